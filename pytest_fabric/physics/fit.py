"""Fitting the analytical model to measurements: the compute throughput and multi-node overhead
that reproduce a set of measured steps on known links (``calibrate``), which ``calibration.py``
(``pytest-fabric calibrate``) uses to state the model's error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .step_model import DEFAULT_LINK_EFFICIENCY, JobShape, Observation, Prediction, predict_step

__all__ = ["Calibration", "calibrate"]


@dataclass(frozen=True)
class Calibration:
    flops_per_s: float
    overhead_s: float
    link_efficiency: float
    observations: tuple[Observation, ...]
    # (predicted - measured) / measured, one per observation, in order.
    errors: tuple[float, ...]

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in self.errors)

    @property
    def rms_error(self) -> float:
        return math.sqrt(sum(e * e for e in self.errors) / len(self.errors))

    def predict(self, shape: JobShape, **options) -> Prediction:
        """``predict_step`` with the fitted throughput, overhead and link efficiency."""
        options.setdefault("link_efficiency", self.link_efficiency)
        options.setdefault("overhead_s", self.overhead_s)
        return predict_step(shape, flops_per_s=self.flops_per_s, **options)


def calibrate(
    observations: Sequence[Observation],
    link_efficiency: float = DEFAULT_LINK_EFFICIENCY,
    grid: int = 240,
) -> Calibration:
    """Fit the per-rank compute throughput and the multi-node overhead to measured step times.

    The link rates are known (the emulated cluster shapes them), so two parameters remain: the
    FLOP/s a rank achieves and the fixed per-step overhead of spanning nodes. Single-node
    observations pin the throughput (their step is compute); multi-node ones the overhead (what
    the bandwidth model leaves unexplained). The fit minimizes the squared relative errors: for
    each candidate throughput the best overhead has a closed form (a weighted mean of the
    multi-node residuals, never negative), and the throughput is found by a log-spaced scan and a
    golden-section refinement. Returns the fitted values and each observation's relative error,
    which is the measure of how far the model can be trusted on this machine.
    """
    obs = tuple(observations)
    if not obs:
        raise ValueError("calibration needs at least one observation")
    for o in obs:
        if not o.step_s > 0:
            raise ValueError(f"observation of {o.shape.spec.name} on {o.shape.nodes} node(s) has step_s {o.step_s}")
    measured = [o.step_s for o in obs]
    multi = [i for i, o in enumerate(obs) if o.shape.nodes > 1]

    def fit_overhead(theta: float) -> tuple[float, list[float]]:
        base = [o.predict(theta, 0.0, link_efficiency).step_s for o in obs]
        if not multi:
            return 0.0, base
        num = sum((measured[i] - base[i]) / measured[i] ** 2 for i in multi)
        den = sum(1.0 / measured[i] ** 2 for i in multi)
        return max(0.0, num / den), base

    def loss(log_theta: float) -> float:
        overhead, base = fit_overhead(math.exp(log_theta))
        return sum(((base[i] + (overhead if obs[i].shape.nodes > 1 else 0.0) - m) / m) ** 2
                   for i, m in enumerate(measured))

    # Every step is at least its compute, so theta >= flops / step for each observation; the
    # largest of those is a lower end, and no CPU or GPU is 1e4 times faster than its slowest step.
    theta_min = max(o.flops() / o.step_s for o in obs) * 0.5
    lo, hi = math.log(theta_min), math.log(theta_min * 1e4)
    xs = [lo + (hi - lo) * k / (grid - 1) for k in range(grid)]
    losses = [loss(x) for x in xs]
    best = min(range(grid), key=losses.__getitem__)
    a, b = xs[max(best - 1, 0)], xs[min(best + 1, grid - 1)]
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = loss(d)
    x = (a + b) / 2
    if losses[best] < loss(x):
        x = xs[best]
    theta = math.exp(x)
    overhead, _ = fit_overhead(theta)
    errors = tuple((o.predict(theta, overhead, link_efficiency).step_s - o.step_s) / o.step_s for o in obs)
    return Calibration(theta, overhead, link_efficiency, obs, errors)
