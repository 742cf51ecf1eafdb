"""Gates: one-sided, and a failure message that carries both numbers, the ratio and the threshold."""

from __future__ import annotations

import pytest

from pytest_fabric import Case, Measurement, assert_ahead, assert_within, ratio


def measurement(fabric: str, tokens_per_s: float, model: str = "qwen2.5-7b", nodes: int = 8) -> Measurement:
    gpus = nodes * 8
    return Measurement(
        case=Case(model, nodes, fabric),
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / gpus,
        median_step_s=1.0,
        step_s=[1.0],
        gpus=gpus,
        cluster="test",
        result={},
    )


def failure_message(gate, *args, **kwargs) -> str:
    with pytest.raises(pytest.fail.Exception) as excinfo:
        gate(*args, **kwargs)
    # pytrace=False: a dashboard shows the message alone, so it must stand alone.
    assert excinfo.value.pytrace is False
    return str(excinfo.value)


class TestAssertWithin:
    def test_failure_names_both_values_ratio_and_threshold(self):
        msg = failure_message(assert_within, measurement("eth", 9300.0), measurement("ib", 10000.0), rel=0.05)
        assert msg.startswith("eth/ib = 0.930 < 0.950: ")
        assert "eth 9300.0 tokens/s" in msg
        assert "ib 10000.0 tokens/s" in msg
        assert "7.0% below" in msg
        assert "allowed: 5% slower" in msg
        assert "[qwen2.5-7b, 8 node(s), 64 GPU(s)]" in msg

    def test_plain_numbers_get_generic_names(self):
        msg = failure_message(assert_within, 90, 100, rel=0.05)
        assert msg.startswith("candidate/reference = 0.900 < 0.950: ")
        assert "candidate 90.0 tokens/s" in msg and "reference 100.0 tokens/s" in msg

    def test_unit_is_used_in_the_message(self):
        msg = failure_message(assert_within, 50, 100, rel=0.1, unit="GB/s")
        assert "50.0 GB/s" in msg and "100.0 GB/s" in msg

    @pytest.mark.parametrize("candidate", [100.0, 101.0, 250.0, 1e9])
    def test_faster_or_equal_never_fails(self, candidate):
        assert assert_within(candidate, 100.0, rel=0.0) == pytest.approx(candidate / 100.0)

    def test_exactly_at_the_threshold_passes(self):
        assert assert_within(95.0, 100.0, rel=0.05) == pytest.approx(0.95)

    def test_just_below_the_threshold_fails(self):
        failure_message(assert_within, 94.9, 100.0, rel=0.05)

    def test_returns_candidate_over_reference(self):
        assert assert_within(measurement("eth", 98.0), measurement("ib", 100.0)) == pytest.approx(0.98)

    @pytest.mark.parametrize("rel", [-0.01, 1.0, 2.0])
    def test_nonsense_tolerance_is_rejected(self, rel):
        with pytest.raises(ValueError, match="rel must be in"):
            assert_within(1.0, 1.0, rel=rel)


class TestAssertAhead:
    def test_failure_names_both_values_ratio_and_threshold(self):
        msg = failure_message(assert_ahead, measurement("ib", 11000.0), measurement("eth", 10000.0), by=0.20)
        assert msg.startswith("ib/eth = 1.100 < 1.200: ")
        assert "ib 11000.0 tokens/s" in msg and "eth 10000.0 tokens/s" in msg
        assert "+10.0% ahead" in msg
        assert "required: at least 20% ahead" in msg
        assert "[qwen2.5-7b, 8 node(s), 64 GPU(s)]" in msg

    def test_reference_slower_than_candidate_fails_with_negative_lead(self):
        msg = failure_message(assert_ahead, 80.0, 100.0, by=0.0)
        assert msg.startswith("reference/candidate = 0.800 < 1.000: ")
        assert "-20.0% ahead" in msg

    @pytest.mark.parametrize("reference", [120.0, 121.0, 500.0])
    def test_far_enough_ahead_passes(self, reference):
        assert assert_ahead(reference, 100.0, by=0.20) == pytest.approx(reference / 100.0)

    def test_negative_margin_is_rejected(self):
        with pytest.raises(ValueError, match="by must be >= 0"):
            assert_ahead(1.0, 1.0, by=-0.1)


class TestRatio:
    def test_uses_tokens_per_s_of_measurements(self):
        assert ratio(measurement("eth", 50.0), measurement("ib", 200.0)) == pytest.approx(0.25)

    @pytest.mark.parametrize("reference", [0.0, -1.0])
    def test_reference_must_be_positive(self, reference):
        with pytest.raises(ValueError, match="reference throughput must be positive"):
            ratio(1.0, reference)
