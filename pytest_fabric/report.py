"""What a measured test reports: its testcase text, the terminal tables, and the JUnit additions.

JUnit as dashboards read it: GitLab and most viewers read a testcase's ``system-out`` but not its
properties, and the xunit2 schema (pytest's default, Jenkins' junit-10.xsd) allows no per-testcase
properties at all. So every measured testcase gets its numbers in ``system-out``; properties are
added where the JUnit family allows them (xunit1/legacy), and run-wide facts (versions, cluster)
go into the testsuite's properties, which every family allows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .fabrics import REFERENCE_FABRIC
from .measure import BandwidthMeasurement, Measurement

SECTION = "pytest-fabric measurements"


def testcase_text(measurements: Sequence[Measurement | BandwidthMeasurement], verdicts: Sequence[str] = ()) -> str:
    """Human lines first (what a person reads on a dashboard), then name=value lines (for scripts).

    A comparison measures each configuration several times: one line per configuration, with the
    mean over its launches and each launch's figure.
    """
    lines = list(verdicts)
    groups: dict[tuple[str, str], list] = {}
    for m in measurements:
        groups.setdefault((type(m).__name__, m.case.id), []).append(m)
    means: dict[tuple[str, int, str], float] = {}
    for group in groups.values():
        first = group[0]
        if isinstance(first, Measurement) and len(group) > 1:
            mean = sum(m.tokens_per_s for m in group) / len(group)
            lines.append(f"{first.case.id}: mean {mean:.1f} tokens/s over {len(group)} launches "
                         f"({', '.join(f'{m.tokens_per_s:.1f}' for m in group)}), {first.gpus} GPU(s)")
        else:
            lines.append(first.summary())
        if isinstance(first, Measurement):
            means[(first.case.model, first.case.nodes, first.case.fabric)] = (
                sum(m.tokens_per_s for m in group) / len(group))
    for (model, nodes, fabric), value in means.items():
        ref = means.get((model, nodes, REFERENCE_FABRIC))
        if ref and fabric != REFERENCE_FABRIC:
            r = value / ref
            lines.append(f"{fabric}/{REFERENCE_FABRIC} tokens/s ratio ({model}, {nodes} nodes): {r:.3f} ({(r - 1) * 100:+.1f}%)")
    if measurements:
        first = measurements[0].result
        attention = f"; attention {first['attention']}" if "attention" in first else ""
        lines.append(f"ran with: {first.get('cluster', measurements[0].cluster)}{attention}; "
                     + ", ".join(f"{k} {v}" for k, v in first.get("versions", {}).items() if v))
    lines.append("")
    for group in groups.values():
        lines.extend(f"{k}={v}" for k, v in group[0].metrics().items())
        if isinstance(group[0], Measurement):
            lines.append(f"fabric.{group[0].case.id}.launch_tokens_per_s="
                         + ",".join(f"{m.tokens_per_s:.3f}" for m in group))
    return "\n".join(lines)


def summary_tables(measurements: Iterable[Measurement], fabrics: Sequence[str]) -> list[str]:
    """Per model: nodes, GPUs, tokens/s per fabric, delta % against the reference, tokens/s/GPU.

    A configuration launched several times (the comparison gates' repeats) shows the mean over its
    launches, as the report does; the number of launches follows in parentheses.
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
        body = []
        for nodes in sorted(rows):
            runs = rows[nodes]
            tps = {f: sum(m.tokens_per_s for m in ms) / len(ms) for f, ms in runs.items()}
            gpus = next(iter(runs.values()))[0].gpus
            cells = [str(nodes), str(gpus)]
            cells += [(f"{tps[f]:.1f}" + (f" ({len(runs[f])})" if len(runs[f]) > 1 else "")) if f in tps else "-"
                      for f in cols]
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
            body.append(cells)
        widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
        out.append(f"{model}:")
        for r in [header, *body]:
            out.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
    return out


def bandwidth_table(measurements: Iterable[BandwidthMeasurement]) -> list[str]:
    """Per nodes x fabric: busbw (Gbit/s) of each collective at its largest payload, and the link rate."""
    ms = sorted(measurements, key=lambda m: (m.case.nodes, m.case.fabric))
    if not ms:
        return []
    ops = sorted({r["op"] for m in ms for r in m.rows})
    header = ["nodes", "fabric", "link Gbit/s", *(f"{op} busbw" for op in ops), "MiB"]
    body = []
    for m in ms:
        link = m.result.get("fabric", {}).get("emulated_mbit")
        body.append([str(m.case.nodes), m.case.fabric, f"{link / 1000:g}" if link else "-",
                     *(f"{m.busbw_gbit(op):.3f}" for op in ops), f"{m.largest(ops[0])['bytes'] / 2**20:g}"])
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return ["collective bandwidth (Gbit/s, largest payload):",
            *("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in [header, *body])]


def _junit_names(nodeid: str, prefix: str | None) -> tuple[str, str]:
    """(classname, name) exactly as pytest's junitxml derives them from a node id."""
    path, bracket, params = nodeid.partition("[")
    names = path.split("::")
    names[0] = re.sub(r"\.py$", "", names[0].replace("/", "."))
    names[-1] += bracket + params
    classnames = names[:-1]
    if prefix:
        classnames.insert(0, prefix)
    return ".".join(classnames), names[-1]


def add_to_junit(path: Path, outputs: Mapping[str, str], suite_properties: Mapping[str, str],
                 prefix: str | None = None) -> int:
    """Add each test's measurement text to its testcase's system-out (appending to any captured
    output already there) and run-wide properties to the testsuite. Returns testcases updated."""
    from junitparser import JUnitXml, TestSuite

    xml = JUnitXml.fromfile(str(path))
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    wanted = {_junit_names(nodeid, prefix): text for nodeid, text in outputs.items()}
    updated = 0
    for suite in suites:
        for name, value in suite_properties.items():
            suite.add_property(name, value)
        for case in suite:
            key = (case.classname, case.name)
            if key in wanted:
                text = wanted[key]
                case.system_out = f"{case.system_out}\n{text}" if case.system_out else text
                updated += 1
    xml.write(str(path))
    return updated
