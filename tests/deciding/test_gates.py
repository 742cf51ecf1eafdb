"""Gates: one-sided, and a failure message that carries both numbers, the ratio and the threshold."""

from __future__ import annotations

import pytest
from helpers import outcome as gate_outcome, train_measurement

from pytest_fabric import Measurement, assert_ahead, assert_within, ratio
from pytest_fabric.deciding.gates import InconclusiveWarning, apply_verdict, machine_fields
from pytest_fabric.deciding.contrasts import Verdict


def measurement(fabric: str, tokens_per_s: float, model: str = "qwen2.5-7b", nodes: int = 8) -> Measurement:
    return train_measurement(model, nodes, fabric, tokens_per_s, gpus_per_node=8)


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
        with pytest.raises(ValueError, match="rel must be a fraction in"):
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
        with pytest.raises(ValueError, match="by must be a fraction >= 0"):
            assert_ahead(1.0, 1.0, by=-0.1)


class TestRatio:
    def test_uses_tokens_per_s_of_measurements(self):
        assert ratio(measurement("eth", 50.0), measurement("ib", 200.0)) == pytest.approx(0.25)

    @pytest.mark.parametrize("reference", [0.0, -1.0])
    def test_reference_must_be_positive(self, reference):
        with pytest.raises(ValueError, match="reference throughput must be positive"):
            ratio(1.0, reference)


class TestJudge:
    """A comparison decided on repeated launches (``GateOutcome``) turned into the test's outcome."""

    def test_pass_returns_the_verdict_line(self):
        line = apply_verdict(gate_outcome(Verdict.PASS), note="predicted: never shown on a pass")
        assert line.startswith("pass: eth/ib = 0.981, 98.75% CI [0.962, 1.001] over 3+4 launches; ")
        assert "required >= 0.950 (eth at most 5% slower)" in line
        assert "eth 981.0 vs ib 1000.0 tokens/s [m, 2 node(s)]" in line
        # The noise the interval used, its source and degrees of freedom: on a pass as on a failure.
        assert "launch noise 1.6% on 8 df: learned from 3 nights, pooled with tonight's 4 df" in line
        assert "predicted" not in line and "re-run" not in line

    def test_failure_carries_the_line_and_the_note_below_it(self):
        msg = failure_message(apply_verdict, gate_outcome(Verdict.FAIL), note="predicted: eth 20% slower")
        first, second = msg.splitlines()
        assert first.startswith("interval wholly below the threshold: eth/ib = 0.981, ")
        assert second == "predicted: eth 20% slower"

    def test_rounds_run_again_are_named_in_the_line(self):
        again = ("re-run: m-n2-eth launch 1: 3 of 4 steps disturbed (cpu steal: 3)",)
        line = apply_verdict(gate_outcome(Verdict.PASS, reruns=again))
        assert "over 3+4 launches (re-run: m-n2-eth launch 1: 3 of 4 steps disturbed (cpu steal: 3))" in line
        assert ", 1 re-run;" in gate_outcome(Verdict.PASS, reruns=again).render("testcase")

    def test_extra_figure_follows_the_line(self):
        from dataclasses import replace

        line = apply_verdict(replace(gate_outcome(), extra="raw tokens/s tonight/baseline = 0.700"))
        assert line.endswith("; raw tokens/s tonight/baseline = 0.700")

    def test_inconclusive_xfails_by_default(self):
        with pytest.raises(pytest.xfail.Exception, match="^inconclusive after the launch budget: eth/ib = 0.981"):
            apply_verdict(gate_outcome(Verdict.INCONCLUSIVE))

    def test_inconclusive_can_fail(self):
        msg = failure_message(apply_verdict, gate_outcome(Verdict.INCONCLUSIVE), "fail", note="predicted: x")
        assert msg.startswith("inconclusive after the launch budget: ") and msg.endswith("\npredicted: x")

    def test_inconclusive_can_warn_and_pass(self):
        with pytest.warns(InconclusiveWarning, match="inconclusive after the launch budget"):
            line = apply_verdict(gate_outcome(Verdict.INCONCLUSIVE), "warn", note="predicted: x")
        assert line.startswith("inconclusive after the launch budget: eth/ib") and "predicted" not in line

    def test_fields_are_what_scripts_read(self):
        fields = machine_fields(gate_outcome(Verdict.FAIL, reruns=("a", "b")).record())
        assert fields["verdict"] == "fail" and fields["reruns"] == "2" and fields["launches"] == "3+4"
        assert fields["noise_df"] == "8" and fields["noise_source"] == "learned from 3 nights"
        assert all(isinstance(v, str) for v in fields.values())


