"""Saved nights: the JSON round trip, reading the plugin's JUnit, rejecting what is not ours, baselines.

Store records are built here in the shape the rank programs write them (no launches); the JUnit
text comes from ``report.testcase_text``, the function the plugin writes system-out with, so the
reader is tested against the writer rather than against a copy of its format.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from pytest_fabric import Case, Measurement
from pytest_fabric.measure import BandwidthMeasurement
from pytest_fabric.report import testcase_text as text_of
from pytest_fabric.results import (
    BASELINE_FORMAT,
    RESULTS_FORMAT,
    ResultsError,
    baseline_for,
    build_baseline,
    identity_mismatch,
    load_baseline,
    load_results,
    save_baseline,
    save_results,
)

VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.23.0", "backend": "gloo",
            "nccl": None, "cuda": None}


def training_record(model: str, nodes: int, fabric: str, tokens_per_s: float, gpus_per_node: int = 1,
                    versions: dict | None = None) -> dict:
    """A training record as Measurer._run stores it, whose steady step time gives ``tokens_per_s``."""
    world = nodes * gpus_per_node
    tokens_per_step = 64 * world
    step = tokens_per_step / tokens_per_s
    return {
        "case": {"model": model, "nodes": nodes, "fabric": fabric},
        "cluster": "emulated",
        "result": {
            "model": model, "world_size": world, "local_world_size": gpus_per_node,
            "nodes": [f"node{i}/198.18.0.{i + 1}" for i in range(nodes)],
            "batch_size": 1, "seq_len": 64,
            "tokens_per_step": tokens_per_step, "step_s": [step] * 4, "median_step_s": step,
            "tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": tokens_per_s / world,
            "device": "cpu", "dtype": "float32", "attention": "sdpa",
            "versions": dict(versions or VERSIONS),
            "fabric": {"name": fabric, "emulated_mbit": {"ib": 2000, "eth": 400}.get(fabric, 1000),
                       "nccl_env": {}, "crosses_fabric": nodes > 1},
            "cluster": "emulated (network namespaces on this machine, links shaped with tc tbf)",
            "host": "vm", "launch_s": 12.0,
        },
    }


def bandwidth_record(nodes: int, fabric: str, gbit: float) -> dict:
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size, scale in ((1 << 20, 0.5), (16 << 20, 1.0)):
            busbw = gbit / 8 * scale
            rows.append({"op": op, "bytes": size, "time_s": size / (busbw * 1e9), "algbw_GBps": busbw,
                         "busbw_GBps": busbw})
    return {
        "case": {"model": "collectives", "nodes": nodes, "fabric": fabric},
        "cluster": "emulated",
        "result": {"rows": rows, "world_size": nodes, "local_world_size": 1, "device": "cpu",
                   "versions": {"torch": "2.13.0+cpu", "backend": "gloo"},
                   "fabric": {"name": fabric, "emulated_mbit": {"ib": 2000, "eth": 400}[fabric],
                              "nccl_env": {}, "crosses_fabric": True}},
    }


def session_store(scale: float = 1.0, versions: dict | None = None) -> dict:
    """A two-fabric, two-model session: repeated launches on two nodes, a shared single-node launch,
    collective bandwidth and one failed launch."""
    store = {"qwen2-tiny-n1-any#aaaa": training_record("qwen2-tiny", 1, "ib", 1000 * scale, versions=versions)}
    for i, (ib, eth) in enumerate([(1800, 1700), (1820, 1690), (1790, 1710)]):
        suffix = f"@{i}" if i else ""
        store[f"qwen2-tiny-n2-ib#bbbb{suffix}"] = training_record("qwen2-tiny", 2, "ib", ib * scale, versions=versions)
        store[f"qwen2-tiny-n2-eth#cccc{suffix}"] = training_record("qwen2-tiny", 2, "eth", eth * scale,
                                                                   versions=versions)
    store["llama-wide-n2-ib#dddd"] = training_record("llama-wide", 2, "ib", 230 * scale, versions=versions)
    store["llama-wide-n2-eth#eeee"] = training_record("llama-wide", 2, "eth", 43 * scale, versions=versions)
    store["collectives-n2-ib#ffff"] = bandwidth_record(2, "ib", 1.8)
    store["collectives-n2-eth#gggg"] = bandwidth_record(2, "eth", 0.36)
    store["llama-wide-n1-any#hhhh"] = {"case": {"model": "llama-wide", "nodes": 1, "fabric": "ib"},
                                       "error": "llama-wide-n1-ib on the emulated cluster: rank 0 exited 1\nTraceback"}
    return store


IDENTITY = {"cluster_kind": "emulated", "nodes": 2, "gpus_per_node": 1, "fabrics": ["ib", "eth"]}
VERDICTS = [{"test": "suites/test_parity.py::test_parity[qwen2-tiny-n2-eth]", "outcome": "passed",
             "message": "pass: eth/ib = 0.941 ..."}]


def saved(tmp_path: Path, name: str = "night.json", **kw) -> Path:
    path = tmp_path / name
    save_results(path, session_store(**kw), IDENTITY, VERDICTS)
    return path


# -- save and load -----------------------------------------------------------------------------

def test_round_trip_keeps_every_launch_bandwidth_verdicts_and_identity(tmp_path):
    path = saved(tmp_path)
    data = json.loads(path.read_text())
    assert data["format"] == RESULTS_FORMAT and data["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["night.json"]  # the temporary file is gone

    run = load_results(path)
    assert run.kind == "results" and run.source == path
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx([1800, 1820, 1790])  # launch order
    assert run.measurements["qwen2-tiny-n2-eth"] == pytest.approx([1700, 1690, 1710])
    eth = run.cases["qwen2-tiny-n2-eth"]
    assert (eth.model, eth.nodes, eth.fabric, eth.gpus) == ("qwen2-tiny", 2, "eth", 2)
    assert eth.mean == pytest.approx(1700) and eth.mean_per_gpu == pytest.approx(850)
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
    store = {f"m-n2-ib#h@{i}" if i else "m-n2-ib#h": training_record("m", 2, "ib", 100 + i) for i in range(12)}
    path = tmp_path / "n.json"
    save_results(path, store, {}, [])
    assert load_results(path).measurements["m-n2-ib"] == pytest.approx([100 + i for i in range(12)])


def test_a_session_store_loads_as_it_is(tmp_path):
    path = tmp_path / "measurements.json"
    path.write_text(json.dumps(session_store()))
    run = load_results(path)
    assert run.kind == "store"
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx([1800, 1820, 1790])
    assert set(run.fabrics()) == {"ib", "eth"}
    assert run.measurements["qwen2-tiny-n1-eth"] == pytest.approx([1000])
    assert run.identity["cluster_kind"] == "emulated"
    assert run.label == tmp_path.name  # a session directory is named after its start time


# -- JUnit as the plugin writes it ---------------------------------------------------------------

def junit_text(store: dict, failing: str | None = None) -> str:
    """JUnit XML whose testcases carry system-out exactly as the plugin writes it."""
    from xml.sax.saxutils import escape, quoteattr

    def measured(key: str, fabric: str | None = None) -> Measurement:
        case = Case(**store[key]["case"])
        return Measurement.from_record(case.with_fabric(fabric or case.fabric), store[key])

    parity = [measured(k) for k in ("qwen2-tiny-n2-ib#bbbb", "qwen2-tiny-n2-ib#bbbb@1", "qwen2-tiny-n2-ib#bbbb@2",
                                    "qwen2-tiny-n2-eth#cccc", "qwen2-tiny-n2-eth#cccc@1", "qwen2-tiny-n2-eth#cccc@2")]
    cases = [
        ("test_parity[qwen2-tiny-n2-eth]", text_of(parity, ["pass: eth/ib = 0.941, 95% CI [0.93, 0.95]"]), None),
        ("test_single[qwen2-tiny-n1-eth]", text_of([measured("qwen2-tiny-n1-any#aaaa", "eth")]), None),
        ("test_advantage[llama-wide-n2-eth]",
         text_of([measured("llama-wide-n2-ib#dddd"), measured("llama-wide-n2-eth#eeee")]),
         "interval wholly below the threshold: ib/eth = 5.3"),
        ("test_busbw[collectives-n2-eth]",
         text_of([BandwidthMeasurement.from_record(store["collectives-n2-eth#gggg"])]), None),
        ("test_unrelated", "", None),
    ]
    body = []
    for name, out, failure in cases:
        fail = f"<failure message={quoteattr(failure)}>details</failure>" if failure else ""
        sysout = f"<system-out>{escape(out)}</system-out>" if out else ""
        body.append(f'<testcase classname="suites.test_x" name={quoteattr(name)} time="1.5">{fail}{sysout}</testcase>')
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" errors="0" failures="1" skipped="0" tests="5" time="7.5" '
        'timestamp="2026-11-22T23:05:39.123456+00:00" hostname="vm"><properties>'
        '<property name="fabric.cluster" value="emulated (network namespaces on this machine)"/>'
        '<property name="fabric.fabrics" value="ib,eth"/>'
        '<property name="fabric.version.torch" value="2.13.0+cpu"/>'
        '<property name="fabric.attention" value="sdpa"/></properties>'
        + "".join(body) + "</testsuite></testsuites>")


def test_junit_metrics_launches_verdicts_and_identity(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(junit_text(session_store()))
    run = load_results(path)
    assert run.kind == "junit"
    # A configuration measured several times: every launch, from its "mean ... over N launches" line.
    assert run.measurements["qwen2-tiny-n2-ib"] == pytest.approx([1800, 1820, 1790], abs=0.05)
    assert run.measurements["qwen2-tiny-n2-eth"] == pytest.approx([1700, 1690, 1710], abs=0.05)
    assert run.measurements["llama-wide-n2-eth"] == pytest.approx([43], abs=1e-3)
    assert run.measurements["qwen2-tiny-n1-eth"] == pytest.approx([1000], abs=1e-3)
    assert run.cases["llama-wide-n2-eth"].gpus == 2
    assert run.cases["llama-wide-n2-eth"].tokens_per_s_per_gpu == pytest.approx([21.5], abs=1e-3)
    link = run.bandwidth["collectives-n2-eth"]
    assert link.busbw_gbit == pytest.approx({"all_gather": 0.36, "all_reduce": 0.36})
    assert link.payload_bytes == 16 << 20 and link.link_gbit == pytest.approx(0.4)
    outcomes = {v["test"].split("::")[-1]: v for v in run.verdicts}
    assert "test_unrelated" not in outcomes  # nothing measured: not a fabric verdict
    assert outcomes["test_parity[qwen2-tiny-n2-eth]"]["outcome"] == "passed"
    assert outcomes["test_parity[qwen2-tiny-n2-eth]"]["message"].startswith("pass: eth/ib = 0.941")
    failed = outcomes["test_advantage[llama-wide-n2-eth]"]
    assert failed["outcome"] == "failed" and "wholly below" in failed["message"]
    assert (failed["model"], failed["nodes"], failed["fabric"]) == ("llama-wide", 2, "eth")
    ident = run.identity
    assert ident["fabrics"] == ["ib", "eth"] and ident["versions"] == {"torch": "2.13.0+cpu"}
    assert ident["cluster_kind"] == "emulated" and ident["nodes"] == 2 and ident["device"] == "cpu"
    assert ident["hosts"] == ["node0/198.18.0.1", "node1/198.18.0.2"]
    assert run.label == "2026-11-22 23:05"


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
    "newer.json": (saved_json(version=99), "newer pytest-fabric"),
    "case.json": (saved_json(one_case(nodes="two")), "\"nodes\" must be int"),
    "values.json": (saved_json(one_case(tokens_per_s=[])), "non-empty list of positive numbers"),
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

def nights(tmp_path: Path, scales: list[float], versions: list[dict] | None = None) -> list[Path]:
    paths = []
    for i, scale in enumerate(scales):
        path = tmp_path / f"night{i}.json"
        save_results(path, session_store(scale, versions[i] if versions else None),
                     {**IDENTITY, "created": f"2026-11-{10 + i:02d}T02:00:00+00:00"}, [])
        paths.append(path)
    return paths


def test_baseline_drops_an_outlier_night(tmp_path):
    paths = nights(tmp_path, [1.0, 1.01, 0.99, 1.005, 0.5])
    baseline = build_baseline([load_results(p) for p in paths])
    c = baseline["cases"]["qwen2-tiny-n2-ib"]
    assert c["kept"] == 4 and c["dropped"] == 1
    assert c["center"] == pytest.approx(1803.333 * 1.0025, rel=1e-3)
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
