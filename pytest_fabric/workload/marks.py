"""Where a launch's time goes, as global rank 0 saw it: wall-clock marks (Unix seconds) at the points
a rank program passes, written to ``marks.json`` in the run directory just before the process exits.

The harness (``measuring/launch_time.py``) places them between its own clock readings (launch start,
the supervisor's return, launch end) and turns consecutive marks into the launch's phases. Marks:

- ``process_start``: when this process started (the kernel's start time, /proc; 10 ms ticks);
- ``entry``: the rank program's ``main`` (after the interpreter and the imports of torch and the
  program's modules);
- ``init``: after ``init_process_group`` and the first small collective (NCCL connected);
- ``built``: after the model is built, sharded, and the optimizer made (training only);
- ``steps_done``: after the last measured step and its signals (training only);
- ``exit``: after the result is written and the process group destroyed.

A program without training steps (collectives, link pairs) also adds up its timed windows, the time
it spends measuring, as ``measured_s`` (seconds, not a point in time).

Plain standard library; no torch, no pytest.
"""

from __future__ import annotations

import json
import os
import time

from ..core.atomic import write_text

MARKS_FILE = "marks.json"
MARK_NAMES = ("process_start", "entry", "init", "built", "steps_done", "exit")

MEASURED = "measured_s"

_marks: dict[str, float] = {}
_measured: list[float] = []  # a program's timed windows (``measured``)
_where: list[str] = []  # the run directory, once the config names it (global rank 0 only)


def process_start_unix() -> float | None:
    """When this process started, on the wall clock: its age (/proc/uptime less the start tick in
    /proc/self/stat) taken from now. None where /proc cannot say (not Linux)."""
    try:
        with open("/proc/self/stat") as f:
            stat = f.read()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the comm
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return round(time.time() - max(0.0, age), 4)


def mark(name: str) -> None:
    """Now, as mark ``name`` (one of ``MARK_NAMES``); a later mark of the same name replaces it."""
    if name not in MARK_NAMES:
        raise ValueError(f"unknown launch mark {name!r}; known: {', '.join(MARK_NAMES)}")
    _marks[name] = round(time.time(), 4)


def measured(seconds: float) -> None:
    """A timed window of ``seconds`` (a program without steps: its timed collectives)."""
    _measured.append(seconds)


def begin(run_dir: str) -> None:
    """The program knows its run directory: global rank 0 (torchrun's ``RANK``) will write its marks
    there at ``write``; the process's start is read now."""
    if os.environ.get("RANK", "0") != "0":
        return
    _where[:] = [run_dir]
    started = process_start_unix()
    if started is not None:
        _marks.setdefault("process_start", started)


def write() -> None:
    """Mark ``exit`` and write every mark (global rank 0, once ``begin`` named the directory). Best
    effort: a launch is never failed by its timing."""
    if not _where:
        return
    mark("exit")
    written = dict(sorted(_marks.items(), key=lambda kv: kv[1]))
    if _measured:
        written[MEASURED] = round(sum(_measured), 4)
    try:
        write_text(os.path.join(_where[0], MARKS_FILE), json.dumps(written))
    except OSError:
        pass
