"""Reporting: testcase text, terminal tables, and JUnit post-processing that keeps the file valid."""

from __future__ import annotations

import pytest
from helpers import assert_valid_junit
from lxml import etree

from pytest_fabric import Case, Measurement
from pytest_fabric.report import add_to_junit, summary_tables
from pytest_fabric.report import testcase_text as text_of


def measurement(model: str, nodes: int, fabric: str, tokens_per_s: float, shared_with: str | None = None):
    return Measurement(
        case=Case(model, nodes, fabric), tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s / nodes,
        median_step_s=0.25, step_s=[0.25, 0.25], gpus=nodes, cluster="emulated",
        result={"attention": "sdpa", "versions": {"torch": "2.13.0", "nccl": None}, "nodes": ["node0", "node1"]},
        shared_with=shared_with)


def test_testcase_text_has_summaries_ratio_and_metrics():
    text = text_of([measurement("m", 2, "ib", 1000.0), measurement("m", 2, "eth", 800.0)])
    lines = text.splitlines()
    assert lines[0].startswith("m-n2-ib: 1000.0 tokens/s, 500.0 tokens/s/GPU, median step 250.0 ms over 2 steps")
    assert lines[1].startswith("m-n2-eth: 800.0 tokens/s")
    assert "eth/ib tokens/s ratio (m, 2 nodes): 0.800 (-20.0%)" in lines
    assert any(line.startswith("ran with: ") and "attention sdpa" in line and "torch 2.13.0" in line for line in lines)
    assert "nccl None" not in text  # versions that are unknown are left out
    assert "fabric.m-n2-eth.tokens_per_s=800.000" in lines
    assert "fabric.m-n2-ib.gpus=2" in lines


def test_testcase_text_without_reference_has_no_ratio():
    text = text_of([measurement("m", 2, "eth", 800.0)])
    assert "ratio" not in text


def test_summary_table_per_model_with_delta_against_ib():
    rows = summary_tables(
        [measurement("m", 1, "ib", 100.0), measurement("m", 1, "eth", 100.0, shared_with="ib"),
         measurement("m", 2, "ib", 200.0), measurement("m", 2, "eth", 150.0)],
        ["ib", "eth"])
    assert rows[0] == "m:"
    assert rows[1].split() == ["nodes", "GPUs", "ib", "tok/s", "eth", "tok/s", "eth", "vs", "ib",
                               "ib", "tok/s/GPU", "eth", "tok/s/GPU"]
    two_nodes = rows[3].split()
    assert two_nodes == ["2", "2", "200.0", "150.0", "-25.0%", "100.0", "75.0"]
    # One node never crosses the fabric: no delta is claimed there.
    assert rows[2].split()[:5] == ["1", "1", "100.0", "100.0", "n/a"]


def test_summary_table_shows_the_mean_over_repeated_launches_and_their_number():
    # The comparison gates launch a configuration several times: the table is their mean, as the report.
    rows = summary_tables([measurement("m", 2, "ib", 200.0), measurement("m", 2, "ib", 220.0),
                           measurement("m", 2, "ib", 240.0), measurement("m", 2, "eth", 110.0)], ["ib", "eth"])
    assert rows[2].split() == ["2", "2", "220.0", "(3)", "110.0", "-50.0%", "110.0", "55.0"]


def test_summary_table_lists_models_separately_and_marks_missing_cells():
    rows = summary_tables([measurement("b", 2, "ib", 10.0), measurement("a", 2, "eth", 5.0)], ["ib", "eth"])
    assert [r for r in rows if r.endswith(":")] == ["a:", "b:"]
    a_row = rows[rows.index("a:") + 2].split()
    assert a_row[2] == "-" and a_row[3] == "5.0" and a_row[4] == "-"


# -- JUnit post-processing against files pytest itself wrote ----------------------------------------

TESTS = {
    "test_top.py": """
        import pytest

        def test_plain():
            print("captured line")

        @pytest.mark.parametrize("x", ["a/b", "c::d", "e f"])
        def test_param(x):
            pass
    """,
    "sub/test_nested.py": """
        import pytest

        class TestGroup:
            @pytest.mark.parametrize("n", [1, 2])
            def test_method(self, n):
                pass

            def test_fails(self):
                assert 0, "broken"
    """,
}


def junit_of(pytester, *args):
    for path, source in TESTS.items():
        target = pytester.path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(__import__("textwrap").dedent(source))
    nodeids = [line for line in pytester.runpytest("--collect-only", "-q").outlines if "::" in line]
    xml = pytester.path / "junit.xml"
    pytester.runpytest(f"--junitxml={xml}", "-o", "junit_logging=system-out", *args)
    return xml, nodeids


@pytest.mark.parametrize("extra", [[], ["-o", "junit_suite_name=fabric", "--junitprefix=nightly"]])
def test_every_testcase_is_found_and_gets_its_text(pytester, junit_schema, extra):
    xml, nodeids = junit_of(pytester, *extra)
    assert len(nodeids) == 7
    outputs = {nodeid: f"measured {nodeid}" for nodeid in nodeids}
    prefix = "nightly" if "--junitprefix=nightly" in extra else None
    updated = add_to_junit(xml, outputs, {"fabric.cluster": "emulated"}, prefix=prefix)
    assert updated == len(nodeids)
    tree = etree.parse(str(xml))
    for case in tree.iter("testcase"):
        out = case.find("system-out")
        assert out is not None and out.text.count("measured ") == 1, etree.tostring(case)
    # Captured output is kept, the measurement text is appended.
    plain = next(c for c in tree.iter("testcase") if c.get("name") == "test_plain")
    assert "captured line" in plain.find("system-out").text
    assert "measured test_top.py::test_plain" in plain.find("system-out").text
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props == {"fabric.cluster": "emulated"}
    assert_valid_junit(junit_schema, xml)


def test_unknown_nodeids_leave_the_file_valid_and_untouched(pytester, junit_schema):
    xml, _ = junit_of(pytester)
    assert add_to_junit(xml, {"test_other.py::test_x": "nothing"}, {}) == 0
    assert "nothing" not in xml.read_text()
    assert_valid_junit(junit_schema, xml)
