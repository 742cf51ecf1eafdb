"""Reading a night back from every form it comes in (``nights.py`` writes them).

``load_results`` reads a file written by ``save_results``, a baseline, a session's store as it is,
or the JUnit XML the plugin wrote (machine lines from the testsuite properties and each testcase's
``system-out``); ``load_records`` the raw launch records of a saved night or a store. Files are JSON
or XML only: a results file is data, and loading a pickle could run code. Whatever cannot be read
raises ``ResultsError`` naming the file and what was expected, never a bare ``KeyError`` from deep
inside.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..core.case import Case
from .night_model import CaseResult, LinkResult, ResultsError, SavedRun
from .nights import BASELINE_FORMAT, FORMAT_VERSION, RESULTS_FORMAT, _runs_from_store, run_from_store

__all__ = ["load_records", "load_results"]


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
