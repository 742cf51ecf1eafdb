#!/usr/bin/env python
"""What a parity gate decides at a given round noise: the plugin's own gate code on simulated nights.

    python benchmarks/gate_power.py [--nights 15000] [--round-sd 0.005,0.01,0.02,0.04,0.08]
                                    [--gates 1,7] [--repeats 2] [--max-repeats 6] [--reruns 2]
                                    [--disturbed 0.05] [--seed 1] [--jobs 2] [--quick]

The measured nights (nightly_gates.py, nightly_resample.py) say what the gates did on this machine
at its noise that day; this says what they do at any noise, so that a measured night can be read
against it and a team can size its budget (--max-repeats) for its cluster's noise. Every decision
comes from the plugin's own code, not a copy: ``rounds.run_rounds`` gathers the paired rounds
(alternating order, a flagged round re-run at most --reruns times per gate, then counted as it is),
``SequentialGate`` looks at them (O'Brien-Fleming looks from --repeats to --max-repeats counted
rounds, the failure boundary at alpha / m over the night's m gates) and ``contrast_interval`` gives
the interval (the mean of the rounds' log ratios, its t interval on a learned noise pooled with
tonight's rounds, tonight's rounds alone from ``MIN_ROUNDS`` on, else the stated noise bound
``QUICK_LOOK_ROUND_SD``). Only the launches are simulated.

The model. The gate is "candidate within 5% of the reference" (``within_gate(DEFAULT_WITHIN)``:
ratio candidate / reference >= 0.95). The round SD s is the SD of one round's log ratio, so each
launch's log tokens/s deviates from its configuration's true value by a normal of SD s / sqrt(2),
independently between the sides (of which the launch's own step standard error, STEP_SE = 0.25%,
is a part, and is what the launch reports as its within-launch variance); a round effect of SD
ROUND_DRIFT = 2% hits both launches of a round alike and cancels in the ratio. The candidate:

  A/A           the reference itself (ratio 1)                          -> must pass, fail <= 1%
  at threshold  ratio exactly 0.95                                      -> passes <= 5% (the gate's error)
  x1.10         every step 10% longer (ratio 1 / 1.10 = 0.909)          -> must fail
  stall         20% of its steps take x1.6 (mean step x1.12, ratio      -> must fail
                0.893), STALL_STEPS = 100 steps a launch: the share of
                stalled steps in a launch is binomial, which adds 2.1%
                (SD of the log value) to each candidate launch and as
                much to its reported within-launch variance

Disturbances: a round is hit by a slow phase (the launch's tokens/s x0.85) on both launches (half
of the hit rounds) or on one of them, so that --disturbed (5%) of all launches are hit. The
detector flags a hit launch with probability DETECT (80%) and a clean one with FALSE_ALARM (2%); a
flagged round is re-run (``run_rounds``), an unflagged hit stays in the data (the realistic harm).

Priors (a baseline's ``NoisePrior``): "learned" is the true launch SD s / sqrt(2) on PRIOR_DF = 20
df from 3 nights; "learned x0.5" and "learned x2" are that sigma halved and doubled (a baseline
learned on a quieter or noisier machine, or from too few launches); "none" is tonight's rounds
alone (the stated bound below MIN_ROUNDS rounds).

Prints, per round SD, m and prior, the share of nights where the A/A gate passes and fails, the
at-threshold candidate passes, the x1.10 and the stall candidates fail (Wilson 95% intervals), the
mean launches per side (re-runs included), and a check of the targets below the table. --quick runs
every row on 40 nights a cell in one process (seconds); the full table (160 cells of 15000 nights,
2.4 million nights) took 7.5 minutes on this 2-core machine (2026-11-27, shared with other tests).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_fabric.deciding.contrasts import (  # noqa: E402
    MIN_ROUNDS,
    QUICK_LOOK_ROUND_SD,
    NoisePrior,
    Verdict,
    within_gate,
)
from pytest_fabric.deciding.gates import DEFAULT_WITHIN  # noqa: E402
from pytest_fabric.deciding.rounds import RERUNS, run_rounds  # noqa: E402
from pytest_fabric.deciding.sequential import SequentialGate  # noqa: E402

THRESHOLD, DIRECTION = within_gate(DEFAULT_WITHIN)
STEP_SE = 0.0025  # a launch's own standard error of its log mean step (part of its launch SD)
ROUND_DRIFT = 0.02  # SD of a round effect shared by both launches of the round (cancels in the ratio)
STALL_P, STALL_FACTOR, STALL_STEPS = 0.2, 1.6, 100
STALL_MEAN = 1 + STALL_P * (STALL_FACTOR - 1)
STALL_SD = math.sqrt(STALL_P * (1 - STALL_P) / STALL_STEPS) * (STALL_FACTOR - 1) / STALL_MEAN
SLOW_PHASE = math.log(0.85)  # a disturbed launch's log tokens/s moves by this
DETECT, FALSE_ALARM = 0.80, 0.02
PRIOR_DF, PRIOR_NIGHTS = 20.0, 3
PRIORS = {"learned": 1.0, "learned x0.5": 0.5, "learned x2": 2.0, "none": None}  # name -> sigma / true
SCENARIOS = {  # name -> true log ratio candidate / reference (the stall's is drawn per launch)
    "A/A": 0.0,
    "at threshold": math.log(THRESHOLD),
    "x1.10": -math.log(1.10),
    "stall": None,
}
TARGETS = {"threshold_pass": 0.05, "aa_fail": 0.01, "aa_pass": 0.95, "slow_fail": 0.95}


@dataclass(frozen=True)
class Cell:
    round_sd: float
    family: int
    prior: str
    scenario: str
    nights: int
    repeats: int
    max_repeats: int
    reruns: int
    disturbed: float
    seed: int


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    launched: int = 0  # launches per side, summed over nights (re-runs included)
    failed_within: int = 0  # failed with at most --max-repeats launches per side, re-runs included
    launches: int = 0  # launches of both sides
    hit: int = 0  # launches hit by a slow phase
    flagged: int = 0
    hit_counted: int = 0  # hit launches in the counted rounds (unflagged, or re-runs spent)


class Night:
    """One night's launches: ``launch(side, number)`` draws round ``number``'s launch of ``side``
    (0 reference, 1 candidate), the round drawn whole on its first launch."""

    def __init__(self, rng: random.Random, cell: Cell, tally: Tally):
        self.rng, self.cell, self.tally = rng, cell, tally
        self.rounds: dict[int, list[tuple[float, float, str, bool]]] = {}
        sigma = cell.round_sd / math.sqrt(2)
        self.step_se = min(STEP_SE, sigma / math.sqrt(2))
        self.rest = math.sqrt(sigma ** 2 - self.step_se ** 2)
        self.hit_rounds = cell.disturbed / 0.75  # a hit round hits 2 launches half the time, else 1

    def _draw_round(self) -> list[tuple[float, float, str, bool]]:
        rng, cell = self.rng, self.cell
        drift = rng.gauss(0.0, ROUND_DRIFT)
        hit = [False, False]
        if rng.random() < self.hit_rounds:
            if rng.random() < 0.5:
                hit = [True, True]
            else:
                hit[rng.randrange(2)] = True
        launches = []
        for side in (0, 1):
            value = drift + rng.gauss(0.0, self.rest) + rng.gauss(0.0, self.step_se)
            within = self.step_se ** 2
            if side == 1:
                effect = SCENARIOS[cell.scenario]
                if effect is None:  # the stall: the share of stalled steps is binomial
                    share = sum(rng.random() < STALL_P for _ in range(STALL_STEPS)) / STALL_STEPS
                    mean = 1 + share * (STALL_FACTOR - 1)
                    effect = -math.log(mean)
                    within += share * (1 - share) * (STALL_FACTOR - 1) ** 2 / mean ** 2 / STALL_STEPS
                value += effect
            if hit[side]:
                value += SLOW_PHASE
            flag = rng.random() < (DETECT if hit[side] else FALSE_ALARM)
            reason = ("machine slow" if hit[side] else "false alarm") if flag else ""
            launches.append((value, within, reason, hit[side]))
        self.tally.launches += 2
        self.tally.hit += sum(hit)
        self.tally.flagged += sum(1 for launch in launches if launch[2])
        return launches

    def launch(self, side: int, number: int) -> tuple[float, float, str, bool]:
        if number not in self.rounds:
            self.rounds[number] = self._draw_round()
        return self.rounds[number][side]


def prior_of(cell: Cell) -> NoisePrior | None:
    scale = PRIORS[cell.prior]
    if scale is None:
        return None
    return NoisePrior(min(scale * cell.round_sd / math.sqrt(2), 0.99), PRIOR_DF, cell.prior, nights=PRIOR_NIGHTS)


def run_cell(cell: Cell) -> tuple[Cell, Tally]:
    """``cell.nights`` nights of one gate: the same seed gives the same nights however the cells
    are spread over processes."""
    rng = random.Random(f"{cell.seed}|{cell.round_sd}|{cell.family}|{cell.prior}|{cell.scenario}")
    tally = Tally()
    prior = prior_of(cell)
    for _ in range(cell.nights):
        gate = SequentialGate(THRESHOLD, DIRECTION, start=cell.repeats, budget=cell.max_repeats, prior=prior,
                              family=cell.family)
        night = Night(rng, cell, tally)
        result = run_rounds(night.launch, 2, gate, signs=(-1.0, +1.0), sample=lambda m: (m[0], m[1]),
                            disturbed=lambda m: m[2], reruns=cell.reruns)
        verdict = result.look.verdict
        tally.passed += verdict is Verdict.PASS
        tally.failed += verdict is Verdict.FAIL
        tally.launched += result.launched
        tally.failed_within += verdict is Verdict.FAIL and result.launched <= cell.max_repeats
        tally.hit_counted += sum(m[3] for side in result.runs for m in side)
    return cell, tally


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k / n:.1%} [{lo:.1%}, {hi:.1%}]"


def check(name: str, rows: list[tuple[str, int, int]], target: float, at_most: bool) -> str:
    """A target's line: PASS where every row's rate is on the target's side, else MISS with the rows
    that miss (and whether their Wilson interval clears the target: more than the nights' noise)."""
    misses = []
    for label, k, n in rows:
        p = k / n
        if (p > target) if at_most else (p < target):
            lo, hi = wilson(k, n)
            clear = lo > target if at_most else hi < target
            misses.append(f"{label}: {rate(k, n)}{'' if clear else ' (within noise)'}")
    head = f"# {'PASS' if not misses else 'MISS'}  {name} ({len(rows) - len(misses)} of {len(rows)} rows)"
    return head + "".join(f"\n#        {m}" for m in misses)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=None,
                        help="simulated nights per cell (default 15000, --quick 40)")
    parser.add_argument("--round-sd", default="0.005,0.01,0.02,0.04,0.08",
                        help="SD of a round's log ratio, comma-separated fractions")
    parser.add_argument("--gates", default="1,7", help="m, the gates of the night's family, comma-separated")
    parser.add_argument("--repeats", type=int, default=2, help="counted rounds at the first look")
    parser.add_argument("--max-repeats", type=int, default=6, help="counted rounds at the last look")
    parser.add_argument("--reruns", type=int, default=RERUNS, help="re-runs of flagged rounds per gate")
    parser.add_argument("--disturbed", type=float, default=0.05, help="share of launches hit by a slow phase")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=None, help="processes (default: up to 2, --quick 1)")
    parser.add_argument("--quick", action="store_true", help="every row on 40 nights a cell, one process")
    args = parser.parse_args(argv)
    try:
        levels = [float(x) for x in args.round_sd.split(",")]
        families = [int(x) for x in args.gates.split(",")]
    except ValueError:
        parser.error(f"--round-sd takes fractions and --gates integers separated by commas (e.g. 0.01,0.02 and "
                     f"1,7), got {args.round_sd!r} and {args.gates!r}")
    nights = args.nights if args.nights is not None else (40 if args.quick else 15000)
    jobs = args.jobs if args.jobs is not None else (1 if args.quick else min(2, os.cpu_count() or 1))
    if (not all(0 < x < 1 for x in levels) or not all(m >= 1 for m in families) or nights < 1 or jobs < 1
            or not 1 <= args.repeats <= args.max_repeats or args.reruns < 0 or not 0 <= args.disturbed <= 0.75):
        parser.error("--round-sd fractions in (0, 1), --gates >= 1, --nights >= 1, --jobs >= 1, "
                     "1 <= --repeats <= --max-repeats, --reruns >= 0, --disturbed in [0, 0.75]")
    cells = [Cell(sd, m, prior, scenario, nights, args.repeats, args.max_repeats, args.reruns, args.disturbed,
                  args.seed)
             for sd in levels for m in families for prior in PRIORS for scenario in SCENARIOS]
    start = time.monotonic()
    print(f"# {nights} simulated nights per cell, seed {args.seed}, {jobs} process(es); the plugin's run_rounds, "
          f"SequentialGate and contrast_interval")
    print(f"# parity gate: ratio candidate / reference >= {THRESHOLD:g} (within {DEFAULT_WITHIN:.0%}); looks at "
          f"{args.repeats}..{args.max_repeats} counted rounds (O'Brien-Fleming), failures at alpha / m; "
          f"<{MIN_ROUNDS} rounds and no prior: the {QUICK_LOOK_ROUND_SD:.0%} round bound")
    print(f"# round SD s: SD of a round's log ratio; each launch s/sqrt(2) (its step SE {STEP_SE:.2%} a part), "
          f"a shared round effect of {ROUND_DRIFT:.0%} (cancels)")
    print(f"# candidates: A/A (1), at threshold ({THRESHOLD:g}), x1.10 ({1 / 1.10:.3f}), stall ({STALL_P:.0%} of "
          f"{STALL_STEPS} steps x{STALL_FACTOR}: mean x{STALL_MEAN:.2f}, ratio {1 / STALL_MEAN:.3f}, "
          f"+{STALL_SD:.1%} per launch)")
    print(f"# disturbances: {args.disturbed:.0%} of launches slow x{math.exp(SLOW_PHASE):.2f} (one or both of a "
          f"round); flagged {DETECT:.0%} of them and {FALSE_ALARM:.0%} of clean ones; a flagged round re-run, at "
          f"most {args.reruns} per gate")
    print(f"# priors: learned = true launch SD on {PRIOR_DF:g} df from {PRIOR_NIGHTS} nights; x0.5, x2: that "
          f"sigma halved, doubled; none = tonight's rounds alone")
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = dict(pool.imap_unordered(run_cell, cells, chunksize=1))
    else:
        done = dict(map(run_cell, cells))
    seconds = time.monotonic() - start
    print("| round SD | m | prior | A/A pass | A/A fail | at-threshold pass | x1.10 fail | stall fail | "
          "launches per side (A/A, thr, x1.10, stall) |")
    print("|---|---|---|---|---|---|---|---|---|")
    checks: dict[str, list[tuple[str, int, int]]] = {
        key: [] for key in ("threshold_pass", "aa_fail", "aa_pass", "slow_fail", "wrong_threshold_pass",
                            "wrong_aa_fail")}
    slow_within = []
    totals = Tally()
    for sd in levels:
        for m in families:
            for prior in PRIORS:
                row = {s: done[Cell(sd, m, prior, s, nights, args.repeats, args.max_repeats, args.reruns,
                                    args.disturbed, args.seed)] for s in SCENARIOS}
                aa, thr, slow, stall = (row[s] for s in SCENARIOS)
                spent = ", ".join(f"{row[s].launched / nights:.1f}" for s in SCENARIOS)
                print(f"| {sd:.1%} | {m} | {prior} | {rate(aa.passed, nights)} | {rate(aa.failed, nights)} | "
                      f"{rate(thr.passed, nights)} | {rate(slow.failed, nights)} | {rate(stall.failed, nights)} | "
                      f"{spent} |")
                label = f"{sd:.1%} m={m} {prior}"
                wrong = PRIORS[prior] not in (1.0, None)  # a learned sigma scaled off the truth
                checks["wrong_threshold_pass" if wrong else "threshold_pass"].append((label, thr.passed, nights))
                checks["wrong_aa_fail" if wrong else "aa_fail"].append((label, aa.failed, nights))
                if sd <= 0.02 + 1e-12 and prior == "learned":
                    checks["aa_pass"].append((label, aa.passed, nights))
                    checks["slow_fail"].append((label, slow.failed, nights))
                    slow_within.append((label, slow.failed_within, nights))
                for t in row.values():
                    totals.launches += t.launches
                    totals.hit += t.hit
                    totals.flagged += t.flagged
                    totals.hit_counted += t.hit_counted
                    totals.launched += t.launched
    print(f"\n# launches: {totals.launches}, {totals.hit / totals.launches:.1%} hit by a slow phase, "
          f"{totals.flagged / totals.launches:.1%} flagged; "
          f"{totals.hit_counted / max(totals.hit, 1):.0%} of the hit launches counted in a verdict (unflagged, or "
          f"re-runs spent)")
    print("# targets (PASS: every row's rate on the target's side; a MISS row '(within noise)' when its Wilson "
          "95% interval still holds the target):")
    right = "prior learned right or none"
    print(check(f"at-threshold pass <= 5%, {right}", checks["threshold_pass"], TARGETS["threshold_pass"], True))
    print(check(f"A/A false fail <= 1% per gate, {right}", checks["aa_fail"], TARGETS["aa_fail"], True))
    if checks["aa_pass"]:
        print(check(f"round SD <= 2%, learned noise: A/A pass >= 95% by {args.max_repeats} counted rounds",
                    checks["aa_pass"], TARGETS["aa_pass"], False))
        print(check(f"round SD <= 2%, learned noise: x1.10 fail >= 95% by {args.max_repeats} counted rounds",
                    checks["slow_fail"], TARGETS["slow_fail"], False))
        print(check(f"  the same within {args.max_repeats} launches per side, re-runs included", slow_within,
                    TARGETS["slow_fail"], False))
    if checks["wrong_threshold_pass"]:
        print(check("wrong prior (x0.5, x2): at-threshold pass <= 5%", checks["wrong_threshold_pass"],
                    TARGETS["threshold_pass"], True))
        print(check("wrong prior (x0.5, x2): A/A false fail <= 1% per gate", checks["wrong_aa_fail"],
                    TARGETS["aa_fail"], True))
    print(f"\n# {nights} nights per cell x {len(cells)} cells in {seconds:.0f} s ({jobs} process(es))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
