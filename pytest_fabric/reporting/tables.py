"""The night's tables as plain data, built once from the night model (``night_model.SavedRun``):
throughput (tokens/s, the change against the reference fabric, per GPU, MFU and peak memory per
rank), collective bandwidth, and cost per million tokens with the break-even premium.

Each table is a ``Table`` (a title, a header and rows of text cells); the renderers only lay them
out: the terminal (``terminal.py``, ``aligned_lines``), the report (``htmlreport.py``, Markdown and
HTML) and the CI outputs (``dashboards.py``, from ``config_rows``). A number is computed here once,
so it reads the same wherever it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.case import Case
from ..physics.cost import break_even_premium, cost_per_million_tokens
from ..core.fabrics import REFERENCE_FABRIC
from ..physics.hostbound import gib_text, mfu_text
from ..history.night_model import CaseResult, LinkResult, SavedRun
from ..deciding.contrasts import Interval, contrast_interval
from ..deciding.stragglers import STRAGGLER_MARGIN
from ..core.units import MIB

__all__ = ["CONFIDENCE", "ConfigRow", "Table", "aligned_lines", "bandwidth_table", "by_model", "config_rows",
           "configuration_interval", "cost_tables", "delta_text", "reference", "throughput_tables"]

CONFIDENCE = 0.95  # of a configuration's interval (a gate's interval has its own, from its spending)

# model -> nodes -> fabric -> the configuration
ByModel = dict[str, dict[int, dict[str, CaseResult]]]


@dataclass
class Table:
    """One table: its title (a model's name, or a caption; "" for none), header and rows of text."""

    title: str
    header: list[str]
    rows: list[list[str]] = field(default_factory=list)


def aligned_lines(table: Table, title: str | None = None) -> list[str]:
    """The table as text lines, each column right-aligned to its widest cell (the terminal's layout),
    under ``title`` (by default the table's own, with a colon)."""
    widths = [max(len(r[i]) for r in [table.header, *table.rows]) for i in range(len(table.header))]
    head = [f"{table.title}:" if title is None else title]
    return head + ["  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [table.header, *table.rows]]


def configuration_interval(values: Sequence[float]) -> Interval:
    """95% interval of a configuration's value (the geometric mean of its counted launches): the
    launches' own spread from 3 launches on, else the stated noise bound
    (``contrasts.contrast_interval``): one launch is known no better than launches differ."""
    return contrast_interval([(+1.0, [(math.log(v), 0.0) for v in values])], None, CONFIDENCE)


def reference(fabrics: Sequence[str]) -> str | None:
    """The fabric every other is compared with: the reference fabric when measured, else the first."""
    return REFERENCE_FABRIC if REFERENCE_FABRIC in fabrics else (fabrics[0] if fabrics else None)


def by_model(cases: Iterable[CaseResult]) -> ByModel:
    table: ByModel = {}
    for c in cases:
        table.setdefault(c.workload, {}).setdefault(c.nodes, {})[c.fabric] = c
    return table


def delta_text(row: Mapping[str, CaseResult], fabric: str, ref: str | None, nodes: int) -> str:
    """``fabric``'s change against ``ref`` ("-25.0%"); "n/a" on one node, "-" where either is missing."""
    if fabric not in row:
        return "-"
    if nodes == 1:
        return "n/a"  # one node: no traffic crosses the fabric, every fabric shares one measurement
    if ref not in row:
        return "-"
    return f"{(row[fabric].mean / row[ref].mean - 1) * 100:+.1f}%"


def _count(c: CaseResult) -> str:
    """" (6)", " (6, 1 disturbed)" (one launch disturbed as a whole, not counted), "" for a single clean launch."""
    if c.launches == 1 and not c.disturbed:
        return ""
    return f" ({c.launches}" + (f", {c.disturbed} disturbed" if c.disturbed else "") + ")"


def with_interval(c: CaseResult) -> str:
    """The configuration's value with its 95% interval: "200.0 [180.2, 221.9]"."""
    iv = configuration_interval(c.counted_tokens_per_s)
    return f"{c.mean:.1f} [{iv.low:.1f}, {iv.high:.1f}]"


def throughput_tables(cases: Iterable[CaseResult], fabrics: Sequence[str], *, detail: bool = False,
                      delta_interval: Callable[[str, int, str, str | None], str] | None = None,
                      verdicts: Mapping[tuple[str, int], Sequence[str]] | None = None) -> list[Table]:
    """Per model: nodes, GPUs, tokens/s per fabric, the change against the reference, tokens/s per
    GPU, MFU and peak GiB per fabric.

    The terminal's (``detail`` False): each value with its launch count, "(3)" or "(3, 1 disturbed)". The
    report's (``detail`` True): each value with its 95% interval, each change with the gate's
    interval (``delta_interval(model, nodes, fabric, ref)``), then the launches and the verdicts.
    """
    ref = reference(fabrics)
    out = []
    for model, rows in sorted(by_model(cases).items()):
        header = ["nodes", "GPUs", *(f"{f} tok/s" for f in fabrics), *(f"{f} vs {ref}" for f in fabrics if f != ref),
                  *(f"{f} tok/s/GPU" for f in fabrics), *(f"{f} MFU" for f in fabrics),
                  *(f"{f} peak GiB" for f in fabrics)]
        if detail:
            header += ["launches", "verdict"]
        body = []
        for nodes in sorted(rows):
            row = rows[nodes]
            gpus = next(iter(row.values())).gpus
            value = with_interval if detail else (lambda c: f"{c.mean:.1f}" + _count(c))
            cells = [str(nodes), str(gpus), *(value(row[f]) if f in row else "-" for f in fabrics)]
            for f in fabrics:
                if f != ref:
                    extra = delta_interval(model, nodes, f, ref) if detail and delta_interval and nodes > 1 else ""
                    cells.append(delta_text(row, f, ref, nodes) + extra)
            per_gpu = (lambda c: c.mean_per_gpu) if detail else (lambda c: c.mean / c.gpus)
            cells += [f"{per_gpu(row[f]):.1f}" if f in row else "-" for f in fabrics]
            cells += [mfu_text(row[f].mfu) if f in row else "-" for f in fabrics]
            cells += [gib_text(row[f].peak_memory_gib) if f in row else "-" for f in fabrics]
            if detail:
                cells += [", ".join(f"{f} {row[f].count_text}" for f in fabrics if f in row),
                          "; ".join((verdicts or {}).get((model, nodes), [])) or "-"]
            body.append(cells)
        out.append(Table(model, header, body))
    return out


def bandwidth_table(links: Iterable[LinkResult], order: Callable[[LinkResult], object] | None = None,
                    payload: str = "MiB") -> Table | None:
    """Per nodes x fabric: busbw (Gbit/s) of each collective at its largest payload, and the link rate;
    rows in ``order`` (by default nodes, then fabric); None without links."""
    links = sorted(links, key=order or (lambda b: (b.nodes, b.fabric)))
    if not links:
        return None
    ops = sorted({op for b in links for op in b.busbw_gbit})
    return Table("collective bandwidth (Gbit/s, largest payload)",
                 ["nodes", "fabric", "link Gbit/s", *(f"{op} busbw" for op in ops), payload],
                 [[str(b.nodes), b.fabric, f"{b.link_gbit:g}" if b.link_gbit else "-",
                   *(f"{b.busbw_gbit[op]:.3f}" if op in b.busbw_gbit else "-" for op in ops),
                   f"{b.payload_bytes / MIB:g}"] for b in links])


def _cheapest(row: Mapping[str, CaseResult], cost: Mapping[str, float], prices: Mapping[str, float]) -> str:
    """The fabric cheapest per token, or "undecided" when its cost interval overlaps another's. Where
    every fabric has the same launches (one node never crosses a fabric: one launch serves them all),
    the price alone decides."""
    best = min(cost, key=cost.__getitem__)
    if len({tuple(row[f].tokens_per_s) for f in cost}) == 1:
        return best

    def bounds(f: str) -> tuple[float, float]:
        iv = configuration_interval(row[f].counted_tokens_per_s)
        return (cost_per_million_tokens(iv.high, row[f].gpus, prices[f]),
                cost_per_million_tokens(iv.low, row[f].gpus, prices[f]))

    tied = [f for f in cost if f != best and bounds(f)[0] <= bounds(best)[1]]
    return f"undecided: {best} or {', '.join(tied)} (intervals overlap)" if tied else best


def cost_tables(run: SavedRun, prices: Mapping[str, float]) -> list[Table]:
    """Per model: $ per million tokens per fabric, the reference's break-even premium over each other
    fabric, its price premium, and the fabric cheapest per token."""
    fabrics = run.fabrics()
    ref = reference(fabrics)
    priced = [f for f in fabrics if f in prices]
    others = [f for f in fabrics if f != ref]
    tables = []
    for model, rows in sorted(by_model(run.cases.values()).items()):
        header = ["nodes", "GPUs", *(f"{f} $/M tokens" for f in priced),
                  *(f"{ref} break-even premium over {f}" for f in others)]
        if ref in prices:
            header += [f"{ref} price premium over {f}" for f in others if f in prices]
        header.append("cheapest per token")
        body = []
        for nodes in sorted(rows):
            row = rows[nodes]
            cost = {f: cost_per_million_tokens(row[f].mean, row[f].gpus, prices[f]) for f in priced if f in row}
            cells = [str(nodes), str(next(iter(row.values())).gpus),
                     *(f"{cost[f]:.4g}" if f in cost else "-" for f in priced)]
            for f in others:
                if nodes == 1:
                    cells.append("n/a")
                elif ref in row and f in row:
                    cells.append(f"{break_even_premium(row[ref].mean, row[f].mean) * 100:+.1f}%")
                else:
                    cells.append("-")
            if ref in prices:
                cells += [f"{(prices[ref] / prices[f] - 1) * 100:+.1f}%" for f in others if f in prices]
            cells.append(_cheapest(row, cost, prices) if cost else "-")
            body.append(cells)
        tables.append(Table(model, header, body))
    return tables


@dataclass(frozen=True)
class ConfigRow:
    """One (model, nodes, fabric): its value (the one the gates judged) and a 95% interval of it;
    its MFU at that value, the peak that MFU is taken against, and its peak memory per rank (None:
    unknown; MFU and its peak on CPU)."""

    model: str
    nodes: int
    fabric: str
    gpus: int
    tokens_per_s: float
    low: float
    high: float
    launches: int | str  # "6", or "6 (1 disturbed)" with one not counted
    mfu: float | None = None
    mfu_peak: str | None = None
    peak_memory_gib: float | None = None
    launch_count: int = 0  # the launches measured...
    disturbed: int = 0  # ...and how many of them were disturbed as a whole (not counted)
    sharding: str = "full"

    @property
    def id(self) -> str:
        return Case(self.model, self.nodes, self.fabric, self.sharding).id

    @property
    def workload(self) -> str:
        return self.model if self.sharding == "full" else f"{self.model} {self.sharding}"


def config_rows(run: SavedRun) -> list[ConfigRow]:
    """Every configuration of the night, by model, nodes and fabric, with its interval, MFU and memory."""
    rows = []
    for c in sorted(run.cases.values(), key=lambda c: (c.workload, c.nodes, c.fabric)):
        iv = configuration_interval(c.counted_tokens_per_s)
        rows.append(ConfigRow(c.model, c.nodes, c.fabric, c.gpus, c.mean, iv.low, iv.high, c.count_text,
                              c.mfu, c.mfu_peak, c.peak_memory_gib, c.launches, c.disturbed, c.sharding))
    return rows


def straggler_report(run: SavedRun) -> tuple[list[str], str | None]:
    """(one line per straggler, naming its configuration, rank and node; the line saying how many
    configurations were judged and found none, or None where none was judged)."""
    judged = {cid: c.stragglers for cid, c in sorted(run.cases.items()) if c.stragglers is not None}
    found = [f"straggler in {cid}: {line}" for cid, lines in judged.items() for line in lines]
    if not judged:
        return found, None
    return found, (f"stragglers: {sum(1 for lines in judged.values() if lines)} of {len(judged)} configuration(s) "
                   f"name a rank or node (CPU: its own work per step over {STRAGGLER_MARGIN:.0%} above the "
                   f"others'; GPU: slowed-down steps and low clocks NVML saw)")
