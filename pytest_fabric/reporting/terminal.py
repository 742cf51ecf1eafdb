"""The terminal's tables: throughput per model x nodes x fabric, collective bandwidth, and cost.

Each configuration shows its value (``measure.configuration_tokens_per_s``: the geometric mean of
its counted launches), the number JUnit records (``junit.py``), with its launch count and how many
of them were disturbed as a whole (not counted: their rounds ran again). The rows are ``tables.py``'s; this module lays them
out as text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..measuring.measurement import BandwidthMeasurement, Measurement
from ..core.models import MFU_CONVENTION
from ..history.night_model import LinkResult, SavedRun
from ..history.nights import case_result
from .tables import aligned_lines, bandwidth_table as link_table, cost_tables, throughput_tables
from ..core.units import mbit_to_gbit

__all__ = ["bandwidth_table", "cost_lines", "summary_tables"]


def summary_tables(measurements: Iterable[Measurement], fabrics: Sequence[str]) -> list[str]:
    """Per model: nodes, GPUs, tokens/s per fabric, delta % against the reference, tokens/s/GPU.

    A configuration launched several times (the comparison gates' repeats) shows its value over its
    launches, as the gates and the report do; the number of launches follows in parentheses.
    """
    launches: dict[str, list[Measurement]] = {}
    for m in measurements:
        launches.setdefault(m.case.id, []).append(m)
    cases = [case_result(ms) for ms in launches.values()]
    cols = [f for f in fabrics if any(c.fabric == f for c in cases)]
    out = [line for table in throughput_tables(cases, cols) for line in aligned_lines(table)]
    if out:
        out.append(f"MFU: {MFU_CONVENTION}; peak GiB: per rank")
    if any(c.disturbed for c in cases):
        out.append("(n, k disturbed): n launches, k of them disturbed as a whole, not counted (their rounds ran again)")
    return out


def bandwidth_table(measurements: Iterable[BandwidthMeasurement]) -> list[str]:
    """Per nodes x fabric: busbw (Gbit/s) of each collective at its largest payload, and the link rate."""
    ms = list(measurements)
    ops = sorted({op for m in ms for op in m.result.ops()})
    links = []
    for m in ms:
        link = m.result.fabric.get("emulated_mbit")
        links.append(LinkResult(m.case.nodes, m.case.fabric, {op: m.busbw_gbit(op) for op in ops},
                                int(m.largest(ops[0]).bytes), mbit_to_gbit(link) if link else None))
    table = link_table(links)
    return [] if table is None else aligned_lines(table)


def cost_lines(run: SavedRun, prices: Mapping[str, float]) -> list[str]:
    """The cost tables as aligned text lines (the pytest terminal summary); none without prices."""
    if not prices or not run.cases:
        return []
    out = ["cost (USD per GPU-hour: " + ", ".join(f"{f} {prices[f]:g}" for f in sorted(prices)) + "):"]
    for table in cost_tables(run, prices):
        out.extend(aligned_lines(table))
    return out

