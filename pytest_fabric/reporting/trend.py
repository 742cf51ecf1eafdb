"""``pytest-fabric trend``: several nights side by side (tokens/s per case, night by night, the
change from the first to the last), set-up changes between nights named, and a plot per model and
fabric with the baseline band and failing nights marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..history.baselines import night_labels
from ..history.night_model import CaseResult, SavedRun
from ..history.setups import identity_mismatch
from .report_document import NO_MATPLOTLIB, PLOTS_DIR, Document, Written, matplotlib_figure, slug, write_document
from .report_plots import plot_trend

__all__ = ["write_trend"]


def write_trend(runs: Sequence[SavedRun], directory: Path | str) -> Written:
    """``trend.md``, ``trend.html`` and ``plots/trend-*.png``: tokens/s per case, night by night."""
    if len(runs) < 2:
        raise ValueError(f"a trend needs at least two nights, got {len(runs)}")
    directory = Path(directory)
    labels = night_labels(runs)
    notes: list[str] = []
    plots: list[Path] = []
    doc = Document("pytest-fabric trend")
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

    Figure = matplotlib_figure()
    if Figure is None and case_ids:
        notes.append(NO_MATPLOTLIB)
        doc.para(NO_MATPLOTLIB)
    elif case_ids:
        doc.heading("Plots")
        groups: dict[tuple[str, str], list[str]] = {}
        for cid in case_ids:
            c = next(r.cases[cid] for r in runs if cid in r.cases)
            groups.setdefault((c.workload, c.fabric), []).append(cid)
        for (model, fabric), ids in sorted(groups.items()):
            png = directory / PLOTS_DIR / f"trend-{slug(model)}-{slug(fabric)}.png"
            plot_trend(Figure, png, f"{model} on {fabric}", labels, runs, ids)
            plots.append(png)
            doc.image(f"{PLOTS_DIR}/{png.name}", f"{model} on {fabric}: tokens/s per night")
    return write_document(directory, doc, "trend", plots, notes)


def _sort_key(c: CaseResult) -> tuple[str, int, str]:
    return c.model, c.nodes, c.fabric
