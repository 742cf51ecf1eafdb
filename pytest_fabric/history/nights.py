"""Nights kept past the session: a night saved to JSON and read back from every form it comes in.

A session's store (``measurements.json`` in its directory) is a cache keyed by launch; it dies with
the session. What is worth keeping is smaller and stable: per configuration, one tokens/s value
per launch, and the step's figures (MFU at the configuration's value, under ``models.MFU_CONVENTION``,
and the largest per-rank peak memory); per link, the bus bandwidth of each collective at its largest payload; the verdicts
(each test's outcome word, ``verdicts.OUTCOMES``, its one-line message, and per gate its fields:
ratio, ci_low, ci_high, threshold, outcome, both sides' values, launches); and the identity
of what ran (cluster, hosts, device, versions), because a comparison between two
nights is only as good as the sameness of the two set-ups.

Reading them back is ``night_files.py``'s (``load_results``, ``load_records``).
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
    "parse_case_id",
    "run_from_store",
    "save_results",
    "session_night",
    "verdict_case",
]

RESULTS_FORMAT = "pytest-fabric-results"
BASELINE_FORMAT = "pytest-fabric-baseline"
FORMAT_VERSION = 1
# A case's optional step figures in a saved night, each absent where unknown (a CPU run's MFU) and in
# files written before they were saved.
STEP_FIGURES = ("mfu", "mfu_peak", "peak_memory_gib")

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
                        **{k: v for k in STEP_FIGURES if (v := getattr(c, k)) is not None}}
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
