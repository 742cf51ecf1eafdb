"""A night's launch time summed: the terminal line, JUnit properties, the saved night's form."""

from __future__ import annotations

import pytest

from pytest_fabric import Case
from pytest_fabric.history.launch_time import launch_line, night_launch_time, records_launch_time
from pytest_fabric.measuring.measurement import LaunchRecord
from pytest_fabric.workload.result import TrainResult

TRAIN = {"startup": 2.0, "imports": 1.5, "init": 0.5, "build": 3.0, "compile": 0.0, "warmup": 2.0, "between": 1.0,
         "measured": 6.0, "finish": 0.5, "teardown": 1.5, "harness": 0.0}
PROGRAM = {"startup": 2.0, "imports": 1.0, "program": 4.0, "teardown": 1.0, "harness": 0.0}


def record(phases, model="qwen2-tiny"):
    result = TrainResult(model=model, world_size=2, hosts=["a", "b"], local_world_size=1, batch_size=1, seq_len=8,
                         tokens_per_step=16, step_s=[0.5], launch_time=phases)
    return LaunchRecord(Case(model, 2, "eth"), "local", result)


def test_the_night_sums_each_phase_and_the_measured_fraction_is_of_the_launches_wall():
    night = night_launch_time([record(TRAIN), record(TRAIN), record(PROGRAM),
                               LaunchRecord(Case("qwen2-tiny", 2, "ib"), error="failed")], session_s=60.0)
    assert night.launches == 3
    assert night.wall_s == pytest.approx(2 * 18.0 + 8.0)
    assert night.phases["measured"] == 12.0 and night.phases["program"] == 4.0 and night.phases["startup"] == 6.0
    assert night.measured_fraction == pytest.approx(12.0 / 44.0)
    assert night.outside_s == pytest.approx(16.0)
    props = night.properties()
    assert props["fabric.launch_time.measured_s"] == "12.000"
    assert props["fabric.launch_time.measured_fraction"] == f"{12 / 44:.4f}"
    assert props["fabric.launch_time.outside_launches_s"] == "16.000"
    line = night.line()
    assert "3 launches, 44.0 s" in line and "measured 12.0 s (27%)" in line and "27.3% of launch wall" in line
    assert line.index("imports") < line.index("program") < line.index("init")  # launch order


def test_launches_recorded_before_they_were_timed_are_counted_apart():
    night = night_launch_time([record(TRAIN), record(None)])
    assert night.launches == 1 and night.untimed == 1 and "1 launch without a breakdown" in night.line()
    assert night_launch_time([record(None)]) is None


def test_a_saved_nights_records_give_the_same_sum():
    night = night_launch_time([record(TRAIN), record(PROGRAM)])
    records = {"a": record(TRAIN).to_dict(), "b": record(PROGRAM).to_dict(), "c": {"case": "x", "error": "e"}}
    assert records_launch_time(records).to_dict() == night.to_dict()


def test_a_bad_breakdown_is_an_error_naming_its_launch():
    with pytest.raises(ValueError, match="qwen2-tiny-n2-eth: launch_time must map phase names to seconds"):
        night_launch_time([record({"startup": -1.0})])


def test_one_launchs_line_leaves_out_empty_phases():
    assert launch_line(TRAIN) == ("launch 18.0 s: startup 2.0 s, imports 1.5 s, init 0.5 s, build 3.0 s, warmup 2.0 s, "
                                  "between 1.0 s, measured 6.0 s, finish 0.5 s, teardown 1.5 s")
