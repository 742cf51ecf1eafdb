"""Where a night's launch time went: each launch's phases (``measuring/launch_time.py``, kept with its
result as ``launch_time``) summed over the night, the share of launch wall time spent measuring
(training steps, timed collectives), and the session's wall outside launches (pytest's start, collection, node checks, gates,
reports), as the terminal, the JUnit suite properties, the saved night and the report show them;
and each configuration's launch wall times (``wall_times``), which a night's plan prices its
launches from and a baseline keeps (``baselines.launch_costs``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.case import Case
from ..measuring.launch_time import PROGRAM_PHASES, TRAIN_PHASES
from ..measuring.measurement import LaunchRecord

# Every phase in launch order (a training launch's, with a collectives or link launch's ``program``
# and ``measured`` in place of init ... finish).
PHASES = (*TRAIN_PHASES[:2], "program", *TRAIN_PHASES[2:])
assert set(PROGRAM_PHASES) <= set(PHASES)
PROPERTY_PREFIX = "fabric.launch_time."


def launched(case: Case) -> Case:
    """The configuration a launch of ``case`` runs: one node never crosses the fabric, so the one-node
    cases of every fabric are one launch (the store's key, ``Measurer.key``, says the same)."""
    return case if case.crosses_fabric else Case(case.model, case.nodes, "any", case.layout)


def wall_times(records: Mapping[str, Any]) -> dict[str, list[float]]:
    """Launched case id (``launched``) -> the launch wall times (``launch_s``) of store or saved-night
    ``records``."""
    out: dict[str, list[float]] = {}
    for record in records.values():
        try:
            seconds = record["result"].get("launch_s")
            cid = launched(Case(**record["case"])).id
        except (KeyError, TypeError, AttributeError):
            continue
        if isinstance(seconds, (int, float)) and seconds > 0:
            out.setdefault(cid, []).append(float(seconds))
    return out


def launch_line(phases: Mapping[str, float]) -> str:
    """One launch's phases in one line: ``launch 13.5 s: startup 2.3 s, imports 1.6 s, ...``
    (phases under 5 ms left out)."""
    wall = sum(phases.values())
    parts = [f"{name} {seconds:.1f} s" for name, seconds in _ordered(phases) if seconds >= 0.005]
    return f"launch {wall:.1f} s: " + ", ".join(parts)


def _ordered(phases: Mapping[str, float]) -> list[tuple[str, float]]:
    known = [(name, phases[name]) for name in PHASES if name in phases]
    return known + sorted((n, s) for n, s in phases.items() if n not in PHASES)


def _phases(value: Any, where: str) -> dict[str, float]:
    if not isinstance(value, Mapping) or not all(
            isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) and s >= 0
            for s in value.values()):
        raise ValueError(f"{where}: launch_time must map phase names to seconds (>= 0), got {value!r}")
    return {str(k): float(s) for k, s in value.items()}


@dataclass
class NightLaunchTime:
    """The night's launches' phases summed (seconds), over ``launches`` timed launches;
    ``session_s``: the pytest session's wall (its process start to the summary), where known."""

    launches: int = 0
    phases: dict[str, float] = field(default_factory=dict)
    untimed: int = 0  # launches whose record has no breakdown (recorded before launches were timed)
    session_s: float | None = None

    def ordered(self) -> list[tuple[str, float]]:
        """(phase, seconds) in launch order."""
        return _ordered(self.phases)

    @property
    def wall_s(self) -> float:
        """The launches' wall time: their phases add up to it."""
        return sum(self.phases.values())

    @property
    def measured_fraction(self) -> float | None:
        return self.phases.get("measured", 0.0) / self.wall_s if self.wall_s > 0 else None

    @property
    def outside_s(self) -> float | None:
        """The session's wall outside launches: pytest's start, collection, the node check, the
        gates' arithmetic, reports (never negative)."""
        return None if self.session_s is None else max(0.0, self.session_s - self.wall_s)

    def line(self) -> str:
        """The terminal's one line: seconds and share of each phase, the measured fraction, the session."""
        wall = self.wall_s
        parts = [f"{name} {s:.1f} s ({s / wall:.0%})" for name, s in _ordered(self.phases) if s >= 0.05]
        text = (f"launch time: {self.launches} launch{'es' if self.launches != 1 else ''}, {wall:.1f} s: "
                + ", ".join(parts) + f"; measuring (steps, timed collectives) {self.measured_fraction:.1%} of launch wall")
        if self.session_s is not None:
            text += f"; session {self.session_s:.1f} s, {self.outside_s:.1f} s of it outside launches"
        if self.untimed:
            text += f"; {self.untimed} launch{'es' if self.untimed != 1 else ''} without a breakdown"
        return text

    def properties(self) -> dict[str, str]:
        """JUnit suite properties: ``fabric.launch_time.<phase>_s``, ``.launches``, ``.wall_s``,
        ``.measured_fraction`` and, where known, ``.session_s``, ``.outside_launches_s``."""
        props = {f"{PROPERTY_PREFIX}{name}_s": f"{s:.3f}" for name, s in _ordered(self.phases)}
        props.update({f"{PROPERTY_PREFIX}launches": str(self.launches), f"{PROPERTY_PREFIX}wall_s": f"{self.wall_s:.3f}",
                      f"{PROPERTY_PREFIX}measured_fraction": f"{self.measured_fraction:.4f}"})
        if self.session_s is not None:
            props[f"{PROPERTY_PREFIX}session_s"] = f"{self.session_s:.3f}"
            props[f"{PROPERTY_PREFIX}outside_launches_s"] = f"{self.outside_s:.3f}"
        return props

    def to_dict(self) -> dict[str, Any]:
        """As the saved night keeps it (``"launch_time"``)."""
        data: dict[str, Any] = {"launches": self.launches, "phases": dict(_ordered(self.phases)),
                                "wall_s": round(self.wall_s, 3), "measured_fraction": self.measured_fraction}
        if self.untimed:
            data["untimed"] = self.untimed
        if self.session_s is not None:
            data.update(session_s=round(self.session_s, 3), outside_launches_s=round(self.outside_s or 0.0, 3))
        return data


def night_launch_time(launches: Iterable[LaunchRecord], session_s: float | None = None) -> NightLaunchTime | None:
    """The phases of every launch that produced a result, summed; None where none did."""
    return _summed(((r.case.id, r.result.launch_time) for r in launches if r.result is not None), session_s)


def records_launch_time(records: Mapping[str, Any]) -> NightLaunchTime | None:
    """``night_launch_time`` of a saved night's or a store's raw records (``{"case", "result"}``)."""
    return _summed((key, record["result"].get("launch_time")) for key, record in records.items()
                   if isinstance(record, Mapping) and isinstance(record.get("result"), Mapping))


def _summed(launches: Iterable[tuple[str, Any]], session_s: float | None = None) -> NightLaunchTime | None:
    night = NightLaunchTime(session_s=session_s)
    for where, phases in launches:
        if phases is None:
            night.untimed += 1
            continue
        night.launches += 1
        for name, seconds in _phases(phases, where).items():
            night.phases[name] = night.phases.get(name, 0.0) + seconds
    return night if night.launches else None
