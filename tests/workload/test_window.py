"""One window per launch, fixed before it starts (workload/window.py), whatever its steps or its
partner's do; a stalling fabric is shown (the verdict line, the launch's fast-steps diagnostic), never
measured longer.

The rule, then launches through the measurer with a stand-in cluster whose ib steps stall, and one
real session on the emulated cluster with the ``stall`` fault planted on one side.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from pytest_fabric.workload.window import MAX_WARMUP_STEPS, measuring_done, warmup_done
from helpers import FakeCluster, emulated_unavailable, lognormal, needs, session_directory

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.measuring.store import ResultStore
from pytest_fabric.workload.config import TrainConfig

from pytest_fabric.measuring.measurement import launch_number
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.deciding.steps import launch_estimate
from pytest_fabric.workload import faults

UNAVAILABLE = emulated_unavailable()


def test_a_launch_measures_its_steps_then_its_seconds_and_never_stops_on_precision():
    same = [0.5] * 30  # perfectly steady steps: known to any precision after a few
    assert measuring_done(same[:9], min_steps=10, max_steps=200, measure_s=6.0) == ""
    assert measuring_done(same[:10], min_steps=10, max_steps=200, measure_s=6.0) == ""
    assert measuring_done(same[:12], min_steps=10, max_steps=200, measure_s=6.0) == "time cap"
    assert measuring_done(same[:5], min_steps=5, max_steps=5, measure_s=60.0) == "step cap"
    assert measuring_done(same[:10], min_steps=10, max_steps=200, measure_s=0.0) == "time cap"  # exactly --steps
    assert measuring_done(same[:9], min_steps=10, max_steps=200, measure_s=0.0) == ""


class TestMeasuringDone:
    kw = dict(min_steps=5, max_steps=100, measure_s=1000.0)

    def test_goes_on_before_min_steps(self):
        assert measuring_done([100.0] * 4, **{**self.kw, "measure_s": 1.0}) == ""

    def test_step_cap(self):
        rng = random.Random(4)
        noisy = lognormal(1.0, 0.5, 20, rng)
        assert measuring_done(noisy, **{**self.kw, "max_steps": 20}) == "step cap"
        assert measuring_done(noisy[:19], **{**self.kw, "max_steps": 20}) == ""

    def test_steady_steps_do_not_stop_early(self):
        # Known to any precision after a few steps, they measure the whole window all the same.
        steps = [1.0, 1.001, 0.999, 1.0, 1.0005, 0.9995] * 2 + [1.0]
        assert measuring_done(steps, **self.kw) == ""

    def test_time_cap(self):
        rng = random.Random(5)
        noisy = lognormal(1.0, 0.3, 30, rng)
        assert measuring_done(noisy, **{**self.kw, "measure_s": sum(noisy) + 1}) == ""
        assert measuring_done(noisy, **{**self.kw, "measure_s": sum(noisy) - 1}) == "time cap"


def test_the_stall_diagnostic_sees_stalls_the_mean_pays_for():
    steady = launch_estimate([0.5] * 20)
    stalling = launch_estimate([1.0 if i % 4 == 3 else 0.5 for i in range(20)])
    assert steady.stall == pytest.approx(0.0)
    assert stalling.stall == pytest.approx(0.25)  # the mean: 0.625 against fast steps of 0.5
    assert stalling.step_s == pytest.approx(0.625)


class _StallingCluster(FakeCluster):
    """ib's steps stall (3 of 12 take x2). Records each launch's window and step cap."""

    def __init__(self) -> None:
        super().__init__()
        self.windows: list[tuple[str, float, int]] = []

    def launch(self, request, on_tick=None):
        outcome = super().launch(request, on_tick)
        config = TrainConfig.load(request.program[request.program.index("--config") + 1])
        self.windows.append((request.fabric.name, config.measure_s, config.max_steps))
        result = json.loads(Path(config.result_path).read_text())
        stalls = request.fabric.name == "ib"
        result["step_s"] = [0.5 * (2.0 if stalls and i % 4 == 3 else 1.0) for i in range(12)]
        for name in ("steal_s", "foreign_s", "sm_clock_mhz", "throttle", "disturbed"):
            if result["signals"].get(name):
                result["signals"][name] = [result["signals"][name][0]] * 12
        Path(config.result_path).write_text(json.dumps(result))
        return outcome


def test_every_launch_of_every_side_measures_the_same_window_whatever_stalls(tmp_path):
    cluster = _StallingCluster()
    m = Measurer(cluster, LaunchSettings(steps=12, warmup_steps=1, batch_size=2, seq_len=16, measure_s=2.0),
                 ResultStore(tmp_path / "store"), tmp_path / "launches")
    ib, eth = Case("qwen2-tiny", 2, "ib"), Case("qwen2-tiny", 2, "eth")
    for launch in range(3):
        for case, partner in ((ib, eth), (eth, ib)) if launch % 2 == 0 else ((eth, ib), (ib, eth)):
            m.measure(case, launch, partners=[partner])
    assert cluster.windows == [(name, 2.0, m.settings.max_steps) for name in ("ib", "eth", "eth", "ib", "ib", "eth")]
    assert sorted(launch_number(k) for k in m.store.all()) == [0, 0, 1, 1, 2, 2]
    assert all("~" not in k and "&" not in k for k in m.store.all())


COMPARED = """
from pytest_fabric.core.case import Case


def test_gate(fabric_compare):
    fabric_compare.within(Case("qwen2-tiny", 2, "ib2"), Case("qwen2-tiny", 2, "ib"), rel=0.9)
"""


@pytest.mark.slow
def test_a_planted_stall_is_named_on_the_verdict_line_and_both_sides_measure_one_window(pytester, monkeypatch):
    """ib's steps stall (planted: each step x3 with p=0.3; of 16 steps fewer than 2 stall about 3
    times in 1000), ib2 is a copy of ib that does not: every launch is given the same window, and the
    verdict line says that ib's steps stall."""
    needs(UNAVAILABLE)
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv(faults.ENV, "stall:fabric=ib,p=0.3,factor=3")
    pytester.makepyfile(test_generated=COMPARED)
    result = pytester.runpytest_subprocess(
        "--models", "qwen2-tiny", "--nodes", "2", "--steps", "16", "--warmup-steps", "1", "--measure-seconds", "2",
        "--fabrics", "ib,ib2", "-o", "fabric_define=ib2: ib", "--repeats", "2", "--max-repeats", "2",
        "--inconclusive", "warn", "--family-wise", "none", "-rA", timeout=600)
    records = json.loads((session_directory(result.stdout.str()) / "measurements.json").read_text())
    windows = {json.loads((Path(r["result"]["run_dir"]) / "config.json").read_text())["measure_s"]
               for r in records.values()}
    assert windows == {2.0}
    assert {r["case"]["fabric"] for r in records.values()} == {"ib", "ib2"}
    assert "ib steps stall" in result.stdout.str()


def test_warm_up_ends_once_two_steps_agree():
    """A compiled first step (30 s), an allocator still filling (0.6 s), then steady steps: warm-up
    stops at the first pair within 10%, never before the steps asked for."""
    steps = [30.0, 0.6, 0.41, 0.40, 0.40]
    ends = [n for n in range(1, len(steps) + 1) if warmup_done(steps[:n], min_steps=2)]
    assert ends[0] == 4  # 0.41 then 0.40: the first agreeing pair
    assert not warmup_done([0.40, 0.40], min_steps=3) and warmup_done([0.40, 0.40, 0.41], min_steps=3)
    # 10% of the faster step: 0.40 and 0.44 agree, 0.40 and 0.45 do not.
    assert warmup_done([0.40, 0.44], min_steps=2) and not warmup_done([0.40, 0.45], min_steps=2)


def test_warm_up_is_capped_and_zero_or_one_step_is_exact():
    never_steady = [1.0 if i % 2 else 2.0 for i in range(MAX_WARMUP_STEPS + 3)]
    first = next(n for n in range(1, len(never_steady) + 1) if warmup_done(never_steady[:n], min_steps=2))
    assert first == MAX_WARMUP_STEPS
    assert warmup_done([], min_steps=0) and warmup_done([5.0], min_steps=1) and not warmup_done([], min_steps=1)
    assert warmup_done([2.0] * 12, min_steps=12) and not warmup_done([2.0, 1.0] * 5 + [2.0], min_steps=12)
