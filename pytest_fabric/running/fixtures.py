"""The objects behind the ``fabric_measure``, ``fabric_compare`` and ``fabric_link_rate`` fixtures.

``MeasureFixture`` launches a configuration (or serves it from the session's cache) and refuses a
result that is not of the fabric asked for: a failed launch, a wrong transport, a step faster than
the link can carry. ``CompareFixture`` decides the gates (``within``, ``ahead``, ``no_regression``)
on paired rounds of launches (``rounds.run_rounds``) with sequential intervals (``deciding/sequential.py``), and
records each verdict with its prediction and floor for the reporter.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from ..core.case import Case
from ..deciding.gates import DEFAULT_AHEAD, DEFAULT_WITHIN, GateOutcome, apply_verdict
from ..deciding.rounds import Rounds, run_rounds
from ..physics.hostbound import host_bound
from ..measuring.measurement import BandwidthMeasurement, Measurement, MeasurementError, configuration_tokens_per_s
from ..history.setups import identity_from_records, identity_mismatch
from ..measuring.link_rate import LinkRate, missing_rate
from . import plan
from .session import ERRORED_KEY, MEASURED_KEY, NOTES_KEY, OUTCOMES_KEY, FabricSession
from ..deciding.contrasts import (Interval, NoisePrior, Verdict, ahead_gate, configuration_value, contrast_interval, fabric_time_sample, within_gate)
from ..deciding.sequential import SequentialGate
from ..deciding.steps import STALL_MARGIN


class MeasureFixture:
    """``fabric_measure(case)`` -> Measurement: launched once per session, then served from the cache."""

    def __init__(self, session: FabricSession, item: pytest.Item) -> None:
        self._session = session
        self._item = item

    def __call__(self, case: Case, launch: int = 0, partners: Sequence[Case] = ()) -> Measurement:
        """Launch number ``launch`` of ``case``; ``partners``: the configurations a round compares it
        with, next to whose launches it must have run (``Measurer.measure``)."""
        return self._record(lambda: self._session.measurer().measure(case, launch, partners))

    def _record(self, measure):
        """``measure()``'s measurement, checked and recorded."""
        try:
            got = measure()
        except MeasurementError as exc:
            message = f"measurement failed: {exc}"
            self._item.stash[ERRORED_KEY] = True
        else:
            message = None
        if message is not None:  # outside the except: the report shows the launch's failure once, unchained
            pytest.fail(message, pytrace=False)
        self._item.stash.setdefault(MEASURED_KEY, []).append(got)
        if got.result.transport_problem:
            # The numbers are real, but not of the fabric that was asked for.
            pytest.fail(f"wrong transport: {got.result.transport_problem}", pytrace=False)
        impossible = self._session.impossible(got)
        if impossible:
            pytest.fail(f"faster than physically possible: {impossible}", pytrace=False)
        return got

    def bandwidth(self, case: Case) -> BandwidthMeasurement:
        """Collective bandwidth over ``case``'s nodes and fabric (all_reduce, all_gather, reduce_scatter)."""
        return self._record(lambda: self._session.measurer().measure_bandwidth(case))


def link_rate_or_skip(session: FabricSession, name: str) -> LinkRate:
    """Fabric ``name``'s per-node link rate and its source (``FabricSession.link_rate``). Skips the
    test where the cluster has no such link (local processes share one machine) or no rate is known,
    saying how to declare one: a gate held to a guessed rate would judge the guess."""
    cluster = session.prepared_cluster()
    if not cluster.realizes_fabrics:
        pytest.skip(f"the {cluster.name} cluster has no {name} link to compare with")
    rate = session.link_rate(name)
    if rate is None:
        pytest.skip(missing_rate(session.options.settings.fabric(name), cluster.name))
    return rate


class CompareFixture:
    """Gates decided on paired rounds of launches (reference, candidate; candidate, reference; ...).

    ``--repeats`` rounds first, then one round more while the interval of the ratio straddles the
    threshold, up to ``--max-repeats`` rounds (``rounds.run_rounds``; a round with a launch
    disturbed as a whole is launched again, at most ``--reruns`` times a gate). Launches are cached
    per number: a reference measured for one comparison serves another whose round ran next to it,
    and is launched again for a round that runs later (``Measurer.measure``: a round's launches run
    back to back). The interval is ``contrasts.contrast_interval`` of the rounds' log ratios, with the
    noise a --fabric-baseline learned where it has one.
    """

    def __init__(self, measure: MeasureFixture, session: FabricSession, item: pytest.Item) -> None:
        self._measure = measure
        self._session = session
        self._item = item

    def within(self, candidate: Case, reference: Case, rel: float = DEFAULT_WITHIN) -> GateOutcome:
        """``candidate`` is at most ``rel`` slower than ``reference`` (one-sided)."""
        return self._compare(candidate, reference, within_gate(rel), f"{candidate.fabric} at most {rel:.0%} slower",
                             parity=True)

    def ahead(self, reference: Case, candidate: Case, by: float = DEFAULT_AHEAD) -> GateOutcome:
        """``reference`` is at least ``by`` faster than ``candidate`` (one-sided)."""
        return self._compare(reference, candidate, ahead_gate(by), f"{reference.fabric} at least {by:.0%} ahead")

    def _gate(self, threshold: float, direction: str, cases: Sequence[Case],
              prior: NoisePrior | None = None) -> SequentialGate:
        o = self._session.options
        # --night-budget: the most rounds set before the first look (plan.gate_rounds), never during it.
        most, why = plan.gate_rounds(self._session, self._item.nodeid) if o.night_budget else (o.max_repeats, "")
        if why:
            self._item.stash.setdefault(NOTES_KEY, []).append(f"night budget: {why}")
        return SequentialGate(threshold, direction, start=o.repeats, budget=max(o.repeats, most),
                              prior=prior or self._session.noise(cases), family=self._session.family())

    def _budget_note(self, outcome: GateOutcome, rounds: Rounds[Measurement]) -> GateOutcome:
        """An inconclusive gate stopped by the night's budget says what more time would have given."""
        if outcome.verdict is not Verdict.INCONCLUSIVE or not self._session.options.night_budget:
            return outcome
        note = plan.undecided_note(self._session, self._item.nodeid, rounds.launched)
        if not note:
            return outcome
        return replace(outcome, extra="; ".join(filter(None, [outcome.extra, note])))

    def _rounds(self, cases: Sequence[Case], signs: Sequence[float], gate: SequentialGate, per_gpu: bool = False,
                fixed: tuple[float, float] = (0.0, 0.0),
                combine: Callable[[Sequence[Measurement]], tuple[float, float]] | None = None) -> Rounds[Measurement]:
        """Paired rounds of ``cases`` until a look decides or the budget is spent (``run_rounds``): the
        gate judges sum_j signs[j] x log tokens/s of cases[j] (per GPU with ``per_gpu``) plus
        ``fixed``, blocked by round; ``combine``: instead, each round's launches make one sample."""
        def launch(j: int, number: int) -> Measurement:
            return self._measure(cases[j], launch=number, partners=[c for k, c in enumerate(cases) if k != j])

        return run_rounds(launch, len(cases), gate, signs=signs, sample=lambda m: m.sample(per_gpu),
                          disturbed=lambda m: m.disturbed, fixed=fixed, reruns=self._session.options.reruns,
                          combine=combine, name=lambda j, m: m.case.id,
                          launch_cap=gate.budget if self._session.options.night_budget else None)

    def _compare(self, a: Case, b: Case, gate_spec: tuple[float, str], requirement: str,
                 parity: bool = False) -> GateOutcome:
        threshold, direction = gate_spec
        gate = self._gate(threshold, direction, (a, b))
        # b first: b a, a b, b a, ...
        rounds = self._rounds((b, a), (-1, +1), gate)
        (runs_b, runs_a), look = rounds.runs, rounds.look
        outcome = GateOutcome(
            a.fabric, b.fabric, threshold, requirement, look.interval, look.verdict,
            (configuration_tokens_per_s(runs_a, every=True), configuration_tokens_per_s(runs_b, every=True)),
            "tokens/s", f"[{a.model}, {a.nodes} node(s)]", gate.prior, rounds.notes(),
            stall_note([(a.fabric, runs_a), (b.fabric, runs_b)]), gate.family)
        if parity and outcome.verdict is Verdict.PASS and (reason := host_bound(runs_a + runs_b)):
            outcome = replace(outcome, verdict=Verdict.INCONCLUSIVE,  # hostbound.py's rule
                              extra="; ".join(filter(None, [reason, outcome.extra])))
        outcome = self._budget_note(outcome, rounds)
        predicted = self._session.predicted(a, b, runs_a, runs_b, outcome.interval)
        # Measured, floor and predicted side by side.
        predicted = "\n".join([predicted, *(self._session.floor_line(runs) for runs in (runs_a, runs_b))])
        self._item.stash.setdefault(OUTCOMES_KEY, []).append(outcome)
        # In the output (JUnit system-out) whatever the verdict, and in a failure's message.
        self._item.stash.setdefault(NOTES_KEY, []).append(predicted)
        apply_verdict(outcome, self._session.options.inconclusive, note=predicted)
        return outcome

    def no_regression(self, case: Case, rel: float | None = None) -> GateOutcome:
        """Tonight's ``case`` is not more than ``rel`` below the --fabric-baseline run's.

        A fabric regression is the fabric adding more time to a step, so by default
        (``--regression-on fabric-time``) the gate judges tonight's n-node tokens/s/GPU with the
        same night's one-node step (a launch that never crosses the fabric) replaced by the
        baseline's: what the fabric adds tonight, at the baseline's compute speed
        (``contrasts.fabric_time_sample``). A machine that is faster or slower all night moves the
        one-node step and the compute inside the n-node step alike, so it cancels, for a
        compute-bound job as scaling efficiency does and for a communication-bound one, where
        efficiency would read it as a fabric change. Scaling efficiency and the raw tokens/s ratio
        are shown beside it; ``--regression-on scaling`` or ``tokens`` gates one of those instead.
        One-node cases, and baselines without a one-node measurement of the model, are judged
        on raw tokens/s.

        Skips when there is no baseline or it never measured ``case``. A baseline from other
        hardware or software is compared all the same, with a loud warning naming the differences.
        """
        o = self._session.options
        baseline = o.baseline
        if baseline is None:
            pytest.skip("no --fabric-baseline given")
        if not baseline.values.get(case.id):
            pytest.skip(f"the baseline {baseline.path} has no measurement of {case.id}")
        rel = o.regression_threshold if rel is None else rel
        threshold, direction = within_gate(rel)
        one = case.with_nodes(1)
        mode = o.regression_on
        if case.nodes == 1 or not baseline.values.get(one.id):
            mode = "tokens"
        noise_n = self._session.noise([case])
        terms = baseline.terms(case.id, one.id)
        past = terms.tokens(noise_n)

        def raw(tonight: list[Measurement], confidence: float) -> Interval:
            return contrast_interval([(+1, [m.sample() for m in tonight])], noise_n, confidence,
                                     (-past[0], past[1]))

        def efficiency(runs_one: list[Measurement], tonight: list[Measurement]) -> tuple[float, float]:
            """(tonight's, the baseline's) scaling efficiency: n-node over one-node tokens/s/GPU."""
            return (configuration_tokens_per_s(tonight, per_gpu=True, every=True)
                    / configuration_tokens_per_s(runs_one, per_gpu=True, every=True), terms.efficiency())

        def raw_line(tonight: list[Measurement], confidence: float) -> str:
            tokens = raw(tonight, confidence)
            return (f"raw tokens/s tonight/baseline = {tokens.point:.3f} [{tokens.low:.3f}, {tokens.high:.3f}]: "
                    f"tonight {configuration_tokens_per_s(tonight, every=True):.1f} vs baseline {math.exp(past[0]):.1f}")

        if mode == "fabric-time":
            reference, one_reference, prior = terms.fabric_time(noise_n, self._session.noise([one]))
            gate = self._gate(threshold, direction, (case, one), prior=prior)
            rounds = self._rounds(
                (one, case), (-1, +1), gate, per_gpu=True, fixed=(-reference[0], reference[1]),
                combine=lambda r: fabric_time_sample(r[1].sample(per_gpu=True), r[0].sample(per_gpu=True),
                                                     one_reference))
            (runs_one, tonight), result = rounds.runs, rounds.look
            values = (math.exp(reference[0]) * result.interval.point, math.exp(reference[0]))
            what = "fabric time"
            unit = (f"n{case.nodes} tokens/s/GPU at the baseline's one-node speed (tonight's n{case.nodes} "
                    f"step less tonight's n1 step, plus the baseline's n1 step)")
            eff = efficiency(runs_one, tonight)
            extra = (f"scaling efficiency tonight/baseline = {eff[0] / eff[1]:.3f} ({eff[0]:.3f} vs {eff[1]:.3f}); "
                     + raw_line(tonight, result.interval.confidence))
        elif mode == "scaling":
            # log efficiency = log(multi / gpus) - log(one / gpus_one); tonight's launches give it per GPU.
            gate = self._gate(threshold, direction, (case, one))
            past_eff = terms.scaling(noise_n, gate.prior)
            fixed = (-past_eff[0], past_eff[1])
            rounds = self._rounds((one, case), (-1, +1), gate, per_gpu=True, fixed=fixed)
            (runs_one, tonight), result = rounds.runs, rounds.look
            values = efficiency(runs_one, tonight)
            what, unit = "scaling", f"scaling efficiency (n{case.nodes} over n1 tokens/s/GPU)"
            extra = raw_line(tonight, result.interval.confidence)
        else:
            gate = self._gate(threshold, direction, (case,))
            rounds = self._rounds((case,), (+1,), gate, fixed=(-past[0], past[1]))
            (tonight,), result = rounds.runs, rounds.look
            values = (configuration_tokens_per_s(tonight, every=True), math.exp(past[0]))
            what, unit = "tokens/s", "tokens/s"
            extra = ("" if case.nodes == 1 or o.regression_on == "tokens"
                     else f"judged on raw tokens/s: the baseline has no one-node measurement of {case.model}")
        mismatch = identity_mismatch(baseline.identity, identity_from_records(self._session.store.all()),
                                     ("baseline", "tonight"))
        if mismatch:
            warnings.warn(FabricIdentityWarning(f"{case.id}: comparing against a baseline from a different "
                                                f"set-up: " + "; ".join(mismatch)), stacklevel=2)
            extra = "; ".join(filter(None, [extra, f"DIFFERENT SET-UP: {'; '.join(mismatch)}"]))
        outcome = GateOutcome("tonight", "baseline", threshold, f"{what} at most {rel:.0%} below the baseline",
                              result.interval, result.verdict, values, unit, f"[{case.id}]", gate.prior,
                              rounds.notes(),
                              "; ".join(filter(None, [stall_note([("tonight", tonight)]), extra])), gate.family)
        outcome = self._budget_note(outcome, rounds)
        self._item.stash.setdefault(OUTCOMES_KEY, []).append(outcome)
        apply_verdict(outcome, o.inconclusive)
        return outcome


def stall_note(sides: Sequence[tuple[str, Sequence[Measurement]]]) -> str:
    """"eth steps stall: mean 8% below the fast steps" for each side whose configuration's mean
    throughput sits more than ``steps.STALL_MARGIN`` below its fast steps (the 25% quantile): the
    cost a stalling fabric puts on the job, which the fast steps alone would hide."""
    notes = []
    for name, launches in sides:
        if not launches:
            continue
        mean = configuration_tokens_per_s(launches, every=True)
        fast = configuration_value([m.result.tokens_per_step / m.estimate.fast_step_s for m in launches])
        if 1 - mean / fast > STALL_MARGIN:
            notes.append(f"{name} steps stall: mean {1 - mean / fast:.0%} below the fast steps")
    return "; ".join(notes)


class FabricIdentityWarning(UserWarning):
    """Two runs being compared ran on different hardware or software."""
