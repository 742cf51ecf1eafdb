"""The link test's rule (deciding/slow_links.py): which node's link is slow, from every pair measured alone."""

from __future__ import annotations

import itertools

import pytest

from pytest_fabric.deciding.slow_links import OK, SLOW, UNDECIDED, CannotJudge, Pair, all_nodes_line, judge

RATE = 2.0  # Gbit/s per node


def pairs_of(nodes: list[str], link: dict[str, float]) -> list[Pair]:
    """Every pair, each at the pace of its slower link (a pair alone moves at its slower node's rate),
    a little below the rate as a real link is (95%)."""
    return [Pair(a, b, 0.95 * min(link[a], link[b])) for a, b in itertools.combinations(nodes, 2)]


def nodes_with(n: int, slow: dict[int, float]) -> tuple[list[str], list[Pair]]:
    nodes = [f"node{i}" for i in range(n)]
    return nodes, pairs_of(nodes, {name: RATE * slow.get(i, 1.0) for i, name in enumerate(nodes)})


@pytest.mark.parametrize("n, bad", [(4, 2), (4, 0), (3, 1), (8, 7)])
def test_one_slow_node_is_named_and_the_others_pass(n, bad):
    nodes, pairs = nodes_with(n, {bad: 0.5})
    verdict = judge(nodes, pairs, RATE, "declared")
    assert verdict.slow_nodes == [f"node{bad}"]
    assert {node: s for node, s in verdict.states.items() if s != OK} == {f"node{bad}": SLOW}
    line = verdict.node_line(f"node{bad}")
    # The numbers: its best pair against the rate, and each of its pairs.
    assert line.startswith(f"node{bad} slow") and "0.950 Gbit/s" in line and "48%" in line and "2 Gbit/s" in line
    assert "declared" in line and verdict.summary().startswith(f"slow node(s): node{bad}")
    good = next(node for node in nodes if node != f"node{bad}")
    assert verdict.node_line(good).startswith(f"{good} ok")


def test_two_slow_nodes_are_each_named_through_their_pairs_with_good_ones():
    nodes, pairs = nodes_with(4, {1: 0.5, 3: 0.4})
    verdict = judge(nodes, pairs, RATE)
    assert verdict.slow_nodes == ["node1", "node3"]
    assert verdict.states["node0"] == verdict.states["node2"] == OK
    assert not verdict.slow_paths  # node1-node3 is slow for its nodes, not for the path


def test_two_nodes_name_the_pair_and_cannot_tell_which():
    nodes, pairs = nodes_with(2, {1: 0.5})
    verdict = judge(nodes, pairs, RATE)
    assert verdict.states == {"node0": UNDECIDED, "node1": UNDECIDED}
    assert verdict.slow_nodes == []
    reason = verdict.node_line("node0")
    assert "node0-node1" in reason and "cannot tell which" in reason and "third node" in reason


def test_every_pair_slow_names_nobody():
    nodes, pairs = nodes_with(3, {1: 0.5, 2: 0.5})  # any two of three nodes explain it
    verdict = judge(nodes, pairs, RATE)
    assert set(verdict.states.values()) == {UNDECIDED}
    assert "every pair is below" in verdict.summary()


def test_a_slow_pair_of_good_nodes_is_the_path_between_them():
    nodes, pairs = nodes_with(4, {})
    pairs = [Pair(p.a, p.b, 0.9) if (p.a, p.b) == ("node0", "node3") else p for p in pairs]
    verdict = judge(nodes, pairs, RATE)
    assert verdict.slow_nodes == [] and set(verdict.states.values()) == {OK}
    assert [p.name for p in verdict.slow_paths] == ["node0-node3"]
    assert "node0-node3" in verdict.summary() and "path" in verdict.summary()


def test_healthy_links_pass():
    nodes, pairs = nodes_with(8, {})
    verdict = judge(nodes, pairs, RATE)
    assert set(verdict.states.values()) == {OK} and not verdict.slow_paths
    assert verdict.summary().startswith("every node's link reaches 85%")


def test_without_a_rate_the_fastest_pair_is_the_reference():
    # No link rate known (a real cluster, none declared): held to the fastest pair. With one slow
    # node in three, two of the three pairs are slow, so the median pair would hide it.
    nodes, pairs = nodes_with(3, {0: 0.5})
    verdict = judge(nodes, pairs, None)
    assert verdict.slow_nodes == ["node0"]
    assert verdict.reference_gbit == pytest.approx(0.95 * RATE)
    assert "fastest pair, node1-node2" in verdict.node_line("node0")


def test_one_pair_without_a_rate_cannot_be_judged():
    nodes, pairs = nodes_with(2, {})
    with pytest.raises(CannotJudge, match="--fabric-link-gbit"):
        judge(nodes, pairs, None)
    with pytest.raises(CannotJudge, match="two nodes"):
        judge(["node0"], [], RATE)


def test_the_threshold_is_85_percent_of_the_rate():
    nodes = ["a", "b", "c"]
    at = [Pair("a", "b", 0.85 * RATE), Pair("a", "c", 0.849 * RATE), Pair("b", "c", 0.849 * RATE)]
    verdict = judge(nodes, at, RATE)
    assert verdict.states == {"a": OK, "b": OK, "c": SLOW}


def test_all_nodes_line_reads_the_all_node_figure_against_the_pairs():
    nodes, pairs = nodes_with(4, {2: 0.5})
    ok, line = all_nodes_line(0.93, 4, judge(nodes, pairs, RATE))
    assert not ok and "node2" in line and "0.930 Gbit/s" in line and "slowest node" in line
    healthy = judge(*nodes_with(4, {}), RATE)
    ok, line = all_nodes_line(1.9, 4, healthy)
    assert ok and "every node's link reaches" in line
    # Every node good alone, the all-node figure low: lost at scale, no node named.
    ok, line = all_nodes_line(1.0, 4, healthy)
    assert not ok and "lost at scale" in line and not any(f"node{i}" in line for i in range(4))
    ok, line = all_nodes_line(0.9, 2, judge(*nodes_with(2, {0: 0.5}), RATE))
    assert not ok and "cannot tell which" in line
