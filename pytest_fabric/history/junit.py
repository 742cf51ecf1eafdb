"""The JUnit format of pytest-fabric: what a measured testcase writes, how the file is completed
after pytest's junitxml wrote it, and how files are merged (``junit_read`` reads one back).

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
from ..core.fabrics import REFERENCE_FABRIC
from ..deciding.gates import GateOutcome, machine_fields
from ..physics.hostbound import (configuration_mfu, link_bytes_per_step, mfu_peak, model_bytes_per_step,
                                 peak_memory_gib)
from ..core.models import MFU_CONVENTION
from ..measuring.measurement import BandwidthMeasurement, LaunchRecord, Measurement, configuration_tokens_per_s
from ..core.redact import redact_file
from .junit_read import junit_suites
from .nights import configuration_stragglers
from .launch_time import launch_line, night_launch_time
from ..deciding.verdicts import INCONCLUSIVE_PREFIX, verdict_line
from ..workload.result import TrainResult

SECTION = "pytest-fabric measurements"


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
            # The layout, and what its node's fabric link carried per step against the traffic model.
            f"{p}.sharding": r.sharding,
            f"{p}.grad_accum": str(r.grad_accum),
            f"{p}.reduce_dtype": r.reduce_dtype,
            f"{p}.link_bytes_per_step": "n/a" if (b := link_bytes_per_step(ms)) is None else f"{b:.0f}",
            f"{p}.model_bytes_per_step": "n/a" if (b := model_bytes_per_step(ms)) is None else f"{b:.0f}",
            # Ranks whose own work stays above the others' (deciding/stragglers.py); CPU runs only so far:
            # a GPU rank's CPU time is not its compute.
            f"{p}.stragglers": straggler_text(ms),
        }
    out[f"{p}.fabric_settings"] = json.dumps(r.fabric, sort_keys=True)
    out[f"{p}.versions"] = ", ".join(f"{k} {v}" for k, v in r.versions.items() if v)
    return out


def straggler_text(launches: Sequence[Measurement]) -> str:
    """The configuration's stragglers, "none", or "n/a" where not judged (``configuration_stragglers``)."""
    found = configuration_stragglers(launches)
    return "n/a" if found is None else "; ".join(found) or "none"


def gate_lines(outcome: GateOutcome) -> dict[str, str]:
    """Machine lines of one gate: verdict, ratio, interval, threshold, launches."""
    p = f"fabric.gate.{outcome.a_name}_vs_{outcome.b_name}"
    return {f"{p}.{name}": value for name, value in machine_fields(outcome.record()).items()}


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
                    lines.extend(launch_time_lines(group))
                    continue
            lines.append(first.summary())
            lines.extend(launch_time_lines(group))
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


def launch_time_lines(launches: Sequence[Measurement | BandwidthMeasurement]) -> list[str]:
    """Where the configuration's launch time went (history/launch_time.py): one launch's phases, or
    several launches' summed; none where no launch was timed. A gate's test leaves them out for its
    output's length: the suite properties carry the night's."""
    night = night_launch_time(LaunchRecord(m.case, result=m.result) for m in launches)
    if night is None:
        return []
    phases = launch_line(night.phases)
    if night.launches > 1:
        phases = phases.replace("launch ", f"{night.launches} launches ", 1)
    fraction = f"; measuring {night.measured_fraction:.0%}" if "measured" in night.phases else ""
    return [f"{launches[0].case.id}: {phases}{fraction}"]


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
