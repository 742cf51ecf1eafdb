#!/usr/bin/env python
"""Rounds one launch after the other, or taking turns? The same gates, both ways, side by side.

    python benchmarks/interleave_ab.py [--pairs 2] [--rounds 6] [--stalls] [--out DIR] [--resume]

Runs ``--pairs`` pairs of sessions on 2 emulated nodes, each pair one session with ``--interleave
off`` (a round's launches one after the other, back to back) and one with ``--interleave on``
(they take turns, ~2 s of measured steps each: ``Measurer.measure_round``), the order within a pair
alternating so that a drift of the machine over the run favours neither. Each session runs the
qwen2-tiny parity gates of ``nightly_gates.py`` on exactly ``--rounds`` rounds (--repeats =
--max-repeats):

  ib2  a copy of ib                                   A/A: the round-to-round noise itself
  ib6  a copy of ib stretched x1.0526 (at the 5% threshold)   the ratio must read ~0.950
  ib5  (--stalls) a copy of ib whose steps stall, 20% x1.6    the ratio must read ~0.89

Per mode and gate it prints the round-to-round standard deviation of the log ratio (each round's
candidate launch over the reference launch of the same round; pooled over the mode's sessions), the
geometric-mean ratio, the verdicts and the seconds per session, and the ratio of the two modes'
standard deviations (on / off), measured in the same run. Needs root; run it alone on the machine:
anything beside it is measured too.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nightly_gates import GATES, PLANT_STALL, PLANT_THRESHOLD, gates_of, night  # noqa: E402

FABRICS = ["--models", "qwen2-tiny", "-o", "fabric_define=ib2: ib\nib5: ib\nib6: ib"]
CANDIDATES = {"ib2": "A/A (ib2 = ib)", "ib6": "x1.0526 (at the threshold)", "ib5": "stalls 20% x1.6"}


def round_ratios(saved: Path, candidate: str, reference: str = "ib") -> list[float]:
    """Log ratio candidate / reference of each round of a saved session, over the launches the gate
    used: the reference launch of the same number measured with (or, back to back, again for) this
    candidate where there is one, else its plain launch of that number."""
    from pytest_fabric.measuring.measurement import LaunchKey, LaunchRecord, Measurement

    records = json.loads(saved.read_text())["records"]
    cand_id, ref_id = f"qwen2-tiny-n2-{candidate}", f"qwen2-tiny-n2-{reference}"
    launches: dict[tuple[str, int], list[tuple[LaunchKey, float]]] = defaultdict(list)
    for key, stored in records.items():
        parsed = LaunchKey.parse(key)
        record = LaunchRecord.from_dict(stored)
        if record.result is None:
            continue
        case_id = parsed.base.partition("#")[0]
        launches[(case_id, parsed.number)].append((parsed, Measurement.from_record(record.case, record).tokens_per_s))
    ratios = []
    for (case_id, number), mine in sorted(launches.items()):
        if case_id != cand_id:
            continue
        mine = sorted(mine, key=lambda kv: -kv[0].window)  # a window matched to the partner's first
        refs = sorted(launches.get((ref_id, number), []), key=lambda kv: -kv[0].window)
        cand = [v for k, v in mine if k.block in ("", ref_id)]
        ref = [v for k, v in refs if k.block == cand_id] or [v for k, v in refs if not k.block]
        if cand and ref:
            ratios.append(math.log(cand[0] / ref[0]))
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=2, help="pairs of sessions (one of each mode)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds every gate takes")
    parser.add_argument("--stalls", action="store_true", help="add the stall gate (ib5: 60 s windows, slow)")
    parser.add_argument("--out", default="interleave-ab", help="directory for JUnit, saved sessions and logs")
    parser.add_argument("--resume", action="store_true", help="reuse the sessions already in --out")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    candidates = ["ib2", "ib6"] + (["ib5"] if args.stalls else [])
    fault = ";".join([PLANT_THRESHOLD] + ([PLANT_STALL] if args.stalls else []))
    argv = ["suites/test_parity.py", *FABRICS, "--fabrics", ",".join(["ib", *candidates]),
            "--repeats", str(args.rounds), "--max-repeats", str(args.rounds),
            "-k", "qwen2 and n2 and (" + " or ".join(candidates) + ")"]
    sessions: list[tuple[str, str, float]] = []
    for pair in range(args.pairs):
        for mode in (("off", "on") if pair % 2 == 0 else ("on", "off")):
            name = f"{mode}{pair + 1}"
            started = time.strftime("%H:%M:%S")
            wall = night(name, out, [*argv, "--interleave", mode], fault, resume=args.resume)
            print(f"{name}: started {started}, {wall:.0f} s", flush=True)
            sessions.append((mode, name, wall))

    print(f"\n{args.pairs} pair(s) of sessions, {args.rounds} rounds per gate, qwen2-tiny on 2 emulated nodes\n")
    print("| mode | gate | rounds | round SD of log ratio | ratio (geomean) | verdicts pass/inconclusive/fail | "
          "s per session (median) |")
    print("|---|---|---|---|---|---|---|")
    sd: dict[tuple[str, str], float] = {}
    for mode in ("off", "on"):
        mine = [(name, wall) for m, name, wall in sessions if m == mode]
        for cand in candidates:
            ratios, pooled, df = [], 0.0, 0
            for name, _ in mine:
                r = round_ratios(out / f"{name}.json", cand)
                ratios += r
                if len(r) >= 2:
                    pooled += sum((x - statistics.fmean(r)) ** 2 for x in r)
                    df += len(r) - 1
            label = GATES[("nightly", "parity", cand)][0]
            verdicts = Counter(g["outcome"] for name, _ in mine for g in gates_of(out / f"{name}.xml", "nightly")
                               if g["gate"] == label)
            sd[(mode, cand)] = math.sqrt(pooled / df) if df else float("nan")
            walls = [w for _, w in mine if w]
            print(f"| {mode} | {CANDIDATES[cand]} | {len(ratios)} | {sd[(mode, cand)]:.2%} | "
                  f"{math.exp(statistics.fmean(ratios)) if ratios else float('nan'):.3f} | "
                  f"{verdicts['pass']}/{verdicts['inconclusive']}/{verdicts['fail']} | "
                  f"{statistics.median(walls) if walls else 0:.0f} |")
    print()
    for cand in candidates:
        print(f"{CANDIDATES[cand]}: round SD on / off = {sd[('on', cand)] / sd[('off', cand)]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
