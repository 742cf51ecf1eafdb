"""The flight recorder's dumps of a launch, one line per set of ranks that stopped at the same place.

torch's flight recorder keeps each process group's last collectives per rank (workload/hangs.py
turns it on and says where the dumps go): ``flight/nccl_trace_rank_<N>`` is NCCL's watchdog dump on
a collective timeout (pickle), ``flight/rank<N>.json`` the rank's own (JSON), written when it dies of
an exception or is asked for its stacks. Both hold ``entries`` (``collective_seq_id``,
``profiling_name`` such as ``nccl:all_gather``, ``input_sizes``, ``output_sizes``, ``state``:
scheduled, started, completed) and ``pg_status`` per group (last enqueued, started, completed).

On gloo (torch 2.13) every entry stays ``scheduled`` and nothing is dumped on a timeout: the
summary then gives each rank's last recorded collective, and the rank whose sequence number is
behind the others' is the one that never entered it.

    flight recorder (2 ranks; <run dir>/flight):
      rank 1: last recorded #3 gloo:all_reduce [256] -> [256] (scheduled)
      rank 0: last recorded #4 gloo:all_gather [256] -> [2, 256] (scheduled)
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .stacks import ranges

FLIGHT_DIR = "flight"
_NCCL_DUMP = re.compile(r"^nccl_trace_rank_(\d+)$")
_OWN_DUMP = re.compile(r"^rank(\d+)\.json$")
# Bytes of one dump read at most (a 2000-entry buffer with stacks is a few MB).
MAX_DUMP_BYTES = 64 << 20


class _DataOnly(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): a dump names no class to build."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight recorder dump names no class ({module}.{name})")


@dataclass(frozen=True)
class RankFlight:
    rank: int
    source: str  # the file it came from
    last: dict[str, Any] | None  # the last entry recorded (any state)
    last_completed: dict[str, Any] | None  # the last entry completed (None on gloo: none ever is)

    def key(self) -> tuple:
        return (_describe(self.last), _describe(self.last_completed))


def load(path: Path) -> dict[str, Any]:
    """One dump, JSON or pickle; ValueError where it is neither or holds no entries."""
    data = path.read_bytes()[:MAX_DUMP_BYTES]
    try:
        loaded = json.loads(data)
    except ValueError:
        try:
            loaded = _DataOnly(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - any damage: a truncated or foreign file
            raise ValueError(f"{path.name}: neither JSON nor a flight recorder pickle ({exc})") from None
    if not isinstance(loaded, dict) or not isinstance(loaded.get("entries", []), list):
        raise ValueError(f"{path.name}: not a flight recorder dump (no entries)")
    return loaded


def summarize(rank: int, dump: dict[str, Any], source: str) -> RankFlight:
    entries = [e for e in dump.get("entries", []) if isinstance(e, dict)]
    entries.sort(key=lambda e: (e.get("time_created_ns") or 0, e.get("record_id") or 0))
    collectives = [e for e in entries if not e.get("is_p2p")] or entries
    completed = [e for e in collectives if e.get("state") == "completed"]
    return RankFlight(rank, source, collectives[-1] if collectives else None, completed[-1] if completed else None)


def _sizes(sizes: Any) -> str:
    if not isinstance(sizes, list):
        return "?"
    return ", ".join("[" + ", ".join(map(str, s)) + "]" if isinstance(s, list) else str(s) for s in sizes) or "[]"


def _describe(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "none"
    group = entry.get("process_group")
    name = group[1] if isinstance(group, list) and len(group) > 1 and group[1] not in ("", "default_pg") else ""
    return (f"#{entry.get('collective_seq_id', '?')} {entry.get('profiling_name', '?')} "
            f"{_sizes(entry.get('input_sizes'))} -> {_sizes(entry.get('output_sizes'))} ({entry.get('state', '?')})"
            + (f" in group {name}" if name else ""))


def read(run_dir: Path) -> tuple[list[RankFlight], list[str]]:
    """Every rank's dump under ``run_dir/flight`` (NCCL's own where both exist), and the files
    that could not be read, each with why."""
    found: dict[int, RankFlight] = {}
    problems: list[str] = []
    directory = run_dir / FLIGHT_DIR
    paths = sorted(directory.iterdir()) if directory.is_dir() else []
    # Ours first, so that NCCL's (the watchdog's, at the timeout itself) replaces it.
    for pattern in (_OWN_DUMP, _NCCL_DUMP):
        for path in paths:
            match = pattern.match(path.name)
            if not match:
                continue
            try:
                found[int(match.group(1))] = summarize(int(match.group(1)), load(path), path.name)
            except (OSError, ValueError) as exc:
                problems.append(str(exc))
    return [found[r] for r in sorted(found)], problems


def report(run_dir: Path) -> list[str]:
    """The launch's flight recorder, ranks grouped by where their records stop; [] without dumps."""
    flights, problems = read(run_dir)
    if not flights and not problems:
        return []
    groups: dict[tuple, list[RankFlight]] = {}
    for flight in flights:
        groups.setdefault(flight.key(), []).append(flight)
    lines = [f"flight recorder ({len(flights)} ranks; {run_dir / FLIGHT_DIR}):"]
    for members in sorted(groups.values(), key=lambda m: (len(m), m[0].rank)):
        first = members[0]
        ranks = [m.rank for m in members]
        done = f"; last completed {_describe(first.last_completed)}" if first.last_completed else ""
        lines.append(f"  rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)}: last recorded "
                     f"{_describe(first.last)}{done}")
    lines += [f"  unreadable: {problem}" for problem in problems]
    return lines
