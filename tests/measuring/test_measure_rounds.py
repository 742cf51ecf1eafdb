"""A round's launches run back to back (``Measurer.measure``, ``Measurer.in_round``).

Blocking by round cancels a drift of the machine only where a round's launches ran next to each
other. The reference every gate shares was, for a later gate, measured minutes of other gates ago:
on this VM the A/A gate's candidate, measured 13 minutes after the ib launches it reused, read 4%
slow. So a stored launch serves a round only where it ran back to back with the round's other
launches; otherwise it is launched again for that round (key ``...+partners``). Without launching:
a stand-in cluster whose launches take 10 s on a clock the test holds.
"""

from __future__ import annotations

import pytest
from helpers import FakeCluster

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.deciding.rounds import ROUND_GAP_S
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.measuring.measurement import LaunchKey, launch_number
from pytest_fabric.measuring.store import ResultStore

IB, ETH, ROCE = (Case("qwen2-tiny", 2, f) for f in ("ib", "eth", "roce"))


class _Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class _TimedCluster(FakeCluster):
    """Each launch takes ``launch_s`` on the test's clock; records which fabric launched."""

    def __init__(self, clock: _Clock, launch_s: float = 10.0) -> None:
        super().__init__()
        self.clock, self.launch_s = clock, launch_s
        self.fabrics: list[str] = []

    def launch(self, request, on_tick=None):
        self.clock.now += self.launch_s
        self.fabrics.append(request.fabric.name)
        return super().launch(request, on_tick)


def _measurer(tmp_path, clock: _Clock, cluster: _TimedCluster | None = None) -> Measurer:
    m = Measurer(cluster or _TimedCluster(clock), LaunchSettings(steps=4, warmup_steps=1, batch_size=2, seq_len=16),
                 ResultStore(tmp_path / "store"), tmp_path / "launches")
    m.clock = clock
    return m


def _gate(m: Measurer, reference: Case, candidate: Case, rounds: int) -> list[str]:
    """A gate's rounds as ``CompareFixture`` launches them: reference first in even rounds, the
    candidate first in odd ones; the store keys each round used, in launch order."""
    keys = []
    for index in range(rounds):
        pair = (reference, candidate) if index % 2 == 0 else (candidate, reference)
        for case, partner in (pair, pair[::-1]):
            keys.append(m.measure(case, index, partners=[partner]).result.run_dir)
    return keys


def test_a_later_gate_launches_the_shared_reference_again_next_to_its_own_candidate(tmp_path):
    clock = _Clock()
    m = _measurer(tmp_path, clock)
    _gate(m, IB, ROCE, 3)
    _gate(m, IB, ETH, 3)
    # The first gate launched ib; the second, 60 s later, launches it again in each of its rounds.
    assert m.cluster.fabrics == ["ib", "roce", "roce", "ib", "ib", "roce", "ib", "eth", "eth", "ib", "ib", "eth"]
    records = m.store.all()
    again = sorted(k for k in records if LaunchKey.parse(k).block)
    assert [(launch_number(k), LaunchKey.parse(k).block) for k in again] == [
        (0, ETH.id), (1, ETH.id), (2, ETH.id)]
    # Every launch of a round ran within one launch of its partner.
    for index in range(3):
        spans = [(r["started"], r["ended"]) for k, r in records.items()
                 if launch_number(k) == index and (r["case"]["fabric"] == "eth" or LaunchKey.parse(k).block)]
        (a, b), (c, d) = sorted(spans)
        assert c - b <= ROUND_GAP_S


def test_gates_measured_round_by_round_together_share_the_reference(tmp_path):
    """Where two gates' rounds interleave (xdist workers side by side), the reference launch of a
    round ran next to both candidates: one launch serves both, as the cache promises."""
    clock = _Clock()
    m = _measurer(tmp_path, clock)
    for index in range(3):
        order = (IB, ROCE, ETH) if index % 2 == 0 else (ROCE, ETH, IB)
        for case in order:
            partners = [IB] if case != IB else [ROCE]
            m.measure(case, index, partners=partners)
        m.measure(IB, index, partners=[ETH])  # the second gate's look at the round: served from the cache
    assert m.cluster.fabrics.count("ib") == 3
    assert not any(LaunchKey.parse(k).block for k in m.store.all())


def test_a_resumed_session_finds_each_round_as_it_was_measured(tmp_path):
    """The choice is made from the stored launches' times, not the clock, wherever the round's
    other launch is stored: a session that resumes a killed one (hours later) launches nothing."""
    clock = _Clock()
    first = _measurer(tmp_path, clock)
    _gate(first, IB, ROCE, 2)
    keys = _gate(first, IB, ETH, 2)
    clock.now += 4 * 3600
    again = _measurer(tmp_path, clock)
    assert _gate(again, IB, ROCE, 2) and _gate(again, IB, ETH, 2) == keys
    assert again.cluster.fabrics == []


def test_a_record_kept_before_launch_times_were_serves_as_it_did(tmp_path):
    clock = _Clock()
    m = _measurer(tmp_path, clock)
    m.measure(IB, 1, partners=[ETH])
    key = next(iter(m.store.all()))
    record = m.store.get(key)
    for field in ("started", "ended"):
        record.pop(field)
    m.store.put(key, record)
    clock.now += 3600
    m.measure(ETH, 1, partners=[IB])
    m.measure(IB, 1, partners=[ETH])
    assert m.cluster.fabrics == ["ib", "eth"]


@pytest.mark.parametrize("key", ["m-n2-ib#ab12", "m-n2-ib#ab12@3", "m-n2-ib#ab12@3+m-n2-ib2",
                                 "m-n2-ib#ab12+m-n1-any,m-n2-ib7"])
def test_a_store_key_reads_back_as_it_was_written(key):
    parsed = LaunchKey.parse(key)
    assert str(parsed) == key and parsed.base == "m-n2-ib#ab12"
