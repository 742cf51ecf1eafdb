"""One launch's steps -> its value: steady window, disturbed steps set aside, the mean and its precision.

Every launch measures one window fixed before it starts (``workload/window.py``), the same for
every launch of every configuration. Inside a launch
(``launch_estimate``): leading warm-up-like steps are dropped (``steady_window``), steps the node's
signals mark as disturbed are set aside, and the launch's value is the **mean** of the clean steps:
tokens over the time they took, what a training job pays. Its precision (batch means,
``mean_standard_error``) and the 25% quantile (``fast_step_s``: the mean far above it says steps
stall) are diagnostics, shown and recorded. A launch disturbed as a whole is flagged
(``LaunchEstimate.disturbed``): its round is launched again (``rounds.run_rounds``).

A leaf, no pytest; scipy only where a quantile's interval is computed.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "FAST_QUANTILE", "LOCATION_QUANTILE", "LaunchEstimate", "MAD_TO_SIGMA", "MAX_DISTURBED_SHARE",
    "MIN_CLEAN_STEPS", "STALL_MARGIN", "launch_estimate", "location_interval", "mean_standard_error",
    "steady_window",
]

# 1.4826 x MAD estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826

# The quantile ``location_interval`` takes by default (the fast-steps diagnostic; the launch's value
# is the mean, ``launch_estimate``). Measured on this project's emulated cluster: between launch
# pairs of an A/A comparison the log values of the 25% quantile differed with a spread of 1.4%, the
# mean's 2.0%: the quantile is steadier, and blind to steps that stall.
LOCATION_QUANTILE = 0.25

# A launch whose flagged steps leave fewer clean ones than this is disturbed as a whole (its value
# then falls back to all its steady steps).
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


@dataclass(frozen=True)
class LaunchEstimate:
    """One launch's value and what went into it."""

    step_s: float  # the mean of the clean steady steps: the launch's step time (what the job pays)
    log_se: float  # standard error of log(step_s) from the launch's own steps (batch means)
    steps: int  # measured steps
    used: int  # clean steady steps the value rests on
    warmup_like: int  # leading steps the steady window dropped
    set_aside: dict[str, int] = field(default_factory=dict)  # disturbed steps by cause
    # Why the whole launch is disturbed ("" when it is not): too few clean steps, most steps
    # disturbed, or the machine in a slow phase for the whole launch. Its round is re-run.
    disturbed: str = ""
    fast_step_s: float = 0.0  # the 25% quantile of the same steps: the fast steps, a diagnostic

    @property
    def set_aside_steps(self) -> int:
        return sum(self.set_aside.values())

    @property
    def stall(self) -> float:
        """How far the mean sits above the fast steps (0.08: the mean step 8% longer)."""
        return self.step_s / self.fast_step_s - 1.0 if self.fast_step_s > 0 else 0.0

    def tokens_per_s(self, tokens_per_step: int) -> float:
        return tokens_per_step / self.step_s

    def describe(self) -> str:
        """How the value was taken, in words (the measurement summary)."""
        if self.disturbed:
            return f"mean of {self.used} of {self.steps} steps; launch disturbed: {self.disturbed}"
        aside = f", {self.set_aside_steps} disturbed set aside" if self.set_aside_steps else ""
        return f"mean of {self.used} of {self.steps} steps{aside}; fast steps {self.fast_step_s * 1000:.1f} ms"


def launch_estimate(step_s: Sequence[float], disturbed: Sequence[str] | None = None) -> LaunchEstimate:
    """The launch's value (the mean of its clean steady steps: tokens over the time they took, what
    the job pays) and its own precision (``mean_standard_error``, in logs).

    A launch whose flagged steps leave fewer than ``MIN_CLEAN_STEPS`` clean ones or are more than
    half of its steps is marked ``disturbed``: its value falls back to all steady steps when too few
    are clean, and its round is launched again (``rounds.run_rounds``).
    The 25% quantile (``fast_step_s``) is kept as a diagnostic: the mean far above it says some steps
    stall.
    """
    if not step_s:
        raise ValueError("a launch with no step times has no value")
    clean, reasons, start = _clean(step_s, disturbed)
    steady = len(step_s) - start
    why = []
    # Disturbed: something outside the job took the launch (its signals flagged most steps, or so
    # many that too few clean ones are left). A short window without flags is the window asked for
    # (--steps 1), not a disturbance: its steps count as they are.
    if reasons and (len(clean) < MIN_CLEAN_STEPS or sum(reasons.values()) > MAX_DISTURBED_SHARE * steady):
        why.append(f"{sum(reasons.values())} of {steady} steps disturbed ("
                   + ", ".join(f"{kind}: {n}" for kind, n in reasons.most_common()) + ")")
    if len(clean) < MIN_CLEAN_STEPS:
        clean = [float(t) for t in step_s[start:]]
    mean = statistics.fmean(clean)
    log_se = mean_standard_error(clean) / mean
    fast = _quantile(sorted(clean), FAST_QUANTILE)
    return LaunchEstimate(mean, log_se, len(step_s), len(clean), start, dict(reasons), "; ".join(why), fast)
