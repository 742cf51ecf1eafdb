"""The default run's launch overhead, this checkout against an earlier commit, side by side in one run.

    python benchmarks/launch_overhead.py --before COMMIT [--nodes 2] [--out DIR] [-- PYTEST ARGS]

Runs ``pytest suites/ --nodes N`` (the README's main job) once on COMMIT (a git worktree made for it)
and once on this checkout, one after the other, each with its own run directory and a saved night,
and prints each night's launch phases (docs/launch-time.md) side by side: seconds, share of launch
wall, after over before; the fraction of launch wall in measured training steps (the same definition
on both sides), and in any measuring (training steps and timed collectives: a checkout that does not
mark its timed collectives counts them as program); the median training launch's overhead (its wall
less its measured steps); the session's wall. Run it with nothing else on the machine: the launches of
both runs share its cores with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pytest_fabric.core.case import BANDWIDTH, LINKS
from pytest_fabric.history.launch_time import PHASES, records_launch_time

REPO = Path(__file__).resolve().parent.parent


def run_night(checkout: Path, name: str, out: Path, nodes: int, extra: list[str]) -> dict:
    """``pytest suites/ --nodes N`` on ``checkout``; the saved night with its wall and exit code."""
    night = out / f"{name}-night.json"
    command = [sys.executable, "-m", "pytest", "suites/", "--nodes", str(nodes), "-q", "-p", "no:cacheprovider",
               f"--fabric-save={night}", f"--run-dir={out / (name + '-runs')}", f"--junitxml={out / (name + '.xml')}",
               *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")]))}
    print(f"# {name}: cd {checkout} && PYTHONPATH={checkout} {' '.join(command[1:])}", flush=True)
    start = time.monotonic()
    with open(out / f"{name}.log", "w") as log:
        code = subprocess.run(command, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - start
    summary = (out / f"{name}.log").read_text().strip().splitlines()[-1:] or [""]
    print(f"# {name}: exit {code}, {wall:.1f} s wall: {summary[0]}", flush=True)
    data = json.loads(night.read_text())
    return {"data": data, "wall_s": wall, "code": code}


def _kind(key: str) -> str:
    return "links" if key.startswith(LINKS) else "collectives" if key.startswith(BANDWIDTH) else "training"


def figures(night: dict) -> dict:
    """The night's phases summed, its training launches' alone, and the median training launch's overhead."""
    records = {**night["data"]["records"], **(night["data"].get("link_records") or {})}
    every = records_launch_time(records)
    training = {k: r for k, r in records.items() if _kind(k) == "training"}
    steps = records_launch_time(training)
    overheads = [sum(p.values()) - p.get("measured", 0.0) for r in training.values()
                 if isinstance(p := (r.get("result") or {}).get("launch_time"), dict)]
    return {"every": every, "steps_s": steps.phases.get("measured", 0.0) if steps else 0.0,
            "overhead": statistics.median(overheads) if overheads else float("nan"),
            "training_launches": len(overheads), "wall_s": night["wall_s"]}


def table(before: dict, after: dict, names: tuple[str, str]) -> list[str]:
    b, a = figures(before), figures(after)
    lines = [f"{'phase':10} {names[0] + ' s':>12} {'share':>7} {names[1] + ' s':>12} {'share':>7} {'after/before':>13}"]
    for phase in PHASES:
        x, y = b["every"].phases.get(phase, 0.0), a["every"].phases.get(phase, 0.0)
        if x or y:
            ratio = f"{y / x:13.2f}" if x else f"{'-':>13}"
            lines.append(f"{phase:10} {x:12.1f} {x / b['every'].wall_s:7.1%} {y:12.1f} {y / a['every'].wall_s:7.1%} {ratio}")
    bw, aw = b["every"].wall_s, a["every"].wall_s
    lines += [
        f"{'launches':10} {bw:12.1f} {1:7.1%} {aw:12.1f} {1:7.1%} {aw / bw:13.2f}",
        f"launches: {b['every'].launches} before, {a['every'].launches} after "
        f"({b['training_launches']} and {a['training_launches']} training)",
        f"measured training steps, share of launch wall: {b['steps_s'] / bw:.1%} before, {a['steps_s'] / aw:.1%} after",
        f"measuring (steps and timed collectives), share of launch wall: {b['every'].measured_fraction:.1%} before, "
        f"{a['every'].measured_fraction:.1%} after",
        f"median training launch's overhead (its wall less its measured steps): {b['overhead']:.2f} s before, "
        f"{a['overhead']:.2f} s after ({a['overhead'] / b['overhead']:.2f}x)",
        f"session wall: {b['wall_s']:.1f} s before, {a['wall_s']:.1f} s after ({a['wall_s'] / b['wall_s']:.2f}x)",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare with (a git revision of this repository)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="where the nights and logs go (default: a new temp dir)")
    parser.add_argument("--after-first", action="store_true", help="run this checkout first")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="launch-overhead-"))
    out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()
    worktree = out / f"before-{commit}"
    if not worktree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=REPO, check=True,
                       capture_output=True)
    print(f"# before: {commit} ({worktree}); after: this checkout ({head}{' + changes' if _dirty() else ''})")
    try:
        order = [("after", REPO), ("before", worktree)] if args.after_first else [("before", worktree), ("after", REPO)]
        nights = {name: run_night(path, name, out, args.nodes, args.pytest_args) for name, path in order}
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO, capture_output=True)
    print("\n".join(table(nights["before"], nights["after"], (f"before {commit}", f"after {head}"))))
    return 0


def _dirty() -> bool:
    return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True).stdout.strip())


if __name__ == "__main__":
    sys.exit(main())
