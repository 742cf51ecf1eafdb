#!/usr/bin/env python
"""Re-judge a saved night's launches by the current rule for a phase of the machine.

    python benchmarks/rejudge_phases.py NIGHT.json [NIGHT.json ...]
    python benchmarks/rejudge_phases.py NIGHT.json --replay DIR --baseline BASELINE.json [--only stall]

A launch run in another phase of the machine than its configuration usually runs in is
down-weighted (README, "How verdicts are decided", rules 2 and 3). The rule is applied when a
launch lands (``Measurer._judge_speed`` records its configuration's usual probe with the result),
so a night saved under an older rule keeps that rule's flags. This replays the measurer's
judgement over the night's records in the order they were launched (their ``started`` times; the
store's order where a record has none) and prints every launch that either rule down-weights, and
the counts. It launches nothing.

``--replay DIR`` (a night of ``nightly_gates.py``): the nightly gates' own pytest command then
judges the night's launches twice through ``replay_plugin`` (every gate's own code, nothing
launched), as saved and as re-judged, and prints both verdicts of each gate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_fabric.measuring.measurement import LaunchKey, LaunchRecord, Measurement  # noqa: E402
from pytest_fabric.workload.signals import launch_probe, usual_probe  # noqa: E402


def rejudged(records: dict[str, dict]) -> dict[str, dict]:
    """A copy of the records with each training launch's usual probe set as ``Measurer._judge_speed``
    sets it: from its configuration's launches so far, in launch order (their ``started`` times; the
    store's order where a record has none)."""
    out = json.loads(json.dumps(records))
    speeds: dict[str, list[float]] = {}
    order = sorted(enumerate(out.items()), key=lambda item: (float(item[1][1].get("started") or 0.0), item[0]))
    for _, (key, stored) in order:
        signals = (stored.get("result") or {}).get("signals")
        if not isinstance(signals, dict):
            continue
        speed = launch_probe(signals.get("probe_s") or [], signals.get("cpu_busy") or [])
        if speed:
            seen = speeds.setdefault(LaunchKey.parse(key).base, [])
            seen.append(speed)
            signals["probe_usual_s"] = usual_probe(seen)
    return out


def rejudge(records: dict[str, dict]) -> list[tuple[str, str, str]]:
    """Per training launch, in launch order: (store key, why the saved judgement down-weights it,
    why the current rule does); "" where it counts fully."""
    again = rejudged(records)
    order = sorted(enumerate(records), key=lambda item: (float(records[item[1]].get("started") or 0.0), item[0]))
    rows = []
    for _, key in order:
        try:
            saved, now = LaunchRecord.from_dict(records[key]), LaunchRecord.from_dict(again[key])
        except (KeyError, TypeError, ValueError):
            continue
        if saved.failed or saved.bandwidth:
            continue
        rows.append((key, Measurement.from_record(saved.case, saved).down_weighted,
                     Measurement.from_record(now.case, now).down_weighted))
    return rows


def replay(records: dict[str, dict], out: Path, baseline: Path, select: str) -> list[dict]:
    """The nightly gates' verdicts on ``records`` (``replay_plugin``: judged, nothing launched)."""
    import os
    import subprocess

    from nightly_gates import FABRICS, NIGHTLY, PLANTS, REPO, gates_of

    out.mkdir(parents=True, exist_ok=True)
    (out / "measurements.json").write_text(json.dumps(records))
    junit = out / "junit.xml"
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "FABRIC_REPLAY_DIR": str(out), "PYTEST_FABRIC_FAULT": PLANTS,
           "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH", "")]))}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "replay_plugin", "-q", "-rA",
           "--nodes", "2", f"--junitxml={junit}", *NIGHTLY, "-k", select, *FABRICS, f"--fabric-baseline={baseline}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    (out / "log.txt").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if not junit.exists() or "ReplayMissing" in proc.stdout:
        raise SystemExit(f"the replay did not judge the night (exit {proc.returncode}): see {out / 'log.txt'}")
    return gates_of(junit, "nightly")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nights", nargs="+", help="saved nights (--fabric-save) or session stores")
    parser.add_argument("--replay", metavar="DIR", help="judge the gates of a nightly_gates.py night twice, as "
                                                        "saved and re-judged (replay stores and logs go here)")
    parser.add_argument("--baseline", help="with --replay: the night's --fabric-baseline")
    parser.add_argument("--only", default="stall", help="with --replay: nightly_gates.py's --only (default: stall)")
    args = parser.parse_args(argv)
    if args.replay and (not args.baseline or len(args.nights) != 1):
        parser.error("--replay judges one night and needs its --baseline")
    for path in args.nights:
        try:
            records = json.loads(Path(path).read_text())["records"]
        except (OSError, ValueError, KeyError) as exc:
            parser.error(f"{path}: not a saved night with records ({exc})")
        rows = rejudge(records)
        print(f"{path}:")
        for key, before, after in rows:
            if before or after:
                print(f"  {key.partition('#')[0]}{key[len(LaunchKey.parse(key).base):]}: "
                      f"saved: {before or 'full weight'} | now: {after or 'full weight'}")
        print(f"  down-weighted: saved {sum(bool(b) for _, b, _ in rows)}, now {sum(bool(a) for *_, a in rows)} "
              f"of {len(rows)} launches")
        if args.replay:
            from nightly_gates import SELECT

            if args.only not in SELECT:
                parser.error(f"--only: one of {', '.join(sorted(SELECT))}")
            out, baseline = Path(args.replay).resolve(), Path(args.baseline).resolve()
            verdicts = {}
            for name, judged in (("saved", records), ("re-judged", rejudged(records))):
                for gate in replay(judged, out / name, baseline, SELECT[args.only]):
                    verdicts.setdefault(gate["gate"], {})[name] = gate
            print("\n| gate | as saved | re-judged |\n|---|---|---|")
            for gate, by in verdicts.items():
                cells = [f"{g['outcome']} {float(g.get('ratio', 'nan')):.3f} [{float(g.get('ci_low', 'nan')):.3f}, {float(g.get('ci_high', 'nan')):.3f}], "
                         f"{g.get('down_weighted', 0)} dw" if (g := by.get(name)) else "-" for name in ("saved", "re-judged")]
                print(f"| {gate} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
