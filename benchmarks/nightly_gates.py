#!/usr/bin/env python
"""Do the gates decide, do they flake, and do they catch a planted slowdown? Nightly runs, measured.

    python benchmarks/nightly_gates.py [--nights 10] [--one-launch-nights 5] [--out DIR] [--resume]
                                       [--only parity|regression|stall] [--no-fixed]

Every "night" is one `pytest suites/...` run in a subprocess, as a nightly CI job would run it, on
2 emulated nodes, with copies of the ib preset defined in the ini so that the effect of each gate is
known in advance:

  ib    the InfiniBand preset (2000 Mbit/s emulated link)
  ib2   a copy of ib: the same link, another name                    -> A/A: must never fail
  ib3   a copy of ib whose steps are stretched x1.10 (the `slow`      -> planted 10% slowdown on a
        fault, compute side: PYTEST_FABRIC_FAULT)                        compute-bound job: must fail
  ib4   a copy of ib, stretched x1.10 on the nightly runs only        -> planted regression
  ib5   a copy of ib whose launches stall: 20% of the steps x1.6       -> planted intermittent stalls
        (the `stall` fault: ~11% of mean throughput lost, the fast       (parity): must fail
        steps untouched)
  ib6   a copy of ib stretched x1.0526: exactly at the 5% parity      -> at the threshold: the pass
        threshold                                                         rate is the gate's error rate
  ib7   a copy of ib that stalls (20% x1.6) on the nightly runs only  -> planted stalls (regression)

Gates, each with the suites' defaults (--repeats / --max-repeats as the plugin ships them):

  parity A/A        qwen2-tiny n2: ib2 within 5% of ib
  parity planted    qwen2-tiny n2: ib3 within 5% of ib
  regression A/A    llama-wide n2 on ib: fabric time (the default measure) at most 5% below the baseline
  regression plant  llama-wide n2 on ib4: the same, with every ib4 step 10% longer tonight
  one launch        --repeats 1 --max-repeats 1: llama-wide ib at least 20% ahead of eth (about 4x),
                    qwen2-tiny ib2 within 5% of ib (A/A)

The regression threshold is 5% here (--regression-threshold 0.05): a planted 10% loss against the
default 10% threshold would sit on the threshold itself, where no gate can decide. The baseline is
built as a team builds one: --baseline-nights runs of the throughput suite (--throughput-launches 3:
three launches of each configuration the gates use, --fabric-save), merged by `pytest-fabric
baseline`, which learns each configuration's launch noise from them; every night's gates take it as
their prior (--fabric-baseline). The one-launch nights and the fixed-steps night take no baseline.

Verdicts and their numbers are read from the JUnit machine lines (`fabric.gate.<a>_vs_<b>.*`), the
measured-step share of each launch from the saved nights. A "fixed" night runs parity A/A with the
old measuring policy (8 fixed steps a launch) for the share of launch time spent measuring, before
and after. Prints a table per gate: pass / inconclusive / fail, launches per side, wall time per
verdict. Exit status 0 when no A/A gate failed and every planted one failed. Needs root. Run it
alone on the machine: anything running beside it is measured too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped

REPO = Path(__file__).resolve().parent.parent

# The planted fabrics first, the A/A gates last: a later gate's rounds launch their reference again
# next to their own candidate (a round's launches run back to back: ``Measurer.in_round``), as any
# later comparison against the same reference in one session does.
FABRICS = ["--fabrics", "ib7,ib6,ib5,ib4,ib3,ib,ib2", "-o",
           "fabric_define=ib2: ib\nib3: ib\nib4: ib\nib5: ib\nib6: ib\nib7: ib"]
PLANT_PARITY = "slow:fabric=ib3,factor=1.10"
PLANT_REGRESSION = "slow:fabric=ib4,factor=1.10"
PLANT_STALL = "stall:fabric=ib5,p=0.2,factor=1.6"
PLANT_THRESHOLD = "slow:fabric=ib6,factor=1.0526"
PLANT_STALL_REGRESSION = "stall:fabric=ib7,p=0.2,factor=1.6"
PLANTS = ";".join([PLANT_PARITY, PLANT_REGRESSION, PLANT_STALL, PLANT_THRESHOLD, PLANT_STALL_REGRESSION])
SELECT = {"parity": "(parity and qwen2 and (ib2 or ib3))",
          "verdicts": "(parity and qwen2 and (ib2 or ib3 or ib6))", "regression": "(regression and llama and n2 and (ib] or ib4))",
          "stall": "(parity and qwen2 and (ib2 or ib5 or ib6)) or (regression and llama and n2 and (ib] or ib7))"}
NIGHTLY = ["suites/test_parity.py", "suites/test_regression.py", "--models", "qwen2-tiny,llama-wide",
           "--regression-threshold", "0.05"]
# The baseline's nights launch each configuration the gates lean on three times, so that the baseline
# learns each one's launch noise (the gates' prior) besides its value.
BASELINE = ["suites/test_throughput.py", "--models", "qwen2-tiny,llama-wide", "--throughput-launches", "3",
            "-k", "(llama and (n1-ib] or n2-ib] or n2-ib4] or n2-ib7])) or (qwen2 and n2-ib])"]
ONE_LAUNCH = ["suites/test_parity.py", "suites/test_advantage.py", "--models", "qwen2-tiny,llama-wide",
              "--fabrics", "ib,ib2,eth", "-o", "fabric_define=ib2: ib", "--repeats", "1", "--max-repeats", "1",
              "-k", "(parity and qwen2 and ib2) or (advantage and llama and n2-eth)"]
FIXED = ["suites/test_parity.py", "--models", "qwen2-tiny", "--fabrics", "ib,ib2", "-o", "fabric_define=ib2: ib",
         "--steps", "8", "--measure-seconds", "0", "-k", "qwen2 and ib2"]

# test id fragment -> (gate label, expected outcome: "not fail" for A/A, "fail" for planted, "pass")
GATES = {
    ("nightly", "parity", "ib2"): ("parity A/A", "not fail"),
    ("nightly", "parity", "ib3"): ("parity planted x1.10", "fail"),
    ("nightly", "regression", "ib]"): ("regression A/A", "not fail"),
    ("nightly", "regression", "ib4"): ("regression planted x1.10", "fail"),
    ("nightly", "parity", "ib5"): ("parity planted stalls 20% x1.6", "fail"),
    ("nightly", "parity", "ib6"): ("parity planted x1.0526 (at threshold)", "rate"),
    ("nightly", "regression", "ib7"): ("regression planted stalls 20% x1.6", "fail"),
    ("one", "parity", "ib2"): ("one launch: parity A/A", "not fail"),
    ("one", "advantage", "eth"): ("one launch: advantage ib vs eth", "pass"),
    ("fixed", "parity", "ib2"): ("fixed 8 steps: parity A/A", "not fail"),
}


def night(name: str, out: Path, argv: list[str], fault: str = "", resume: bool = False) -> float:
    """Run one night unless ``resume`` finds it already run; its wall time (0 when resumed)."""
    junit = out / f"{name}.xml"
    if resume and junit.exists():
        return 0.0
    env = {**os.environ, "PYTEST_FABRIC_FAULT": fault} if fault else {
        k: v for k, v in os.environ.items() if k != "PYTEST_FABRIC_FAULT"}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "--nodes", "2",
           f"--fabric-save={out / f'{name}.json'}", f"--junitxml={junit}", *argv]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.monotonic() - start
    (out / f"{name}.log").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if not junit.exists():
        raise SystemExit(f"{name}: pytest wrote no JUnit (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return wall


def gates_of(junit: Path, kind: str) -> list[dict]:
    """Each gate testcase of a night: label, outcome, its machine-line fields, wall time."""
    found = []
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            label = next((g for (k, suite_part, part), g in GATES.items()
                          if k == kind and suite_part in (case.classname or "") and part in case.name), None)
            if label is None:
                continue
            outcome = "pass"
            for r in case.result:
                if isinstance(r, (Failure, Error)):
                    outcome = "fail" if isinstance(r, Failure) else "error"
                elif isinstance(r, Skipped):
                    outcome = "inconclusive" if "inconclusive" in (r.message or "").lower() else "skipped"
            fields = {}
            for line in (case.system_out or "").splitlines():
                if line.startswith("fabric.gate."):
                    name, _, value = line.partition("=")
                    fields[name.rsplit(".", 1)[1]] = value
            found.append({"gate": label[0], "expect": label[1], "outcome": outcome, "time": case.time or 0.0,
                          **fields})
    return found


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) interval of a rate of k in n: 0 fails in 10 bounds the rate below 31%."""
    from scipy.stats import beta

    alpha = 1 - confidence
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def measured_share(saved: Path) -> list[float]:
    """Per launch of a saved night: the share of its wall time spent in measured steps."""
    if not saved.exists():
        return []
    records = json.loads(saved.read_text()).get("records", {})
    shares = []
    for record in records.values():
        r = record.get("result") or {}
        if r.get("launch_s") and r.get("step_s"):
            shares.append(sum(r["step_s"]) / r["launch_s"])
    return shares


def print_table(rows: list[dict], aa_max: float = 0.0, planted_min: float = 1.0) -> bool:
    """The table of a night's gates: pass / inconclusive / fail per gate, the rate that matters with
    its exact interval, launches per side, seconds per verdict. True when A/A gates failed (or
    errored) in at most ``aa_max`` of nights, planted ones failed in at least ``planted_min``, the
    one-launch advantage passed every night, and the at-threshold plant passed at most 10%."""
    ok = True
    print("\n| gate | nights | pass | inconclusive | fail | 95% interval of the pass / fail rate | "
          "launches per side (count) | s per verdict (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, expect in dict.fromkeys(GATES.values()):
        mine = [r for r in rows if r["gate"] == label]
        if not mine:
            continue
        counts = Counter(r["outcome"] for r in mine)
        launches = Counter(max(int(x) for x in r["launches"].split("+")) for r in mine if r.get("launches"))
        spread = ", ".join(f"{n}: {c}" for n, c in sorted(launches.items()))
        # The rate that matters for the gate: false fails of an A/A, catches of a plant, passes at the threshold.
        k = counts["pass"] if expect in ("rate", "pass") else counts["fail"]
        low, high = clopper_pearson(k, len(mine))
        rate = f"{'pass' if expect in ('rate', 'pass') else 'fail'} {k}/{len(mine)}: [{low:.0%}, {high:.0%}]"
        print(f"| {label} | {len(mine)} | {counts['pass']} | {counts['inconclusive']} | {counts['fail']} | {rate} | "
              f"{spread} | {statistics.median(r['time'] for r in mine):.0f} |")
        if expect == "not fail" and counts["fail"] + counts["error"] > aa_max * len(mine):
            ok = False
        if expect == "fail" and counts["fail"] < planted_min * len(mine):
            ok = False
        if expect == "pass" and counts["pass"] < len(mine):
            ok = False
        if expect == "rate" and counts["pass"] > 0.10 * len(mine):  # at the threshold: pass at most 10%
            ok = False
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=10, help="nightly runs (parity + regression gates)")
    parser.add_argument("--one-launch-nights", type=int, default=5, help="runs with one launch per side")
    parser.add_argument("--baseline-nights", type=int, default=3, help="nights merged into the baseline")
    parser.add_argument("--no-fixed", action="store_true", help="skip the fixed-steps night")
    parser.add_argument("--out", default="nightly-gates", help="directory for JUnit, saved results and logs")
    parser.add_argument("--resume", action="store_true", help="reuse the nights already in --out")
    parser.add_argument("--only", choices=sorted(SELECT),
                        help="the nights run only these gates (parity, regression, or stall: parity A/A, stalls and "
                             "the at-threshold plant, regression A/A and stalls)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    baseline = out / "baseline.json"
    for b in range(1, args.baseline_nights + 1):
        wall = night(f"baseline{b}", out, [*BASELINE, *FABRICS], resume=args.resume)
        print(f"baseline night {b}: {wall:.0f}s", flush=True)
    merged = subprocess.run([sys.executable, "-m", "pytest_fabric.cli", "baseline", str(baseline),
                             *(str(out / f"baseline{b}.json") for b in range(1, args.baseline_nights + 1))],
                            cwd=REPO, capture_output=True, text=True)
    print(merged.stdout + merged.stderr, flush=True)
    if merged.returncode != 0:
        return 1

    plans = [] if args.no_fixed else [("fixed", "fixed", FIXED, "")]
    select = SELECT[args.only] if args.only else " or ".join(SELECT.values())
    plans += [(f"night{i}", "nightly", [*NIGHTLY, "-k", select, *FABRICS, f"--fabric-baseline={baseline}"],
               PLANTS) for i in range(1, args.nights + 1)]
    plans += [(f"one{i}", "one", ONE_LAUNCH, "") for i in range(1, args.one_launch_nights + 1)]
    rows = []
    shares: dict[str, list[float]] = {}
    for name, kind, extra, fault in plans:
        wall = night(name, out, extra, fault, args.resume)
        for g in gates_of(out / f"{name}.xml", kind):
            rows.append({"night": name, **g})
            print(f"{name:8s} {g['gate']:34s} {g['outcome']:12s} ratio {g.get('ratio', '-'):>8s} "
                  f"[{g.get('ci_low', '-')}, {g.get('ci_high', '-')}] launches {g.get('launches', '-'):>5s} "
                  f"re-run {g.get('reruns', '-')}  ({g['time']:.0f}s)", flush=True)
        shares.setdefault("fixed" if kind == "fixed" else "adaptive", []).extend(measured_share(out / f"{name}.json"))
        print(f"{name}: {wall:.0f}s", flush=True)

    ok = print_table(rows)
    for policy, values in shares.items():
        if values:
            print(f"\nshare of launch wall time in measured steps, {policy}: median {statistics.median(values):.0%} "
                  f"over {len(values)} launches")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
