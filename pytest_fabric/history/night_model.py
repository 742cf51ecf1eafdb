"""The night model: what a saved night is, as plain data (``SavedRun`` of ``CaseResult`` and
``LinkResult``, with its verdicts), and ``ResultsError`` for a file that is not one.

A leaf, as pytest keeps ``reports.py``: the readers and writers (``nights.py`` for JSON and the
session store, ``baselines.py``, ``junit.py`` for JUnit XML) all build and read these types, and
none of them has to import another to do so. It imports only other leaves (``case``, ``fabrics``,
``deciding.contrasts``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.case import BANDWIDTH, Case
from ..core.fabrics import FABRICS
from ..deciding.contrasts import configuration_value

__all__ = ["CaseResult", "LinkResult", "ResultsError", "SavedRun", "case_of_test", "parse_case_id", "verdict_case"]


class ResultsError(Exception):
    """A file that is not a readable pytest-fabric results file; the message says which and why."""


def parse_case_id(case_id: str) -> Case:
    """``Case.parse``, under the name older callers import (``Case.parse`` is the one reader)."""
    return Case.parse(case_id)


@dataclass
class CaseResult:
    """One (model, nodes, fabric, sharding) of a night: a value per launch, and the step's figures."""

    model: str
    nodes: int
    fabric: str
    gpus: int
    tokens_per_s: list[float]
    tokens_per_s_per_gpu: list[float]
    # Whether each launch counts in the value (``Measurement.counted``: not disturbed as a whole, its
    # round launched again); None: all count.
    counted: list[bool] | None = None
    # The step's figures (``hostbound.py``), as the terminal and JUnit show them: the MFU at the
    # configuration's value (``models.MFU_CONVENTION``) against ``mfu_peak`` ("H200 SXM 989 TFLOP/s
    # dense bf16"), and the largest per-rank peak memory over the launches, GiB. None: a CPU run (MFU
    # and its peak: no GPU peak), a baseline, or a file written before they were saved (all three).
    mfu: float | None = None
    mfu_peak: str | None = None
    peak_memory_gib: float | None = None
    sharding: str = "full"  # core.case.SHARDINGS
    # Ranks (or nodes) whose own work per step stayed above the others' (deciding/stragglers.py), one
    # line each; [] none; None not judged (a GPU run, whose CPU time is not its compute; a baseline).
    stragglers: list[str] | None = None

    @property
    def id(self) -> str:
        return Case(self.model, self.nodes, self.fabric, self.sharding).id

    @property
    def workload(self) -> str:
        """The model and, where it is not full sharding, the layout: what a table's rows group by
        ("llama-wide", "llama-wide hybrid")."""
        return self.model if self.sharding == "full" else f"{self.model} {self.sharding}"

    @property
    def launches(self) -> int:
        return len(self.tokens_per_s)

    @property
    def disturbed(self) -> int:
        """Launches not counted (disturbed as a whole: their rounds were launched again)."""
        return sum(1 for c in self.counted or () if not c)

    @property
    def count_text(self) -> str:
        """"6", or "6 (1 disturbed)" with one of them not counted: the count every output shows."""
        return f"{self.launches}" + (f" ({self.disturbed} disturbed)" if self.disturbed else "")

    def counted_of(self, values: list[float]) -> list[float]:
        """``values`` (one per launch) of the launches that count (all, where none does)."""
        kept = [v for v, c in zip(values, self.counted or [True] * len(values)) if c]
        return kept or values

    @property
    def counted_tokens_per_s(self) -> list[float]:
        """The values of the launches that count (all, where none does)."""
        return self.counted_of(self.tokens_per_s)

    @property
    def mean(self) -> float:
        """The configuration's value: ``contrasts.configuration_value`` of its counted launches (the
        number the terminal and JUnit showed)."""
        return configuration_value(self.counted_tokens_per_s)

    @property
    def mean_per_gpu(self) -> float:
        return configuration_value(self.counted_of(self.tokens_per_s_per_gpu))


@dataclass
class LinkResult:
    """Collective bandwidth of one (nodes, fabric): busbw at each collective's largest payload."""

    nodes: int
    fabric: str
    busbw_gbit: dict[str, float]
    payload_bytes: int
    link_gbit: float | None = None  # the emulated link rate; None on a real fabric

    @property
    def id(self) -> str:
        return Case(BANDWIDTH, self.nodes, self.fabric).id


@dataclass
class SavedRun:
    """One night (or a baseline, or several JUnit files of one night, combined)."""

    identity: dict[str, Any]
    cases: dict[str, CaseResult] = field(default_factory=dict)
    bandwidth: dict[str, LinkResult] = field(default_factory=dict)
    # {"test", "outcome" (a verdicts.OUTCOMES word; older nights: pytest's), "message", "gates"} and,
    # where known, {"model", "nodes", "fabric"}.
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # first line of each failed launch
    source: Path | None = None
    kind: str = "results"  # "results", "store", "junit" or "baseline"
    # USD per GPU-hour by fabric, as the night was run with (ini fabric_price, --fabric-price).
    prices: dict[str, float] = field(default_factory=dict)

    @property
    def measurements(self) -> dict[str, list[float]]:
        """case id -> tokens/s of each launch."""
        return {cid: list(c.tokens_per_s) for cid, c in self.cases.items()}

    @property
    def label(self) -> str:
        """What a trend calls this night: when it ran, else its session directory or file name."""
        created = self.identity.get("created")
        if isinstance(created, str) and len(created) >= 16:
            return created[:16].replace("T", " ")
        if self.source is None:
            return "unnamed"
        # A store is always measurements.json; its session directory is named after the start time.
        return self.source.parent.name if self.kind == "store" else self.source.name

    def fabrics(self) -> list[str]:
        """The fabrics measured, the session's order first, then the presets' order, then by name."""
        seen = {c.fabric for c in self.cases.values()} | {b.fabric for b in self.bandwidth.values()}
        declared = [f for f in self.identity.get("fabrics") or [] if f in seen]
        presets = [f for f in FABRICS if f in seen and f not in declared]
        return declared + presets + sorted(seen - set(declared) - set(presets))


def case_of_test(test: str) -> dict[str, Any]:
    """model, nodes and fabric when the test's parameter is a case id (``test_x[qwen2-tiny-n2-eth]``)."""
    _, bracket, param = test.partition("[")
    try:
        case = Case.parse(param.rstrip("]")) if bracket else None
    except ValueError:
        return {}
    return {"model": case.model, "nodes": case.nodes, "fabric": case.fabric} if case else {}


def verdict_case(verdict: Mapping[str, Any]) -> tuple[str, int, str] | None:
    """(model, nodes, fabric) a verdict is about: given explicitly, or the test id's parameter."""
    if all(k in verdict for k in ("model", "nodes", "fabric")):
        return str(verdict["model"]), int(verdict["nodes"]), str(verdict["fabric"])
    found = case_of_test(str(verdict.get("test", "")))
    return (found["model"], found["nodes"], found["fabric"]) if found else None
