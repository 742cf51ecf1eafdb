"""The analytical model: bytes, bounds, labels, calibration and cost, against hand computation."""

from __future__ import annotations

import itertools
import random

import pytest

from pytest_fabric.core.models import ModelSpec, get_model
from pytest_fabric.physics.cost import break_even_premium, break_even_price, cost_per_million_tokens
from pytest_fabric.physics.fit import calibrate
from pytest_fabric.physics.comparison import fit_flops, predict_comparison
from pytest_fabric.physics.step_model import (JobShape, Observation, bytes_per_param, node_traffic_bytes,
                                              predict_penalty, predict_step)

# A Llama small enough to count by hand: hidden 8, MLP 16, 2 layers, 2 heads of 4, 1 KV head,
# vocabulary 10, untied.
#   per layer: q 8*8 + kv 2*8*4 + o 8*8 + MLP 3*8*16 + 2 norms of 8 = 64+64+64+384+16 = 592
#   non-embedding: 2*592 + final norm 8 = 1192; embeddings + head: 2*10*8 = 160; total 1352
HAND = ModelSpec("hand", "llama", {
    "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": False,
}, "hand-countable", batch_size=1, seq_len=4)

CPU_FLOPS = 2e10  # what a CPU rank of the emulated cluster achieves, roughly


class TestBytes:
    def test_hand_model_counts(self):
        assert HAND.param_count() == (1352, 1192)

    def test_headline_formula(self):
        # (n-1)/n x N x (2 b_param + b_grad) a node sends, 2 nodes x 2 GPUs, the root gathered once:
        # 0.75 x (1192 x 2 x 2 + 160 x 2 + 1352 x 2) = 5844 in bf16, twice that in fp32.
        assert node_traffic_bytes(JobShape(HAND, 2, 2)) == pytest.approx(5844)
        assert node_traffic_bytes(JobShape(HAND, 2, 2, dtype="fp32")) == pytest.approx(2 * 5844)
        assert node_traffic_bytes(JobShape(HAND, 1, 8)) == 0

    def test_seven_b_moves_about_six_n_bytes(self):
        total, non_embedding = get_model("qwen2.5-7b").param_count()
        root = total - non_embedding
        assert node_traffic_bytes(JobShape(get_model("qwen2.5-7b"), 2, 8)) == pytest.approx(
            15 / 16 * (4 * non_embedding + 2 * root + 2 * total))

    def test_hybrid_sharding_crosses_nodes_with_one_gradient_all_reduce(self):
        # 2 (n-1)/n x N x b_grad per node, whatever the GPUs per node: 1352 x 2 bytes at 2 nodes.
        assert node_traffic_bytes(JobShape(HAND, 2, 2, sharding="hybrid")) == pytest.approx(1352 * 2)
        assert node_traffic_bytes(JobShape(HAND, 8, 8, sharding="hybrid")) == pytest.approx(2 * 7 / 8 * 1352 * 2)
        # fp32 gradient reduction under bf16 compute doubles it.
        assert node_traffic_bytes(JobShape(HAND, 2, 2, sharding="hybrid", grad_bytes=4)) == pytest.approx(1352 * 4)

    def test_gradient_accumulation_gathers_once_more_per_micro_batch_and_reduces_once(self):
        one, four = (node_traffic_bytes(JobShape(HAND, 2, 2, grad_accum=k)) for k in (1, 4))
        assert four - one == pytest.approx(0.75 * 3 * 1192 * 2)  # three more backward gathers of the layers
        assert node_traffic_bytes(JobShape(HAND, 2, 2, sharding="hybrid", grad_accum=4)) == pytest.approx(1352 * 2)

    def test_gloo_reduces_scatter_as_an_all_reduce(self):
        nccl, gloo = (node_traffic_bytes(JobShape(HAND, 2, 2, backend=b)) for b in ("nccl", "gloo"))
        assert gloo - nccl == pytest.approx(0.75 * 1352 * 2)

    def test_prediction_moves_the_root_once_and_times_it_at_the_node_rate(self):
        p = predict_step(JobShape(HAND, nodes=2, gpus_per_node=2), flops_per_s=1e9, inter_gbit=1.0,
                         link_efficiency=1.0)
        assert p.node_bytes == pytest.approx(5844)
        # One node's NIC carries one rank's share: 5844 bytes at 1 Gbit/s.
        assert p.traffic_s == pytest.approx(5844 / 1.25e8)
        assert p.world == 4

    def test_hybrid_prediction_times_the_gradient_all_reduce_at_the_node_rate(self):
        p = predict_step(JobShape(HAND, nodes=2, gpus_per_node=2, sharding="hybrid"), flops_per_s=1e9,
                         inter_gbit=1.0, link_efficiency=1.0)
        assert p.node_bytes == pytest.approx(1352 * 2)
        assert p.traffic_s == pytest.approx(1352 * 2 / 1.25e8)  # NVLink never the bottleneck (no intra rate)

    def test_dtype_bytes(self):
        assert bytes_per_param("bf16") == 2 and bytes_per_param("fp32") == 4
        fp32 = predict_step(JobShape(HAND, 2, dtype="fp32"), flops_per_s=1e9, inter_gbit=1.0)
        bf16 = predict_step(JobShape(HAND, 2, dtype="bf16"), flops_per_s=1e9, inter_gbit=1.0)
        assert fp32.node_bytes == pytest.approx(2 * bf16.node_bytes)
        with pytest.raises(ValueError):
            bytes_per_param("int3")


class TestStep:
    def test_compute_time_from_flops(self):
        p = predict_step(JobShape(HAND, nodes=1), flops_per_s=1e6)
        assert p.compute_s == pytest.approx(1 * 4 * HAND.flops_per_token(4) / 1e6)
        assert p.step_s == pytest.approx(p.compute_s)
        assert p.traffic_s == 0 and p.tokens_per_s == pytest.approx(4 / p.step_s)

    @pytest.mark.parametrize(("model", "nodes", "gbit"), itertools.product(
        ["qwen2-tiny", "llama-wide", "qwen2.5-7b", "llama-3.1-70b"], [1, 2, 4, 8], [0.1, 0.4, 4.0, 100.0, 3200.0]))
    def test_bounds_hold(self, model, nodes, gbit):
        p = predict_step(JobShape(get_model(model), nodes, gpus_per_node=2), flops_per_s=CPU_FLOPS, inter_gbit=gbit,
                         intra_gbit=1000.0, overhead_s=0.01)
        assert max(p.compute_s, p.comm_s) + p.exposed_s + p.overhead_s == pytest.approx(p.lower_s)
        assert p.compute_s + p.comm_s + p.exposed_s + p.overhead_s == pytest.approx(p.upper_s)
        rounding = 1e-12 * p.upper_s  # per-layer terms summed against whole-step totals
        assert p.lower_s - rounding <= p.step_s <= p.upper_s + rounding

    def test_overhead_only_across_nodes(self):
        one = predict_step(JobShape(HAND, 1), flops_per_s=1e9, overhead_s=0.5)
        two = predict_step(JobShape(HAND, 2), flops_per_s=1e9, inter_gbit=1e6, overhead_s=0.5)
        assert one.overhead_s == 0 and two.overhead_s == 0.5
        assert two.step_s == pytest.approx(one.step_s + 0.5, rel=1e-3)

    def test_tiny_model_with_many_tokens_is_compute_bound(self):
        p = predict_step(JobShape(get_model("qwen2-tiny"), 2, dtype="fp32"), flops_per_s=CPU_FLOPS, inter_gbit=0.4)
        assert p.bound == "compute"
        assert p.traffic_ratio < 0.01

    def test_wide_model_with_few_tokens_is_communication_bound(self):
        p = predict_step(JobShape(get_model("llama-wide"), 2, dtype="fp32"), flops_per_s=CPU_FLOPS, inter_gbit=0.4)
        assert p.bound == "communication"
        assert p.step_s == pytest.approx(p.traffic_s, rel=0.05)

    def test_needs_a_fabric_rate_across_nodes(self):
        with pytest.raises(ValueError):
            predict_step(JobShape(HAND, 2), flops_per_s=1e9)


class TestPenalty:
    def test_compute_bound_cannot_tell_the_fabrics_apart(self):
        pen = predict_penalty(JobShape(get_model("qwen2-tiny"), 2, dtype="fp32"), flops_per_s=CPU_FLOPS, fast_gbit=4.0,
                              slow_gbit=0.4)
        assert pen.label == "compute-bound"
        assert not pen.distinguishable
        assert "cannot tell the fabrics apart" in pen.message
        assert pen.ratio > 0.98

    def test_communication_bound_shows_the_fabric(self):
        pen = predict_penalty(JobShape(get_model("llama-wide"), 2, dtype="fp32"), flops_per_s=CPU_FLOPS, fast_gbit=4.0,
                              slow_gbit=0.4)
        assert pen.label == "communication-bound"
        assert pen.distinguishable
        assert pen.ratio < 0.5 and pen.advantage > 1.0

    def test_one_node_never_shows_the_fabric(self):
        pen = predict_penalty(JobShape(get_model("llama-wide"), 1), flops_per_s=CPU_FLOPS, fast_gbit=4.0, slow_gbit=0.4)
        assert pen.label == "single-node" and pen.ratio == 1.0 and not pen.distinguishable

    @pytest.mark.parametrize("model", ["llama-wide", "qwen2.5-7b"])
    def test_penalty_grows_as_the_slow_link_slows(self, model):
        ratios = [predict_penalty(JobShape(get_model(model), 2, gpus_per_node=8 if model == "qwen2.5-7b" else 1),
                                  flops_per_s=CPU_FLOPS if model == "llama-wide" else 400e12,
                                  fast_gbit=3200.0, slow_gbit=slow).ratio
                  for slow in (1600.0, 400.0, 100.0, 25.0, 5.0)]
        assert all(a > b for a, b in zip(ratios, ratios[1:]))
        assert ratios[0] <= 1.0

    def test_seven_b_on_tcp_ethernet_against_infiniband(self):
        # 8 x 400 Gb/s NDR per node against 100 GbE, H100s at 40% of peak: the slow fabric shows.
        pen = predict_penalty(JobShape(get_model("qwen2.5-7b"), 2, 8, 2, 2048), flops_per_s=0.4 * 989e12,
                              fast_gbit=3200.0, slow_gbit=100.0, intra_gbit=3600.0)
        assert pen.fast.bound == "compute"
        assert pen.label == "communication-bound"


def synthetic(flops_per_s: float, overhead_s: float, efficiency: float, noise: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    obs = []
    for model, nodes, gbit in [("qwen2-tiny", 1, None), ("llama-wide", 1, None), ("qwen2-tiny", 2, 4.0),
                               ("qwen2-tiny", 2, 0.4), ("llama-wide", 2, 4.0), ("llama-wide", 2, 0.4),
                               ("llama-wide", 4, 2.0), ("qwen2-tiny", 4, 0.2)]:
        spec = get_model(model)
        template = Observation(JobShape(spec, nodes, dtype="fp32"), 1.0, inter_gbit=gbit)
        step = template.predict(flops_per_s, overhead_s, efficiency).step_s * (1 + rng.gauss(0, noise))
        obs.append(Observation(JobShape(spec, nodes, dtype="fp32"), step, inter_gbit=gbit))
    return obs


class TestCalibrate:
    def test_recovers_the_parameters_that_generated_the_measurements(self):
        cal = calibrate(synthetic(3.0e10, 0.08, 0.88), link_efficiency=0.88)
        assert cal.flops_per_s == pytest.approx(3.0e10, rel=1e-3)
        assert cal.overhead_s == pytest.approx(0.08, rel=1e-2)
        assert cal.max_abs_error < 1e-3
        assert len(cal.errors) == 8

    def test_noisy_measurements_give_close_parameters_and_small_errors(self):
        cal = calibrate(synthetic(1.5e10, 0.05, 0.88, noise=0.03, seed=1), link_efficiency=0.88)
        assert cal.flops_per_s == pytest.approx(1.5e10, rel=0.1)
        assert cal.overhead_s == pytest.approx(0.05, abs=0.03)
        assert cal.rms_error < 0.06

    def test_without_multi_node_measurements_the_overhead_is_zero(self):
        obs = [o for o in synthetic(2e10, 0.1, 0.9) if o.shape.nodes == 1]
        cal = calibrate(obs)
        assert cal.overhead_s == 0 and cal.flops_per_s == pytest.approx(2e10, rel=1e-3)

    def test_calibration_predicts(self):
        cal = calibrate(synthetic(2e10, 0.05, 0.9))
        p = cal.predict(JobShape(get_model("llama-wide"), 2, dtype="fp32"), inter_gbit=1.0)
        expected = predict_step(JobShape(get_model("llama-wide"), 2, dtype="fp32"), flops_per_s=2e10, inter_gbit=1.0,
                                overhead_s=0.05, link_efficiency=0.9)
        assert p.step_s == pytest.approx(expected.step_s, rel=1e-3)

    def test_needs_observations(self):
        with pytest.raises(ValueError):
            calibrate([])


class TestComparison:
    def test_fit_flops_reproduces_the_measured_step(self):
        spec = get_model("llama-wide")
        true = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=3e9, inter_gbit=2.0)
        assert true.bound != "communication"
        obs = Observation(JobShape(spec, 2, dtype="fp32"), true.step_s, inter_gbit=2.0)
        assert fit_flops(obs) == pytest.approx(3e9, rel=1e-6)

    def test_a_step_that_is_all_transfer_fits_the_smallest_throughput_that_hides_compute(self):
        spec = get_model("llama-wide")
        true = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=3e10, inter_gbit=2.0)
        theta = fit_flops(Observation(JobShape(spec, 2, dtype="fp32"), true.step_s, inter_gbit=2.0))
        assert theta < 3e10
        again = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=theta, inter_gbit=2.0)
        assert again.step_s == pytest.approx(true.step_s, rel=1e-6)

    def test_a_step_shorter_than_its_transfer_cannot_be_fitted(self):
        spec = get_model("llama-wide")
        fast = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=1e30, inter_gbit=2.0)
        with pytest.raises(ValueError, match="shorter than the predicted transfer"):
            fit_flops(Observation(JobShape(spec, 2, dtype="fp32"), fast.step_s * 0.9, inter_gbit=2.0))

    def test_penalty_predicted_from_the_fast_side_alone(self):
        spec = get_model("llama-wide")
        fast = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=3e9, inter_gbit=2.0)
        slow = predict_step(JobShape(spec, 2, dtype="fp32"), flops_per_s=3e9, inter_gbit=0.4)
        cp = predict_comparison(JobShape(spec, 2, dtype="fp32"), rates={"eth": 0.4, "ib": 2.0}, fast_step_s=fast.step_s)
        assert (cp.fast, cp.slow) == ("ib", "eth")
        assert cp.flops_per_s == pytest.approx(3e9, rel=1e-6)
        assert cp.slowdown == pytest.approx(1 - fast.step_s / slow.step_s, rel=1e-6)
        line = cp.line((0.5, 0.45, 0.55, 0.95))
        assert line.startswith(f"predicted: eth {cp.slowdown * 100:.1f}% slower than ib (traffic/compute ")
        assert "measured: eth 50.0% slower, 95% CI of the slowdown [+45.0%, +55.0%]" in line
        assert f"prediction off by {(cp.slowdown - 0.5) * 100:+.1f} points" in line

    def test_compute_bound_label_follows_the_threshold(self):
        spec = get_model("qwen2-tiny")
        cp = predict_comparison(JobShape(spec, 2, dtype="fp32"), rates={"ib": 2.0, "eth": 0.4}, flops_per_s=CPU_FLOPS)
        assert cp.penalty.slow.traffic_ratio < 0.5 and cp.compute_bound
        assert "compute-bound: cannot tell the fabrics apart" in cp.line()
        wide = predict_comparison(JobShape(get_model("llama-wide"), 2, dtype="fp32"), rates={"ib": 2.0, "eth": 0.4},
                                  flops_per_s=CPU_FLOPS)
        assert not wide.compute_bound and "compute-bound" not in wide.line()

    def test_one_node_and_equal_rates_predict_no_difference(self):
        spec = get_model("llama-wide")
        one = predict_comparison(JobShape(spec, 1), rates={"ib": 2.0, "eth": 0.4}, flops_per_s=CPU_FLOPS)
        assert one.penalty is None and "one node" in one.line() and one.compute_bound
        same = predict_comparison(JobShape(spec, 2), rates={"ib": 2.0, "eth": 2.0}, flops_per_s=CPU_FLOPS)
        assert same.slowdown == 0 and "both 2 Gbit/s" in same.line()

    def test_needs_a_throughput_or_a_step(self):
        with pytest.raises(ValueError, match="neither"):
            predict_comparison(JobShape(get_model("llama-wide"), 2), rates={"ib": 2.0, "eth": 0.4})
        with pytest.raises(ValueError, match="no link rate"):
            predict_comparison(JobShape(get_model("llama-wide"), 2), rates={"ib": 2.0, "eth": None}, flops_per_s=1e10)


class TestCost:
    def test_dollars_per_million_tokens(self):
        # 8 GPUs at $2/GPU-hour = $16/hour for 3.6 M tokens.
        assert cost_per_million_tokens(1000.0, 8, 2.0) == pytest.approx(16 / 3.6)

    def test_break_even(self):
        assert break_even_premium(1250.0, 1000.0) == pytest.approx(0.25)
        assert break_even_price(1250.0, 1000.0, 2.0) == pytest.approx(2.5)
        # At that price both fabrics cost the same per token.
        assert cost_per_million_tokens(1250.0, 8, 2.5) == pytest.approx(cost_per_million_tokens(1000.0, 8, 2.0))

    def test_a_fabric_that_is_not_faster_is_worth_no_premium(self):
        assert break_even_premium(1000.0, 1000.0) == 0
        assert break_even_premium(900.0, 1000.0) < 0

    def test_rejects_nonsense(self):
        with pytest.raises(ValueError):
            cost_per_million_tokens(0.0, 8, 2.0)
        with pytest.raises(ValueError):
            break_even_premium(1000.0, 0.0)


def test_recorded_bytes_reads_torch_dtype_names_from_a_result():
    from pytest_fabric.physics.step_model import recorded_bytes

    assert recorded_bytes({"dtype": "float32", "reduce_dtype": "float32"}) == (4, 4)
    assert recorded_bytes({"dtype": "bfloat16", "reduce_dtype": "float32"}) == (2, 4)
    assert recorded_bytes({"dtype": "bfloat16"}) == (2, 2)  # reduced in the compute dtype
    assert recorded_bytes({}) == (2, 2)


@pytest.mark.parametrize("item, parsed", [("ib=3.50", ("ib", 3.5)), (" eth = 2.9 ", ("eth", 2.9)), ("eth=400", ("eth", 400.0))])
def test_a_per_fabric_number_reads_name_and_value(item, parsed):
    from pytest_fabric.core.fabrics import fabric_value

    assert fabric_value(item) == parsed


@pytest.mark.parametrize("item", ["ib", "ib=", "ib=abc", "ib=0", "ib=-1", "ib=inf", "ib=nan", "=1", " = 2"])
def test_a_per_fabric_number_refuses_what_is_not_a_name_and_a_positive_number(item):
    from pytest_fabric.core.fabrics import fabric_value

    with pytest.raises(ValueError, match="positive number"):
        fabric_value(item)
