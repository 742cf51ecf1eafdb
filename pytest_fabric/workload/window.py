"""The rank's stop rule: one window per launch, fixed before it starts.

Every rank calls ``measuring_done`` after each measured step with the all-reduced step times, so
every rank stops at the same step. The window never depends on the step times' spread: a stop on
precision ends on a run of fast steps, and a window stretched after a stall measures a different
machine (``deciding/steps.py`` values the launch; README, "How verdicts are decided", rule 1).
"""

from __future__ import annotations

from collections.abc import Sequence

# Warm-up ends once two consecutive steps agree within this share (compile done, the allocator's
# pools and the caches settled)...
STEADY_WITHIN = 0.10
# ...after at least the steps asked for, and at most this many warm-up steps in all.
MAX_WARMUP_STEPS = 10

__all__ = ["STEADY_WITHIN", "MAX_WARMUP_STEPS", "measuring_done", "warmup_done"]


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


def warmup_done(step_s: Sequence[float], *, min_steps: int) -> bool:
    """Whether warm-up may end after these warm-up steps (the all-reduced step times, so every rank
    decides alike): at least ``min_steps``; from two on, until the last two agree within
    ``STEADY_WITHIN`` of the faster, at most ``MAX_WARMUP_STEPS`` (or ``min_steps`` if more). The same
    rule for every launch, judged before the first measured step: a step that still compiles, or
    fills the allocator's pools, is never measured. 0 or 1 asked for: exactly that many."""
    n = len(step_s)
    if n < min_steps:
        return False
    if min_steps < 2 or n >= max(MAX_WARMUP_STEPS, min_steps):
        return True
    a, b = step_s[-2], step_s[-1]
    return abs(a - b) <= STEADY_WITHIN * min(a, b)
