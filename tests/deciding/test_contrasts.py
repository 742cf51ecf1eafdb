"""Statistics across launches (deciding/contrasts.py): the noise, a configuration's value, the
baseline's term, the contrast interval and the gate's verdict, on synthetic samples whose true answer
is known.

Every random sample comes from ``random.Random(seed)``: the tests are deterministic.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
from helpers import lognormal, side

from pytest_fabric.deciding.contrasts import (BOUND_DF, MIN_LEARNED_NIGHTS, QUICK_LOOK_ROUND_SD,
                                              configuration_value, Interval, NoisePrior, Verdict, ahead_gate,
                                              combined_noise, contrast_interval, decide, fabric_time_reference,
                                              fabric_time_sample, night_variance, pooled_noise, reference_term,
                                              within_gate)
from pytest_fabric.deciding.steps import LOCATION_QUANTILE


def interval(low: float, point: float, high: float) -> Interval:
    return Interval(low, point, high, 0.95, 6.0, 0.02, (3, 3))


@pytest.mark.parametrize("module", ["steps", "contrasts", "sequential", "across_nights", "rounds"])
def test_public_names_exist(module):
    import importlib

    mod = importlib.import_module(f"pytest_fabric.deciding.{module}")
    for name in mod.__all__:
        assert hasattr(mod, name), name
    assert LOCATION_QUANTILE == 0.25  # a low quantile: noise is one-sided (README)


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
        assert iv.point == pytest.approx(1.0) and iv.low <= 1.0 <= iv.high and iv.source == "learned"
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
        assert iv.point == pytest.approx(1.0) and iv.low <= 1.0 <= iv.high
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
        assert iv.low <= 0.9 <= iv.high
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
            iv = contrast_interval([(1, side(a)), (-1, side(b))], blocked=True)
            covered += iv.low <= 1000 / 1100 <= iv.high
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
