"""How long a launch measures (stats.measure_window): a configuration's first launch twice the window,
one whose steps stalled earlier three times.

The rule, then two real launches on the emulated cluster: the first with the `stall` fault planted
(each step stalls with p=0.3, x2; of 16 steps none stalls 3 times in 1000, and three quarters
or more almost never, so the 25% quantile stays a fast step) measures the default window; the second, of the same
configuration, measures up to three times as long and says why in its record; a configuration
whose first launch did not stall (eth, unless the machine is busy) measures its second as usual.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import emulated_unavailable, needs, session_directory

from pytest_fabric.measuring.measure import result_estimate
from pytest_fabric.deciding.stats import (FIRST_LAUNCH_FACTOR, STALL_MARGIN, STALL_MEASURE_FACTOR, Window, measure_window,
                                          measuring_done)
from pytest_fabric.workload import faults
from pytest_fabric.workload.result import TrainResult

UNAVAILABLE = emulated_unavailable()


def test_the_first_launch_measures_its_whole_longer_window_and_later_clean_ones_stop_as_usual():
    assert measure_window(6.0, 0, []) == Window(6.0 * FIRST_LAUNCH_FACTOR, True)
    assert measure_window(6.0, 1, [0.0]) == Window(6.0, False)
    assert measure_window(6.0, 3, [0.0, STALL_MARGIN * 0.9, 0.01]) == Window(6.0, False)


def test_an_earlier_stall_stretches_the_window_measured_whole_and_says_why():
    window = measure_window(6.0, 2, [0.01, 0.12])
    assert window.seconds == pytest.approx(6.0 * STALL_MEASURE_FACTOR) and window.whole
    assert "12%" in window.why and "stall" in window.why and f"{6.0 * STALL_MEASURE_FACTOR:g} s" in window.why


def test_a_fixed_step_count_stays_fixed():
    assert measure_window(0.0, 0, []) == Window(0.0, False)
    assert measure_window(0.0, 1, [0.5]) == Window(0.0, False)


def test_no_precision_stop_when_the_whole_window_is_measured():
    steady = [0.5] * 30  # known to far better than 1% after 10 steps
    assert measuring_done(steady[:10], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.01) == "precision"
    assert measuring_done(steady[:10], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.0) == ""
    assert measuring_done(steady[:12], None, min_steps=10, max_steps=200, measure_s=6.0, precision=0.0) == "time cap"


SOURCE = """
import pytest
from pytest_fabric.core.case import Case


@pytest.mark.parametrize("fabric", ["ib", "eth"])
def test_two_launches(fabric_measure, fabric):
    for launch in (0, 1):
        fabric_measure(Case("qwen2-tiny", 2, fabric), launch)
"""


@pytest.mark.slow
def test_a_stalling_configuration_measures_its_next_launch_longer(pytester, monkeypatch):
    needs(UNAVAILABLE)
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv(faults.ENV, "stall:fabric=ib,p=0.3,factor=2")
    pytester.makepyfile(test_generated=SOURCE)
    result = pytester.runpytest_subprocess("--models", "qwen2-tiny", "--nodes", "2", "--fabrics", "ib,eth",
                                           "--steps", "16", "--warmup-steps", "1", "--measure-seconds", "2",
                                           timeout=600)
    result.assert_outcomes(passed=2)
    records = json.loads((session_directory(result.stdout.str()) / "measurements.json").read_text())
    by_key = {(r["case"]["fabric"], "@1" in key): r for key, r in records.items()}
    for fabric in ("ib", "eth"):
        first, second = by_key[(fabric, False)], by_key[(fabric, True)]
        stalled = result_estimate(TrainResult.from_dict(first["result"], fabric)).stall >= STALL_MARGIN
        assert "measured_longer" not in first
        # The rule, on each configuration's own first launch (eth's may stall too on a busy machine).
        assert ("measured_longer" in second) == stalled, (fabric, second.get("measured_longer"))
    ib0, ib1 = by_key[("ib", False)], by_key[("ib", True)]
    assert "stall" in ib1["measured_longer"]  # planted: of 16 steps at p=0.3 none stalls 3 times in 1000
    # The window the ranks were given (their config.json) is what stretched: three times --measure-seconds.
    window = {r: [json.loads((Path(x["result"]["run_dir"]) / "config.json").read_text())[k]
                  for k in ("measure_s", "step_precision")] for r, x in (("first", ib0), ("second", ib1))}
    assert window == {"first": [2.0 * FIRST_LAUNCH_FACTOR, 0.0], "second": [2.0 * STALL_MEASURE_FACTOR, 0.0]}
