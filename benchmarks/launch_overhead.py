"""The default run's launch overhead, this checkout against an earlier commit, side by side in one run.

    python benchmarks/launch_overhead.py --before COMMIT [--nodes 2] [--out DIR] [-- PYTEST ARGS]

Runs ``pytest suites/ --nodes N`` (the README's main job) once on COMMIT (a git worktree made for it)
and once on this checkout, one after the other, each with its own run directory and a saved night,
and prints each night's launch phases (docs/launch-time.md) side by side where both recorded them:
seconds, share of launch wall, after over before. Then what any checkout records, the same definition
on both sides: the measured training steps (the results' step times) over the launches' ``launch_s``
(the supervisor's wall of each launch, from the first process started to the last ended), over all
launches and over the training launches; the median training launch's overhead (its launch_s less
its measured steps); the session's wall. Run it with nothing else on the machine: the launches of
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


def figures(night: dict) -> dict:
    """The night's phases summed (None where its launches recorded none), and the like-for-like figures
    any checkout records: measured training steps (the results' step times) over the launches'
    ``launch_s`` (the supervisor's wall of each launch), and the median training launch's overhead."""
    records = {**night["data"]["records"], **(night["data"].get("link_records") or {})}
    results = [r.get("result") or {} for r in records.values() if isinstance(r, dict)]
    steps = [sum(res.get("step_s") or []) for res in results]
    walls = [res.get("launch_s") or 0.0 for res in results]
    training = [(s, w) for s, w, res in zip(steps, walls, results) if res.get("step_s") and w]
    return {"every": records_launch_time(records), "steps_s": sum(steps), "launch_s": sum(walls),
            "training": training, "overhead": statistics.median(w - s for s, w in training),
            "wall_s": night["wall_s"]}


def table(before: dict, after: dict, names: tuple[str, str]) -> list[str]:
    b, a = figures(before), figures(after)
    lines = []
    if b["every"] and a["every"]:
        lines.append(f"{'phase':10} {names[0] + ' s':>14} {'share':>7} {names[1] + ' s':>14} {'share':>7} "
                     f"{'after/before':>13}")
        for phase in PHASES:
            x, y = b["every"].phases.get(phase, 0.0), a["every"].phases.get(phase, 0.0)
            if x or y:
                ratio = f"{y / x:13.2f}" if x else f"{'-':>13}"
                lines.append(f"{phase:10} {x:14.1f} {x / b['every'].wall_s:7.1%} {y:14.1f} {y / a['every'].wall_s:7.1%} "
                             f"{ratio}")
        lines.append(f"{'launches':10} {b['every'].wall_s:14.1f} {1:7.1%} {a['every'].wall_s:14.1f} {1:7.1%} "
                     f"{a['every'].wall_s / b['every'].wall_s:13.2f}")
        lines.append(f"measuring (steps and timed collectives), share of launch wall (phases): "
                     f"{b['every'].measured_fraction:.1%} before, {a['every'].measured_fraction:.1%} after")
    else:
        lines.append(f"(phases: {'before' if not b['every'] else 'after'} recorded none; the like-for-like figures below)")
    share = [x["steps_s"] / x["launch_s"] for x in (b, a)]
    training = [sum(s for s, _ in x["training"]) / sum(w for _, w in x["training"]) for x in (b, a)]
    lines += [
        f"training launches: {len(b['training'])} before, {len(a['training'])} after",
        f"measured training steps, share of all launches' launch_s: {share[0]:.1%} before, {share[1]:.1%} after",
        f"measured training steps, share of the training launches' launch_s: {training[0]:.1%} before, "
        f"{training[1]:.1%} after",
        f"median training launch's overhead (launch_s less its measured steps): {b['overhead']:.2f} s before, "
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
