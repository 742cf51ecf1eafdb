"""How far the analytical model (predict.py) can be trusted, stated from measured runs.

``pytest-fabric calibrate`` reads saved nights (``--fabric-save`` files, or a session's
``measurements.json``: both keep each launch's step times and what ran), turns every measured
configuration into an ``Observation`` (model, nodes, ranks per node, batch x sequence, precision,
and the link rate: the exact emulated rate on the emulated cluster, else the fabric's nominal
rate or one given with ``--gbit``), and tests the model three ways:

- **fit on all**: ``calibrate`` fits the per-rank FLOP/s and the multi-node overhead to every
  configuration; its errors are in-sample (how well the model *can* describe the runs);
- **leave-one-out**: each configuration's step is predicted by a fit on all the others, an honest
  out-of-sample error of the step time and tokens/s;
- **fabric penalty**: a fit on the fastest fabric's configurations (and the single-node ones, which
  no fabric touches) predicts every slower fabric's configurations; the predicted slowdown is set
  against the measured one. A second prediction fits the throughput to each fast-fabric step alone
  (``comparison.predict_comparison``), exactly as the line next to each comparison in a test's output
  does, so its error is the error of that line.

Plain standard library, like predict.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.case import BANDWIDTH
from ..core.fabrics import FABRICS
from ..core.models import MODELS
from ..physics.fit import Calibration, calibrate
from ..physics.comparison import BOUND_WORDS, predict_comparison
from ..physics.step_model import DEFAULT_LINK_EFFICIENCY, JobShape, Observation, recorded_shape
from ..measuring.measurement import LaunchRecord, launch_value
from ..deciding.contrasts import configuration_value
from ..core.units import mbit_to_gbit

__all__ = ["Configuration", "PenaltyRow", "Study", "configurations", "study", "study_lines"]

# Link efficiencies tried when asked to fit it too.
EFFICIENCY_GRID = tuple(round(0.5 + 0.05 * k, 2) for k in range(11))


@dataclass(frozen=True)
class Configuration:
    """One measured configuration: its observation (geometric mean step over launches) and its fabric."""

    fabric: str  # "any" on one node: no fabric is crossed
    observation: Observation
    launches: int

    @property
    def label(self) -> str:
        o = self.observation.shape
        layout = "" if o.sharding == "full" or o.nodes == 1 else f" {o.sharding}"
        return f"{o.spec.name} n{o.nodes}x{o.gpus_per_node}{layout} {self.fabric}"

    @property
    def shape(self) -> JobShape:
        """What must be equal for two configurations to differ only by fabric."""
        return self.observation.shape

    def tokens_per_s(self, step_s: float) -> float:
        return self.shape.world * self.shape.tokens_per_rank / step_s


def configurations(records: Mapping[str, Any], gbit: Mapping[str, float] | None = None
                   ) -> tuple[list[Configuration], list[str]]:
    """Configurations from store records (``key -> {"case", "cluster", "result"}``), and notes on
    what was left out and why. Launches of one configuration give one observation: the geometric
    mean of their launch values (``contrasts.configuration_value`` of each ``measurement.launch_value``, as
    the gates value a launch)."""
    gbit = dict(gbit or {})
    notes: list[str] = []
    groups: dict[tuple, list[float]] = {}
    proto: dict[tuple, tuple[str, Observation]] = {}
    for key, record in sorted(records.items()):
        case = record.get("case") if isinstance(record, dict) else None
        if not isinstance(case, dict) or case.get("model") == BANDWIDTH or "error" in record:
            continue
        r = record.get("result") or {}
        model, nodes, fabric = case.get("model"), int(case.get("nodes", 0)), str(case.get("fabric"))
        spec = MODELS.get(model)
        if spec is None:
            notes.append(f"{key}: model {model!r} is not in the catalog; left out")
            continue
        try:
            step = launch_value(LaunchRecord.from_dict(record).result).step_s
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            notes.append(f"{key}: no step times ({type(exc).__name__}: {exc}); left out")
            continue
        rate = None
        if nodes > 1:
            mbit = (r.get("fabric") or {}).get("emulated_mbit")
            if fabric in gbit:
                rate = gbit[fabric]
            elif record.get("cluster") == "emulated" and mbit:
                rate = mbit_to_gbit(float(mbit))
            elif fabric in FABRICS and FABRICS[fabric].nominal_gbit:
                rate = FABRICS[fabric].nominal_gbit
            else:
                notes.append(f"{key}: no link rate known for fabric {fabric!r} (give --gbit {fabric}=GBIT); left out")
                continue
        shape = recorded_shape(spec, nodes, r)
        obs = Observation(shape, step, inter_gbit=rate)
        label = fabric if nodes > 1 else "any"
        group = (label, shape, rate)
        groups.setdefault(group, []).append(step)
        proto.setdefault(group, (label, obs))
    out = []
    for group, steps in groups.items():
        label, obs = proto[group]
        out.append(Configuration(label, replace(obs, step_s=configuration_value(steps)), len(steps)))
    out.sort(key=lambda c: (c.shape.spec.name, c.shape.nodes, -(c.observation.inter_gbit or 0)))
    return out, notes


@dataclass(frozen=True)
class PenaltyRow:
    fast: Configuration
    slow: Configuration
    measured: float  # slowdown: 1 - slow tokens/s / fast tokens/s
    predicted_fit: float | None  # by the fit on the fast fabric (and one node)
    predicted_step: float | None  # by the throughput fitted to this fast step alone (the test-output line)
    label: str


@dataclass(frozen=True)
class Study:
    configurations: tuple[Configuration, ...]
    link_efficiency: float
    efficiency_fitted: bool
    fit: Calibration
    loo: tuple[float | None, ...]  # leave-one-out predicted step per configuration (None: nothing to fit on)
    fast_fabric: str | None
    fast_fit: Calibration | None
    penalties: tuple[PenaltyRow, ...]

    @property
    def loo_errors(self) -> list[float]:
        return [(p - c.observation.step_s) / c.observation.step_s
                for p, c in zip(self.loo, self.configurations) if p is not None]


def _rms(values: Sequence[float]) -> float:
    return math.sqrt(sum(v * v for v in values) / len(values)) if values else math.nan


def study(configs: Sequence[Configuration], link_efficiency: float | None = DEFAULT_LINK_EFFICIENCY) -> Study:
    """Fit, leave-one-out and fabric-penalty predictions for ``configs``.

    ``link_efficiency`` None: chosen from ``EFFICIENCY_GRID`` by the smallest RMS error of the fit
    on all configurations.
    """
    configs = tuple(configs)
    if not configs:
        raise ValueError("no measured training configurations to calibrate on")
    obs = [c.observation for c in configs]
    fitted = link_efficiency is None
    if fitted:
        link_efficiency = min(EFFICIENCY_GRID, key=lambda e: calibrate(obs, link_efficiency=e).rms_error)
    fit = calibrate(obs, link_efficiency=link_efficiency)
    loo: list[float | None] = []
    for i, o in enumerate(obs):
        rest = obs[:i] + obs[i + 1:]
        loo.append(calibrate(rest, link_efficiency=link_efficiency).predict(o.shape, **_links(o)).step_s
                   if rest else None)
    rates = {c.fabric: c.observation.inter_gbit for c in configs if c.shape.nodes > 1}
    fast_fabric = max(rates, key=rates.__getitem__) if rates else None
    fast_fit = None
    penalties: list[PenaltyRow] = []
    if fast_fabric is not None:
        train = [c.observation for c in configs if c.fabric in ("any", fast_fabric)]
        fast_fit = calibrate(train, link_efficiency=link_efficiency)
        by_shape = {c.shape: c for c in configs if c.fabric == fast_fabric}
        for slow in configs:
            fast = by_shape.get(slow.shape)
            if fast is None or slow.fabric in ("any", fast_fabric):
                continue
            penalties.append(_penalty(fast, slow, fast_fit, link_efficiency))
    return Study(configs, link_efficiency, fitted, fit, tuple(loo), fast_fabric, fast_fit, tuple(penalties))


def _links(o: Observation) -> dict[str, Any]:
    return {"inter_gbit": o.inter_gbit, "intra_gbit": o.intra_gbit}


def _penalty(fast: Configuration, slow: Configuration, fast_fit: Calibration, efficiency: float) -> PenaltyRow:
    f, s = fast.observation, slow.observation
    measured = 1 - f.step_s / s.step_s
    pf = fast_fit.predict(f.shape, **_links(f)).step_s
    ps = fast_fit.predict(s.shape, **_links(s)).step_s
    try:
        cp = predict_comparison(f.shape, rates={fast.fabric: f.inter_gbit, slow.fabric: s.inter_gbit},
                                fast_step_s=f.step_s, link_efficiency=efficiency)
        per_step, label = cp.slowdown, ("compute-bound" if cp.compute_bound else BOUND_WORDS[cp.penalty.slow.bound])
    except ValueError:
        per_step, label = None, "no fit (step below transfer)"
    return PenaltyRow(fast, slow, measured, 1 - pf / ps, per_step, label)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in [header, *rows]]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{round(x * 100, 1) + 0.0:+.1f}%"  # + 0.0: no "-0.0%"


def _constants(cal: Calibration) -> str:
    return f"{cal.flops_per_s:.4g} FLOP/s per rank, multi-node overhead {cal.overhead_s * 1000:.1f} ms per step"


def study_lines(s: Study) -> list[str]:
    """The report ``pytest-fabric calibrate`` prints: constants, per-configuration and penalty tables."""
    eff = f"{s.link_efficiency:.2f} ({'fitted' if s.efficiency_fitted else 'assumed'})"
    out = [f"{len(s.configurations)} configuration(s); link efficiency {eff}",
           f"fit on all: {_constants(s.fit)}; in-sample step error RMS {s.fit.rms_error * 100:.1f}%, "
           f"max {s.fit.max_abs_error * 100:.1f}%", "",
           "step time and tokens/s per configuration, predicted by a fit on all the others (leave-one-out):"]
    rows = []
    for c, p in zip(s.configurations, s.loo):
        o = c.observation
        bound = s.fit.predict(o.shape, **_links(o)).bound
        rows.append([c.label, f"{o.inter_gbit:g}" if o.inter_gbit else "-", str(c.launches),
                     f"{o.step_s * 1000:.1f}", "-" if p is None else f"{p * 1000:.1f}",
                     "-" if p is None else _pct((p - o.step_s) / o.step_s),
                     f"{c.tokens_per_s(o.step_s):.1f}", "-" if p is None else f"{c.tokens_per_s(p):.1f}", bound])
    out += _table(["configuration", "link Gbit/s", "launches", "measured ms", "predicted ms", "error",
                   "measured tok/s", "predicted tok/s", "bound (fit on all)"], rows)
    errors = s.loo_errors
    out.append(f"leave-one-out step error: RMS {_rms(errors) * 100:.1f}%, max "
               f"{max((abs(e) for e in errors), default=math.nan) * 100:.1f}% over {len(errors)} configuration(s)"
               if errors else "leave-one-out: needs two configurations or more")
    out.append("")
    if not s.penalties:
        out.append("fabric penalty: no configuration was measured on two fabrics (same model, nodes and shape)")
        return out
    out.append(f"fabric penalty (slowdown: 1 - slow tokens/s / fast tokens/s), predicted from {s.fast_fabric} "
               f"alone: fit on {s.fast_fabric} and one-node configurations: {_constants(s.fast_fit)}; "
               f"per step: throughput fitted to each {s.fast_fabric} step, as in test output")
    rows = []
    for p in s.penalties:
        o, shape = p.slow.observation, p.slow.shape
        layout = "" if shape.sharding == "full" else f" {shape.sharding}"
        rows.append([f"{shape.spec.name} n{shape.nodes}x{shape.gpus_per_node}{layout}", f"{p.fast.fabric} vs {p.slow.fabric}",
                     f"{p.fast.observation.inter_gbit:g} / {o.inter_gbit:g}", _pct(p.measured),
                     _pct(p.predicted_fit),
                     "-" if p.predicted_fit is None else _pct(p.predicted_fit - p.measured)[:-1],
                     _pct(p.predicted_step),
                     "-" if p.predicted_step is None else _pct(p.predicted_step - p.measured)[:-1], p.label])
    out += _table(["configuration", "fabrics", "Gbit/s", "measured", "predicted (fit)", "error pts",
                   "predicted (per step)", "error pts", "label"], rows)
    fit_err = [p.predicted_fit - p.measured for p in s.penalties if p.predicted_fit is not None]
    step_err = [p.predicted_step - p.measured for p in s.penalties if p.predicted_step is not None]
    out.append(f"penalty error: fit RMS {_rms(fit_err) * 100:.1f} points; per step RMS "
               f"{_rms(step_err) * 100:.1f} points over {len(s.penalties)} pair(s)")
    return out
