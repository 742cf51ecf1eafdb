"""Where a night's launch time went, as tables: from a saved night (``--fabric-save``).

    python benchmarks/launch_breakdown.py night.json

The night's phases (seconds, share of launch wall), the same per kind of launch (training steps,
collectives, link pairs) and one row per launch; the session's wall and the part outside launches
where the night saved them. Reads what the harness recorded (docs/launch-time.md); estimates nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_fabric.core.case import BANDWIDTH, LINKS
from pytest_fabric.history.launch_time import PHASES, records_launch_time


def _kind(key: str) -> str:
    case = key  # the store's key starts with the case id
    return "links" if case.startswith(LINKS) else "collectives" if case.startswith(BANDWIDTH) else "training"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("night", type=Path, help="a saved night (--fabric-save)")
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.night.read_text())
        records = {**data["records"], **(data.get("link_records") or {})}  # the link test's store too
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{args.night}: not a saved night with launch records ({exc})", file=sys.stderr)
        return 2
    night = records_launch_time(records)
    if night is None:
        print(f"{args.night}: no launch recorded a breakdown (recorded before launches were timed?)", file=sys.stderr)
        return 1
    kinds: dict[str, dict] = {}
    for key, record in records.items():
        kinds.setdefault(_kind(key), {})[key] = record
    by_kind = {kind: records_launch_time(rs) for kind, rs in sorted(kinds.items())}
    by_kind = {k: v for k, v in by_kind.items() if v is not None}
    header = f"{'phase':10} {'night s':>9} {'share':>7}" + "".join(f" {k + ' s':>13}" for k in by_kind)
    print(header)
    for name in PHASES:
        if name in night.phases:
            s = night.phases[name]
            print(f"{name:10} {s:9.1f} {s / night.wall_s:7.1%}"
                  + "".join(f" {v.phases.get(name, 0.0):13.1f}" for v in by_kind.values()))
    print(f"{'launches':10} {night.wall_s:9.1f} {1:7.1%}" + "".join(f" {v.wall_s:13.1f}" for v in by_kind.values()))
    print(f"launches: {night.launches} ({', '.join(f'{k} {v.launches}' for k, v in by_kind.items())}); "
          f"measuring (steps, timed collectives) {night.measured_fraction:.1%} of launch wall")
    saved = data.get("launch_time") or {}
    if "session_s" in saved:
        print(f"session: {saved['session_s']:.1f} s wall, {saved['outside_launches_s']:.1f} s of it outside launches "
              f"(pytest's start, collection, node check, gates, reports); launches + outside = "
              f"{night.wall_s + saved['outside_launches_s']:.1f} s")
    waited = sum(m["launch_started"] - m["machine_asked"] for r in records.values() if isinstance(r, dict)
                 and isinstance(m := (r.get("result") or {}).get("launch_marks") or {}, dict) and "machine_asked" in m)
    print(f"waited for this machine while another session's launch held it: {waited:.1f} s (part of outside launches)")
    print()
    print(f"{'launch':60} " + " ".join(f"{p[:8]:>8}" for p in PHASES))
    for key, record in records.items():
        phases = (record.get("result") or {}).get("launch_time") if isinstance(record, dict) else None
        if phases:
            print(f"{key[:60]:60} " + " ".join(f"{phases[p]:8.2f}" if p in phases else f"{'':8}" for p in PHASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
