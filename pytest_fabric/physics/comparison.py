"""The model next to a measured comparison: the compute throughput fitted to the fast fabric's step,
the slow fabric's step and penalty predicted from it, and the ``predicted: ...; measured: ...`` line.

Next to every ``fabric_compare`` comparison the plugin shows ``predict_comparison``'s line: the
link rates are the emulated ones on the emulated cluster, else each fabric's nominal rate; the
per-rank FLOP/s is ``--fabric-flops`` when given, else fitted (``fit_flops``) to the faster
fabric's measured step, so the slower fabric's step and the penalty are predicted from the fast
side alone (the fit counts a fixed multi-node overhead as compute, so it leans towards too small a
penalty). ``calibration.py`` (``pytest-fabric calibrate``) measures the model's error on saved runs.

``predict`` re-exports every name here. Plain standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.models import get_model
from .step_model import (DEFAULT_LINK_EFFICIENCY, DEFAULT_RESOLUTION, JobShape, Observation, Penalty, predict_penalty,
                         predict_step, recorded_shape)

__all__ = ["BOUND_WORDS", "ComparisonPrediction", "comparison_line", "fit_flops", "predict_comparison"]


def fit_flops(observation: Observation, overhead_s: float = 0.0,
              link_efficiency: float = DEFAULT_LINK_EFFICIENCY) -> float:
    """The per-rank FLOP/s at which the model reproduces ``observation``'s measured step exactly.

    The predicted step falls as the throughput rises, from at least the step's compute (at
    FLOPs / step) down to the transfer alone; the answer is found by bisection in log space.
    ValueError when no throughput can reproduce the step: a step shorter than the predicted
    transfer (and overhead) means the link rate or the traffic model does not fit the run. A step
    that is all transfer (compute wholly hidden) fits every throughput above some value: that
    smallest one is returned.
    """
    step = observation.step_s
    if not step > 0:
        raise ValueError(f"the measured step must be positive, got {step}")

    def predicted(theta: float) -> float:
        return observation.predict(theta, overhead_s, link_efficiency).step_s

    lo = observation.flops() / step  # compute alone fills the step: predicted >= step
    hi = lo
    for _ in range(40):
        hi *= 2
        if predicted(hi) <= step * (1 + 1e-9):
            break
    else:
        floor = predicted(hi)
        rate = f" at {observation.inter_gbit:g} Gbit/s" if observation.shape.nodes > 1 else ""
        raise ValueError(f"the measured step {step * 1000:.1f} ms is shorter than the predicted transfer and "
                         f"overhead alone ({floor * 1000:.1f} ms{rate}, {link_efficiency:.0%} link efficiency): "
                         f"the link rate or the traffic model does not fit this run")
    a, b = math.log(lo), math.log(hi)
    for _ in range(80):
        mid = (a + b) / 2
        if predicted(math.exp(mid)) > step:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)


BOUND_WORDS = {"compute": "compute-bound", "overlap": "overlap-bound", "communication": "communication-bound"}


def _percent_slower(slowdown: float) -> str:
    return f"{slowdown * 100:.1f}% slower" if slowdown >= 0 else f"{-slowdown * 100:.1f}% faster"


def _flops_text(flops_per_s: float) -> str:
    return f"{flops_per_s / 1e12:.3g} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:.3g} GFLOP/s"


@dataclass(frozen=True)
class ComparisonPrediction:
    """The model's view of one fabric comparison: which fabric is faster by rate, and by how much.

    ``penalty`` is None where both fabrics have the same link rate (the model sees no difference).
    ``flops_source`` says where the compute throughput came from (fitted to a measured step, or given).
    """

    fast: str
    slow: str
    fast_gbit: float
    slow_gbit: float
    nodes: int
    flops_per_s: float
    flops_source: str
    penalty: Penalty | None
    # The smallest slowdown launch-to-launch noise lets a gate see.
    resolution: float = DEFAULT_RESOLUTION

    @property
    def slowdown(self) -> float:
        """Predicted fraction of tokens/s the slow fabric loses."""
        return self.penalty.slowdown if self.penalty else 0.0

    @property
    def compute_bound(self) -> bool:
        """Predicted transfer below the compute-bound share of compute (``COMPUTE_BOUND_BELOW``) even
        on the slow fabric, or one node; with a predicted slowdown below ``resolution`` as well, the
        comparison cannot tell the fabrics apart."""
        return self.nodes == 1 or self.penalty is None or self.penalty.slow.bound == "compute"

    def line(self, measured: tuple[float, float, float, float] | None = None) -> str:
        """``predicted: ...; measured: ...`` for the test's output.

        ``measured``: the measured slow/fast tokens/s ratio as (point, low, high, confidence).
        """
        rates = f"{self.slow} {self.slow_gbit:g} vs {self.fast} {self.fast_gbit:g} Gbit/s per node"
        if self.nodes == 1:
            text = "predicted: no difference (one node: no traffic crosses the fabric); single-node"
        elif self.penalty is None:
            text = f"predicted: no difference ({self.slow} and {self.fast} both {self.fast_gbit:g} Gbit/s per node)"
        else:
            p = self.penalty
            text = (f"predicted: {self.slow} {_percent_slower(p.slowdown)} than {self.fast} "
                    f"(traffic/compute {p.slow.traffic_ratio:.2g} on {self.slow}, {p.fast.traffic_ratio:.2g} on "
                    f"{self.fast}: {BOUND_WORDS[p.slow.bound]}; {rates}; "
                    f"{_flops_text(self.flops_per_s)} per rank {self.flops_source})")
        if self.compute_bound and self.slowdown < self.resolution:
            text += "; compute-bound: cannot tell the fabrics apart"
        elif self.compute_bound:
            text += ("; compute-bound: only the unhidden first all-gather and last reduce-scatter "
                     "show the fabric")
        if measured is None:
            return text
        point, low, high, confidence = measured
        slowdown = 1.0 - point
        return (f"{text}; measured: {self.slow} {_percent_slower(slowdown)}, {confidence * 100:.4g}% CI of the "
                f"slowdown [{(1 - high) * 100:+.1f}%, {(1 - low) * 100:+.1f}%]; prediction off by "
                f"{(self.slowdown - slowdown) * 100:+.1f} points")


def comparison_line(model: str, nodes: int, rates: Mapping[str, float | None],
                    sides: Sequence[tuple[str, Any, float]], ratio: tuple[float, float, float, float],
                    gpus_per_node: int = 1, flops_per_rank: float | None = None) -> str:
    """The model's prediction for comparing fabric a with fabric b, next to the measurement: the
    ``predicted: ...; measured: ...`` line of a comparison's output.

    ``sides``: (fabric, what its launches ran, the configuration's tokens/s) for a, then b; what ran
    is a ``TrainResult`` (shape, precision, ranks per node). ``rates``: each fabric's per-node link
    rate in Gbit/s (declared, emulated or nominal: the caller's choice). ``ratio``: the measured a/b
    tokens/s as (point, low, high, confidence). Compute throughput: ``flops_per_rank`` when given,
    else fitted to the faster fabric's measured step (the penalty is predicted from the fast side
    alone). Never raises: a prediction that cannot be made says why.
    """
    try:
        (a, a_result, a_tokens), (b, b_result, b_tokens) = sides
        for f in (a, b):
            if not rates.get(f):
                return f"predicted: unavailable (no nominal link rate known for fabric {f!r})"
        fast = a if rates[a] >= rates[b] else b
        r, tokens = (a_result, a_tokens) if fast == a else (b_result, b_tokens)
        shape = recorded_shape(get_model(model), nodes, r, gpus_per_node)
        prediction = predict_comparison(shape, rates={a: rates[a], b: rates[b]},
                                        fast_step_s=r.tokens_per_step / tokens, flops_per_s=flops_per_rank)
        point, low, high, confidence = ratio
        # The measured slow/fast ratio from a/b (its bounds are positive).
        measured = (point, low, high, confidence) if fast == b else (1 / point, 1 / high, 1 / low, confidence)
        return prediction.line(measured)
    except Exception as exc:  # noqa: BLE001 - a prediction must never turn a test into an error
        return f"predicted: unavailable ({type(exc).__name__}: {exc})"


def predict_comparison(
    shape: JobShape,
    *,
    rates: dict[str, float],
    fast_step_s: float | None = None,
    flops_per_s: float | None = None,
    link_efficiency: float = DEFAULT_LINK_EFFICIENCY,
    **options,
) -> ComparisonPrediction:
    """The model's prediction for comparing the two fabrics of ``rates`` (name -> Gbit/s per node).

    The fabric with the higher rate is the fast one. The compute throughput is ``flops_per_s``
    when given; otherwise it is fitted to ``fast_step_s``, the fast fabric's measured step
    (``fit_flops``), so that the slow fabric's step, and so the penalty, is predicted out of
    sample: nothing measured on the slow fabric goes into it. Other ``options`` (intra_gbit,
    overhead_s) go to ``predict_step``.
    """
    if len(rates) != 2:
        raise ValueError(f"a comparison has two fabrics, got {len(rates)}")
    (n1, r1), (n2, r2) = rates.items()
    for name, rate in rates.items():
        if not (rate and rate > 0):
            raise ValueError(f"no link rate known for fabric {name!r}")
    (fast, fast_gbit), (slow, slow_gbit) = ((n1, r1), (n2, r2)) if r1 >= r2 else ((n2, r2), (n1, r1))
    if flops_per_s is not None:
        source = "given"
    elif fast_step_s is not None:
        obs = Observation(shape, fast_step_s, inter_gbit=fast_gbit if shape.nodes > 1 else None,
                          intra_gbit=options.get("intra_gbit"))
        flops_per_s = fit_flops(obs, link_efficiency=link_efficiency)
        source = f"fitted to {fast}'s measured step"
    else:
        raise ValueError("neither a compute throughput nor the fast fabric's measured step was given")
    penalty = None
    if shape.nodes > 1 and fast_gbit != slow_gbit:
        penalty = predict_penalty(shape, flops_per_s=flops_per_s, fast_gbit=fast_gbit, slow_gbit=slow_gbit,
                                  link_efficiency=link_efficiency, **options)
    return ComparisonPrediction(fast, slow, fast_gbit, slow_gbit, shape.nodes, flops_per_s, source, penalty)


def predicted_contradiction(shape: JobShape, kind: str, threshold: float, reference: tuple[str, float],
                            candidate: tuple[str, float], flops_per_s: float, **options) -> str | None:
    """What to announce before the night for a gate the model predicts will fail on these links, or
    None where the prediction agrees with it.

    ``kind`` "within": the gate needs candidate/reference tokens/s >= ``threshold``; "ahead":
    reference/candidate >= ``threshold``. ``reference`` and ``candidate``: (fabric, per-node Gbit/s).
    The words name the predicted ratio, what bounds the candidate's step, what the gate needs, and
    what the other layout (full or hybrid sharding) is predicted to give. Other ``options``
    (intra_gbit, link_efficiency, overhead_s) go to ``predict_step``."""
    def ratio(s: JobShape) -> tuple[float, str]:
        ref = predict_step(s, flops_per_s=flops_per_s, inter_gbit=reference[1], **options)
        cand = predict_step(s, flops_per_s=flops_per_s, inter_gbit=candidate[1], **options)
        return cand.tokens_per_s / ref.tokens_per_s, cand.bound

    r, bound = ratio(shape)
    if (r if kind == "within" else 1 / r) >= threshold:
        return None
    other = replace(shape, sharding="full" if shape.sharding == "hybrid" else "hybrid")

    def said(x: float) -> str:
        return f"{(1 - x) * 100:.0f}% slower" if x <= 1 else f"{(x - 1) * 100:.0f}% faster"

    need = (f"the gate needs {candidate[0]} at most {(1 - threshold) * 100:.0f}% slower" if kind == "within"
            else f"the gate needs {reference[0]} at least {(threshold - 1) * 100:.0f}% ahead")
    return (f"{'parity' if kind == 'within' else 'advantage'} {shape.spec.name} n{shape.nodes} {shape.sharding}: "
            f"predicted {candidate[0]} {said(r)} than {reference[0]} on {candidate[1]:g} against {reference[1]:g} "
            f"Gbit/s per node ({bound}-bound here); {need}; {other.sharding} sharding predicted {said(ratio(other)[0])}")
