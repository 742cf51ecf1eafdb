"""Across launches: a configuration's value, the interval of a contrast of log tokens/s, the gate.

Part of the statistics (README, "How verdicts are decided").
Every comparison is a contrast of log tokens/s between groups of launches (candidate vs reference;
tonight's multi-node vs one-node vs a baseline's), blocked by round (``contrast_interval``): the mean
of the rounds' contrasts, every launch alike, with the paired t interval of tonight's rounds (at
least 3), pooled with a noise learned from earlier nights where a baseline has one (``NoisePrior``);
with fewer rounds and nothing learned, against a stated bound of the noise (``QUICK_LOOK_ROUND_SD``).
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

__all__ = [
    "Interval", "MIN_LEARNED_NIGHTS", "MIN_NIGHTS_FOR_NIGHT_VARIANCE", "NoisePrior",
    "MIN_ROUNDS", "PRIOR_CHECK_P", "QUICK_LOOK_ROUND_SD", "BOUND_DF", "Verdict", "ahead_gate",
    "bound_note", "bound_prior", "combined_noise", "configuration_value", "contrast_interval", "decide",
    "fabric_time_reference", "fabric_time_sample", "night_variance", "pooled_noise", "reference_term",
    "within_gate",
]

# --------------------------------------------------------------------------------------------
# Across launches: the interval of a contrast of log tokens/s
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NoisePrior:
    """What is known about launch-to-launch variation before tonight's launches: learned from
    earlier nights (a baseline's ``launch_noise``), or the stated bound (``bound_prior``).

    ``sigma``: the standard deviation of one launch's log value around its configuration's true
    value (0.02: launches of one configuration differ by about 2%), ``df``: how much evidence it
    rests on, in degrees of freedom (the launches that measured it). ``source`` says where it came
    from, for the verdict line.
    """

    sigma: float
    df: float
    source: str = "learned"
    nights: int = 0  # learned from this many nights

    def __post_init__(self) -> None:
        if not (0 < self.sigma < 1 and self.df > 0):
            raise ValueError(f"launch noise needs 0 < sigma < 1 and df > 0, got sigma={self.sigma}, df={self.df}")


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
    """One configuration's value from its launches' values: their geometric mean, every launch
    alike. The contrasts judge the same means of log values, so this is the estimate every verdict
    rests on; the terminal, JUnit, reports, saved nights and baselines show the same number."""
    values = [float(v) for v in launch_values]
    if not values or not all(v > 0 and math.isfinite(v) for v in values):
        raise ValueError(f"launch values must be positive and finite, got {values}")
    return math.exp(statistics.fmean(math.log(v) for v in values))


def reference_term(values: Sequence[float], prior: NoisePrior | None = None,
                   per_night: float = 1.0) -> tuple[float, float]:
    """(log value, variance) of a configuration known from elsewhere (a baseline's nightly values,
    each the mean of ``per_night`` launches, or a saved night's launches: ``per_night`` 1), as
    ``contrast_interval``'s ``fixed`` term.

    A nightly value varies by the launch noise over its launches plus the night-to-night component
    tau^2: its variance is estimated from the values' own spread, moderated by the prior's
    sigma^2 / per_night (the least it can be); over the number of values; plus tau^2 again
    (``night_variance``): tonight is one more night, and its own night effect is not in tonight's
    rounds. With one value and no prior: the stated bound (``bound_prior``).
    """
    logs = [math.log(configuration_value([v])) for v in values]
    s2, df = pooled_noise([logs])
    if prior is None and df == 0:
        prior = bound_prior(None)
    if prior is None:
        var_one = max(s2, RESOLUTION ** 2)
    else:
        floor = prior.sigma ** 2 / per_night
        var_one = (prior.df * floor + df * max(s2, floor)) / (prior.df + df)
    return statistics.fmean(logs), var_one / len(logs) + night_variance(s2, df, prior, per_night)


# Below this many nights the spread of nightly values says too little of a night component to add.
MIN_NIGHTS_FOR_NIGHT_VARIANCE = 3


def night_variance(s2_nights: float, df: int, prior: NoisePrior | None, per_night: float = 1.0) -> float:
    """The night-to-night variance component tau^2: a nightly value (the mean of ``per_night``
    launches) varies by tau^2 + sigma^2 / per_night, so tau^2 = s2 - sigma^2 / per_night (unbiased
    where s2 and sigma^2 are; clipped at 0), 0 with fewer than ``MIN_NIGHTS_FOR_NIGHT_VARIANCE``
    nights. Without it a regression interval holds only the launch noise, and with a night SD of 2%
    the gate's error at the threshold grows to ~18% a side."""
    if df + 1 < MIN_NIGHTS_FOR_NIGHT_VARIANCE:
        return 0.0
    sigma2 = prior.sigma ** 2 if prior is not None else 0.0
    return max(0.0, s2_nights - sigma2 / max(per_night, 1.0))


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
                       one_reference: float) -> tuple[float, float]:
    """One round's (log tokens/s/GPU, within-launch variance) of the n-node launch ``multi`` with its
    one-node step (the same round's ``one``) replaced by the baseline's (``one_reference``, log
    tokens/s/GPU): log 1 / (u_n - u_1 + U_1). ``multi`` and ``one`` are ``Measurement.sample``
    pairs; the variance carries through by the delta method. The added time is kept at least 5% of
    the step (a round whose one-node launch is slower than its n-node one by more than the baseline's
    whole one-node step is noise, not a faster fabric)."""
    (lm, wm), (l1, w1) = _parts(multi), _parts(one)
    um, u1, ub = math.exp(-lm), math.exp(-l1), math.exp(-one_reference)
    d = max(um - u1 + ub, 0.05 * um)
    a, b = (um / d) ** 2, (u1 / d) ** 2
    return -math.log(d), a * wm + b * w1


def fabric_time_reference(noise_n: NoisePrior | None, noise_1: NoisePrior | None,
                          nights: Sequence[tuple[float, float]] = (),
                          apart: tuple[Sequence[float], Sequence[float]] | None = None,
                          per_night: float = 1.0,
                          ) -> tuple[tuple[float, float], float, NoisePrior | None]:
    """The baseline's side of a fabric-time regression: ((log tokens/s/GPU of its n-node
    configuration, variance), log tokens/s/GPU of its one-node one, the launch noise of a round's
    value), as ``contrast_interval``'s ``fixed`` term (negated by the caller),
    ``fabric_time_sample``'s ``one_reference`` and the gate's prior.

    ``nights``: (log n-node, log one-node) tokens/s/GPU of each baseline night that measured both,
    each the mean of ``per_night`` launches. The variance is that of z = log n-node - a log one-node
    over the nights (a = U_1 / U_n, the derivative of the contrast in the one-node term), so what
    moved both of a night's values cancels as far as it should; taken as ``reference_term`` takes
    nightly values. ``apart``: instead of nights, each side's tokens/s/GPU values (a single saved
    night), each taken by ``reference_term`` with its own noise: their variances add. The prior is
    the two configurations' launch noise (``noise_n``, ``noise_1``) weighted 1 and a
    (``combined_noise``; None where either is unknown).
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
    z = [m - a * o for m, o in nights]
    return (ln, reference_term([math.exp(v) for v in z], prior, per_night)[1]), l1, prior


def combined_noise(parts: Sequence[tuple[float, NoisePrior | None]]) -> NoisePrior | None:
    """The launch noise of sum_i w_i x_i for independent launches x_i with priors ``parts``
    ((w_i, prior_i)): sigma^2 = sum w_i^2 sigma_i^2, resting on the least-supported part's df; None
    where any part's noise is unknown."""
    known = [(w, p) for w, p in parts if p is not None]
    if len(known) < len(parts):
        return None
    sigma = math.sqrt(sum(w * w * p.sigma ** 2 for w, p in known))
    sources = list(dict.fromkeys(p.source for _, p in known))
    return NoisePrior(min(max(sigma, 1e-6), 0.99), min(p.df for _, p in known), "; ".join(sources),
                      nights=min(p.nights for _, p in known))


@dataclass(frozen=True)
class Interval:
    """A two-sided confidence interval of a ratio of tokens/s (a contrast of log tokens/s)."""

    low: float
    point: float
    high: float
    confidence: float
    df: float  # degrees of freedom of the t quantile: the prior's plus the rounds'
    sigma: float  # launch-to-launch standard deviation (log scale) the interval used
    launches: tuple[int, ...]  # launches in each group, in the contrast's order
    # Where the interval's noise came from, in words: tonight's rounds, pooled with a learned noise,
    # the stated bound, or a learned noise set aside because tonight's rounds disagree with it.
    noise_note: str = ""
    data_df: int = 0  # degrees of freedom from tonight's launches (the rest: the prior's)
    source: str = ""  # the noise's source in a few words: "tonight's 4 rounds", "the noise bound, 15% per round"

    @property
    def width(self) -> float:
        return self.high - self.low

    def __str__(self) -> str:
        return (f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}] ({self.confidence * 100:.4g}% CI, "
                f"{'+'.join(map(str, self.launches))} launches)")


# The least launch-to-launch SD an interval uses: a launch's value is never known better than this
# (timers, whole steps in a window), so identical launches give a narrow interval, not an empty one.
RESOLUTION = 0.001
# Tonight's rounds alone give the interval's noise (paired t) from this many rounds on; fewer rounds
# lean on a noise learned from earlier nights (a baseline's), else on the stated bound below.
MIN_ROUNDS = 3
# With one launch per side a learned noise is used alone only when it was learned from at least this
# many nights of the configurations compared (``baselines.baseline_noise``); with fewer, one launch
# cannot check it, and the bound stands in.
MIN_LEARNED_NIGHTS = 3
# The stated bound of the noise: the largest round-to-round SD of a round's log ratio measured on any
# cluster the project has run, 13.8% on this 2-core VM's emulated cluster (10-step windows; nights of
# launches one after the other 1.9-11%), rounded up. GPU clusters vary far less (0.5-2% per round),
# so there the bound is conservative. Taken as known (BOUND_DF): at a first look of 99.86% an effect
# beyond about 3.2 bounds (a ratio 1.6 x past its threshold) decides; a 10% effect stays
# inconclusive, and the line says what would decide it.
QUICK_LOOK_ROUND_SD = 0.15
BOUND_DF = 1000.0
# Tonight's rounds are checked against a learned noise (an F-test of their spread over its
# variance); beyond this one-sided p the learned noise is set aside (the verdict line warns) and the
# interval rests on tonight's rounds alone.
PRIOR_CHECK_P = 0.01


def _parts(sample: Sequence[float]) -> tuple[float, float]:
    """(log value, within-launch variance) of a sample."""
    return float(sample[0]), float(sample[1])


def bound_prior(prior: NoisePrior | None) -> NoisePrior:
    """The stated noise bound as a prior: ``QUICK_LOOK_ROUND_SD`` per round, a launch's share of it,
    taken as known (a larger learned noise wins)."""
    sigma = max(prior.sigma if prior is not None else 0.0, QUICK_LOOK_ROUND_SD / math.sqrt(2))
    return NoisePrior(sigma, BOUND_DF, f"the noise bound, {QUICK_LOOK_ROUND_SD:.0%} per round",
                      prior.nights if prior is not None else 0)


def bound_note(rounds: int) -> str:
    """What the line of a look judged against the noise bound says of its noise."""
    return (f"too few rounds for tonight's own noise ({rounds} of {MIN_ROUNDS}) and no noise learned from {MIN_LEARNED_NIGHTS} nights: "
            f"judged against the noise bound, {QUICK_LOOK_ROUND_SD:.0%} per round (the largest measured on any "
            f"cluster), so only large effects decide; {MIN_ROUNDS} rounds (--repeats {MIN_ROUNDS}) or a "
            f"baseline's learned noise (pytest-fabric baseline, --fabric-baseline) decide smaller ones")


def contrast_interval(
    groups: Sequence[tuple[float, Sequence[Sequence[float]]]],
    prior: NoisePrior | None = None,
    confidence: float = 0.95,
    fixed: tuple[float, float] = (0.0, 0.0),
    blocked: bool = False,
) -> Interval:
    """Interval of exp(sum_g c_g mean_g + fixed_log) for groups of launches of one configuration each.

    ``groups``: (coefficient, [(log value, within-launch variance), ...]). A ratio candidate /
    reference of tokens/s is [(+1, candidate), (-1, reference)]; a scaling efficiency tonight
    against a baseline adds the one-node groups with the opposite signs. ``fixed``: (log value,
    variance) of a term known from elsewhere (a baseline built from many nights). Every launch
    counts alike (mean_g: the plain mean of the group's log values).

    Tonight's noise: ``blocked`` (every group the same length k, launch i of each group run in the
    same round): the paired design, the contrast per round c_i = sum_g c_g x_gi, its spread over
    the rounds divided by sum_g c_g^2 per launch (k - 1 df): drifts of the machine that hit both
    launches of a round cancel. Unblocked: pooled over the groups, each around its own mean. Never
    taken as less than the launches' own within-launch variance w (a launch cannot be known better
    than its steps allow).

    The noise the interval uses (``noise_note`` says which):

    - a learned ``prior`` (a baseline's): pooled with tonight's, s2 = (df0 sigma0^2 + df s2) /
      (df0 + df), unless tonight's spread is too large for it (an F-test beyond ``PRIOR_CHECK_P``):
      then tonight's alone, and the note warns. With one launch per side, only a prior learned
      from ``MIN_LEARNED_NIGHTS`` nights of these configurations is used alone;
    - no prior: tonight's alone from ``MIN_ROUNDS`` rounds (paired t);
    - otherwise (fewer rounds, nothing learned): the stated bound (``bound_prior``), as known.

    The contrast's variance is sum_g c_g^2 s2 / k_g + fixed variance; Student's t on the degrees of
    freedom used.
    """
    from scipy.stats import f as f_dist
    from scipy.stats import t as student_t

    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if not groups or any(not samples for _, samples in groups):
        raise ValueError("every group of a contrast needs at least one launch")
    parts = [(c, [_parts(s) for s in samples]) for c, samples in groups]
    estimate = fixed[0] + sum(c * statistics.fmean(v for v, _ in samples) for c, samples in parts)
    within = max(statistics.fmean(w for _, samples in parts for _, w in samples), RESOLUTION ** 2)
    weights = sum(c * c for c, _ in parts)
    if blocked:
        k = len(parts[0][1])
        if any(len(samples) != k for _, samples in parts):
            raise ValueError("a blocked contrast needs the same number of launches in every group")
        s2_rounds, df = pooled_noise([[sum(c * samples[i][0] for c, samples in parts) for i in range(k)]])
        s2_tonight = s2_rounds / weights
    else:
        s2_tonight, df = pooled_noise([[v for v, _ in samples] for _, samples in parts])
    rounds = df + 1
    one_each = all(len(samples) == 1 for _, samples in parts)
    note = ""
    if prior is not None and not (one_each and prior.nights < MIN_LEARNED_NIGHTS):
        floor = max(prior.sigma ** 2, within)
        s2 = (prior.df * floor + df * max(s2_tonight, within)) / (prior.df + df)
        dof = prior.df + df
        note = source = f"{prior.source}" + (f", pooled with tonight's {df} df" if df else "")
        if df >= 2 and s2_tonight > floor:
            p = float(f_dist.sf(s2_tonight / floor, df, prior.df))
            if p < PRIOR_CHECK_P:
                note = (f"WARNING: tonight's rounds vary {math.sqrt(s2_tonight):.1%}, beyond the learned "
                        f"{math.sqrt(floor):.1%} (F = {s2_tonight / floor:.1f}, p = {p:.2g}): the learned noise set "
                        f"aside, tonight's rounds alone")
                s2, dof = max(s2_tonight, within), float(df)
                source = f"tonight's {rounds} rounds (learned noise set aside)"
    elif df >= MIN_ROUNDS - 1:
        s2, dof = max(s2_tonight, within), float(df)
        note = source = f"tonight's {rounds} rounds"
    else:
        prior = bound_prior(prior)
        s2, dof = max(prior.sigma ** 2, within), prior.df
        note, source = bound_note(rounds), prior.source
    variance = sum(c * c * s2 / len(samples) for c, samples in parts) + fixed[1]
    # Capped where a look on few degrees of freedom asks for an extreme level (e^50: no threshold lies beyond).
    half = min(float(student_t.ppf(1 - (1 - confidence) / 2, dof)) * math.sqrt(variance), 50.0)
    return Interval(math.exp(estimate - half), math.exp(estimate), math.exp(estimate + half), confidence, dof,
                    math.sqrt(s2), tuple(len(samples) for _, samples in parts), note, df, source)


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
