"""What CI systems read (pytest_fabric/reporting/dashboards.py): GitHub's job summary, OpenMetrics for GitLab's
metrics report and node_exporter, Bencher Metric Format; all from one table builder.

The night is a real one (fixtures/dashboards: a 2-node run of the parity, advantage and bandwidth
suites on the emulated cluster); variants with a failing or inconclusive gate change its verdicts.
The plugin's end-of-run writing is driven through pytester with gates decided as in test_verdicts.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from helpers import IDENTITY, REPO, gpu_night, outcome, run_gates, session_store

from pytest_fabric.reporting.dashboards import (BusbwRow, build_tables, benchmark_json, job_summary, largest_payloads, md_cell,
                                      md_table, openmetrics)
from pytest_fabric.history.junit_read import load_junit
from pytest_fabric.history.junit import testcase_text as text_of  # not collected as a test
from pytest_fabric.measuring.measurement import Measurement
from pytest_fabric.core.case import Case
from pytest_fabric.history.night_files import load_records, load_results

FIXTURES = REPO / "fixtures" / "dashboards"
PARITY = "suites/test_parity.py::test_within_5_percent_of_ib[qwen2-tiny-n2-eth]"
ADVANTAGE = "suites/test_advantage.py::test_ib_at_least_20_percent_ahead[llama-wide-n2-eth]"


def night(**outcomes):
    """The recorded night; ``outcomes``: test name part -> (outcome, ratio interval) to plant."""
    run = load_results(FIXTURES / "night.json")
    run.verdicts = copy.deepcopy(run.verdicts)
    for v in run.verdicts:
        for part, (word, low, high) in outcomes.items():
            if part in v["test"]:
                v["outcome"] = word
                v["message"] = f"{word}: planted\nsecond line | with a bar"
                for g in v["gates"]:
                    g.update(outcome=word, ci_low=low, ci_high=high)
    return run


def tables(run=None):
    return build_tables(run or night(), load_records(FIXTURES / "night.json"))


def test_the_tables_carry_every_configuration_gate_and_payload_of_the_night():
    t = tables()
    assert {(c.model, c.nodes, c.fabric) for c in t.configs} == {
        ("llama-wide", 2, "ib"), ("llama-wide", 2, "eth"), ("qwen2-tiny", 2, "ib"), ("qwen2-tiny", 2, "eth")}
    for c in t.configs:
        assert c.low < c.tokens_per_s < c.high
    parity = next(g for g in t.gates if g.test == PARITY)
    assert (parity.name, parity.where, parity.outcome) == ("eth/ib", "qwen2-tiny n2", "pass")
    assert parity.low == pytest.approx(0.951305) and parity.high == pytest.approx(1.09184)
    # Every payload of each collective (from the launch records), with the emulated link rate.
    payloads = {r.bytes for r in t.busbw if (r.fabric, r.op) == ("eth", "all_reduce")}
    assert len(payloads) > 3 and max(payloads) == 16 << 20
    assert {r.link_gbit for r in t.busbw if r.fabric == "eth"} == {0.4}


def test_openmetrics_parses_and_holds_every_configuration_and_gate():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    t = tables(night(parity=("inconclusive", 0.93, 1.04)))
    families = {f.name: f for f in text_string_to_metric_families(openmetrics(t))}
    assert all(f.type == "gauge" for f in families.values())
    tokens = {(s.labels["model"], s.labels["nodes"], s.labels["fabric"]): s.value
              for s in families["fabric_tokens_per_second"].samples}
    assert tokens == {(c.model, str(c.nodes), c.fabric): pytest.approx(c.tokens_per_s, rel=1e-5) for c in t.configs}
    ratio = {s.labels["test"]: s.value for s in families["fabric_gate_ratio"].samples}
    low = {s.labels["test"]: s.value for s in families["fabric_gate_ratio_low"].samples}
    high = {s.labels["test"]: s.value for s in families["fabric_gate_ratio_high"].samples}
    assert set(ratio) == {PARITY, ADVANTAGE}
    assert low[PARITY] == 0.93 and high[PARITY] == 1.04 and low[ADVANTAGE] < ratio[ADVANTAGE] < high[ADVANTAGE]
    outcome = {(s.labels["test"], s.labels["outcome"]): s.value for s in families["fabric_gate_outcome"].samples}
    assert outcome[(PARITY, "inconclusive")] == 1 and outcome[(PARITY, "pass")] == 0
    assert outcome[(ADVANTAGE, "pass")] == 1
    busbw = families["fabric_busbw_gbit"].samples
    assert len(busbw) == len(t.busbw) and {s.labels["op"] for s in busbw} >= {"all_reduce", "all_gather"}
    tests = {s.labels["outcome"]: s.value for s in families["fabric_tests"].samples}
    assert tests["inconclusive"] == 1 and tests["pass"] == 4


def test_openmetrics_is_also_prometheus_text_for_a_textfile_collector():
    from prometheus_client.parser import text_string_to_metric_families

    names = {f.name for f in text_string_to_metric_families(openmetrics(tables()))}
    assert {"fabric_tokens_per_second", "fabric_gate_ratio", "fabric_busbw_gbit"} <= names


def test_label_values_are_escaped():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    run = night()
    run.verdicts[0]["test"] = 'suites/t.py::test_x["quoted"\\path]'
    (sample,) = next(f for f in text_string_to_metric_families(openmetrics(tables(run)))
                     if f.name == "fabric_gate_ratio").samples[:1]
    assert sample.labels["test"] == 'suites/t.py::test_x["quoted"\\path]'


def md_rows(text: str, heading: str) -> list[list[str]]:
    """The rows of the table under ``heading`` (cells split on unescaped bars)."""
    block = text.split(f"### {heading}", 1)[1].split("\n\n", 2)[1]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in block.splitlines()]


def test_job_summary_puts_failures_first_then_verdicts_with_intervals_then_throughput():
    text = job_summary(tables(night(advantage=("fail", 1.05, 1.15), parity=("inconclusive", 0.93, 1.04))))
    assert text.startswith("## pytest-fabric: 3 pass, 1 fail, 1 inconclusive\n")
    assert text.index("### Failures") < text.index("### Verdicts") < text.index("### Throughput")
    failures = md_rows(text, "Failures")
    assert failures[2][:2] == [ADVANTAGE, "fail"]
    assert failures[2][2] == "fail: planted<br>second line \\| with a bar"  # one row, whatever the message
    verdicts = md_rows(text, "Verdicts")
    assert [row[0] for row in verdicts[2:]] == ["FAIL", "INCONCLUSIVE"]
    assert verdicts[3][1:6] == ["eth/ib", "qwen2-tiny n2", "1.019", "[0.930, 1.040] (0.9951)", "0.950"]
    assert all(len(row) == len(verdicts[0]) for row in verdicts)
    throughput = md_rows(text, "Throughput (tokens/s, 95% interval)")
    assert len(throughput) == 2 + 4 and all(re.fullmatch(r"\[[\d.]+, [\d.]+\]", row[5]) for row in throughput[2:])
    assert "### Collective bandwidth" in text


def test_markdown_cells_escape_bars_and_line_breaks():
    assert md_cell("a|b\nc\r\nd") == "a\\|b<br>c<br>d"
    assert md_table(["x", "n"], [["one\ntwo", 3]], "lr") == ["| x | n |", "|---|---:|", "| one<br>two | 3 |"]


def test_benchmark_json_is_bencher_metric_format_with_bounds():
    bmf = benchmark_json(tables())
    measure = bmf["qwen2-tiny-n2-eth"]["tokens-per-second"]
    assert measure["lower_value"] < measure["value"] < measure["upper_value"]
    gate = bmf["gate eth/ib qwen2-tiny n2"]["ratio"]
    assert gate == {"value": pytest.approx(1.01915), "lower_value": pytest.approx(0.951305),
                    "upper_value": pytest.approx(1.09184)}
    assert set(bmf["collectives-n2-eth all_reduce"]) == {"busbw-gbit"}
    json.dumps(bmf)  # plain JSON


# -- the step's figures: MFU and peak memory -------------------------------------------------------


def test_mfu_and_peak_memory_of_the_recorded_gpu_launch_in_the_summary_metrics_and_bencher(tmp_path):
    from helpers import GPU_PEAK, gpu_expected
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pytest_fabric.core.models import MFU_CONVENTION

    mfu, gib = gpu_expected()
    t = build_tables(gpu_night(tmp_path / "night.json"), load_records(tmp_path / "night.json"))
    text = job_summary(t)
    header, _, row = md_rows(text, "Throughput (tokens/s, 95% interval)")
    cells = dict(zip(header, row))
    assert cells["MFU"] == f"{mfu * 100:.1f}%" and cells["peak GiB"] == f"{gib:.1f}" == "90.0"
    assert f"MFU: {MFU_CONVENTION}; against {GPU_PEAK}" in text
    families = {f.name: f for f in text_string_to_metric_families(openmetrics(t))}
    (sample,) = families["fabric_mfu"].samples
    assert sample.value == pytest.approx(mfu, rel=1e-9) and sample.labels["peak"] == GPU_PEAK
    assert MFU_CONVENTION in families["fabric_mfu"].documentation
    (sample,) = families["fabric_peak_memory_gib"].samples
    assert sample.value == pytest.approx(gib, rel=1e-9) and sample.labels["model"] == "qwen2.5-1.5b"
    bmf = benchmark_json(t)["qwen2.5-1.5b-n1-eth"]
    assert bmf["mfu"] == {"value": pytest.approx(mfu, rel=1e-12)}
    assert bmf["peak-memory-gib"] == {"value": pytest.approx(gib, rel=1e-12)}


def test_no_mfu_on_cpu_nights_and_none_of_the_figures_on_nights_saved_before_them(tmp_path):
    """A CPU night: MFU n/a in the summary, no MFU sample or measure, its peak memory shown; the
    recorded night (saved before the figures were) reads n/a for both and emits neither."""
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    from pytest_fabric.history.nights import save_results

    store = session_store()
    for record in store.values():
        if "result" in record and record["case"]["model"] != "collectives":
            record["result"]["peak_memory_bytes"] = 3 * 2**30
    save_results(tmp_path / "cpu.json", store, IDENTITY)
    for path, peak in ((tmp_path / "cpu.json", "3.0"), (FIXTURES / "night.json", "n/a")):
        t = build_tables(load_results(path), load_records(path))
        header, _, *rows = md_rows(job_summary(t), "Throughput (tokens/s, 95% interval)")
        assert {(dict(zip(header, r))["MFU"], dict(zip(header, r))["peak GiB"]) for r in rows} == {("n/a", peak)}
        names = {f.name for f in text_string_to_metric_families(openmetrics(t))}
        assert "fabric_mfu" not in names and ("fabric_peak_memory_gib" in names) == (peak != "n/a")
        bench = benchmark_json(t)
        assert any("tokens-per-second" in measures for measures in bench.values())  # not empty: the check below bites
        assert not any("mfu" in measures for measures in bench.values())


def test_the_default_runs_testcases_stay_under_1000_characters():
    """The real night's verdict and prediction lines with its real launches, in today's format."""
    records = json.loads((FIXTURES / "measurements.json").read_text())
    old = {v["test"].split("::")[-1]: v for v in load_junit(FIXTURES / "night-before-issue12.xml").verdicts}
    from lxml import etree

    for case in etree.parse(str(FIXTURES / "night-before-issue12.xml")).iter("testcase"):
        out = case.find("system-out")
        if out is None or "fabric.gate." not in out.text:
            continue
        human = out.text.split("\n\n")[0].splitlines()
        verdict_lines = [line for line in human if line.startswith(("pass:", "predicted:"))]
        assert len(verdict_lines) == 2
        ms = [Measurement.from_record(Case(**r["case"]), r) for r in records.values()
              if "error" not in r and r["case"]["model"] in case.get("name")]
        gates = old[case.get("name")]["gates"]
        assert gates and ms

        text = text_of(ms, verdict_lines, [outcome()])
        assert len(out.text) > 2500 and len(text) < 1000, (case.get("name"), len(text))


def test_the_plugin_writes_metrics_benchmark_json_and_the_job_summary(pytester, monkeypatch):
    summary = pytester.path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    metrics, bench = pytester.path / "metrics.txt", pytester.path / "bench.json"
    result, _ = run_gates(pytester, ["pass", "inconclusive"], "-k", "not broken", f"--fabric-metrics={metrics}",
                          f"--fabric-benchmark-json={bench}")
    assert result.ret == 0
    text = summary.read_text()
    assert text.startswith("earlier step\n## pytest-fabric: 1 pass, 1 inconclusive")  # appended
    assert "| INCONCLUSIVE | eth/ib |" in text
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    assert len(families["fabric_gate_ratio"].samples) == 2
    assert set(json.loads(bench.read_text())) == {"gate eth/ib"}


def test_no_summary_outside_github_actions(pytester, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result, _ = run_gates(pytester, ["pass"], "-k", "not broken")
    assert result.ret == 0 and not list(Path(pytester.path).glob("*.md"))


@pytest.mark.parametrize("option", ["--fabric-metrics", "--fabric-benchmark-json"])
def test_an_output_in_a_missing_directory_is_a_usage_error(pytester, option):
    result = pytester.runpytest(f"{option}=/nonexistent/dir/out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option} /nonexistent/dir/out: the directory /nonexistent/dir does not exist*"])


def test_a_disturbed_launch_is_left_out_the_same_way_in_every_dashboard():
    """One number and one count per configuration: the summary's 'launches' says how many were
    disturbed (not counted), the metrics carry both counts, and the interval is around the value."""
    from pytest_fabric.history.night_model import CaseResult, SavedRun
    from pytest_fabric.deciding.contrasts import configuration_value

    values, counted = [1000.0, 1100.0, 400.0], [True, True, False]
    case = CaseResult("m", 2, "ib", 2, values, [v / 2 for v in values], counted)
    run = SavedRun({"cluster_kind": "emulated"}, {case.id: case}, {}, [], [], Path("night.json"), "saved")
    (row,) = build_tables(run).configs
    assert row.tokens_per_s == pytest.approx(configuration_value(values[:2])) == pytest.approx(case.mean)
    assert row.low < row.tokens_per_s < row.high
    assert (row.launch_count, row.disturbed, row.launches) == (3, 1, "3 (1 disturbed)")
    assert re.search(r"\| m \| 2 \| ib \| 2 \| [\d.]+ \| .* \| 3 \(1 disturbed\) \|", job_summary(build_tables(run)))
    metrics = openmetrics(build_tables(run))
    assert 'fabric_launches{model="m",nodes="2",fabric="ib",sharding="full"} 3' in metrics
    assert 'fabric_launches_disturbed{model="m",nodes="2",fabric="ib",sharding="full"} 1' in metrics


def test_every_gate_shows_the_noise_it_used_in_the_summary_and_the_metrics():
    from pytest_fabric.history.night_model import SavedRun

    gate = {"a": "eth", "b": "ib", "outcome": "pass", "ratio": 0.99, "ci_low": 0.97, "ci_high": 1.01,
            "confidence": 0.9, "threshold": 0.95, "launches": [3, 3], "launch_noise": 0.014, "noise_df": 9.0,
            "noise_source": "declared default", "family": 4}
    verdict = {"test": "suites/test_parity.py::test_x[m-n2-eth]", "outcome": "pass", "gates": [gate]}
    run = SavedRun({}, {}, {}, [verdict], [], Path("night.json"), "saved")
    summary = job_summary(build_tables(run))
    assert "| 3+3 | 1.4% on 9 df (declared default) |" in summary
    assert "Failures judged over 4 gates (Bonferroni, `--family-wise`)." in summary
    metrics = openmetrics(build_tables(run))
    assert re.search(r'fabric_gate_launch_noise\{.*source="declared default"\} 0\.014', metrics)
    assert re.search(r"fabric_gate_noise_df\{.*\} 9\b", metrics)
    # A night saved before the noise was recorded: a dash, no metric.
    old = SavedRun({}, {}, {}, [{**verdict, "gates": [{k: v for k, v in gate.items() if "noise" not in k}]}], [],
                   Path("night.json"), "saved")
    assert "| 3+3 | - |" in job_summary(build_tables(old)) and "launch_noise" not in openmetrics(build_tables(old))


def test_largest_payloads_keep_one_row_per_collective_in_first_seen_order():
    rows = [BusbwRow(2, "ib", "all_reduce", 1 << 20, 1.0, None), BusbwRow(2, "ib", "all_gather", 1 << 24, 2.0, None),
            BusbwRow(2, "ib", "all_reduce", 1 << 24, 3.0, None), BusbwRow(2, "ib", "all_reduce", 1 << 24, 4.0, None)]
    assert [(r.op, r.busbw_gbit) for r in largest_payloads(rows)] == [("all_reduce", 3.0), ("all_gather", 2.0)]
    assert largest_payloads([]) == []
