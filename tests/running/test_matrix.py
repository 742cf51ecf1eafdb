"""The model x nodes x fabric matrix: a fixed order, powers of two, never more nodes than the cluster."""

from __future__ import annotations

import pytest

from pytest_fabric import Case
from pytest_fabric.running.matrix import expand, powers_of_two_up_to


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, [1]), (2, [1, 2]), (3, [1, 2]), (4, [1, 2, 4]), (7, [1, 2, 4]), (8, [1, 2, 4, 8]), (100, [1, 2, 4, 8, 16, 32, 64])],
)
def test_powers_of_two_up_to(n, expected):
    assert powers_of_two_up_to(n) == expected


def test_order_is_model_then_nodes_then_fabric():
    cases = expand(["b-model", "a-model"], 4, ["ib", "eth"])
    assert [c.id for c in cases] == [
        "b-model-n1-ib", "b-model-n1-eth", "b-model-n2-ib", "b-model-n2-eth", "b-model-n4-ib", "b-model-n4-eth",
        "a-model-n1-ib", "a-model-n1-eth", "a-model-n2-ib", "a-model-n2-eth", "a-model-n4-ib", "a-model-n4-eth",
    ]


def test_default_nodes_are_powers_of_two_up_to_max():
    assert sorted({c.nodes for c in expand(["m"], 6, ["ib"])}) == [1, 2, 4]


@pytest.mark.parametrize("max_nodes", [1, 2, 3, 5, 8, 16])
def test_never_more_nodes_than_the_cluster(max_nodes):
    cases = expand(["m"], max_nodes, ["ib"], nodes=[1, 2, 3, 4, 8, 16, 32])
    assert cases and max(c.nodes for c in cases) <= max_nodes


def test_explicit_nodes_are_sorted_deduplicated_and_capped():
    cases = expand(["m"], 4, ["ib"], nodes=[4, 16, 2, 2, 3])
    assert [c.nodes for c in cases] == [2, 3, 4]


def test_min_nodes_drops_single_node_cases():
    assert [c.id for c in expand(["m"], 4, ["eth"], min_nodes=2)] == ["m-n2-eth", "m-n4-eth"]


def test_nothing_fits_gives_no_cases():
    assert expand(["m"], 2, ["ib"], nodes=[4, 8]) == []


def test_same_inputs_same_cases():
    # Every xdist worker expands independently; the ids must agree.
    args = (["qwen2-tiny", "llama-wide"], 8, ["ib", "eth", "roce"])
    assert expand(*args) == expand(*args)


def test_case_id_and_with_fabric():
    case = Case("llama-3.1-70b", 8, "eth")
    assert case.id == "llama-3.1-70b-n8-eth"
    assert case.with_fabric("ib") == Case("llama-3.1-70b", 8, "ib")
    assert case.crosses_fabric and not Case("m", 1, "eth").crosses_fabric


def test_case_with_nodes_and_bandwidth_cases():
    case = Case("qwen2-tiny", 4, "eth")
    assert case.with_nodes(1) == Case("qwen2-tiny", 1, "eth") and not case.with_nodes(1).crosses_fabric
    assert Case("collectives", 2, "ib").is_bandwidth and not case.is_bandwidth


@pytest.mark.parametrize("case", [Case("qwen2-tiny", 2, "eth"), Case("llama-3.1-70b", 16, "roce"),
                                  Case("m-n2-x", 1, "ib"), Case("a-b", 8, "my_fabric.v2-1")])
def test_case_id_parses_back(case):
    from pytest_fabric.core.case import Case as CaseHere

    assert CaseHere.parse(case.id) == case
    # The package's Case is the one in case.py: every module (matrix, measure, results) shares it.
    assert Case is CaseHere


@pytest.mark.parametrize("text", ["qwen2-tiny", "qwen2-tiny-n2", "qwen2-tiny-nX-eth", "qwen2-tiny-n2-Eth", "-n2-"])
def test_not_a_case_id(text):
    with pytest.raises(ValueError, match="is not a case id"):
        Case.parse(text)


def test_the_sharding_axis_sits_between_nodes_and_fabric_and_one_node_has_one_layout():
    cases = expand(["m"], 2, ["ib", "eth"], shardings=("full", "hybrid"))
    assert [c.id for c in cases] == ["m-n1-ib", "m-n1-eth", "m-n2-ib", "m-n2-eth", "m-n2-ib-hybrid", "m-n2-eth-hybrid"]


@pytest.mark.parametrize("case", [Case("qwen2.5-7b", 8, "roce.v2", "hybrid"), Case("m", 2, "roce-dc2", "hybrid"),
                                  Case("m", 2, "roce-dc2"), Case("llama-3.1-8b", 16, "eth")])
def test_a_case_id_names_its_sharding_and_reads_back(case):
    assert Case.parse(case.id) == case
    assert case.id.endswith("-hybrid") == (case.sharding == "hybrid")


def test_one_node_is_one_layout_whatever_the_sharding():
    hybrid = Case("m", 2, "ib", "hybrid")
    assert hybrid.layout == "hybrid" and hybrid.with_nodes(1) == Case("m", 1, "ib") and hybrid.with_nodes(1).layout == "full"
    assert hybrid.with_fabric("eth").sharding == "hybrid"
