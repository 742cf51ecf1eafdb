"""What CI systems and dashboards read, built from one set of tables.

Teams look at a night in GitHub's job summary, GitLab's metrics report, a Prometheus textfile
collector, and benchmark trackers (Bencher, github-action-benchmark) - not in a JUnit viewer,
which shows few of the numbers (README, "What each CI system shows"). ``build_tables`` turns a
night (``nights.SavedRun``, with the launch records where there are any) into rows once: each
gate's ratio, interval, threshold and outcome word; each configuration's tokens/s with its 95%
interval, its MFU and peak memory per rank (as the night keeps them, ``nights.CaseResult``; no MFU
on CPU); each collective's busbw per payload. Every renderer here, and the report
(``htmlreport``), reads those rows, so a number is the same wherever it is shown.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.case import BANDWIDTH, Case
from ..physics.hostbound import gib_text, mfu_text
from ..measuring.measurement import BandwidthMeasurement
from ..core.models import MFU_CONVENTION
from ..history.night_model import SavedRun, verdict_case
from .tables import CONFIDENCE, ConfigRow, config_rows
from ..core.units import MIB
from ..deciding.verdicts import ERROR, FAIL, INCONCLUSIVE, OUTCOMES, PASS, counts

@dataclass(frozen=True)
class GateRow:
    """One gate of one test: ``a``/``b`` with its interval, against its threshold."""

    test: str
    outcome: str
    a: str
    b: str
    ratio: float
    low: float
    high: float
    confidence: float
    threshold: float
    model: str = ""
    nodes: int = 0
    launches: str = ""
    # The launch noise the gate's interval used (log scale), its degrees of freedom and source;
    # None in nights saved before 0.2.
    noise: float | None = None
    noise_df: float | None = None
    noise_source: str = ""
    family: int = 0  # gates a failure's allowance was shared over (0: not recorded)

    @property
    def noise_text(self) -> str:
        """"1.4% on 9 df (declared default)", or "-" where the night did not record it."""
        if self.noise is None:
            return "-"
        df = f" on {self.noise_df:g} df" if self.noise_df is not None else ""
        return f"{self.noise * 100:.1f}%{df}" + (f" ({self.noise_source})" if self.noise_source else "")

    @property
    def name(self) -> str:
        return f"{self.a}/{self.b}"

    @property
    def where(self) -> str:
        return f"{self.model} n{self.nodes}" if self.model else ""


@dataclass(frozen=True)
class BusbwRow:
    nodes: int
    fabric: str
    op: str
    bytes: int
    busbw_gbit: float
    link_gbit: float | None


@dataclass
class Tables:
    """A night as rows: every renderer of a night reads these."""

    tests: list[tuple[str, str, str]]  # (test, outcome word, one-line message), every test with a verdict
    gates: list[GateRow]
    configs: list[ConfigRow]
    busbw: list[BusbwRow]  # every payload where the launch records are known, else the largest
    identity: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # e.g. why the night decided nothing

    @property
    def counts(self) -> dict[str, int]:
        return counts(outcome for _, outcome, _ in self.tests)


def _number(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def build_tables(run: SavedRun, records: Mapping[str, Any] | None = None) -> Tables:
    """The rows of ``run``; ``records`` (a session's store, or a saved night's ``records``) add the
    busbw of every payload."""
    tests, gates = [], []
    for v in run.verdicts:
        test, outcome = str(v.get("test", "?")), str(v.get("outcome", "?"))
        tests.append((test, outcome, str(v.get("message", ""))))
        where = verdict_case(v)
        for g in v.get("gates") or []:
            launches = g.get("launches", "")
            gates.append(GateRow(test, str(g.get("outcome", outcome)), str(g["a"]), str(g["b"]),
                                 float(g["ratio"]), float(g["ci_low"]), float(g["ci_high"]),
                                 float(g.get("confidence", CONFIDENCE)), float(g["threshold"]),
                                 where[0] if where else "", where[1] if where else 0,
                                 "+".join(map(str, launches)) if isinstance(launches, list) else str(launches),
                                 _number(g.get("launch_noise")), _number(g.get("noise_df")),
                                 str(g.get("noise_source") or ""), int(_number(g.get("family")) or 0)))
    return Tables(tests, gates, config_rows(run), _busbw_rows(run, records), dict(run.identity))


def _busbw_rows(run: SavedRun, records: Mapping[str, Any] | None) -> list[BusbwRow]:
    rows: dict[tuple[int, str, str, int], BusbwRow] = {}
    links = {link.id: link for link in run.bandwidth.values()}
    for record in (records or {}).values():
        if not isinstance(record, dict) or "error" in record or record.get("case", {}).get("model") != BANDWIDTH:
            continue
        m = BandwidthMeasurement.from_record(record)
        link = links.get(m.case.id)
        for row in m.rows:
            rows[(m.case.nodes, m.case.fabric, row.op, row.bytes)] = BusbwRow(
                m.case.nodes, m.case.fabric, row.op, row.bytes, row.busbw_gbit, link.link_gbit if link else None)
    if not rows:
        for link in run.bandwidth.values():
            for op, gbit in link.busbw_gbit.items():
                rows[(link.nodes, link.fabric, op, link.payload_bytes)] = BusbwRow(
                    link.nodes, link.fabric, op, link.payload_bytes, gbit, link.link_gbit)
    return [rows[k] for k in sorted(rows)]


def largest_payloads(rows: Sequence[BusbwRow]) -> list[BusbwRow]:
    """Per (nodes, fabric, collective) the row of its largest payload (the first of equal ones), in the
    order they first appear: what the summary and the trackers show of a collective."""
    largest: dict[tuple[int, str, str], BusbwRow] = {}
    for r in rows:
        if (r.nodes, r.fabric, r.op) not in largest or r.bytes > largest[(r.nodes, r.fabric, r.op)].bytes:
            largest[(r.nodes, r.fabric, r.op)] = r
    return list(largest.values())


def mfu_convention(tables: Tables) -> str:
    """How the MFU shown counts (the night's convention, named with every MFU column) and what peak
    memory is, in one line: "MFU: output head counted, ...; against H200 SXM 989 TFLOP/s dense bf16;
    n/a without a GPU peak (CPU). peak GiB: ..."."""
    peaks = sorted({c.mfu_peak for c in tables.configs if c.mfu_peak})
    return (f"MFU: {tables.identity.get('mfu_convention') or MFU_CONVENTION}"
            + (f"; against {', '.join(peaks)}" if peaks else "") + "; n/a without a GPU peak (CPU). "
            "peak GiB: the largest peak memory of a rank over the configuration's launches (n/a: not recorded)")


# -- Markdown: GitHub's job summary ------------------------------------------------------------------


def md_cell(text: object) -> str:
    """A GitHub-flavoured Markdown table cell: a ``|`` or a line break would end the cell or the row."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\r\n", "<br>").replace("\n", "<br>")


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> list[str]:
    """``align``: one character per column, ``r`` right-aligned (numbers), anything else left."""
    marks = ["---:" if (align[i:i + 1] == "r") else "---" for i in range(len(header))]
    return ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "|".join(marks) + "|",
            *("| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows)]


def _interval(low: float, high: float, digits: int = 3) -> str:
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def job_summary(tables: Tables) -> str:
    """GitHub Actions' job summary: outcome counts, failures first, then each gate's ratio and
    interval against its threshold, then throughput and bandwidth with their intervals."""
    n = tables.counts
    lines = ["## pytest-fabric: " + (", ".join(f"{n[w]} {w}" for w in OUTCOMES if n[w]) or "no tests"), ""]
    lines += [f"> {md_cell(note)}" for note in tables.notes] + ([""] if tables.notes else [])
    bad = [(t, o, m) for t, o, m in tables.tests if o in (FAIL, ERROR)]
    if bad:
        lines += ["### Failures", "", *md_table(["test", "outcome", "message"], bad), ""]
    if tables.gates:
        order = {FAIL: 0, ERROR: 1, INCONCLUSIVE: 2, PASS: 3}
        gates = sorted(tables.gates, key=lambda g: (order.get(g.outcome, 4), g.test))
        families = {g.family for g in gates if g.family}
        family_note = ([f"Failures judged over {max(families)} gates (Bonferroni, `--family-wise`)."]
                       if families and max(families) > 1 else [])
        lines += ["### Verdicts", "", *family_note, *([""] if family_note else []), *md_table(
            ["outcome", "gate", "where", "ratio", "interval", "threshold", "launches", "launch noise"],
            [[g.outcome.upper(), g.name, g.where, f"{g.ratio:.3f}",
              f"{_interval(g.low, g.high)} ({g.confidence:.4g})", f"{g.threshold:.3f}", g.launches, g.noise_text]
             for g in gates], "lllrrrrl"), ""]
    if tables.configs:
        lines += [f"### Throughput (tokens/s, {CONFIDENCE:.0%} interval)", "", *md_table(
            ["model", "nodes", "fabric", "GPUs", "tokens/s", "interval", "tokens/s/GPU", "MFU", "peak GiB", "launches"],
            [[c.workload, c.nodes, c.fabric, c.gpus, f"{c.tokens_per_s:.1f}", _interval(c.low, c.high, 1),
              f"{c.tokens_per_s / c.gpus:.1f}", mfu_text(c.mfu), gib_text(c.peak_memory_gib), c.launches]
             for c in tables.configs], "lrlrrrrrrr"), "", md_cell(mfu_convention(tables)), ""]
    largest = largest_payloads(tables.busbw)
    if largest:
        lines += ["### Collective bandwidth (busbw, Gbit/s, largest payload)", "", *md_table(
            ["nodes", "fabric", "collective", "busbw", "link", "MiB"],
            [[r.nodes, r.fabric, r.op, f"{r.busbw_gbit:.3f}", f"{r.link_gbit:g}" if r.link_gbit else "-",
              f"{r.bytes / MIB:g}"] for r in largest], "rllrrr"), ""]
    return "\n".join(lines)


# -- OpenMetrics: GitLab's metrics report, a node_exporter textfile collector ------------------------


def _labels(**labels: object) -> str:
    def esc(v: object) -> str:
        return str(v).replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def openmetrics(tables: Tables) -> str:
    """OpenMetrics text: gauges only (a night is a snapshot), every family with HELP and TYPE."""
    families: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, help_text: str, labels: dict[str, object], value: float) -> None:
        families.setdefault(name, (help_text, []))[1].append(f"{name}{_labels(**labels)} {value:.10g}")

    for c in tables.configs:
        where = {"model": c.model, "nodes": c.nodes, "fabric": c.fabric, "sharding": c.sharding}
        add("fabric_tokens_per_second", "tokens/s of the whole job (geometric mean of the counted launches)",
            where, c.tokens_per_s)
        add("fabric_launches", "launches the configuration measured", where, c.launch_count)
        add("fabric_launches_disturbed", "of those, launches disturbed as a whole, not counted", where, c.disturbed)
        add("fabric_tokens_per_second_low", f"lower bound of the {CONFIDENCE:.0%} interval of tokens/s", where, c.low)
        add("fabric_tokens_per_second_high", f"upper bound of the {CONFIDENCE:.0%} interval of tokens/s", where,
            c.high)
        if c.mfu is not None:  # none on CPU: no GPU peak
            add("fabric_mfu", "model FLOPs utilization at the configuration's tokens/s, a fraction ("
                f"{tables.identity.get('mfu_convention') or MFU_CONVENTION}; the peak in the label)",
                {**where, "peak": c.mfu_peak or ""}, c.mfu)
        if c.peak_memory_gib is not None:
            add("fabric_peak_memory_gib", "the largest peak memory of a rank over the launches, GiB", where,
                c.peak_memory_gib)
    for g in tables.gates:
        where = {"gate": g.name, "model": g.model, "nodes": g.nodes, "fabric": g.a, "test": g.test}
        add("fabric_gate_ratio", "the gate's ratio a/b", where, g.ratio)
        add("fabric_gate_ratio_low", "lower bound of the gate's interval", where, g.low)
        add("fabric_gate_ratio_high", "upper bound of the gate's interval", where, g.high)
        add("fabric_gate_threshold", "the ratio the gate requires (at least)", where, g.threshold)
        if g.noise is not None:
            add("fabric_gate_launch_noise", "the launch-to-launch noise (log scale) the gate's interval used",
                {**where, "source": g.noise_source}, g.noise)
            if g.noise_df is not None:
                add("fabric_gate_noise_df", "degrees of freedom of that noise (the prior's and tonight's)", where,
                    g.noise_df)
        for word in (PASS, FAIL, INCONCLUSIVE, ERROR):
            add("fabric_gate_outcome", "1 for the gate's outcome, 0 for the others", {**where, "outcome": word},
                1.0 if g.outcome == word else 0.0)
    for r in tables.busbw:
        add("fabric_busbw_gbit", "bus bandwidth (nccl-tests semantics) in Gbit/s",
            {"op": r.op, "bytes": r.bytes, "nodes": r.nodes, "fabric": r.fabric}, r.busbw_gbit)
    for (nodes, fabric), link in sorted({(r.nodes, r.fabric): r.link_gbit for r in tables.busbw}.items()):
        if link:
            add("fabric_link_gbit", "the emulated link rate in Gbit/s", {"nodes": nodes, "fabric": fabric}, link)
    for word, n in tables.counts.items():
        add("fabric_tests", "tests of the night by outcome", {"outcome": word}, n)
    out = []
    for name, (help_text, samples) in families.items():
        out += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", *samples]
    return "\n".join([*out, "# EOF"]) + "\n"


# -- Bencher Metric Format: benchmark trackers -------------------------------------------------------


def benchmark_json(tables: Tables) -> dict[str, dict[str, dict[str, float]]]:
    """Bencher Metric Format: benchmark -> measure -> value with lower and upper bounds (the intervals),
    so a tracker trends each ratio and its interval without reading prose."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for c in tables.configs:
        measures = out.setdefault(c.id, {})
        measures["tokens-per-second"] = {"value": c.tokens_per_s, "lower_value": c.low, "upper_value": c.high}
        if c.mfu is not None:  # none on CPU: no GPU peak
            measures["mfu"] = {"value": c.mfu}
        if c.peak_memory_gib is not None:
            measures["peak-memory-gib"] = {"value": c.peak_memory_gib}
    for g in tables.gates:
        name = f"gate {g.name} {g.where}".strip()
        out.setdefault(name, {})["ratio"] = {"value": g.ratio, "lower_value": g.low, "upper_value": g.high}
    for r in largest_payloads(tables.busbw):
        out.setdefault(f"{Case(BANDWIDTH, r.nodes, r.fabric).id} {r.op}", {})["busbw-gbit"] = {"value": r.busbw_gbit}
    return out


def write_outputs(tables: Tables, metrics: Path | str | None, benchmark: Path | str | None,
                  step_summary: Path | str | None) -> list[Path]:
    """Write each output that has a path (the job summary is appended: other steps write there too)."""
    written = []
    if metrics:
        Path(metrics).write_text(openmetrics(tables))
        written.append(Path(metrics))
    if benchmark:
        Path(benchmark).write_text(json.dumps(benchmark_json(tables), indent=1, sort_keys=True) + "\n")
        written.append(Path(benchmark))
    if step_summary:
        with open(step_summary, "a") as f:
            f.write(job_summary(tables) + "\n")
        written.append(Path(step_summary))
    return written
