"""The value types of a launch, a leaf below the launch machinery (``measure.py``).

``LaunchRecord`` is one launch as the session's store keeps it (the case, the cluster, and the rank
program's typed result or why there is none): the measurer returns it, the store holds its JSON,
and the night (``nights.run_from_store``) is built from it. ``Measurement`` and
``BandwidthMeasurement`` are a record read as a case's value; ``launch_value`` is the one place a
launch's value is taken from a training result (measurements, calibration, the benchmarks).

A measurement takes four forms from the ranks to JUnit: the rank's ``TrainResult`` (written as
result.json), the store's ``LaunchRecord``, the session's ``Measurement`` (and the night's
``SavedRun``), and JUnit's machine lines. This module imports no launcher, lock or probe: the
readers of a night (``nights``, ``junit``, ``gates``, ``terminal``) need none of them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.case import BANDWIDTH, LINKS, Case
from ..deciding.contrasts import configuration_value
from ..deciding.steps import LaunchEstimate, launch_estimate
from ..core.units import MIB
from ..workload.pair_types import LinksResult, PairRow
from ..workload.result import CollectiveRow, CollectivesResult, TrainResult

__all__ = ["BandwidthMeasurement", "LinksMeasurement", "LaunchKey", "LaunchRecord", "Measurement", "MeasurementError",
           "configuration_tokens_per_s", "block_name", "launch_number", "launch_value"]


_KEY_TAIL = re.compile(r"^(?P<hash>[^@+]+)(?:@(?P<number>\d+))?(?:\+(?P<block>.+))?$")


@dataclass(frozen=True)
class LaunchKey:
    """A store key, ``<case>#<set-up>[@N][+partners]``, read in one place (``parse``) and written in
    one (``str``): the configuration (``base``: the case and every setting that changes it), the
    launch number (0 is the first), and, for a launch measured again for a round whose other
    launches ran later than its first one (``Measurer.measure``: a round's launches run back to
    back), the partners of that round (``block``, their case ids, "," between)."""

    base: str
    number: int = 0
    block: str = ""

    @classmethod
    def parse(cls, key: str) -> LaunchKey:
        head, hashed, tail = key.rpartition("#")
        match = _KEY_TAIL.match(tail) if hashed else None
        if match is None:
            return cls(key.partition("@")[0])
        return cls(f"{head}#{match['hash']}", int(match["number"] or 0), match["block"] or "")

    def __str__(self) -> str:
        return self.base + (f"@{self.number}" if self.number else "") + (f"+{self.block}" if self.block else "")


def block_name(partners: Sequence[Case]) -> str:
    """The ``block`` part of a key: the case ids of a round's other launches, sorted."""
    return ",".join(sorted(p.id for p in partners))


def launch_number(key: str) -> int:
    """The launch number a store key names: ``...#hash`` 0, ``...#hash@3`` 3, and
    ``...#hash@3+partner`` (launch 3 measured again for a later round's partner) 3."""
    return LaunchKey.parse(key).number


class MeasurementError(Exception):
    """A launch that produced no result; the message carries the ranks' last log lines."""


@dataclass
class LaunchRecord:
    """One launch as the session's store keeps it: what was launched (``case``), on which cluster
    (``cluster``, the launcher's name), and the rank program's typed result, or why there is none
    (``error``, a launch that produced no result; ``result`` is then None).

    Its JSON (``to_dict``) is the store's record, ``{"case", "cluster", "result"}`` or
    ``{"case", "error"}``, the keys a saved night keeps under ``"records"``.
    """

    case: Case
    cluster: str = ""
    result: TrainResult | CollectivesResult | LinksResult | None = field(default=None, repr=False)
    error: str | None = None
    # When the launch ran on this harness's clock (seconds since the epoch; 0.0: a record from before
    # they were kept): whether a stored launch ran back to back with its round's others (``Measurer``).
    started: float = 0.0
    ended: float = 0.0

    @property
    def failed(self) -> bool:
        return self.error is not None

    @property
    def bandwidth(self) -> bool:
        """A collectives launch (busbw), not a training one."""
        return self.case.model == BANDWIDTH

    @classmethod
    def failure(cls, case: Case, error: str) -> LaunchRecord:
        return cls(case, error=error)

    def to_dict(self) -> dict[str, Any]:
        when = {"started": self.started, "ended": self.ended} if self.ended else {}
        if self.error is not None:
            return {"case": asdict(self.case), "error": self.error, **when}
        assert self.result is not None, "a launch record holds a result or an error"
        return {"case": asdict(self.case), "cluster": self.cluster, "result": self.result.to_dict(), **when}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> LaunchRecord:
        """A store record as a ``LaunchRecord``: ``KeyError``, ``TypeError`` or ``ValueError``
        (``ResultFormatError``) where it is not one."""
        if isinstance(record, LaunchRecord):
            return record
        case = Case(**record["case"])
        when = {"started": float(record.get("started") or 0.0), "ended": float(record.get("ended") or 0.0)}
        if "error" in record:
            return cls(case, error=str(record["error"]) if record["error"] else "", **when)
        kind = {BANDWIDTH: CollectivesResult, LINKS: LinksResult}.get(case.model, TrainResult)
        result = kind.from_dict(record["result"], f"result of {case.id}")
        return cls(case, str(record.get("cluster", "")), result, **when)


@dataclass
class Measurement:
    """One training launch of a case: the rank program's result and the launch's value.

    The value is ``launch_value`` of the result (the measured steps' mean once warm-up-like and
    disturbed steps are set aside: what the job pays), and every figure here (tokens/s, per GPU,
    MFU) derives from it: one number per launch, computed in one place. A launch disturbed as a
    whole (``disturbed`` says why) has its round launched again by the gates (``rounds.run_rounds``)
    and is not counted in its configuration's value (``counted``).
    """

    case: Case
    result: TrainResult = field(repr=False)
    estimate: LaunchEstimate
    cluster: str
    launch: int = 0  # the launch's index among the repeats of its case
    # Set when this measurement was taken for another fabric and serves this one too (one node).
    shared_with: str | None = None

    @property
    def step_s(self) -> float:
        """The launch's step time: its value."""
        return self.estimate.step_s

    @property
    def gpus(self) -> int:
        return self.result.world_size

    @property
    def tokens_per_s(self) -> float:
        return self.result.tokens_per_step / self.estimate.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.gpus

    @property
    def mfu(self) -> float | None:
        return self.result.mfu(self.tokens_per_s)

    @property
    def disturbed(self) -> str:
        """Why the whole launch is disturbed ("" when it is not): its round is launched again."""
        return self.estimate.disturbed

    @property
    def counted(self) -> bool:
        """Whether the launch counts in its configuration's value: not disturbed as a whole."""
        return not self.estimate.disturbed

    def sample(self, per_gpu: bool = False) -> tuple[float, float]:
        """(log tokens/s, its within-launch variance): what a launch contributes to a contrast."""
        value = self.tokens_per_s_per_gpu if per_gpu else self.tokens_per_s
        return math.log(value), self.estimate.log_se ** 2

    @property
    def label(self) -> str:
        return f"{self.case.fabric} ({self.case.model}, {self.case.nodes} node{'s' * (self.case.nodes > 1)})"

    def summary(self) -> str:
        shared = f" [one node: shared with {self.shared_with}]" if self.shared_with else ""
        return (f"{self.case.id}: {self.tokens_per_s:.1f} tokens/s, {self.tokens_per_s_per_gpu:.1f} tokens/s/GPU, "
                f"step {self.step_s * 1000:.1f} ms ({self.estimate.describe()}), {self.gpus} GPU(s){shared}")

    @classmethod
    def from_record(cls, case: Case, record: LaunchRecord | Mapping[str, Any], launch: int = 0) -> Measurement:
        """A launch record (a ``LaunchRecord``, or its JSON ``{"case", "cluster", "result"}``) as the
        Measurement of ``case``.

        ``ResultFormatError`` when the result is not a readable training result.
        """
        record = LaunchRecord.from_dict(record)
        if not isinstance(record.result, TrainResult):
            raise ValueError(f"{record.case.id}: {record.error or 'not a training result'}")
        return cls(case=case, result=record.result, estimate=launch_value(record.result), cluster=record.cluster,
                   launch=launch, shared_with=record.case.fabric if record.case != case else None)


def launch_value(result: TrainResult) -> LaunchEstimate:
    """A training result's launch value (``steps.launch_estimate``): its steps and their disturbance
    flags. The one place a launch's value is taken from a result (measurements, calibration, the
    benchmarks)."""
    return launch_estimate(result.step_s, result.signals.disturbed or None)


def configuration_tokens_per_s(launches: Sequence[Measurement], per_gpu: bool = False, every: bool = False) -> float:
    """A configuration's tokens/s (per GPU) from its launches: ``contrasts.configuration_value`` of the
    counted ones (``Measurement.counted``; all where none is), or of ``every`` one (a gate's rounds:
    what it counted). The one number the gates, the terminal, JUnit and saved nights show."""
    chosen = list(launches) if every else ([m for m in launches if m.counted] or list(launches))
    return configuration_value([m.tokens_per_s_per_gpu if per_gpu else m.tokens_per_s for m in chosen])


@dataclass
class BandwidthMeasurement:
    """Collective bandwidth of one (nodes, fabric), nccl-tests semantics (see workload/collectives.py)."""

    case: Case
    result: CollectivesResult = field(repr=False)
    cluster: str

    @property
    def rows(self) -> list[CollectiveRow]:
        return self.result.rows

    def largest(self, op: str) -> CollectiveRow:
        """The row gates read: the largest payload of ``op``."""
        return self.result.largest(op)

    def busbw_gbit(self, op: str) -> float:
        return self.largest(op).busbw_gbit

    def summary(self) -> str:
        parts = [f"{op} {self.busbw_gbit(op):.3f} Gbit/s at {self.largest(op).bytes / MIB:g} MiB"
                 for op in self.result.ops()]
        return f"{self.case.id}: busbw " + ", ".join(parts)

    @classmethod
    def from_record(cls, record: LaunchRecord | Mapping[str, Any]) -> BandwidthMeasurement:
        record = LaunchRecord.from_dict(record)
        if not isinstance(record.result, CollectivesResult):
            raise ValueError(f"{record.case.id}: {record.error or 'not a collectives result'}")
        return cls(record.case, record.result, record.cluster)


@dataclass
class LinksMeasurement:
    """Every pair of one launch's nodes measured alone (see workload/pairs.py), nodes by their ranks' names."""

    case: Case
    result: LinksResult = field(repr=False)
    cluster: str

    @property
    def pairs(self) -> list[PairRow]:
        return self.result.pairs

    def summary(self) -> str:
        """The launch in one line (the pairs' figures: ``deciding.slow_links.LinkVerdict.table``)."""
        size = f" of {self.pairs[0].bytes / MIB:.3g} MiB" if self.pairs else ""
        took = f", launch {self.result.launch_s:g} s" if self.result.launch_s else ""
        return (f"{self.case.id}: all_reduce{size} over each pair of nodes alone, {len(self.pairs)} pairs, "
                f"{self.pairs[0].ranks if self.pairs else 0} ranks a pair{took}")

    @classmethod
    def from_record(cls, record: LaunchRecord | Mapping[str, Any]) -> LinksMeasurement:
        record = LaunchRecord.from_dict(record)
        if not isinstance(record.result, LinksResult):
            raise ValueError(f"{record.case.id}: {record.error or 'not a links result'}")
        return cls(record.case, record.result, record.cluster)
