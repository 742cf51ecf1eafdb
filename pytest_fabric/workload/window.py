"""The rank's stop rule: one window per launch, fixed before it starts.

Every rank calls ``measuring_done`` after each measured step with the all-reduced step times, so
every rank stops at the same step. The window never depends on the step times' spread: a stop on
precision ends on a run of fast steps, and a window stretched after a stall measures a different
machine (``deciding/steps.py`` values the launch; README, "How verdicts are decided", rule 1).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["measuring_done"]


def measuring_done(step_s: Sequence[float], *, min_steps: int, max_steps: int, measure_s: float) -> str:
    """Why measuring may stop now ("" to go on).

    "time cap": at least ``min_steps`` steps and ``measure_s`` seconds of measured steps spent;
    "step cap": ``max_steps`` steps; ``measure_s`` 0: exactly ``min_steps`` steps. Deterministic in
    its inputs.
    """
    n = len(step_s)
    if n >= max_steps:
        return "step cap"
    if n < min_steps:
        return ""
    if not measure_s or sum(step_s) >= measure_s:
        return "time cap"
    return ""
