"""Statistics of repeated launches, on synthetic samples whose true answer is known."""

from __future__ import annotations

import math
import random
import time

import pytest

from pytest_fabric.stats import (
    AdaptiveComparison,
    Interval,
    Verdict,
    adaptive_compare,
    ahead_gate,
    decide,
    launch_value,
    ratio_interval,
    robust_baseline,
    steady_window,
    t_quantile,
    within_gate,
)


def launches(mean: float, cv: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, cv)) for _ in range(n)]


class TestSteadyWindow:
    def test_leading_warmup_steps_are_dropped(self):
        steps = [5.0, 2.0, 1.01, 1.0, 0.99, 1.0, 1.02, 1.0]
        assert steady_window(steps) == steps[2:]

    def test_a_fast_first_step_is_dropped_too(self):
        # A token-bucket shaper starts with a full bucket: the first step can be too fast.
        steps = [0.5, 1.0, 1.01, 0.99, 1.0, 1.0]
        assert steady_window(steps) == steps[1:]

    def test_a_hiccup_in_the_middle_is_kept(self):
        steps = [1.0, 1.01, 3.0, 0.99, 1.0, 1.0]
        assert steady_window(steps) == steps

    def test_never_drops_more_than_half(self):
        steps = [9.0, 8.0, 7.0, 6.0, 1.0, 1.0, 1.0, 1.0]
        assert len(steady_window(steps)) >= len(steps) // 2

    def test_quiet_launch_is_left_alone(self):
        steps = [1.0, 1.001, 0.999, 1.0, 1.0005]
        assert steady_window(steps) == steps

    def test_short_launches(self):
        assert steady_window([]) == []
        assert steady_window([2.0]) == [2.0]
        assert steady_window([3.0, 1.0]) == [1.0]

    def test_launch_value_is_the_median_of_the_window(self):
        assert launch_value([5.0, 1.2, 1.0, 0.9, 1.1, 1.0, 1.0]) == pytest.approx(1.0)
        with pytest.raises(ValueError):
            launch_value([])


class TestTQuantile:
    @pytest.mark.parametrize(("p", "df", "expected"), [
        (0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 4, 2.7764), (0.975, 18, 2.1009),
        (0.995, 30, 2.7500), (0.95, 10, 1.8125), (0.025, 4, -2.7764), (0.975, 1e9, 1.9600),
    ])
    def test_matches_tables(self, p, df, expected):
        assert t_quantile(p, df) == pytest.approx(expected, abs=1e-3)

    def test_fractional_degrees_of_freedom_lie_between(self):
        assert t_quantile(0.975, 5) < t_quantile(0.975, 4.5) < t_quantile(0.975, 4)


class TestRatioInterval:
    def test_identical_distributions_contain_one_and_pass_a_5pct_within_gate(self):
        a, b = launches(1000, 0.02, 10, seed=1), launches(1000, 0.02, 10, seed=2)
        iv = ratio_interval(a, b, seed=0)
        assert iv.contains(1.0)
        assert (iv.n_a, iv.n_b) == (10, 10)
        assert decide(iv, *within_gate(0.05)) is Verdict.PASS

    def test_a_20pct_slowdown_fails_the_within_gate(self):
        candidate, reference = launches(800, 0.02, 5, seed=3), launches(1000, 0.02, 5, seed=4)
        iv = ratio_interval(candidate, reference)
        assert iv.contains(0.8)
        assert decide(iv, *within_gate(0.05)) is Verdict.FAIL

    def test_a_ratio_at_the_threshold_is_inconclusive(self):
        noise = (-0.02, -0.01, 0.0, 0.01, 0.02)
        reference = [1000 * (1 + e) for e in noise]
        candidate = [950 * (1 + e) for e in reversed(noise)]
        iv = ratio_interval(candidate, reference)
        assert iv.point == pytest.approx(0.95)
        assert decide(iv, *within_gate(0.05)) is Verdict.INCONCLUSIVE

    def test_two_launches_a_side_give_a_wide_but_finite_interval(self):
        a, b = launches(1000, 0.02, 10, seed=5), launches(1000, 0.02, 10, seed=6)
        small, large = ratio_interval(a[:2], b[:2]), ratio_interval(a, b)
        assert 0 < small.low <= small.point <= small.high < math.inf
        assert small.width > 2 * large.width
        # The bootstrap alone cannot reach past the values it was given; the envelope is wider.
        assert small.width > ratio_interval(a[:2], b[:2], method="bootstrap").width

    def test_one_launch_says_nothing_about_noise(self):
        iv = ratio_interval([1000.0], [900.0, 910.0])
        assert iv.point == pytest.approx(1000 / 905)
        assert (iv.low, iv.high) == (0.0, math.inf)
        assert decide(iv, *within_gate(0.05)) is Verdict.INCONCLUSIVE

    def test_deterministic_with_a_seed(self):
        a, b = launches(1000, 0.05, 6, seed=7), launches(950, 0.05, 6, seed=8)
        first = ratio_interval(a, b, seed=42, method="bootstrap")
        assert ratio_interval(a, b, seed=42, method="bootstrap") == first
        assert ratio_interval(a, b, seed=43, method="bootstrap") != first

    def test_median_statistic_shrugs_off_an_outlier(self):
        a = launches(1000, 0.01, 9, seed=9) + [200.0]
        b = launches(1000, 0.01, 10, seed=10)
        iv = ratio_interval(a, b, statistic="median", method="bootstrap")
        assert iv.point == pytest.approx(1.0, abs=0.02)
        assert iv.contains(1.0)

    def test_fast_enough_to_run_between_launches(self):
        a, b = launches(1000, 0.02, 10, seed=11), launches(1000, 0.02, 10, seed=12)
        best = math.inf
        for _ in range(5):
            t0 = time.perf_counter()
            ratio_interval(a, b)
            best = min(best, time.perf_counter() - t0)
        assert best < 0.05

    @pytest.mark.parametrize("bad", [[], [1.0, -2.0], [1.0, float("nan")]])
    def test_rejects_unusable_samples(self, bad):
        with pytest.raises(ValueError):
            ratio_interval(bad, [1.0, 2.0])


class TestDecide:
    def test_within_gate(self):
        threshold, direction = within_gate(0.05)
        assert threshold == pytest.approx(0.95)
        assert decide(Interval(0.96, 0.99, 1.02, 5, 5), threshold, direction) is Verdict.PASS
        assert decide(Interval(0.80, 0.85, 0.94, 5, 5), threshold, direction) is Verdict.FAIL
        assert decide(Interval(0.93, 0.96, 0.99, 5, 5), threshold, direction) is Verdict.INCONCLUSIVE

    def test_ahead_gate(self):
        threshold, direction = ahead_gate(0.20)
        assert threshold == pytest.approx(1.20)
        assert decide(Interval(1.5, 2.0, 2.6, 3, 3), threshold, direction) is Verdict.PASS
        assert decide(Interval(0.95, 1.0, 1.05, 3, 3), threshold, direction) is Verdict.FAIL
        assert decide(Interval(1.1, 1.25, 1.4, 3, 3), threshold, direction) is Verdict.INCONCLUSIVE

    def test_at_most_direction_mirrors(self):
        assert decide(Interval(0.5, 0.6, 0.7, 3, 3), 0.8, "<=") is Verdict.PASS
        assert decide(Interval(0.9, 1.0, 1.1, 3, 3), 0.8, "<=") is Verdict.FAIL
        assert decide(Interval(0.7, 0.8, 0.9, 3, 3), 0.8, "<=") is Verdict.INCONCLUSIVE

    def test_verdict_reads_as_its_word(self):
        assert str(Verdict.PASS) == "pass" and Verdict.INCONCLUSIVE == "inconclusive"

    def test_unknown_direction(self):
        with pytest.raises(ValueError):
            decide(Interval(1, 1, 1, 2, 2), 1.0, ">")


class PairSource:
    """Interleaved synthetic launches: A then B, each with multiplicative noise."""

    def __init__(self, a_mean: float, b_mean: float, cv: float, seed: int) -> None:
        self.rng = random.Random(seed)
        self.a_mean, self.b_mean, self.cv = a_mean, b_mean, cv
        self.order: list[str] = []

    def __call__(self) -> tuple[float, float]:
        self.order += ["A", "B"]
        a = self.a_mean * (1 + self.rng.gauss(0, self.cv))
        b = self.b_mean * (1 + self.rng.gauss(0, self.cv))
        return a, b


class TestAdaptive:
    def test_stops_at_the_first_look_when_clearly_failing(self):
        source = PairSource(800, 1000, 0.01, seed=1)
        result = adaptive_compare(source, *within_gate(0.05), start_pairs=3, max_pairs=10)
        assert result.verdict is Verdict.FAIL
        assert result.stopped == "decided"
        assert result.pairs == 3 and result.launches == 6
        assert source.order == ["A", "B"] * 3
        assert len(result.looks) == 1

    def test_stops_early_when_clearly_passing(self):
        source = PairSource(1000, 1000, 0.005, seed=2)
        result = adaptive_compare(source, *within_gate(0.05), start_pairs=3, max_pairs=10)
        assert result.verdict is Verdict.PASS
        assert result.pairs < 10

    def test_noisy_identical_fabrics_pass_after_more_pairs(self):
        source = PairSource(1000, 1000, 0.02, seed=3)
        result = adaptive_compare(source, *within_gate(0.05), start_pairs=3, max_pairs=12)
        assert result.verdict is Verdict.PASS
        assert 3 < result.pairs <= 12
        assert [look.verdict for look in result.looks[:-1]] == [Verdict.INCONCLUSIVE] * (len(result.looks) - 1)

    def test_stops_at_the_budget_when_the_truth_sits_on_the_threshold(self):
        source = PairSource(950, 1000, 0.02, seed=4)
        result = adaptive_compare(source, *within_gate(0.05), start_pairs=3, max_pairs=8)
        assert result.verdict is Verdict.INCONCLUSIVE
        assert result.stopped == "budget"
        assert result.pairs == 8 and result.launches == 16
        assert len(result.looks) == 6

    def test_ahead_gate_catches_a_fast_fabric_that_lost_its_edge(self):
        # The reference (a) should be 20% ahead; it is level with the candidate (b).
        result = adaptive_compare(PairSource(1000, 1000, 0.01, seed=5), *ahead_gate(0.20))
        assert result.verdict is Verdict.FAIL

    def test_peeking_correction_widens_each_look(self):
        plain = AdaptiveComparison(0.95, correct_for_peeking=False)
        corrected = AdaptiveComparison(0.95, start_pairs=3, max_pairs=10)
        assert plain.look_confidence == 0.95
        assert corrected.look_confidence == pytest.approx(1 - 0.05 / 8)

    def test_deterministic(self):
        runs = [adaptive_compare(PairSource(960, 1000, 0.02, seed=6), *within_gate(0.05), seed=1)
                for _ in range(2)]
        assert runs[0].interval == runs[1].interval and runs[0].pairs == runs[1].pairs

    def test_step_by_step_use(self):
        cmp = AdaptiveComparison(*within_gate(0.05), start_pairs=2, max_pairs=4)
        assert cmp.needs_more()
        source = PairSource(700, 1000, 0.01, seed=7)
        while cmp.needs_more():
            cmp.add(*source())
        assert cmp.pairs == 2 and cmp.verdict() is Verdict.FAIL

    def test_rejects_a_budget_below_the_start(self):
        with pytest.raises(ValueError):
            AdaptiveComparison(0.95, start_pairs=5, max_pairs=3)


class TestRobustBaseline:
    def test_drops_a_bad_night(self):
        base = robust_baseline([100.0, 101.0, 99.0, 100.5, 70.0])
        assert base.dropped == (70.0,)
        assert base.center == pytest.approx(100.25)
        assert 0 < base.spread < 2

    def test_drops_an_outlier_among_identical_nights(self):
        base = robust_baseline([100.0] * 5 + [130.0])
        assert base.dropped == (130.0,)
        assert base.center == 100.0 and base.spread == 0.0

    def test_keeps_ordinary_spread(self):
        values = launches(1000, 0.02, 15, seed=8)
        base = robust_baseline(values)
        assert base.dropped == ()
        assert base.center == pytest.approx(1000, rel=0.03)
        assert base.rel_spread == pytest.approx(0.02, rel=0.6)

    def test_nights_agreeing_to_a_fraction_of_a_percent_do_not_make_outliers(self):
        assert robust_baseline([100.0, 100.05, 99.95, 100.0, 102.0]).dropped == ()

    def test_few_nights_drop_only_a_gross_outlier(self):
        # Of three nights the MAD is the smaller of two deviations: 174 was an ordinary night here.
        assert robust_baseline([210.6, 216.7, 173.8]).dropped == ()
        assert robust_baseline([210.6, 216.7, 100.0]).dropped == (100.0,)
        assert robust_baseline([100.0, 101.0, 99.0, 60.0]).dropped == (60.0,)

    def test_two_values_cannot_name_an_outlier(self):
        base = robust_baseline([100.0, 50.0])
        assert base.dropped == () and base.center == 75.0

    def test_needs_a_value(self):
        with pytest.raises(ValueError):
            robust_baseline([])
