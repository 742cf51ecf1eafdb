"""The straggler rule on per-rank work: a steady excess is named, noise and one slow step are not."""

from __future__ import annotations

import random

from pytest_fabric.deciding.stragglers import gpu_lines, straggler_lines, stragglers


def steps(n: int, ranks: int, slow: dict[int, float] | None = None, seed: int = 0, spread: float = 0.03):
    rng = random.Random(seed)
    return [[0.4 * (1 + rng.gauss(0, spread)) * (slow or {}).get(r, 1.0) for r in range(ranks)] for _ in range(n)]


def test_a_rank_30_percent_slower_is_named_with_its_node():
    (found,) = stragglers(steps(20, 4, {3: 1.3}), local_world_size=2)
    assert (found.rank, found.node) == (3, "node 1") and 0.2 < found.excess < 0.4 and found.steps >= 18
    assert found.line().startswith(f"rank 3 on node 1 works {found.excess:.0%} longer per step than the others")
    hosts = ["a/10.0.0.1", "a/10.0.0.1", "b/10.0.0.2", "b/10.0.0.2"]
    (named,) = stragglers(steps(20, 4, {2: 1.3}), local_world_size=2, hosts=hosts)
    assert (named.rank, named.node) == (2, "b/10.0.0.2")


def test_a_node_whose_every_rank_is_slow_is_named_as_the_node():
    hosts = ["a", "a", "b", "b", "c", "c"]
    found = stragglers(steps(20, 6, {2: 1.4, 3: 1.4}), 2, hosts)
    assert [s.rank for s in found] == [2, 3]
    (line,) = straggler_lines(found, {"a": 2, "b": 2, "c": 2})
    assert line.startswith("b: all 2 ranks (2, 3)")
    # One rank of the node: the rank is named, not the node.
    (one,) = straggler_lines(stragglers(steps(20, 6, {3: 1.4}), 2, hosts), {"a": 2, "b": 2, "c": 2})
    assert one.startswith("rank 3 on b ")


def test_no_straggler_in_ten_quiet_runs():
    assert all(stragglers(steps(20, 4, seed=seed)) == [] for seed in range(10))


def test_one_slow_step_is_not_a_straggler():
    work = steps(20, 4)
    work[5][2] *= 3
    assert stragglers(work) == []


def test_one_rank_says_nothing():
    assert stragglers(steps(10, 1)) == [] and stragglers([]) == []


def test_gpu_runs_name_each_nodes_slowed_down_steps_and_a_low_clock():
    """Two nodes of two GPUs, 10 steps: rank 3 (node b) reports a thermal slowdown in 4 steps and runs
    at 1400 MHz against 1980; a software power cap (a busy GPU's normal state) on rank 0 is not named."""
    clocks = [[1980.0, 1980.0, 1975.0, 1400.0]] * 10
    masks = [[0x4, 0, 0, 0x40 if i < 4 else 0] for i in range(10)]
    health = [{"temperature_c": 60}, {"temperature_c": 61}, {"temperature_c": 62}, {"temperature_c": 88,
                                                                                    "ecc_uncorrected": 1}]
    (line,) = gpu_lines(clocks, masks, ["a", "a", "b", "b"], 2, health)
    assert line.startswith("b: GPU slowed down in 4 of 10 steps (hw_thermal_slowdown) on rank 3; rank 3's SM clock "
                           "1400 MHz against 1980 MHz")
    assert "rank 3 88 C" in line and "rank 3 1 uncorrected ECC errors" in line and "a:" not in line
    assert gpu_lines([[1980.0, 1970.0]] * 5, [[0x4, 0]] * 5) == []  # healthy: nothing to say
    (by_index,) = gpu_lines([[1980.0, 1200.0]] * 5, [[0, 0]] * 5)  # no host names: the node's index
    assert by_index.startswith("node 1: rank 1's SM clock 1200 MHz")
