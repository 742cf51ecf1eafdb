#!/usr/bin/env python
"""What a parity gate decides at a given launch noise: the plugin's own gate on simulated nights.

    python benchmarks/gate_power.py [--nights 2000] [--noise 0.01,0.02,0.03,0.05,0.07]
                                    [--gates 7] [--repeats 2] [--max-repeats 6] [--seed 1]

The measured nights (nightly_gates.py, nightly_resample.py) say what the gates did on this machine
at its noise that day; this says what they do at any noise, so that a measured night can be read
against it and a team can size its budget (--max-repeats) for its cluster's noise. Every number
comes from the plugin's own decision code: ``SequentialGate`` (its sequential looks, the
family-wise rule over --gates gates, the TOST outcome), ``contrast_interval`` (blocked by round,
the prior, the F-check of tonight's rounds against it); the launches are what is simulated.

Per night, a parity gate "candidate within 5% of the reference" launches both sides once per round,
as ``CompareFixture._launch_until_decided`` does: rounds 1..--repeats, then one more per look until a
look decides or --max-repeats are spent. A launch's log tokens/s is its configuration's true value
plus a normal deviation of sd ``noise`` (the launch-to-launch noise of one configuration, as a
baseline learns it from launch values: its steps' own standard error, 1%, included; the rounds' log
ratio then varies by noise x sqrt(2)). The candidate is:

  A/A         the reference itself                              -> must not fail
  x1.10       every step 10% longer (ratio 0.909)              -> must fail
  threshold   x1.0526 (ratio 0.950, on the threshold)           -> passes at most 5% (the gate's error)
  stalls      20% of steps x1.6 (ratio 0.893), 90 steps a       -> must fail
              launch: the count of stalled steps adds its own
              binomial sd (2.3%) to each candidate launch

Two priors: "learned" (the true noise, on 12 df: a baseline of 3 nights of 3 launches each learns
about that much, per configuration) and "declared" (the plugin's default 2% on 4 df, whatever the
true noise). Prints, per noise and scenario, the share of nights that pass, are inconclusive and
fail, with Wilson 95% intervals, and the launches per side used. Fast (no launch): about a minute.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pytest_fabric.deciding.contrasts import DEFAULT_NOISE, NoisePrior, Verdict  # noqa: E402
from pytest_fabric.deciding.sequential import SequentialGate  # noqa: E402

THRESHOLD = 0.95
STEP_SE = 0.01  # a launch's own standard error of its mean step (the plugin's --step-precision)
STALL_P, STALL_FACTOR, STALL_STEPS = 0.2, 1.6, 90
STALL_MEAN = 1 + STALL_P * (STALL_FACTOR - 1)
# How much the share of stalled steps in one launch of STALL_STEPS steps moves its mean (log).
STALL_SD = math.sqrt(STALL_P * (1 - STALL_P) / STALL_STEPS) * (STALL_FACTOR - 1) / STALL_MEAN
SCENARIOS = {  # name -> (true log ratio candidate / reference, extra sd of each candidate launch, expected)
    "A/A": (0.0, 0.0, "no fail"),
    "x1.10": (-math.log(1.10), 0.0, "fail"),
    "threshold x1.0526": (-math.log(1.0526), 0.0, "pass <= 5%"),
    "stalls 20% x1.6": (-math.log(STALL_MEAN), STALL_SD, "fail"),
}


def launch_effect(rng: random.Random, noise: float) -> float:
    """One launch's deviation from its configuration's value (log): ``noise`` in all, of which its own
    steps' standard error (STEP_SE) is a part, as in the launch values a baseline learns its noise from."""
    return rng.gauss(0.0, math.sqrt(max(noise ** 2 - STEP_SE ** 2, 0.0))) + rng.gauss(0.0, STEP_SE)


def night(rng: random.Random, effect: float, extra: float, noise: float, prior: NoisePrior,
          gates: int, repeats: int, max_repeats: int) -> tuple[Verdict, int]:
    """One gate's night: its verdict and the launches per side it took."""
    gate = SequentialGate(THRESHOLD, ">=", start=repeats, budget=max_repeats, prior=prior, family=gates)
    reference, candidate = [], []
    while True:
        reference.append((launch_effect(rng, noise), STEP_SE ** 2, 0.0))
        candidate.append((effect + launch_effect(rng, noise) + rng.gauss(0.0, extra), STEP_SE ** 2, 0.0))
        spent = len(reference) >= max_repeats
        if not spent and len(reference) < repeats:
            continue
        look = gate.look([(-1.0, reference), (+1.0, candidate)], blocked=True, launches=len(reference))
        if look.verdict is not Verdict.INCONCLUSIVE or spent:
            return look.verdict, len(reference)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=2000)
    parser.add_argument("--noise", default="0.01,0.02,0.03,0.05,0.07",
                        help="launch-to-launch noise of one configuration (sd of its log value), comma-separated")
    parser.add_argument("--gates", type=int, default=7, help="gates a night (the family-wise rule's m)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-repeats", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        levels = [float(x) for x in args.noise.split(",")]
    except ValueError:
        parser.error(f"--noise takes fractions separated by commas (e.g. 0.02,0.05), got {args.noise!r}")
    if not all(0 < x < 1 for x in levels) or args.nights < 1 or not 1 <= args.repeats <= args.max_repeats:
        parser.error("--noise fractions in (0, 1), --nights >= 1, 1 <= --repeats <= --max-repeats")
    rng = random.Random(args.seed)
    start = time.monotonic()
    print(f"# {args.nights} simulated nights per row; parity gate within {1 - THRESHOLD:.0%}, launches "
          f"{args.repeats}..{args.max_repeats} per side, failures judged over {args.gates} gates (Bonferroni)")
    print(f"# noise: launch-to-launch sd of one configuration (a round's ratio varies by noise x 1.41); "
          f"stalls add {STALL_SD:.1%} per candidate launch")
    print("| noise | prior | candidate | expected | pass | inconclusive | fail | pass rate [95%] | "
          "fail rate [95%] | launches per side (median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for noise in levels:
        priors = {"learned": NoisePrior(noise, 12.0, "learned", nights=3), "declared": DEFAULT_NOISE}
        for prior_name, prior in priors.items():
            for name, (effect, extra, expected) in SCENARIOS.items():
                counts = {v: 0 for v in Verdict}
                spent = []
                for _ in range(args.nights):
                    verdict, launches = night(rng, effect, extra, noise, prior, args.gates, args.repeats,
                                              args.max_repeats)
                    counts[verdict] += 1
                    spent.append(launches)
                n, passed, failed = args.nights, counts[Verdict.PASS], counts[Verdict.FAIL]
                lo_p, hi_p = wilson(passed, n)
                lo_f, hi_f = wilson(failed, n)
                print(f"| {noise:.0%} | {prior_name} | {name} | {expected} | {passed} | "
                      f"{counts[Verdict.INCONCLUSIVE]} | {failed} | {passed / n:.1%} [{lo_p:.1%}, {hi_p:.1%}] | "
                      f"{failed / n:.1%} [{lo_f:.1%}, {hi_f:.1%}] | {sorted(spent)[n // 2]} |", flush=True)
    print(f"\n# {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
