"""The report's and the trend's pictures (PNG, matplotlib's object-oriented API on the Agg canvas, no
global pyplot state): each launch as a point with the value and its 95% interval, the gates against
their thresholds, busbw versus payload with the link rate, tokens/s night by night with the
baseline band and failing nights marked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .dashboards import GateRow
from ..history.night_model import CaseResult, SavedRun, verdict_case
from ..deciding.across_nights import robust_baseline
from .tables import configuration_interval

__all__ = ["gate_failed", "plot_busbw", "plot_gates", "plot_per_gpu", "plot_trend", "save_png"]


def plot_per_gpu(Figure, png: Path, model: str, rows: dict[int, dict[str, CaseResult]],
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
        ivs = [configuration_interval(c.counted_of(c.tokens_per_s_per_gpu)) for _, c in cases]
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
    save_png(fig, png)


def plot_gates(Figure, png: Path, gates: Sequence[GateRow]) -> None:
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
    save_png(fig, png)


def plot_busbw(Figure, png: Path, op: str, rows: Sequence[Any]) -> None:
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
    save_png(fig, png)


def save_png(fig, png: Path) -> None:
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png")


def plot_trend(Figure, png: Path, title: str, labels: Sequence[str], runs: Sequence[SavedRun],
                case_ids: Sequence[str]) -> None:
    """tokens/s per night per node count: the baseline band (robust center of the nights, +-10%, the
    default regression threshold) shaded, nights whose gates failed for the case marked with a red x."""
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
        failed = [(x, r.cases[cid].mean) for x, r in zip(xs, runs) if cid in r.cases and gate_failed(r, cid)]
        if failed:
            ax.scatter([x for x, _ in failed], [v for _, v in failed], marker="x", s=90, color="red", zorder=3,
                       label="gate failed" if i == 0 else None)
    ax.set_title(f"{title}: tokens/s (band: baseline +-10%)")
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens/s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    save_png(fig, png)


def gate_failed(run: SavedRun, case_id: str) -> bool:
    """A gate of the night about ``case_id`` failed."""
    for v in run.verdicts:
        if str(v.get("outcome")) in ("fail", "failed") and (where := verdict_case(v)) is not None:
            if "-".join([where[0], f"n{where[1]}", where[2]]) == case_id:
                return True
    return False
