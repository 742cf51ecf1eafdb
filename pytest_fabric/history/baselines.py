"""Baselines: several saved nights combined, an outlier night dropped, and what the regression
gates take from them (each case's value per night, the launch noise learned per configuration).

``pytest-fabric baseline`` builds one (``build_baseline``) from nights (``nights.py``); the
regression gates read it through ``Baseline.load`` (--fabric-baseline).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .night_model import ResultsError, SavedRun
from .launch_time import wall_times
from .night_files import _parse_json, _read_text, _validated_baseline, load_records, load_results
from .nights import BASELINE_FORMAT, FORMAT_VERSION, _now, _write_json_atomically
from .setups import identity_mismatch
from ..deciding.across_nights import RobustCenter, robust_baseline
from ..deciding.contrasts import NoisePrior, pooled_noise
from ..deciding.regression import BaselineTerms

__all__ = ["MIN_LEARNED_NOISE", "Baseline", "baseline_for", "baseline_nights", "baseline_noise", "build_baseline",
           "launch_costs", "launch_noise", "load_baseline", "night_labels", "save_baseline"]


def build_baseline(runs: Sequence[SavedRun], launch_costs: Mapping[str, Sequence[float]] | None = None
                   ) -> dict[str, Any]:
    """Per case, the robust center of the nights' mean tokens/s (``across_nights.robust_baseline``).

    Each night contributes one value per case (``CaseResult.mean`` of its counted launches); a night that is an
    outlier among the others is dropped and named in ``nights``. ``warnings`` lists set-up
    differences between the latest night and each earlier one. ``launch_costs``: each launched
    configuration's launch wall times in those nights (``launch_time.wall_times``), kept so that a
    later night's plan prices its launches from this cluster's (--fabric-baseline).
    """
    if not runs:
        raise ValueError("a baseline needs at least one night")
    labels = night_labels(runs)
    cases: dict[str, Any] = {}
    for cid in sorted({cid for run in runs for cid in run.cases}):
        nights = [(label, run.cases[cid]) for label, run in zip(labels, runs) if cid in run.cases]
        values = [c.mean for _, c in nights]
        b = robust_baseline(values)
        latest = nights[-1][1]
        dropped = list(b.dropped)
        marked = []
        for (label, c), value in zip(nights, values):
            kept = value not in dropped
            if not kept:
                dropped.remove(value)
            # Launches behind the nightly value: what the night-to-night variance is told apart by.
            marked.append({"night": label, "tokens_per_s": value, "kept": kept,
                           "launches": len(c.counted_tokens_per_s)})
        cases[cid] = {"model": latest.model, "nodes": latest.nodes, "fabric": latest.fabric, "gpus": latest.gpus,
                      "center": b.center, "spread": b.spread, "kept": len(b.kept), "dropped": len(b.dropped),
                      "nights": marked}
    latest = runs[-1]
    noise = launch_noise(runs)
    warnings = [f"{labels[i]}: {line}" for i, run in enumerate(runs[:-1])
                for line in identity_mismatch(run.identity, latest.identity, (labels[i], labels[-1]))]
    return {"format": BASELINE_FORMAT, "version": FORMAT_VERSION, "created": _now(), "cases": cases,
            "identities": [run.identity for run in runs], "nights": labels,
            "launch_noise": noise,
            "launch_costs": {cid: [round(t, 2) for t in times] for cid, times in sorted((launch_costs or {}).items())},
            "sources": [str(run.source) if run.source else None for run in runs], "warnings": warnings}


def night_labels(runs: Sequence[SavedRun]) -> list[str]:
    """Each run's label, the file name added where two runs would read alike."""
    labels = [run.label for run in runs]
    return [f"{label} ({run.source.parent.name}/{run.source.name})" if labels.count(label) > 1 and run.source
            else label for label, run in zip(labels, runs)]


def save_baseline(path: Path | str, baseline: Mapping[str, Any]) -> None:
    _write_json_atomically(Path(path), dict(baseline))


def load_baseline(path: Path | str) -> dict[str, Any]:
    """A baseline written by ``save_baseline``; ResultsError for anything else."""
    path = Path(path)
    data = _parse_json(_read_text(path), path)
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ResultsError(f"{path}: not a pytest-fabric baseline (format {found!r}); expected "
                           f"\"format\": \"{BASELINE_FORMAT}\", as written by `pytest-fabric baseline`")
    return _validated_baseline(data, path)


def launch_costs(path: Path | str) -> dict[str, list[float]]:
    """The launch wall times ``path`` holds per launched configuration (``launch_time.wall_times``): a
    saved night's or a session store's launch records, the link test's too, or those a built baseline
    kept ({} where it kept none); ResultsError where it is none of these (JUnit keeps no launch times)."""
    try:
        return wall_times(load_records(path, links=True))
    except ResultsError:
        costs = load_baseline(path).get("launch_costs") or {}
        return {str(cid): [float(t) for t in times] for cid, times in costs.items()}


def baseline_for(baseline: Mapping[str, Any], case_id: str) -> RobustCenter | None:
    """The ``across_nights.RobustCenter`` of one case (tokens/s), or None when the baseline never measured it."""
    c = baseline.get("cases", {}).get(case_id)
    if c is None:
        return None
    nights = c.get("nights", [])
    return RobustCenter(float(c["center"]), float(c["spread"]),
                        tuple(n["tokens_per_s"] for n in nights if n.get("kept", True)),
                        tuple(n["tokens_per_s"] for n in nights if not n.get("kept", True)))


def baseline_nights(baseline: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """Each case's kept value per night of a built baseline: case id -> {night label: tokens/s}."""
    out: dict[str, dict[str, float]] = {}
    for cid, c in baseline.get("cases", {}).items():
        out[cid] = {str(n["night"]): float(n["tokens_per_s"]) for n in c.get("nights", [])
                    if n.get("kept", True) and "night" in n and "tokens_per_s" in n}
    return out


def launch_noise(runs: Sequence[SavedRun]) -> dict[str, Any] | None:
    """Launch-to-launch variation learned from nights: the pooled standard deviation of log tokens/s
    between launches of one configuration in one night (``contrasts.pooled_noise``), with its degrees
    of freedom, over the multi-node configurations, and per configuration (``cases``: one node
    included, since a scaling-efficiency gate leans on it); None when no night launched any
    configuration twice. Noise differs by configuration (here 0.9% for a communication-bound
    model, 3.3% for a compute-bound one), so a gate takes its own configurations' where known."""
    per_case: dict[str, list[list[float]]] = {}
    for run in runs:
        for cid, c in run.cases.items():
            if len(c.counted_tokens_per_s) >= 2:
                per_case.setdefault(cid, []).append([math.log(v) for v in c.counted_tokens_per_s])
    contributing = [run for run in runs
                    if any(c.nodes > 1 and len(c.counted_tokens_per_s) >= 2 for c in run.cases.values())]
    groups = [[math.log(v) for v in c.counted_tokens_per_s] for run in contributing for c in run.cases.values()
              if c.nodes > 1 and len(c.counted_tokens_per_s) >= 2]
    variance, df = pooled_noise(groups)
    cases = {}
    for cid, case_groups in sorted(per_case.items()):
        v, d = pooled_noise(case_groups)
        cases[cid] = {"sigma": math.sqrt(v), "df": d, "nights": len(case_groups)}
    if not df and not cases:
        return None
    out: dict[str, Any] = {"cases": cases}
    if df:
        out.update({"sigma": math.sqrt(variance), "df": df, "nights": len(contributing)})
    return out


# A learned noise never counts as less than this (nights whose launches agreed by chance must not
# make tomorrow's gates over-confident) nor more than 0.5 (beyond it the log-normal picture fails).
MIN_LEARNED_NOISE = 0.005


def baseline_noise(baseline: Mapping[str, Any], case_ids: Sequence[str] = ()) -> NoisePrior | None:
    """The launch noise a built baseline learned (``launch_noise``) as the gates' prior, or None:
    pooled over ``case_ids`` where the baseline learned any of them, else over all multi-node
    configurations."""
    noise = baseline.get("launch_noise")
    if not isinstance(noise, dict):
        return None
    learned = noise.get("cases") if isinstance(noise.get("cases"), dict) else {}
    wanted = list(dict.fromkeys(case_ids))
    mine = [learned[cid] for cid in wanted if isinstance(learned.get(cid), dict)]
    try:
        if mine:
            df = sum(float(c["df"]) for c in mine)
            sigma = math.sqrt(sum(float(c["df"]) * float(c["sigma"]) ** 2 for c in mine) / df) if df > 0 else math.nan
            nights = max(int(c.get("nights", 0)) for c in mine)
            what = "these configurations' launches"
            # Nights of *these* configurations (what one launch per side may decide on,
            # contrasts.MIN_LEARNED_NIGHTS): the fewest any of them was learned from, 0 where one was not.
            covered = min(int(c.get("nights", 0)) for c in mine) if len(mine) == len(wanted) else 0
            if len(mine) < len(wanted):
                what = f"{len(mine)} of these {len(wanted)} configurations' launches"
        else:
            sigma, df = float(noise["sigma"]), float(noise["df"])
            nights, what, covered = noise.get("nights", "?"), "all configurations' launches", 0
    except (KeyError, TypeError, ValueError):
        return None
    if not (df > 0 and math.isfinite(sigma)):
        return None
    return NoisePrior(min(max(sigma, MIN_LEARNED_NOISE), 0.5), df, f"learned from {nights} nights of {what}",
                      nights=covered)


@dataclass(frozen=True)
class Baseline:
    """What --fabric-baseline gives the regression gates: last nights' tokens/s per case id (one value
    per kept night, or per launch of a single saved night), GPUs per case, the launch noise learned
    from the nights, and what they ran on."""

    path: str
    values: dict[str, list[float]]
    gpus: dict[str, int]
    identity: dict
    learned_noise: dict | None = None  # the built baseline's ``launch_noise``, as stored
    # A built baseline's kept value of each case per night (night label -> tokens/s).
    nights: dict[str, dict[str, float]] = field(default_factory=dict)
    # Launches behind each case's nightly values (their harmonic mean); absent: one value per launch.
    launches: dict[str, float] = field(default_factory=dict)

    def per_night(self, case_id: str) -> float:
        """How many launches each of ``case_id``'s values rests on (``contrasts.reference_term``)."""
        return self.launches.get(case_id, 1.0)

    def paired(self, a: str, b: str) -> list[tuple[float, float]]:
        """(a, b) tokens/s of each night of a built baseline that kept a value of both."""
        mine, theirs = self.nights.get(a, {}), self.nights.get(b, {})
        return [(mine[night], theirs[night]) for night in mine if night in theirs]

    def terms(self, case_id: str, one_id: str) -> BaselineTerms:
        """What the baseline says of ``case_id`` and of its one-node configuration ``one_id``: the
        regression gate's reference terms."""
        gpus_n, gpus_1 = self.gpus.get(case_id, 1), self.gpus.get(one_id, 1)
        return BaselineTerms(self.values[case_id], self.values.get(one_id) or [], gpus_n, gpus_1,
                             [(math.log(n / gpus_n), math.log(one / gpus_1)) for n, one in self.paired(case_id, one_id)],
                             self.per_night(case_id), self.per_night(one_id))

    def noise(self, case_ids: Sequence[str] = ()) -> NoisePrior | None:
        """The launch noise the baseline learned for ``case_ids`` (else over all its multi-node
        configurations), or None."""
        return baseline_noise({"launch_noise": self.learned_noise}, case_ids)

    @classmethod
    def load(cls, path: str) -> Baseline:
        run = load_results(path)
        learned, nights, launches = None, {}, {}
        if run.kind == "baseline":
            # A built baseline keeps one value per kept night: those are its samples.
            data = load_baseline(path)
            values = {cid: list(b.kept) for cid in run.cases if (b := baseline_for(data, cid)) is not None}
            learned = data.get("launch_noise") if isinstance(data.get("launch_noise"), dict) else None
            nights = baseline_nights(data)
            launches = _launches_per_night(data)
        else:
            values = run.measurements
        return cls(str(path), {cid: v for cid, v in values.items() if v},
                   {cid: c.gpus for cid, c in run.cases.items()}, dict(run.identity), learned, nights, launches)


def _launches_per_night(baseline: Mapping[str, Any]) -> dict[str, float]:
    """Each case's launches per kept night (harmonic mean: the mean's variance goes as its 1 / n),
    where the baseline recorded them."""
    out: dict[str, float] = {}
    for cid, c in baseline.get("cases", {}).items():
        counts = [n["launches"] for n in c.get("nights", []) if n.get("kept", True)
                  and isinstance(n.get("launches"), int) and n["launches"] > 0]
        if counts:
            out[cid] = len(counts) / sum(1 / k for k in counts)
    return out
