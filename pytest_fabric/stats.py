"""Repeats and statistics: from steps and launches to a pass, a failure, or "measure more".

The data have two levels (Kalibera & Jones 2013): steps within a launch, launches within a
comparison. Both wobble, and on shared machines the wobble is one-sided and additive (Chen &
Revels 2016): a step is slowed by something else taking the CPU, the VM running slower for a
while, a GPU clocking down; nothing makes a step faster than the job allows. So:

- **Inside a launch** (``launch_estimate``): leading warm-up-like steps are dropped
  (``steady_window``), steps the node's signals mark as disturbed are set aside
  (``workload.signals``), and the launch's value is a low quantile of the clean steps
  (``LOCATION_QUANTILE``, the 25% quantile: it resists upward excursions), with a
  distribution-free interval from order statistics that gives the launch's own precision. The rank program measures until that precision is reached, within a
  time cap (``measuring_done``), as pyperf and BenchmarkTools calibrate their loops.
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

# The launch's value is this quantile of its clean steady steps. Noise on shared machines is additive
# and one-sided (excursions upward from a floor), so a low quantile estimates the undisturbed step
# far more stably than the median or the mean. Measured on this project's emulated cluster
# (README, "How verdicts are decided"): between launch pairs of an A/A comparison the log values
# of the 25% quantile differed with a spread of 1.4%, the median's 2.6%, the mean's 2.0%; the
# minimum (2.0%) rests on one step; a lower quantile needs more steps for its own interval.
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
                   measure_s: float, precision: float, q: float = LOCATION_QUANTILE) -> str:
    """Why measuring may stop now ("" to go on): the rank programs call this after every step.

    "precision": at least ``min_steps`` clean steady steps and the launch's value known to
    ``precision`` (half-width of its 95% interval over the value); "time cap": ``measure_s``
    seconds of measured steps spent (with at least ``min_steps`` steps); "step cap": ``max_steps``.
    Deterministic in its inputs, so every rank, given the same all-reduced step times, stops at
    the same step.
    """
    n = len(step_s)
    if n >= max_steps:
        return "step cap"
    if n < min_steps:
        return ""
    clean, _, _ = _clean(step_s, disturbed)
    if len(clean) >= min_steps:
        loc, low, high = location_interval(clean, q)
        if low is not None and high is not None and (high - low) / 2 <= precision * loc:
            return "precision"
    if sum(step_s) >= measure_s:
        return "time cap"
    return ""


@dataclass(frozen=True)
class LaunchEstimate:
    """One launch's value and what went into it."""

    step_s: float  # the quantile of the clean steady steps: the launch's step time
    log_se: float  # standard error of log(step_s) from the launch's own steps
    steps: int  # measured steps
    used: int  # clean steady steps the value rests on
    warmup_like: int  # leading steps the steady window dropped
    set_aside: dict[str, int] = field(default_factory=dict)  # disturbed steps by cause
    # Why the whole launch is set aside ("" when it is not): too few clean steps.
    disturbed: str = ""

    @property
    def set_aside_steps(self) -> int:
        return sum(self.set_aside.values())

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return tokens_per_step / self.step_s


def launch_estimate(step_s: Sequence[float], disturbed: Sequence[str] | None = None,
                    q: float = LOCATION_QUANTILE) -> LaunchEstimate:
    """The launch's value (``LOCATION_QUANTILE`` of its clean steady steps) and its own precision.

    The standard error of log(value) comes from the order-statistic interval of the quantile
    (half-width / 1.96, in logs); with too few steps for that interval, from the MAD of the log
    step times (x the quantile's asymptotic factor / sqrt(n)). A launch with fewer than
    ``MIN_CLEAN_STEPS`` clean steps, or more than half of its steps disturbed, is marked
    ``disturbed``: its value falls back to all steady steps, and the gates set it aside.
    """
    if not step_s:
        raise ValueError("a launch with no step times has no value")
    clean, reasons, start = _clean(step_s, disturbed)
    steady = len(step_s) - start
    why = ""
    if len(clean) < MIN_CLEAN_STEPS or sum(reasons.values()) > MAX_DISTURBED_SHARE * steady:
        if reasons:
            why = (f"{sum(reasons.values())} of {steady} steps disturbed ("
                   + ", ".join(f"{kind}: {n}" for kind, n in reasons.most_common()) + ")")
        else:
            why = f"only {len(clean)} steady steps (at least {MIN_CLEAN_STEPS} needed)"
        if len(clean) < MIN_CLEAN_STEPS:
            clean = [float(t) for t in step_s[start:]]
    loc, low, high = location_interval(clean, q)
    if low is not None and high is not None and low > 0:
        log_se = (math.log(high) - math.log(low)) / (2 * _Z95)
    else:
        logs = [math.log(t) for t in clean]
        center = statistics.median(logs)
        spread = MAD_TO_SIGMA * _mad(logs, center) if len(logs) > 1 else 0.0
        # The q quantile's asymptotic standard error for normal data: sqrt(q (1 - q)) / phi(z_q) sigma / sqrt(n)
        # (1.2533 for the median, 1.3626 for the 25% quantile).
        normal = statistics.NormalDist()
        factor = math.sqrt(q * (1 - q)) / normal.pdf(normal.inv_cdf(q))
        log_se = factor * spread / math.sqrt(len(logs))
    return LaunchEstimate(loc, log_se, len(step_s), len(clean), start, dict(reasons), why)


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


def configuration_value(launch_values: Sequence[float]) -> float:
    """One configuration's value from its launches' values: their geometric mean.

    The contrasts judge means of log values, so this is the estimate every verdict rests on; the
    terminal, JUnit, reports, saved nights and baselines show the same number.
    """
    values = [float(v) for v in launch_values]
    if not values or not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"launch values must be positive and finite, got {values}")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def reference_term(values: Sequence[float], prior: NoisePrior | None = None) -> tuple[float, float]:
    """(log value, variance) of a configuration known from elsewhere (a baseline's nights or a
    saved night's launches), as ``contrast_interval``'s ``fixed`` term.

    The variance of one value is the values' own sample variance of logs, moderated by the prior
    like tonight's launches (with one value: the prior alone), over the number of values.
    """
    prior = prior or DEFAULT_NOISE
    logs = [math.log(configuration_value([v])) for v in values]
    s2, df = pooled_noise([logs])
    var_one = (prior.df * prior.sigma ** 2 + df * s2) / (prior.df + df)
    return statistics.fmean(logs), var_one / len(logs)


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


def fabric_time_sample(multi: tuple[float, float], one: tuple[float, float],
                       one_reference: float) -> tuple[float, float]:
    """One round's (log tokens/s/GPU, within-launch variance) of the n-node launch ``multi`` with
    its one-node step (the same round's ``one``) replaced by the baseline's (``one_reference``, log
    tokens/s/GPU): log 1 / (u_n - u_1 + U_1). The added time is kept at least 5% of the step
    (a round whose one-node launch is slower than its n-node one by more than the baseline's
    whole one-node step is noise, not a faster fabric)."""
    (lm, wm), (l1, w1) = multi, one
    um, u1, ub = math.exp(-lm), math.exp(-l1), math.exp(-one_reference)
    d = max(um - u1 + ub, 0.05 * um)
    return -math.log(d), (um / d) ** 2 * wm + (u1 / d) ** 2 * w1


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
    return (ln, var_one / len(nights)), l1, prior


def combined_noise(parts: Sequence[tuple[float, NoisePrior]]) -> NoisePrior:
    """The launch noise of sum_i w_i x_i for independent launches x_i with priors ``parts``
    ((w_i, prior_i)): sigma^2 = sum w_i^2 sigma_i^2, resting on the least-supported part's df."""
    sigma = math.sqrt(sum(w * w * p.sigma ** 2 for w, p in parts))
    sources = list(dict.fromkeys(p.source for _, p in parts))
    return NoisePrior(min(max(sigma, 1e-6), 0.99), min(p.df for _, p in parts), "; ".join(sources))


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

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low

    def __str__(self) -> str:
        return (f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.confidence * 100:.4g}% CI, "
                f"{'+'.join(map(str, self.launches))} launches)")


def contrast_interval(
    groups: Sequence[tuple[float, Sequence[tuple[float, float]]]],
    prior: NoisePrior = DEFAULT_NOISE,
    confidence: float = 0.95,
    fixed: tuple[float, float] = (0.0, 0.0),
    blocked: bool = False,
) -> Interval:
    """Interval of exp(sum_g c_g mean_g + fixed_log) for groups of launches of one configuration each.

    ``groups``: (coefficient, [(log value, within-launch variance), ...]). A ratio candidate /
    reference of tokens/s is [(+1, candidate), (-1, reference)]; a scaling efficiency tonight
    against a baseline adds the one-node groups with the opposite signs. ``fixed``: (log value,
    variance) of a term known from elsewhere (a baseline built from many nights).

    The variance of one launch's log value is never taken as less than the prior's sigma^2 or
    the launches' own within-launch variance w (a launch cannot be known better than its steps
    allow): the prior's part is max(sigma0^2, w), with the prior's weight df0.

    Unblocked: the launches' variance is pooled over the groups (each around its own mean):
    s2 = (df0 max(sigma0^2, w) + df s2_launches) / (df0 + df); the contrast's variance is
    s2 sum_g c_g^2 / k_g.

    ``blocked`` (every group the same length k, launch i of each group run in the same round, one
    after the other): the contrast is computed per round, c_i = sum_g c_g x_gi, and its variance
    from the spread of the c_i (k - 1 df), moderated by the prior's sum_g c_g^2 max(sigma0^2, w).
    Slow drifts of the machine that hit both launches of a round cancel (Kalibera & Jones' advice:
    compare within the level that varies most).

    Degrees of freedom df0 + df; quantile Student's t (scipy).
    """
    from scipy.stats import t as student_t

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not groups or any(not samples for _, samples in groups):
        raise ValueError("every group of a contrast needs at least one launch")
    estimate = fixed[0]
    for c, samples in groups:
        estimate += c * statistics.fmean(v for v, _ in samples)
    within = statistics.fmean(w for _, samples in groups for _, w in samples)
    floor = max(prior.sigma ** 2, within)
    weights = sum(c * c for c, _ in groups)
    if blocked:
        k = len(groups[0][1])
        if any(len(samples) != k for _, samples in groups):
            raise ValueError("a blocked contrast needs the same number of launches in every group")
        per_round = [sum(c * samples[i][0] for c, samples in groups) for i in range(k)]
        s2_rounds, df = pooled_noise([per_round])
        s2 = (prior.df * weights * floor + df * s2_rounds) / (prior.df + df)
        variance = s2 / k + fixed[1]
        sigma = math.sqrt(s2 / weights)  # per launch, as if the rounds' noise were shared evenly
    else:
        s2_launches, df = pooled_noise([[v for v, _ in samples] for _, samples in groups])
        s2 = (prior.df * floor + df * s2_launches) / (prior.df + df)
        variance = s2 * sum(c * c / len(samples) for c, samples in groups) + fixed[1]
        sigma = math.sqrt(s2)
    dof = prior.df + df
    half = float(student_t.ppf(1 - (1 - confidence) / 2, dof)) * math.sqrt(variance)
    return Interval(math.exp(estimate - half), math.exp(estimate), math.exp(estimate + half), confidence, dof,
                    sigma, tuple(len(samples) for _, samples in groups))


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
        look = Look(spent, interval, decide(interval, self.threshold, self.direction))
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
