"""The sequential design: a gate looked at repeatedly as launches are added, keeping its confidence.

Part of the statistics (README, "How verdicts are decided").
An inconclusive comparison buys more launches up to a budget (``SequentialGate``); each look
(``Look``) spends a share of the error allowance (an O'Brien-Fleming-type spending function,
``obrien_fleming_spending``) with boundaries computed from the looks' joint distribution
(``_boundaries``), so the whole procedure keeps its stated confidence (``CONFIDENCE``) without the
union bound's waste; a night's gates share the allowance for false failures (``FAMILY_RULES``).

A leaf; numpy and scipy are imported only where a boundary is computed.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from .contrasts import _AT_LEAST, _AT_MOST, MIN_ROUNDS, Interval, NoisePrior, Verdict, contrast_interval, decide

__all__ = ["CONFIDENCE", "FAMILY_RULES", "Look", "SequentialGate", "obrien_fleming_spending"]

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


# Simulated paths behind the boundaries of looks on tonight's own rounds (``_t_simulated``): a look's
# share at a family's alpha / 7 is 0.1-0.5% of them, 200-1000 paths beyond its boundary.
T_PATHS = 200_000


@functools.lru_cache(maxsize=256)
def _t_simulated(alpha: float, rounds: tuple[int, ...], fractions: tuple[float, ...],
                 before: float) -> tuple[float, ...]:
    """The nominal two-sided confidences of looks after ``rounds`` rounds (increasing, each from
    ``MIN_ROUNDS`` on) whose interval rests on tonight's own rounds (Student's t on rounds - 1 df),
    at information ``fractions``, each spending its share of ``obrien_fleming_spending``; ``before``:
    what the looks before them (on the stated noise bound, a known variance) may have spent.

    The known-variance boundaries (``_boundaries``) assume the looks' statistics move as one
    Brownian motion; t statistics whose variance is re-estimated at every look from 2-5 df are less
    correlated, and the looks together spend more than their allowance (simulated: 5.3% against 5%
    at the threshold). So each boundary is set on simulated t statistics of the same looks (normal
    rounds, a fixed seed: the same levels every run) such that the paths still going leave exactly
    its share to cross (Jennison & Turnbull 2000, ch. 11, the t statistics' joint distribution
    simulated instead of approximated)."""
    import numpy as np
    from scipy.stats import t as student_t

    rng = np.random.default_rng(20261127)
    x = rng.standard_normal((T_PATHS, rounds[-1]))
    going = np.ones(T_PATHS, dtype=bool)
    levels, spent = [], before
    for i, (k, t) in enumerate(zip(rounds, fractions)):
        sample = x[:, :k]
        stat = np.abs(sample.mean(axis=1) / (sample.std(axis=1, ddof=1) / np.sqrt(k)))
        share = max(obrien_fleming_spending(t, alpha) - spent, 0.0)
        spent = max(spent, obrien_fleming_spending(t, alpha))
        live = stat[going]
        cross = int(round(share * T_PATHS))
        if i == 0 and share > 0:  # the first look on t: its level is exact, no simulation needed
            c = float(student_t.ppf(1 - share / 2, k - 1))
        elif cross <= 0 or live.size == 0:
            c = float("inf")
        elif cross >= live.size:
            c = 0.0
        else:
            c = float(np.partition(live, live.size - cross)[live.size - cross])
        going &= stat < c
        levels.append(1.0 - 1e-12 if c == float("inf") else float(2 * student_t.cdf(c, k - 1) - 1))
    return tuple(levels)


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
    prior: NoisePrior | None = None  # a noise learned from earlier nights (contrast_interval)
    # Gates judged in the same night: a failure must hold at the error allowance over this many,
    # spent over the looks by the same function (``_next``; ``FAMILY_RULES``), so that a night of many
    # gates keeps its chance of any false failure at the stated rate.
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

    def _next(self, launches: int) -> tuple[float, float, tuple[float, ...]]:
        """This look's nominal confidences, (to decide, for a failure over the family), and the
        information fractions looked at with it. A failure's boundary comes from the same spending
        function at alpha / family (the family's allowance spent over the looks as the gate's is),
        so that at the last look it is Bonferroni's and earlier it spends its share, no more."""
        t = self._fraction(launches)
        if self._times and t <= self._times[-1]:
            # The same information again: nothing left to spend on it.
            return 1.0 - 1e-12, 1.0 - 1e-12, self._times
        times = (*self._times, t)
        alpha = 1.0 - self.confidence
        if self.prior is None and self._rounds(t) >= MIN_ROUNDS:
            # Tonight's rounds alone (contrast_interval): boundaries for an estimated variance.
            return (self._t_level(alpha, times), self._t_level(alpha / self.family, times), times)
        c, _ = _boundaries(alpha, times)
        c_fail = c if self.family == 1 else _boundaries(alpha / self.family, times)[0]
        return 2 * statistics.NormalDist().cdf(c) - 1, 2 * statistics.NormalDist().cdf(c_fail) - 1, times

    def _rounds(self, t: float) -> int:
        """The rounds an information fraction stands for."""
        return self.budget if self.start >= self.budget else int(round(t * self.budget))

    def _t_level(self, alpha: float, times: tuple[float, ...]) -> float:
        """The last look's nominal confidence where the looks from ``MIN_ROUNDS`` rounds on rest on
        tonight's rounds (``_t_simulated``), the looks before them taken as having spent theirs."""
        on_t = [(self._rounds(t), t) for t in times if self._rounds(t) >= MIN_ROUNDS]
        earlier = [t for t in times if self._rounds(t) < MIN_ROUNDS]
        before = obrien_fleming_spending(earlier[-1], alpha) if earlier else 0.0
        rounds, fractions = zip(*on_t)
        return _t_simulated(alpha, tuple(rounds), tuple(fractions), before)[-1]

    def look_confidence(self, launches: int) -> float:
        """The nominal confidence a look after ``launches`` launches uses (given the looks before it)."""
        return self._next(launches)[0]

    def fail_confidence(self, launches: int) -> float:
        """The nominal confidence a failure must hold at a look after ``launches`` launches: the gate's
        own where it is judged alone, else the family's boundary (``_next``)."""
        return self._next(launches)[1]

    def look(self, groups: Sequence[tuple[float, Sequence[tuple[float, float]]]],
             fixed: tuple[float, float] = (0.0, 0.0), blocked: bool = False, launches: int | None = None) -> Look:
        """Judge ``groups`` now; ``launches``: launches spent per side so far (default: the
        largest group), which decides this look's share of the error allowance."""
        spent = max(len(s) for _, s in groups) if launches is None else launches
        confidence, fail_confidence, self._times = self._next(spent)
        interval = contrast_interval(groups, self.prior, min(confidence, 1 - 1e-12), fixed, blocked)
        verdict = decide(interval, self.threshold, self.direction)
        if verdict is Verdict.FAIL and self.family > 1:
            # Over the night's gates, on the failing side: a failure needs the interval at the family's
            # boundary (the spending function at alpha / family) to lie beyond the threshold.
            wide = contrast_interval(groups, self.prior, min(fail_confidence, 1 - 1e-12), fixed, blocked)
            verdict = decide(wide, self.threshold, self.direction)
            if verdict is not Verdict.FAIL:
                # Shown as judged: the family's interval, which straddles the threshold.
                verdict, interval = Verdict.INCONCLUSIVE, wide
        look = Look(spent, interval, verdict)
        self.looks.append(look)
        return look
