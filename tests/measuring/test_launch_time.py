"""Where a launch's time goes: phases that add up to the launch's wall (measuring/launch_time.py)."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.cluster.local import LocalCluster
from pytest_fabric.measuring.launch_time import PROGRAM_PHASES, TRAIN_PHASES, breakdown, read_marks
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.measuring.store import ResultStore

MARKS = {"process_start": 102.0, "entry": 103.5, "init": 104.0, "built": 107.0, "steps_done": 117.0, "exit": 117.5}


def test_training_phases_add_up_to_the_wall_and_measured_is_the_steps_own_time():
    phases = breakdown(MARKS, 100.0, 118.0, 118.25, warmup_step_s=[1.0, 1.0], step_s=[0.5] * 12)
    assert list(phases) == list(TRAIN_PHASES)
    assert sum(phases.values()) == pytest.approx(18.25)
    assert phases["startup"] == 2.0 and phases["imports"] == 1.5 and phases["init"] == 0.5
    assert phases["build"] == 3.0 and phases["finish"] == 0.5 and phases["teardown"] == 0.5
    assert phases["harness"] == 0.25
    # The loop's 10 s: 6 s measured, 2 s warm-up, the rest between steps; no compile on an eager run.
    assert (phases["measured"], phases["warmup"], phases["compile"], phases["between"]) == (6.0, 2.0, 0.0, 2.0)


def test_compile_is_the_first_warmup_steps_excess_over_the_median_measured_step_on_compiled_runs_only():
    steps = [0.5, 0.6, 0.4]
    compiled = breakdown(MARKS, 100.0, 118.0, 118.0, warmup_step_s=[4.0, 0.7], step_s=steps, compiled=True)
    assert compiled["compile"] == pytest.approx(4.0 - statistics.median(steps))
    assert compiled["warmup"] == pytest.approx(4.7 - compiled["compile"])
    eager = breakdown(MARKS, 100.0, 118.0, 118.0, warmup_step_s=[4.0, 0.7], step_s=steps)
    assert eager["compile"] == 0.0 and eager["warmup"] == pytest.approx(4.7)


def test_marks_off_the_harness_clock_are_clamped_and_the_sum_still_holds():
    # Rank 0's node clock 3 s behind the harness's: its first marks fall before the launch started.
    skewed = {name: at - 3.0 for name, at in MARKS.items()}
    phases = breakdown(skewed, 100.0, 118.0, 118.0, step_s=[20.0])
    assert all(s >= 0 for s in phases.values())
    assert sum(phases.values()) == pytest.approx(18.0)
    assert phases["measured"] <= 10.0  # never more than the loop the marks bound


def test_a_missing_mark_gives_its_time_to_the_next_phase():
    marks = {k: v for k, v in MARKS.items() if k != "process_start"}
    phases = breakdown(marks, 100.0, 118.0, 118.0, step_s=[1.0])
    assert phases["startup"] == 0.0 and phases["imports"] == 3.5


def test_a_program_without_steps_has_one_program_phase():
    phases = breakdown({"process_start": 101.0, "entry": 102.0, "exit": 110.0}, 100.0, 111.0, 111.5)
    assert list(phases) == list(PROGRAM_PHASES)
    assert phases == {"startup": 1.0, "imports": 1.0, "program": 8.0, "measured": 0.0, "teardown": 1.0,
                      "harness": 0.5}


def test_a_programs_timed_windows_are_its_measured_time_within_its_program():
    marks = {"process_start": 101.0, "entry": 102.0, "exit": 110.0, "measured_s": 5.5}
    phases = breakdown(marks, 100.0, 111.0, 111.5)
    assert phases["program"] == 2.5 and phases["measured"] == 5.5
    assert sum(phases.values()) == pytest.approx(11.5)
    # Never more than the program it was timed in.
    assert breakdown({**marks, "measured_s": 50.0}, 100.0, 111.0, 111.5)["measured"] == 8.0


def test_times_out_of_order_are_refused():
    with pytest.raises(ValueError, match="out of order"):
        breakdown(MARKS, 100.0, 99.0, 118.0)


def test_unreadable_marks_read_as_none(tmp_path):
    assert read_marks(tmp_path) == {}
    (tmp_path / "marks.json").write_text("{not json")
    assert read_marks(tmp_path) == {}
    (tmp_path / "marks.json").write_text(json.dumps({"entry": 5, "bad": "x"}))
    assert read_marks(tmp_path) == {"entry": 5.0}


@pytest.mark.slow
def test_a_real_launchs_breakdown_adds_up_to_its_wall_read_outside_the_harness(tmp_path: Path):
    """Two nodes of local processes (torchrun, gloo): the phases' sum against this test's own clock
    around the launch (less any wait for another session's launch on this machine, before it
    started), within 5%; every mark the rank program sets was read."""
    measurer = Measurer(LocalCluster(), LaunchSettings(steps=3, warmup_steps=1, measure_s=0, device="cpu"),
                        ResultStore(tmp_path / "store"), tmp_path / "launches")
    before = time.time()
    result = measurer.measure(Case("qwen2-tiny", 2, "eth")).result
    wall = time.time() - before
    phases = result.launch_time
    wall -= result.launch_marks["launch_started"] - result.launch_marks["machine_asked"]
    assert phases is not None and list(phases) == list(TRAIN_PHASES)
    assert abs(sum(phases.values()) - wall) <= 0.05 * wall, (phases, wall)
    assert set(result.launch_marks) >= {"launch_started", "process_start", "entry", "init", "built", "steps_done",
                                        "exit", "launch_returned", "launch_ended"}
    assert phases["measured"] == pytest.approx(sum(result.step_s), abs=0.002)
    for name in ("startup", "imports", "init", "build", "warmup", "teardown"):
        assert phases[name] > 0, (name, phases)
