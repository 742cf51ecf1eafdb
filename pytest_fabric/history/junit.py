"""The JUnit format of pytest-fabric, in one place: what a measured testcase writes, how the file
is completed after pytest's junitxml wrote it, how it is read back, and how files are merged.

What a testcase writes (its ``system-out``, also the report section pytest shows with ``-rA``):
human lines first (the verdict with ratio, interval, threshold and the two fabrics' numbers, the
prediction; or one line per configuration of a test that only measured), then machine lines:
``fabric.<case id>.tokens_per_s=<value>`` per configuration (busbw at the largest payload for
bandwidth) and ``fabric.gate.<a>_vs_<b>.<name>=<value>`` per gate. Kept well under 1,000
characters: Jenkins keeps the first and last 500 of a passed test's output, GitLab shows a
skip's body only.

What the testsuite carries (properties, which every JUnit family allows): run-wide facts (versions,
cluster, nodes, repeats policy, device, project version, the count of each outcome) and, over
every launch of the run, each configuration's machine lines ``fabric.<case id>.<name>``: its
figure (the one the gate judged, ``contrasts.configuration_value`` of the launches that counted),
``launch_tokens_per_s`` per launch and ``launch_counted`` (1, or 0 for a launch disturbed as a
whole, whose round ran again). A reader reads the machine lines (suite properties first, then testcases), never the
sentences. Per-testcase properties are added where the family allows them (xunit1/legacy:
Jenkins ``keepProperties``); the xunit2 schema (pytest's default, junit-10.xsd) has none.

An inconclusive gate is a ``<skipped type="fabric.inconclusive">`` whose message starts
``INCONCLUSIVE:`` with a body (``add_to_junit``), so no parser counts it as a pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.atomic import replacing
from ..core.case import BANDWIDTH, FABRIC_NAME, Case
from ..core.fabrics import REFERENCE_FABRIC
from ..deciding.gates import GateOutcome
from ..physics.hostbound import configuration_mfu, mfu_peak, peak_memory_gib
from ..core.models import MFU_CONVENTION
from ..measuring.measurement import BandwidthMeasurement, Measurement, configuration_tokens_per_s
from ..core.redact import redact_file
from ..deciding.verdicts import ERROR, FAIL, INCONCLUSIVE, INCONCLUSIVE_PREFIX, PASS, SKIPPED, verdict_line
from .night_model import CaseResult, LinkResult, ResultsError, SavedRun, case_of_test
from ..core.units import mbit_to_gbit
from ..workload.result import TrainResult, host_list

SECTION = "pytest-fabric measurements"

# "fabric.<case id>.<metric>=<value>", one per line in a measured testcase's system-out.
# The name is one word, or op.bytes.busbw_gbit for bandwidth: a fabric name may contain dots (roce.v2).
# "fabric.gate.<a>_vs_<b>.<name>=<value>"; fabric names may contain dots (roce.v2).
_GATE_LINE = re.compile(r"^fabric\.gate\.(?P<pair>(?P<a>.+?)_vs_(?P<b>.+))\.(?P<name>[a-z_]+)=(?P<value>.*)$")
_METRIC_LINE = re.compile(rf"^fabric\.(?P<id>.+?-n\d+-{FABRIC_NAME}?)\."  # the id as case.py spells it
                          r"(?P<name>[a-z_]+\.\d+\.busbw_gbit|[A-Za-z0-9_]+)=(?P<value>.*)$")


# --------------------------------------------------------------------------------------------
# Writing: a measured testcase's text
# --------------------------------------------------------------------------------------------


def measurement_lines(launches: Sequence[Measurement | BandwidthMeasurement]) -> dict[str, str]:
    """Machine lines of one configuration, from its launches in this test (name -> value)."""
    first = launches[0]
    p = f"fabric.{first.case.id}"
    if isinstance(first, BandwidthMeasurement):
        out = {f"{p}.{row.op}.{row.bytes}.busbw_gbit": f"{row.busbw_gbit:.4f}" for row in first.rows}
        r = first.result
    else:
        ms = [m for m in launches if isinstance(m, Measurement)]
        value = configuration_tokens_per_s(ms)
        r = first.result
        out = {
            f"{p}.tokens_per_s": f"{value:.3f}",
            f"{p}.tokens_per_s_per_gpu": f"{value / first.gpus:.3f}",
            f"{p}.step_s": f"{r.tokens_per_step / value:.6f}",
            f"{p}.launches": str(len(ms)),
            f"{p}.launches_disturbed": str(sum(1 for m in ms if not m.counted)),
            f"{p}.launch_tokens_per_s": ",".join(f"{m.tokens_per_s:.3f}" for m in ms),
            f"{p}.launch_counted": ",".join("1" if m.counted else "0" for m in ms),
            f"{p}.steps": ",".join(str(m.estimate.steps) for m in ms),
            f"{p}.gpus": str(first.gpus),
            f"{p}.cluster": first.cluster,
            f"{p}.hosts": ",".join(r.hosts),
            f"{p}.attention": r.attention,
            f"{p}.device": f"{r.device}/{r.dtype}",
            # MFU under models.MFU_CONVENTION on the result's peak ("n/a" on CPU), peak memory per rank
            # ("n/a" where the launches recorded none).
            f"{p}.mfu": "n/a" if (mfu := configuration_mfu(ms, value)) is None else f"{mfu:.4f}",
            f"{p}.mfu_peak": mfu_peak(ms) or "n/a",
            f"{p}.peak_memory_gib": "n/a" if (gib := peak_memory_gib(ms)) is None else f"{gib:.2f}",
        }
    out[f"{p}.fabric_settings"] = json.dumps(r.fabric, sort_keys=True)
    out[f"{p}.versions"] = ", ".join(f"{k} {v}" for k, v in r.versions.items() if v)
    return out


def gate_lines(outcome: GateOutcome) -> dict[str, str]:
    """Machine lines of one gate: verdict, ratio, interval, threshold, launches."""
    p = f"fabric.gate.{outcome.a_name}_vs_{outcome.b_name}"
    return {f"{p}.{name}": value for name, value in outcome.fields().items()}


# What a testcase's system-out carries per configuration; the rest is in the suite properties.
_TESTCASE_NAMES = ("tokens_per_s",)
# A gate's fields left out of its testcase's output for its length (the verdict line above them
# says them in words; the saved night and xunit1 properties keep them as fields).
_LEFT_OUT_GATE_FIELDS = ("launch_noise", "noise_df", "noise_source", "family")


# Lines whose parenthesised details (how a prediction was made, the floor's bytes and tolerance)
# stay in the terminal and the failure message; a testcase's output keeps the rest, to stay whole.
_COMPACTED = ("predicted:", "floor:")
_DETAILS = re.compile(r" \((?:[^()]|\([^()]*\))*\)")


def _compact(text: str) -> str:
    """``text`` with the first parenthesised details of each prediction or floor line left out."""
    return "\n".join(_DETAILS.sub("", line, count=1) if line.startswith(_COMPACTED) else line
                     for line in text.splitlines())


def testcase_text(measurements: Sequence[Measurement | BandwidthMeasurement], notes: Sequence[str] = (),
                  outcomes: Sequence[GateOutcome] = ()) -> str:
    """A testcase's output, short enough that every viewer keeps it whole (Jenkins keeps 1,000
    characters of a passed test's output): human lines first, then name=value lines.

    A gate's test shows its verdict lines (ratio, interval, threshold, the two fabrics' numbers,
    the prediction); a test that only measured shows one line per configuration. Machine lines:
    each configuration's figure (``tokens_per_s``, or busbw per collective at the largest payload)
    and each gate's fields. Everything else about a configuration (each launch, hosts, settings)
    and the run-wide facts are suite properties (``suite_properties``).
    """
    # A gate's test: its verdict lines, rendered from its GateOutcomes whatever they decided, then
    # the notes (the prediction and the floor).
    lines = [verdict_line(g) for g in outcomes] + [_compact(n) for n in notes]
    groups: dict[tuple[str, str], list[Any]] = {}
    for m in measurements:
        groups.setdefault((type(m).__name__, m.case.id), []).append(m)
    if not outcomes:
        values: dict[tuple[str, int, str], float] = {}
        for group in groups.values():
            first = group[0]
            if isinstance(first, Measurement):
                value = configuration_tokens_per_s(group)
                values[(first.case.model, first.case.nodes, first.case.fabric)] = value
                if len(group) > 1:
                    aside = sum(1 for m in group if not m.counted)
                    lines.append(f"{first.case.id}: {value:.1f} tokens/s over {len(group)} launches "
                                 f"({', '.join(f'{m.tokens_per_s:.1f}' for m in group)}"
                                 + (f"; {aside} disturbed, not counted" if aside else "") + f"), {first.gpus} GPU(s)")
                    continue
            lines.append(first.summary())
        for (model, nodes, fabric), value in values.items():
            ref = values.get((model, nodes, REFERENCE_FABRIC))
            if ref and fabric != REFERENCE_FABRIC:
                r = value / ref
                lines.append(f"{fabric}/{REFERENCE_FABRIC} tokens/s ratio ({model}, {nodes} nodes): {r:.3f} "
                             f"({(r - 1) * 100:+.1f}%)")
    lines.append("")
    for group in groups.values():
        full = measurement_lines(group)
        lines.extend(f"{k}={v}" for k, v in full.items()
                     if k.rpartition(".")[2] in _TESTCASE_NAMES or _largest_payload(k, full))
    for outcome in outcomes:
        lines.extend(f"{k}={v}" for k, v in gate_lines(outcome).items()
                     if k.rpartition(".")[2] not in _LEFT_OUT_GATE_FIELDS)
    return "\n".join(lines)


def _largest_payload(name: str, lines: Mapping[str, str]) -> bool:
    """``fabric.<id>.<op>.<bytes>.busbw_gbit`` of the largest payload measured for ``op``."""
    head, _, tail = name.rpartition(".")
    if tail != "busbw_gbit":
        return False
    op_prefix, _, size = head.rpartition(".")
    sizes = [int(k.rpartition(".")[0].rpartition(".")[2]) for k in lines if k.startswith(op_prefix + ".")
             and k.endswith(".busbw_gbit")]
    return int(size) == max(sizes)


def suite_properties(measurements: Sequence[Measurement | BandwidthMeasurement],
                     facts: Mapping[str, str]) -> dict[str, str]:
    """The testsuite's properties: ``facts`` (cluster, nodes, policies, outcome counts) and, from
    every launch of the run, each configuration's machine lines (``fabric.<case id>.<name>``, as
    ``measurement_lines`` writes them) and the run-wide facts those carry (versions, attention,
    device). Every JUnit family allows suite properties; a reader merges them with the testcases'.
    """
    props = dict(facts)
    groups: dict[tuple[str, str], list[Any]] = {}
    for m in measurements:
        groups.setdefault((type(m).__name__, m.case.id), []).append(m)
    for group in groups.values():
        props.update(measurement_lines(group))
    training = [m.result for m in measurements if isinstance(m, Measurement)]
    results = training or [m.result for m in measurements]
    if results:
        r = results[0]
        props.update({f"fabric.version.{k}": str(v) for k, v in r.versions.items() if v})
        if isinstance(r, TrainResult):
            props["fabric.attention"] = r.attention
            props["fabric.device"] = f"{r.device}/{r.dtype}"
            props["fabric.mfu_convention"] = MFU_CONVENTION
    return props


# --------------------------------------------------------------------------------------------
# Completing the file pytest wrote
# --------------------------------------------------------------------------------------------


def junit_names(nodeid: str, prefix: str | None) -> tuple[str, str]:
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
                 prefix: str | None = None, inconclusive: Mapping[str, tuple[str, str]] | None = None) -> int:
    """Add each test's measurement text to its testcase's system-out (appending to any captured
    output already there) and run-wide properties to the testsuite. Returns testcases updated.

    ``inconclusive``: nodeid -> (one-line message, verdict text) of each inconclusive gate. pytest writes an xfail
    as an empty ``<skipped/>`` (Codecov counts it as a pass) and a warned one as a pass; here each
    becomes ``<skipped type="fabric.inconclusive" message="INCONCLUSIVE: ...">`` with the test's
    human lines (else the verdict text) as its body, which GitLab and Jenkins show for a skip.
    """
    from junitparser import JUnitXml, TestSuite

    xml = JUnitXml.fromfile(str(path))
    suites = [xml] if isinstance(xml, TestSuite) else list(xml)
    wanted = {junit_names(nodeid, prefix): text for nodeid, text in outputs.items()}
    undecided = {junit_names(nodeid, prefix): told for nodeid, told in (inconclusive or {}).items()}
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
            if key in undecided and not (case.is_failure or case.is_error):
                message, verdict = undecided[key]
                _mark_inconclusive(case, message, wanted.get(key, "").partition("\n\n")[0] or verdict or message)
        _recount(suite)
    xml.write(str(path))
    return updated


def _mark_inconclusive(case: Any, message: str, text: str) -> None:
    from junitparser import Skipped

    skipped = Skipped(f"{INCONCLUSIVE_PREFIX} {message}" if message else f"{INCONCLUSIVE_PREFIX} undecided",
                      "fabric.inconclusive")
    skipped.text = text
    case.result = [skipped]


def _recount(suite: Any) -> None:
    """The testsuite's skipped count after a passing (warned) inconclusive gate became a skip."""
    cases = list(suite)
    suite.skipped = sum(1 for c in cases if c.is_skipped)

# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


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
            match = _METRIC_LINE.match(f"{prop.name}={prop.value or ''}")
            if match:  # a configuration's lines over every launch of the run: they win over a testcase's
                metrics.setdefault(match["id"], {})[match["name"]] = match["value"]
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
            for line in out.splitlines():
                match = _METRIC_LINE.match(line.strip())
                if match:
                    mine.setdefault(match["id"], {})[match["name"]] = match["value"]
            for cid, lines in mine.items():
                for name, value in lines.items():
                    metrics.setdefault(cid, {}).setdefault(name, value)
                values = _launch_values(lines, path)
                # The same launches are cached per index: the longest list holds the others.
                if values is not None and len(values[0]) > len(launches.get(cid, ([], []))[0]):
                    launches[cid] = values
            if mine:
                verdicts.append(_junit_verdict(case, out))
    if not metrics:
        raise ResultsError(f"{path}: JUnit, but no testcase carries pytest-fabric measurements (no "
                           "fabric.<case>.tokens_per_s= lines in any system-out); expected the JUnit XML of a "
                           "pytest-fabric run")
    for m in metrics.values():
        if m.get("cluster"):
            identity.setdefault("cluster_kind", m["cluster"])
        if listed := host_list(m, str):
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
                                        _known(m, "peak_memory_gib", float))
        except ValueError as exc:
            raise ResultsError(f"{path}: metric lines of {cid} are malformed ({exc}); expected "
                               f"fabric.{cid}.tokens_per_s=<number>, fabric.{cid}.gpus=<integer> and "
                               f"fabric.{cid}.mfu= and .peak_memory_gib= a number or n/a") from None
    return cases, links


def _known(lines: Mapping[str, str], name: str, kind: type) -> Any:
    """A machine line's value as ``kind``; None where absent or "n/a"."""
    value = lines.get(name)
    return None if value in (None, "", "n/a") else kind(value)


def _junit_verdict(case: Any, out: str) -> dict[str, Any]:
    """A measured testcase's outcome word (``verdicts.OUTCOMES``), with its one-line message."""
    from junitparser import Error, Failure, Skipped

    outcome = PASS
    gates = _gate_fields(out)
    # The human line of a gate that passed or was left undecided: the one that starts with the outcome
    # word its machine line stored (``fabric.gate.<a>_vs_<b>.verdict=``). A file written before gates
    # had machine lines has only the sentence: its words are all there is.
    said = {g.get("outcome") for g in gates} & {PASS, INCONCLUSIVE} if gates else {PASS, INCONCLUSIVE}
    message = next((line for line in out.splitlines() if line.partition(":")[0].partition(" ")[0] in said), "")
    for r in case.result:
        if isinstance(r, (Failure, Error)):
            outcome = FAIL if isinstance(r, Failure) else ERROR
        elif isinstance(r, Skipped):
            # Files older than the INCONCLUSIVE skip wrote an inconclusive gate as a pytest xfail.
            undecided = r.type in ("fabric.inconclusive", "pytest.xfail")
            outcome = INCONCLUSIVE if undecided else SKIPPED
        else:
            continue
        message = r.message or message
    verdict: dict[str, Any] = {"test": f"{case.classname}::{case.name}" if case.classname else case.name,
                               "outcome": outcome, "message": message.splitlines()[0] if message else "",
                               "gates": gates}
    return {**verdict, **case_of_test(case.name or "")}


def _gate_fields(out: str) -> list[dict[str, Any]]:
    """Each gate's ``fabric.gate.<a>_vs_<b>.<name>=`` lines as the saved night's fields."""
    gates: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        match = _GATE_LINE.match(line.strip())
        if not match:
            continue
        gate = gates.setdefault(match["pair"], {"a": match["a"], "b": match["b"]})
        name, value = match["name"], match["value"]
        try:
            gate[name] = (value if name == "verdict" else [int(n) for n in value.split("+")] if name == "launches"
                          else float(value))
        except ValueError:
            gate[name] = value
    for gate in gates.values():
        if "verdict" in gate:
            gate["outcome"] = gate.pop("verdict")
    return list(gates.values())

# --------------------------------------------------------------------------------------------
# Merging: several files of one nightly as one
# --------------------------------------------------------------------------------------------


def merge_junit(paths: Sequence[Path | str], out: Path | str) -> int:
    """Write every testsuite of ``paths`` (each kept whole: its properties, timestamp, host) into
    one ``<testsuites>`` file at ``out``. Returns the number of testcases written.

    The totals on ``<testsuites>`` are the ones junit-10.xsd allows there (tests, failures,
    errors, time): dashboards validate against it. A file that is not JUnit raises
    ``ResultsError`` before anything is written.
    """
    from copy import deepcopy

    from junitparser import JUnitXml

    if not paths:
        raise ValueError("nothing to merge")
    merged = JUnitXml()
    tests = failures = errors = 0
    time = 0.0
    for path in paths:
        for suite in junit_suites(path):
            cases = list(suite)
            tests += len(cases)
            failures += sum(1 for c in cases if c.is_failure)
            errors += sum(1 for c in cases if c.is_error)
            time += sum(c.time or 0.0 for c in cases)
            merged.append(deepcopy(suite))
    merged.name = "pytest-fabric"
    merged.tests, merged.failures, merged.errors, merged.time = tests, failures, errors, round(time, 3)
    with replacing(out) as tmp:
        merged.write(str(tmp))
        redact_file(tmp)
    return tests
