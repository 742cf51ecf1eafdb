"""The link test's rank program (workload/pairs.py) and its contract (workload/pair_types.py): ranks
grouped by node, the payload sized from the link rate."""

from __future__ import annotations

from pytest_fabric.workload.pair_types import payload_for
from pytest_fabric.workload.pairs import node_ranks


def test_the_payload_is_sized_from_the_link_rate():
    assert payload_for(None) is None  # unknown rate: the backend's largest payload
    assert payload_for(0.4) == 10_000_000  # 0.2 s at 400 Mbit/s
    assert payload_for(0.001) == 1 << 20 and payload_for(1e6) == 1 << 30  # between 1 MiB and 1 GiB
    assert payload_for(3.3, ranks_per_pair=16) % (4 * 16) == 0


def test_ranks_are_grouped_by_their_node():
    # Two ranks a node, named by PYTEST_FABRIC_NODE; torchrun's node rank tells nodes apart.
    assert node_ranks([(0, "node0/a"), (0, "node0/a"), (1, "node1/b"), (1, "node1/b")]) == {
        "node0/a": [0, 1], "node1/b": [2, 3]}
    # One host name in every container: still two nodes.
    assert node_ranks([(0, "c"), (1, "c")]) == {"c (node rank 0)": [0], "c (node rank 1)": [1]}
    assert node_ranks([(-1, "x"), (-1, "y"), (-1, "x")]) == {"x": [0, 2], "y": [1]}  # no node rank: by name
