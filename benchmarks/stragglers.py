#!/usr/bin/env python
"""Stragglers on the emulated cluster: A/A runs name nobody, a rank planted slower is named.

    python benchmarks/stragglers.py [--aa 10] [--out DIR]      # root, alone on the machine

Each run is `pytest suites/test_throughput.py -k "qwen2-tiny and n2-ib"` on 2 emulated nodes of 2
ranks, measured as a night measures (the default window: 10 steps, then until 6 s), with its own
--fabric-save. The
A/A runs plant nothing. The planted runs put a sitecustomize on the ranks' PYTHONPATH (the test's
fault, ``tests/helpers.slow_rank_site``) that spins 30% more CPU (of its main thread) before each optimizer step on:
rank 3 (node1), rank 1 (node0), and ranks 2 and 3 (the whole of node1). For every run the table
shows what the harness named (JUnit's ``fabric.<case>.stragglers``, the same lines as the terminal)
and the largest excess of any rank over the others (its median CPU work per step over the median of
the others' medians, less 1): the margin the rule needs (15%) set against the A/A's largest excess.
Exit 1 when an A/A run names anyone or a planted run does not name exactly what was planted.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers import slow_rank_site  # noqa: E402

CASE = "qwen2-tiny-n2-ib"
ARGS = ["-k", "qwen2-tiny and n2-ib", "--nodes", "2", "--gpus-per-node", "2", "--launch-timeout", "180",
        "-p", "no:cacheprovider", "-q"]
PLANTED = [((3,), "rank 3 on node1/"), ((1,), "rank 1 on node0/"), ((2, 3), "node1/198.18.0.2: all 2 ranks")]


def excess(saved: Path) -> tuple[float, int]:
    """(the largest excess of any rank, that rank) over the launch's measured steps."""
    records = json.loads(saved.read_text())["records"]
    (record,) = [r for r in records.values() if "result" in r]
    work = record["result"]["signals"]["rank_cpu_s"]
    medians = [statistics.median(step[r] for step in work) for r in range(len(work[0]))]
    ratios = [m / statistics.median(o for i, o in enumerate(medians) if i != r) - 1 for r, m in enumerate(medians)]
    top = max(range(len(ratios)), key=ratios.__getitem__)
    return ratios[top], top


def run(out: Path, name: str, ranks: tuple[int, ...]) -> tuple[str, float, int, float]:
    env = dict(os.environ)
    if ranks:
        env["PYTHONPATH"] = str(slow_rank_site(out / name / "site", ranks, extra=0.3))
    saved, junit = out / name / "night.json", out / name / "junit.xml"
    saved.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "suites" / "test_throughput.py"), *ARGS,
                           f"--fabric-save={saved}", f"--junitxml={junit}"], cwd=out / name, env=env,
                          capture_output=True, text=True, timeout=600)
    (out / name / "output.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: pytest exited {proc.returncode}; see {out / name / 'output.txt'}")
    from junitparser import JUnitXml

    props = {p.name: p.value for s in JUnitXml.fromfile(str(junit)) for p in s.properties()}
    top, rank = excess(saved)
    return props[f"fabric.{CASE}.stragglers"], top, rank, time.monotonic() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa", type=int, default=10, help="A/A runs (default 10)")
    parser.add_argument("--out", type=Path, default=None, help="where the runs' files go (default: a temp dir)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="stragglers-", dir=Path.home()))
    plan = [(f"aa{i:02d}", (), None) for i in range(args.aa)] + [
        (f"slow{'-'.join(map(str, ranks))}", ranks, expect) for ranks, expect in PLANTED]
    print(f"{'run':<10} {'planted':<12} {'largest excess':>15} {'named':<s}")
    bad = 0
    aa_excess = []
    for name, ranks, expect in plan:
        named, top, rank, seconds = run(out, name, ranks)
        planted = ",".join(f"rank {r}" for r in ranks) or "-"
        ok = named == "none" if not ranks else named.startswith(expect) and named.count("; ") == 0
        bad += not ok
        if not ranks:
            aa_excess.append(top)
        print(f"{name:<10} {planted:<12} {top:>+9.1%} (r{rank}) {named}{'' if ok else '   <- WRONG'}  [{seconds:.0f}s]",
              flush=True)
    print(f"A/A: {sum(1 for n, r, _ in plan if not r)} runs, largest excess of any rank {max(aa_excess):+.1%} "
          f"(median of the runs' largest {statistics.median(aa_excess):+.1%}); the rule's margin is 15%")
    print(f"{bad} wrong; files under {out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
