"""Statistics inside one launch (deciding/steps.py): the steady window, the location interval and
a launch's estimate, on synthetic samples whose true answer is known.

Every random sample comes from ``random.Random(seed)``: the tests are deterministic.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
from helpers import lognormal

from pytest_fabric.deciding.steps import (STALL_MARGIN, mean_standard_error, LaunchEstimate, launch_estimate,
                                          location_interval, steady_window)


def q25(values) -> float:
    """The 25% quantile with linear interpolation, computed independently of deciding/steps.py."""
    return statistics.quantiles(values, n=4, method="inclusive")[0]



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

    def test_tokens_per_s(self):
        assert launch_estimate([0.5] * 8).tokens_per_s(1000) == pytest.approx(2000.0)

    def test_rejects_empty_launches_and_mismatched_flags(self):
        with pytest.raises(ValueError):
            launch_estimate([])
        with pytest.raises(ValueError):
            launch_estimate([1.0, 1.0, 1.0], ["", ""])
