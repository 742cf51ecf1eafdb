"""Repeats and statistics: from a handful of launches to a pass, a failure, or "measure more".

One launch gives one number, and two launches of the same configuration never give the same
number: the machine, the network and the scheduler all wobble. A gate that compares two single
numbers fails on noise when the true gap is near its threshold, and passes a real regression when
noise happens to favour it. So a comparison here is made of repeats:

- inside a launch, the steady window of step times (warm-up-like leading steps dropped) gives one
  value per launch (``launch_value``);
- across launches, the per-launch values of both sides give a confidence interval of their ratio
  (``ratio_interval``);
- the gate is one-sided and has three outcomes (``decide``): the whole interval clears the
  threshold (pass), the whole interval misses it (fail), or the interval straddles it
  (inconclusive: the data cannot tell yet);
- an inconclusive comparison buys more launches, interleaved A B A B so that slow drifts of the
  machine hit both sides alike, until it is decided or the budget is spent
  (``AdaptiveComparison``);
- last nights' values are combined with outliers dropped (``robust_baseline``), so that one bad
  night does not move the reference the next night is judged against.

Standard library only: these functions run in the pytest process, between launches, and must not
pull in numpy or torch.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "AdaptiveComparison",
    "AdaptiveResult",
    "Baseline",
    "Interval",
    "Look",
    "Verdict",
    "adaptive_compare",
    "ahead_gate",
    "decide",
    "launch_value",
    "ratio_interval",
    "robust_baseline",
    "steady_window",
    "t_quantile",
    "within_gate",
]

# 1.4826 x MAD estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826


def _mad(values: Sequence[float], center: float) -> float:
    return statistics.median(abs(v - center) for v in values)


# --------------------------------------------------------------------------------------------
# Inside one launch: the steady window
# --------------------------------------------------------------------------------------------


def steady_window(
    step_times: Sequence[float],
    k: float = 3.0,
    rel_floor: float = 0.02,
    max_drop: int | None = None,
) -> list[float]:
    """The steady part of a launch's step times: leading steps that look like warm-up dropped.

    The first steps of a launch are slow for reasons that have nothing to do with the fabric
    (allocator growth, NCCL/gloo connection set-up, kernel autotuning, a cold page cache), and
    sometimes fast (a token-bucket link shaper starts with a full bucket). The configured warm-up
    steps do not always cover them. The reference for "steady" is the last half of the launch:
    its median and its MAD-based spread. Leading steps further than ``k`` spreads from that
    median are dropped, stopping at the first step that is not, so a slow step in the middle of
    the launch (a real hiccup the user should see) is kept. The spread never counts as less than
    ``rel_floor`` of the median, so a very quiet launch does not turn 1% jitter into outliers.
    At most ``max_drop`` steps (default: half of them) are dropped: the window never becomes
    smaller than the part that defined it.
    """
    times = [float(t) for t in step_times]
    if len(times) < 2:
        return times
    tail = times[len(times) // 2:]
    center = statistics.median(tail)
    scale = max(MAD_TO_SIGMA * _mad(tail, center), rel_floor * abs(center))
    limit = len(times) // 2 if max_drop is None else min(max_drop, len(times) - 1)
    start = 0
    while start < limit and abs(times[start] - center) > k * scale:
        start += 1
    return times[start:]


def launch_value(step_times: Sequence[float], **window_options: Any) -> float:
    """One launch's value: the median step time (seconds) of its steady window.

    The median, not the mean, so that a single slow step (a GC pause, a retransmit) does not
    move the launch's value. Tokens per second for the launch is tokens_per_step / this value.
    """
    if not step_times:
        raise ValueError("a launch with no step times has no value")
    return statistics.median(steady_window(step_times, **window_options))


# --------------------------------------------------------------------------------------------
# Student's t quantile (no scipy): for intervals that stay honest with 2 or 3 launches
# --------------------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` (possibly fractional) degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    if df > 1e7:
        return statistics.NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-10 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# --------------------------------------------------------------------------------------------
# Across launches: the interval of a ratio
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A confidence interval of the ratio a/b, with the point estimate and the sample sizes."""

    low: float
    point: float
    high: float
    n_a: int
    n_b: int
    confidence: float = 0.95
    method: str = "auto"

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    @property
    def width(self) -> float:
        return self.high - self.low

    def __str__(self) -> str:
        return (f"{self.point:.3f} [{self.low:.3f}, {self.high:.3f}] "
                f"({self.confidence * 100:g}% CI, {self.n_a} vs {self.n_b} launches)")


_STATISTICS: dict[str, Callable[[Sequence[float]], float]] = {
    "mean": statistics.fmean,
    "median": statistics.median,
}


def _check_samples(name: str, samples: Sequence[float]) -> list[float]:
    values = [float(x) for x in samples]
    if not values:
        raise ValueError(f"{name}: no samples")
    bad = [x for x in values if not (x > 0 and math.isfinite(x))]
    if bad:
        raise ValueError(f"{name}: per-launch values must be positive and finite, got {bad}")
    return values


def _quantile_sorted(values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of already sorted values."""
    pos = q * (len(values) - 1)
    i = int(math.floor(pos))
    j = min(i + 1, len(values) - 1)
    return values[i] + (values[j] - values[i]) * (pos - i)


def _bootstrap(a: list[float], b: list[float], stat: Callable[[Sequence[float]], float], alpha: float,
               n_boot: int, seed: int) -> tuple[float, float]:
    rng = random.Random(seed)
    choices = rng.choices
    na, nb = len(a), len(b)
    if stat is statistics.fmean:  # the hot path: sum() is several times faster than fmean()
        scale = nb / na
        ratios = sorted(scale * sum(choices(a, k=na)) / sum(choices(b, k=nb)) for _ in range(n_boot))
    else:
        ratios = sorted(stat(choices(a, k=na)) / stat(choices(b, k=nb)) for _ in range(n_boot))
    return _quantile_sorted(ratios, alpha / 2), _quantile_sorted(ratios, 1 - alpha / 2)


def _welch_log(a: list[float], b: list[float], alpha: float) -> tuple[float, float]:
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    na, nb = len(la), len(lb)
    diff = statistics.fmean(la) - statistics.fmean(lb)
    wa, wb = statistics.variance(la) / na, statistics.variance(lb) / nb
    se2 = wa + wb
    if se2 <= 0.0:
        return math.exp(diff), math.exp(diff)
    df = se2 * se2 / (wa * wa / (na - 1) + wb * wb / (nb - 1))
    half = t_quantile(1 - alpha / 2, df) * math.sqrt(se2)
    return math.exp(diff - half), math.exp(diff + half)


def ratio_interval(
    a_samples: Sequence[float],
    b_samples: Sequence[float],
    confidence: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
    statistic: str = "mean",
    method: str = "auto",
) -> Interval:
    """Two-sided ``confidence`` interval of statistic(a)/statistic(b) from per-launch values.

    ``method``:

    - ``"bootstrap"``: percentile bootstrap of the ratio (resample each side with replacement,
      ``n_boot`` times, from ``random.Random(seed)``: the same inputs always give the same
      interval). No normality assumption, and it works for the median as well as the mean; but
      with 2 or 3 launches a side it is far too narrow (it can never reach beyond the most extreme
      values it was given, while an honest interval from two values is wide).
    - ``"t"``: Welch's t interval of the difference of mean logarithms, exponentiated (the ratio
      of geometric means; for throughputs a few percent apart this is the ratio of means).
      Student's t quantiles with Welch-Satterthwaite degrees of freedom make it wide when there
      are few launches, which is exactly the small-sample honesty the bootstrap lacks.
    - ``"auto"`` (default): the envelope of both. Neither method's weakness can then make a gate
      over-confident: few launches widen it through t, skew or an outlier through the bootstrap.

    With a single launch on either side nothing is known about the noise: the interval is
    (0, inf) and every gate is inconclusive. The point estimate is always
    statistic(a)/statistic(b) of the values given.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if statistic not in _STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(_STATISTICS)}, got {statistic!r}")
    if method not in ("auto", "bootstrap", "t"):
        raise ValueError(f"method must be 'auto', 'bootstrap' or 't', got {method!r}")
    if n_boot < 100:
        raise ValueError(f"n_boot must be at least 100, got {n_boot}")
    a, b = _check_samples("a_samples", a_samples), _check_samples("b_samples", b_samples)
    stat = _STATISTICS[statistic]
    point = stat(a) / stat(b)
    if len(a) < 2 or len(b) < 2:
        return Interval(0.0, point, math.inf, len(a), len(b), confidence, method)
    alpha = 1.0 - confidence
    bounds = []
    if method in ("auto", "bootstrap"):
        bounds.append(_bootstrap(a, b, stat, alpha, n_boot, seed))
    if method in ("auto", "t"):
        bounds.append(_welch_log(a, b, alpha))
    low = min(lo for lo, _ in bounds)
    high = max(hi for _, hi in bounds)
    return Interval(min(low, point), point, max(high, point), len(a), len(b), confidence, method)


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

    ``direction=">="`` (the project's gates: the ratio must be at least the threshold): pass when
    the whole interval is at or above the threshold, fail when the whole interval is below it,
    inconclusive when it straddles. ``"<="`` is the mirror image. A two-sided interval at
    confidence 1 - alpha makes each verdict wrong with probability at most alpha/2.
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
    """(threshold, direction) of ``assert_within``: candidate/reference >= 1 - rel.

    Feed the candidate's launches as ``a`` and the reference's as ``b``.
    """
    if not 0 <= rel < 1:
        raise ValueError(f"rel must be in [0, 1), got {rel}")
    return 1.0 - rel, ">="


def ahead_gate(by: float) -> tuple[float, str]:
    """(threshold, direction) of ``assert_ahead``: reference/candidate >= 1 + by.

    Feed the reference's launches as ``a`` and the candidate's as ``b``.
    """
    if by < 0:
        raise ValueError(f"by must be >= 0, got {by}")
    return 1.0 + by, ">="


# --------------------------------------------------------------------------------------------
# The adaptive loop: launch pairs until decided or out of budget
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Look:
    """One decision point of an adaptive comparison."""

    pairs: int
    interval: Interval
    verdict: Verdict


@dataclass
class AdaptiveResult:
    interval: Interval
    verdict: Verdict
    pairs: int
    a: list[float]
    b: list[float]
    looks: list[Look]
    # "decided": a look passed or failed; "budget": still inconclusive at max_pairs.
    stopped: str

    @property
    def launches(self) -> int:
        return len(self.a) + len(self.b)


@dataclass
class AdaptiveComparison:
    """Interleaved A/B launches, added while the gate is inconclusive, up to a budget.

    The caller owns the measuring: either hand ``run`` a callable that launches A then B once and
    returns their two per-launch values, or drive it step by step (``add``, ``needs_more``,
    ``verdict``) where launches are scheduled elsewhere. A and B are interleaved pair by pair so a
    slow drift of the machine (thermal, a neighbour's job, a filling disk) lands on both sides
    instead of on whichever ran second.

    The gate is looked at after ``start_pairs`` pairs and after every pair added, up to
    ``max_pairs``. Looking repeatedly and stopping at the first decisive look makes a wrong
    verdict likelier than one look would; with ``correct_for_peeking`` (default) the error
    allowance 1 - confidence is split evenly over all the looks the budget allows (Bonferroni),
    so the whole procedure keeps the stated confidence.
    """

    threshold: float
    direction: str = ">="
    start_pairs: int = 3
    max_pairs: int = 10
    confidence: float = 0.95
    statistic: str = "mean"
    method: str = "auto"
    n_boot: int = 2000
    seed: int = 0
    correct_for_peeking: bool = True
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    looks: list[Look] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.start_pairs < 1:
            raise ValueError(f"start_pairs must be at least 1, got {self.start_pairs}")
        if self.max_pairs < self.start_pairs:
            raise ValueError(f"max_pairs ({self.max_pairs}) must be at least start_pairs ({self.start_pairs})")
        decide(Interval(1, 1, 1, 0, 0), self.threshold, self.direction)  # validates direction

    @property
    def pairs(self) -> int:
        return min(len(self.a), len(self.b))

    @property
    def look_confidence(self) -> float:
        """The confidence each look uses."""
        if not self.correct_for_peeking:
            return self.confidence
        looks = self.max_pairs - self.start_pairs + 1
        return 1.0 - (1.0 - self.confidence) / looks

    def add(self, a: float, b: float) -> None:
        self.a.append(float(a))
        self.b.append(float(b))

    def interval(self) -> Interval:
        return ratio_interval(self.a, self.b, confidence=self.look_confidence, n_boot=self.n_boot,
                              seed=self.seed, statistic=self.statistic, method=self.method)

    def verdict(self) -> Verdict:
        return decide(self.interval(), self.threshold, self.direction)

    def needs_more(self) -> bool:
        """True while another pair should be launched."""
        if self.pairs < self.start_pairs:
            return True
        if self.pairs >= self.max_pairs:
            return False
        return self.verdict() is Verdict.INCONCLUSIVE

    def run(self, measure_pair: Callable[[], tuple[float, float]]) -> AdaptiveResult:
        """Launch pairs through ``measure_pair`` until decided or at ``max_pairs``."""
        while self.pairs < self.start_pairs:
            self.add(*measure_pair())
        while True:
            interval = self.interval()
            verdict = decide(interval, self.threshold, self.direction)
            self.looks.append(Look(self.pairs, interval, verdict))
            if verdict is not Verdict.INCONCLUSIVE or self.pairs >= self.max_pairs:
                break
            self.add(*measure_pair())
        return AdaptiveResult(
            interval=interval, verdict=verdict, pairs=self.pairs, a=list(self.a), b=list(self.b),
            looks=list(self.looks), stopped="budget" if verdict is Verdict.INCONCLUSIVE else "decided")


def adaptive_compare(measure_pair: Callable[[], tuple[float, float]], threshold: float,
                     direction: str = ">=", **options) -> AdaptiveResult:
    """Functional form of ``AdaptiveComparison(threshold, direction, **options).run(measure_pair)``."""
    return AdaptiveComparison(threshold, direction, **options).run(measure_pair)


# --------------------------------------------------------------------------------------------
# Across nights: a baseline that one bad night does not move
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Baseline:
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


def robust_baseline(values: Sequence[float], k: float = 3.5, rel_floor: float = 0.01) -> Baseline:
    """Combine past nights' values into a center and a spread, dropping outliers.

    An outlier is a value whose modified z-score |x - median| / (1.4826 MAD) exceeds ``k``
    (3.5, Iglewicz and Hoaglin's rule). When more than half the values are identical the MAD is
    zero; the mean absolute deviation (x 1.2533) stands in, as the same authors suggest, so one
    deviating night among identical ones is still judged by a spread rather than by zero. The
    spread used for the rule never counts as less than ``rel_floor`` of the median: nights that
    agree to a fraction of a percent must not make a 2% night an outlier. With fewer than
    ``FEW_NIGHTS`` values that floor is ``FEW_NIGHTS_REL_FLOOR`` (seen here: of 211, 217 and 174
    tokens/s, the MAD rule dropped 174, an ordinary night on a machine that drifts 15%; only a night
    off by more than ~35% is dropped from so few). Two values cannot tell which of them is the
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
    return Baseline(center, spread, tuple(kept), tuple(dropped))
