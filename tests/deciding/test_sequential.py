"""The sequential gate (deciding/sequential.py): its looks spend the error allowance O'Brien-Fleming
style, and its verdicts keep their error rates, on synthetic samples whose true answer is known.

Every random sample comes from ``random.Random(seed)``: the tests are deterministic.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter

import pytest
from helpers import lognormal, side

from pytest_fabric.deciding.contrasts import NoisePrior, Verdict, contrast_interval, decide, within_gate
from pytest_fabric.deciding.sequential import CONFIDENCE, Look, SequentialGate, obrien_fleming_spending


# A noise learned from many nights: the looks' variance as good as known (the Brownian-motion boundaries).
KNOWN = NoisePrior(0.02, 1e6, "learned", nights=10)


def boundaries(gate: SequentialGate, launches) -> list[float]:
    """The standard-normal boundary of each of ``gate``'s looks after ``launches`` launches."""
    out = []
    for n in launches:
        look = gate.look([(1, side([1000.0] * n)), (-1, side([1000.0] * n))], launches=n)
        out.append(statistics.NormalDist().inv_cdf((1 + look.interval.confidence) / 2))
    return out


class TestSequentialGate:
    def test_looks_on_tonights_rounds_alone_keep_their_error_rate_as_t_statistics(self):
        # Without a learned noise the looks from 3 rounds on rest on tonight's rounds (t on rounds - 1
        # df): their boundaries are set on the t statistics' joint distribution, so that the looks
        # together cross no more than alpha, where the known-variance levels used as t quantiles
        # crossed more. Checked on fresh simulated nights (a seed of their own).
        import numpy as np
        from scipy.stats import t as student_t

        gate = SequentialGate(0.95, start=2, budget=6)
        levels = []
        for n in range(2, 7):
            levels.append(gate.look([(1, side([1000.0] * n)), (-1, side([1000.0] * n))], launches=n).interval.confidence)
        known = boundaries(SequentialGate(0.95, start=2, budget=6, prior=KNOWN), range(2, 7))
        assert levels[0] == pytest.approx(2 * statistics.NormalDist().cdf(known[0]) - 1)  # the bound's look
        # From the second look on t, each level lies beyond the known-variance one (a single look would not).
        assert all(level > 2 * statistics.NormalDist().cdf(c) - 1 for level, c in zip(levels[2:], known[2:]))
        rng = np.random.default_rng(11)
        x = rng.standard_normal((100_000, 6))
        crossed = np.zeros(100_000, dtype=bool)
        naive = np.zeros(100_000, dtype=bool)
        for n, level, c in zip(range(3, 7), levels[1:], known[1:]):
            stat = np.abs(x[:, :n].mean(axis=1) / (x[:, :n].std(axis=1, ddof=1) / np.sqrt(n)))
            crossed |= stat >= student_t.ppf((1 + level) / 2, n - 1)
            naive |= stat >= student_t.ppf(statistics.NormalDist().cdf(c), n - 1)
        assert crossed.mean() <= 0.1 + 0.003
        assert naive.mean() > crossed.mean()

    def test_looks_spend_the_error_allowance_obrien_fleming_style(self):
        gate = SequentialGate(0.95, start=2, budget=6, confidence=0.95)
        spent = [gate.spending(n) for n in range(2, 7)]
        assert spent == sorted(spent) and spent[-1] == pytest.approx(0.05)
        # Lan-DeMets O'Brien-Fleming type, alpha/2 per side: 2 (1 - Phi(z_{1-alpha/4} / sqrt(t))).
        z = statistics.NormalDist().inv_cdf(1 - 0.05 / 4)
        assert spent[0] == pytest.approx(4 * (1 - statistics.NormalDist().cdf(z / math.sqrt(2 / 6))))
        assert spent[0] < 0.001
        assert gate.look_confidence(2) == pytest.approx(1 - spent[0], rel=1e-6)  # the first look spends its share
        assert SequentialGate(0.95, start=4, budget=4, confidence=0.95).look_confidence(4) == pytest.approx(0.95)
        assert SequentialGate(0.95, start=1, budget=1, confidence=0.95).look_confidence(1) == pytest.approx(0.95)

    def test_boundaries_match_the_published_obrien_fleming_table(self):
        # Five equally spaced looks, two-sided alpha 0.05, Lan-DeMets O'Brien-Fleming spending:
        # 4.877, 3.357, 2.680, 2.290, 2.031 (Jennison & Turnbull 2000; gsDesign sfLDOF).
        bounds = boundaries(SequentialGate(0.95, start=1, budget=5, confidence=0.95, prior=KNOWN), range(1, 6))
        assert bounds == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=2e-3)

    def test_the_sequential_procedure_keeps_its_error_rate_and_no_more(self):
        # Z at the looks is a Brownian motion in information time; under no effect, the chance
        # that any look's |Z| crosses its boundary is alpha: not more (the stated confidence
        # holds), and not much less (a union bound would waste it).
        import numpy as np

        gate = SequentialGate(0.95, start=2, budget=6, confidence=0.95, prior=KNOWN)
        bounds = boundaries(gate, range(2, 7))
        rng = np.random.default_rng(7)
        steps = rng.standard_normal((200_000, 6))
        paths = np.cumsum(steps, axis=1)[:, 1:] / np.sqrt(np.arange(2, 7))  # Z after 2..6 launches
        crossed = (np.abs(paths) >= np.array(bounds)).any(axis=1).mean()
        assert crossed == pytest.approx(0.05, abs=0.003)
        union = 1 - 0.05 + obrien_fleming_spending(5 / 6, 0.05)  # what a union bound's last look would use
        assert gate.looks[-1].interval.confidence < union

    def test_each_look_spends_only_what_is_left_since_the_last(self):
        gate = SequentialGate(*within_gate(0.05), start=2, budget=6, prior=KNOWN)
        groups = [(1, side([1000.0, 1005.0])), (-1, side([1000.0, 1002.0]))]
        first = gate.look(groups, launches=2)
        second = gate.look(groups, launches=4)
        assert 1 - first.interval.confidence == pytest.approx(gate.spending(2), rel=1e-6)
        # Given that the first look went on, the second spends spending(4) - spending(2): as a
        # nominal level that is more than the share itself (the looks are correlated), less than all.
        assert gate.spending(4) - gate.spending(2) < 1 - second.interval.confidence < gate.spending(4)
        # Looking again at the same information spends nothing more.
        assert gate.look(groups, launches=4).interval.confidence > 1 - 1e-9

    @pytest.mark.parametrize("kwargs", [dict(start=0), dict(start=5, budget=3), dict(direction=">"),
                                        dict(confidence=1.0)])
    def test_rejects_nonsense(self, kwargs):
        with pytest.raises(ValueError):
            SequentialGate(0.95, **kwargs)

    def test_look_appends_a_look(self):
        gate = SequentialGate(*within_gate(0.05), start=2, budget=6)
        assert gate.looks == []
        groups = [(1, side([1000.0, 1005.0, 995.0])), (-1, side([1000.0, 1002.0]))]
        look = gate.look(groups)
        assert isinstance(look, Look)
        assert gate.looks == [look]
        assert look.launches == 3
        assert look.interval.confidence == pytest.approx(1 - gate.spending(3), rel=1e-6)
        assert look.verdict is decide(look.interval, gate.threshold, gate.direction)
        gate.look(groups)
        assert len(gate.looks) == 2

    def test_each_look_is_wider_than_a_single_look(self):
        groups = [(1, side([1000.0, 1010.0])), (-1, side([990.0, 1000.0]))]
        look = SequentialGate(0.95).look(groups)
        assert look.interval.width > contrast_interval(groups).width

    def test_uses_its_prior_and_fixed_term(self):
        prior = NoisePrior(0.05, 7.0, "nights", nights=3)
        gate = SequentialGate(0.95, start=1, budget=1, prior=prior)
        look = gate.look([(1, side([1000.0]))], fixed=(math.log(1 / 500), 0.0))
        assert look.interval.df == 7.0
        assert look.interval.point == pytest.approx(2.0)
        assert look.verdict is Verdict.PASS


def simulate(true_ratio: float, trials: int, seed: int, sigma: float = 0.02) -> Counter:
    """Verdicts of ``trials`` sequential within-5% comparisons of interleaved launch pairs."""
    rng = random.Random(seed)
    verdicts: Counter = Counter()
    for _ in range(trials):
        gate = SequentialGate(*within_gate(0.05), start=2, budget=6)
        candidate: list[tuple[float, float]] = []
        reference: list[tuple[float, float]] = []
        while True:
            candidate.append((math.log(1000 * true_ratio) + rng.gauss(0, sigma), 0.005 ** 2))
            reference.append((math.log(1000) + rng.gauss(0, sigma), 0.005 ** 2))
            if len(candidate) < gate.start:
                continue
            look = gate.look([(1, candidate), (-1, reference)])
            if look.verdict is not Verdict.INCONCLUSIVE or len(candidate) >= gate.budget:
                break
        assert len(gate.looks) <= gate.budget - gate.start + 1
        verdicts[look.verdict] += 1
    return verdicts


class TestErrorRates:
    trials = 200

    def test_a_to_a_rarely_fails_and_mostly_passes(self):
        verdicts = simulate(1.0, self.trials, seed=14)
        assert verdicts[Verdict.FAIL] <= 0.05 * self.trials
        assert verdicts[Verdict.FAIL] == 0
        assert verdicts[Verdict.PASS] >= 0.8 * self.trials

    def test_a_10pct_slowdown_never_passes_and_mostly_fails(self):
        verdicts = simulate(0.9, self.trials, seed=15)
        assert verdicts[Verdict.PASS] == 0
        assert verdicts[Verdict.FAIL] >= 0.8 * self.trials

    def test_at_the_threshold_either_verdict_is_rare_despite_repeated_looks(self):
        # At the threshold each verdict is wrong half the time it is given: the looks together keep
        # each below (1 - CONFIDENCE) / 2 = 5% (within this simulation's own error, 3 s.e.).
        trials = 800
        verdicts = simulate(0.95, trials, seed=16)
        allowed = (1 - CONFIDENCE) / 2
        bound = trials * allowed + 3 * math.sqrt(trials * allowed * (1 - allowed))
        assert verdicts[Verdict.PASS] <= bound
        assert verdicts[Verdict.FAIL] <= bound


def test_a_failure_the_family_cannot_confirm_is_inconclusive_and_shows_the_familys_interval():
    # 8% below a 5% threshold on 3 launches a side: one gate alone fails it; over 30 gates the
    # failure must hold at alpha / 30, and the interval it was judged on (shown) straddles 0.95.
    rng = random.Random(21)
    groups = [(1, side(lognormal(920, 0.02, 3, rng))), (-1, side(lognormal(1000, 0.02, 3, rng)))]
    alone = SequentialGate(0.95, start=3, budget=3).look(groups)
    family = SequentialGate(0.95, start=3, budget=3, family=30).look(groups)
    assert alone.verdict is Verdict.FAIL and alone.interval.high < 0.95
    assert family.verdict is Verdict.INCONCLUSIVE and family.interval.low <= 0.95 <= family.interval.high
    assert family.interval.confidence > alone.interval.confidence


def test_a_familys_failure_boundary_is_spent_over_the_looks_as_the_gates_own():
    """The failing side's boundary comes from the same spending function at alpha / m: a single look is
    Bonferroni's exactly, and looks spread over a budget spend the family's allowance as the gate
    spends its own (not each look's level divided by m, which is slightly lenient)."""
    single = SequentialGate(0.95, start=3, budget=3, family=7)
    assert single.fail_confidence(3) == pytest.approx(1 - 0.10 / 7, abs=1e-9)
    alone = SequentialGate(0.95, start=2, budget=6)
    family = SequentialGate(0.95, start=2, budget=6, family=7)
    for launches in range(2, 7):
        own, fail = family.look_confidence(launches), family.fail_confidence(launches)
        assert own == pytest.approx(alone.look_confidence(launches)) and fail > own
        family._next(launches)  # the look taken: the next one spends its share given this one
        alone._next(launches)
        if launches == 2:
            # The first look of five: O'Brien-Fleming spends almost nothing at alpha / 7 either.
            assert fail > 1 - (1 - own) / 7
