"""The physical floor's arithmetic against hand-computed values (floor.py)."""

from __future__ import annotations

import pytest

from pytest_fabric.core.fabrics import FabricConfigError, build_table
from pytest_fabric.physics.floor import (Floor, collective_node_gbit, floor_for, impossible_payloads, node_bytes,
                                 transport_hint)
from pytest_fabric.core.models import get_model
from pytest_fabric.workload.result import CollectiveRow

# 1e9 parameters, bf16 parameters and gradients: 2e9 bytes of each.
N = 1e9


def test_full_shard_two_nodes_moves_three_model_sizes_halved_each_way():
    # in: 1/2 x 2 gathers x 2e9 + 2e9 / 2 = 3e9; out: 1/2 x 2e9 + 2 x 2e9 / 2 = 3e9.
    assert node_bytes(N, 2) == pytest.approx((3e9, 3e9))


def test_full_shard_eight_nodes_counts_each_direction_separately():
    # in: 7/8 x 4e9 + 2e9/8 = 3.75e9; out: 7/8 x 2e9 + 4e9/8 = 2.25e9.
    assert node_bytes(N, 8) == pytest.approx((3.75e9, 2.25e9))
    floor = Floor(8, *node_bytes(N, 8), link_gbit=100)
    assert floor.bytes == pytest.approx(3.75e9)
    assert floor.step_s == pytest.approx(3.75e9 * 8 / 100e9)  # 0.3 s


def test_root_unit_is_gathered_once():
    # 2e8 of the parameters stay gathered from forward through backward: 2 x 2e9 - 2 x 2e8 gathered.
    gathered = 2 * 2e9 - 2 * 2e8
    assert node_bytes(N, 2, root_params=2e8) == pytest.approx((gathered / 2 + 1e9, 1e9 + gathered / 2))


def test_no_reshard_gathers_once_and_fp32_gradients_double_the_reduce():
    # in: 1/2 x 2e9 + 4e9/2 = 3e9; out: 1/2 x 4e9 + 2e9/2 = 3e9.
    assert node_bytes(N, 2, grad_bytes=4, sharding="no-reshard") == pytest.approx((3e9, 3e9))
    assert node_bytes(N, 4, sharding="no-reshard") == pytest.approx((0.75 * 2e9 + 0.5e9, 0.75 * 2e9 + 0.5e9))


def test_hybrid_moves_the_gradients_once_each_way_whatever_the_node_count():
    assert node_bytes(N, 2, sharding="hybrid") == (2e9, 2e9)
    assert node_bytes(N, 16, sharding="hybrid") == (2e9, 2e9)


def test_one_node_has_no_floor():
    assert node_bytes(N, 1) == (0.0, 0.0)
    floor = Floor(1, 0.0, 0.0, 100)
    assert not floor.impossible(1e-6)
    assert "one node" in floor.line(1e-3, "eth")


def test_bad_arguments_say_what_is_allowed():
    with pytest.raises(ValueError, match="sharding"):
        node_bytes(N, 2, sharding="zero3")
    with pytest.raises(ValueError, match="nodes"):
        node_bytes(N, 0)
    with pytest.raises(ValueError, match="link rate"):
        floor_for(get_model("qwen2.5-7b"), 2, 0)


def test_qwen25_7b_on_eight_nodes_needs_the_published_rate():
    spec = get_model("qwen2.5-7b")
    total, non_embedding = spec.param_count()
    floor = floor_for(spec, 8, 80)
    root = total - non_embedding
    expected_in = 7 / 8 * (2 * 2 * total - 2 * root) + 2 * total / 8
    assert floor.bytes == pytest.approx(expected_in)
    # 26.65 GB one way over 80 Gbit/s: 2.67 s is the shortest step.
    assert floor.step_s == pytest.approx(expected_in * 8 / 80e9)
    assert floor.step_s == pytest.approx(2.665, abs=0.001)


def test_a_step_beyond_the_tolerance_is_impossible_and_the_message_has_the_numbers():
    floor = Floor(2, 3e9, 3e9, link_gbit=80, tolerance=0.10)  # floor step 0.3 s
    assert floor.implied_gbit(0.3) == pytest.approx(80)
    assert not floor.impossible(0.3 / 1.09)  # 87 Gbit/s: inside the 10% tolerance
    assert floor.impossible(0.3 / 1.11)  # 89 Gbit/s
    assert floor.problem(0.3, "eth") is None
    message = floor.problem(0.075, "eth", transport_hint({"NCCL_NET": "Socket"}, "emulated"))
    assert message == ("eth: 0.075 s/step needs >= 320 Gbit/s per node across the fabric; eth's link is 80 "
                       "Gbit/s: this traffic did not cross eth (check NCCL's socket interface: NCCL prefers "
                       "ib* interfaces)")
    assert transport_hint({"NCCL_NET": "IB"}, "nominal").endswith(
        "or the link is faster than the fabric's nominal rate: declare it with fabric_link_gbit")
    line = floor.line(0.075, "eth")
    assert "floor 300.0 ms/step" in line and "measured 75.0 ms/step" in line and line.endswith("IMPOSSIBLE")


def test_a_link_rate_is_declared_for_a_known_fabric_only():
    assert build_table(link_gbit={"eth": 80})["eth"].declared_gbit == 80  # which rate wins: test_link_rate.py
    with pytest.raises(FabricConfigError, match="unknown fabric"):
        build_table(link_gbit={"nope": 1})


def test_a_collective_needs_its_bytes_into_each_node_whatever_the_algorithm():
    # all_reduce of 1e9 bytes in 1 s: each node must take in the whole buffer (8 Gbit/s), in-network
    # reduction included; all_gather on 4 nodes: the 3/4 of it the node lacks.
    assert collective_node_gbit("all_reduce", 1e9, 1.0, 4) == pytest.approx(8.0)
    assert collective_node_gbit("all_gather", 1e9, 1.0, 4) == pytest.approx(6.0)
    assert collective_node_gbit("reduce_scatter", 1e9, 1.0, 2) == pytest.approx(4.0)


def test_payloads_faster_than_the_link_are_flagged_each():
    # The 16 KiB all_reduce the token bucket let through at 1.5 Gbit/s on the 0.4 Gbit/s eth link.
    rows = [CollectiveRow("all_reduce", 16384, 16384 * 8 / 1.524e9, 0.19, 0.19),
            CollectiveRow("all_reduce", 16 << 20, (16 << 20) * 8 / 0.382e9, 0.048, 0.048)]
    (flagged,) = impossible_payloads(rows, 2, 0.4)
    assert flagged.startswith("all_reduce at 16.4 kB needs >= 1.52 Gbit/s per node")
    assert impossible_payloads(rows, 2, 2.0) == []
    assert impossible_payloads(rows, 1, 0.4) == []  # one node: nothing crossed a link
