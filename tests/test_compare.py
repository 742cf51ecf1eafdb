"""Gates on repeated launches: interleaving, verdicts and the inconclusive policy.

The launches are synthetic here (known distributions, so the right verdict is known); the real
launch path is covered by the emulated runs in test_plugin_runs.py.
"""

import random
from types import SimpleNamespace

import pytest

from pytest_fabric.measure import Case
from pytest_fabric.plugin import VERDICTS_KEY, CompareFixture


class FakeLaunches:
    """Per-fabric tokens/s drawn from a seeded normal distribution; remembers the launch order."""

    def __init__(self, means, noise=0.01, seed=1):
        self.means, self.noise, self.rng, self.order = means, noise, random.Random(seed), []

    def __call__(self, case, launch=0):
        self.order.append((case.fabric, launch))
        value = self.means[case.fabric] * (1 + self.rng.gauss(0, self.noise))
        return SimpleNamespace(tokens_per_s=value, case=case)


def compare(means, inconclusive="xfail", repeats=3, max_repeats=6, noise=0.01):
    launches = FakeLaunches(means, noise)
    options = SimpleNamespace(repeats=repeats, max_repeats=max_repeats, inconclusive=inconclusive)
    item = SimpleNamespace(stash={})
    return CompareFixture(launches, SimpleNamespace(options=options), item), launches, item


CAND, REF = Case("m", 2, "eth"), Case("m", 2, "ib")


def test_equal_fabrics_pass_and_launches_are_interleaved():
    fixture, launches, item = compare({"ib": 1000.0, "eth": 1000.0})
    result = fixture.within(CAND, REF, rel=0.05)
    assert str(result.verdict) == "pass" and result.pairs == 3
    # reference, candidate, reference, candidate ... each launch index once per side
    assert launches.order == [("ib", 0), ("eth", 0), ("ib", 1), ("eth", 1), ("ib", 2), ("eth", 2)]
    [line] = item.stash[VERDICTS_KEY]
    assert line.startswith("pass: eth/ib = ") and "over 3+3 launches" in line and ">= 0.950" in line


def test_clear_slowdown_fails_with_interval_and_numbers():
    fixture, _, _ = compare({"ib": 1000.0, "eth": 800.0})
    with pytest.raises(pytest.fail.Exception) as info:
        fixture.within(CAND, REF, rel=0.05)
    message = str(info.value)
    assert "wholly below" in message and "eth/ib = 0.8" in message and "CI [" in message
    assert "mean eth 8" in message and "vs ib 10" in message


def test_advantage_gate_direction():
    fixture, _, _ = compare({"ib": 1000.0, "eth": 500.0})
    assert str(fixture.ahead(REF, CAND, by=0.20).verdict) == "pass"
    fixture, _, _ = compare({"ib": 1000.0, "eth": 990.0})
    with pytest.raises(pytest.fail.Exception, match="ib/eth = 1.0"):
        fixture.ahead(REF, CAND, by=0.20)


@pytest.mark.parametrize(("policy", "outcome"), [("xfail", pytest.xfail.Exception),
                                                  ("fail", pytest.fail.Exception)])
def test_inconclusive_takes_more_launches_then_follows_the_policy(policy, outcome):
    # True ratio exactly at the threshold with 5% noise: no budget can decide it.
    fixture, launches, _ = compare({"ib": 1000.0, "eth": 950.0}, inconclusive=policy, noise=0.05)
    with pytest.raises(outcome, match="inconclusive after the launch budget"):
        fixture.within(CAND, REF, rel=0.05)
    assert len(launches.order) == 2 * 6  # extended from --repeats 3 to --max-repeats 6


def test_inconclusive_warn_passes_with_a_warning():
    from pytest_fabric.gates import InconclusiveWarning

    fixture, _, _ = compare({"ib": 1000.0, "eth": 950.0}, inconclusive="warn", noise=0.05)
    with pytest.warns(InconclusiveWarning, match="inconclusive"):
        result = fixture.within(CAND, REF, rel=0.05)
    assert str(result.verdict) == "inconclusive"


def regression(tonight_mean, past, noise=0.01):
    launches = FakeLaunches({"ib": tonight_mean}, noise)
    baseline = SimpleNamespace(values={"m-n2-ib": past}, identity={"cluster_kind": "emulated"}, path="b.json")
    options = SimpleNamespace(repeats=3, max_repeats=6, inconclusive="fail", baseline=baseline,
                              regression_threshold=0.10)
    session = SimpleNamespace(options=options, store=SimpleNamespace(all=lambda: {}))
    return CompareFixture(launches, session, SimpleNamespace(stash={})), launches


def test_regression_against_baseline_is_caught():
    fixture, launches = regression(700.0, [1000.0, 1010.0, 990.0])
    with pytest.raises(pytest.fail.Exception, match=r"tonight/baseline = 0\.70.*at most 10% below"):
        fixture.no_regression(REF)
    assert len(launches.order) == 3  # decided at the first look


def test_same_as_baseline_passes_and_missing_case_skips():
    fixture, _ = regression(1000.0, [1000.0, 1010.0, 990.0])
    assert str(fixture.no_regression(REF).verdict) == "pass"
    with pytest.raises(pytest.skip.Exception, match="no measurement of m-n2-eth"):
        fixture.no_regression(CAND)
