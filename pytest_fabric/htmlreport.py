"""Reports a person reads after the night: Markdown and HTML from saved runs, plots, cost, trends.

``write_report`` turns one night (or the parts of one night: several JUnit files, a results file)
into ``report.md`` and ``report.html``: per model, tokens/s per fabric and node count with its 95%
interval and the delta against the reference fabric (with the gate's interval), tokens/s per GPU,
MFU (its convention named; n/a on CPU) and peak memory per rank, and the tests' outcome words; each gate's ratio, interval and threshold; collective bandwidth;
and, given prices per GPU-hour, dollars per million tokens per fabric, the premium at which the
faster fabric stops paying for itself, and which is cheaper ("undecided" when the intervals
overlap). Pictures: per model each launch as a point with the value and its interval (the y-axis
fits the data), the gates against their thresholds, busbw versus payload with the link rate.
``write_trend`` puts several nights side by side, with the baseline band and failing nights marked.
The rows come from ``tables.py`` (and the gates' from ``dashboards.build_tables``), as the CI outputs' do.

Both documents are built once as a list of blocks and rendered twice, so the Markdown and the HTML
never disagree. The HTML is self-contained (inline CSS); plots are PNG files next to it, referenced
by relative path, so the directory can be archived or served as it is. Plots need matplotlib (the
``report`` extra); without it the tables are still written and the documents say what is missing.
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .atomic import write_text
from .dashboards import GateRow, Tables, build_tables, md_cell, mfu_convention
from .redact import redact
from .baselines import night_labels
from .nights import CaseResult, ResultsError, SavedRun, identity_mismatch, load_records, verdict_case
from .tables import (bandwidth_table, by_model as group_by_model, configuration_interval, cost_tables, reference,
                     throughput_tables)
from .terminal import cost_lines  # noqa: F401 (public name: the terminal's cost lines, formerly here)

__all__ = ["Written", "combine", "cost_lines", "write_report", "write_trend"]

PLOTS_DIR = "plots"
NO_MATPLOTLIB = ("plots skipped: matplotlib is not installed (pip install 'fabric-gates[report]' "
                 "or pip install 'matplotlib>=3.7'); the tables are complete without them")


@dataclass
class Written:
    """What a report wrote, and anything the reader should be told about it."""

    markdown: Path
    html: Path
    plots: list[Path] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# One document, two renderings
# --------------------------------------------------------------------------------------------


class _Document:
    def __init__(self, title: str) -> None:
        self.title = title
        self.blocks: list[tuple[str, Any]] = []

    def heading(self, text: str, level: int = 2) -> None:
        self.blocks.append(("heading", (level, text)))

    def para(self, text: str) -> None:
        self.blocks.append(("para", text))

    def bullets(self, items: Sequence[str]) -> None:
        if items:
            self.blocks.append(("bullets", list(items)))

    def table(self, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        self.blocks.append(("table", ([str(h) for h in header], [[str(c) for c in r] for r in rows])))

    def image(self, relative: str, alt: str) -> None:
        self.blocks.append(("image", (relative, alt)))

    def markdown(self) -> str:
        out = [f"# {self.title}", ""]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                out += [f"{'#' * level} {text}", ""]
            elif kind == "para":
                out += [value, ""]
            elif kind == "bullets":
                out += [f"- {item}" for item in value] + [""]
            elif kind == "table":
                header, rows = value
                out.append(_markdown_row(header))
                out.append("|" + "|".join("---:" if _numeric(rows, i) else "---" for i in range(len(header))) + "|")
                out += [_markdown_row(row) for row in rows]
                out.append("")
            elif kind == "image":
                relative, alt = value
                out += [f"![{alt}]({relative})", ""]
        return "\n".join(out)

    def html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        for kind, value in self.blocks:
            if kind == "heading":
                level, text = value
                body.append(f"<h{level}>{e(text)}</h{level}>")
            elif kind == "para":
                body.append(f"<p>{e(value)}</p>")
            elif kind == "bullets":
                body.append("<ul>" + "".join(f"<li>{e(item)}</li>" for item in value) + "</ul>")
            elif kind == "table":
                header, rows = value
                head = "".join(f"<th>{e(h)}</th>" for h in header)
                align = ["num" if _numeric(rows, i) else "text" for i in range(len(header))]
                trs = "".join("<tr>" + "".join(f'<td class="{a}">{e(c)}</td>' for a, c in zip(align, row)) + "</tr>"
                              for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            elif kind == "image":
                relative, alt = value
                body.append(f'<figure><img src="{e(relative)}" alt="{e(alt)}">'
                            f"<figcaption>{e(alt)}</figcaption></figure>")
        return (
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{e(self.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(md_cell(c) for c in cells) + " |"


_NUMBER = re.compile(r"^[-+$]?[0-9.,]+(e[-+]?\d+)?%?$|^-$|^n/a$")


def _numeric(rows: Sequence[Sequence[str]], column: int) -> bool:
    """Right-align a column of numbers (placeholders aside), as the HTML does."""
    cells = [row[column] for row in rows if column < len(row)]
    return any(c not in ("-", "n/a") for c in cells) and all(_NUMBER.match(c) for c in cells)


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:72em;padding:0 1em;color:#222}"
    "h1,h2,h3{font-weight:600}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}"
    "table{border-collapse:collapse;margin:.6em 0 1.2em}"
    "th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}"
    "td.num{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}"
    "tbody tr:nth-child(even){background:#fafafa}"
    "figure{margin:.5em 0 1.5em}img{max-width:100%;border:1px solid #eee}"
    "figcaption{font-size:.85em;color:#666}li{margin:.15em 0}"
)


def _write(directory: Path, doc: _Document, stem: str, plots: list[Path], notes: list[str]) -> Written:
    directory.mkdir(parents=True, exist_ok=True)
    markdown, page = directory / f"{stem}.md", directory / f"{stem}.html"
    for path, text in ((markdown, doc.markdown()), (page, doc.html())):
        write_text(path, redact(text))  # inputs may come from an older version or another tool
    return Written(markdown, page, plots, notes)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "plot"


def _matplotlib_figure():
    """matplotlib's Figure class, or None: object-oriented API, Agg canvas, no global pyplot state."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    return Figure


# --------------------------------------------------------------------------------------------
# The night's report
# --------------------------------------------------------------------------------------------


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
    """The launch records behind the nights that keep them (saved nights, stores): busbw per payload."""
    records: dict[str, Any] = {}
    for run in runs:
        if run.source is not None and run.kind in ("results", "store"):
            try:
                records.update(load_records(run.source))
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
    doc = _Document("pytest-fabric report")

    doc.heading("What ran")
    doc.bullets(_identity_lines(run.identity))
    doc.para("Inputs: " + ", ".join(str(r.source) if r.source else "(in memory)" for r in runs))
    warnings = [f"{r.source or i}: {line}" for i, r in enumerate(runs[1:], 1)
                for line in identity_mismatch(runs[0].identity, r.identity, ("first input", "this input"))]
    if warnings:
        doc.heading("Set-up differences between the inputs")
        doc.para("These numbers come from set-ups that differ; compare them with care.")
        doc.bullets(warnings)

    Figure = _matplotlib_figure()
    by_model = group_by_model(run.cases.values())
    tables = build_tables(run, _records(runs))
    doc.heading("Throughput")
    if not by_model:
        doc.para("No training measurements.")
    else:
        doc.para(f"tokens/s of the whole job, mean over launches (a launch disturbed as a whole counts with a small "
                 f"weight: 'dw'); deltas against {ref}. "
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
            png = directory / PLOTS_DIR / f"{_slug(model)}-per-gpu.png"
            _plot_per_gpu(Figure, png, model, rows, fabrics)
            plots.append(png)
            doc.image(f"{PLOTS_DIR}/{png.name}", f"{model}: tokens/s per GPU versus nodes, each launch a point, "
                                                 "the value with its 95% interval")
    if by_model:
        doc.para("tok/s: the value with its 95% interval [low, high]; vs: the change against the reference, with "
                 "the gate's interval where a gate compared the two. " + mfu_convention(tables) + ".")

    if run.verdicts:
        doc.heading("Verdicts")
        doc.para("One outcome per test: pass, fail, inconclusive (the interval still straddles the threshold after "
                 "the launch budget), error (could not be measured) or skipped.")
        doc.table(["test", "outcome", "gate", "ratio", "interval", "threshold", "detail"],
                  [_verdict_cells(v, tables) for v in run.verdicts])
        if tables.gates and Figure is not None:
            png = directory / PLOTS_DIR / "gates.png"
            _plot_gates(Figure, png, tables.gates)
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
                png = directory / PLOTS_DIR / f"busbw-{_slug(op)}.png"
                _plot_busbw(Figure, png, op, [r for r in tables.busbw if r.op == op])
                plots.append(png)
                doc.image(f"{PLOTS_DIR}/{png.name}", f"{op}: busbw versus payload per fabric, the link rate dashed")

    # Prices saved with the night (ini fabric_price, --fabric-price) unless given here.
    saved = {f for f in run.prices if f not in (prices or {})}
    prices = {**run.prices, **(prices or {})}
    if prices:
        _cost_section(doc, run, fabrics, ref, prices, notes, saved)

    if run.errors:
        doc.heading("Failed launches")
        doc.bullets(run.errors)
    return _write(directory, doc, "report", plots, notes)


def _cost_section(doc: _Document, run: SavedRun, fabrics: Sequence[str],
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


def _plot_per_gpu(Figure, png: Path, model: str, rows: dict[int, dict[str, CaseResult]],
                  fabrics: Sequence[str]) -> None:
    """Each launch a point, the value with its 95% interval; the y-axis fits the data (from 0 it
    would flatten the gap the gates judge)."""
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    shift = {f: (i - (len(fabrics) - 1) / 2) * 0.06 for i, f in enumerate(fabrics)}
    for i, fabric in enumerate(fabrics):
        cases = [(nodes, row[fabric]) for nodes, row in sorted(rows.items()) if fabric in row]
        if not cases:
            continue
        color = f"C{i}"
        xs = [nodes * (1 + shift[fabric]) for nodes, _ in cases]
        for x, (_, c) in zip(xs, cases):
            ax.scatter([x] * len(c.tokens_per_s_per_gpu), c.tokens_per_s_per_gpu, s=12, alpha=0.45, color=color)
        ivs = [configuration_interval(c.tokens_per_s_per_gpu, c.weights) for _, c in cases]
        ax.errorbar(xs, [iv.point for iv in ivs], yerr=[[iv.point - iv.low for iv in ivs], [iv.high - iv.point for iv in ivs]],
                    marker="o", capsize=4, color=color, label=fabric)
    ax.set_title(f"{model}: tokens/s per GPU")
    ax.set_xlabel("nodes (points: launches; bars: 95% interval)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_xscale("log", base=2)
    ax.set_xlim(min(rows) / 1.5, max(rows) * 1.5)
    ax.set_xticks(sorted(rows))
    ax.set_xticklabels([str(n) for n in sorted(rows)])
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save_png(fig, png)


def _plot_gates(Figure, png: Path, gates: Sequence[GateRow]) -> None:
    """One row per gate: its ratio with the interval, and its threshold as a red tick."""
    colors = {"pass": "tab:green", "fail": "tab:red", "inconclusive": "tab:orange", "error": "tab:gray"}
    fig = Figure(figsize=(7.2, 1.2 + 0.45 * len(gates)), dpi=100)
    ax = fig.add_subplot()
    for y, g in enumerate(gates):
        ax.errorbar([g.ratio], [y], xerr=[[g.ratio - g.low], [g.high - g.ratio]], marker="o", capsize=4,
                    color=colors.get(g.outcome, "black"))
        ax.plot([g.threshold, g.threshold], [y - 0.35, y + 0.35], color="red", linewidth=2)
    ax.set_yticks(range(len(gates)))
    ax.set_yticklabels([f"{g.name} {g.where} ({g.outcome})" for g in gates], fontsize=8)
    ax.set_ylim(-0.6, len(gates) - 0.4)
    ax.set_xlabel("ratio a/b with its interval; red: the threshold it must clear")
    ax.grid(True, axis="x", alpha=0.3)
    _save_png(fig, png)


def _plot_busbw(Figure, png: Path, op: str, rows: Sequence[Any]) -> None:
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    for i, key in enumerate(sorted({(r.nodes, r.fabric) for r in rows})):
        mine = sorted((r for r in rows if (r.nodes, r.fabric) == key), key=lambda r: r.bytes)
        label = f"{key[1]}, {key[0]} nodes"
        ax.plot([r.bytes for r in mine], [r.busbw_gbit for r in mine], marker="o", color=f"C{i}", label=label)
        if mine[0].link_gbit:
            ax.axhline(mine[0].link_gbit, color=f"C{i}", linestyle="--", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_title(f"{op}: busbw versus payload (dashed: the link rate)")
    ax.set_xlabel("payload (bytes)")
    ax.set_ylabel("busbw (Gbit/s)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save_png(fig, png)


def _save_png(fig, png: Path) -> None:
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")


# --------------------------------------------------------------------------------------------
# Several nights
# --------------------------------------------------------------------------------------------


def write_trend(runs: Sequence[SavedRun], directory: Path | str) -> Written:
    """``trend.md``, ``trend.html`` and ``plots/trend-*.png``: tokens/s per case, night by night."""
    if len(runs) < 2:
        raise ValueError(f"a trend needs at least two nights, got {len(runs)}")
    directory = Path(directory)
    labels = night_labels(runs)
    notes: list[str] = []
    plots: list[Path] = []
    doc = _Document("pytest-fabric trend")
    doc.heading("Nights")
    doc.table(["night", "source", "cases"],
              [[label, str(r.source) if r.source else "-", str(len(r.cases))] for label, r in zip(labels, runs)])
    warnings = [f"{labels[i]}: {line}" for i in range(1, len(runs))
                for line in identity_mismatch(runs[i - 1].identity, runs[i].identity, ("night before", "this night"))]
    if warnings:
        doc.heading("Set-up changes between nights")
        doc.para("A change in numbers next to a change in set-up may be the set-up, not the fabric.")
        doc.bullets(warnings)

    case_ids = sorted({cid for r in runs for cid in r.cases},
                      key=lambda cid: _sort_key(next(r.cases[cid] for r in runs if cid in r.cases)))
    doc.heading("tokens/s per night")
    body = []
    for cid in case_ids:
        values = [r.cases[cid].mean if cid in r.cases else None for r in runs]
        known = [v for v in values if v is not None]
        change = f"{(known[-1] / known[0] - 1) * 100:+.1f}%" if len(known) >= 2 else "-"
        body.append([cid, *(f"{v:.1f}" if v is not None else "-" for v in values), change])
    doc.table(["case", *labels, "last vs first"], body)

    Figure = _matplotlib_figure()
    if Figure is None and case_ids:
        notes.append(NO_MATPLOTLIB)
        doc.para(NO_MATPLOTLIB)
    elif case_ids:
        doc.heading("Plots")
        groups: dict[tuple[str, str], list[str]] = {}
        for cid in case_ids:
            c = next(r.cases[cid] for r in runs if cid in r.cases)
            groups.setdefault((c.model, c.fabric), []).append(cid)
        for (model, fabric), ids in sorted(groups.items()):
            png = directory / PLOTS_DIR / f"trend-{_slug(model)}-{_slug(fabric)}.png"
            _plot_trend(Figure, png, f"{model} on {fabric}", labels, runs, ids)
            plots.append(png)
            doc.image(f"{PLOTS_DIR}/{png.name}", f"{model} on {fabric}: tokens/s per night")
    return _write(directory, doc, "trend", plots, notes)


def _sort_key(c: CaseResult) -> tuple[str, int, str]:
    return c.model, c.nodes, c.fabric


def _plot_trend(Figure, png: Path, title: str, labels: Sequence[str], runs: Sequence[SavedRun],
                case_ids: Sequence[str]) -> None:
    """tokens/s per night per node count: the baseline band (robust center of the nights, +-10%, the
    default regression threshold) shaded, nights whose gates failed for the case marked with a red x."""
    from .stats import robust_baseline

    fig = Figure(figsize=(max(6.4, 0.9 * len(labels)), 4.0), dpi=100)
    ax = fig.add_subplot()
    xs = list(range(len(labels)))
    for i, cid in enumerate(case_ids):
        points = [(x, r.cases[cid].mean) for x, r in zip(xs, runs) if cid in r.cases]
        nodes = next(r.cases[cid].nodes for r in runs if cid in r.cases)
        color = f"C{i}"
        ax.plot([x for x, _ in points], [v for _, v in points], marker="o", color=color,
                label=f"{nodes} node{'s' * (nodes > 1)}")
        center = robust_baseline([v for _, v in points]).center
        ax.axhspan(center * 0.9, center * 1.1, color=color, alpha=0.12)
        failed = [(x, r.cases[cid].mean) for x, r in zip(xs, runs) if cid in r.cases and _failed(r, cid)]
        if failed:
            ax.scatter([x for x, _ in failed], [v for _, v in failed], marker="x", s=90, color="red", zorder=3,
                       label="gate failed" if i == 0 else None)
    ax.set_title(f"{title}: tokens/s (band: baseline +-10%)")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    _save_png(fig, png)


def _failed(run: SavedRun, case_id: str) -> bool:
    """A gate of the night about ``case_id`` failed."""
    for v in run.verdicts:
        if str(v.get("outcome")) in ("fail", "failed") and (where := verdict_case(v)) is not None:
            if "-".join([where[0], f"n{where[1]}", where[2]]) == case_id:
                return True
    return False
