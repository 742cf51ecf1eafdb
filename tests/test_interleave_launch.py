"""Interleaved rounds on the emulated cluster (``Measurer.measure_round``, workload/turnstile.py):
real launches of two fabrics started together, whose measured steps take turns.

The sides' steps must alternate in chunks and never overlap (each side measured alone on the
machine, seconds from the other), the records say so, the round is stored under its own keys and
served from them, and nothing is left behind. A side whose rank crashes fails alone: the other side
is not left waiting for it, and finishes its window.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from cluster_env import leftover_processes
from helpers import emulated_unavailable, interrupt_when, namespaces, needs

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.cluster.emulated import EmulatedCluster, owned_namespaces
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.measuring.measurement import LaunchKey, MeasurementError
from pytest_fabric.measuring.store import ResultStore

UNAVAILABLE = emulated_unavailable()
IB, ETH = Case("qwen2-tiny", 2, "ib"), Case("qwen2-tiny", 2, "eth")
SETTINGS = LaunchSettings(steps=4, warmup_steps=1, batch_size=1, seq_len=64, measure_s=3.0, launch_timeout_s=120)


def _measurer(tmp_path) -> Measurer:
    needs(UNAVAILABLE)
    cluster = EmulatedCluster()
    cluster.prepare()
    return Measurer(cluster, SETTINGS, ResultStore(tmp_path / "store"), tmp_path / "launches")


def _steps(m):
    """(start, end, side) of each measured step of a measurement, on the wall clock."""
    r = m.result
    return [(end - s, end, r.interleaved["side"]) for s, end in zip(r.step_s, r.signals.step_end_unix)]


@pytest.fixture(scope="module")
def interleaved_round(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("round")
    m = _measurer(tmp_path)
    before = set(namespaces())
    started = time.time()
    ib, eth = m.measure_round([IB, ETH], 0)
    return m, ib, eth, time.time() - started, before, tmp_path


def test_the_sides_take_turns_and_never_overlap(interleaved_round):
    _, ib, eth, *_ = interleaved_round
    assert ib.result.interleaved["side"] == 0 and eth.result.interleaved["side"] == 1
    steps = sorted(_steps(ib) + _steps(eth))
    turns = [steps[0][2]] + [b[2] for a, b in zip(steps, steps[1:]) if b[2] != a[2]]
    assert turns[0] == 0 and len(turns) >= 4  # ib first, then turns: not one launch after the other
    # A step of one side never runs while the other side's does (the step's own timing, 50 ms slack
    # for the rounding of the recorded end times and the all-reduce after the step).
    for (a0, a1, sa), (b0, b1, sb) in zip(steps, steps[1:]):
        if sa != sb:
            assert b0 >= a1 - 0.05
    for m in (ib, eth):
        i = m.result.interleaved
        assert i["sides"] == 2 and i["partners_lost"] == [] and i["chunks"] >= 2 and i["waited_s"] > 0
        assert m.result.stopped == "time cap"  # the whole window: no stop on precision


def test_the_round_is_stored_under_its_own_keys_and_served_from_them(interleaved_round):
    m, ib, eth, *_ = interleaved_round
    keys = sorted(m.store.all())
    assert [(k.partition("#")[0], LaunchKey.parse(k).interleaved, LaunchKey.parse(k).block) for k in keys] == [
        (ETH.id, True, IB.id), (IB.id, True, ETH.id)]
    launched = len(m.launched)
    again = m.measure_round([IB, ETH], 0)
    assert len(m.launched) == launched and [x.result.run_dir for x in again] == [ib.result.run_dir, eth.result.run_dir]


def test_an_interleaved_round_leaves_nothing_behind(interleaved_round):
    m, _, _, _, before, tmp_path = interleaved_round
    assert not owned_namespaces() and set(namespaces()) <= before
    assert not list((tmp_path / "launches").glob("turns-*"))  # the turnstile's directory is removed


def test_a_crashed_side_fails_alone_and_the_other_finishes_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_FABRIC_FAULT", "crash:fabric=eth,rank=1,step=3")
    m = _measurer(tmp_path)
    started = time.time()
    with pytest.raises(MeasurementError):
        m.measure_round([ETH, IB], 0)
    assert time.time() - started < 100  # far inside the deadline: ib never waited out the silent side
    (ib_key,) = [k for k in m.store.all() if k.startswith(IB.id)]
    ib = m.store.all()[ib_key]["result"]
    assert ib["stopped"] == "time cap" and ib["interleaved"]["alone_steps"] > 0
    assert not owned_namespaces()


COMPARED = """
from pytest_fabric.core.case import Case


def test_gate(fabric_compare):
    fabric_compare.within(Case("qwen2-tiny", 2, "eth"), Case("qwen2-tiny", 2, "ib"), rel=0.5)
"""


@pytest.mark.slow
def test_sigterm_during_an_interleaved_round_stops_both_sides_and_leaves_nothing(pytester):
    """The sides' supervisors run in threads, where no signal handler can be set: a SIGTERM (a CI job
    cancelled) must still unwind them, killing every rank and removing every namespace."""
    needs(UNAVAILABLE)
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    pytester.makepyfile(test_generated=COMPARED)
    before = set(namespaces())
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_generated.py",
                             "--nodes", "2", "--batch-size", "1", "--seq-len", "64", "--interleave", "on",
                             "--measure-seconds", "30", f"--run-dir={tmp}"],
                            cwd=pytester.path, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)

    def both_measuring() -> bool:  # each side has a progress line past its warm-up
        logs = [p.read_text(errors="replace") for p in tmp.rglob("progress.jsonl")]
        return len(logs) == 2 and all('"measure"' in text for text in logs)

    output, stopped_s = interrupt_when(proc, both_measuring, signal.SIGTERM,
                                       "the round's launches never both reached their measured steps", 120, 60)
    assert proc.returncode != 0 and stopped_s < 20, output
    assert leftover_processes(str(pytester.path)) == []
    assert {n for n in set(namespaces()) - before if n.startswith(f"pf{proc.pid}-")} == set(), output
