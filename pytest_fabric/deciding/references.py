"""References outside code: a declarative TOML file of gate thresholds and expected values.

A team tunes its gates per model x nodes x fabric without editing Python::

    [[gate]]                      # every model, every node count, eth against ib
    fabric = "eth"
    within = 0.05                 # eth/ib >= 0.95

    [[gate]]
    model = "llama-3.1-70b"
    nodes = [4, 8]
    fabric = "eth"
    ahead = 0.20                  # ib/eth >= 1.20

    [[expect]]                    # ReFrame-style (value, lower, upper), bounds relative to value
    model = "qwen2.5-7b"
    nodes = 8
    fabric = "ib"
    tokens_per_s = [52000.0, -0.10, 0.50]

``model``, ``nodes`` and ``fabric`` default to "*" (any). Where several entries match a case the
most specific wins (most keys given), then the later one. Values are numbers only: nothing in the
file is evaluated.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from ..core.case import Case
from ..core.fabrics import REFERENCE_FABRIC
from .contrasts import ahead_gate, within_gate

GATE_KEYS = {"within", "ahead"}
MATCH_KEYS = {"model", "nodes", "fabric"}
METRICS = {"tokens_per_s", "tokens_per_s_per_gpu", "median_step_s"}
# Keys a suite file could once give that nothing ever checked: refused, saying what to write instead.
REFUSED = {
    ("gate", "reference"): f"every gate compares against the reference fabric '{REFERENCE_FABRIC}', so another "
                           f"reference here would never be used; remove 'reference', and compare against another "
                           f"fabric in a test of your own (fabric_compare.within(candidate, reference))",
    ("expect", "busbw_gbps"): "no suite checks a busbw expectation (suites/test_bandwidth.py judges busbw against "
                              "the link rate: at least 85% of it, and ib 20% ahead); remove 'busbw_gbps', and set "
                              "the link rate with --fabric-rate (emulated) or --fabric-link-gbit (declared)",
}


class ReferenceError(ValueError):
    """The suite file cannot be used; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class Match:
    model: str | None
    nodes: frozenset[int] | None
    fabric: str | None

    def matches(self, case: Case) -> bool:
        return ((self.model is None or self.model == case.model)
                and (self.nodes is None or case.nodes in self.nodes)
                and (self.fabric is None or self.fabric == case.fabric))

    @property
    def specificity(self) -> int:
        return sum(x is not None for x in (self.model, self.nodes, self.fabric))


@dataclass(frozen=True)
class Gate:
    within: float | None = None  # candidate / reference >= 1 - within
    ahead: float | None = None  # reference / candidate >= 1 + ahead


@dataclass(frozen=True)
class Expectation:
    metric: str
    value: float
    lower: float  # relative, <= 0
    upper: float  # relative, >= 0

    def check(self, measured: float) -> str | None:
        low, high = self.value * (1 + self.lower), self.value * (1 + self.upper)
        if low <= measured <= high:
            return None
        return (f"{self.metric} = {measured:.6g} outside the reference {self.value:.6g} "
                f"[{self.lower * 100:+g}%, {self.upper * 100:+g}%] = [{low:.6g}, {high:.6g}]")


@dataclass
class References:
    path: Path | None = None
    gates: list[tuple[Match, Gate]] = field(default_factory=list)
    expectations: list[tuple[Match, list[Expectation]]] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path) -> References:
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ReferenceError(f"suite file {path} does not exist") from None
        except IsADirectoryError:
            raise ReferenceError(f"suite file {path} is a directory; give the path of a TOML file") from None
        except OSError as exc:
            raise ReferenceError(f"suite file {path} cannot be read ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ReferenceError(f"suite file {path} is not valid TOML: {exc}") from None
        unknown = set(data) - {"gate", "expect"}
        if unknown:
            raise ReferenceError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; "
                                 f"use [[gate]] and [[expect]] entries")
        refs = cls(path)
        for i, entry in enumerate(_entries(path, data, "gate")):
            where = f"{path}: [[gate]] #{i + 1}"
            _refuse(where, "gate", entry)
            _no_unknown(where, entry, MATCH_KEYS | GATE_KEYS)
            if not GATE_KEYS & set(entry):
                raise ReferenceError(f"{where}: give 'within = 0.05' (candidate at most 5% slower) "
                                     f"or 'ahead = 0.20' (reference at least 20% faster)")
            gate = Gate(within=_gate_value(where, entry, "within", within_gate),
                        ahead=_gate_value(where, entry, "ahead", ahead_gate))
            refs.gates.append((_match(where, entry), gate))
        for i, entry in enumerate(_entries(path, data, "expect")):
            where = f"{path}: [[expect]] #{i + 1}"
            _refuse(where, "expect", entry)
            _no_unknown(where, entry, MATCH_KEYS | METRICS)
            exps = [_expectation(where, metric, entry[metric]) for metric in sorted(METRICS & set(entry))]
            if not exps:
                raise ReferenceError(f"{where}: give at least one of {', '.join(sorted(METRICS))} "
                                     f"as [value, lower, upper]")
            refs.expectations.append((_match(where, entry), exps))
        return refs

    def gate(self, case: Case) -> Gate | None:
        return _best(self.gates, case)

    def within(self, case: Case, default: float) -> float:
        """The allowed slowdown of ``case`` against its reference (the file's, else ``default``)."""
        gate = self.gate(case)
        return gate.within if gate is not None and gate.within is not None else default

    def ahead(self, case: Case, default: float) -> float:
        """The lead the reference must have over ``case`` (the file's, else ``default``)."""
        gate = self.gate(case)
        return gate.ahead if gate is not None and gate.ahead is not None else default

    def expected(self, case: Case) -> list[Expectation]:
        return _best(self.expectations, case) or []

    def violations(self, case: Case, metrics: dict[str, float]) -> list[str]:
        """Each expected metric of ``case`` that the measured ``metrics`` miss, as a message."""
        out = []
        for exp in self.expected(case):
            if exp.metric in metrics:
                problem = exp.check(metrics[exp.metric])
                if problem:
                    out.append(f"{case.id}: {problem} ({self.path})")
        return out


def _best(entries: list, case: Case):
    found = [(m.specificity, i, value) for i, (m, value) in enumerate(entries) if m.matches(case)]
    return max(found, key=lambda t: (t[0], t[1]))[2] if found else None


def _entries(path: Path, data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise ReferenceError(f"{path}: '{key}' must be a list of tables: write [[{key}]] entries")
    return value


def _refuse(where: str, section: str, entry: dict[str, Any]) -> None:
    for key in sorted(entry):
        if (section, key) in REFUSED:
            raise ReferenceError(f"{where}: '{key}' is not supported: {REFUSED[section, key]}")


def _no_unknown(where: str, entry: dict[str, Any], allowed: set[str]) -> None:
    unknown = set(entry) - allowed
    if unknown:
        raise ReferenceError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; "
                             f"allowed: {', '.join(sorted(allowed))}")


def _text(where: str, entry: dict[str, Any], key: str) -> str | None:
    value = entry.get(key, "*")
    if not isinstance(value, str) or not value:
        raise ReferenceError(f"{where}: '{key}' must be a name or \"*\", got {value!r}")
    return None if value == "*" else value


def _match(where: str, entry: dict[str, Any]) -> Match:
    nodes = entry.get("nodes", "*")
    if nodes == "*":
        node_set = None
    elif isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 1:
        node_set = frozenset([nodes])
    elif isinstance(nodes, list) and nodes and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                   for n in nodes):
        node_set = frozenset(nodes)
    else:
        raise ReferenceError(f"{where}: 'nodes' must be \"*\", a node count or a list of them, got {nodes!r}")
    return Match(_text(where, entry, "model"), node_set, _text(where, entry, "fabric"))


def _gate_value(where: str, entry: dict[str, Any], key: str, rule: Callable[[float], Any]) -> float | None:
    """``entry[key]`` checked by the gate's own rule (``contrasts.within_gate`` / ``ahead_gate``)."""
    if key not in entry:
        return None
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReferenceError(f"{where}: '{key}' must be a fraction such as 0.05, got {value!r}")
    try:
        rule(float(value))
    except ValueError as exc:
        raise ReferenceError(f"{where}: '{key}' = {value!r}: {exc}") from None
    return float(value)


def _expectation(where: str, metric: str, value: Any) -> Expectation:
    ok = (isinstance(value, list) and len(value) == 3
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))
    if not ok or value[0] <= 0 or value[1] > 0 or value[2] < 0:
        raise ReferenceError(f"{where}: '{metric}' must be [value, lower, upper] with value > 0, lower <= 0 "
                             f"and upper >= 0 relative to value (e.g. [52000.0, -0.10, 0.50]), got {value!r}")
    return Expectation(metric, float(value[0]), float(value[1]), float(value[2]))
