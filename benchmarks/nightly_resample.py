#!/usr/bin/env python
"""The gates' error rates from many nights: real launches pooled once, nights resampled from them.

    python benchmarks/nightly_resample.py --out DIR [--pool-sessions 3] [--pool-launches 4] [--rounds R]
                                          [--nights 200] [--seed 1] --baseline FILE

Ten real nights (`benchmarks/nightly_gates.py`) take ~100 minutes here and bound a rate only to
[0%, 31%] when nothing fails. This benchmark measures the same configurations as the nightly gates
(the same `ib` copies and planted faults: a copy of ib, x1.10 slowdowns, 20% of steps stalling x1.6,
x1.0526 at the parity threshold) in a few real pytest sessions of the throughput suite
(--throughput-launches, the planted faults in PYTEST_FABRIC_FAULT, every launch over the same fixed
window), then resamples nights from that pool:

  a night draws, for every configuration, its launches (without replacement) from the pool's,
  writes them into a store under their keys, and runs the nightly gates' pytest command on it with
  `-p replay_plugin`, which makes the session judge that store instead of launching. Every verdict
  is the plugin's own: paired rounds (a disturbed round re-run from the store's next launch), the
  noise, the sequential looks, the family-wise rule over the night's gates.

What resampling leaves out, and which way it leans: a round's two launches are not back to back, so
the machine's drift within a pool session is noise the blocked contrast would have cancelled (more
inconclusive, not more wrong); night-to-night variation of the machine enters only through the
baseline (--baseline: nights measured on other sessions, never the pool, so a regression A/A is not
judged against its own launches); and the nights share launches, so their outcomes are not
independent: the intervals of the rates below treat them as independent and are too narrow by an
unknown factor (the pool's size, not the number of nights, bounds what is learned).
A pool session measures each configuration's launches back to back (--throughput-launches), so a
slow phase of the machine that lasts minutes lands on one configuration and reads as its effect.
On 2026-11-26 from 09:15 this VM's speed wobbled: in both pool sessions the configurations measured
first (ib6, planted x1.0526, and ib5, stalls) came out 0.79 and 0.81 of ib, against 0.95 and 0.89
measured at 06:00, and their gates' resampled rates were no error rates. Check the pool's own ratios
(its configurations' values over ib's, printed at the end) against the plants before reading the
table: where they are off, the pool is, not the gate.

--rounds R measures the pool as the gates measure a night, round by round: R sessions of the
nightly gates' own pytest command (against --baseline), session r with --repeats r --max-repeats r
and rounds 0..r-2 in its resume file, so each adds round r-1 of every comparison under the gates'
own policy: the first side alternating by round, the suite's order rotated by round. A night then
takes the rounds in one drawn order, the same for every configuration: the launches the gates pair
(reference and candidate, a regression's n1 and n2) were measured minutes apart, as in a real night.
R rounds give R!/(R-6)! orders of the six launches a side may take, far fewer distinct nights than
200 for small R: read the table's intervals as the nights', not the machine's.
Needs root for the pool sessions. Run alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nightly_gates import FABRICS, NIGHTLY, PLANTS, REPO, SELECT, gates_of, night, print_table  # noqa: E402

from pytest_fabric.measuring.measurement import LaunchKey  # noqa: E402

HERE = Path(__file__).resolve().parent
# Every configuration a nightly gate judges: qwen2-tiny n2 ib and its parity candidates; llama-wide
# n1 (the regression gate's one-node term) and n2 ib with the regression plants.
POOL = ["suites/test_throughput.py", "--models", "qwen2-tiny,llama-wide",
        "-k", "(llama and (n1-ib] or n2-ib] or n2-ib4] or n2-ib7])) or "
              "(qwen2 and (n2-ib] or n2-ib2] or n2-ib3] or n2-ib5] or n2-ib6]))"]
ALL_GATES = " or ".join(SELECT.values())


def pool(out: Path, sessions: int, launches: int, resume: bool) -> dict[str, list[dict]]:
    """Run (or reuse) the pool sessions; their launches by configuration key (every launch measured
    the same window, so they are exchangeable).
    Every configuration is measured in every session: a pool that mixed one configuration's new
    launches with another's older ones would read the machine's drift between them as an effect
    (this machine ran 23% slower two hours after the first pool)."""
    by_key: dict[str, list[dict]] = {}
    for k in range(1, sessions + 1):
        wall = night(f"pool{k}", out, [*POOL, *FABRICS, "--throughput-launches", str(launches)], PLANTS, resume)
        print(f"pool session {k}: {wall:.0f}s", flush=True)
        records = json.loads((out / f"pool{k}.json").read_text())["records"]
        for key, record in records.items():
            if "result" not in record:
                continue
            by_key.setdefault(LaunchKey.parse(key).base, []).append(record)
    return by_key


def rotated(argv: list[str], r: int) -> list[str]:
    """``argv`` with its --models and --fabrics lists rotated by round ``r``: the suite launches in
    their order, so each configuration takes every place in a round in turn (the first round of
    2026-11-26's pool kept one order, and the configuration launched first in each session came
    out 5% slower than its plant)."""
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("--models", "--fabrics"):
            items = out[i + 1].split(",")
            k = (r - 1) % len(items)
            out[i + 1] = ",".join(items[k:] + items[:k])
    return out


def baseline_args(baseline: Path | None) -> list[str]:
    """--fabric-baseline where one is given (the regression gates need it; parity gates do not)."""
    return [f"--fabric-baseline={baseline}"] if baseline is not None else []


def pool_in_rounds(out: Path, rounds: int, resume: bool, baseline: Path | None, select: str) -> dict[str, dict]:
    """Run (or reuse) ``rounds`` sessions of the nightly gates' own pytest command that each add one
    round: session r runs every gate with ``--repeats r --max-repeats r`` and finds rounds 0..r-2 in
    its resume file (the store's own resume, written here from session r-1's saved night), so it
    measures round r-1 of every comparison exactly as a night's round r-1 is measured: which side
    launches first alternating by round, a disturbed round re-run. The suite's order is
    rotated by round (``rotated``), so a slow phase of the machine lands on one round of every
    configuration, not on one configuration. Returns the store's records of every round by key."""
    from pytest_fabric.measuring.store import _resume_identity, resume_path

    records: dict[str, dict] = {}
    for r in range(1, rounds + 1):
        save = out / f"round{r}.json"
        if not (resume and (out / f"round{r}.xml").exists()):
            if records:
                # The identity the session will check: its faults are the plants (night() sets them).
                identity = {**_resume_identity(), "faults": PLANTS}
                resume_path(save).write_text(json.dumps({"identity": identity, "records": records}))
            # One launch of every configuration per round: no re-run in the pool (a replayed night
            # re-runs a disturbed round from the pool's other rounds, as a night would launch again).
            argv = [*rotated(NIGHTLY, r), "-k", select, *rotated(FABRICS, r), "--repeats", str(r),
                    "--max-repeats", str(r), "--reruns", "0", *baseline_args(baseline)]
            wall = night(f"round{r}", out, argv, PLANTS)
            print(f"round {r}: {wall:.0f}s", flush=True)
        saved_records = json.loads(save.read_text())["records"]
        missing = [key for key in records if key not in saved_records]
        if missing:
            raise SystemExit(f"round {r} did not reuse the earlier rounds' launches {missing[:3]}: see round{r}.log")
        records = {key: record for key, record in saved_records.items() if "result" in record}
    short = {base: len(launches) for base, launches in round_launches(records).items() if len(launches) != rounds}
    if short:
        raise SystemExit(f"configurations without a launch in every round (a failed launch): {short}")
    return records


def round_launches(records: dict[str, dict]) -> dict[str, list[dict]]:
    """Each configuration's launch of each round, in round order: the round's own launch, not one
    measured again for a later comparison of the round (``+partners``), where it has one."""
    chosen: dict[tuple[str, int], tuple[bool, str]] = {}
    for key in records:
        parsed = LaunchKey.parse(key)
        slot, rank = (parsed.base, parsed.number), (not parsed.block, key)
        if slot not in chosen or rank > chosen[slot]:
            chosen[slot] = rank
    by_key: dict[str, list[dict]] = {}
    for (base, _), (*_, key) in sorted(chosen.items()):
        by_key.setdefault(base, []).append(records[key])
    return by_key


def night_store(records: dict[str, dict], order: Sequence[int]) -> dict[str, dict]:
    """The store of a night that takes the pool's rounds in ``order`` (``order[j]``: the pool round
    its round j was measured in): every launch of a round, ones measured again for a later
    comparison (``+partners``) included, under the round's new number; rounds not drawn are left out."""
    position = {r: j for j, r in enumerate(order)}
    store = {}
    for key, record in records.items():
        parsed = LaunchKey.parse(key)
        if parsed.number in position:
            store[str(replace(parsed, number=position[parsed.number]))] = record
    return store


def resampled_night(i: int, out: Path, by_key: dict[str, list[dict]], rng: random.Random,
                    baseline: Path | None, select: str, by_round: dict[str, dict] | None = None) -> list[dict]:
    """One night drawn from the pool, judged by the plugin; its gates' rows. From a pool in rounds
    (``by_round``): the rounds in one order drawn for the night and shared by every configuration,
    so that a night's launches that the gates pair (a round's reference and candidate, a
    regression's n1 and n2) were measured together."""
    directory = out / "replay" / f"night{i}"
    directory.mkdir(parents=True, exist_ok=True)
    store = {}
    if by_round is not None:
        rounds = len(next(iter(round_launches(by_round).values())))
        store = night_store(by_round, rng.sample(range(rounds), rounds))
    for base, drawn in by_key.items():
        for j, record in enumerate(rng.sample(drawn, len(drawn))):
            store[base + (f"@{j}" if j else "")] = record
    (directory / "measurements.json").write_text(json.dumps(store))
    junit = directory / "junit.xml"
    env = {**os.environ, "FABRIC_REPLAY_DIR": str(directory), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH", "")])), "PYTEST_FABRIC_FAULT": PLANTS}
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "replay_plugin", "-q", "-rA",
           "--nodes", "2", f"--junitxml={junit}", *NIGHTLY, "-k", select, *FABRICS, *baseline_args(baseline)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    (directory / "log.txt").write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    if not junit.exists() or "ReplayMissing" in proc.stdout:
        raise SystemExit(f"night {i}: the replay did not judge its store (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}")
    return [{"night": f"replay{i}", **g} for g in gates_of(junit, "nightly")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="nightly-resample", help="directory for the pool, the replayed nights, logs")
    parser.add_argument("--pool-sessions", type=int, default=3, help="real pytest sessions measuring the pool")
    parser.add_argument("--pool-launches", type=int, default=4, help="launches of each configuration per session")
    parser.add_argument("--rounds", type=int, default=0,
                        help="measure the pool in this many rounds instead (one launch of every configuration per "
                             "session, round by round as the gates take them); nights resample whole rounds")
    parser.add_argument("--nights", type=int, default=200, help="nights resampled from the pool")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--baseline", help="a baseline merged from other sessions' nights (nightly_gates.py's "
                                           "baseline.json); needed where regression gates are judged")
    parser.add_argument("--only", choices=sorted(SELECT), help="judge only these gates (default: all of them)")
    parser.add_argument("--resume", action="store_true", help="reuse the pool sessions already in --out")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    baseline = Path(args.baseline).resolve() if args.baseline else None
    select = SELECT[args.only] if args.only else ALL_GATES
    if baseline is None and "regression" in select:
        parser.error("the regression gates need --baseline (or --only parity, --only verdicts)")
    by_round = pool_in_rounds(out, args.rounds, args.resume, baseline, select) if args.rounds else None
    by_key = {} if by_round else pool(out, args.pool_sessions, args.pool_launches, args.resume)
    drawn_pool = round_launches(by_round) if by_round else by_key
    if by_round:
        print(f"pool in {args.rounds} rounds: {len(drawn_pool)} configurations, one launch of each "
              f"per round ({len(by_round)} launches)", flush=True)
    for base, drawn in sorted(by_key.items()):
        print(f"pool {base}: {len(drawn)} launches", flush=True)
    rng = random.Random(args.seed)
    rows = []
    start = time.monotonic()
    for i in range(1, args.nights + 1):
        rows += resampled_night(i, out, by_key, rng, baseline, select, by_round)
        if i % 10 == 0:
            print(f"{i} nights resampled ({time.monotonic() - start:.0f}s)", flush=True)
    (out / "replay-rows.json").write_text(json.dumps(rows, indent=1))
    drawn_from = (f"{args.rounds} rounds of one launch of each configuration" if by_round else
                  f"{args.pool_sessions} pool sessions x {args.pool_launches} launches of each configuration")
    print(f"\n{args.nights} nights resampled from {drawn_from} (seed {args.seed}); s per verdict: judging only, "
          f"no launch")
    ok = print_table(rows, aa_max=0.05, planted_min=0.9)
    print("\nthe pool's own ratios (tokens/s over the same model's n2 ib, over all its launches; set the "
          "plants against them before reading the table):")
    for line in pool_ratios(drawn_pool):
        print(f"  {line}")
    if by_round:
        print("\nthe pool's rounds as the gates pair them (each round's ratio; its spread is the noise "
              "the gates judge against):")
        for line in round_noise(by_round):
            print(f"  {line}")
    return 0 if ok else 1


def pool_ratios(by_key: dict[str, list[dict]]) -> list[str]:
    """Each multi-node configuration's value over its model's n2 ib value, the number the gates show
    (``configuration_tokens_per_s``), from all of the pool's launches."""
    from pytest_fabric.measuring.measurement import LaunchRecord, Measurement, configuration_tokens_per_s

    values = {}
    for key, drawn in by_key.items():
        records = [LaunchRecord.from_dict(r) for r in drawn]
        values[key.partition("#")[0]] = configuration_tokens_per_s([Measurement.from_record(r.case, r) for r in records])
    lines = []
    for name, value in sorted(values.items()):
        model, _, fabric = name.rpartition("-")
        reference = values.get(f"{model}-ib")
        if model.endswith("-n2") and fabric != "ib" and reference:
            lines.append(f"{name}: {value / reference:.3f}")
    return lines


def _value(record: dict) -> float:
    from pytest_fabric.measuring.measurement import LaunchRecord, Measurement

    launch = LaunchRecord.from_dict(record)
    return Measurement.from_record(launch.case, launch).tokens_per_s


def round_pairs(records: dict[str, dict]) -> dict[tuple[str, str], list[float]]:
    """The pool's rounds as its gates pair them: every n2 configuration with its model's n2 ib (the
    parity pairs) and with its model's one-node launch (the regression pairs), per round the ratio
    of their tokens/s. A side measured again for that comparison (``+partners``) is the one the
    round used."""
    bases = {LaunchKey.parse(key).base: key.partition("#")[0] for key in records}
    by_name = {name: base for base, name in bases.items()}
    rounds = sorted({LaunchKey.parse(key).number for key in records})
    pairs: dict[tuple[str, str], list[float]] = {}
    for base, name in sorted(bases.items()):
        model, _, fabric = name.rpartition("-n2-")
        for reference in (f"{model}-n2-ib", f"{model}-n1-any") if model else ():
            ref_base = by_name.get(reference)
            if ref_base is None or reference == name:
                continue
            for k in rounds:
                sides = []
                for mine, partner in ((base, ref_base), (ref_base, base)):
                    side = LaunchKey(mine, k)
                    again = str(replace(side, block=bases[partner]))
                    sides.append(again if again in records else str(side))
                if all(side in records for side in sides):
                    pairs.setdefault((name, reference), []).append(_value(records[sides[0]]) / _value(records[sides[1]]))
    return pairs


def round_noise(records: dict[str, dict]) -> list[str]:
    """Per pair of ``round_pairs``: the ratio over the rounds (geometric mean), and how much it
    varies from round to round (the standard deviation of its log): the noise the gates judge
    against, paired as they pair it."""
    lines = []
    for (candidate, reference), ratios in sorted(round_pairs(records).items()):
        logs = [math.log(ratio) for ratio in ratios]
        spread = f", varies {statistics.stdev(logs):.1%} between rounds" if len(logs) > 1 else ""
        lines.append(f"{candidate} over {reference}: {math.exp(statistics.fmean(logs)):.3f} over {len(logs)} "
                     f"rounds{spread}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
