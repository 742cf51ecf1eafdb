"""The terminal's tables: throughput per model x nodes x fabric, and collective bandwidth.

Each configuration shows its value (``measure.configuration_tokens_per_s``: the weighted geometric
mean of its launches), the number its gates judged and JUnit records (``junit.py``), with its launch
count and how many of them were down-weighted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .fabrics import REFERENCE_FABRIC
from .models import MFU_CONVENTION
from .hostbound import configuration_mfu, gib_text, mfu_text, peak_memory_gib
from .measure import BandwidthMeasurement, Measurement, configuration_tokens_per_s
from .units import MIB, mbit_to_gbit


def summary_tables(measurements: Iterable[Measurement], fabrics: Sequence[str]) -> list[str]:
    """Per model: nodes, GPUs, tokens/s per fabric, delta % against the reference, tokens/s/GPU.

    A configuration launched several times (the comparison gates' repeats) shows its value over its
    launches, as the gates and the report do; the number of launches follows in parentheses.
    """
    table: dict[str, dict[int, dict[str, list[Measurement]]]] = {}
    for m in measurements:
        table.setdefault(m.case.model, {}).setdefault(m.case.nodes, {}).setdefault(m.case.fabric, []).append(m)
    cols = [f for f in fabrics if any(f in row for rows in table.values() for row in rows.values())]
    ref = REFERENCE_FABRIC if REFERENCE_FABRIC in cols else (cols[0] if cols else None)
    out: list[str] = []
    for model, rows in sorted(table.items()):
        header = ["nodes", "GPUs"] + [f"{f} tok/s" for f in cols]
        header += [f"{f} vs {ref}" for f in cols if f != ref] + [f"{f} tok/s/GPU" for f in cols]
        header += [f"{f} MFU" for f in cols] + [f"{f} peak GiB" for f in cols]
        body = []
        for nodes in sorted(rows):
            runs = rows[nodes]
            tps = {f: configuration_tokens_per_s(ms) for f, ms in runs.items()}
            gpus = next(iter(runs.values()))[0].gpus
            cells = [str(nodes), str(gpus)]
            cells += [(f"{tps[f]:.1f}" + _count(runs[f])) if f in tps else "-" for f in cols]
            for f in cols:
                if f == ref:
                    continue
                if nodes == 1 and f in tps:
                    cells.append("n/a")  # one node: no traffic crosses the fabric
                elif f in tps and ref in tps:
                    cells.append(f"{(tps[f] / tps[ref] - 1) * 100:+.1f}%")
                else:
                    cells.append("-")
            cells += [f"{tps[f] / gpus:.1f}" if f in tps else "-" for f in cols]
            cells += [mfu_text(configuration_mfu(runs[f], tps[f])) if f in tps else "-" for f in cols]
            cells += [gib_text(peak_memory_gib(runs[f])) if f in tps else "-" for f in cols]
            body.append(cells)
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        out.append(f"{model}:")
        for r in [header, *body]:
            out.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
    if out:
        out.append(f"MFU: {MFU_CONVENTION}; peak GiB: per rank")
    if any(m.down_weighted for rows in table.values() for runs in rows.values() for ms in runs.values() for m in ms):
        out.append("(n, k dw): n launches, k of them disturbed as a whole and counted with a small weight")
    return out


def _count(launches: Sequence[Measurement]) -> str:
    """" (6)", " (6, 1 dw)" (one launch down-weighted: disturbed as a whole), "" for a single clean launch."""
    dw = sum(1 for m in launches if m.down_weighted)
    if len(launches) == 1 and not dw:
        return ""
    return f" ({len(launches)}" + (f", {dw} dw" if dw else "") + ")"


def bandwidth_table(measurements: Iterable[BandwidthMeasurement]) -> list[str]:
    """Per nodes x fabric: busbw (Gbit/s) of each collective at its largest payload, and the link rate."""
    ms = sorted(measurements, key=lambda m: (m.case.nodes, m.case.fabric))
    if not ms:
        return []
    ops = sorted({op for m in ms for op in m.result.ops()})
    header = ["nodes", "fabric", "link Gbit/s", *(f"{op} busbw" for op in ops), "MiB"]
    body = []
    for m in ms:
        link = m.result.fabric.get("emulated_mbit")
        body.append([str(m.case.nodes), m.case.fabric, f"{mbit_to_gbit(link):g}" if link else "-",
                     *(f"{m.busbw_gbit(op):.3f}" for op in ops), f"{m.largest(ops[0]).bytes / MIB:g}"])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return ["collective bandwidth (Gbit/s, largest payload):",
            *("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *body])]


