"""Reports a person reads after the night: Markdown and HTML from saved runs, plots, cost, trends.

``write_report`` turns one night (or the parts of one night: several JUnit files, a results file)
into ``report.md`` and ``report.html``: per model, tokens/s per fabric and node count with its 95%
interval and the delta against the reference fabric (with the gate's interval), tokens/s per GPU,
MFU (its convention named; n/a on CPU) and peak memory per rank, and the tests' outcome words;
each gate's ratio, interval and threshold; collective bandwidth;
and, given prices per GPU-hour, dollars per million tokens per fabric, the premium at which the
faster fabric stops paying for itself, and which is cheaper ("undecided" when the intervals
overlap). Pictures: per model each launch as a point with the value and its interval (the y-axis
fits the data), the gates against their thresholds, busbw versus payload with the link rate.
The rows come from ``tables.py`` (and the gates' from ``dashboards.build_tables``), as the CI outputs' do.

The document is ``report_document.Document`` (built once, rendered as Markdown and as self-contained
HTML, so the two never disagree); the plots are ``report_plots``' PNG files next to it, referenced by
relative path, so the directory can be archived or served as it is. Plots need matplotlib (the
``report`` extra); without it the tables are still written and the documents say what is missing.
Several nights side by side: ``trend.write_trend``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .dashboards import GateRow, Tables, build_tables, mfu_convention
from ..core.case import LINKS
from ..history.night_model import ResultsError, SavedRun, verdict_case
from ..history.night_files import load_records
from ..history.launch_time import records_launch_time
from ..history.setups import identity_mismatch
from .report_document import (NO_MATPLOTLIB, PLOTS_DIR, Document, Written, matplotlib_figure, slug,
                              write_document)
from .report_plots import plot_busbw, plot_gates, plot_per_gpu
from .tables import (bandwidth_table, by_model as group_by_model, cost_tables, reference, straggler_report,
                     throughput_tables)

__all__ = ["Written", "combine", "write_report"]


def combine(runs: Sequence[SavedRun]) -> SavedRun:
    """Several files of one night as one run: a case or link in several of them takes the last one's values."""
    if not runs:
        raise ValueError("nothing to combine")
    combined = SavedRun(dict(runs[0].identity), source=runs[0].source, kind=runs[0].kind)
    for run in runs:
        combined.cases.update(run.cases)
        combined.bandwidth.update(run.bandwidth)
        combined.verdicts.extend(run.verdicts)
        combined.errors.extend(run.errors)
        combined.prices.update(run.prices)
        if not combined.identity.get("fabrics") and run.identity.get("fabrics"):
            combined.identity["fabrics"] = run.identity["fabrics"]
    return combined


def _identity_lines(identity: Mapping[str, Any]) -> list[str]:
    versions = identity.get("versions") or {}
    facts = [
        ("cluster", identity.get("cluster") or identity.get("cluster_kind")),
        ("nodes", identity.get("nodes")),
        ("hosts", ", ".join(identity["hosts"]) if identity.get("hosts") else None),
        ("GPUs per node", identity.get("gpus_per_node")),
        ("device", " ".join(str(identity[k]) for k in ("device", "dtype") if identity.get(k)) or None),
        ("GPU", identity.get("gpu")),
        ("attention", identity.get("attention")),
        ("batch x sequence per GPU", ", ".join(f"{m} {v}" for m, v in sorted((identity.get("shapes") or {}).items()))
         or None),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v) or None),
        ("fabrics", ", ".join(identity["fabrics"]) if identity.get("fabrics") else None),
        ("run at", identity.get("created")),
        ("baseline of", f"{identity['baseline_nights']} nights" if identity.get("baseline_nights") else None),
        ("pytest-fabric", identity.get("pytest_fabric")),
    ]
    return [f"{name}: {value}" for name, value in facts if value not in (None, "")]


def _gate_of(tables: Tables, model: str, nodes: int, fabric: str, ref: str | None) -> GateRow | None:
    """The gate that compared ``fabric`` with ``ref`` on (model, nodes), either way round."""
    return next((g for g in tables.gates if (g.model, g.nodes) == (model, nodes) and {g.a, g.b} == {fabric, ref}),
                None)


def _delta_interval(gate: GateRow | None, fabric: str) -> str:
    """The gate's interval as a change of ``fabric`` against the other side, e.g. ``[-19.0%, +29.0%]``."""
    if gate is None:
        return ""
    low, high = (gate.low, gate.high) if gate.a == fabric else (1 / gate.high, 1 / gate.low)
    return f" [{(low - 1) * 100:+.1f}%, {(high - 1) * 100:+.1f}%]"


def _verdict_cells(v: Mapping[str, Any], tables: Tables) -> list[str]:
    gates = [g for g in tables.gates if g.test == v.get("test")]
    outcome = {"passed": "pass", "failed": "fail", "xfailed": "inconclusive"}.get(str(v.get("outcome")),
                                                                               str(v.get("outcome", "?")))
    return [str(v.get("test", "?")), outcome, "; ".join(g.name for g in gates) or "-",
            "; ".join(f"{g.ratio:.3f}" for g in gates) or "-",
            "; ".join(f"[{g.low:.3f}, {g.high:.3f}]" for g in gates) or "-",
            "; ".join(f"{g.threshold:.3f}" for g in gates) or "-", str(v.get("message", ""))]


def _records(runs: Sequence[SavedRun]) -> dict[str, Any]:
    """The launch records behind the nights that keep them (saved nights, stores), the link test's
    launches too: busbw per payload, where the launch time went."""
    records: dict[str, Any] = {}
    for run in runs:
        if run.source is not None and run.kind in ("results", "store"):
            try:
                records.update(load_records(run.source, links=True))
            except ResultsError:
                continue
    return records


def _verdicts_by_row(run: SavedRun) -> dict[tuple[str, int], list[str]]:
    """Per (model, nodes), the gates' outcomes: tests that passed without a verdict line only measured."""
    out: dict[tuple[str, int], list[str]] = {}
    for v in run.verdicts:
        case = verdict_case(v)
        outcome = v.get("outcome", "?")
        outcome = {"passed": "pass", "failed": "fail", "xfailed": "inconclusive"}.get(outcome, outcome)
        if case is None or (outcome == "pass" and not v.get("message")):
            continue
        test = str(v.get("test", "?")).rpartition("::")[2].partition("[")[0]
        out.setdefault(case[:2], []).append(f"{test} ({case[2]}): {outcome}")
    return out


def write_report(runs: Sequence[SavedRun], directory: Path | str, prices: Mapping[str, float] | None = None) -> Written:
    """``report.md``, ``report.html`` and ``plots/*.png`` in ``directory`` for the night in ``runs``.

    ``prices``: USD per GPU-hour by fabric, over those saved with the night (``SavedRun.prices``);
    with any, the report adds cost per million tokens and the break-even premium of the reference
    fabric over each other one.
    """
    directory = Path(directory)
    run = combine(runs)
    fabrics = run.fabrics()
    ref = reference(fabrics)
    notes: list[str] = []
    plots: list[Path] = []
    doc = Document("pytest-fabric report")

    doc.heading("What ran")
    doc.bullets(_identity_lines(run.identity))
    doc.para("Inputs: " + ", ".join(str(r.source) if r.source else "(in memory)" for r in runs))
    warnings = [f"{r.source or i}: {line}" for i, r in enumerate(runs[1:], 1)
                for line in identity_mismatch(runs[0].identity, r.identity, ("first input", "this input"))]
    if warnings:
        doc.heading("Set-up differences between the inputs")
        doc.para("These numbers come from set-ups that differ; compare them with care.")
        doc.bullets(warnings)

    Figure = matplotlib_figure()
    by_model = group_by_model(run.cases.values())
    records = _records(runs)
    tables = build_tables(run, {key: r for key, r in records.items() if not key.startswith(LINKS)})
    doc.heading("Throughput")
    if not by_model:
        doc.para("No training measurements.")
    else:
        doc.para(f"tokens/s of the whole job, mean over launches (a launch disturbed as a whole is not counted: "
                 f"'disturbed'); deltas against {ref}. "
                 "One node never crosses the fabric: its measurement serves every fabric (n/a).")
    if by_model and Figure is None:
        notes.append(NO_MATPLOTLIB)
        doc.para(NO_MATPLOTLIB)
    gate_interval = (lambda model, nodes, f, ref: _delta_interval(_gate_of(tables, model, nodes, f, ref), f))
    for table in throughput_tables(run.cases.values(), fabrics, detail=True, delta_interval=gate_interval,
                                   verdicts=_verdicts_by_row(run)):
        model, rows = table.title, by_model[table.title]
        doc.heading(model, 3)
        doc.table(table.header, table.rows)
        if Figure is not None:
            png = directory / PLOTS_DIR / f"{slug(model)}-per-gpu.png"
            plot_per_gpu(Figure, png, model, rows, fabrics)
            plots.append(png)
            doc.image(f"{PLOTS_DIR}/{png.name}", f"{model}: tokens/s per GPU versus nodes, each launch a point, "
                                                 "the value with its 95% interval")
    if by_model:
        doc.para("tok/s: the value with its 95% interval [low, high]; vs: the change against the reference, with "
                 "the gate's interval where a gate compared the two. " + mfu_convention(tables) + ".")

    found, judged = straggler_report(run)
    if judged:
        doc.heading("Stragglers")
        doc.para(judged + " (its CPU time in the step, on CPU runs; deciding/stragglers.py).")
        if found:
            doc.bullets(found)

    if run.verdicts:
        doc.heading("Verdicts")
        doc.para("One outcome per test: pass, fail, inconclusive (the interval still straddles the threshold after "
                 "the launch budget), error (could not be measured) or skipped.")
        doc.table(["test", "outcome", "gate", "ratio", "interval", "threshold", "detail"],
                  [_verdict_cells(v, tables) for v in run.verdicts])
        if tables.gates and Figure is not None:
            png = directory / PLOTS_DIR / "gates.png"
            plot_gates(Figure, png, tables.gates)
            plots.append(png)
            doc.image(f"{PLOTS_DIR}/{png.name}", "each gate's ratio with its interval against its threshold")

    if run.bandwidth:
        doc.heading("Collective bandwidth")
        doc.para("Bus bandwidth (nccl-tests semantics) at each collective's largest payload, Gbit/s.")
        links = bandwidth_table(run.bandwidth.values(), lambda b: (b.nodes, fabrics.index(b.fabric)), "payload MiB")
        if links is not None:
            doc.table(links.header, links.rows)
        if Figure is not None and tables.busbw:
            for op in sorted({r.op for r in tables.busbw}):
                png = directory / PLOTS_DIR / f"busbw-{slug(op)}.png"
                plot_busbw(Figure, png, op, [r for r in tables.busbw if r.op == op])
                plots.append(png)
                doc.image(f"{PLOTS_DIR}/{png.name}", f"{op}: busbw versus payload per fabric, the link rate dashed")

    # Prices saved with the night (ini fabric_price, --fabric-price) unless given here.
    saved = {f for f in run.prices if f not in (prices or {})}
    prices = {**run.prices, **(prices or {})}
    if prices:
        _cost_section(doc, run, fabrics, ref, prices, notes, saved)

    _launch_time_section(doc, records)
    if run.errors:
        doc.heading("Failed launches")
        doc.bullets(run.errors)
    return write_document(directory, doc, "report", plots, notes)


def _launch_time_section(doc: Document, records: Mapping[str, Any]) -> None:
    """Where the night's launch time went (history/launch_time.py), summed over its launches."""
    night = records_launch_time(records)
    if night is None:
        return
    doc.heading("Where launch time went")
    doc.para(f"{night.launches} launches, {night.wall_s:.1f} s of launch wall time; measuring (steps, timed "
             f"collectives) {night.measured_fraction:.1%} of it. Each launch's phases add up to its wall, from "
             "before the cluster built anything to after its clean-up (docs/launch-time.md)"
             + (f"; {night.untimed} launches recorded no breakdown." if night.untimed else "."))
    wall = night.wall_s
    doc.table(["phase", "seconds", "share"], [[name, f"{s:.1f}", f"{s / wall:.1%}"] for name, s in night.ordered()])


def _cost_section(doc: Document, run: SavedRun, fabrics: Sequence[str],
                  ref: str | None, prices: Mapping[str, float], notes: list[str], saved: set[str]) -> None:
    doc.heading("Cost")
    if not run.cases:
        doc.para("No training measurements to price.")
        return
    unknown = sorted(set(prices) - set(fabrics))
    if unknown:
        note = f"prices given for fabrics with no measurements: {', '.join(unknown)}"
        notes.append(note)
        doc.para(note + ".")
    doc.para("Prices per GPU-hour: " + ", ".join(f"{f} ${prices[f]:g}" + (" (saved with the night)" if f in saved else "")
                                                for f in sorted(prices)) + ". "
             f"Break-even premium: how much more per GPU-hour {ref} may cost than the other fabric and still "
             f"cost no more per token (its tokens/s advantage).")
    for table in cost_tables(run, prices):
        doc.heading(f"{table.title}: cost", 3)
        doc.table(table.header, table.rows)
