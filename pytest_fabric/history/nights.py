"""Nights kept past the session: a night saved to JSON and read back from every form it comes in.

A session's store (``measurements.json`` in its directory) is a cache keyed by launch; it dies with
the session. What is worth keeping is smaller and stable: per configuration, one tokens/s value
per launch, and the step's figures (MFU at the configuration's value, under ``models.MFU_CONVENTION``,
and the largest per-rank peak memory); per link, the bus bandwidth of each collective at its largest payload; the verdicts
(each test's outcome word, ``verdicts.OUTCOMES``, its one-line message, and per gate its fields:
ratio, ci_low, ci_high, threshold, outcome, both sides' values, launches); and the identity
of what ran (cluster, hosts, device, versions), because a comparison between two
nights is only as good as the sameness of the two set-ups.

``load_results`` reads every form a night can come in: a file written by ``save_results``, a
baseline, a session's store as it is, or the JUnit XML the plugin wrote (machine lines from the
testsuite properties and each testcase's ``system-out``). Files are JSON or XML only: a results file is data, and loading a
pickle could run code. Whatever cannot be read raises ``ResultsError`` naming the file and what
was expected, never a bare ``KeyError`` from deep inside.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..core.version import VERSION
from ..core.atomic import write_text
from ..core.case import BANDWIDTH, Case
from ..physics.hostbound import configuration_mfu, mfu_peak, peak_memory_gib
from ..measuring.measurement import (BandwidthMeasurement, LaunchRecord, Measurement, launch_number,
                                     configuration_tokens_per_s)
from .night_model import CaseResult, LinkResult, ResultsError, SavedRun, parse_case_id, verdict_case
from ..core.redact import redact_data
from ..workload.result import TrainResult
from ..deciding.stragglers import gpu_lines, straggler_lines, stragglers
from ..core.units import mbit_to_gbit

from .setups import identity_from_records

__all__ = [
    "BASELINE_FORMAT",
    "RESULTS_FORMAT",
    "load_records",
    "load_results",
    "parse_case_id",
    "run_from_store",
    "save_results",
    "session_night",
    "verdict_case",
]

RESULTS_FORMAT = "pytest-fabric-results"
BASELINE_FORMAT = "pytest-fabric-baseline"
FORMAT_VERSION = 1

# --------------------------------------------------------------------------------------------
# From a session's store
# --------------------------------------------------------------------------------------------


def launch_records(records: Mapping[str, Any], where: str = "session store") -> dict[str, LaunchRecord]:
    """A store's JSON records (key -> ``{"case", "cluster", "result"}`` or ``{"case", "error"}``) as
    typed ``LaunchRecord``s, in the store's order: each result decoded once, here. ``ResultsError``
    names the first record that is not one."""
    out: dict[str, LaunchRecord] = {}
    for key, record in records.items():
        if isinstance(record, LaunchRecord):
            out[key] = record
            continue
        if not isinstance(record, dict) or not isinstance(record.get("case"), dict):
            raise ResultsError(f"{where}: record {key!r} has no \"case\" object; expected a pytest-fabric "
                               "session store (key -> {\"case\", \"result\" or \"error\"})")
        training = record["case"].get("model") != BANDWIDTH and "error" not in record
        try:
            case = Case(**record["case"])
            if training and not isinstance(case.nodes, int):
                raise ValueError(f"case.nodes must be an integer, got {record['case']['nodes']!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ResultsError(_malformed(where, key, exc, _ANY_RESULT)) from None
        try:
            out[key] = LaunchRecord.from_dict(record)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise ResultsError(_malformed(where, key, exc, _TRAINING if training else _ANY_RESULT)) from None
    return out


_ANY_RESULT = ("a training result (step_s, tokens_per_step, world_size) or collective rows "
               "(op, bytes, busbw_GBps)")
_TRAINING = "result.step_s, tokens_per_step and world_size"


def _malformed(where: str, key: str, exc: Exception, expected: str) -> str:
    return f"{where}: record {key!r} is malformed ({type(exc).__name__}: {exc}); expected {expected}"


def session_measurements(launches: Mapping[str, LaunchRecord], fabrics: Sequence[str]
                         ) -> tuple[list[Measurement], list[BandwidthMeasurement]]:
    """Every training launch as a ``Measurement``, in the store's order (a one-node launch listed
    under each of ``fabrics``: ``Case.serves``), and every bandwidth launch; failed launches left out."""
    measured: list[Measurement] = []
    bandwidth: list[BandwidthMeasurement] = []
    for record in launches.values():
        if record.failed:
            continue
        if record.bandwidth:
            bandwidth.append(BandwidthMeasurement.from_record(record))
            continue
        measured.extend(Measurement.from_record(case, record) for case in record.case.serves(list(fabrics)))
    return measured, bandwidth


def _error_line(key: str, record: LaunchRecord) -> str:
    """A failed launch in one line: its error's first line."""
    return record.error.splitlines()[0] if record.error else f"{key}: failed"


def _runs_from_store(records: Mapping[str, Any], fabrics: Sequence[str] | None,
                     where: str) -> tuple[dict[str, CaseResult], dict[str, LinkResult], list[str]]:
    """Per case, one value per launch (in launch order); per link, busbw; the failed launches.

    A single-node launch never touches the fabric and serves every fabric of the session, so it is
    listed under each of them (``fabrics``; by default every fabric the store mentions).
    """
    errors: list[str] = []
    training: list[tuple[int, str, LaunchRecord]] = []
    links: dict[str, LinkResult] = {}
    for key, record in sorted(launch_records(records, where).items()):
        if record.failed:
            errors.append(_error_line(key, record))
        elif record.bandwidth:
            m = BandwidthMeasurement.from_record(record)
            ops = m.result.ops()
            mbit = m.result.fabric.get("emulated_mbit")
            links[m.case.id] = LinkResult(
                m.case.nodes, m.case.fabric, {op: m.busbw_gbit(op) for op in ops},
                int(m.largest(ops[0]).bytes) if ops else 0,
                mbit_to_gbit(mbit) if mbit and record.cluster == "emulated" else None)
        else:
            training.append((launch_number(key), key, record))
    every_fabric = list(fabrics) if fabrics else sorted({rec.case.fabric for _, _, rec in training})
    launches: dict[str, list[Measurement]] = {}
    for _, key, record in sorted(training, key=lambda t: (t[0], t[1])):
        for case in record.case.serves(every_fabric):
            launches.setdefault(case.id, []).append(Measurement.from_record(case, record))
    return {cid: case_result(ms) for cid, ms in launches.items()}, links, errors


def case_result(launches: Sequence[Measurement]) -> CaseResult:
    """A configuration's launches as the night keeps them: every launch with its weight, so that its
    value is the one its gates judged, and the step's figures as the terminal and JUnit show them."""
    first = launches[0]
    return CaseResult(first.case.model, first.case.nodes, first.case.fabric, first.gpus,
                      [m.tokens_per_s for m in launches], [m.tokens_per_s_per_gpu for m in launches],
                      [m.counted for m in launches] if not all(m.counted for m in launches) else None,
                      configuration_mfu(launches, configuration_tokens_per_s(launches)), mfu_peak(launches),
                      peak_memory_gib(launches), first.case.sharding, configuration_stragglers(launches))


def configuration_stragglers(launches: Sequence[Measurement]) -> list[str] | None:
    """The configuration's stragglers over the measured steps of its launches, judged together where
    their ranks ran on the same nodes (``deciding/stragglers.py``): on CPU each rank's own work, on
    GPUs what NVML recorded (slowed-down steps per node, a GPU's low clock). None where nothing was
    recorded to judge (a GPU run without pynvml, a result from before)."""
    results = [m.result for m in launches]
    if all(r.device == "cpu" and r.signals.rank_cpu_s for r in results):
        def judge(rs: list[TrainResult]) -> list[str]:
            hosts = rs[0].rank_hosts
            return straggler_lines(stragglers([row for r in rs for row in r.signals.rank_cpu_s],
                                              rs[0].local_world_size, hosts), {h: hosts.count(h) for h in hosts})
    elif all(r.device != "cpu" and r.signals.rank_sm_clock_mhz for r in results):
        def judge(rs: list[TrainResult]) -> list[str]:
            return gpu_lines([row for r in rs for row in r.signals.rank_sm_clock_mhz],
                             [row for r in rs for row in r.signals.rank_throttle_mask], rs[0].rank_hosts,
                             rs[0].local_world_size, rs[-1].rank_gpu_health)
    else:
        return None
    by_hosts: dict[tuple[str, ...], list[TrainResult]] = {}
    for r in results:
        by_hosts.setdefault(tuple(r.rank_hosts), []).append(r)
    lines: list[str] = []
    for group in by_hosts.values():
        lines += [line for line in judge(group) if line not in lines]
    return lines


# --------------------------------------------------------------------------------------------
# Saving and loading
# --------------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _write_json_atomically(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, secrets masked (``redact``); a reader never sees half a file."""
    write_text(path, json.dumps(redact_data(data), indent=1, sort_keys=True) + "\n")


def run_from_store(records: Mapping[str, Any], fabrics: Sequence[str] | None = None,
                   where: str = "session store", launches: Mapping[str, LaunchRecord] | None = None) -> SavedRun:
    """A session's store records as a ``SavedRun`` (one-node launches listed under each of ``fabrics``);
    ``launches``: the records already decoded (``launch_records``)."""
    cases, links, errors = _runs_from_store(records if launches is None else launches, fabrics, where)
    identity = identity_from_records(records)
    if fabrics:
        identity["fabrics"] = list(fabrics)
    return SavedRun(identity, cases, links, [], errors, None, "store")


@dataclass
class SessionNight:
    """A session's store read once, at its end, and every form its outputs take from it: the raw
    records (saved under ``"records"``), the typed ``LaunchRecord``s, each case's ``Measurement``s
    and the bandwidth measurements in the store's order (the terminal's tables, the JUnit suite
    properties), and the one ``SavedRun`` (dashboards, cost lines, ``--fabric-save``)."""

    records: dict[str, Any]
    launches: dict[str, LaunchRecord]
    measured: list[Measurement]
    bandwidth: list[BandwidthMeasurement]
    run: SavedRun

    @property
    def errors(self) -> list[str]:
        """Each failed launch in one line, in the store's order."""
        return [_error_line(key, r) for key, r in self.launches.items() if r.failed]


def session_night(records: Mapping[str, Any], fabrics: Sequence[str]) -> SessionNight:
    """The one builder of a session's night from its store's records (``ResultStore.all``): each
    record decoded once; an empty store is an empty night."""
    launches = launch_records(records)
    measured, bandwidth = session_measurements(launches, fabrics)
    run = run_from_store(records, fabrics, launches=launches) if records else SavedRun({})
    return SessionNight(dict(records), launches, measured, bandwidth, run)


def save_results(path: Path | str, store_records: Mapping[str, Any], identity: Mapping[str, Any],
                 verdicts: Sequence[Mapping[str, Any]] = (), prices: Mapping[str, float] | None = None,
                 run: SavedRun | None = None, extra: Mapping[str, Any] | None = None) -> None:
    """Write one night: per-case launch values, bandwidth, verdicts and the identity, as JSON.

    ``prices`` (USD per GPU-hour by fabric) go along, so that a report prices the night by default.

    ``identity`` is what the caller knows (see ``identity_from_records`` for what the records add:
    the caller's values win). The raw store records go along too: the step times and NCCL settings
    behind each number are what one reads when a night looks wrong. Written atomically: a reader
    never sees half a file. ``run``: the night already built from ``store_records`` with the same
    fabrics (``session_night``), whose cases, links and errors are written as they are. ``extra``:
    more top-level keys (the night's ``launch_time``, history/launch_time.py).
    """
    full = {**identity_from_records(store_records), "created": _now(), "pytest_fabric": VERSION,
            "harness_host": platform.node()}
    full.update({k: v for k, v in identity.items() if v is not None})
    if run is None:
        cases, links, errors = _runs_from_store(store_records, full.get("fabrics"), str(path))
    else:
        cases, links, errors = run.cases, run.bandwidth, run.errors
    _write_json_atomically(Path(path), {
        "format": RESULTS_FORMAT,
        "version": FORMAT_VERSION,
        "identity": full,
        "cases": {cid: {"model": c.model, "nodes": c.nodes, "fabric": c.fabric, "gpus": c.gpus,
                        "tokens_per_s": c.tokens_per_s, "tokens_per_s_per_gpu": c.tokens_per_s_per_gpu,
                        **({"counted": c.counted} if c.counted else {}),
                        **({"sharding": c.sharding} if c.sharding != "full" else {}),
                        **({"stragglers": c.stragglers} if c.stragglers is not None else {}),
                        # absent where unknown: a CPU run has no MFU
                        **{k: v for k in _STEP_FIGURES if (v := getattr(c, k)) is not None}}
                  for cid, c in sorted(cases.items())},
        "bandwidth": {lid: {"nodes": b.nodes, "fabric": b.fabric, "busbw_gbit": b.busbw_gbit,
                            "payload_bytes": b.payload_bytes, "link_gbit": b.link_gbit}
                      for lid, b in sorted(links.items())},
        "verdicts": [dict(v) for v in verdicts],
        "errors": errors,
        "prices": {f: float(p) for f, p in sorted((prices or {}).items())},
        "records": dict(store_records),
        **(extra or {}),
    })


def load_results(path: Path | str) -> SavedRun:
    """A night from any of: ``save_results`` JSON, a baseline, a session store, or JUnit XML."""
    path = Path(path)
    text = _read_text(path)
    head = text.lstrip()
    if head.startswith("<"):
        from .junit_read import load_junit

        return load_junit(path)
    if head.startswith(("{", "[")):
        return _from_json(_parse_json(text, path), path)
    raise ResultsError(f"{path}: neither JSON nor XML; expected a pytest-fabric results file (.json, "
                       "written by --fabric-save or pytest-fabric baseline), a session's measurements.json, "
                       "or a JUnit XML file written by pytest --junitxml")


def load_records(path: Path | str, links: bool = False) -> dict[str, Any]:
    """The raw launch records (step times and what ran) of a ``save_results`` file or a session's
    store; ResultsError for anything else (JUnit and baselines keep only tokens/s). ``links``: a
    saved night's link-test launches too (``link_records``: their own store's)."""
    path = Path(path)
    text = _read_text(path)
    data = None if text.lstrip().startswith("<") else _parse_json(text, path)
    if isinstance(data, dict) and data.get("format") == RESULTS_FORMAT:
        _check_version(data, path)
        extra = data.get("link_records") if links and isinstance(data.get("link_records"), dict) else {}
        data = data.get("records")
        if isinstance(data, dict) and extra:
            data = {**data, **extra}
    elif isinstance(data, dict) and "format" not in data and data:
        _runs_from_store(data, None, str(path))  # validates every record
    else:
        data = None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: holds no launch records; expected a results file written by --fabric-save "
                           "or a session's measurements.json (JUnit XML and baselines keep only tokens/s)")
    return data


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _decode(raw, path)


def _decode(raw: bytes, path: Path) -> str:
    if raw[:1] == b"\x80":  # every pickle protocol >= 2 starts with PROTO (0x80)
        raise ResultsError(f"{path}: this looks like a Python pickle; pytest-fabric reads only JSON and JUnit "
                           "XML (loading a pickle can run arbitrary code)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ResultsError(f"{path}: not UTF-8 text; expected a JSON results file or JUnit XML") from None


def _parse_json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"{path}: invalid JSON ({exc}); the file may be truncated") from None


def _from_json(data: Any, path: Path) -> SavedRun:
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: the JSON is a {type(data).__name__}, expected an object with "
                           f"\"format\": \"{RESULTS_FORMAT}\" (or a session's measurements.json)")
    fmt = data.get("format")
    if fmt == RESULTS_FORMAT:
        _check_version(data, path)
        return _run_from_saved(data, path)
    if fmt == BASELINE_FORMAT:
        return _run_from_baseline(_validated_baseline(data, path), path)
    if fmt is not None:
        raise ResultsError(f"{path}: unknown format marker {fmt!r}; expected {RESULTS_FORMAT!r} or {BASELINE_FORMAT!r}")
    if not data:
        raise ResultsError(f"{path}: an empty JSON object holds no measurements; expected a pytest-fabric "
                           "results file or a session's measurements.json")
    # No marker: a session's store as the plugin leaves it.
    run = run_from_store(data, None, str(path))
    run.source = path
    return run


def _check_version(data: Mapping[str, Any], path: Path) -> None:
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ResultsError(f"{path}: \"version\" must be an integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ResultsError(f"{path}: written by a newer pytest-fabric (format version {version}; this one reads "
                           f"up to {FORMAT_VERSION}); upgrade pytest-fabric to read it")


def _field(obj: Any, name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or name not in obj:
        raise ResultsError(f"{where}: missing \"{name}\"")
    value = obj[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        expected = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ResultsError(f"{where}: \"{name}\" must be {expected}, got {type(value).__name__}")
    return value


def _flags(obj: Any, name: str, n: int, where: str) -> list[bool]:
    values = _field(obj, name, list, where)
    if len(values) != n or not all(isinstance(v, bool) for v in values):
        raise ResultsError(f"{where}: \"{name}\" must be a list of true/false, one per launch")
    return values


def _numbers(obj: Any, name: str, where: str) -> list[float]:
    values = _field(obj, name, list, where)
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        raise ResultsError(f"{where}: \"{name}\" must be a non-empty list of positive numbers")
    return [float(v) for v in values]


# A case's optional step figures in a saved night, each absent where unknown (a CPU run's MFU) and in
# files written before they were saved.
_STEP_FIGURES = ("mfu", "mfu_peak", "peak_memory_gib")


def _optional(obj: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``obj[name]`` checked as ``_field`` does; None where absent or null. A number must be >= 0."""
    if obj.get(name) is None:
        return None
    value = _field(obj, name, kind, where)
    if isinstance(value, (int, float)):
        if not value >= 0:
            raise ResultsError(f"{where}: \"{name}\" must be a number >= 0, got {value}")
        return float(value)
    return value


def _strings(obj: dict[str, Any], name: str, where: str) -> list[str] | None:
    """A list of strings at ``name``; None where absent."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ResultsError(f"{where}: \"{name}\" must be a list of strings, got {value!r}")
    return value


def _run_from_saved(data: dict[str, Any], path: Path) -> SavedRun:
    identity = _field(data, "identity", dict, str(path))
    cases = {}
    for cid, c in _field(data, "cases", dict, str(path)).items():
        where = f"{path}: case {cid!r}"
        cases[cid] = CaseResult(_field(c, "model", str, where), _field(c, "nodes", int, where),
                                _field(c, "fabric", str, where), _field(c, "gpus", int, where),
                                _numbers(c, "tokens_per_s", where), _numbers(c, "tokens_per_s_per_gpu", where),
                                _flags(c, "counted", len(c.get("tokens_per_s") or []), where) if "counted" in c else None,
                                _optional(c, "mfu", (int, float), where), _optional(c, "mfu_peak", str, where),
                                _optional(c, "peak_memory_gib", (int, float), where),
                                str(c.get("sharding") or "full"), _strings(c, "stragglers", where))
    links = {}
    for lid, b in _field(data, "bandwidth", dict, str(path)).items():
        where = f"{path}: bandwidth {lid!r}"
        busbw = _field(b, "busbw_gbit", dict, where)
        if not all(isinstance(v, (int, float)) for v in busbw.values()):
            raise ResultsError(f"{where}: \"busbw_gbit\" must map collective names to numbers")
        link = b.get("link_gbit")
        links[lid] = LinkResult(_field(b, "nodes", int, where), _field(b, "fabric", str, where),
                                {k: float(v) for k, v in busbw.items()}, _field(b, "payload_bytes", int, where),
                                float(link) if isinstance(link, (int, float)) else None)
    verdicts = _field(data, "verdicts", list, str(path))
    if not all(isinstance(v, dict) for v in verdicts):
        raise ResultsError(f"{path}: \"verdicts\" must be a list of objects")
    errors = [str(e) for e in data.get("errors") or []]
    prices = data.get("prices") or {}  # absent in files written before prices were saved
    if not isinstance(prices, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in prices.values()):
        raise ResultsError(f"{path}: \"prices\" must map fabric names to positive USD per GPU-hour")
    return SavedRun(identity, cases, links, verdicts, errors, path, "results",
                    {str(f): float(v) for f, v in prices.items()})


# Reading a baseline file as a night (``load_results``); building and judging baselines is
# ``baselines.py``.


def _validated_baseline(data: dict[str, Any], path: Path) -> dict[str, Any]:
    _check_version(data, path)
    for cid, c in _field(data, "cases", dict, str(path)).items():
        where = f"{path}: baseline case {cid!r}"
        for name, kind in (("model", str), ("fabric", str), ("nodes", int), ("gpus", int),
                           ("center", (int, float)), ("spread", (int, float)), ("nights", list)):
            _field(c, name, kind, where)
        if not c["center"] > 0:
            raise ResultsError(f"{where}: \"center\" must be positive, got {c['center']}")
        for night in c["nights"]:
            _field(night, "tokens_per_s", (int, float), f"{where}, a night")
    identities = data.get("identities", [])
    if not isinstance(identities, list) or not all(isinstance(i, dict) for i in identities):
        raise ResultsError(f"{path}: \"identities\" must be a list of objects")
    costs = data.get("launch_costs", {})
    if not isinstance(costs, dict) or not all(
            isinstance(t, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in t)
            for t in costs.values()):
        raise ResultsError(f"{path}: \"launch_costs\" must map configurations to launch wall times (seconds > 0)")
    return data


def _run_from_baseline(data: dict[str, Any], path: Path) -> SavedRun:
    identities = data.get("identities") or [{}]
    identity = {**identities[-1], "baseline_nights": len(identities)}
    if data.get("created"):
        identity["created"] = data["created"]
    cases = {cid: CaseResult(c["model"], c["nodes"], c["fabric"], c["gpus"], [float(c["center"])],
                             [float(c["center"]) / c["gpus"]], sharding=Case.parse(cid).sharding)
             for cid, c in data["cases"].items()}
    return SavedRun(identity, cases, source=path, kind="baseline")
