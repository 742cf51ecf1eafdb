"""Where one launch's time goes: its wall time split into phases that add up to it.

The harness reads its own clock when a launch starts (before the cluster builds anything: the
emulated cluster's namespaces, a Slurm step), when the cluster's launch returns (every process ended,
namespaces removed) and when the launch's record is complete (result read, transport proved). Global
rank 0 of the rank program writes its marks (``workload/marks.py``). Consecutive readings give the
phases, each clamped between its neighbours, so they add up to the launch's wall exactly:

=========  ===========================================================================================
startup    launch start -> rank 0's process started: the cluster's set-up (namespaces, srun), torchrun
           agents' start and rendezvous, the worker's spawn
imports    the worker's interpreter and its imports (torch, transformers, the program) -> its ``main``
init       ``main`` -> the process group up and its first small collective done (NCCL connected)
build      the model built on the meta device, sharded, weights set, the optimizer made
compile    compiled runs only: the first warm-up step's excess over the median measured step
warmup     the warm-up steps' own time (less what ``compile`` took)
between    time in the step loop outside any step: the per-step signals all-reduce, progress lines
measured   the measured steps' own time (the sum of the step times the result records); in a
           program without steps, its timed windows (``measured_s``: the timed collectives)
finish     after the last step: peak memory gathered, the result written, the group destroyed
teardown   rank 0's exit -> the cluster's launch returned (the other processes, the agents, clean-up)
harness    the result read and checked by the harness
=========  ===========================================================================================

A collectives or link launch has ``program`` (``main`` to exit, less its timed windows) and
``measured`` in place of init ... finish. A mark that is missing (a program without it) leaves its
phase at 0 and the next phase takes its time.
Rank 0's clock is its node's: on a real cluster it can differ from the harness's by the nodes' NTP
offset (milliseconds); a negative phase is read as 0 (the clamping above).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..workload.marks import MARKS_FILE, MEASURED

TRAIN_PHASES = ("startup", "imports", "init", "build", "compile", "warmup", "between", "measured", "finish",
                "teardown", "harness")
PROGRAM_PHASES = ("startup", "imports", "program", "measured", "teardown", "harness")


def read_marks(run_dir: Path) -> dict[str, float]:
    """Rank 0's marks (``workload/marks.py``) from ``run_dir``; {} where it wrote none or they do not read."""
    try:
        data = json.loads((Path(run_dir) / MARKS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _clamped(sequence: Sequence[tuple[str, float | None]], start: float, end: float) -> dict[str, float]:
    """Each named span from the previous reading to its own (None: not read, the span is 0 and the
    next one takes its time), every reading held within [previous, end]: the spans add up to
    ``end - start``."""
    spans: dict[str, float] = {}
    previous = start
    for name, at in sequence:
        now = previous if at is None else min(max(at, previous), end)
        spans[name] = now - previous
        previous = now
    return spans


def breakdown(marks: Mapping[str, float], started: float, returned: float, ended: float,
              warmup_step_s: Sequence[float] = (), step_s: Sequence[float] | None = None,
              compiled: bool = False) -> dict[str, float]:
    """The launch's phases in seconds (module docstring), adding up to ``ended - started``.

    ``started``, ``returned``, ``ended``: the harness's clock at launch start, at the cluster's
    return and once the record was complete; ``marks``: rank 0's; ``step_s``: the measured steps'
    times of a training launch (None: a program without steps); ``warmup_step_s`` theirs before."""
    if not ended >= returned >= started:
        raise ValueError(f"launch times out of order: started {started}, returned {returned}, ended {ended}")
    if step_s is None:
        spans = _clamped([("startup", marks.get("process_start")), ("imports", marks.get("entry")),
                          ("program", marks.get("exit")), ("teardown", returned), ("harness", ended)],
                         started, ended)
        spans["measured"] = min(max(0.0, marks.get(MEASURED, 0.0)), spans["program"])
        spans["program"] -= spans["measured"]
        return {name: round(spans[name], 3) for name in PROGRAM_PHASES}
    spans = _clamped([("startup", marks.get("process_start")), ("imports", marks.get("entry")),
                      ("init", marks.get("init")), ("build", marks.get("built")), ("loop", marks.get("steps_done")),
                      ("finish", marks.get("exit")), ("teardown", returned), ("harness", ended)], started, ended)
    loop = spans.pop("loop")
    measured = min(sum(step_s), loop)
    first_excess = warmup_step_s[0] - statistics.median(step_s) if compiled and warmup_step_s and step_s else 0.0
    compile_s = min(max(0.0, first_excess), loop - measured)
    warmup = min(max(0.0, sum(warmup_step_s) - compile_s), loop - measured - compile_s)
    spans.update(compile=compile_s, warmup=warmup, measured=measured, between=loop - measured - compile_s - warmup)
    return {name: round(spans[name], 3) for name in TRAIN_PHASES}


def launch_breakdown(result: Any, run_dir: Path, started: float, returned: float, ended: float) -> dict[str, float]:
    """``breakdown`` of a launch whose ``result`` the harness has read (a TrainResult has steps, a
    collectives or link result none)."""
    steps = getattr(result, "step_s", None)
    return breakdown(read_marks(run_dir), started, returned, ended, getattr(result, "warmup_step_s", ()) or (),
                     steps if steps else None, bool(getattr(result, "compile", False)))
