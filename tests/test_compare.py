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
    line, predicted = item.stash[VERDICTS_KEY]
    assert line.startswith("pass: eth/ib = ") and "over 3+3 launches" in line and ">= 0.950" in line
    # These fake launches carry no step times: the prediction says why it is missing, and nothing fails.
    assert predicted.startswith("predicted: unavailable (")


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


# -- the model's prediction next to the measurement --------------------------------------------------

class ModelLaunches:
    """Launches whose step times the analytical model itself generates (plus noise), so the
    prediction next to the comparison is known: the measured penalty, within the noise."""

    def __init__(self, model, rates_gbit, flops_per_s=2e10, noise=0.005, seed=2):
        from pytest_fabric.models import get_model
        from pytest_fabric.predict import predict_step

        self.spec = get_model(model)
        self.steps = {f: predict_step(self.spec, 2, flops_per_s=flops_per_s, inter_gbit=g, dtype="fp32").step_s
                      for f, g in rates_gbit.items()}
        self.noise, self.rng = noise, random.Random(seed)

    def __call__(self, case, launch=0):
        step = self.steps[case.fabric] * (1 + self.rng.gauss(0, self.noise))
        tokens = 2 * self.spec.batch_size * self.spec.seq_len
        result = {"batch_size": self.spec.batch_size, "seq_len": self.spec.seq_len, "local_world_size": 1,
                  "dtype": "float32", "reduce_dtype": "float32", "activation_checkpointing": False}
        return SimpleNamespace(tokens_per_s=tokens / step, median_step_s=step, case=case, result=result)


def predicting(model, rates_mbit, cluster="emulated", fabric_flops=None, inconclusive="fail"):
    from pytest_fabric.fabrics import build_table
    from pytest_fabric.measure import Settings

    table = build_table(rates=rates_mbit)
    gbit = {f: (table[f].emulated_mbit / 1000 if cluster == "emulated" else table[f].nominal_gbit)
            for f in ("ib", "eth")}
    launches = ModelLaunches(model, gbit)
    options = SimpleNamespace(repeats=3, max_repeats=4, inconclusive=inconclusive, flops_per_rank=fabric_flops,
                              settings=Settings(fabric_table=table))
    item = SimpleNamespace(stash={})
    session = SimpleNamespace(options=options, cluster=SimpleNamespace(name=cluster))
    return CompareFixture(launches, session, item), item


def test_prediction_sits_next_to_the_measurement_with_the_emulated_rates():
    fixture, item = predicting("llama-wide", {"eth": 200})  # --fabric-rate eth=200
    fixture.ahead(Case("llama-wide", 2, "ib"), Case("llama-wide", 2, "eth"), by=0.20)
    passed, predicted = item.stash[VERDICTS_KEY]
    assert passed.startswith("pass: ib/eth")
    assert predicted.startswith("predicted: eth ") and "% slower than ib" in predicted
    assert "eth 0.2 vs ib 2 Gbit/s per node" in predicted and "fitted to ib's measured step" in predicted
    assert "communication-bound" in predicted and "cannot tell" not in predicted
    # The steps came from the model itself: the prediction from the ib side alone meets the eth side.
    off = float(predicted.rsplit("prediction off by ", 1)[1].split()[0])
    assert abs(off) < 2.0
    assert "measured: eth " in predicted and "% CI of the slowdown [+" in predicted


def test_failure_message_carries_the_prediction():
    fixture, item = predicting("llama-wide", {})
    with pytest.raises(pytest.fail.Exception) as info:
        fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    first, second = str(info.value).splitlines()
    assert first.startswith("interval wholly below the threshold: eth/ib")
    assert second.startswith("predicted: eth ") and "measured: eth " in second
    assert item.stash[VERDICTS_KEY] == [second]  # in system-out as well


def test_deeply_compute_bound_comparison_is_labelled():
    fixture, item = predicting("qwen2-tiny", {})
    fixture.within(Case("qwen2-tiny", 2, "eth"), Case("qwen2-tiny", 2, "ib"), rel=0.05)
    predicted = item.stash[VERDICTS_KEY][-1]
    assert "compute-bound: cannot tell the fabrics apart" in predicted


def test_off_the_emulated_cluster_the_nominal_rates_and_a_given_throughput_are_used():
    fixture, item = predicting("llama-wide", {}, cluster="slurm", fabric_flops=2e10, inconclusive="warn")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    predicted = item.stash[VERDICTS_KEY][-1]
    assert "eth 100 vs ib 3200 Gbit/s per node" in predicted and "20 GFLOP/s per rank given" in predicted
    # Transfer hides behind compute, but the first all-gather and last reduce-scatter cannot: a few %.
    assert "compute-bound: only the unhidden first all-gather" in predicted


def test_equal_rates_predict_no_difference():
    fixture, item = predicting("llama-wide", {"eth": 2000})
    fixture.within(Case("llama-wide", 2, "eth"), Case("llama-wide", 2, "ib"), rel=0.05)
    predicted = item.stash[VERDICTS_KEY][-1]
    assert predicted.startswith("predicted: no difference (") and "cannot tell the fabrics apart" in predicted


def test_prediction_reads_real_measurements_as_the_store_records_them():
    from test_results import training_record

    from pytest_fabric.fabrics import build_table
    from pytest_fabric.measure import Measurement, Settings
    from pytest_fabric.plugin import _predicted

    def runs(fabric, tokens_per_s):
        record = training_record("qwen2-tiny", 2, fabric, tokens_per_s)
        return [Measurement.from_record(Case("qwen2-tiny", 2, fabric), record)] * 3

    session = SimpleNamespace(options=SimpleNamespace(settings=Settings(fabric_table=build_table()),
                                                      flops_per_rank=None),
                              cluster=SimpleNamespace(name="emulated"))
    interval = SimpleNamespace(point=1700 / 1800, low=0.93, high=0.96, confidence=0.95)
    line = _predicted(session, Case("qwen2-tiny", 2, "eth"), Case("qwen2-tiny", 2, "ib"),
                      {"a": runs("eth", 1700.0), "b": runs("ib", 1800.0)}, SimpleNamespace(interval=interval))
    assert line.startswith("predicted: eth ") and "eth 0.4 vs ib 2 Gbit/s per node" in line, line
    assert "measured: eth 5.6% slower, 95% CI of the slowdown [+4.0%, +7.0%]" in line
