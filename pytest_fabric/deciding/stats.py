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

No pytest: the rank programs import ``measuring_done`` too. scipy and numpy are imported only
where a quantile or a boundary is computed.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

__all__ = [
    "DEFAULT_NOISE",
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
    "measure_window",
    "location_interval",
    "measuring_done",
    "obrien_fleming_spending",
    "pooled_noise",
    "reference_term",
    "robust_baseline",
    "steady_window",
    "within_gate",
]

# 1.4826 x MAD estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826

# The quantile ``location_interval`` takes by default (the fast-steps diagnostic; the launch's value
# is the mean, ``launch_estimate``). Measured on this project's emulated cluster: between launch
# pairs of an A/A comparison the log values of the 25% quantile differed with a spread of 1.4%, the
# mean's 2.0%: the quantile is steadier, and blind to steps that stall.
LOCATION_QUANTILE = 0.25

# A launch needs this many clean steps for a value of its own; with fewer it is set aside.
MIN_CLEAN_STEPS = 3
# A launch with more than this share of its steps disturbed is set aside as a whole.
MAX_DISTURBED_SHARE = 0.5

_Z95 = 1.959964


def _mad(values: Sequence[float], center: float) -> float:
    return statistics.median(abs(v - center) for v in values)


# --------------------------------------------------------------------------------------------
# Inside one launch
# --------------------------------------------------------------------------------------------


def steady_window(
    step_times: Sequence[float],
    k: float = 3.0,
    rel_floor: float = 0.02,
    max_drop: int | None = None,
) -> list[float]:
    """The steady part of a launch's step times: leading steps that look like warm-up dropped.

    The first steps of a launch are slow for reasons that have nothing to do with the fabric
    (allocator growth, connection set-up, a cold page cache). The reference for "steady" is the
    last half of the launch: its median and its MAD-based spread. Leading steps further than
    ``k`` spreads from that median are dropped, stopping at the first step that is not, so a slow
    step in the middle of the launch is kept. The spread never counts as less than ``rel_floor``
    of the median. At most ``max_drop`` steps (default: half) are dropped.
    """
    times = [float(t) for t in step_times]
    return times[_steady_start(times, k, rel_floor, max_drop):]


def _steady_start(times: Sequence[float], k: float = 3.0, rel_floor: float = 0.02,
                  max_drop: int | None = None) -> int:
    if len(times) < 2:
        return 0
    tail = times[len(times) // 2:]
    center = statistics.median(tail)
    scale = max(MAD_TO_SIGMA * _mad(tail, center), rel_floor * abs(center))
    limit = len(times) // 2 if max_drop is None else min(max_drop, len(times) - 1)
    start = 0
    while start < limit and abs(times[start] - center) > k * scale:
        start += 1
    return start


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values."""
    pos = q * (len(sorted_values) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(sorted_values) - 1)
    return sorted_values[i] + (sorted_values[j] - sorted_values[i]) * (pos - i)


def _order_statistic_ranks(m: int, q: float, confidence: float) -> tuple[int, int] | None:
    """1-based ranks (j, k) with P(x_(j) <= q-quantile <= x_(k)) >= ``confidence`` for m values,
    from the binomial distribution (distribution-free); None when m is too small for it."""
    from scipy.stats import binom

    alpha = 1.0 - confidence
    cdf = binom.cdf(range(m + 1), m, q).tolist()  # P(at most i of the m values lie below the quantile)
    lower = [i + 1 for i in range(m + 1) if cdf[i] <= alpha / 2]
    upper = [i + 1 for i in range(m + 1) if cdf[i] >= 1 - alpha / 2]
    j, k = (max(lower) if lower else 0), (min(upper) if upper else m + 1)
    return (j, k) if j >= 1 and k <= m else None


def location_interval(times: Sequence[float], q: float = LOCATION_QUANTILE,
                      confidence: float = 0.95) -> tuple[float, float | None, float | None]:
    """(q-quantile, low, high) of ``times``; low/high None when there are too few for the interval."""
    x = sorted(float(t) for t in times)
    if not x:
        raise ValueError("no step times")
    ranks = _order_statistic_ranks(len(x), q, confidence)
    loc = _quantile(x, q)
    if ranks is None:
        return loc, None, None
    return loc, x[ranks[0] - 1], x[ranks[1] - 1]


def _clean(step_s: Sequence[float], disturbed: Sequence[str] | None) -> tuple[list[float], Counter, int]:
    """The steady, undisturbed steps; the reasons steps were set aside; how many leading steps
    the steady window dropped."""
    times = [float(t) for t in step_s]
    flags = list(disturbed) if disturbed else [""] * len(times)
    if len(flags) != len(times):
        raise ValueError(f"{len(times)} step times but {len(flags)} disturbance flags")
    start = _steady_start(times)
    reasons = Counter(_reason_kind(d) for d in flags[start:] if d)
    return [t for t, d in zip(times[start:], flags[start:]) if not d], reasons, start


def _reason_kind(reason: str) -> str:
    """"cpu steal 40 ms" -> "cpu steal", "cpu slowed 35%" -> "cpu slowed": counts group by cause (the
    words before the first figure), not by figure."""
    words = reason.split()
    cut = next((i for i, w in enumerate(words) if any(ch.isdigit() for ch in w)), len(words))
    return " ".join(words[:cut]) or reason


def measuring_done(step_s: Sequence[float], disturbed: Sequence[str] | None, *, min_steps: int, max_steps: int,
                   measure_s: float, precision: float, q: float | None = None) -> str:
    """Why measuring may stop now ("" to go on): the rank programs call this after every step.

    "precision": at least ``min_steps`` clean steady steps and the launch's value (their mean) known
    to ``precision`` (half-width of its 95% interval over the value); "time cap": ``measure_s``
    seconds of measured steps spent (with at least ``min_steps`` steps); "step cap": ``max_steps``.
    Deterministic in its inputs, so every rank, given the same all-reduced step times, stops at
    the same step. (``q`` is ignored: the value is the mean since 0.2.)
    """
    n = len(step_s)
    if n >= max_steps:
        return "step cap"
    if n < min_steps:
        return ""
    clean, _, _ = _clean(step_s, disturbed)
    if len(clean) >= max(min_steps, 2):  # one step says nothing of its own precision
        mean = statistics.fmean(clean)
        if _Z95 * mean_standard_error(clean) <= precision * mean:
            return "precision"
    if sum(step_s) >= measure_s:
        return "time cap"
    return ""


def mean_standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of successive, possibly correlated steps.

    Steps are not independent: a slow phase of the machine or a congested link lasts several steps.
    With 20 steps or more, batch means (Fishman; the method simulation output analysis and
    pyperf-style runners use): the steps cut into about sqrt(n) consecutive batches (at least 4), the
    spread of the batch means over sqrt(batches). With fewer, the naive s / sqrt(n) inflated by the
    lag-1 autocorrelation r (clipped to [0, 0.8]): sqrt((1 + r) / (1 - r)), the AR(1) effective
    sample size. 0.0 for a single step.
    """
    x = [float(v) for v in values]
    n = len(x)
    if n < 2:
        return 0.0
    mean = statistics.fmean(x)
    if n >= 20:
        batches = max(4, int(math.sqrt(n)))
        size = n // batches
        means = [statistics.fmean(x[i * size:(i + 1) * size]) for i in range(batches)]
        return statistics.stdev(means) / math.sqrt(batches)
    var = statistics.variance(x)
    if var == 0.0:
        return 0.0
    r = sum((x[i] - mean) * (x[i + 1] - mean) for i in range(n - 1)) / ((n - 1) * var)
    r = min(max(r, 0.0), 0.8)
    return math.sqrt(var / n) * math.sqrt((1 + r) / (1 - r))


# A launch's mean more than this far above its fast steps (the 25% quantile) means some steps
# stall: the verdict line says so, since a stalling fabric costs the job the difference.
STALL_MARGIN = 0.05
# The fast-steps diagnostic: this quantile of the clean steady steps.
FAST_QUANTILE = 0.25
# Weight, not veto: a launch disturbed as a whole counts, as a launch with extra launch-to-launch
# noise (log scale) would: at least this much, or as much as the disturbance measured (what other
# processes and steal took of its steps, a slowed CPU, a slow phase): next to clean launches (2%
# noise) it weighs 4% as much or less; alone, it still decides an effect far beyond its threshold
# and beyond what disturbed it, never a small one.
DISTURBED_SIGMA = 0.10
# The noise against which a launch's weight is set (its weight: WEIGHT_SIGMA^2 / (WEIGHT_SIGMA^2 +
# extra)): a property of the launch alone, so every output weighs a configuration's launches alike.
WEIGHT_SIGMA = 0.02


# How long a launch measures beyond --measure-seconds, decided before it starts (never on its own
# steps: a launch that measured longer because its own first steps stalled would, on average, end
# with fewer stalls than it should have, its value biased toward the fast steps):
# - a configuration's first launch this session measures FIRST_LAUNCH_FACTOR x --measure-seconds:
#   it is where the session learns whether the configuration's steps stall;
# - a configuration whose earlier launch stalled (its mean at least ``STALL_MARGIN`` above its fast
#   steps) measures its next launches STALL_MEASURE_FACTOR x --measure-seconds.
# Why: a mean over steps of which some stall varies from launch to launch with how many happened to
# stall (20% of 12 steps stalling x1.6: about 6% between launches; of 36: about 4%), and a gate over
# 6 launches then cannot tell an 11% loss from a 5% one. Simulated with this module's gate (5 gates
# a night, Bonferroni): such stalls fail 72% of nights with a first launch of 12 steps and the rest
# of 36, 94% with a first of 24.
FIRST_LAUNCH_FACTOR = 2.0
STALL_MEASURE_FACTOR = 3.0


def measure_window(measure_s: float, launch: int, earlier_stall: Sequence[float]) -> tuple[float, str]:
    """(seconds of measured steps launch number ``launch`` of a configuration may spend, why it is
    more than ``measure_s`` when its steps stall, else "").

    ``earlier_stall``: ``LaunchEstimate.stall`` of the configuration's earlier launches this session.
    ``measure_s`` 0 (exactly --steps steps) stays 0.
    """
    if not measure_s:
        return measure_s, ""
    worst = max(earlier_stall, default=0.0)
    if worst >= STALL_MARGIN:
        return (measure_s * STALL_MEASURE_FACTOR,
                f"an earlier launch's mean sat {worst:.0%} above its fast steps (steps stall): measuring up to "
                f"{measure_s * STALL_MEASURE_FACTOR:g} s instead of {measure_s:g} s")
    return (measure_s * FIRST_LAUNCH_FACTOR if launch == 0 else measure_s), ""


@dataclass(frozen=True)
class LaunchEstimate:
    """One launch's value and what went into it."""

    step_s: float  # the mean of the clean steady steps: the launch's step time (what the job pays)
    log_se: float  # standard error of log(step_s) from the launch's own steps (batch means)
    steps: int  # measured steps
    used: int  # clean steady steps the value rests on
    warmup_like: int  # leading steps the steady window dropped
    set_aside: dict[str, int] = field(default_factory=dict)  # disturbed steps by cause
    # Why the whole launch is down-weighted ("" when it is not): too few clean steps, most steps
    # disturbed, or the machine in a slow phase for the whole launch.
    disturbed: str = ""
    fast_step_s: float = 0.0  # the 25% quantile of the same steps: the fast steps, a diagnostic
    # How far the disturbance may have moved the value (log scale), when disturbed as a whole.
    disturbance: float = 0.0

    @property
    def set_aside_steps(self) -> int:
        return sum(self.set_aside.values())

    @property
    def extra_var(self) -> float:
        """Extra variance (log scale) the gates give this launch when disturbed as a whole: the larger
        of ``DISTURBED_SIGMA`` and the measured disturbance, squared."""
        return max(DISTURBED_SIGMA, self.disturbance) ** 2 if self.disturbed else 0.0

    @property
    def weight(self) -> float:
        """The launch's weight in its configuration's value: 1 clean, about 0.04 disturbed."""
        return WEIGHT_SIGMA ** 2 / (WEIGHT_SIGMA ** 2 + self.extra_var)

    @property
    def stall(self) -> float:
        """How far the mean sits above the fast steps (0.08: the mean step 8% longer)."""
        return self.step_s / self.fast_step_s - 1.0 if self.fast_step_s > 0 else 0.0

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return tokens_per_step / self.step_s

    def describe(self) -> str:
        """How the value was taken, in words (the measurement summary)."""
        if self.disturbed:
            return f"mean of {self.used} of {self.steps} steps; launch down-weighted: {self.disturbed}"
        aside = f", {self.set_aside_steps} disturbed set aside" if self.set_aside_steps else ""
        return f"mean of {self.used} of {self.steps} steps{aside}; fast steps {self.fast_step_s * 1000:.1f} ms"


def launch_estimate(step_s: Sequence[float], disturbed: Sequence[str] | None = None,
                    q: float | None = None, slow_phase: float = 0.0,
                    loss: Sequence[float] | None = None) -> LaunchEstimate:
    """The launch's value (the mean of its clean steady steps: tokens over the time they took, what
    the job pays) and its own precision (``mean_standard_error``, in logs).

    A launch with fewer than ``MIN_CLEAN_STEPS`` clean steps, more than half of its steps
    disturbed, or run in a slow phase of the machine (``slow_phase`` > 0: its fastest CPU probe that
    much slower than its configuration's fastest launch's, as ``workload.signals.slow_phase`` judged) is marked ``disturbed``:
    its value falls back to all steady steps when too few are clean, and the gates weigh it down
    (``DISTURBED_SIGMA``) instead of dropping it. The 25% quantile (``fast_step_s``) is kept as a
    diagnostic: the mean far above it says some steps stall.

    ``loss``: per step, the share of its time the disturbance took (0..1; ``measure.result_estimate``
    reads it from the signals). A launch disturbed as a whole carries as ``disturbance`` how far
    that may have moved its value: the log ratio of all steady steps' mean to the clean steps' mean
    where enough are clean, else -log(1 - mean loss of the disturbed steps), and log(1 + slow_phase).
    """
    if not step_s:
        raise ValueError("a launch with no step times has no value")
    clean, reasons, start = _clean(step_s, disturbed)
    steady = len(step_s) - start
    why = []
    if len(clean) < MIN_CLEAN_STEPS or sum(reasons.values()) > MAX_DISTURBED_SHARE * steady:
        if reasons:
            why.append(f"{sum(reasons.values())} of {steady} steps disturbed ("
                       + ", ".join(f"{kind}: {n}" for kind, n in reasons.most_common()) + ")")
        else:
            why.append(f"only {len(clean)} steady steps (at least {MIN_CLEAN_STEPS} needed)")
        if len(clean) < MIN_CLEAN_STEPS:
            clean = [float(t) for t in step_s[start:]]
    if slow_phase > 0:
        why.append(f"machine slow {slow_phase:.0%} for the whole launch (its fastest CPU probe against the "
                   f"fastest of its configuration's launches)")
    mean = statistics.fmean(clean)
    log_se = mean_standard_error(clean) / mean
    fast = _quantile(sorted(clean), FAST_QUANTILE)
    magnitude = 0.0
    if why:
        steady_times = [float(t) for t in step_s[start:]]
        flags = (list(disturbed) if disturbed else [""] * len(step_s))[start:]
        clean_only = [t for t, d in zip(steady_times, flags) if not d]
        if len(clean_only) >= MIN_CLEAN_STEPS:
            magnitude = abs(math.log(statistics.fmean(steady_times) / statistics.fmean(clean_only)))
        elif loss:
            lost = [min(max(float(x), 0.0), 0.95) for x, d in zip(list(loss)[start:], flags) if d]
            magnitude = -math.log(1 - statistics.fmean(lost)) if lost else 0.0
        magnitude = max(magnitude, math.log1p(slow_phase))
    return LaunchEstimate(mean, log_se, len(step_s), len(clean), start, dict(reasons), "; ".join(why), fast,
                          magnitude)


# --------------------------------------------------------------------------------------------
# Across launches: the interval of a contrast of log tokens/s
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoisePrior:
    """What is known about launch-to-launch variation before tonight's launches.

    ``sigma``: the standard deviation of one launch's log value around its configuration's true
    value (0.02: launches of one configuration differ by about 2%), ``df``: how much evidence it
    rests on, in degrees of freedom (a declared default: a few; learned from nights: the launches
    that measured it). ``source`` says where it came from, for the verdict line.
    """

    sigma: float
    df: float
    source: str = "declared"
    nights: int = 0  # learned from this many nights (0: declared)

    def __post_init__(self) -> None:
        if not (0 < self.sigma < 1 and self.df > 0):
            raise ValueError(f"launch noise needs 0 < sigma < 1 and df > 0, got sigma={self.sigma}, df={self.df}")


# Measured on this project's emulated cluster (README, "How verdicts are decided"): launches of one
# configuration, valued as above, differ by 1-2%; declared with little weight, so that a night's own
# launches soon outweigh it.
DEFAULT_NOISE = NoisePrior(0.02, 4.0, "declared default")


def pooled_noise(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """(pooled variance, degrees of freedom) of log values around each group's own mean.

    Each group holds the log values of launches of one configuration; groups of one contribute
    nothing. (0.0, 0) when no group has two launches.
    """
    ss, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            mean = statistics.fmean(g)
            ss += sum((x - mean) ** 2 for x in g)
            df += len(g) - 1
    return (ss / df if df else 0.0), df


def configuration_value(launch_values: Sequence[float], weights: Sequence[float] | None = None) -> float:
    """One configuration's value from its launches' values: their (weighted) geometric mean.

    ``weights``: each launch's ``LaunchEstimate.weight`` (1 for a clean launch, about 0.04 for one
    disturbed as a whole); default all 1. The contrasts judge the same weighted means of log values,
    so this is the estimate every verdict rests on; the terminal, JUnit, reports, saved nights and
    baselines show the same number.
    """
    values = [float(v) for v in launch_values]
    if not values or not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"launch values must be positive and finite, got {values}")
    w = [1.0] * len(values) if weights is None else [float(x) for x in weights]
    if len(w) != len(values) or not all(x > 0 for x in w):
        raise ValueError(f"one positive weight per launch value needed, got {weights} for {len(values)} values")
    return math.exp(sum(x * math.log(v) for x, v in zip(w, values)) / sum(w))


def reference_term(values: Sequence[float], prior: NoisePrior | None = None) -> tuple[float, float]:
    """(log value, variance) of a configuration known from elsewhere (a baseline's nights or a
    saved night's launches), as ``contrast_interval``'s ``fixed`` term.

    The variance of one value is the values' own sample variance of logs, moderated by the prior
    like tonight's launches (with one value: the prior alone), over the number of values; plus the
    **night-to-night** component (``night_variance``): tonight is one more night, and its own night
    effect is not in tonight's rounds.
    """
    prior = prior or DEFAULT_NOISE
    logs = [math.log(configuration_value([v])) for v in values]
    s2, df = pooled_noise([logs])
    var_one = (prior.df * prior.sigma ** 2 + df * s2) / (prior.df + df)
    return statistics.fmean(logs), var_one / len(logs) + night_variance(s2, df, prior)


# Below this many nights the spread of nightly values says too little of a night component to add.
MIN_NIGHTS_FOR_NIGHT_VARIANCE = 3


def night_variance(s2_nights: float, df: int, prior: NoisePrior) -> float:
    """The night-to-night variance component: the nightly values' spread beyond what launch noise
    alone explains (s2 - sigma0^2, a night taken as one launch: the smaller, conservative reading),
    0 with fewer than ``MIN_NIGHTS_FOR_NIGHT_VARIANCE`` nights. Without it a regression interval
    holds only the launch noise, and with a night SD of 2% the gate's error at the threshold grows
    to ~18% a side."""
    if df + 1 < MIN_NIGHTS_FOR_NIGHT_VARIANCE:
        return 0.0
    return max(0.0, s2_nights - prior.sigma ** 2)


# --------------------------------------------------------------------------------------------
# Regression on the time the fabric adds to a step
# --------------------------------------------------------------------------------------------
#
# A step on n nodes is the one-node step (the same work per GPU: FSDP keeps the per-GPU batch)
# plus what crossing the fabric adds: u_n = u_1 + x, with u = 1 / (tokens/s/GPU). A fabric
# regression is x growing. Judging u_n alone (raw tokens/s) reads a faster or slower machine as
# a fabric change where the job is compute-bound; judging u_1 / u_n (scaling efficiency) reads it
# so where the job is communication-bound (u_1 moves with the machine, u_n hardly does: tonight's
# one-node launch 7% faster moves the efficiency 7%). Tonight's x put on the baseline's one-node
# step, 1 / (u_n - u_1 + U_1), is tonight's tokens/s/GPU as the baseline's machine would have run
# it: a machine drift cancels exactly where nothing overlaps, and moves it by the drift times
# u_1 / u_n (the compute share) where communication hides compute, against the whole drift for
# efficiency. Everything below is on log tokens/s/GPU, variances by the delta method.


def fabric_time_sample(multi: Sequence[float], one: Sequence[float],
                       one_reference: float) -> tuple[float, float, float]:
    """One round's (log tokens/s/GPU, within-launch variance, extra variance) of the n-node launch
    ``multi`` with its one-node step (the same round's ``one``) replaced by the baseline's
    (``one_reference``, log tokens/s/GPU): log 1 / (u_n - u_1 + U_1). ``multi`` and ``one`` are
    ``Measurement.sample`` tuples; variances carry through by the delta method. The added time is
    kept at least 5% of the step (a round whose one-node launch is slower than its n-node one by
    more than the baseline's whole one-node step is noise, not a faster fabric)."""
    (lm, wm, em), (l1, w1, e1) = _parts(multi), _parts(one)
    um, u1, ub = math.exp(-lm), math.exp(-l1), math.exp(-one_reference)
    d = max(um - u1 + ub, 0.05 * um)
    a, b = (um / d) ** 2, (u1 / d) ** 2
    return -math.log(d), a * wm + b * w1, a * em + b * e1


def fabric_time_reference(noise_n: NoisePrior, noise_1: NoisePrior,
                          nights: Sequence[tuple[float, float]] = (),
                          apart: tuple[Sequence[float], Sequence[float]] | None = None,
                          ) -> tuple[tuple[float, float], float, NoisePrior]:
    """The baseline's side of a fabric-time regression: ((log tokens/s/GPU of its n-node
    configuration, variance), log tokens/s/GPU of its one-node one, the launch noise of a round's
    value), as ``contrast_interval``'s ``fixed`` term (negated by the caller),
    ``fabric_time_sample``'s ``one_reference`` and the gate's prior.

    ``nights``: (log n-node, log one-node) tokens/s/GPU of each baseline night that measured both.
    The variance is that of z = log n-node - a log one-node over the nights (a = U_1 / U_n, the
    derivative of the contrast in the one-node term), so what moved both of a night's values
    cancels as far as it should; moderated by the prior like ``reference_term``. ``apart``:
    instead of nights, each side's tokens/s/GPU values (a single saved night), each taken by
    ``reference_term`` with its own noise: their variances add. The prior is the two
    configurations' launch noise (``noise_n``, ``noise_1``) weighted 1 and a (``combined_noise``).
    """
    if apart is not None:
        (ln, vn), (l1, v1) = reference_term(apart[0], noise_n), reference_term(apart[1], noise_1)
    elif nights:
        ln = statistics.fmean(m for m, _ in nights)
        l1 = statistics.fmean(o for _, o in nights)
    else:
        raise ValueError("a fabric-time reference needs at least one night with both configurations")
    a = math.exp(ln - l1)
    prior = combined_noise([(1.0, noise_n), (a, noise_1)])
    if apart is not None:
        return (ln, vn + a * a * v1), l1, prior
    s2, df = pooled_noise([[m - a * o for m, o in nights]])
    var_one = (prior.df * prior.sigma ** 2 + df * s2) / (prior.df + df)
    return (ln, var_one / len(nights) + night_variance(s2, df, prior)), l1, prior


def combined_noise(parts: Sequence[tuple[float, NoisePrior]]) -> NoisePrior:
    """The launch noise of sum_i w_i x_i for independent launches x_i with priors ``parts``
    ((w_i, prior_i)): sigma^2 = sum w_i^2 sigma_i^2, resting on the least-supported part's df."""
    sigma = math.sqrt(sum(w * w * p.sigma ** 2 for w, p in parts))
    sources = list(dict.fromkeys(p.source for _, p in parts))
    return NoisePrior(min(max(sigma, 1e-6), 0.99), min(p.df for _, p in parts), "; ".join(sources),
                      nights=min(p.nights for _, p in parts))


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval of a ratio of tokens/s (a contrast of log tokens/s)."""

    low: float
    point: float
    high: float
    confidence: float
    df: float  # degrees of freedom of the t quantile: the prior's plus the launches'
    sigma: float  # launch-to-launch standard deviation (log scale) the interval used
    launches: tuple[int, ...]  # launches in each group, in the contrast's order
    # What the interval's noise rests on when it is not simply the prior moderated by the launches:
    # the prior widened for one launch per side, or set aside because tonight's rounds disagree.
    noise_note: str = ""
    data_df: int = 0  # degrees of freedom from tonight's launches (the rest: the prior's)

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low

    def __str__(self) -> str:
        return (f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.confidence * 100:.4g}% CI, "
                f"{'+'.join(map(str, self.launches))} launches)")


# One launch per side has no launch-to-launch spread of its own: its interval is the prior's alone.
# A prior learned from at least this many nights of the configurations is trusted for that...
MIN_LEARNED_NIGHTS = 3
# ... any other (the declared default, a user's --launch-noise, a baseline of fewer nights) is
# widened to at least this launch noise with this few degrees of freedom, so that only an effect
# far beyond the threshold (ib 3-5x ahead of eth) decides on one launch, never a small one.
UNLEARNED_SIGMA = 0.10
UNLEARNED_DF = 3.0
# Tonight's rounds are checked against the prior (an F-test of their spread over the prior's
# variance); beyond this one-sided p the prior is set aside and the interval rests on the rounds.
PRIOR_CHECK_P = 0.01


def _parts(sample: Sequence[float]) -> tuple[float, float, float]:
    """(log value, within-launch variance, extra variance) of a sample given as 2 or 3 numbers."""
    return (float(sample[0]), float(sample[1]), float(sample[2]) if len(sample) > 2 else 0.0)


def one_launch_prior(prior: NoisePrior) -> NoisePrior:
    """The prior a contrast of one launch per side uses: ``prior`` itself when learned from at least
    ``MIN_LEARNED_NIGHTS`` nights, else widened (``UNLEARNED_SIGMA``, ``UNLEARNED_DF``)."""
    if prior.nights >= MIN_LEARNED_NIGHTS:
        return prior
    return NoisePrior(max(prior.sigma, UNLEARNED_SIGMA), min(prior.df, UNLEARNED_DF),
                      f"{prior.source}, widened to {max(prior.sigma, UNLEARNED_SIGMA):.0%}: one launch per side "
                      f"decides a small effect only on a noise learned from {MIN_LEARNED_NIGHTS} nights", prior.nights)


def contrast_interval(
    groups: Sequence[tuple[float, Sequence[Sequence[float]]]],
    prior: NoisePrior = DEFAULT_NOISE,
    confidence: float = 0.95,
    fixed: tuple[float, float] = (0.0, 0.0),
    blocked: bool = False,
) -> Interval:
    """Interval of exp(sum_g c_g mean_g + fixed_log) for groups of launches of one configuration each.

    ``groups``: (coefficient, [(log value, within-launch variance[, extra variance]), ...]). A ratio
    candidate / reference of tokens/s is [(+1, candidate), (-1, reference)]; a scaling efficiency
    tonight against a baseline adds the one-node groups with the opposite signs. ``fixed``: (log
    value, variance) of a term known from elsewhere (a baseline built from many nights).

    **Weight, not veto**: a launch disturbed as a whole carries extra variance e
    (``LaunchEstimate.extra_var``); each group's mean_g is weighted by 1 / (WEIGHT_SIGMA^2 + e), the
    weights ``configuration_value`` uses, so the ratio shown is the ratio of the values shown.

    The variance of one launch's log value is never taken as less than the prior's sigma^2 or
    the launches' own within-launch variance w (a launch cannot be known better than its steps
    allow): the prior's part is max(sigma0^2, w), with the prior's weight df0. Tonight's part comes
    from the clean launches only (disturbed ones would inflate it by their own extra):

    - unblocked: pooled over the groups (each around its own mean), df = sum (k_g - 1);
    - ``blocked`` (every group the same length k, launch i of each group run in the same round): the
      contrast per round, c_i = sum_g c_g x_gi, over the rounds whose launches are all clean, its
      spread divided by sum_g c_g^2 per launch (rounds - 1 df). Slow drifts of the machine that hit
      both launches of a round cancel (Kalibera & Jones' advice: compare within the level that
      varies most).

    Moderated: s2 = (df0 floor + df s2_tonight) / (df0 + df), unless tonight's spread is too large for
    the prior (F = s2_tonight / floor beyond its ``PRIOR_CHECK_P`` quantile): then s2 = s2_tonight on
    df alone, and ``noise_note`` says so. With one launch in every group (no spread tonight) the
    prior is ``one_launch_prior``'s. The contrast's variance is sum_g c_g^2 sum_i omega_gi^2 (s2 +
    e_gi) + fixed variance; Student's t on the degrees of freedom used.
    """
    from scipy.stats import f as f_dist
    from scipy.stats import t as student_t

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not groups or any(not samples for _, samples in groups):
        raise ValueError("every group of a contrast needs at least one launch")
    parts = [(c, [_parts(s) for s in samples]) for c, samples in groups]
    note = ""
    if all(len(samples) == 1 for _, samples in parts):
        widened = one_launch_prior(prior)
        if widened is not prior:
            note = f"one launch per side: launch noise widened to {widened.sigma:.0%} ({widened.df:g} df)"
        prior = widened
    estimate = fixed[0]
    omegas = []
    for c, samples in parts:
        w = [1.0 / (WEIGHT_SIGMA ** 2 + e) for _, _, e in samples]
        omega = [x / sum(w) for x in w]
        omegas.append(omega)
        estimate += c * sum(o * v for o, (v, _, _) in zip(omega, samples))
    within = statistics.fmean(w for _, samples in parts for _, w, _ in samples)
    floor = max(prior.sigma ** 2, within)
    weights = sum(c * c for c, _ in parts)
    if blocked:
        k = len(parts[0][1])
        if any(len(samples) != k for _, samples in parts):
            raise ValueError("a blocked contrast needs the same number of launches in every group")
        clean_rounds = [i for i in range(k) if all(samples[i][2] == 0.0 for _, samples in parts)]
        per_round = [sum(c * samples[i][0] for c, samples in parts) for i in clean_rounds]
        s2_rounds, df = pooled_noise([per_round])
        s2_tonight = s2_rounds / weights
    else:
        s2_tonight, df = pooled_noise([[v for v, _, e in samples if e == 0.0] for _, samples in parts])
    s2 = (prior.df * floor + df * s2_tonight) / (prior.df + df)
    dof = prior.df + df
    if df >= 2 and s2_tonight > floor:
        p = float(f_dist.sf(s2_tonight / floor, df, prior.df))
        if p < PRIOR_CHECK_P:
            note = (f"tonight's launches vary {math.sqrt(s2_tonight):.1%}, beyond the prior's {math.sqrt(floor):.1%} "
                    f"(F = {s2_tonight / floor:.1f}, p = {p:.2g}): the prior set aside")
            s2, dof = s2_tonight, float(df)
    variance = sum(c * c * sum(o * o * (s2 + e) for o, (_, _, e) in zip(omega, samples))
                   for (c, samples), omega in zip(parts, omegas)) + fixed[1]
    half = float(student_t.ppf(1 - (1 - confidence) / 2, dof)) * math.sqrt(variance)
    return Interval(math.exp(estimate - half), math.exp(estimate), math.exp(estimate + half), confidence, dof,
                    math.sqrt(s2), tuple(len(samples) for _, samples in parts), note, df)


# --------------------------------------------------------------------------------------------
# The gate: pass, fail, or not yet known
# --------------------------------------------------------------------------------------------


class Verdict(str, Enum):
    PASS = "pass"
    FAIL = "fail"
    INCONCLUSIVE = "inconclusive"

    def __str__(self) -> str:
        return self.value


_AT_LEAST = (">=", "at_least", "above")
_AT_MOST = ("<=", "at_most", "below")


def decide(interval: Interval, threshold: float, direction: str = ">=") -> Verdict:
    """One-sided gate on an interval: pass, fail, or inconclusive.

    ``">="`` (the project's gates: the ratio must be at least the threshold): pass when the
    whole interval is at or above the threshold, fail when it lies wholly below, inconclusive
    when it straddles. ``"<="`` is the mirror image. A two-sided interval at confidence 1 - alpha
    makes each verdict wrong with probability at most alpha/2.
    """
    if direction in _AT_LEAST:
        if interval.low >= threshold:
            return Verdict.PASS
        if interval.high < threshold:
            return Verdict.FAIL
        return Verdict.INCONCLUSIVE
    if direction in _AT_MOST:
        if interval.high <= threshold:
            return Verdict.PASS
        if interval.low > threshold:
            return Verdict.FAIL
        return Verdict.INCONCLUSIVE
    raise ValueError(f"direction must be '>=' or '<=', got {direction!r}")


def within_gate(rel: float) -> tuple[float, str]:
    """(threshold, direction) of "within": candidate/reference >= 1 - rel. The one definition of the
    rule and its range: the plain gates, the repeated-launch gates and suite files all use it."""
    if not 0 <= rel < 1:
        raise ValueError(f"rel must be a fraction in [0, 1), got {rel}")
    return 1.0 - rel, ">="


def ahead_gate(by: float) -> tuple[float, str]:
    """(threshold, direction) of "ahead": reference/candidate >= 1 + by (the one definition, as
    ``within_gate``)."""
    if not 0 <= by < math.inf:
        raise ValueError(f"by must be a fraction >= 0, got {by}")
    return 1.0 + by, ">="


@dataclass(frozen=True)
class Look:
    """One decision point of a sequential gate."""

    launches: int  # launches per group at this look (the largest group)
    interval: Interval
    verdict: Verdict


def obrien_fleming_spending(t: float, alpha: float) -> float:
    """Error allowance spent by information fraction ``t`` (0 < t <= 1) of a two-sided test at
    level ``alpha``: the Lan-DeMets O'Brien-Fleming-type function spent on each side,
    alpha/2 (t) = 2 (1 - Phi(z_{1-alpha/4} / sqrt(t))), as gsDesign's ``sfLDOF``. Little early,
    alpha at t = 1."""
    if t >= 1.0:
        return alpha
    z = statistics.NormalDist().inv_cdf(1 - alpha / 4)
    return 4 * (1 - statistics.NormalDist().cdf(z / math.sqrt(t)))


# Points of the grid on which the continuation density is carried from look to look (odd: Simpson).
_GRID = 801


@dataclass(frozen=True)
class _Continuation:
    """The sub-density of the standardized statistic Z at a look, over the region where the
    procedure went on (|Z| < the look's boundary), on a grid with Simpson weights."""

    t: float
    grid: object  # numpy arrays; numpy is imported only where boundaries are computed
    weighted: object  # density x Simpson weight at each grid point


@functools.lru_cache(maxsize=256)
def _boundaries(alpha: float, times: tuple[float, ...]) -> tuple[float, _Continuation]:
    """The boundary of the last of looks at information fractions ``times`` (strictly increasing),
    each spending its share of ``obrien_fleming_spending``; cached, as every gate of a session
    looks at the same fractions."""
    previous = _boundaries(alpha, times[:-1])[1] if len(times) > 1 else None
    spent = obrien_fleming_spending(times[-2], alpha) if len(times) > 1 else 0.0
    return _boundary(previous, times[-1], obrien_fleming_spending(times[-1], alpha) - spent)


def _boundary(previous: _Continuation | None, t: float, share: float) -> tuple[float, _Continuation]:
    """The two-sided boundary c of a look at information fraction ``t`` whose exit probability,
    given that no earlier look stopped, is ``share``; and the continuation density beyond it.

    Z at successive looks is a Brownian motion in information time: Z_t = r Z_prev + s e with
    r = sqrt(t_prev / t), s = sqrt(1 - r^2) (Armitage, McPherson & Rowe 1969; Jennison & Turnbull
    2000, ch. 19). The exit probability is integrated over the previous continuation density."""
    import numpy as np
    from scipy.optimize import brentq
    from scipy.stats import norm

    if previous is None:
        c = float(norm.ppf(1 - share / 2))
    else:
        r = math.sqrt(previous.t / t)
        s = math.sqrt(1 - r * r)
        u, wf = previous.grid, previous.weighted

        def exits(c: float) -> float:
            return float(np.sum(wf * (norm.cdf((-c - r * u) / s) + norm.cdf((-c + r * u) / s))))

        total = exits(0.0)  # the whole mass still going on: the most this look can spend
        c = 0.0 if share >= total else float(brentq(lambda c: exits(c) - share, 0.0, 40.0, xtol=1e-10))
    grid = np.linspace(-c, c, _GRID)
    weights = np.ones(_GRID)
    weights[1:-1:2], weights[2:-1:2] = 4.0, 2.0
    weights *= (grid[1] - grid[0]) / 3
    if previous is None:
        density = norm.pdf(grid)
    else:
        density = (norm.pdf((grid[:, None] - r * previous.grid[None, :]) / s) / s) @ previous.weighted
    return c, _Continuation(t, grid, density * weights)


# The two-sided confidence of a gate's interval. A gate's verdicts are one-sided (pass: the interval
# clears the threshold; fail: it lies wholly beyond), so each is wrong with probability at most
# (1 - CONFIDENCE) / 2 = 5%: the two one-sided tests at 5% of equivalence testing (Schuirmann's
# TOST, whose interval is the two-sided 90% one), spent over the looks below.
CONFIDENCE = 0.90
# How a night's gates share the allowance for false failures (--family-wise), the default first:
# "bonferroni": a failure must hold at alpha / m over the m gates of the night; "none": each alone.
FAMILY_RULES = ("bonferroni", "none")


@dataclass
class SequentialGate:
    """A gate looked at after ``start`` launches per side and again as launches are added, up to
    ``budget``. Looking repeatedly and stopping at the first decisive look makes a wrong verdict
    likelier than one look would, so the looks share the error allowance alpha = 1 - confidence
    as a group-sequential design does (Lan & DeMets 1983): by information fraction t (launches
    spent over the budget) the looks together may have spent at most
    ``obrien_fleming_spending(t)``, and each look's boundary is set so that, given the looks
    before it went on, it spends exactly its share. The boundaries come from the joint
    distribution of the successive statistics (numerical integration), not from a union bound,
    so they are as wide as the stated confidence needs and no wider: with looks at 2..6 launches
    of 6 and 90% confidence the last look uses a nominal 92.1% where a union bound would use
    96.4%. Early looks
    spend little (only a large effect decides there). A look's boundary c becomes the interval's
    nominal confidence 2 Phi(c) - 1, with Student's t quantile (the usual use of group-sequential
    boundaries when the variance is estimated). A single look (start == budget) spends all of
    alpha."""

    threshold: float
    direction: str = ">="
    start: int = 2
    budget: int = 6
    confidence: float = CONFIDENCE
    prior: NoisePrior = DEFAULT_NOISE
    # Gates judged in the same night: a failure must hold at the error allowance over this many
    # (Bonferroni on the failing side; ``FAMILY_RULES``), so that a night of many gates keeps its
    # chance of any false failure at the stated rate.
    family: int = 1
    looks: list[Look] = field(default_factory=list)
    _times: tuple[float, ...] = field(default=(), init=False, repr=False)  # information fractions looked at

    def __post_init__(self) -> None:
        if self.start < 1:
            raise ValueError(f"start must be at least 1, got {self.start}")
        if self.budget < self.start:
            raise ValueError(f"budget ({self.budget}) must be at least start ({self.start})")
        if self.direction not in (*_AT_LEAST, *_AT_MOST):
            raise ValueError(f"direction must be '>=' or '<=', got {self.direction!r}")
        if not 0.0 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def _fraction(self, launches: int) -> float:
        if self.start >= self.budget:
            return 1.0
        return min(1.0, launches / self.budget)

    def spending(self, launches: int) -> float:
        """Error allowance spent by all looks up to ``launches`` launches (per side)."""
        return obrien_fleming_spending(self._fraction(launches), 1.0 - self.confidence)

    def _next(self, launches: int) -> tuple[float, tuple[float, ...]]:
        t = self._fraction(launches)
        if self._times and t <= self._times[-1]:
            return 1.0 - 1e-12, self._times  # the same information again: nothing left to spend on it
        times = (*self._times, t)
        c, _ = _boundaries(1.0 - self.confidence, times)
        return 2 * statistics.NormalDist().cdf(c) - 1, times

    def look_confidence(self, launches: int) -> float:
        """The nominal confidence a look after ``launches`` launches uses (given the looks before it)."""
        return self._next(launches)[0]

    def look(self, groups: Sequence[tuple[float, Sequence[tuple[float, float]]]],
             fixed: tuple[float, float] = (0.0, 0.0), blocked: bool = False, launches: int | None = None) -> Look:
        """Judge ``groups`` now; ``launches``: launches spent per side so far (default: the
        largest group), which decides this look's share of the error allowance."""
        spent = max(len(s) for _, s in groups) if launches is None else launches
        confidence, self._times = self._next(spent)
        interval = contrast_interval(groups, self.prior, min(confidence, 1 - 1e-12), fixed, blocked)
        verdict = decide(interval, self.threshold, self.direction)
        if verdict is Verdict.FAIL and self.family > 1:
            # Bonferroni over the night's gates, on the failing side: a failure needs the interval
            # whose error allowance is the look's over the number of gates to lie beyond the threshold.
            wide = contrast_interval(groups, self.prior, min(1 - (1 - confidence) / self.family, 1 - 1e-12),
                                     fixed, blocked)
            verdict = decide(wide, self.threshold, self.direction)
            if verdict is not Verdict.FAIL:
                # Shown as judged: the family's interval, which straddles the threshold.
                verdict, interval = Verdict.INCONCLUSIVE, wide
        look = Look(spent, interval, verdict)
        self.looks.append(look)
        return look


# --------------------------------------------------------------------------------------------
# Across nights: a center that one bad night does not move
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RobustCenter:
    center: float
    # Robust standard deviation (1.4826 x MAD) of the values kept; 0 with fewer than 2 kept.
    spread: float
    kept: tuple[float, ...]
    dropped: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.kept)

    @property
    def rel_spread(self) -> float:
        return self.spread / abs(self.center) if self.center else math.inf


# Below this many nights the MAD is itself fragile (of 3 values it is the smaller of two deviations):
# the spread used to name outliers then never counts as less than FEW_NIGHTS_REL_FLOOR of the median.
FEW_NIGHTS = 5
FEW_NIGHTS_REL_FLOOR = 0.10


def robust_baseline(values: Sequence[float], k: float = 3.5, rel_floor: float = 0.01) -> RobustCenter:
    """Combine past nights' values into a center and a spread, dropping outliers.

    An outlier is a value whose modified z-score |x - median| / (1.4826 MAD) exceeds ``k``
    (3.5, Iglewicz and Hoaglin's rule). When more than half the values are identical the MAD is
    zero; the mean absolute deviation (x 1.2533) stands in. The spread used for the rule never
    counts as less than ``rel_floor`` of the median; with fewer than ``FEW_NIGHTS`` values that
    floor is ``FEW_NIGHTS_REL_FLOOR`` (of 211, 217 and 174 tokens/s the MAD rule dropped 174, an
    ordinary night on a machine that drifts 15%). Two values cannot tell which of them is the
    outlier: both are kept. The center is the median of the values kept.
    """
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("no values to make a baseline from")
    if len(vals) <= 2:
        kept = vals
    else:
        med = statistics.median(vals)
        scale = MAD_TO_SIGMA * _mad(vals, med)
        if scale == 0.0:
            scale = 1.2533 * statistics.fmean(abs(v - med) for v in vals)
        floor = max(rel_floor, FEW_NIGHTS_REL_FLOOR) if len(vals) < FEW_NIGHTS else rel_floor
        scale = max(scale, floor * abs(med))
        kept = vals if scale == 0.0 else [v for v in vals if abs(v - med) <= k * scale]
    dropped = [v for v in vals if v not in kept]
    center = statistics.median(kept)
    spread = MAD_TO_SIGMA * _mad(kept, center) if len(kept) >= 2 else 0.0
    return RobustCenter(center, spread, tuple(kept), tuple(dropped))
