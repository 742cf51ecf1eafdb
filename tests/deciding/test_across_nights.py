"""A baseline's center across nights (deciding/across_nights.py): a bad night is dropped, an ordinary
spread is kept.

Every random sample comes from ``random.Random(seed)``: the tests are deterministic.
"""

from __future__ import annotations

import random

import pytest

from pytest_fabric.deciding.across_nights import RobustCenter, robust_baseline


def launches(mean: float, cv: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, cv)) for _ in range(n)]



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
