"""Saved nights: the JSON round trip, reading the plugin's JUnit, rejecting what is not ours, baselines.

Store records are built (``helpers.py``) in the shape the rank programs write them (``TrainResult`` /
``CollectivesResult``, result version 2; no launches), and in the version-1 shape where the point
is that older stores are still read. The JUnit text comes from ``junit.testcase_text``, the
function the plugin writes system-out with, so the reader is tested against the writer rather
than against a copy of its format. A configuration's value is the geometric mean of its launches;
the expected values are computed from the launches (``helpers.geomean``).
"""

from __future__ import annotations

import json
import math
import pickle
import statistics

import pytest
from helpers import (ETH_LAUNCHES, IB_LAUNCHES, IDENTITY, VERDICTS, VERSIONS, geomean, junit_text, nights, saved,
                     outcome as gate_outcome,
                     session_store, train_measurement, train_record)

from pytest_fabric import Case, Measurement
from pytest_fabric.history.junit import suite_properties
from pytest_fabric.history.junit import testcase_text as text_of
from pytest_fabric.history.baselines import (baseline_for, baseline_noise, build_baseline,
                                             load_baseline, save_baseline)
from pytest_fabric.history.night_model import CaseResult, ResultsError, SavedRun
from pytest_fabric.history.night_files import load_results
from pytest_fabric.history.nights import BASELINE_FORMAT, RESULTS_FORMAT, save_results
from pytest_fabric.history.setups import identity_mismatch
from pytest_fabric.deciding.contrasts import NoisePrior
from pytest_fabric.workload.result import (
    COLLECTIVES_FORMAT,
    RESULT_VERSION,
    TRAIN_FORMAT,
)


# -- save and load -----------------------------------------------------------------------------

def test_round_trip_keeps_every_launch_bandwidth_verdicts_and_identity(tmp_path):
    path = saved(tmp_path)
    data = json.loads(path.read_text())
    assert data["format"] == RESULTS_FORMAT and data["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["night.json"]  # the temporary file is gone

    # The raw records go along in the format the rank programs wrote them.
    raw = data["records"]["qwen2-tiny-n2-ib#bbbb"]["result"]
    assert (raw["format"], raw["version"]) == (TRAIN_FORMAT, RESULT_VERSION) and "nodes" not in raw
    assert raw["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert data["records"]["collectives-n2-eth#gggg"]["result"]["format"] == COLLECTIVES_FORMAT

    run = load_results(path)
    assert run.kind == "results" and run.source == path
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx(list(IB_LAUNCHES))  # launch order
    assert run.measurements["qwen2-tiny-n2-eth"] == pytest.approx(list(ETH_LAUNCHES))
    eth = run.cases["qwen2-tiny-n2-eth"]
    assert (eth.model, eth.nodes, eth.fabric, eth.gpus) == ("qwen2-tiny", 2, "eth", 2)
    # The configuration's value is the geometric mean of its launches (not their arithmetic mean).
    assert eth.mean == pytest.approx(geomean(ETH_LAUNCHES), rel=1e-12)
    assert eth.mean_per_gpu == pytest.approx(geomean(ETH_LAUNCHES) / 2, rel=1e-12)
    assert eth.mean != pytest.approx(statistics.fmean(ETH_LAUNCHES), rel=1e-6)
    # One node never crosses the fabric: its launch is listed under every fabric of the session.
    assert run.measurements["qwen2-tiny-n1-ib"] == run.measurements["qwen2-tiny-n1-eth"] == pytest.approx([1000])
    link = run.bandwidth["collectives-n2-eth"]
    assert link.busbw_gbit == pytest.approx({"all_reduce": 0.36, "all_gather": 0.36})  # the largest payload
    assert link.payload_bytes == 16 << 20 and link.link_gbit == pytest.approx(0.4)
    assert run.verdicts == VERDICTS
    assert run.errors == ["llama-wide-n1-ib on the emulated cluster: rank 0 exited 1"]
    ident = run.identity
    assert ident["cluster_kind"] == "emulated" and ident["nodes"] == 2 and ident["fabrics"] == ["ib", "eth"]
    assert ident["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert ident["versions"] == {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.23.0",
                                 "backend": "gloo"}  # unknown versions are left out, not None
    assert ident["device"] == "cpu" and ident["dtype"] == "float32"
    assert ident["shapes"] == {"qwen2-tiny": "1 x 64", "llama-wide": "1 x 64"}
    assert ident["created"] and ident["pytest_fabric"]
    assert run.fabrics() == ["ib", "eth"]


def test_the_callers_identity_wins_over_what_the_records_say(tmp_path):
    path = tmp_path / "n.json"
    identity = {"nodes": 4, "gpu": "NVIDIA H100 80GB HBM3", "created": "2026-01-02T03:04:05"}
    save_results(path, session_store(), identity, [])
    ident = load_results(path).identity
    assert ident["nodes"] == 4 and ident["gpu"] == "NVIDIA H100 80GB HBM3"
    assert load_results(path).label == "2026-01-02 03:04"


def test_launches_are_ordered_by_launch_number_not_by_key_text(tmp_path):
    store = {f"m-n2-ib#h@{i}" if i else "m-n2-ib#h": train_record(Case("m", 2, "ib"), 100 + i) for i in range(12)}
    path = tmp_path / "n.json"
    save_results(path, store, {}, [])
    assert load_results(path).measurements["m-n2-ib"] == pytest.approx([100 + i for i in range(12)])


def test_a_session_store_loads_as_it_is(tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(session_store()))
    run = load_results(path)
    assert run.kind == "store"
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx(list(IB_LAUNCHES))
    assert set(run.fabrics()) == {"ib", "eth"}
    assert run.measurements["qwen2-tiny-n1-eth"] == pytest.approx([1000])
    assert run.identity["cluster_kind"] == "emulated"
    assert run.identity["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert run.label == tmp_path.name  # a session directory is named after its start time


def test_a_store_of_pytest_fabric_0_1_results_is_refused_with_what_to_do(tmp_path):
    old = session_store()
    result = old["qwen2-tiny-n2-ib#bbbb"]["result"]
    result["nodes"] = result.pop("hosts")
    del result["format"], result["version"]
    store = tmp_path / "measurements.json"
    store.write_text(json.dumps(old))
    with pytest.raises(ResultsError, match="pytest-fabric 0.1.*run its launches again"):
        load_results(store)


# -- JUnit as the plugin writes it ---------------------------------------------------------------


def test_junit_metrics_launches_verdicts_and_identity(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(junit_text(session_store()))
    run = load_results(path)
    assert run.kind == "junit"
    # A configuration measured several times: every launch, from its launch_tokens_per_s= line
    # (written with 3 decimals), and its value, the geometric mean of those launches.
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx(list(IB_LAUNCHES), abs=5e-4)
    assert run.measurements["qwen2-tiny-n2-eth"] == pytest.approx(list(ETH_LAUNCHES), abs=5e-4)
    assert run.cases["qwen2-tiny-n2-ib"].mean == pytest.approx(geomean(IB_LAUNCHES), rel=1e-6)
    assert run.measurements["llama-wide-n2-eth"] == pytest.approx([43], abs=1e-3)
    assert run.measurements["qwen2-tiny-n1-eth"] == pytest.approx([1000], abs=1e-3)
    assert run.cases["llama-wide-n2-eth"].gpus == 2
    assert run.cases["llama-wide-n2-eth"].tokens_per_s_per_gpu == pytest.approx([21.5], abs=1e-3)
    link = run.bandwidth["collectives-n2-eth"]
    assert link.busbw_gbit == pytest.approx({"all_gather": 0.36, "all_reduce": 0.36})
    assert link.payload_bytes == 16 << 20 and link.link_gbit == pytest.approx(0.4)
    outcomes = {v["test"].split("::")[-1]: v for v in run.verdicts}
    assert "test_unrelated" not in outcomes  # nothing measured: not a fabric verdict
    assert outcomes["test_parity[qwen2-tiny-n2-eth]"]["outcome"] == "pass"
    # Its message is read from the gate's machine fields, not from the sentence above them.
    assert outcomes["test_parity[qwen2-tiny-n2-eth]"]["message"] == "pass: eth/ib = 0.981 [0.962, 1.001] vs threshold 0.950"
    assert outcomes["test_parity[qwen2-tiny-n2-eth]"]["gates"][0]["launches"] == [3, 4]
    failed = outcomes["test_advantage[llama-wide-n2-eth]"]
    assert failed["outcome"] == "fail" and "wholly below" in failed["message"]
    assert (failed["model"], failed["nodes"], failed["fabric"]) == ("llama-wide", 2, "eth")
    ident = run.identity
    assert ident["fabrics"] == ["ib", "eth"] and ident["versions"] == {"torch": "2.13.0+cpu"}
    assert ident["cluster_kind"] == "emulated" and ident["nodes"] == 2 and ident["device"] == "cpu"
    assert ident["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert run.label == "2026-11-22 23:05"


def junit_skeleton(*names: str) -> str:
    """A JUnit file as pytest's junitxml writes it before the plugin adds its text: one testcase of
    suites/test_x.py per name, nothing in system-out."""
    cases = "".join(f'<testcase classname="suites.test_x" name="{n}" time="2.0"/>' for n in names)
    return ('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
            f'errors="0" failures="0" skipped="0" tests="{len(names)}" time="4.0" '
            f'timestamp="2026-11-23T01:02:03.000000+00:00" hostname="vm">{cases}</testsuite></testsuites>')


def launches(model: str, nodes: int, fabric: str, values, gpus_per_node: int = 1) -> list[Measurement]:
    """One Measurement per launch value, read back from store records as the plugin does."""
    return [train_measurement(model, nodes, fabric, v, launch=i, gpus_per_node=gpus_per_node, addresses=True)
            for i, v in enumerate(values)]


def test_junit_round_trip_keeps_every_launch_and_the_geometric_mean(tmp_path):
    """junit.testcase_text -> the plugin's JUnit (add_to_junit) -> load_results: the same launches
    and the same value, the geometric mean of the launches (the number the gate judged)."""
    from pytest_fabric.history.junit import add_to_junit

    ib, eth = (1500.0, 1812.5, 2100.25), (1200.0, 1633.333, 1400.5, 999.75)  # spread: geomean != mean
    ms = launches("qwen2-tiny", 2, "ib", ib, gpus_per_node=2) + launches("qwen2-tiny", 2, "eth", eth, gpus_per_node=2)
    assert [m.tokens_per_s for m in ms] == pytest.approx([*ib, *eth], rel=1e-12)
    text = text_of(ms, outcomes=[gate_outcome()])
    props = suite_properties(ms, {"fabric.cluster": "emulated (network namespaces on this machine)",
                                  "fabric.fabrics": "ib,eth"})
    # The machine line holds the geometric mean, not the arithmetic one.
    assert f"fabric.qwen2-tiny-n2-ib.tokens_per_s={geomean(ib):.3f}" in text.splitlines()
    assert props["fabric.qwen2-tiny-n2-eth.tokens_per_s_per_gpu"] == f"{geomean(eth) / 4:.3f}"
    assert f"{statistics.fmean(ib):.3f}" not in text

    path = tmp_path / "junit.xml"
    path.write_text(junit_skeleton("test_parity[qwen2-tiny-n2-eth]", "test_other"))
    assert add_to_junit(path, {"suites/test_x.py::test_parity[qwen2-tiny-n2-eth]": text}, props) == 1
    run = load_results(path)
    assert run.kind == "junit" and set(run.cases) == {"qwen2-tiny-n2-ib", "qwen2-tiny-n2-eth"}
    for cid, values in (("qwen2-tiny-n2-ib", ib), ("qwen2-tiny-n2-eth", eth)):
        c = run.cases[cid]
        assert c.gpus == 4
        assert c.tokens_per_s == pytest.approx(list(values), abs=5e-4)  # launch order, 3 decimals
        assert c.tokens_per_s_per_gpu == pytest.approx([v / 4 for v in values], abs=5e-4)
        assert c.mean == pytest.approx(geomean(values), rel=1e-6)
        assert c.mean_per_gpu == pytest.approx(geomean(values) / 4, rel=1e-6)
        assert c.mean == pytest.approx(configuration_line(text, cid), abs=5e-4)  # what JUnit showed
    assert run.identity["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert run.identity["cluster_kind"] == "emulated" and run.identity["nodes"] == 2
    assert run.identity["fabrics"] == ["ib", "eth"]
    assert [v["outcome"] for v in run.verdicts] == ["pass"]
    assert run.verdicts[0]["message"].startswith("pass: eth/ib = 0.981")


def configuration_line(text: str, case_id: str) -> float:
    """The value a testcase's machine line gives a configuration."""
    prefix = f"fabric.{case_id}.tokens_per_s="
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).removeprefix(prefix))


def test_the_junit_reader_ignores_the_human_sentences(tmp_path):
    """The human lines are for people; a reader reads only fabric.<case>.<name>= lines. Human lines
    that disagree with the machine lines (edited, or written by an older format: "mean ... over N
    launches (...)") change nothing, and a configuration only a sentence mentions is not read."""
    ib = (1800.0, 1820.0, 1790.0)
    text = text_of(launches("qwen2-tiny", 2, "ib", ib))
    props = suite_properties(launches("qwen2-tiny", 2, "ib", ib), {})
    human = next(line for line in text.splitlines() if line.startswith("qwen2-tiny-n2-ib: "))
    lied = text.replace(human, "\n".join([
        "qwen2-tiny-n2-ib: 999.0 tokens/s over 2 launches (998.0, 1000.0), 2 GPU(s)",
        "qwen2-tiny-n2-ib: mean 555.0 tokens/s over 4 launches (500.0, 550.0, 600.0, 570.0), 2 GPU(s)",
        "llama-wide-n2-eth: mean 43.0 tokens/s over 2 launches (40.0, 46.0), 2 GPU(s)",
    ]))
    assert lied != text and props["fabric.qwen2-tiny-n2-ib.launch_tokens_per_s"] == "1800.000,1820.000,1790.000"
    path = tmp_path / "junit.xml"
    path.write_text(junit_skeleton("test_parity[qwen2-tiny-n2-ib]"))
    from pytest_fabric.history.junit import add_to_junit

    add_to_junit(path, {"suites/test_x.py::test_parity[qwen2-tiny-n2-ib]": lied}, props)
    run = load_results(path)
    assert set(run.cases) == {"qwen2-tiny-n2-ib"}  # llama-wide had a sentence, no machine lines
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx(list(ib), abs=5e-4)
    assert run.cases["qwen2-tiny-n2-ib"].mean == pytest.approx(geomean(ib), rel=1e-6)
    assert run.cases["qwen2-tiny-n2-ib"].gpus == 2


def test_a_disturbed_launch_is_left_out_of_the_value_read_back(tmp_path):
    """CaseResult.mean is documented as 'the number the terminal and JUnit showed': a launch
    disturbed as a whole is not counted in it, read from JUnit or from a saved night."""
    from pytest_fabric.history.junit import add_to_junit
    from pytest_fabric.measuring.measurement import configuration_tokens_per_s

    ms = launches("qwen2-tiny", 2, "ib", IB_LAUNCHES)
    # Every step of it marked disturbed by the node's signals: the launch is disturbed as a whole
    # (``Measurement.disturbed``), its round runs again, and it is not counted.
    aside = train_measurement("qwen2-tiny", 2, "ib", 900.0, launch=3, disturbed=4)
    assert not aside.counted and all(m.counted for m in ms)
    judged = configuration_tokens_per_s([*ms, aside])
    assert judged == pytest.approx(geomean(IB_LAUNCHES), rel=1e-12)
    path = tmp_path / "junit.xml"
    path.write_text(junit_skeleton("test_x[qwen2-tiny-n2-ib]"))
    add_to_junit(path, {"suites/test_x.py::test_x[qwen2-tiny-n2-ib]": text_of([*ms, aside])}, {})
    store = {f"qwen2-tiny-n2-ib#b@{i}" if i else "qwen2-tiny-n2-ib#b": train_record(Case("qwen2-tiny", 2, "ib"), v)
             for i, v in enumerate(IB_LAUNCHES)}
    store["qwen2-tiny-n2-ib#b@3"] = train_record(Case("qwen2-tiny", 2, "ib"), 900.0, disturbed=4)
    save_results(tmp_path / "night.json", store, {}, [])
    for source in (path, tmp_path / "night.json"):
        assert load_results(source).cases["qwen2-tiny-n2-ib"].mean == pytest.approx(judged, rel=1e-6), source


def test_junit_reads_a_fabric_whose_name_has_a_dot(tmp_path):
    from pytest_fabric.history.junit import add_to_junit

    ms = launches("qwen2-tiny", 2, "roce.v2", (1000.0, 1010.0))
    path = tmp_path / "junit.xml"
    path.write_text(junit_skeleton("test_x[qwen2-tiny-n2-roce.v2]"))
    add_to_junit(path, {"suites/test_x.py::test_x[qwen2-tiny-n2-roce.v2]": text_of(ms)}, suite_properties(ms, {}))
    assert load_results(path).measurements["qwen2-tiny-n2-roce.v2"] == pytest.approx([1000.0, 1010.0], abs=5e-4)


# -- the step's figures: MFU and peak memory -------------------------------------------------------

def test_a_saved_night_keeps_mfu_and_peak_memory_of_the_recorded_gpu_launch(tmp_path):
    """The H200 launch (fixtures/gpu, recorded on hardware): its MFU at the configuration's value, the
    peak it is taken against and its peak memory are written and read back; the convention is named."""
    from helpers import GPU_PEAK, gpu_expected, gpu_record

    from pytest_fabric.core.models import MFU_CONVENTION

    path = tmp_path / "night.json"
    save_results(path, {"qwen2.5-1.5b-n1-any#aaaa": gpu_record("ib")}, {"fabrics": ["ib", "eth"]})
    mfu, gib = gpu_expected()
    written = json.loads(path.read_text())
    assert written["cases"]["qwen2.5-1.5b-n1-eth"]["mfu"] == pytest.approx(mfu, rel=1e-12)
    assert written["identity"]["mfu_convention"] == MFU_CONVENTION
    run = load_results(path)
    for fabric in ("ib", "eth"):  # one node: its launch serves every fabric
        case = run.cases[f"qwen2.5-1.5b-n1-{fabric}"]
        assert case.mfu == pytest.approx(mfu, rel=1e-12) and case.mfu_peak == GPU_PEAK
        assert case.peak_memory_gib == pytest.approx(gib, rel=1e-12)
    assert run.identity["mfu_convention"] == MFU_CONVENTION
    # Recorded before the output head was counted: MFU takes the catalog's count (10.3 GFLOP/token,
    # not the recorded 8.9), so 37.4% rather than the 32.3% the recording's own figure gives.
    assert 0.37 < mfu < 0.38 and gib == pytest.approx(90.0, abs=0.1)


def test_a_cpu_night_saves_no_mfu_and_its_peak_memory(tmp_path):
    """No GPU peak, no MFU: the field is left out and reads back None; the peak resident set is kept."""
    store = session_store()
    store["qwen2-tiny-n1-any#aaaa"]["result"]["peak_memory_bytes"] = 3 * 2**30
    path = tmp_path / "night.json"
    save_results(path, store, IDENTITY, VERDICTS)
    written = json.loads(path.read_text())["cases"]["qwen2-tiny-n1-eth"]
    assert "mfu" not in written and "mfu_peak" not in written and written["peak_memory_gib"] == 3.0
    case = load_results(path).cases["qwen2-tiny-n1-eth"]
    assert case.mfu is None and case.mfu_peak is None and case.peak_memory_gib == 3.0


def test_a_night_saved_before_mfu_and_peak_memory_still_loads(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(saved_json(one_case()))
    case = load_results(path).cases["m-n2-ib"]
    assert case.mean == 1.0 and (case.mfu, case.mfu_peak, case.peak_memory_gib) == (None, None, None)


def test_junit_machine_lines_give_back_mfu_and_peak_memory(tmp_path):
    """The recorded H200 launch through the plugin's JUnit (suite properties, testcase text) and back;
    a CPU launch reads n/a as None; a file written before the lines reads None too."""
    from helpers import GPU_PEAK, gpu_expected, gpu_measurement

    from pytest_fabric.history.junit import add_to_junit
    from pytest_fabric.core.models import MFU_CONVENTION

    gpu, cpu = gpu_measurement("eth"), launches("qwen2-tiny", 2, "eth", [1700.0])[0]
    path = tmp_path / "j.xml"
    path.write_text(junit_skeleton("test_x[qwen2.5-1.5b-n1-eth]", "test_x[qwen2-tiny-n2-eth]"))
    add_to_junit(path, {"suites/test_x.py::test_x[qwen2.5-1.5b-n1-eth]": text_of([gpu]),
                        "suites/test_x.py::test_x[qwen2-tiny-n2-eth]": text_of([cpu])},
                 suite_properties([gpu, cpu], {}))
    run = load_results(path)
    mfu, gib = gpu_expected()
    case = run.cases["qwen2.5-1.5b-n1-eth"]
    assert case.mfu == pytest.approx(mfu, abs=5e-5) and case.mfu_peak == GPU_PEAK  # written with 4 decimals
    assert case.peak_memory_gib == pytest.approx(gib, abs=5e-3)
    assert run.cases["qwen2-tiny-n2-eth"].mfu is None and run.cases["qwen2-tiny-n2-eth"].mfu_peak is None
    assert run.identity["mfu_convention"] == MFU_CONVENTION


# -- what is not ours ----------------------------------------------------------------------------

def saved_json(cases: dict | None = None, version: int = 1) -> str:
    return json.dumps({"format": RESULTS_FORMAT, "version": version, "identity": {}, "cases": cases or {},
                       "bandwidth": {}, "verdicts": []})


def one_case(**changes) -> dict:
    case = {"model": "m", "nodes": 2, "fabric": "ib", "gpus": 2, "tokens_per_s": [1.0], "tokens_per_s_per_gpu": [0.5]}
    return {"m-n2-ib": {**case, **changes}}


CORRUPT = {
    "truncated.json": ('{"format": "pytest-fabric-results", "version": 1, "cases": {', "invalid JSON"),
    "marker.json": ('{"format": "someone-else", "version": 1}', "unknown format marker 'someone-else'"),
    "list.json": ("[1, 2, 3]", "the JSON is a list, expected an object"),
    "empty-object.json": ("{}", "empty JSON object"),
    "empty.json": ("", "neither JSON nor XML"),
    "html.xml": ("<html><body>not a report</body></html>", "XML but not JUnit"),
    "broken.xml": ('<testsuites><testsuite name="a"', "not readable as JUnit XML"),
    "plain-junit.xml": ('<testsuite name="p" tests="1"><testcase classname="a" name="t"/></testsuite>',
                        "no testcase carries pytest-fabric measurements"),
    "launches.xml": ('<testsuite name="p" tests="1"><testcase classname="a" name="t"><system-out>'
                     "fabric.m-n2-ib.tokens_per_s=1.0\nfabric.m-n2-ib.launch_tokens_per_s=1.0,fast"
                     "</system-out></testcase></testsuite>", "is not a comma-separated list of numbers"),
    "newer.json": (saved_json(version=99), "newer pytest-fabric"),
    "case.json": (saved_json(one_case(nodes="two")), "\"nodes\" must be int"),
    "values.json": (saved_json(one_case(tokens_per_s=[])), "non-empty list of positive numbers"),
    "mfu.json": (saved_json(one_case(mfu="high")), "\"mfu\" must be int or float"),
    "peak.json": (saved_json(one_case(peak_memory_gib=-1)), "\"peak_memory_gib\" must be a number >= 0"),
    "store.json": (json.dumps({"m-n2-ib#x": {"case": {"model": "m", "nodes": 2, "fabric": "ib"},
                                             "cluster": "emulated", "result": {"step_s": [0.1]}}}),
                   "record 'm-n2-ib#x' is malformed"),
    "notrecords.json": ('{"a": 1}', "has no \"case\" object"),
    "prices.json": (saved_json()[:-1] + ', "prices": {"ib": "cheap"}}', "\"prices\" must map fabric names"),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_corrupt_inputs_raise_a_message_naming_the_file(tmp_path, name):
    text, expected = CORRUPT[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ResultsError) as info:
        load_results(path)
    assert str(path) in str(info.value) and expected in str(info.value)


def test_prices_are_saved_with_the_night_and_read_back(tmp_path):
    path = tmp_path / "night.json"
    save_results(path, session_store(), IDENTITY, VERDICTS, {"ib": 3.5, "eth": 2.9})
    assert json.loads(path.read_text())["prices"] == {"eth": 2.9, "ib": 3.5}
    assert load_results(path).prices == {"eth": 2.9, "ib": 3.5}
    assert load_results(saved(tmp_path, "plain.json")).prices == {}  # none given: none saved


def test_a_pickle_is_refused_without_being_loaded(tmp_path):
    path = tmp_path / "night.pkl"
    path.write_bytes(pickle.dumps({"format": RESULTS_FORMAT}))
    with pytest.raises(ResultsError, match="pickle"):
        load_results(path)


def test_binary_and_missing_files(tmp_path):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe\x00\x01junk")
    with pytest.raises(ResultsError, match="not UTF-8"):
        load_results(garbage)
    with pytest.raises(ResultsError, match="cannot read"):
        load_results(tmp_path / "absent.json")


# -- identities ----------------------------------------------------------------------------------

def test_identity_mismatch_names_each_difference():
    a = {"cluster_kind": "emulated", "nodes": 2, "device": "cuda", "gpu": "H100",
         "hosts": ["n1", "n2"], "versions": {"torch": "2.13.0", "nccl": "2.21.5", "python": "3.11"},
         "shapes": {"qwen2.5-7b": "2 x 2048", "llama-3.1-8b": "2 x 2048"}}
    b = {"cluster_kind": "slurm", "nodes": 4, "device": "cuda", "gpu": "A100",
         "hosts": ["n2", "n3"], "versions": {"torch": "2.14.0", "nccl": "2.23.4", "python": "3.12"},
         "shapes": {"qwen2.5-7b": "1 x 4096"}}
    lines = identity_mismatch(a, b, ("baseline", "tonight"))
    assert "cluster kind differs: emulated (baseline) vs slurm (tonight)" in lines
    assert "node count differs: 2 (baseline) vs 4 (tonight)" in lines
    assert "GPU differs: H100 (baseline) vs A100 (tonight)" in lines
    assert "torch version differs: 2.13.0 (baseline) vs 2.14.0 (tonight)" in lines
    assert "NCCL version differs: 2.21.5 (baseline) vs 2.23.4 (tonight)" in lines
    assert "hosts differ: only in baseline: n1; only in tonight: n3" in lines
    assert "qwen2.5-7b batch x sequence differs: 2 x 2048 (baseline) vs 1 x 4096 (tonight)" in lines
    assert len(lines) == 7
    assert not any("python" in line or "device" in line for line in lines)  # python is not a fabric fact
    assert identity_mismatch(a, dict(a)) == []


def test_a_fact_only_one_side_recorded_is_not_a_difference():
    assert identity_mismatch({"gpu": "H100", "versions": {"nccl": "2.21.5"}}, {"versions": {}}) == []


# -- baselines -----------------------------------------------------------------------------------


def test_a_built_baseline_pairs_two_cases_night_by_night(tmp_path):
    from pytest_fabric.history.baselines import Baseline

    paths = nights(tmp_path, [1.0, 1.01, 0.99, 1.005, 0.5])
    out = tmp_path / "baseline.json"
    baseline = build_baseline([load_results(p) for p in paths])
    save_baseline(out, baseline)
    loaded = Baseline.load(str(out))
    ib, eth = "qwen2-tiny-n2-ib", "qwen2-tiny-n2-eth"
    pairs = loaded.paired(ib, eth)
    # The outlier night (0.5) is dropped for both cases: four nights pair up, each with its own values.
    assert len(pairs) == 4
    expected = {n["night"]: n["tokens_per_s"] for n in baseline["cases"][ib]["nights"] if n["kept"]}
    assert sorted(a for a, _ in pairs) == sorted(expected.values())
    # The same night's two values: scaled alike, so their ratio is the same every night.
    assert len({round(a / b, 9) for a, b in pairs}) == 1
    assert loaded.paired(ib, "no-such-case") == []


def test_baseline_drops_an_outlier_night(tmp_path):
    paths = nights(tmp_path, [1.0, 1.01, 0.99, 1.005, 0.5])
    baseline = build_baseline([load_results(p) for p in paths])
    c = baseline["cases"]["qwen2-tiny-n2-ib"]
    assert c["kept"] == 4 and c["dropped"] == 1
    # Each night's value is the geometric mean of its launches; the center is the median of the
    # nights kept (scales 1.0, 1.01, 0.99, 1.005: median 1.0025).
    assert [n["tokens_per_s"] for n in c["nights"]] == pytest.approx(
        [geomean(IB_LAUNCHES) * scale for scale in (1.0, 1.01, 0.99, 1.005, 0.5)], rel=1e-12)
    assert c["center"] == pytest.approx(geomean(IB_LAUNCHES) * statistics.median([1.0, 1.01, 0.99, 1.005]),
                                        rel=1e-12)
    assert [n["night"] for n in c["nights"] if not n["kept"]] == ["2026-11-14 02:00"]
    assert c["spread"] > 0 and c["gpus"] == 2
    assert baseline["warnings"] == []

    out = tmp_path / "baseline.json"
    save_baseline(out, baseline)
    assert json.loads(out.read_text())["format"] == BASELINE_FORMAT
    loaded = load_baseline(out)
    assert loaded["cases"]["qwen2-tiny-n2-ib"]["center"] == pytest.approx(c["center"])
    b = baseline_for(loaded, "qwen2-tiny-n2-ib")
    assert b.center == pytest.approx(c["center"]) and len(b.kept) == 4 and len(b.dropped) == 1
    assert baseline_for(loaded, "never-n9-ib") is None

    # A baseline is a run too: one value per case, its center.
    as_run = load_results(out)
    assert as_run.kind == "baseline"
    assert as_run.measurements["qwen2-tiny-n2-ib"] == pytest.approx([c["center"]])
    assert as_run.cases["qwen2-tiny-n2-ib"].mean_per_gpu == pytest.approx(c["center"] / 2)
    assert as_run.identity["baseline_nights"] == 5


def test_baseline_warns_when_the_nights_ran_on_different_set_ups(tmp_path):
    newer = {**VERSIONS, "torch": "2.14.0"}
    paths = nights(tmp_path, [1.0, 1.0, 1.0], [VERSIONS, VERSIONS, newer])
    baseline = build_baseline([load_results(p) for p in paths])
    assert len(baseline["warnings"]) == 2
    assert all("torch version differs: 2.13.0+cpu" in w for w in baseline["warnings"])


def test_load_baseline_refuses_a_results_file(tmp_path):
    path = saved(tmp_path)
    with pytest.raises(ResultsError, match="not a pytest-fabric baseline"):
        load_baseline(path)


# -- launch noise learned from nights ------------------------------------------------------------

def night_of(cases: dict[str, list[float]], created: str = "2026-11-10T02:00:00+00:00", gpus: int = 2) -> SavedRun:
    """A night with the given launches (tokens/s) per case id."""
    out = {}
    for cid, values in cases.items():
        case = Case.parse(cid)
        out[cid] = CaseResult(case.model, case.nodes, case.fabric, gpus, list(values), [v / gpus for v in values])
    return SavedRun({"created": created}, out)


def test_baseline_learns_the_launch_noise_from_repeated_launches():
    """Launches spread by known amounts in log space: three launches at x*e^-s, x, x*e^s give a
    squared deviation sum of 2 s^2 over 2 degrees of freedom, two at x*e^-t, x*e^t give 2 t^2 over 1.
    Pooled over every multi-node configuration of every night: sqrt((2 s^2 * 2 + 2 t^2) / 5)."""
    s, t = 0.03, 0.06
    three = lambda x: [x * math.exp(-s), x, x * math.exp(s)]  # noqa: E731
    two = lambda x: [x * math.exp(-t), x * math.exp(t)]  # noqa: E731
    runs = [
        night_of({"m-n2-ib": three(1800), "m-n2-eth": two(1700), "m-n4-ib": [3000.0],  # one launch: nothing
                  "m-n1-ib": [500.0, 1000.0, 2000.0]},  # one node never crosses the fabric: not counted
                 "2026-11-10T02:00:00+00:00"),
        night_of({"m-n2-ib": three(1750), "big-n2-eth": [40.0]}, "2026-11-11T02:00:00+00:00"),
    ]
    noise = build_baseline(runs)["launch_noise"]
    assert noise["df"] == 2 + 1 + 2
    assert noise["sigma"] == pytest.approx(math.sqrt((2 * s**2 * 2 + 2 * t**2) / 5), rel=1e-9)
    assert noise["nights"] == 2
    prior = baseline_noise(build_baseline(runs))
    assert isinstance(prior, NoisePrior)
    assert prior.sigma == pytest.approx(noise["sigma"], rel=1e-12) and prior.df == 5
    assert "2 nights" in prior.source


def test_launch_noise_recovered_from_noisy_nights():
    """Launches drawn with a known log-normal spread (2%): the learned sigma is close to it."""
    import random

    rng = random.Random(7)
    sigma = 0.02
    runs = [night_of({f"m-n2-{fabric}": [1000 * math.exp(rng.gauss(0, sigma)) for _ in range(4)]
                      for fabric in ("ib", "eth", "roce")}, f"2026-11-{10 + i:02d}T02:00:00+00:00")
            for i in range(20)]
    noise = build_baseline(runs)["launch_noise"]
    assert noise["df"] == 20 * 3 * 3
    assert noise["sigma"] == pytest.approx(sigma, rel=0.15)


def test_launch_noise_through_saved_nights(tmp_path):
    """From --fabric-save files to the baseline file and back: the two-node launches of session_store
    are what the noise is learned from."""
    paths = nights(tmp_path, [1.0, 1.01, 0.99])
    baseline = build_baseline([load_results(p) for p in paths])
    # Scaling a night scales every launch alike: the deviations in log space are the same each night.
    groups = [IB_LAUNCHES, ETH_LAUNCHES]  # llama-wide launched once per fabric; one node: not counted
    ss = sum(sum((math.log(v) - statistics.fmean(math.log(x) for x in g)) ** 2 for v in g) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    assert baseline["launch_noise"]["df"] == 3 * df
    assert baseline["launch_noise"]["sigma"] == pytest.approx(math.sqrt(3 * ss / (3 * df)), rel=1e-9)
    out = tmp_path / "baseline.json"
    save_baseline(out, baseline)
    loaded = load_baseline(out)
    assert loaded["launch_noise"] == baseline["launch_noise"]
    prior = baseline_noise(loaded)
    assert prior.sigma == pytest.approx(max(baseline["launch_noise"]["sigma"], 0.005))
    assert prior.df == 3 * df


def test_no_launch_noise_without_a_configuration_launched_twice(tmp_path):
    runs = [night_of({"m-n2-ib": [1800.0], "m-n2-eth": [1700.0]}),
            night_of({"m-n2-ib": [1810.0]}, "2026-11-11T02:00:00+00:00")]
    baseline = build_baseline(runs)
    assert baseline["launch_noise"] is None
    assert baseline_noise(baseline) is None
    assert baseline_noise(baseline, ["m-n2-ib"]) is None
    out = tmp_path / "baseline.json"
    save_baseline(out, baseline)
    assert baseline_noise(load_baseline(out)) is None


def test_launch_noise_is_learned_per_configuration_too(tmp_path):
    """Each configuration launched twice or more gets its own noise (one node included: a scaling
    gate leans on it); a gate over some configurations pools theirs, weighted by df."""
    s, t = 0.01, 0.04
    runs = [night_of({"m-n2-ib": [1800 * math.exp(-s), 1800 * math.exp(s)],
                      "m-n1-ib": [900 * math.exp(-t), 900, 900 * math.exp(t)], "m-n2-eth": [1700.0]}),
            night_of({"m-n2-ib": [1810 * math.exp(-s), 1810 * math.exp(s)]}, "2026-11-11T02:00:00+00:00")]
    baseline = build_baseline(runs)
    cases = baseline["launch_noise"]["cases"]
    assert set(cases) == {"m-n2-ib", "m-n1-ib"}
    assert cases["m-n2-ib"]["df"] == 2 and cases["m-n2-ib"]["sigma"] == pytest.approx(math.sqrt(2) * s)
    assert cases["m-n1-ib"]["df"] == 2 and cases["m-n1-ib"]["sigma"] == pytest.approx(t)
    out = tmp_path / "baseline.json"
    save_baseline(out, baseline)
    loaded = load_baseline(out)
    both = baseline_noise(loaded, ["m-n2-ib", "m-n1-ib"])
    assert both.df == 4 and both.sigma == pytest.approx(math.sqrt((2 * 2 * s * s + 2 * t * t) / 4))
    assert baseline_noise(loaded, ["m-n2-ib"]).sigma == pytest.approx(math.sqrt(2) * s)
    # A configuration the baseline never repeated: the pooled multi-node noise (m-n2-ib's alone here).
    assert baseline_noise(loaded, ["m-n2-eth"]).sigma == pytest.approx(math.sqrt(2) * s)
    # Only one-node configurations repeated: nothing pooled to fall back on.
    only_one = build_baseline([night_of({"m-n1-ib": [900.0, 950.0], "m-n2-ib": [1800.0]})])
    assert baseline_noise(only_one) is None and baseline_noise(only_one, ["m-n1-ib"]) is not None


def test_learned_noise_is_floored():
    """Launches that agreed exactly (or nearly) must not make the gates over-confident: 0.005 at least."""
    same = build_baseline([night_of({"m-n2-ib": [1800.0, 1800.0, 1800.0]})])
    assert same["launch_noise"]["sigma"] == 0.0 and same["launch_noise"]["df"] == 2
    prior = baseline_noise(same)
    assert prior.sigma == 0.005 and prior.df == 2
    close = build_baseline([night_of({"m-n2-ib": [1800.0 * math.exp(-0.001), 1800.0 * math.exp(0.001)]})])
    assert close["launch_noise"]["sigma"] == pytest.approx(math.sqrt(2) * 0.001, rel=1e-9)
    assert baseline_noise(close).sigma == 0.005
    wide = 0.02
    above = {"launch_noise": {"sigma": wide, "df": 7, "nights": 3}}
    assert baseline_noise(above).sigma == wide and baseline_noise(above).df == 7  # above the floor: as learned
    assert baseline_noise({"launch_noise": {"sigma": 0.9, "df": 3}}).sigma == 0.5  # and capped


def test_a_baseline_without_launch_noise_gives_none(tmp_path):
    """Baselines built before launch noise was learned have no such field; damaged ones no usable one."""
    paths = nights(tmp_path, [1.0, 1.01])
    baseline = build_baseline([load_results(p) for p in paths])
    del baseline["launch_noise"]
    out = tmp_path / "old-baseline.json"
    save_baseline(out, baseline)
    loaded = load_baseline(out)
    assert "launch_noise" not in loaded and baseline_noise(loaded) is None
    assert baseline_for(loaded, "qwen2-tiny-n2-ib") is not None  # the rest still reads
    for damaged in (None, "0.02", {"sigma": 0.02}, {"df": 3}, {"sigma": "x", "df": 3}, {"sigma": 0.02, "df": 0},
                    {"sigma": float("nan"), "df": 3}):
        assert baseline_noise({"launch_noise": damaged}) is None, damaged


def test_stragglers_are_judged_per_configuration_and_read_back_from_junit_and_saved_nights(tmp_path):
    """Each rank's CPU work per step (two launches on the same nodes, judged together) names rank 2 on
    node1; the saved night and the JUnit machine lines give back the same line; a GPU run is not judged."""
    from pytest_fabric.history.junit import add_to_junit, straggler_text
    from pytest_fabric.history.nights import configuration_stragglers
    from pytest_fabric.workload.result import StepSignals

    hosts = ["node0/198.18.0.1", "node0/198.18.0.1", "node1/198.18.0.2", "node1/198.18.0.2"]
    work = [[0.40, 0.41, 0.55, 0.40], [0.41, 0.40, 0.54, 0.42], [0.40, 0.40, 0.56, 0.41], [0.42, 0.40, 0.40, 0.41]]
    ms = [train_measurement("qwen2-tiny", 2, "eth", 1000.0 + i, launch=i, gpus_per_node=2, rank_hosts=hosts,
                            device="cpu", signals=StepSignals(rank_cpu_s=work)) for i in range(2)]
    (line,) = configuration_stragglers(ms)
    assert line.startswith("rank 2 on node1/198.18.0.2 works 3") and "in 6 of 8 steps" in line
    quiet = [train_measurement("qwen2-tiny", 2, "eth", 1000.0, gpus_per_node=2, rank_hosts=hosts, device="cpu",
                               signals=StepSignals(rank_cpu_s=[[0.4, 0.41, 0.4, 0.42]] * 4))]
    assert configuration_stragglers(quiet) == [] and straggler_text(quiet) == "none"
    assert straggler_text([train_measurement("qwen2-tiny", 2, "eth", 1000.0, device="cuda")]) == "n/a"
    # A GPU run with NVML's readings: the node whose GPU slowed down is named.
    gpu = [train_measurement("qwen2-tiny", 2, "eth", 1000.0, gpus_per_node=2, rank_hosts=hosts, device="cuda",
                             signals=StepSignals(rank_sm_clock_mhz=[[1980.0] * 4] * 4,
                                                 rank_throttle_mask=[[0, 0, 0x8, 0]] * 4))]
    assert straggler_text(gpu) == "node1/198.18.0.2: GPU slowed down in 4 of 4 steps (hw_slowdown) on rank 2"

    night = tmp_path / "night.json"
    save_results(night, {f"qwen2-tiny-n2-eth#{i}": {**train_record(Case("qwen2-tiny", 2, "eth"), 1000.0 + i,
                                                                   gpus_per_node=2, rank_hosts=hosts, device="cpu",
                                                                   signals=StepSignals(rank_cpu_s=work)),
                                                    "launch": i} for i in range(2)}, IDENTITY, VERDICTS)
    assert load_results(night).cases["qwen2-tiny-n2-eth"].stragglers == [line]
    path = tmp_path / "j.xml"
    path.write_text(junit_skeleton("test_x[qwen2-tiny-n2-eth]"))
    add_to_junit(path, {"suites/test_x.py::test_x[qwen2-tiny-n2-eth]": text_of(ms)}, suite_properties(ms, {}))
    assert load_results(path).cases["qwen2-tiny-n2-eth"].stragglers == [line]
