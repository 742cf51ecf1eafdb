"""Real runs on the emulated 2-node cluster: torchrun + FSDP2 launches through the whole plugin.

Launches take 15-25 s each on 2 cores (torch import dominates), so each scenario runs pytest once,
as a subprocess like a user's run, and several tests read that one run's output, session directory
and JUnit file.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from helpers import FAST_LAUNCH, assert_valid_junit, emulated_unavailable, session_directory
from lxml import etree

from pytest_fabric import FABRICS, Case, Measurement
from pytest_fabric.history.baselines import build_baseline
from pytest_fabric.history.night_files import load_results

UNAVAILABLE = emulated_unavailable()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("needs_emulated"),
]


@dataclass
class Run:
    result: pytest.RunResult
    output: str
    directory: Path | None  # the session's results directory, as the summary names it
    junit: Path

    @property
    def records(self) -> dict:
        return json.loads((self.directory / "measurements.json").read_text())

    def record(self, fabric: str) -> dict:
        (record,) = [r for r in self.records.values() if Case(**r["case"]) == Case("qwen2-tiny", 2, fabric)]
        return record

    def measured(self, fabric: str) -> Measurement:
        """The stored record as the plugin reads it: the numbers every report must show."""
        return Measurement.from_record(Case("qwen2-tiny", 2, fabric), self.record(fabric))

    @property
    def launch_dirs(self) -> list[str]:
        return sorted(p.name for p in (self.directory / "launches").iterdir() if p.is_dir())

    @property
    def launched_cases(self) -> list[str]:
        """The case id of every launch directory (``<case id>-<time>...``), sorted."""
        return sorted(re.match(r"(qwen2-tiny-n\d+-[a-z]+)-\d", d).group(1) for d in self.launch_dirs)

    def testcases(self) -> dict[str, etree._Element]:
        tree = etree.parse(str(self.junit))
        return {f"{c.get('classname')}::{c.get('name')}": c for c in tree.iter("testcase")}


def run_once(cache: dict, pytester: pytest.Pytester, monkeypatch, source: str, *args: str) -> Run:
    """Run ``source`` under pytest once per module; later tests get the same Run (also a broken one,
    so that a run that went wrong is not repeated by every test reading it)."""
    if "run" not in cache:
        # The session directory goes under the test's own temporary directory (--run-dir).
        tmp = pytester.path / "tmp"
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        pytester.makepyfile(test_generated=source)
        junit = pytester.path / "junit.xml"
        result = pytester.runpytest_subprocess(*args, f"--junitxml={junit}", f"--run-dir={tmp}", timeout=400)
        output = result.stdout.str()
        try:
            directory = session_directory(output)
        except AssertionError:
            directory = None
        cache["run"] = Run(result, output, directory, junit)
        assert directory is None or directory.is_relative_to(tmp), directory
    run = cache["run"]
    assert run.directory is not None, f"the run printed no results directory:\n{run.output}"
    return run


# -- one plain run: terminal table, results store, JUnit -------------------------------------------

SUITE = """
import math

import pytest

from pytest_fabric import assert_ahead, assert_within


@pytest.mark.fabric_matrix(nodes=[2])
def test_step(fabric_case, fabric_measure):
    m = fabric_measure(fabric_case)
    assert m.gpus == 2
    assert math.isfinite(m.result.final_loss)


class TestGates:
    @pytest.mark.fabric_comparison
    @pytest.mark.fabric_matrix(fabrics=["eth"], min_nodes=2)
    def test_eth_vs_ib(self, fabric_case, fabric_measure):
        eth = fabric_measure(fabric_case)
        ib = fabric_measure(fabric_case.with_fabric("ib"))
        assert_within(eth, ib, rel=0.99)

    @pytest.mark.fabric_matrix(fabrics=["ib"], min_nodes=2)
    def test_gate_failure(self, fabric_case, fabric_measure):
        ib = fabric_measure(fabric_case)
        assert_ahead(ib, ib, by=0.5)  # never true: its failure is what is checked
"""


@pytest.fixture(scope="module")
def _plain_cache():
    return {}


@pytest.fixture
def plain_run(_plain_cache, pytester, monkeypatch) -> Run:
    return run_once(_plain_cache, pytester, monkeypatch, SUITE, "--nodes", "2", "--fabrics", "ib,eth",
                    "--fabric-rate", "eth=200", "--fabric-price", "ib=3.5,eth=2.9", *FAST_LAUNCH)


def test_outcomes_and_gate_message(plain_run):
    plain_run.result.assert_outcomes(passed=3, failed=1)
    failure = re.search(r"ib/ib = 1\.000 < 1\.500: ib ([\d.]+) tokens/s is only \+0\.0% ahead of ib ([\d.]+) tokens/s "
                        r"\(required: at least 50% ahead\) \[qwen2-tiny, 2 node\(s\), 2 GPU\(s\)\]", plain_run.output)
    assert failure, plain_run.output
    assert failure.group(1) == failure.group(2)
    # pytrace=False: the message stands alone, no traceback through the gate's code.
    assert "assert_ahead(ib, ib" not in plain_run.output


def test_each_configuration_launched_once_on_two_emulated_nodes(plain_run):
    # Four tests need two configurations (n2-ib, n2-eth): two launches, two records.
    assert plain_run.launched_cases == ["qwen2-tiny-n2-eth", "qwen2-tiny-n2-ib"]
    assert len(plain_run.records) == 2
    for fabric, mbit in (("ib", FABRICS["ib"].emulated_mbit), ("eth", 200)):
        record = plain_run.record(fabric)
        assert "error" not in record, record.get("error")
        assert record["cluster"] == "emulated"
        result = record["result"]
        assert result["world_size"] == 2
        # Two distinct nodes, each at its own emulated address.
        assert len(result["hosts"]) == 2
        assert all("198.18.0." in node for node in result["hosts"]), result["hosts"]
        assert result["fabric"]["name"] == fabric and result["fabric"]["emulated_mbit"] == mbit
        assert (result["batch_size"], result["seq_len"], len(result["step_s"])) == (1, 64, 1)
        assert result["tokens_per_step"] > 0 and result["step_s"][0] > 0
        assert result["format"] == "pytest-fabric-train-result" and result["stopped"] == "time cap"


def test_header_and_summary_name_the_same_directory(plain_run):
    header = re.search(r"results in (\S+)", plain_run.output)
    assert header and Path(header.group(1)) == plain_run.directory
    ib = FABRICS["ib"].emulated_mbit
    assert f"fabric: fabrics ib, eth (emulated links: ib {ib:g} Mbit/s, eth 200 Mbit/s)" in plain_run.output


def test_terminal_table_shows_the_stored_numbers(plain_run):
    lines = plain_run.output.splitlines()
    start = next(i for i, line in enumerate(lines) if "fabric throughput (tokens/s)" in line)
    assert lines[start + 1] == "qwen2-tiny:"
    assert lines[start + 2].split() == ["nodes", "GPUs", "ib", "tok/s", "eth", "tok/s", "eth", "vs", "ib",
                                        "ib", "tok/s/GPU", "eth", "tok/s/GPU", "ib", "MFU", "eth", "MFU",
                                        "ib", "peak", "GiB", "eth", "peak", "GiB"]
    ib, eth = plain_run.measured("ib"), plain_run.measured("eth")
    delta = (eth.tokens_per_s / ib.tokens_per_s - 1) * 100
    # Launch counts in parentheses (and how many were down-weighted) where there are any to show.
    row = re.sub(r" \(\d+(?:, \d+ disturbed)?\)", "", lines[start + 3]).split()
    assert row[:7] == [
        "2", "2", f"{ib.tokens_per_s:.1f}", f"{eth.tokens_per_s:.1f}", f"{delta:+.1f}%",
        f"{ib.tokens_per_s_per_gpu:.1f}", f"{eth.tokens_per_s_per_gpu:.1f}"]
    # No GPU peak on CPU: MFU n/a; the peak memory per rank is the process's.
    assert row[7:9] == ["n/a", "n/a"] and all(float(x) > 0 for x in row[9:11])


def test_terminal_summary_prices_the_fabrics(plain_run):
    from pytest_fabric.physics.cost import break_even_premium, cost_per_million_tokens

    lines = plain_run.output.splitlines()
    start = lines.index("cost (USD per GPU-hour: eth 2.9, ib 3.5):")
    assert lines[start + 1] == "qwen2-tiny:" and "ib break-even premium over eth" in lines[start + 2]
    ib, eth = plain_run.measured("ib"), plain_run.measured("eth")
    row = lines[start + 3].split()
    assert row[:5] == ["2", "2", f"{cost_per_million_tokens(ib.tokens_per_s, 2, 3.5):.4g}",
                       f"{cost_per_million_tokens(eth.tokens_per_s, 2, 2.9):.4g}",
                       f"{break_even_premium(ib.tokens_per_s, eth.tokens_per_s) * 100:+.1f}%"]


def test_junit_is_schema_valid(plain_run, junit_schema):
    assert_valid_junit(junit_schema, plain_run.junit)


def test_junit_system_out_carries_each_tests_measurements(plain_run):
    cases = plain_run.testcases()
    assert sorted(cases) == [
        "test_generated.TestGates::test_eth_vs_ib[qwen2-tiny-n2-eth]",
        "test_generated.TestGates::test_gate_failure[qwen2-tiny-n2-ib]",
        "test_generated::test_step[qwen2-tiny-n2-eth]",
        "test_generated::test_step[qwen2-tiny-n2-ib]",
    ]
    measured = {f: plain_run.measured(f) for f in ("ib", "eth")}
    props = {p.get("name"): p.get("value") for p in etree.parse(str(plain_run.junit)).iter("property")}
    for key, case in cases.items():
        out = case.find("system-out")
        assert out is not None, f"{key} has no system-out"
        assert len(out.text) < 1000, key  # Jenkins keeps a passed test's output whole
        fabrics = ["eth", "ib"] if "eth_vs_ib" in key else [re.search(r"n2-(\w+)\]", key).group(1)]
        for fabric in fabrics:
            expected = measured[fabric].tokens_per_s
            assert f"fabric.qwen2-tiny-n2-{fabric}.tokens_per_s={expected:.3f}" in out.text, key
            assert props[f"fabric.qwen2-tiny-n2-{fabric}.gpus"] == "2"  # the rest of a configuration: suite-wide
    comparison = cases["test_generated.TestGates::test_eth_vs_ib[qwen2-tiny-n2-eth]"].find("system-out").text
    ratio = measured["eth"].tokens_per_s / measured["ib"].tokens_per_s
    assert f"eth/ib tokens/s ratio (qwen2-tiny, 2 nodes): {ratio:.3f}" in comparison


def test_junit_failure_message_carries_the_numbers(plain_run):
    case = plain_run.testcases()["test_generated.TestGates::test_gate_failure[qwen2-tiny-n2-ib]"]
    failure = case.find("failure")
    assert failure is not None
    assert "ib/ib = 1.000 < 1.500: ib " in failure.get("message")
    assert "required: at least 50% ahead" in failure.get("message")


def test_junit_suite_properties_record_versions_and_cluster(plain_run):
    tree = etree.parse(str(plain_run.junit))
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props["fabric.cluster"].startswith("emulated")
    assert props["fabric.fabrics"] == "ib,eth"
    assert props["fabric.version.torch"] == version("torch")
    assert props["fabric.version.backend"] == "gloo"
    assert props["fabric.nodes"] == "2" and props["fabric.device"] == "cpu/float32"
    assert props["fabric.project_version"] == version("fabric-gates")
    assert props["fabric.outcome.pass"] == "3" and props["fabric.outcome.fail"] == "1"
    # xunit2 (the default) has no testcase properties: every property sits in the testsuite.
    assert all(p.getparent().getparent().tag == "testsuite" for p in tree.iter("property"))


# -- xdist: same ids, one launch per configuration ------------------------------------------------

XDIST_SUITE = """
import pytest


@pytest.mark.fabric_matrix(nodes=[2])
def test_a(fabric_case, fabric_measure):
    assert fabric_measure(fabric_case).gpus == 2


@pytest.mark.fabric_matrix(nodes=[2])
def test_b(fabric_case, fabric_measure):
    assert fabric_measure(fabric_case).gpus == 2
"""


@pytest.fixture(scope="module")
def _xdist_cache():
    return {}


@pytest.fixture
def xdist_run(_xdist_cache, pytester, monkeypatch) -> Run:
    return run_once(_xdist_cache, pytester, monkeypatch, XDIST_SUITE, "-n", "2", "-v", "-o", "junit_family=xunit1",
                    "--nodes", "2", "--fabrics", "ib,eth", *FAST_LAUNCH)


def test_xdist_runs_the_same_ids_as_a_plain_collection(xdist_run, pytester):
    pytester.makepyfile(test_collect_only=XDIST_SUITE)
    plain = pytester.runpytest("--collect-only", "-q", "test_collect_only.py", "--nodes", "2", "--fabrics", "ib,eth",
                               *FAST_LAUNCH)
    expected = sorted(line.replace("test_collect_only.py", "test_generated.py")
                      for line in plain.outlines if "::" in line)
    assert len(expected) == 4
    ran = sorted(set(re.findall(r"PASSED (test_generated\.py::\S+)", xdist_run.output)))
    assert ran == expected
    xdist_run.result.assert_outcomes(passed=4)
    # Both workers took part.
    assert "[gw0]" in xdist_run.output and "[gw1]" in xdist_run.output


def test_xdist_controller_shows_the_nights_plan_once_before_any_test_runs(xdist_run):
    # The first worker to collect makes the plan; the controller, which collects nothing, shows it.
    out = xdist_run.output
    assert len(re.findall(r"fabric: plan: 0 gate\(s\), \d+ other launch\(es\)", out)) == 1, out
    assert out.index("fabric: plan: ") < out.index("PASSED")
    assert "fabric: plan: launch costs from: " in out


def test_xdist_launches_each_configuration_once(xdist_run):
    assert xdist_run.launched_cases == ["qwen2-tiny-n2-eth", "qwen2-tiny-n2-ib"]
    assert len(xdist_run.records) == 2
    assert all("error" not in r for r in xdist_run.records.values())


def test_xdist_controller_prints_the_table(xdist_run):
    ib, eth = xdist_run.measured("ib"), xdist_run.measured("eth")
    assert "fabric throughput (tokens/s)" in xdist_run.output
    count = r"(?: \(\d+(?:, \d+ disturbed)?\))?"
    assert re.search(rf"^\s+2\s+2\s+{ib.tokens_per_s:.1f}{count}\s+{eth.tokens_per_s:.1f}{count}\s", xdist_run.output,
                     re.M)


def test_xdist_junit_has_system_out_and_xunit1_properties_for_every_test(xdist_run):
    cases = xdist_run.testcases()
    assert len(cases) == 4
    for key, case in cases.items():
        fabric = re.search(r"n2-(\w+)\]", key).group(1)
        expected = xdist_run.measured(fabric).tokens_per_s
        out = case.find("system-out")
        assert out is not None and f"fabric.qwen2-tiny-n2-{fabric}.tokens_per_s={expected:.3f}" in out.text, key
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props[f"fabric.qwen2-tiny-n2-{fabric}.tokens_per_s"] == f"{expected:.3f}", key


# -- a launch that fails: reported with logs, cached, cleaned up ----------------------------------

FAILING_SUITE = """
import pytest


@pytest.mark.fabric_matrix(nodes=[2], fabrics=["ib"])
def test_first(fabric_case, fabric_measure):
    fabric_measure(fabric_case)


@pytest.mark.fabric_matrix(nodes=[2], fabrics=["ib"])
def test_second(fabric_case, fabric_measure):
    fabric_measure(fabric_case)
"""


def test_deadline_fails_every_test_of_the_configuration_with_one_launch(pytester, monkeypatch):
    # A one-second deadline: torchrun has not even imported torch by then (the later option wins).
    run = run_once({}, pytester, monkeypatch, FAILING_SUITE, "--nodes", "2", "--fabrics", "ib", *FAST_LAUNCH,
                   "--launch-timeout", "1")
    run.result.assert_outcomes(failed=2)
    messages = re.findall(r"measurement failed: qwen2-tiny-n2-ib on the emulated cluster: deadline exceeded after "
                          r"[\d.]+s", run.output)
    assert len(messages) >= 2, run.output
    assert "--- node0: killed; last lines of " in run.output and "--- node1: killed; last lines of " in run.output
    assert re.search(r"failed launch: qwen2-tiny-n2-ib on the emulated cluster: deadline exceeded", run.output)
    # The second test reused the cached failure instead of waiting out the deadline again.
    assert len(run.launch_dirs) == 1
    assert "error" in run.record("ib")


@pytest.mark.slow
def test_throughput_launches_teach_the_baseline_each_configurations_noise(pytester, monkeypatch, tmp_path):
    """--throughput-launches 2 on the shipped throughput suite: two real launches of the configuration,
    its value over both in the saved night, and `pytest-fabric baseline` learns its launch noise."""
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    saved = tmp_path / "night.json"
    suite = Path(__file__).resolve().parents[2] / "suites" / "test_throughput.py"
    result = pytester.runpytest_subprocess(str(suite), "--nodes", "2", "-k", "n2-ib]", "--throughput-launches", "2",
                                           f"--fabric-save={saved}", *FAST_LAUNCH, timeout=300)
    result.assert_outcomes(passed=1)
    run = load_results(saved)
    (case,) = run.cases.values()
    assert case.nodes == 2 and len(case.tokens_per_s) == 2
    noise = build_baseline([run])["launch_noise"]
    assert set(noise["cases"]) == {case.id} and noise["cases"][case.id]["df"] == 1
    assert noise["cases"][case.id]["sigma"] == pytest.approx(
        abs(math.log(case.tokens_per_s[0]) - math.log(case.tokens_per_s[1])) / math.sqrt(2))
