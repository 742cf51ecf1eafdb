"""Reports from saved runs: the tables' numbers, plots as real PNGs, cost, trends, merged JUnit."""

from __future__ import annotations

import re
import sys
import textwrap

import pytest
from helpers import (ETH_LAUNCHES, IB_LAUNCHES, IDENTITY, REPO, assert_valid_junit, geomean, gpu_night, junit_text,
                     nights, saved, session_store)

from pytest_fabric.reporting.tables import configuration_interval
from pytest_fabric.physics.cost import break_even_premium, cost_per_million_tokens
from pytest_fabric.history.junit import merge_junit
from pytest_fabric.reporting.htmlreport import write_report
from pytest_fabric.reporting.trend import write_trend
from pytest_fabric.history.night_model import ResultsError
from pytest_fabric.history.night_files import load_results
from pytest_fabric.history.nights import save_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# qwen2-tiny on two nodes in session_store: each configuration's value, the geometric mean of its launches.
IB, ETH = geomean(IB_LAUNCHES), geomean(ETH_LAUNCHES)


def markdown_rows(text: str, first_cell: str) -> list[list[str]]:
    """The cells of every Markdown table row starting with ``first_cell``."""
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {first_cell} |")]


@pytest.fixture
def no_plots(monkeypatch):
    """matplotlib as if not installed: tests about tables skip the (slow) drawing."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)


@pytest.fixture
def night(tmp_path):
    path = tmp_path / "night.json"
    verdicts = [{"test": "suites/test_parity.py::test_parity[qwen2-tiny-n2-eth]", "outcome": "pass",
                 "message": "pass: eth/ib = 0.941 <within 5%>"}]
    save_results(path, session_store(), IDENTITY, verdicts)
    return load_results(path)


def test_report_tables_hold_the_numbers(tmp_path, no_plots, night):
    written = write_report([night], tmp_path / "out")
    md = written.markdown.read_text()
    assert written.markdown == tmp_path / "out" / "report.md" and written.html.exists()
    header = next(line for line in md.splitlines() if line.startswith("| nodes | GPUs | ib tok/s"))
    assert header.split(" | ")[2:7] == ["ib tok/s", "eth tok/s", "eth vs ib", "ib tok/s/GPU", "eth tok/s/GPU"]
    # qwen2-tiny on 2 nodes: ib 1803.3 and eth 1700.0 (geometric means of 3 launches each), -5.7%,
    # per GPU half (901.6: the arithmetic mean of the ib launches would have given 901.7).
    assert (f"{IB:.1f}", f"{ETH:.1f}", f"{IB / 2:.1f}", f"{ETH / 2:.1f}") == ("1803.3", "1700.0", "901.6", "850.0")
    # Each value with its 95% interval (the declared launch noise as prior, as the gates use it).
    ib_iv, eth_iv = configuration_interval(list(IB_LAUNCHES)), configuration_interval(list(ETH_LAUNCHES))
    assert ib_iv.low < IB < ib_iv.high and ib_iv.point == pytest.approx(IB)
    two = [r for r in markdown_rows(md, "2") if r[2].startswith(f"{IB:.1f} ")]
    assert two == [["2", "2", f"{IB:.1f} [{ib_iv.low:.1f}, {ib_iv.high:.1f}]",
                    f"{ETH:.1f} [{eth_iv.low:.1f}, {eth_iv.high:.1f}]", f"{(ETH / IB - 1) * 100:+.1f}%", f"{IB / 2:.1f}",
                    f"{ETH / 2:.1f}", "n/a", "n/a", "n/a", "n/a", "ib 3, eth 3", "test_parity (eth): pass"]]
    one = [r for r in markdown_rows(md, "1") if r[2].startswith("1000.0 ")]
    assert [r[3:] for r in one] == [["1000.0 [" + one[0][2].split("[")[1], "n/a", "1000.0", "1000.0", "n/a", "n/a",
                                     "n/a", "n/a", "ib 1, eth 1", "-"]]
    assert ["230.0", "43.0", "-81.3%"] in [[r[i].split(" [")[0] for i in (2, 3, 4)] for r in markdown_rows(md, "2")]
    # Bandwidth: largest payload, emulated link rate.
    assert ["2", "eth", "0.4", "0.360", "0.360", "16"] in markdown_rows(md, "2")
    assert "llama-wide-n1-ib on the emulated cluster: rank 0 exited 1" in md
    assert "torch 2.13.0+cpu" in md
    page = written.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert f"<td class=\"text\">{IB:.1f} [" in page and "-81.3%" in page
    assert "&lt;within 5%&gt;" in page and "<within" not in page  # text is escaped
    assert "<link" not in page and "<script" not in page  # self-contained


def test_report_shows_mfu_and_peak_memory_of_the_recorded_gpu_launch(tmp_path, no_plots):
    """The H200 launch (fixtures/gpu, recorded on hardware), saved and reported: its MFU at the
    configuration's value and its peak memory per rank, the convention and the peak named."""
    from helpers import GPU_PEAK, gpu_expected

    from pytest_fabric.core.models import MFU_CONVENTION

    mfu, gib = gpu_expected()
    written = write_report([gpu_night(tmp_path / "night.json")], tmp_path / "out")
    md = written.markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| nodes | GPUs | eth tok/s"))
    (row,) = markdown_rows(md, "1")
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], row))
    assert cells["eth MFU"] == f"{mfu * 100:.1f}%" and cells["eth peak GiB"] == f"{gib:.1f}" == "90.0"
    assert f"MFU: {MFU_CONVENTION}; against {GPU_PEAK}" in md
    page = written.html.read_text()
    assert f">{mfu * 100:.1f}%</td>" in page and "output head counted, embedding lookups not" in page


def test_report_reads_mfu_na_on_a_cpu_night_and_keeps_its_peak_memory(tmp_path, no_plots):
    store = session_store()
    store["qwen2-tiny-n1-any#aaaa"]["result"]["peak_memory_bytes"] = 3 * 2**30
    save_results(tmp_path / "night.json", store, IDENTITY)
    md = write_report([load_results(tmp_path / "night.json")], tmp_path / "out").markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| nodes | GPUs | ib tok/s"))
    one = next(r for r in markdown_rows(md, "1") if r[2].startswith("1000.0 "))
    cells = dict(zip([c.strip() for c in header.strip("|").split("|")], one))
    assert [cells[k] for k in ("ib MFU", "eth MFU", "ib peak GiB", "eth peak GiB")] == ["n/a", "n/a", "3.0", "3.0"]
    assert "n/a without a GPU peak (CPU)" in md


def test_plots_are_real_pngs_referenced_by_relative_path(tmp_path, night):
    pytest.importorskip("matplotlib")
    written = write_report([night], tmp_path / "out")
    assert sorted(p.name for p in written.plots) == ["busbw-all_gather.png", "busbw-all_reduce.png",
                                                     "llama-wide-per-gpu.png", "qwen2-tiny-per-gpu.png"]
    for png in written.plots:
        assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
        assert f"](plots/{png.name})" in written.markdown.read_text()
        assert f'src="plots/{png.name}"' in written.html.read_text()
    assert written.notes == []


def test_without_matplotlib_the_tables_are_still_written(tmp_path, night, no_plots):
    written = write_report([night], tmp_path / "out")
    assert written.plots == [] and not (tmp_path / "out" / "plots").exists()
    assert any("matplotlib is not installed" in n for n in written.notes)
    md = written.markdown.read_text()
    assert "matplotlib is not installed" in md and f"{IB:.1f}" in md and "![" not in md


def test_cost_and_break_even(tmp_path, no_plots, night):
    written = write_report([night], tmp_path / "out", prices={"ib": 4.0, "eth": 3.0})
    md = written.markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| nodes | GPUs | ib $/M tokens"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "nodes", "GPUs", "ib $/M tokens", "eth $/M tokens", "ib break-even premium over eth",
        "ib price premium over eth", "cheapest per token"]
    ib_cost = cost_per_million_tokens(IB, 2, 4.0)
    eth_cost = cost_per_million_tokens(ETH, 2, 3.0)
    premium = break_even_premium(IB, ETH)
    row = [r for r in markdown_rows(md, "2") if r[2] == f"{ib_cost:.4g}"]
    assert row == [["2", "2", f"{ib_cost:.4g}", f"{eth_cost:.4g}", f"{premium * 100:+.1f}%", "+33.3%", "eth"]]
    assert f"{premium * 100:+.1f}%" == "+6.1%"
    # llama-wide: ib is 5.3x faster, worth far more than its 33% price premium.
    llama_premium = break_even_premium(230.0, 43.0)
    llama = [r for r in markdown_rows(md, "2") if r[4] == f"{llama_premium * 100:+.1f}%"]
    assert llama and llama[0][-1] == "ib"


def test_prices_saved_with_the_night_are_used_and_given_ones_win(tmp_path, no_plots):
    path = tmp_path / "priced.json"
    save_results(path, session_store(), IDENTITY, [], {"ib": 4.0, "eth": 3.0})
    md = write_report([load_results(path)], tmp_path / "out").markdown.read_text()
    assert "eth $3 (saved with the night), ib $4 (saved with the night)" in md
    assert f"| {cost_per_million_tokens(ETH, 2, 3.0):.4g} |" in md
    md = write_report([load_results(path)], tmp_path / "out2", prices={"eth": 1.0}).markdown.read_text()
    assert "eth $1, ib $4 (saved with the night)" in md
    assert f"| {cost_per_million_tokens(ETH, 2, 1.0):.4g} |" in md


def test_cost_lines_for_the_terminal(night):
    from pytest_fabric.reporting.terminal import cost_lines

    lines = cost_lines(night, {"ib": 4.0, "eth": 3.0})
    assert lines[0] == "cost (USD per GPU-hour: eth 3, ib 4):"
    header = next(line for line in lines if "ib $/M tokens" in line)
    assert header.split() == ["nodes", "GPUs", "ib", "$/M", "tokens", "eth", "$/M", "tokens", "ib", "break-even",
                              "premium", "over", "eth", "ib", "price", "premium", "over", "eth", "cheapest",
                              "per", "token"]
    assert any(line.split()[:2] == ["2", "2"] and line.split()[-1] == "ib" for line in lines)  # llama-wide
    assert cost_lines(night, {}) == []


def test_a_price_for_an_unmeasured_fabric_is_reported(tmp_path, no_plots, night):
    written = write_report([night], tmp_path / "out", prices={"ib": 4.0, "efa": 2.0})
    assert any("efa" in n for n in written.notes)
    assert "eth $/M tokens" not in written.markdown.read_text()


def test_several_inputs_of_one_night_combine_and_warn_on_set_up_differences(tmp_path, no_plots):
    first = tmp_path / "a.json"
    save_results(first, {k: v for k, v in session_store().items() if k.startswith("qwen2")}, IDENTITY, [])
    junit = tmp_path / "b.xml"
    junit.write_text(junit_text(session_store()).replace('value="2.13.0+cpu"', 'value="2.14.0"'))
    written = write_report([load_results(first), load_results(junit)], tmp_path / "out")
    md = written.markdown.read_text()
    assert "### llama-wide" in md and "### qwen2-tiny" in md
    assert "torch version differs: 2.13.0+cpu (first input) vs 2.14.0 (this input)" in md
    # The JUnit verdicts land in their rows; a test that only measured is no verdict.
    assert "| test_advantage (eth): fail |" in md and "test_parity (eth): pass" in md
    assert "test_single" not in md.split("## Verdicts")[0]


def test_trend_over_nights(tmp_path):
    paths = nights(tmp_path, [1.0, 1.02, 0.8], [None, None, {"torch": "2.14.0", "backend": "gloo"}])
    written = write_trend([load_results(p) for p in paths], tmp_path / "trend")
    md = written.markdown.read_text()
    header = next(line for line in md.splitlines() if line.startswith("| case |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "case", "2026-11-10 02:00", "2026-11-11 02:00", "2026-11-12 02:00", "last vs first"]
    row = markdown_rows(md, "qwen2-tiny-n2-eth")
    assert row == [["qwen2-tiny-n2-eth", f"{ETH:.1f}", f"{ETH * 1.02:.1f}", f"{ETH * 0.8:.1f}", "-20.0%"]]
    assert row[0][1:4] == ["1700.0", "1734.0", "1360.0"]
    assert "2026-11-12 02:00: torch version differs: 2.13.0+cpu (night before) vs 2.14.0 (this night)" in md
    if written.plots:  # matplotlib installed
        names = sorted(p.name for p in written.plots)
        assert names == ["trend-llama-wide-eth.png", "trend-llama-wide-ib.png",
                         "trend-qwen2-tiny-eth.png", "trend-qwen2-tiny-ib.png"]
        assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written.plots)
    with pytest.raises(ValueError, match="at least two nights"):
        write_trend([load_results(paths[0])], tmp_path / "t2")


def test_trend_labels_two_nights_of_the_same_minute_apart(tmp_path, no_plots):
    a = saved(tmp_path, "a.json")
    b = saved(tmp_path, "b.json")
    runs = [load_results(a), load_results(b)]
    runs[1].identity["created"] = runs[0].identity["created"]
    md = write_trend(runs, tmp_path / "t").markdown.read_text()
    assert re.search(r"\| case \| .* \(\S+/a\.json\) \| .* \(\S+/b\.json\) \|", md)


# -- JUnit merging -------------------------------------------------------------------------------

def pytest_junit(pytester, name: str, source: str):
    pytester.makepyfile(**{name: textwrap.dedent(source)})
    xml = pytester.path / f"{name}.xml"
    pytester.runpytest(f"{name}.py", f"--junitxml={xml}", "-p", "no:cacheprovider")
    return xml


def test_merge_keeps_every_testcase_and_stays_valid(pytester, junit_schema, tmp_path):
    a = pytest_junit(pytester, "test_a", """
        import pytest
        def test_one(): pass
        def test_two(): assert 0
        @pytest.mark.skip(reason="no")
        def test_three(): pass
    """)
    b = pytest_junit(pytester, "test_b", """
        def test_four(): print("fabric.m-n2-ib.tokens_per_s=10.000")
    """)
    fabric = tmp_path / "fabric.xml"
    fabric.write_text(junit_text(session_store()))
    out = tmp_path / "merged" / "all.xml"
    assert merge_junit([a, b, fabric], out) == 3 + 1 + 5
    from junitparser import JUnitXml

    merged = JUnitXml.fromfile(str(out))
    names = sorted(c.name for suite in merged for c in suite)
    assert names == sorted(["test_one", "test_two", "test_three", "test_four", "test_parity[qwen2-tiny-n2-eth]",
                            "test_single[qwen2-tiny-n1-eth]", "test_advantage[llama-wide-n2-eth]",
                            "test_busbw[collectives-n2-eth]", "test_unrelated"])
    assert (merged.tests, merged.failures, merged.errors) == (9, 2, 0)
    assert len(list(merged)) == 3  # each input's suite kept whole, properties included
    assert_valid_junit(junit_schema, out)
    # The merged file reads back as one night with the fabric metrics in it.
    merged_run = load_results(out)
    assert merged_run.measurements["qwen2-tiny-n2-ib"] == pytest.approx(list(IB_LAUNCHES), abs=5e-4)
    assert merged_run.cases["qwen2-tiny-n2-ib"].mean == pytest.approx(IB, rel=1e-6)


def test_merge_refuses_what_is_not_junit(tmp_path):
    bad = tmp_path / "x.xml"
    bad.write_text("<html/>")
    with pytest.raises(ResultsError, match="XML but not JUnit"):
        merge_junit([bad], tmp_path / "out.xml")
    assert not (tmp_path / "out.xml").exists()


# -- intervals, undecided cost, outcome words, gate and trend pictures ------------------------------


def test_verdicts_show_words_gate_fields_and_one_row_per_test_whatever_the_message(tmp_path, no_plots):
    run = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    verdict = next(v for v in run.verdicts if "parity" in v["test"])
    verdict.update(outcome="inconclusive", message="inconclusive after the launch budget: eth/ib\npredicted: x | y")
    md = write_report([run], tmp_path / "out").markdown.read_text()
    rows = [line for line in md.splitlines() if line.startswith("| suites/test_parity.py")]
    assert len(rows) == 1  # the line break is a <br>, the bar escaped: no bogus row
    cells = [c.strip() for c in re.split(r"(?<!\\)\|", rows[0])[1:-1]]
    assert cells[1:6] == ["inconclusive", "eth/ib", "1.019", "[0.951, 1.092]", "0.950"]
    assert cells[6] == "inconclusive after the launch budget: eth/ib<br>predicted: x \\| y"


def test_the_cost_table_says_when_the_cheaper_fabric_is_undecided(tmp_path, no_plots):
    run = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    # qwen2-tiny: eth 1.9% faster within launch noise; priced equal, which is cheaper is not known.
    md = write_report([run], tmp_path / "out", prices={"ib": 3.0, "eth": 3.0}).markdown.read_text()
    qwen = md.split("### qwen2-tiny: cost", 1)[1].split("\n\n")[1]
    assert "undecided: eth or ib (intervals overlap)" in qwen
    # llama-wide: ib five times faster: decided.
    llama = md.split("### llama-wide: cost", 1)[1].split("\n\n")[1]
    assert llama.splitlines()[-1].endswith("| ib |")


def test_the_gate_picture_and_busbw_per_payload_come_from_the_launch_records(tmp_path):
    pytest.importorskip("matplotlib")
    run = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    written = write_report([run], tmp_path / "out")
    names = sorted(p.name for p in written.plots)
    assert names == ["busbw-all_gather.png", "busbw-all_reduce.png", "busbw-reduce_scatter.png", "gates.png",
                     "llama-wide-per-gpu.png", "qwen2-tiny-per-gpu.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written.plots)


def test_a_trend_marks_failing_nights(tmp_path):
    pytest.importorskip("matplotlib")
    from pytest_fabric.reporting.report_plots import gate_failed

    first = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    second = load_results(REPO / "fixtures" / "dashboards" / "night.json")
    second.verdicts = [dict(v, outcome="fail") if "advantage" in v["test"] else v for v in second.verdicts]
    assert gate_failed(second, "llama-wide-n2-eth") and not gate_failed(first, "llama-wide-n2-eth")
    written = write_trend([first, second], tmp_path / "trend")
    assert written.plots and all(p.read_bytes()[:8] == PNG_MAGIC for p in written.plots)
