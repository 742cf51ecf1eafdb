"""Statistics of steps and launches, on synthetic samples whose true answer is known.

Every random sample comes from ``random.Random(seed)``: the tests are deterministic.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter

import pytest

from pytest_fabric.deciding.across_nights import RobustCenter, robust_baseline
from pytest_fabric.deciding.contrasts import (BOUND_DF, MIN_LEARNED_NIGHTS, QUICK_LOOK_ROUND_SD,
                                              configuration_value, Interval, NoisePrior, Verdict, ahead_gate,
                                              combined_noise, contrast_interval, decide, fabric_time_reference,
                                              fabric_time_sample, night_variance, pooled_noise, reference_term,
                                              within_gate)
from pytest_fabric.deciding.sequential import CONFIDENCE, Look, SequentialGate, obrien_fleming_spending
from pytest_fabric.workload.window import measuring_done
from pytest_fabric.deciding.steps import (STALL_MARGIN, mean_standard_error, LOCATION_QUANTILE, LaunchEstimate,
                                          launch_estimate, location_interval, steady_window)

LOG = math.log


def launches(mean: float, cv: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, cv)) for _ in range(n)]


def lognormal(median: float, sigma: float, n: int, rng: random.Random) -> list[float]:
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def side(values: list[float], within: float = 0.0) -> list[tuple[float, float]]:
    """Launch values (tokens/s) as a contrast group's (log value, within-launch variance) pairs."""
    return [(math.log(v), within) for v in values]


def q25(values) -> float:
    """The 25% quantile with linear interpolation, computed independently of deciding/steps.py."""
    return statistics.quantiles(values, n=4, method="inclusive")[0]


def interval(low: float, point: float, high: float) -> Interval:
    return Interval(low, point, high, 0.95, 6.0, 0.02, (3, 3))


@pytest.mark.parametrize("module", ["steps", "contrasts", "sequential", "across_nights", "rounds"])
def test_public_names_exist(module):
    import importlib

    mod = importlib.import_module(f"pytest_fabric.deciding.{module}")
    for name in mod.__all__:
        assert hasattr(mod, name), name
    assert LOCATION_QUANTILE == 0.25  # a low quantile: noise is one-sided (README)


# --------------------------------------------------------------------------------------------
# Inside one launch
# --------------------------------------------------------------------------------------------


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

    def test_max_drop_caps_the_dropped_steps(self):
        steps = [9.0, 8.0, 7.0, 1.0, 1.0, 1.0, 1.0, 1.0]
        assert steady_window(steps) == steps[3:]
        assert steady_window(steps, max_drop=1) == steps[1:]

    def test_quiet_launch_is_left_alone(self):
        steps = [1.0, 1.001, 0.999, 1.0, 1.0005]
        assert steady_window(steps) == steps

    def test_short_launches(self):
        assert steady_window([]) == []
        assert steady_window([2.0]) == [2.0]
        assert steady_window([3.0, 1.0]) == [1.0]


class TestLocationInterval:
    def test_value_is_the_quantile_and_the_interval_holds_it(self):
        times = [1.3, 0.9, 1.0, 1.1, 1.2, 0.95, 1.05, 1.0, 1.02, 0.97, 1.15, 1.01, 0.99, 1.08]
        loc, low, high = location_interval(times)
        assert loc == pytest.approx(q25(times))
        assert location_interval(times, q=0.5)[0] == pytest.approx(statistics.median(times))
        assert low is not None and high is not None
        assert low <= loc <= high
        assert low in times and high in times  # order statistics, not interpolated values

    def test_even_count_interpolates_the_median(self):
        assert location_interval([1.0, 2.0, 3.0, 4.0], q=0.5)[0] == pytest.approx(2.5)
        assert location_interval([1.0, 2.0, 3.0, 4.0])[0] == pytest.approx(1.75)

    def test_other_quantiles_interpolate_linearly(self):
        assert location_interval([4.0, 1.0, 3.0, 2.0, 5.0], q=0.25)[0] == pytest.approx(2.0)
        assert location_interval([1.0, 2.0], q=0.25)[0] == pytest.approx(1.25)

    def test_too_few_values_have_no_interval(self):
        # Of five values the extremes cover the median with probability 1 - 2/32 < 95%.
        for n in range(1, 6):
            loc, low, high = location_interval([float(i) for i in range(n)], q=0.5)
            assert (low, high) == (None, None)
            assert loc == pytest.approx((n - 1) / 2)
        # Six values: the extremes (1 - 2/64 >= 95%).
        assert location_interval([3.0, 1.0, 6.0, 2.0, 5.0, 4.0], q=0.5) == (3.5, 1.0, 6.0)
        # The 25% quantile needs more: below the minimum with probability 0.75^n, so 11 values.
        assert location_interval([float(i) for i in range(12)])[1:] == (None, None)
        assert location_interval([float(i) for i in range(13)])[1] == 0.0

    def test_a_lower_confidence_needs_fewer_values(self):
        assert location_interval([1.0, 2.0, 3.0, 4.0, 5.0], q=0.5, confidence=0.9) == (3.0, 1.0, 5.0)

    def test_narrows_with_more_values(self):
        rng = random.Random(1)
        widths = []
        for n in (20, 80, 320, 1280):
            _, low, high = location_interval(lognormal(1.0, 0.05, n, rng))
            widths.append(high - low)
        assert widths == sorted(widths, reverse=True)
        assert widths[-1] < widths[0] / 4

    def test_covers_the_true_quantile_at_least_as_often_as_stated(self):
        # Distribution-free: a skewed distribution (exponential) is covered too; its q quantile
        # is -ln(1 - q).
        rng = random.Random(2)
        for q, n in ((0.5, 15), (0.25, 25)):
            covered = 0
            for _ in range(400):
                _, low, high = location_interval([rng.expovariate(1.0) for _ in range(n)], q=q)
                covered += low <= -math.log(1 - q) <= high
            assert covered / 400 >= 0.93

    def test_needs_a_value(self):
        with pytest.raises(ValueError):
            location_interval([])


class TestLaunchEstimate:
    def test_value_is_the_mean_of_the_steady_steps_and_the_fast_steps_a_diagnostic(self):
        est = launch_estimate([5.0, 1.2, 1.0, 0.9, 1.1, 1.0, 1.0])
        assert isinstance(est, LaunchEstimate)
        assert est.step_s == pytest.approx(statistics.fmean([1.2, 1.0, 0.9, 1.1, 1.0, 1.0]))
        assert est.fast_step_s == pytest.approx(q25([1.2, 1.0, 0.9, 1.1, 1.0, 1.0]))
        assert (est.steps, est.used, est.warmup_like) == (7, 6, 1)
        assert est.set_aside == {} and est.set_aside_steps == 0
        assert est.disturbed == ""

    def test_warmup_like_steps_do_not_move_the_value(self):
        steady = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.0, 1.01]
        est = launch_estimate([8.0, 4.0] + steady)
        assert est.warmup_like == 2
        assert est.step_s == pytest.approx(statistics.fmean(steady))

    def test_disturbed_steps_are_set_aside_and_counted_by_cause(self):
        times = [1.0, 1.01, 3.0, 0.99, 2.5, 1.0, 1.02, 0.98, 1.0, 1.6]
        flags = ["", "", "cpu steal 40 ms", "", "cpu steal 12 ms", "", "", "", "", "gpu clock 1200 MHz"]
        est = launch_estimate(times, flags)
        clean = [t for t, f in zip(times, flags) if not f]
        assert est.step_s == pytest.approx(statistics.fmean(clean))
        assert (est.steps, est.used, est.warmup_like) == (10, 7, 0)
        assert est.set_aside_steps == 3
        # The figures are dropped from the cause: two steal steps are one kind, counted twice.
        assert sorted(est.set_aside.values()) == [1, 2]
        steal = [kind for kind in est.set_aside if kind.startswith("cpu steal")]
        assert len(steal) == 1 and est.set_aside[steal[0]] == 2
        assert not any(ch.isdigit() for kind in est.set_aside for ch in kind)
        assert est.disturbed == ""

    def test_flags_on_dropped_warmup_steps_are_not_counted(self):
        times = [6.0, 1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0]
        flags = ["cpu steal 90 ms"] + [""] * 7
        est = launch_estimate(times, flags)
        assert est.warmup_like == 1
        assert est.set_aside == {} and est.used == 7

    def test_too_few_clean_steps_mark_the_launch_disturbed(self):
        times = [1.0, 1.5, 1.4, 1.6, 1.01, 1.3]
        flags = ["", "cpu steal 40 ms", "cpu steal 30 ms", "gpu clock 900 MHz", "", "cpu steal 20 ms"]
        est = launch_estimate(times, flags)
        assert est.disturbed != ""
        assert "cpu steal" in est.disturbed
        assert est.set_aside_steps == 4
        # With too few clean steps the value falls back to all steady steps (its round runs again).
        assert est.used == 6
        assert est.step_s == pytest.approx(statistics.fmean(times))

    def test_mostly_disturbed_launch_is_marked_even_with_enough_clean_steps(self):
        times = [1.0] * 10
        flags = [""] * 4 + ["cpu steal 5 ms"] * 6
        est = launch_estimate(times, flags)
        assert est.used == 4
        assert est.disturbed != ""

    def test_a_short_window_is_no_disturbance(self):
        # Two steps, none flagged: the window asked for (--steps 2), not something outside the job.
        est = launch_estimate([2.0, 2.1])
        assert est.disturbed == "" and est.used == 2 and est.step_s == pytest.approx(2.05)
        # Two steps, one flagged: too few clean steps left, the launch is disturbed.
        assert "cpu steal" in launch_estimate([2.0, 2.1, 2.05], ["", "cpu steal 40 ms", ""]).disturbed

    def test_log_se_shrinks_with_more_steps(self):
        rng = random.Random(3)
        ses = [launch_estimate(lognormal(1.0, 0.05, n, rng)).log_se for n in (10, 40, 160, 640)]
        assert all(se > 0 for se in ses)
        assert ses == sorted(ses, reverse=True)
        # The mean of n independent lognormal steps: standard error about sigma / sqrt(n) in logs.
        assert ses[-1] == pytest.approx(0.05 / math.sqrt(640), rel=0.5)

    def test_log_se_of_correlated_steps_is_wider_than_the_naive_one(self):
        # A slow phase lasting several steps (AR(1), r = 0.7): batch means (n >= 20) and the lag-1
        # correction (n < 20) both widen the naive s / sqrt(n), as they must for the interval to hold.
        rng = random.Random(5)
        for n in (12, 64):
            x, steps = 0.0, []
            for _ in range(n):
                x = 0.7 * x + rng.gauss(0, 0.03)
                steps.append(math.exp(x))
            naive = statistics.stdev(steps) / math.sqrt(n) / statistics.fmean(steps)
            assert launch_estimate(steps).log_se > 1.2 * naive

    def test_the_mean_standard_error_covers_the_true_mean_of_correlated_steps(self):
        # AR(1) steps around 1.0, r = 0.5, 30 steps: the 95% interval from batch means covers 1.0
        # about 95% of the time (at least 88% of 300 launches), where the naive one would not.
        rng = random.Random(11)
        covered = naive_covered = 0
        for _ in range(300):
            x, steps = 0.0, []
            for _ in range(30):
                x = 0.5 * x + rng.gauss(0, 0.02)
                steps.append(1.0 + x)
            mean = statistics.fmean(steps)
            # 30 steps: 5 batches of 6, Student's t on 4 df.
            covered += abs(mean - 1.0) <= 2.776 * mean_standard_error(steps)
            naive_covered += abs(mean - 1.0) <= 1.96 * statistics.stdev(steps) / math.sqrt(30)
        assert covered / 300 >= 0.88 and naive_covered < covered

    def test_stalled_steps_move_the_mean_and_not_the_fast_steps(self):
        # 20% of the steps stall by +60%: the job pays ~12% more per step; the 25% quantile sees nothing.
        steps = [1.6 if i % 5 == 4 else 1.0 for i in range(40)]
        est = launch_estimate(steps)
        assert est.step_s == pytest.approx(1.12) and est.fast_step_s == pytest.approx(1.0)
        assert est.stall == pytest.approx(0.12) and est.stall > STALL_MARGIN

    def test_a_slow_phase_marks_the_launch(self):
        est = launch_estimate([1.0] * 10, slow_phase=0.4)
        assert "machine slow 40%" in est.disturbed
        fast = launch_estimate([1.0] * 10, slow_phase=-0.3)  # its probes took 30% less: 43% faster
        assert "machine fast 43%" in fast.disturbed
        assert launch_estimate([1.0] * 10).disturbed == ""

    def test_tokens_per_s(self):
        assert launch_estimate([0.5] * 8).tokens_per_s(1000) == pytest.approx(2000.0)

    def test_rejects_empty_launches_and_mismatched_flags(self):
        with pytest.raises(ValueError):
            launch_estimate([])
        with pytest.raises(ValueError):
            launch_estimate([1.0, 1.0, 1.0], ["", ""])


class TestMeasuringDone:
    kw = dict(min_steps=5, max_steps=100, measure_s=1000.0)

    def test_goes_on_before_min_steps(self):
        assert measuring_done([100.0] * 4, **{**self.kw, "measure_s": 1.0}) == ""

    def test_step_cap(self):
        rng = random.Random(4)
        noisy = lognormal(1.0, 0.5, 20, rng)
        assert measuring_done(noisy, **{**self.kw, "max_steps": 20}) == "step cap"
        assert measuring_done(noisy[:19], **{**self.kw, "max_steps": 20}) == ""

    def test_steady_steps_do_not_stop_early(self):
        # Known to any precision after a few steps, they measure the whole window all the same.
        steps = [1.0, 1.001, 0.999, 1.0, 1.0005, 0.9995] * 2 + [1.0]
        assert measuring_done(steps, **self.kw) == ""

    def test_time_cap(self):
        rng = random.Random(5)
        noisy = lognormal(1.0, 0.3, 30, rng)
        assert measuring_done(noisy, **{**self.kw, "measure_s": sum(noisy) + 1}) == ""
        assert measuring_done(noisy, **{**self.kw, "measure_s": sum(noisy) - 1}) == "time cap"


# --------------------------------------------------------------------------------------------
# Across launches
# --------------------------------------------------------------------------------------------


class TestNoisePrior:
    @pytest.mark.parametrize(("sigma", "df"), [(0.0, 4.0), (-0.1, 4.0), (1.0, 4.0), (0.02, 0.0), (0.02, -1.0)])
    def test_rejects_nonsense(self, sigma, df):
        with pytest.raises(ValueError):
            NoisePrior(sigma, df)


class TestPooledNoise:
    def test_groups_of_one_contribute_nothing(self):
        assert pooled_noise([[1.0], [5.0]]) == (0.0, 0)
        assert pooled_noise([]) == (0.0, 0)
        assert pooled_noise([[1.0], [2.0, 4.0], [100.0]]) == (pytest.approx(2.0), 1)

    def test_each_group_around_its_own_mean(self):
        var, df = pooled_noise([[1.0, 2.0, 3.0], [101.0, 102.0, 103.0]])
        assert (var, df) == (pytest.approx(1.0), 4)

    def test_recovers_a_known_variance(self):
        rng = random.Random(7)
        groups = [[mu + rng.gauss(0, 0.03) for _ in range(4)] for mu in (rng.uniform(5, 8) for _ in range(60))]
        var, df = pooled_noise(groups)
        assert df == 180
        assert var == pytest.approx(0.03 ** 2, rel=0.2)


class TestConfigurationValue:
    def test_geometric_mean(self):
        assert configuration_value([100.0, 400.0]) == pytest.approx(200.0)
        assert configuration_value([123.0]) == pytest.approx(123.0)
        assert configuration_value([2.0, 8.0, 4.0]) == pytest.approx(4.0)

    @pytest.mark.parametrize("bad", [[], [1.0, 0.0], [1.0, -2.0], [1.0, float("nan")], [float("inf")]])
    def test_rejects_unusable_values(self, bad):
        with pytest.raises(ValueError):
            configuration_value(bad)


class TestReferenceTerm:
    def test_one_value_rests_on_the_prior_alone_else_on_the_bound(self):
        log_value, var = reference_term([100.0], NoisePrior(0.02, 10.0))
        assert log_value == pytest.approx(math.log(100.0))
        assert var == pytest.approx(0.02 ** 2)
        assert reference_term([100.0])[1] == pytest.approx(QUICK_LOOK_ROUND_SD ** 2 / 2)

    def test_variance_is_moderated_and_divided_by_the_count(self):
        prior = NoisePrior(0.05, 2.0)
        values = [100.0, 110.0, 90.0, 105.0]
        log_value, var = reference_term(values, prior)
        logs = [math.log(v) for v in values]
        s2 = statistics.variance(logs)
        assert log_value == pytest.approx(statistics.fmean(logs))
        # The values spread 7.9%, beyond the prior's 5%: the excess is the night-to-night component.
        assert var == pytest.approx((2.0 * 0.05 ** 2 + 3 * s2) / 5.0 / 4 + (s2 - 0.05 ** 2))

    def test_nightly_values_of_several_launches_leave_more_to_the_night_component(self):
        # Each nightly value the mean of 4 launches: launch noise explains sigma^2 / 4 of the spread.
        prior = NoisePrior(0.05, 2.0)
        values = [100.0, 110.0, 90.0, 105.0]
        s2 = statistics.variance([math.log(v) for v in values])
        one, four = reference_term(values, prior)[1], reference_term(values, prior, per_night=4)[1]
        floor = 0.05 ** 2 / 4
        assert four == pytest.approx((2.0 * floor + 3 * s2) / 5.0 / 4 + (s2 - floor))
        assert four > one

    def test_the_night_variance_is_unbiased(self):
        # tau = sigma = 2%, 3 launches a night: s2 - sigma^2 / 3 averages tau^2 over many baselines
        # (s2 - sigma^2, a night taken as one launch, would average 1.15% squared).
        rng = random.Random(21)
        tau, sigma, n = 0.02, 0.02, 3
        estimates = []
        for _ in range(4000):
            nightly = [rng.gauss(0, tau) + statistics.fmean(rng.gauss(0, sigma) for _ in range(n)) for _ in range(6)]
            s2 = statistics.variance(nightly)
            estimates.append(s2 - sigma ** 2 / n)  # unclipped: the estimator's mean
        assert statistics.fmean(estimates) == pytest.approx(tau ** 2, rel=0.05)
        assert night_variance(0.03 ** 2, 5, NoisePrior(sigma, 10.0), n) == pytest.approx(0.03 ** 2 - sigma ** 2 / n)

    def test_many_agreeing_nights_make_a_tight_term(self):
        assert reference_term([100.0] * 20)[1] < reference_term([100.0] * 2)[1] < reference_term([100.0])[1]

    def test_rejects_unusable_values(self):
        with pytest.raises(ValueError):
            reference_term([100.0, -1.0])


class TestContrastInterval:
    def test_too_few_rounds_without_a_learned_noise_decide_only_beyond_the_noise_bound(self):
        # No launch-to-launch evidence tonight and nothing learned: the interval rests on the stated
        # noise bound (15% per round, a launch's share of it, as known), and the line says so.
        iv = contrast_interval([(1, side([1000.0])), (-1, side([200.0]))], confidence=0.9986)
        assert iv.point == pytest.approx(5.0) and iv.launches == (1, 1)
        assert (iv.df, iv.data_df) == (BOUND_DF, 0)
        assert iv.sigma == pytest.approx(QUICK_LOOK_ROUND_SD / math.sqrt(2))
        # 99.86% (a first look): half-width t * 15% on the log scale, t = 3.20 on 1000 df.
        assert math.log(iv.high / iv.point) == pytest.approx(3.2 * QUICK_LOOK_ROUND_SD, rel=2e-3)
        assert "judged against the noise bound, 15% per round" in iv.noise_note
        assert "--fabric-baseline" in iv.noise_note and "--repeats 3" in iv.noise_note
        assert iv.source == "the noise bound, 15% per round"
        # A 5x gap is far beyond the bound: it decides. A 10% one stays inconclusive.
        assert decide(iv, *ahead_gate(0.2)) is Verdict.PASS
        small = contrast_interval([(1, side([1000.0])), (-1, side([1100.0]))], confidence=0.9986)
        assert decide(small, *within_gate(0.05)) is Verdict.INCONCLUSIVE
        # Two rounds still lean on the bound; three carry tonight's own paired spread.
        two = contrast_interval([(1, side([1000.0, 1010.0])), (-1, side([200.0, 202.0]))], blocked=True)
        assert two.df == BOUND_DF
        three = contrast_interval([(1, side([1000.0, 1010.0, 990.0])), (-1, side([200.0, 203.0, 199.0]))],
                                  blocked=True)
        assert (three.df, three.data_df, three.source) == (2.0, 2, "tonight's 3 rounds")
        assert decide(three, *ahead_gate(0.2)) is Verdict.PASS

    def test_one_launch_a_side_on_a_learned_prior_uses_it(self):
        learned = NoisePrior(0.02, 4.0, "learned", nights=MIN_LEARNED_NIGHTS)
        iv = contrast_interval([(1, side([1000.0])), (-1, side([1000.0]))], learned)
        assert iv.point == pytest.approx(1.0) and iv.contains(1.0) and iv.source == "learned"
        # Student's t with the prior's 4 df: 2.7764; sigma of a difference of two launches.
        half = 2.7764 * 0.02 * math.sqrt(2)
        assert iv.low == pytest.approx(math.exp(-half), rel=1e-4)
        assert iv.high == pytest.approx(math.exp(half), rel=1e-4)
        # Learned on fewer nights, or nothing learned: the noise bound, so a small effect stays undecided.
        for prior in (NoisePrior(0.02, 4.0, "learned", nights=MIN_LEARNED_NIGHTS - 1), None):
            wide = contrast_interval([(1, side([1000.0])), (-1, side([920.0]))], prior)
            assert decide(wide, *within_gate(0.05)) is Verdict.INCONCLUSIVE
        assert decide(contrast_interval([(1, side([850.0])), (-1, side([1000.0]))], learned),
                      *within_gate(0.05)) is Verdict.FAIL

    def test_tonights_noise_far_beyond_the_learned_one_sets_it_aside_with_a_warning(self):
        # Launches that vary 15% against a learned 1% on 4 df: the F-test rejects it, and the
        # interval rests on tonight's launches alone (and says so).
        rng = random.Random(4)
        a, b = lognormal(1000, 0.15, 6, rng), lognormal(1000, 0.15, 6, rng)
        prior = NoisePrior(0.01, 4.0)
        iv = contrast_interval([(1, side(a)), (-1, side(b))], prior)
        assert iv.noise_note.startswith("WARNING") and "set aside" in iv.noise_note and iv.df == iv.data_df == 10
        # Tonight's launches agree with it: it moderates them.
        c, d = lognormal(1000, 0.01, 6, rng), lognormal(1000, 0.01, 6, rng)
        ok = contrast_interval([(1, side(c)), (-1, side(d))], prior)
        assert "WARNING" not in ok.noise_note and ok.df == 14

    def test_every_launch_counts_alike(self):
        # No weights: the point is the ratio of the plain geometric means, whatever a launch was.
        iv = contrast_interval([(1, side([1000.0, 500.0, 1000.0])), (-1, side([1000.0, 1000.0, 1000.0]))],
                               blocked=True)
        assert iv.point == pytest.approx(configuration_value([1000.0, 500.0, 1000.0]) / 1000.0)
        assert iv.data_df == 2

    def test_a_to_a_samples_contain_one(self):
        rng = random.Random(8)
        values = lognormal(1000.0, 0.02, 5, rng)
        iv = contrast_interval([(1, side(values)), (-1, side(values))])
        assert iv.point == pytest.approx(1.0) and iv.contains(1.0)
        assert decide(iv, *within_gate(0.05)) is Verdict.PASS

    def test_more_launches_narrow_the_interval(self):
        # The same spread at every size: only the count changes.
        def width(k: int) -> float:
            noise = [0.02 * (-1) ** i for i in range(k)]
            a = [(math.log(1000) + e, 0.0) for e in noise]
            b = [(math.log(1000) - e, 0.0) for e in noise]
            return contrast_interval([(1, a), (-1, b)]).width

        widths = [width(k) for k in (3, 4, 8, 16)]
        assert widths == sorted(widths, reverse=True)
        assert widths[-1] < widths[0] / 2

        rng = random.Random(9)
        a, b = lognormal(1000, 0.02, 16, rng), lognormal(1000, 0.02, 16, rng)
        few = contrast_interval([(1, side(a[:3])), (-1, side(b[:3]))])
        many = contrast_interval([(1, side(a)), (-1, side(b))])
        assert many.width < few.width / 2

    @pytest.mark.parametrize("seed", [10, 11, 12])
    def test_a_planted_10pct_gap_lies_wholly_below_the_gate(self, seed):
        rng = random.Random(seed)
        candidate, reference = lognormal(900, 0.02, 6, rng), lognormal(1000, 0.02, 6, rng)
        iv = contrast_interval([(1, side(candidate)), (-1, side(reference))])
        assert iv.high < 0.95
        assert iv.contains(0.9)
        assert decide(iv, *within_gate(0.05)) is Verdict.FAIL

    def test_degrees_of_freedom_add_the_prior_and_the_launches(self):
        prior = NoisePrior(0.05, 10.0)
        iv = contrast_interval([(1, side([1.0, 1.05, 0.95])), (-1, side([1.0, 1.02, 0.98, 1.01]))], prior)
        assert iv.df == pytest.approx(10.0 + 2 + 3)
        assert iv.launches == (3, 4)

    def test_prior_moderates_the_launches_noise(self):
        values_a, values_b = [1000.0, 1030.0, 970.0], [1020.0, 980.0, 1000.0]
        groups = [(1, side(values_a)), (-1, side(values_b))]
        s_launches = math.sqrt(pooled_noise([[math.log(v) for v in values_a], [math.log(v) for v in values_b]])[0])
        strong = contrast_interval(groups, NoisePrior(0.03, 1e6))
        weak = contrast_interval(groups, NoisePrior(0.03, 1e-6))
        assert strong.sigma == pytest.approx(0.03, rel=1e-3)
        assert weak.sigma == pytest.approx(s_launches, rel=1e-3)
        middle = contrast_interval(groups, NoisePrior(0.03, 4.0))
        expected = math.sqrt((4 * 0.03 ** 2 + 4 * s_launches ** 2) / 8)
        assert middle.sigma == pytest.approx(expected)

    def test_within_launch_variance_is_a_floor_for_the_prior(self):
        # A launch cannot be known better than its own steps allow: max(sigma0^2, w).
        learned = NoisePrior(0.02, 4.0, "learned", nights=MIN_LEARNED_NIGHTS)
        w = 0.03 ** 2
        iv = contrast_interval([(1, side([1000.0], w)), (-1, side([1000.0], w))], learned)
        assert iv.sigma == pytest.approx(0.03)
        small = contrast_interval([(1, side([1000.0], 0.001 ** 2)), (-1, side([1000.0], 0.001 ** 2))], learned)
        assert small.sigma == pytest.approx(0.02)

    def test_blocked_rounds_cancel_a_shared_drift(self):
        # Each round's two launches share the machine's speed of the moment: by round the
        # contrast is steady, pooled it is not.
        drift = [1000.0, 1080.0, 950.0, 1040.0, 990.0]
        a, b = side([d * 1.01 for d in drift]), side(drift)
        blocked = contrast_interval([(1, a), (-1, b)], blocked=True)
        pooled = contrast_interval([(1, a), (-1, b)])
        assert blocked.point == pytest.approx(pooled.point) == pytest.approx(1.01)
        assert blocked.width < pooled.width / 2
        assert blocked.df == 4 and pooled.df == 8
        with pytest.raises(ValueError):
            contrast_interval([(1, side([1.0, 2.0])), (-1, side([1.0]))], blocked=True)

    def test_fixed_term_shifts_the_point_and_its_variance_widens(self):
        groups = [(1, side([1000.0, 1010.0, 995.0])), (-1, side([500.0, 505.0, 501.0]))]
        plain = contrast_interval(groups)
        shifted = contrast_interval(groups, fixed=(math.log(0.5), 0.0))
        assert shifted.point == pytest.approx(plain.point * 0.5)
        assert shifted.width == pytest.approx(plain.width * 0.5)
        wider = contrast_interval(groups, fixed=(math.log(0.5), 0.05 ** 2))
        assert wider.point == pytest.approx(shifted.point)
        assert wider.width > shifted.width

    def test_against_a_baseline_term(self):
        # Tonight's candidate against a reference known from past nights.
        nights = [1000.0, 1010.0, 990.0, 1005.0, 995.0]
        log_ref, var_ref = reference_term(nights)
        iv = contrast_interval([(1, side([800.0, 805.0]))], fixed=(-log_ref, var_ref))
        assert iv.point == pytest.approx(configuration_value([800.0, 805.0]) / configuration_value(nights))
        assert decide(iv, *within_gate(0.05)) is Verdict.FAIL

    def test_higher_confidence_is_wider(self):
        groups = [(1, side([1000.0, 1020.0, 1010.0])), (-1, side([990.0, 1000.0, 1005.0]))]
        assert contrast_interval(groups, confidence=0.99).width > contrast_interval(groups, confidence=0.9).width

    @pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1])
    def test_rejects_bad_confidence(self, confidence):
        with pytest.raises(ValueError):
            contrast_interval([(1, side([1.0])), (-1, side([1.0]))], confidence=confidence)

    def test_rejects_empty_groups(self):
        with pytest.raises(ValueError):
            contrast_interval([])
        with pytest.raises(ValueError):
            contrast_interval([(1, side([1.0])), (-1, [])])

    def test_covers_the_true_ratio_at_least_as_often_as_stated(self):
        # Three rounds, paired t on tonight's rounds alone.
        rng = random.Random(13)
        covered = 0
        for _ in range(400):
            a, b = lognormal(1000, 0.02, 3, rng), lognormal(1100, 0.02, 3, rng)
            covered += contrast_interval([(1, side(a)), (-1, side(b))], blocked=True).contains(1000 / 1100)
        assert covered / 400 >= 0.93

    def test_reads_as_a_line(self):
        text = str(contrast_interval([(1, side([1000.0])), (-1, side([1000.0]))]))
        assert text.startswith("1.000 [") and "95% CI" in text and "1+1 launches" in text


# --------------------------------------------------------------------------------------------
# The gate
# --------------------------------------------------------------------------------------------


class TestDecide:
    def test_within_gate(self):
        threshold, direction = within_gate(0.05)
        assert threshold == pytest.approx(0.95) and direction == ">="
        assert decide(interval(0.96, 0.99, 1.02), threshold, direction) is Verdict.PASS
        assert decide(interval(0.80, 0.85, 0.94), threshold, direction) is Verdict.FAIL
        assert decide(interval(0.93, 0.96, 0.99), threshold, direction) is Verdict.INCONCLUSIVE

    def test_ahead_gate(self):
        threshold, direction = ahead_gate(0.20)
        assert threshold == pytest.approx(1.20)
        assert decide(interval(1.5, 2.0, 2.6), threshold, direction) is Verdict.PASS
        assert decide(interval(0.95, 1.0, 1.05), threshold, direction) is Verdict.FAIL
        assert decide(interval(1.1, 1.25, 1.4), threshold, direction) is Verdict.INCONCLUSIVE

    def test_the_threshold_itself(self):
        assert decide(interval(0.95, 1.0, 1.05), 0.95) is Verdict.PASS
        assert decide(interval(0.90, 0.92, 0.95), 0.95) is Verdict.INCONCLUSIVE

    def test_at_most_direction_mirrors(self):
        assert decide(interval(0.5, 0.6, 0.7), 0.8, "<=") is Verdict.PASS
        assert decide(interval(0.9, 1.0, 1.1), 0.8, "<=") is Verdict.FAIL
        assert decide(interval(0.7, 0.8, 0.9), 0.8, "<=") is Verdict.INCONCLUSIVE
        assert decide(interval(0.5, 0.6, 0.7), 0.8, "at_most") is Verdict.PASS
        assert decide(interval(0.9, 1.0, 1.1), 0.8, "at_least") is Verdict.PASS

    def test_verdict_reads_as_its_word(self):
        assert str(Verdict.PASS) == "pass" and Verdict.INCONCLUSIVE == "inconclusive"

    def test_unknown_direction(self):
        with pytest.raises(ValueError):
            decide(interval(1, 1, 1), 1.0, ">")

    @pytest.mark.parametrize(("gate", "bad"), [(within_gate, -0.1), (within_gate, 1.0), (ahead_gate, -0.01)])
    def test_gates_reject_nonsense(self, gate, bad):
        with pytest.raises(ValueError):
            gate(bad)


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
        assert verdicts[Verdict.PASS] + verdicts[Verdict.FAIL] >= 0.02 * trials  # the allowance is used, not wasted


# --------------------------------------------------------------------------------------------
# Across nights
# --------------------------------------------------------------------------------------------


class TestRobustBaseline:
    def test_drops_a_bad_night(self):
        base = robust_baseline([100.0, 101.0, 99.0, 100.5, 70.0])
        assert isinstance(base, RobustCenter)
        assert base.dropped == (70.0,)
        assert base.n == 4
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

    def test_one_value(self):
        base = robust_baseline([42.0])
        assert base.center == 42.0 and base.spread == 0.0 and base.n == 1

    def test_needs_a_value(self):
        with pytest.raises(ValueError):
            robust_baseline([])


# -- regression on the time the fabric adds to a step -------------------------------------------


def _per_gpu(compute_s: float, fabric_s: float) -> float:
    """log tokens/s/GPU of a step of ``compute_s`` + ``fabric_s`` seconds per token."""
    return -math.log(compute_s + fabric_s)


@pytest.mark.parametrize("speed", [0.8, 1.0, 1.25])
def test_a_machine_drift_cancels_in_the_fabric_time(speed):
    # Compute 2 ms per token on one node, plus 7 ms the fabric adds at n nodes; tonight's machine
    # computes at ``speed`` times the baseline's, the fabric is unchanged.
    nights = [(_per_gpu(2e-3, 7e-3), _per_gpu(2e-3, 0.0))] * 3
    (reference, _), one_reference, _ = fabric_time_reference(NoisePrior(0.02, 4.0), NoisePrior(0.02, 4.0), nights)
    value, _ = fabric_time_sample((_per_gpu(2e-3 / speed, 7e-3), 0.0), (_per_gpu(2e-3 / speed, 0.0), 0.0),
                                     one_reference)
    assert value - reference == pytest.approx(0.0, abs=1e-12)
    # The fabric adding 10% more time shows as its share of the step.
    slower, _ = fabric_time_sample((_per_gpu(2e-3 / speed, 7.7e-3), 0.0), (_per_gpu(2e-3 / speed, 0.0), 0.0),
                                   one_reference)
    assert math.exp(slower - reference) == pytest.approx(9.0 / 9.7)


def test_the_fabric_time_variance_is_the_delta_method_of_both_launches():
    rng = random.Random(7)
    multi, one, one_reference = (math.log(110.0), 0.01 ** 2), (math.log(450.0), 0.04 ** 2), math.log(430.0)
    value, variance = fabric_time_sample(multi, one, one_reference)
    draws = [fabric_time_sample((rng.gauss(multi[0], 0.01), 0.0), (rng.gauss(one[0], 0.04), 0.0), one_reference)[0]
             for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(value, abs=1e-3)
    assert statistics.variance(draws) == pytest.approx(variance, rel=0.05)
    # The one-node launch weighs in by its share of the step: a quarter of its noise, not all of it.
    assert variance < 0.01 ** 2 + (0.04 / 2) ** 2


def test_the_fabric_time_reference_takes_the_nights_pairs():
    # Each night's machine speed moved both values; taken night by night the drift's part cancels.
    prior = NoisePrior(0.002, 4.0)
    nights = [(_per_gpu(2e-3 / f, 7e-3), _per_gpu(2e-3 / f, 0.0)) for f in (1.0, 0.9, 1.1, 0.95)]
    (_, by_night), _, _ = fabric_time_reference(prior, prior, nights)
    values = ([math.exp(m) for m, _ in nights], [math.exp(o) for _, o in nights])
    (_, apart), _, _ = fabric_time_reference(prior, prior, apart=values)
    assert by_night < apart / 4
    with pytest.raises(ValueError, match="at least one night"):
        fabric_time_reference(prior, prior)


def test_combined_noise_adds_weighted_variances_on_the_weaker_evidence():
    noise = combined_noise([(1.0, NoisePrior(0.01, 10.0, "a")), (0.25, NoisePrior(0.04, 4.0, "b"))])
    assert noise.sigma == pytest.approx(math.sqrt(0.01 ** 2 + 0.01 ** 2)) and noise.df == 4.0
    assert noise.source == "a; b"


def test_a_regression_interval_holds_the_night_to_night_variance():
    # Five nights whose values spread 4% while launches vary 1%: tonight is one more night, so the
    # baseline's term carries the night component (s2 - sigma0^2) besides its mean's variance.
    prior = NoisePrior(0.01, 10.0)
    nights = [1000.0, 1040.0, 960.0, 1020.0, 980.0]
    logs = [math.log(v) for v in nights]
    s2 = statistics.variance(logs)
    mean, variance = reference_term(nights, prior)
    var_one = (10.0 * 0.01 ** 2 + 4 * s2) / 14.0
    assert variance == pytest.approx(var_one / 5 + (s2 - 0.01 ** 2))
    # Two nights say too little of a night component; nights as steady as the launches add none.
    assert reference_term(nights[:2], prior)[1] == pytest.approx(
        ((10.0 * 0.01 ** 2 + statistics.variance(logs[:2])) / 11.0) / 2)
    assert night_variance(0.005 ** 2, 4, prior) == 0.0


def test_a_failure_the_family_cannot_confirm_is_inconclusive_and_shows_the_familys_interval():
    # 8% below a 5% threshold on 3 launches a side: one gate alone fails it; over 30 gates the
    # failure must hold at alpha / 30, and the interval it was judged on (shown) straddles 0.95.
    rng = random.Random(21)
    groups = [(1, side(lognormal(920, 0.02, 3, rng))), (-1, side(lognormal(1000, 0.02, 3, rng)))]
    alone = SequentialGate(0.95, start=3, budget=3).look(groups)
    family = SequentialGate(0.95, start=3, budget=3, family=30).look(groups)
    assert alone.verdict is Verdict.FAIL and alone.interval.high < 0.95
    assert family.verdict is Verdict.INCONCLUSIVE and family.interval.contains(0.95)
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
