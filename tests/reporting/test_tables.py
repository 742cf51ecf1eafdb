"""The table model: the rows every renderer (terminal, report, job summary, metrics) lays out."""

from __future__ import annotations

import pytest

from pytest_fabric.history.night_model import CaseResult, LinkResult, SavedRun
from pytest_fabric.reporting.tables import (Table, aligned_lines, bandwidth_table, config_rows, cost_tables, delta_text,
                                  reference, throughput_tables)


def case(model: str, nodes: int, fabric: str, values: list[float], counted: list[bool] | None = None,
         gpus: int | None = None) -> CaseResult:
    gpus = gpus or nodes
    return CaseResult(model, nodes, fabric, gpus, values, [v / gpus for v in values], counted)


def night() -> SavedRun:
    cases = [case("m", 1, "ib", [100.0]), case("m", 1, "eth", [100.0]),
             case("m", 2, "ib", [200.0, 200.0, 200.0]), case("m", 2, "eth", [150.0])]
    return SavedRun({"fabrics": ["ib", "eth"]}, {c.id: c for c in cases})


def test_reference_is_ib_when_measured_else_the_first():
    assert reference(["eth", "ib"]) == "ib"
    assert reference(["eth", "roce"]) == "eth"
    assert reference([]) is None


def test_delta_text_on_one_node_and_with_a_side_missing():
    run = night()
    two = {c.fabric: c for c in run.cases.values() if c.nodes == 2}
    assert delta_text(two, "eth", "ib", 2) == "-25.0%"
    assert delta_text({"ib": two["ib"]}, "eth", "ib", 2) == "-"
    assert delta_text({"eth": two["eth"]}, "eth", "ib", 2) == "-"
    assert delta_text(two, "eth", "ib", 1) == "n/a"


def test_throughput_tables_the_terminal_columns_with_launch_counts():
    (table,) = throughput_tables(night().cases.values(), ["ib", "eth"])
    assert table.title == "m"
    assert table.header == ["nodes", "GPUs", "ib tok/s", "eth tok/s", "eth vs ib", "ib tok/s/GPU", "eth tok/s/GPU",
                            "ib MFU", "eth MFU", "ib peak GiB", "eth peak GiB"]
    assert table.rows[0] == ["1", "1", "100.0", "100.0", "n/a", "100.0", "100.0", "n/a", "n/a", "n/a", "n/a"]
    assert table.rows[1][:7] == ["2", "2", "200.0 (3)", "150.0", "-25.0%", "100.0", "75.0"]


def test_throughput_tables_the_report_columns_with_intervals_launches_and_verdicts():
    (table,) = throughput_tables(night().cases.values(), ["ib", "eth"], detail=True,
                                 delta_interval=lambda model, nodes, f, ref: f" <{model} {nodes} {f}/{ref}>",
                                 verdicts={("m", 2): ["test_x (eth): fail"]})
    assert table.header[-2:] == ["launches", "verdict"]
    one, two = table.rows
    assert one[4] == "n/a" and one[-1] == "-"  # one node: no delta, and no gate interval either
    assert two[2].startswith("200.0 [") and two[4] == "-25.0% <m 2 eth/ib>"
    assert two[-2:] == ["ib 3, eth 1", "test_x (eth): fail"]


def test_a_disturbed_launch_is_named_in_the_terminal_cell_and_left_out_of_the_value():
    (table,) = throughput_tables([case("m", 2, "ib", [200.0, 50.0], [True, False])], ["ib"])
    assert table.rows[0][2] == "200.0 (2, 1 disturbed)"


def test_bandwidth_table_at_the_largest_payload_in_order():
    links = [LinkResult(2, "ib", {"all_reduce": 2.0}, 64 * 2 ** 20, 100.0),
             LinkResult(2, "eth", {"all_reduce": 0.4, "all_gather": 0.3}, 32 * 2 ** 20)]
    table = bandwidth_table(links)
    assert table.header == ["nodes", "fabric", "link Gbit/s", "all_gather busbw", "all_reduce busbw", "MiB"]
    assert table.rows == [["2", "eth", "-", "0.300", "0.400", "32"], ["2", "ib", "100", "-", "2.000", "64"]]
    table = bandwidth_table(links, order=lambda b: ["ib", "eth"].index(b.fabric), payload="payload MiB")
    assert [r[1] for r in table.rows] == ["ib", "eth"] and table.header[-1] == "payload MiB"
    assert bandwidth_table([]) is None


def test_cost_tables_price_each_fabric_and_name_the_cheapest():
    (table,) = cost_tables(night(), {"ib": 4.0, "eth": 3.0})
    assert table.header == ["nodes", "GPUs", "ib $/M tokens", "eth $/M tokens", "ib break-even premium over eth",
                            "ib price premium over eth", "cheapest per token"]
    one, two = table.rows
    assert one[4] == "n/a" and two[4] == "+33.3%" and two[5] == "+33.3%"
    # One node: both fabrics are the same launch, so the price decides (no interval to overlap).
    assert one[6] == "eth"
    assert cost_tables(SavedRun({}), {"ib": 1.0}) == []


def test_config_rows_carry_the_value_and_its_interval():
    rows = config_rows(night())
    assert [(r.model, r.nodes, r.fabric) for r in rows] == [("m", 1, "eth"), ("m", 1, "ib"), ("m", 2, "eth"),
                                                             ("m", 2, "ib")]
    ib2 = rows[-1]
    assert ib2.tokens_per_s == pytest.approx(200.0) and ib2.low < 200.0 < ib2.high and ib2.launches == "3"


def test_aligned_lines_right_align_each_column_under_the_title():
    lines = aligned_lines(Table("m", ["nodes", "x"], [["1", "10.0"], ["16", "-"]]))
    assert lines == ["m:", "  nodes     x", "      1  10.0", "     16     -"]
    assert aligned_lines(Table("m", ["a"], []), "custom")[0] == "custom"
