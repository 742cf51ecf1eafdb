#!/usr/bin/env python
"""Where the noise is: variance at each level of saved nights (steps, launches, rounds, nights).

    python benchmarks/noise_levels.py NIGHT.json [NIGHT.json ...]

Reads `--fabric-save` files (their raw records) and prints, per configuration (model, nodes,
fabric) and pooled over the nights:

  steps     the spread of log step times within a launch (steady, clean steps)
  within    a launch value's own standard error (measurement.launch_value)
  launches  the spread of launch values of one configuration within a night
  rounds    for each pair of configurations launched in the same rounds (ib / ib2 ...), the spread
            of the per-round log ratio: what a blocked comparison sees
  nights    the spread of the configuration's value (geometric mean of its launches) across nights

Kalibera & Jones: spend repetitions at the level that varies most. All figures are standard
deviations of natural logs, in percent (about the relative spread).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_fabric.measuring.measurement import launch_number, launch_value  # noqa: E402
from pytest_fabric.deciding.contrasts import configuration_value, pooled_noise  # noqa: E402
from pytest_fabric.deciding.steps import steady_window  # noqa: E402
from pytest_fabric.workload.result import TrainResult  # noqa: E402


def launches_of(path: Path) -> dict[str, dict[int, dict]]:
    """config id -> launch index -> {"value", "se", "steps_sd"} for one saved night."""
    out: dict[str, dict[int, dict]] = {}
    for key, record in json.loads(path.read_text()).get("records", {}).items():
        r = record.get("result")
        if not r or record["case"]["model"] == "collectives":
            continue
        config, index = key.partition("#")[0], launch_number(key)
        est = launch_value(TrainResult.from_dict(r, key))
        steady = [math.log(t) for t in steady_window(r["step_s"])]
        out.setdefault(config, {})[index] = {
            "value": math.log(est.step_s), "se": est.log_se, "aside": bool(est.disturbed),
            "steps_sd": statistics.stdev(steady) if len(steady) > 1 else 0.0}
    return out


def pct(x: float) -> str:
    return f"{x * 100:5.2f}%"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("nights", nargs="+", type=Path)
    args = parser.parse_args(argv)
    nights = [launches_of(p) for p in args.nights]
    configs = sorted({c for n in nights for c in n})
    print(f"{len(nights)} night(s); standard deviations of log values (about the relative spread)\n")
    print(f"{'configuration':28s} {'steps':>7s} {'within':>7s} {'launches':>9s} {'df':>4s} {'nights':>7s} {'n':>3s}")
    for config in configs:
        per_night = [n[config] for n in nights if config in n]
        launches = [v for night in per_night for v in night.values()]
        steps = statistics.fmean(v["steps_sd"] for v in launches)
        within = math.sqrt(statistics.fmean(v["se"] ** 2 for v in launches))
        s2, df = pooled_noise([[v["value"] for v in night.values() if not v["aside"]] for night in per_night])
        values = [-math.log(configuration_value([math.exp(-v["value"]) for v in night.values()])) for night in per_night]
        between = statistics.stdev(values) if len(values) > 1 else float("nan")
        print(f"{config:28s} {pct(steps):>7s} {pct(within):>7s} {pct(math.sqrt(s2)):>9s} {df:4d} {pct(between):>7s} "
              f"{len(per_night):3d}")
    print("\nrounds: per-round log ratio of two configurations launched in the same rounds (blocked)")
    for a in configs:
        for b in configs:
            if a >= b or a.rsplit("-", 1)[0] != b.rsplit("-", 1)[0]:
                continue
            diffs = [[night[a][i]["value"] - night[b][i]["value"] for i in sorted(set(night[a]) & set(night[b]))
                      if not (night[a][i]["aside"] or night[b][i]["aside"])]
                     for night in nights if a in night and b in night]
            s2, df = pooled_noise(diffs)
            if df:
                pooled_a, _ = pooled_noise([[v["value"] for v in n[a].values()] for n in nights if a in n])
                pooled_b, _ = pooled_noise([[v["value"] for v in n[b].values()] for n in nights if b in n])
                print(f"  {a} / {b}: round-to-round {pct(math.sqrt(s2))} ({df} df); unblocked the same difference "
                      f"would vary {pct(math.sqrt(pooled_a + pooled_b))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
