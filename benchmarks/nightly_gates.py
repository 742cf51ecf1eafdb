#!/usr/bin/env python
"""Do the gates flake, and do they catch a real slowdown? Nightly-style runs on the emulated cluster.

    python benchmarks/nightly_gates.py [--nights 10] [--slowdown 0.3] [--out DIR]

Every "night" is one `pytest suites/test_parity.py suites/test_regression.py` run in a subprocess,
as a nightly CI job would run it, on 2 emulated nodes with two fabrics:

  ib    the InfiniBand preset (2000 Mbit/s emulated link)
  ib2   a copy of ib defined in the ini (`fabric_define = ib2: ib`): the same link, another name

and two gates:

  A/A parity       qwen2-tiny: ib2 within 5% of ib (the embedded parity suite). Both sides are the
                   same fabric, so a fail is a false alarm.
  regression       llama-wide (communication-bound), 2 nodes on ib: tonight no more than 10%
                   below the baseline (--fabric-baseline).

The baseline is built the way a team builds one: --baseline-nights runs of the throughput suite
(one llama-wide launch each, --fabric-save), merged by `pytest-fabric baseline` (one value per
night, outliers dropped). Nights 1..N then change nothing: every fail there is a flake. The last night, "planted", lowers ib's link
by --slowdown (a known fraction, via --fabric-rate) and must fail the regression gate. The table
gives each night's verdict per gate with the interval and launches the gate reported (read from
the JUnit XML with junitparser). Exit status 0 when no A/A night failed and the planted night
failed its regression gate, 1 otherwise. Needs root (network namespaces). ~4 min a night here.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from junitparser import JUnitXml

REPO = Path(__file__).resolve().parent.parent
IB_MBIT = 2000


NIGHTLY = ["suites/test_parity.py", "suites/test_regression.py",
           "-k", "within or (regression and llama and n2 and not ib2)"]
BASELINE = ["suites/test_throughput.py", "-k", "llama and n2 and not ib2"]


def night(index: int | str, out: Path, extra: list[str],
          resume: bool = False) -> tuple[dict[str, tuple[str, str]], float]:
    """Run one night (or, with ``resume``, read the one already run); {test id: (outcome, message)}, wall time."""
    junit = out / f"night{index}.xml"
    if resume and junit.exists():
        return verdicts_of(junit), 0.0
    argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA",
            "--nodes", "2", "--fabrics", "ib,ib2", "--models", "qwen2-tiny,llama-wide",
            "-o", "fabric_define=ib2: ib",
            f"--fabric-save={out / f'night{index}.json'}", f"--junitxml={junit}", *extra]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - start
    (out / f"night{index}.log").write_text(proc.stdout + proc.stderr)
    if not junit.exists():
        raise SystemExit(f"night {index}: pytest wrote no JUnit (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    return verdicts_of(junit), wall


def verdicts_of(junit: Path) -> dict[str, tuple[str, str]]:
    verdicts = {}
    for suite in JUnitXml.fromfile(str(junit)):
        for case in suite:
            outcome, message = "passed", ""
            for r in case.result:
                outcome = {"Failure": "FAILED", "Error": "ERROR", "Skipped": "skipped"}.get(type(r).__name__, "?")
                message = r.message or ""
                if outcome == "skipped" and "xfail" in (r.type or "") + message:
                    outcome = "xfail"
            if outcome == "passed":  # the gate's own line: "pass: ..."
                found = re.search(r"^(pass: .*)$", case.system_out or "", re.MULTILINE)
                message = found.group(1) if found else ""
            verdicts[case.name] = (outcome, message)
    return verdicts


def short(message: str) -> str:
    interval = re.search(r"= (\d+\.\d+), [\d.]+% CI \[(\d+\.\d+), (\d+\.\d+)\]", message)
    launches = re.search(r"(\d+\+\d+|\d+) launch(?:es)?", message)
    bits = []
    if interval:
        bits.append(f"ratio {interval.group(1)} [{interval.group(2)}, {interval.group(3)}]")
    if launches:
        bits.append(launches.group(0))
    return ", ".join(bits) or message[:80]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=10, help="unchanged (A/A) nights after night 0 (default 10)")
    parser.add_argument("--baseline-nights", type=int, default=3, help="nights merged into the baseline (default 3)")
    parser.add_argument("--slowdown", type=float, default=0.3,
                        help="fraction of ib's link rate removed on the planted night (default 0.3)")
    parser.add_argument("--out", default="nightly-gates", help="directory for JUnit, saved results and logs")
    parser.add_argument("--resume", action="store_true", help="reuse the nights already in --out (their JUnit)")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    baseline = out / "baseline.json"
    for b in range(1, args.baseline_nights + 1):
        _, wall = night(f"b{b}", out, BASELINE, args.resume)
        print(f"baseline night b{b}: {wall:.0f}s", flush=True)
    merged = subprocess.run([sys.executable, "-m", "pytest_fabric.cli", "baseline", str(baseline),
                             *(str(out / f"nightb{b}.json") for b in range(1, args.baseline_nights + 1))],
                            cwd=REPO, capture_output=True, text=True)
    print(merged.stdout + merged.stderr, flush=True)
    if merged.returncode != 0:
        return 1
    plans = [("A/A", i, [*NIGHTLY, f"--fabric-baseline={baseline}"]) for i in range(1, args.nights + 1)]
    planted_mbit = round(IB_MBIT * (1 - args.slowdown))
    plans.append((f"planted: ib {IB_MBIT}->{planted_mbit} Mbit/s", args.nights + 1,
                  [*NIGHTLY, f"--fabric-baseline={baseline}", f"--fabric-rate=ib={planted_mbit}"]))

    rows, ok = [], True
    for label, index, extra in plans:
        verdicts, wall = night(index, out, extra, args.resume)
        for test, (outcome, message) in sorted(verdicts.items()):
            rows.append((index, label, test, outcome, short(message), wall))
            print(f"night {index:2d} {label:28s} {test:55s} {outcome:8s} {short(message)}  ({wall:.0f}s)",
                  flush=True)
            if label == "A/A" and outcome in ("FAILED", "ERROR"):
                ok = False
            if label.startswith("planted") and "regression" in test and outcome != "FAILED":
                ok = False

    print("\n| night | kind | gate | verdict | interval, launches |\n|---|---|---|---|---|")
    for index, label, test, outcome, message, _ in rows:
        print(f"| {index} | {label} | `{test}` | {outcome} | {message} |")
    aa = [r for r in rows if r[1] == "A/A"]
    print(f"\nA/A gate results: {len(aa)}; failed: {sum(r[3] in ('FAILED', 'ERROR') for r in aa)}; "
          f"inconclusive (xfail): {sum(r[3] == 'xfail' for r in aa)}")
    print("planted slowdown caught" if ok or any(r[1].startswith("planted") and r[3] == "FAILED" for r in rows)
          else "planted slowdown NOT caught")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
