"""Repeats and statistics: from steps and launches to a pass, a failure, or "measure more".

The data have two levels (Kalibera & Jones 2013): steps within a launch, launches within a
comparison. Both wobble, and on shared machines the wobble is one-sided and additive (Chen &
Revels 2016): a step is slowed by something else taking the CPU, the VM running slower for a
while, a GPU clocking down; nothing makes a step faster than the job allows. So:

- **Inside a launch** (``launch_estimate``): leading warm-up-like steps are dropped
  (``steady_window``), steps the node's signals mark as disturbed (something outside the job took
  the CPU or slowed the GPU: ``workload.signals``) are set aside, and the launch's value is the
  **mean** of the clean steps: tokens over the time they took, what a training job pays. (Before
  0.4 it was the 25% quantile, which resists noise but throws away exactly the cost of a fabric
  that stalls some steps: a flapping link, congestion bursts, retransmits. It is kept as the
  fast-steps diagnostic, ``fast_step_s``; the verdict line says when the mean sits more than
  ``STALL_MARGIN`` above it.) Its precision comes from batch means of the successive steps
  (``mean_standard_error``), and the rank program measures until that precision is reached, within
  a time cap (``measuring_done``), as pyperf and BenchmarkTools calibrate their loops. A launch
  disturbed as a whole (most steps, or a slow phase of the machine) is weighed down
  (``DISTURBED_SIGMA``), never dropped: weight, not veto.
- **Across launches** (``contrast_interval``): every comparison is a contrast of log
  tokens/s between groups of launches (candidate vs reference; tonight's multi-node vs one-node
  vs a baseline's), blocked by round: the launches of one round ran back to back, so the
  contrast is taken per round and its spread estimated from the rounds. That variance is
  moderated by a prior (``NoisePrior``: declared, or learned from earlier nights and stored with
  the baseline), so that one launch per side still gives an honest interval: the prior's degrees
  of freedom stand in for the launches not made. Student's t with the pooled degrees of freedom.
- **The gate** (``decide``) is one-sided with three outcomes: the whole interval clears the
  threshold (pass), lies wholly below it (fail), or straddles it (inconclusive). The threshold
  is the minimum magnitude: significance alone never fails a gate.
- **Looking repeatedly** (``SequentialGate``): an inconclusive comparison buys more launches up
  to a budget; each look spends a share of the error allowance (an O'Brien-Fleming-type
  spending function) with boundaries computed from the looks' joint distribution, so the
  whole procedure keeps its stated confidence without the union bound's waste.
- **Across nights** (``robust_baseline``): past nights combined with outlier nights dropped.

Where each part lives (this module re-exports every name of them, private ones included, so every
import of ``stats``, by its folder's path or by its old top-level one, keeps working):

- ``steps``: one launch's steps -> its value (``launch_estimate``, ``measuring_done``, ``measure_window``);
- ``contrasts``: across launches -> an interval and a verdict (``NoisePrior``, ``contrast_interval``,
  ``reference_term``, ``fabric_time_*``, ``decide``, ``within_gate``, ``ahead_gate``);
- ``sequential``: looking repeatedly (``SequentialGate``, ``obrien_fleming_spending``, ``CONFIDENCE``);
- ``across_nights``: a robust center of past nights (``robust_baseline``).

All are leaves, as this module is. No pytest: the rank programs import ``measuring_done`` too.
scipy and numpy are imported only where a quantile or a boundary is computed.
"""

from __future__ import annotations

from .across_nights import FEW_NIGHTS, FEW_NIGHTS_REL_FLOOR, RobustCenter, robust_baseline
from .contrasts import (
    _AT_LEAST,
    _AT_MOST,
    BOUND_DF,
    MIN_LEARNED_NIGHTS,
    MIN_ROUNDS,
    bound_note,
    bound_prior,
    ONE_LAUNCH,
    QUICK_LOOK_ROUND_SD,
    MIN_NIGHTS_FOR_NIGHT_VARIANCE,
    PRIOR_CHECK_P,
    Interval,
    NoisePrior,
    Verdict,
    _parts,
    ahead_gate,
    combined_noise,
    configuration_value,
    contrast_interval,
    decide,
    fabric_time_reference,
    fabric_time_sample,
    night_variance,
    pooled_noise,
    reference_term,
    within_gate,
)
from .sequential import (
    _GRID,
    CONFIDENCE,
    FAMILY_RULES,
    Look,
    SequentialGate,
    _boundaries,
    _boundary,
    _Continuation,
    obrien_fleming_spending,
)
from .steps import (
    _Z95,
    FAST_QUANTILE,
    LOCATION_QUANTILE,
    MAD_TO_SIGMA,
    MAX_DISTURBED_SHARE,
    MIN_CLEAN_STEPS,
    STALL_MARGIN,
    LaunchEstimate,
    _clean,
    _mad,
    _order_statistic_ranks,
    _quantile,
    _reason_kind,
    _steady_start,
    launch_estimate,
    location_interval,
    mean_standard_error,
    measuring_done,
    steady_window,
)

__all__ = [
    "Interval",
    "LOCATION_QUANTILE",
    "LaunchEstimate",
    "CONFIDENCE",
    "Look",
    "NoisePrior",
    "RobustCenter",
    "SequentialGate",
    "Verdict",
    "ahead_gate",
    "configuration_value",
    "contrast_interval",
    "decide",
    "launch_estimate",
    "location_interval",
    "measuring_done",
    "obrien_fleming_spending",
    "pooled_noise",
    "reference_term",
    "robust_baseline",
    "steady_window",
    "within_gate",
]
