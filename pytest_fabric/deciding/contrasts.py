"""Across launches: a configuration's value, the interval of a contrast of log tokens/s, the gate.

Part of the statistics (``stats`` re-exports every name; its docstring gives the whole design).
Every comparison is a contrast of log tokens/s between groups of launches (candidate vs reference;
tonight's multi-node vs one-node vs a baseline's), blocked by round (``contrast_interval``). Its
variance is moderated by a prior (``NoisePrior``: declared, or learned from earlier nights), so that
one launch per side still gives an honest interval; Student's t on the pooled degrees of freedom.
A configuration known from elsewhere enters as a fixed term (``reference_term``, with the
night-to-night component ``night_variance``); the fabric-time regression (``fabric_time_*``) puts
tonight's added time on the baseline's one-node step. The gate (``decide``) is one-sided with three
outcomes (pass, fail, inconclusive); ``within_gate`` and ``ahead_gate`` define the thresholds.

A leaf; scipy is imported only where a quantile is computed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from .steps import WEIGHT_SIGMA

__all__ = [
    "DEFAULT_NOISE", "Interval", "MIN_LEARNED_NIGHTS", "MIN_NIGHTS_FOR_NIGHT_VARIANCE", "NoisePrior",
    "ONE_LAUNCH", "PRIOR_CHECK_P", "QUICK_LOOK_ROUND_SD", "BOUND_DF", "Verdict", "ahead_gate", "combined_noise",
    "configuration_value", "contrast_interval", "decide", "fabric_time_reference", "fabric_time_sample",
    "night_variance", "one_launch_note", "one_launch_prior", "pooled_noise", "reference_term", "within_gate",
]

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
    # the noise bound of one launch per side, or the prior set aside because tonight's rounds disagree.
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
# A prior learned from at least this many nights of the configurations compared (a baseline's:
# ``baselines.baseline_noise``) is used as it is. Any other (the declared default, a user's
# --launch-noise, a baseline of fewer nights or of other configurations) is a guess that one launch
# cannot check, so the interval rests instead on a stated bound of the noise:
MIN_LEARNED_NIGHTS = 3
# the largest round-to-round SD of a round's log ratio measured on any cluster the project has run:
# 13.8% on this 2-core VM's emulated cluster (10-step windows; stop 27's window study: 7.7-13.8%;
# nights of launches one after the other 1.9-11%), rounded up. GPU clusters vary far less (0.5-2% per
# round), so there the bound is conservative. Taken as known (BOUND_DF): at a first look of
# 99.86% an effect beyond about 3.2 bounds (a ratio 1.6 x past its threshold) decides; a 10% effect
# stays inconclusive, and the line says what would decide it.
QUICK_LOOK_ROUND_SD = 0.15
BOUND_DF = 1000.0
# How the line of such a look begins its note (``one_launch_note``).
ONE_LAUNCH = "one launch per side"
# Tonight's rounds are checked against the prior (an F-test of their spread over the prior's
# variance); beyond this one-sided p the prior is set aside and the interval rests on the rounds.
PRIOR_CHECK_P = 0.01


def _parts(sample: Sequence[float]) -> tuple[float, float, float]:
    """(log value, within-launch variance, extra variance) of a sample given as 2 or 3 numbers."""
    return (float(sample[0]), float(sample[1]), float(sample[2]) if len(sample) > 2 else 0.0)


def one_launch_prior(prior: NoisePrior) -> NoisePrior:
    """The prior a contrast of one launch per side uses: ``prior`` itself when learned from at least
    ``MIN_LEARNED_NIGHTS`` nights of the configurations, else the noise bound (``QUICK_LOOK_ROUND_SD``
    per round, a launch's share of it, as known; a larger prior wins)."""
    if prior.nights >= MIN_LEARNED_NIGHTS:
        return prior
    sigma = max(prior.sigma, QUICK_LOOK_ROUND_SD / math.sqrt(2))
    return NoisePrior(sigma, BOUND_DF, f"the noise bound, {QUICK_LOOK_ROUND_SD:.0%} per round (no noise learned "
                                       f"from {MIN_LEARNED_NIGHTS} nights of these configurations)", prior.nights)


def one_launch_note(prior: NoisePrior) -> str:
    """What the line of a contrast of one launch per side says of its noise ("" on a learned one)."""
    if prior.nights >= MIN_LEARNED_NIGHTS:
        return ""
    return (f"{ONE_LAUNCH}: judged against the noise bound, {QUICK_LOOK_ROUND_SD:.0%} per round (the "
            f"largest measured on any cluster), so only large effects decide; a noise learned from "
            f"{MIN_LEARNED_NIGHTS} nights (pytest-fabric baseline, --fabric-baseline) or --repeats 2 decides "
            f"smaller ones")


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
    prior is ``one_launch_prior``'s: a prior learned from nights of these configurations, else the
    stated noise bound (``QUICK_LOOK_ROUND_SD``). The contrast's variance is sum_g c_g^2 sum_i omega_gi^2 (s2 +
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
        note = one_launch_note(prior)
        prior = one_launch_prior(prior)
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
