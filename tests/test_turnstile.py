"""The turnstile of interleaved launches (workload/turnstile.py): sides take turns in chunks, a side
that ends or never comes is not waited for, and a side's ranks move together.

Each side here is a thread with its own ``Turnstile`` (the protocol is files in one directory, as
between the rank processes of concurrent launches); a step is a real sleep, so that overlapping
steps would show in their times.
"""

from __future__ import annotations

import threading
import time

import pytest

from pytest_fabric.workload.turnstile import DONE, TurnConfig, Turnstile, mark_done


def _side(directory, side, worlds, steps, step_s, log, chunk_s=0.05, rank=0, **waits):
    turns = Turnstile(TurnConfig(str(directory), side, worlds, chunk_s, **waits), rank)
    for i in range(steps):
        turns.wait()
        start = time.monotonic()
        time.sleep(step_s)
        log.append((side, rank, start, time.monotonic()))
        turns.stepped(step_s, done=i == steps - 1)
    return turns


def _run_sides(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a side never finished: the turnstile deadlocked"


def test_two_sides_take_turns_in_chunks_and_never_overlap(tmp_path):
    log, result = [], {}
    _run_sides([lambda s=s: result.__setitem__(s, _side(tmp_path, s, (1, 1), 24, 0.01, log)) for s in (0, 1)])
    log.sort(key=lambda r: r[2])
    sides = [r[0] for r in log]
    assert sides[0] == 0  # side 0 goes first
    runs = [sides[0]]
    for a, b in zip(sides, sides[1:]):
        if b != a:
            runs.append(b)
    assert len(runs) >= 8  # 24 steps of 10 ms in chunks of 50 ms: turns, not one side then the other
    # No step of one side runs while a step of the other does (the sides take turns).
    for (s1, _, a1, b1), (s2, _, a2, b2) in zip(log, log[1:]):
        if s1 != s2:
            assert a2 >= b1 - 1e-3
    assert result[0].summary()["chunks"] >= 3 and result[1].summary()["waited_s"] > 0


def test_three_sides_go_round_in_order(tmp_path):
    log = []
    _run_sides([lambda s=s: _side(tmp_path, s, (1, 1, 1), 12, 0.01, log, chunk_s=0.03) for s in (0, 1, 2)])
    log.sort(key=lambda r: r[2])
    order = []
    for side, *_ in log:
        if not order or order[-1] != side:
            order.append(side)
    assert order[:6] == [0, 1, 2, 0, 1, 2]


def test_a_side_that_never_comes_is_waited_for_at_most_ready_wait(tmp_path):
    log = []
    start = time.monotonic()
    turns = _side(tmp_path, 0, (1, 1), 10, 0.005, log, chunk_s=0.01, ready_wait_s=0.3)
    assert 0.3 <= time.monotonic() - start < 5
    assert turns.summary()["partners_lost"] == [1]
    assert turns.summary()["alone_steps"] == 10


def test_a_side_marked_done_by_the_harness_is_not_waited_for(tmp_path):
    mark_done(tmp_path, 1, 2)  # side 1 (2 ranks) ended before it measured: its launch failed
    start = time.monotonic()
    turns = _side(tmp_path, 0, (1, 2), 10, 0.005, [], chunk_s=0.01, ready_wait_s=30)
    assert time.monotonic() - start < 5
    assert turns.summary()["partners_lost"] == [] and turns.summary()["alone_steps"] == 10


def test_a_side_counts_as_its_slowest_rank(tmp_path):
    """Side 1 has two ranks: side 0 waits until both of them have completed their chunk."""
    log = []
    other = Turnstile(TurnConfig(str(tmp_path), 1, (1, 2), 0.01), 1)
    lagging = Turnstile(TurnConfig(str(tmp_path), 1, (1, 2), 0.01), 0)
    first = Turnstile(TurnConfig(str(tmp_path), 0, (1, 2), 0.01), 0)
    other.ready()
    lagging.ready()
    first.wait()
    first.stepped(0.02)  # side 0's chunk 0 done
    for t in (other, lagging):
        t.wait()  # side 1's turn now
    other.stepped(0.02)  # one rank of side 1 has completed its chunk, the other not yet
    assert first.count(1) == 0
    waited = threading.Thread(target=first.wait)
    waited.start()
    time.sleep(0.1)
    assert waited.is_alive()  # still waiting for side 1's second rank
    lagging.stepped(0.02)
    waited.join(5)
    assert not waited.is_alive()
    for t in (other, lagging, first):
        t.finish()
    assert first.count(1) == DONE


def test_a_silent_side_is_given_up_after_wait_s(tmp_path):
    gone = Turnstile(TurnConfig(str(tmp_path), 1, (1, 1), 0.01, wait_s=0.2), 0)
    gone.ready()  # ready, then never steps: a hung launch
    turns = _side(tmp_path, 0, (1, 1), 6, 0.005, [], chunk_s=0.01, wait_s=0.2)
    assert turns.summary()["partners_lost"] == [1]


@pytest.mark.parametrize("kwargs", [dict(side=2, worlds=(1, 1)), dict(side=0, worlds=(1,)),
                                    dict(side=0, worlds=(1, 0)), dict(side=0, worlds=(1, 1), chunk_s=0)])
def test_bad_turn_configs_are_refused(tmp_path, kwargs):
    with pytest.raises(ValueError):
        TurnConfig(str(tmp_path), **kwargs)


def test_turn_config_round_trips_through_the_rank_config(tmp_path):
    cfg = TurnConfig(str(tmp_path), 1, (2, 1), 1.5)
    assert TurnConfig.from_dict(cfg.to_dict()) == cfg
