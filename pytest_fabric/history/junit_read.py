"""Reading a JUnit file back: its testsuites, and the night its machine lines hold.

A reader reads data, never a sentence: each ``fabric.<case id>.<name>=<value>`` line (suite
properties first, then each testcase's system-out) and each gate's
``fabric.gate.<a>_vs_<b>.<name>=<value>`` fields (``gates.record_from_fields``, the inverse of the
writer's ``gates.machine_fields``); a test's outcome is its JUnit result element's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.case import BANDWIDTH, Case
from ..core.units import mbit_to_gbit
from ..deciding.gates import record_from_fields
from ..deciding.verdicts import ERROR, FAIL, INCONCLUSIVE, PASS, SKIPPED
from .night_model import CaseResult, LinkResult, ResultsError, SavedRun, case_of_test

GATE_PREFIX = "fabric.gate."


def machine_line(line: str) -> tuple[str, str, str] | None:
    """(subject, name, value) of one machine line, None for any other line. The subject is a case id
    (``fabric.<case id>.<name>=``; the name is one word, or ``<op>.<bytes>.busbw_gbit``) or a gate's
    ``<a>_vs_<b>`` (``fabric.gate.<a>_vs_<b>.<name>=``); fabric and model names may hold dots."""
    key, eq, value = line.strip().partition("=")
    if not eq or not key.startswith("fabric."):
        return None
    parts = key.split(".")[1:]
    if key.startswith(GATE_PREFIX):
        pair, name = ".".join(parts[1:-1]), parts[-1]
        return (pair, name, value) if "_vs_" in pair and name else None
    width = 3 if parts[-1] == "busbw_gbit" and len(parts) > 3 and parts[-2].isdigit() else 1
    subject = ".".join(parts[:-width])
    try:
        Case.parse(subject)
    except ValueError:
        return None  # a run-wide property (fabric.version.torch, fabric.cluster)
    return subject, ".".join(parts[-width:]), value



def junit_suites(path: Path | str) -> list[Any]:
    """The testsuites of a JUnit file (junitparser objects); ResultsError when it is not one."""
    from junitparser import JUnitXml, TestSuite
    from junitparser.junitparser import JUnitXmlError

    try:
        xml = JUnitXml.fromfile(str(path))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except JUnitXmlError:
        raise ResultsError(f"{path}: XML but not JUnit (the root element must be <testsuites> or "
                           "<testsuite>)") from None
    except (SyntaxError, ValueError) as exc:  # lxml's and ElementTree's parse errors are SyntaxErrors
        raise ResultsError(f"{path}: not readable as JUnit XML ({exc}); the file may be truncated") from None
    # junitparser 3 returns a lone <testsuite> as it is, later versions wrap it in <testsuites>.
    return [xml] if isinstance(xml, TestSuite) else list(xml)


def load_junit(path: Path) -> SavedRun:
    """A night as its JUnit file holds it, read from the machine lines (``fabric.<case>.<name>=``)
    and the testsuite properties; ``ResultsError`` when the file carries no pytest-fabric figures."""
    suites = junit_suites(path)
    identity: dict[str, Any] = {}
    versions: dict[str, str] = {}
    metrics: dict[str, dict[str, str]] = {}
    launches: dict[str, tuple[list[float], list[bool]]] = {}
    verdicts: list[dict[str, Any]] = []
    for suite in suites:
        if suite.timestamp and "created" not in identity:
            identity["created"] = suite.timestamp
        if suite.hostname and "harness_host" not in identity:
            identity["harness_host"] = suite.hostname
        for prop in suite.properties():
            line = machine_line(f"{prop.name}={prop.value or ''}")
            if line and not prop.name.startswith(GATE_PREFIX):
                # a configuration's lines over every launch of the run: they win over a testcase's
                metrics.setdefault(line[0], {})[line[1]] = line[2]
            if prop.name == "fabric.cluster":
                identity.setdefault("cluster", prop.value)
            elif prop.name == "fabric.fabrics":
                identity.setdefault("fabrics", [f for f in (prop.value or "").split(",") if f])
            elif prop.name == "fabric.attention":
                identity.setdefault("attention", prop.value)
            elif prop.name == "fabric.mfu_convention":
                identity.setdefault("mfu_convention", prop.value)
            elif prop.name.startswith("fabric.version."):
                versions.setdefault(prop.name.removeprefix("fabric.version."), prop.value)
        for cid, lines in metrics.items():
            values = _launch_values(lines, path)
            if values is not None and len(values[0]) > len(launches.get(cid, ([], []))[0]):
                launches[cid] = values
        for case in suite:
            out = case.system_out or ""
            mine: dict[str, dict[str, str]] = {}
            gates: dict[str, dict[str, str]] = {}
            for text in out.splitlines():
                if line := machine_line(text):
                    (gates if text.strip().startswith(GATE_PREFIX) else mine).setdefault(line[0], {})[line[1]] = line[2]
            for cid, lines in mine.items():
                for name, value in lines.items():
                    metrics.setdefault(cid, {}).setdefault(name, value)
                values = _launch_values(lines, path)
                # The same launches are cached per index: the longest list holds the others.
                if values is not None and len(values[0]) > len(launches.get(cid, ([], []))[0]):
                    launches[cid] = values
            if mine:
                verdicts.append(_junit_verdict(case, [record_from_fields(*pair.split("_vs_", 1), fields)
                                                      for pair, fields in gates.items()]))
    if not metrics:
        raise ResultsError(f"{path}: JUnit, but no testcase carries pytest-fabric measurements (no "
                           "fabric.<case>.tokens_per_s= lines in any system-out); expected the JUnit XML of a "
                           "pytest-fabric run")
    for m in metrics.values():
        if m.get("cluster"):
            identity.setdefault("cluster_kind", m["cluster"])
        if listed := m.get("hosts"):
            hosts = sorted(h for h in listed.split(",") if h)
            if len(hosts) > len(identity.get("hosts", [])):
                identity["hosts"] = hosts
        device, _, dtype = (m.get("device") or "").partition("/")  # "cuda/bfloat16"
        if device and device != "None":
            identity.setdefault("device", device)
        if dtype and dtype != "None":
            identity.setdefault("dtype", dtype)
    emulated = identity.get("cluster_kind") == "emulated" or str(identity.get("cluster", "")).startswith("emulated")
    cases, links = _cases_from_metrics(metrics, launches, emulated, path)
    if cases or links:
        identity["nodes"] = max(c.nodes for c in [*cases.values(), *links.values()])
    if versions:
        identity["versions"] = versions
    identity = {k: v for k, v in identity.items() if v not in (None, "")}
    return SavedRun(identity, cases, links, verdicts, [], path, "junit")


def _launch_values(lines: Mapping[str, str], path: Path) -> tuple[list[float], list[bool]] | None:
    """(each launch's tokens/s, whether it counts) from one testcase's machine lines (all count
    where ``launch_counted`` is absent)."""
    text = lines.get("launch_tokens_per_s")
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ResultsError(f"{path}: launch_tokens_per_s={text!r} is not a comma-separated list of numbers") from None
    flags = [f.strip() != "0" for f in lines.get("launch_counted", "").split(",") if f.strip()]
    return values, flags if len(flags) == len(values) else [True] * len(values)


def _cases_from_metrics(metrics: dict[str, dict[str, str]], launches: dict[str, tuple[list[float], list[bool]]],
                        emulated: bool,
                        path: Path) -> tuple[dict[str, CaseResult], dict[str, LinkResult]]:
    cases: dict[str, CaseResult] = {}
    links: dict[str, LinkResult] = {}
    for cid, m in sorted(metrics.items()):
        case = Case.parse(cid)  # the metric pattern only matches case ids
        try:
            if case.model == BANDWIDTH:
                busbw: dict[str, tuple[int, float]] = {}
                for name, value in m.items():
                    parts = name.split(".")
                    if len(parts) == 3 and parts[2] == "busbw_gbit" and parts[1].isdigit():
                        op, size = parts[0], int(parts[1])
                        if op not in busbw or size > busbw[op][0]:
                            busbw[op] = (size, float(value))
                if busbw:
                    settings = json.loads(m.get("fabric_settings") or "{}")
                    mbit = settings.get("emulated_mbit") if emulated else None
                    links[cid] = LinkResult(case.nodes, case.fabric, {op: v for op, (_, v) in sorted(busbw.items())},
                                            max(size for size, _ in busbw.values()), mbit_to_gbit(mbit) if mbit else None)
            elif "tokens_per_s" in m:
                gpus = int(m.get("gpus", "1"))
                values, counted = launches.get(cid) or ([float(m["tokens_per_s"])], [True])
                # The step's figures; "n/a" (a CPU run) and files written before them: None.
                cases[cid] = CaseResult(case.model, case.nodes, case.fabric, gpus, values, [v / gpus for v in values],
                                        counted if not all(counted) else None, _known(m, "mfu", float), _known(m, "mfu_peak", str),
                                        _known(m, "peak_memory_gib", float), case.sharding,
                                        _straggler_lines(m.get("stragglers")))
        except ValueError as exc:
            raise ResultsError(f"{path}: metric lines of {cid} are malformed ({exc}); expected "
                               f"fabric.{cid}.tokens_per_s=<number>, fabric.{cid}.gpus=<integer> and "
                               f"fabric.{cid}.mfu= and .peak_memory_gib= a number or n/a") from None
    return cases, links


def _straggler_lines(value: str | None) -> list[str] | None:
    """``fabric.<case>.stragglers`` as lines (``junit.straggler_text``): "none" is [], "n/a" or absent None."""
    if value is None or value == "n/a":
        return None
    return [] if value == "none" else value.split("; ")


def _known(lines: Mapping[str, str], name: str, kind: type) -> Any:
    """A machine line's value as ``kind``; None where absent or "n/a"."""
    value = lines.get(name)
    return None if value in (None, "", "n/a") else kind(value)


def _junit_verdict(case: Any, gates: list[dict[str, Any]]) -> dict[str, Any]:
    """A measured testcase's outcome word (``verdicts.OUTCOMES``), from its JUnit result element,
    with its one-line message (the element's, else each gate's figures) and its gates' records."""
    from junitparser import Error, Failure, Skipped

    outcome = PASS
    message = "; ".join(_said(g) for g in gates)
    for r in case.result:
        if isinstance(r, (Failure, Error)):
            outcome = FAIL if isinstance(r, Failure) else ERROR
        elif isinstance(r, Skipped):
            # A skip is a gate's undecided verdict where the plugin marked it so, or where its gates say
            # so (pytest's own xfail, in a file the plugin did not complete).
            undecided = r.type == "fabric.inconclusive" or any(g.get("outcome") == INCONCLUSIVE for g in gates)
            outcome = INCONCLUSIVE if undecided else SKIPPED
        else:
            continue
        message = r.message or message
    verdict: dict[str, Any] = {"test": f"{case.classname}::{case.name}" if case.classname else case.name,
                               "outcome": outcome, "message": message.splitlines()[0] if message else "",
                               "gates": gates}
    return {**verdict, **case_of_test(case.name or "")}


def _said(gate: Mapping[str, Any]) -> str:
    """A gate record in one line: "pass: eth/ib = 0.981 [0.962, 1.001] vs threshold 0.950"."""
    def num(name: str) -> str:
        value = gate.get(name)
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    return (f"{gate.get('outcome')}: {gate['a']}/{gate['b']} = {num('ratio')} [{num('ci_low')}, {num('ci_high')}] "
            f"vs threshold {num('threshold')}")
