"""The ``pytest-fabric`` command: what each subcommand writes and prints, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from helpers import (ETH_LAUNCHES, IB_LAUNCHES, IDENTITY, REPO, VERDICTS, assert_one_line_error, geomean, junit_text,
                     nights, run, saved, session_store)

from pytest_fabric.core.models import get_model
from pytest_fabric.physics.step_model import JobShape, predict_penalty
from pytest_fabric.history.baselines import load_baseline
from pytest_fabric.history.night_files import load_results


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The commands' output is under test here, not the drawing (test_htmlreport covers the plots)."""
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)


def test_report_writes_the_documents(capsys, tmp_path):
    night = saved(tmp_path)
    code, out, err = run(capsys, "report", str(night), "-o", str(tmp_path / "out"), "--price", "ib=4",
                         "--price", "eth=3")
    assert code == 0, err
    assert f"wrote {tmp_path / 'out' / 'report.md'}" in out and f"wrote {tmp_path / 'out' / 'report.html'}" in out
    assert "matplotlib is not installed" in err  # said once, on stderr, not as a failure
    md = (tmp_path / "out" / "report.md").read_text()
    ib, eth = geomean(IB_LAUNCHES), geomean(ETH_LAUNCHES)  # a configuration's value
    assert re.search(rf"\| 2 \| 2 \| {ib:.1f} \[[\d.]+, [\d.]+\] \| {eth:.1f} \[[\d.]+, [\d.]+\] \| "
                     rf"{(eth / ib - 1) * 100:+.1f}% \|", md)
    assert "| 2 | 2 | 1803.3 [" in md and "ib break-even premium over eth" in md


def test_report_prices_the_night_with_its_saved_prices_unless_given(capsys, tmp_path):

    from pytest_fabric.history.nights import save_results

    night = tmp_path / "night.json"
    save_results(night, session_store(), IDENTITY, VERDICTS, {"ib": 4.0, "eth": 3.0})
    code, _, err = run(capsys, "report", str(night), "-o", str(tmp_path / "out"))
    assert code == 0, err
    md = (tmp_path / "out" / "report.md").read_text()
    assert "ib break-even premium over eth" in md and "eth $3 (saved with the night)" in md
    code, _, err = run(capsys, "report", str(night), "-o", str(tmp_path / "out"), "--price", "eth=2")
    assert code == 0, err
    assert "eth $2, ib $4 (saved with the night)" in (tmp_path / "out" / "report.md").read_text()


def test_report_reads_a_session_store_and_junit_together(capsys, tmp_path):
    store = tmp_path / "measurements.json"
    store.write_text(json.dumps(session_store()))
    junit = tmp_path / "junit.xml"
    junit.write_text(junit_text(session_store()))
    code, _, err = run(capsys, "report", str(store), str(junit), "-o", str(tmp_path / "out"))
    assert code == 0, err
    assert "test_advantage (eth): fail" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.parametrize("price, expected", [
    ("ib", "write FABRIC=USD_PER_GPU_HOUR"),
    ("ib=cheap", "write FABRIC=USD_PER_GPU_HOUR"),
    ("ib=-1", "positive price"),
    ("=3", "write FABRIC=USD_PER_GPU_HOUR"),
])
def test_bad_prices(capsys, tmp_path, price, expected):
    code, _, err = run(capsys, "report", str(saved(tmp_path)), "-o", str(tmp_path / "out"), "--price", price)
    assert_one_line_error(code, err, expected, "pytest-fabric report: error:")
    assert not (tmp_path / "out").exists()


def test_report_on_bad_inputs(capsys, tmp_path):
    truncated = tmp_path / "night.json"
    truncated.write_text('{"format": "pytest-fabric-results", "ver')
    code, _, err = run(capsys, "report", str(truncated), "-o", str(tmp_path / "out"))
    assert_one_line_error(code, err, str(truncated), "invalid JSON")
    code, _, err = run(capsys, "report", str(tmp_path / "absent.json"))
    assert_one_line_error(code, err, "absent.json", "cannot read")
    code, _, err = run(capsys, "report")
    assert_one_line_error(code, err, "the following arguments are required: INPUT")


def test_merge(capsys, tmp_path):
    a, b = tmp_path / "a.xml", tmp_path / "b.xml"
    a.write_text(junit_text(session_store()))
    b.write_text('<testsuite name="other" tests="1"><testcase classname="c" name="t" time="1"/></testsuite>')
    code, out, err = run(capsys, "merge", str(tmp_path / "all.xml"), str(a), str(b))
    assert code == 0, err
    assert "6 testcase(s) from 2 file(s)" in out
    code, _, err = run(capsys, "merge", str(tmp_path / "x.xml"), str(saved(tmp_path)))
    assert_one_line_error(code, err, "night.json", "not readable as JUnit XML")


def test_trend(capsys, tmp_path):
    paths = [str(p) for p in nights(tmp_path, [1.0, 1.1])]
    code, _, err = run(capsys, "trend", *paths, "-o", str(tmp_path / "t"))
    assert code == 0, err
    eth = geomean(ETH_LAUNCHES)
    assert f"| qwen2-tiny-n2-eth | {eth:.1f} | {eth * 1.1:.1f} | +10.0% |" in (tmp_path / "t" / "trend.md").read_text()
    code, _, err = run(capsys, "trend", paths[0])
    assert_one_line_error(code, err, "at least two nights")


def test_baseline(capsys, tmp_path):
    paths = [str(p) for p in nights(tmp_path, [1.0, 1.01, 0.99, 1.005, 0.5])]
    out_path = tmp_path / "baseline.json"
    code, out, err = run(capsys, "baseline", str(out_path), *paths)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("qwen2-tiny-n2-ib:"))
    assert "over 4 night(s)" in line and "dropped as outlier(s): 2026-11-14 02:00" in line
    assert load_baseline(out_path)["cases"]["qwen2-tiny-n2-ib"]["dropped"] == 1
    # The launch noise learned from the nights' repeated two-node launches (qwen2-tiny on ib and on
    # eth, three launches each: 2 x 2 degrees of freedom a night) goes into the file.
    assert load_baseline(out_path)["launch_noise"]["df"] == 5 * 2 * 2
    assert load_results(out_path).kind == "baseline"
    code, _, err = run(capsys, "baseline", str(out_path), str(tmp_path / "nope.json"))
    assert_one_line_error(code, err, "nope.json")


def test_the_reports_launch_time_counts_the_link_tests_launches(capsys, tmp_path):
    path = saved(tmp_path)
    data = json.loads(path.read_text())
    timed = {"startup": 1.0, "imports": 1.0, "program": 1.0, "measured": 2.0, "teardown": 1.0, "harness": 0.0}
    key, record = next((k, r) for k, r in data["records"].items() if k.startswith("collectives-"))
    data["records"] = {key: {**record, "result": {**record["result"], "launch_time": timed}}}
    link = {"case": {"model": "links", "nodes": 2, "fabric": "ib"}, "cluster": "emulated",
            "result": {**record["result"], "launch_time": {**timed, "measured": 0.5}}}
    data["link_records"] = {"links-n2-ib#abc": link}
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "report", str(path), "-o", str(tmp_path / "out"))
    assert code == 0, err
    text = (tmp_path / "out" / "report.md").read_text()
    assert "2 launches, 10.5 s of launch wall time; measuring (steps, timed collectives) 23.8% of it" in text


def test_a_baseline_keeps_its_nights_launch_costs_for_the_plan(capsys, tmp_path):
    paths = nights(tmp_path, [1.0, 1.0])
    for i, path in enumerate(paths):  # launches that recorded their wall time: 10 s the first night, 11 s the next
        data = json.loads(path.read_text())
        for record in data["records"].values():
            if "result" in record:
                record["result"]["launch_s"] = 10.0 + i
        path.write_text(json.dumps(data))
    out_path = tmp_path / "baseline.json"
    code, out, err = run(capsys, "baseline", str(out_path), *map(str, paths))
    assert code == 0, err
    costs = load_baseline(out_path)["launch_costs"]
    launches = len(IB_LAUNCHES)
    assert costs["qwen2-tiny-n2-ib"] == [10.0] * launches + [11.0] * launches
    assert costs["qwen2-tiny-n1-any"] == [10.0, 11.0]  # one launch serves every fabric's one-node case
    assert "launch costs of" in out
    # The plan of a later night reads them (--night-costs, or the --fabric-baseline).
    from types import SimpleNamespace

    from pytest_fabric.running.plan import _history
    session = SimpleNamespace(options=SimpleNamespace(night_costs=str(out_path), baseline_path=None))
    assert _history(session)["qwen2-tiny-n2-eth"] == [10.0] * launches + [11.0] * launches
    session.options.night_costs, session.options.baseline_path = None, str(out_path)
    assert _history(session)["qwen2-tiny-n1-any"] == [10.0, 11.0]


def test_predict_prints_what_predict_computes(capsys):
    code, out, err = run(capsys, "predict", "--model", "llama-3.1-70b", "--nodes", "4", "--gpus-per-node", "8",
                         "--batch", "1", "--seq", "4096", "--fast-gbit", "3200", "--slow-gbit", "200",
                         "--flops-per-gpu", "4e14")
    assert code == 0, err
    p = predict_penalty(JobShape(get_model("llama-3.1-70b"), 4, 8, 1, 4096), flops_per_s=4e14, fast_gbit=3200,
                        slow_gbit=200)
    lines = out.splitlines()
    assert lines[0] == "llama-3.1-70b on 4 node(s) x 8 GPU(s), batch 1 x seq 4096 per GPU, 400 TFLOP/s per GPU"
    assert lines[1].startswith(f"fast fabric (3200 Gbit/s per node): step {p.fast.step_s * 1000:.1f} ms, "
                               f"{p.fast.tokens_per_s:.1f} tokens/s, {p.fast.tokens_per_s_per_gpu:.1f} tokens/s/GPU")
    assert lines[2].startswith(f"slow fabric (200 Gbit/s per node): step {p.slow.step_s * 1000:.1f} ms")
    assert lines[3] == (f"penalty: slow/fast tokens/s = {p.ratio:.3f} ({p.slowdown * 100:.1f}% fewer tokens/s): "
                        f"{p.label}")
    assert p.label == "communication-bound" and lines[4] == p.message


def test_predict_single_node_and_the_models_default_shape(capsys):
    code, out, _ = run(capsys, "predict", "--model", "qwen2.5-7b", "--nodes", "1", "--gpus-per-node", "8",
                       "--fast-gbit", "400", "--slow-gbit", "100", "--flops-per-gpu", "4e14")
    assert code == 0
    assert "batch 2 x seq 2048 per GPU" in out and "single-node" in out


@pytest.mark.parametrize("argv, expected", [
    (["--model", "gpt-9"], "--model 'gpt-9': unknown model; known models: qwen2.5-1.5b"),
    (["--model", "qwen2-tiny", "--nodes", "0"], "--nodes must be at least 1"),
    (["--model", "qwen2-tiny", "--flops-per-gpu", "fast"], "not a number: 'fast'"),
    (["--model", "qwen2-tiny", "--slow-gbit", "0"], "--slow-gbit must be positive"),
    (["--model", "qwen2-tiny", "--nodes", "two"], "invalid int value: 'two'"),
])
def test_predict_bad_input(capsys, argv, expected):
    base = {"--model": "qwen2-tiny", "--nodes": "2", "--fast-gbit": "2", "--slow-gbit": "0.4",
            "--flops-per-gpu": "2e10"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    code, _, err = run(capsys, "predict", *[x for kv in base.items() for x in kv])
    assert_one_line_error(code, err, expected)


def test_unknown_command_and_the_catalogs(capsys):
    code, _, err = run(capsys, "repot")
    assert_one_line_error(code, err, "invalid choice: 'repot'")
    code, out, _ = run(capsys, "models")
    assert code == 0 and "llama-wide" in out
    code, out, _ = run(capsys, "fabrics")
    assert code == 0 and "NCCL_NET=IB" in out


def test_the_installed_command_exits_2_without_a_traceback(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    proc = subprocess.run([sys.executable, "-m", "pytest_fabric.cli", "report", str(bad)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"pytest-fabric report: error: {bad}: the JSON is a list, expected an object with "
                                   "\"format\": \"pytest-fabric-results\" (or a session's measurements.json)")


# -- calibrate -----------------------------------------------------------------------------------

CALIBRATION_FIXTURE = REPO / "fixtures" / "calibration" / "synthetic-night.json"


def test_calibrate_prints_constants_and_the_error_tables(capsys):
    code, out, err = run(capsys, "calibrate", str(CALIBRATION_FIXTURE))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:3] == ["pytest-fabric calibrate: 1 file(s)", "6 configuration(s); link efficiency 0.90 (assumed)",
                         "fit on all: 2e+10 FLOP/s per rank, multi-node overhead 50.0 ms per step; in-sample step "
                         "error RMS 0.0%, max 0.0%"]
    assert "leave-one-out step error: RMS 0.0%, max 0.0% over 6 configuration(s)" in lines
    qwen = next(line for line in lines if line.strip().startswith("qwen2-tiny n2x1  ib vs eth"))
    assert qwen.split()[-1] == "compute-bound"
    assert lines[-1].startswith("penalty error: fit RMS 0.0 points; per step RMS ")


def test_calibrate_pools_files_and_reads_a_session_store(capsys, tmp_path):
    records = json.loads(CALIBRATION_FIXTURE.read_text())["records"]
    store = tmp_path / "measurements.json"
    store.write_text(json.dumps(records))
    code, out, err = run(capsys, "calibrate", str(CALIBRATION_FIXTURE), str(store), "--link-efficiency", "fit")
    assert code == 0, err
    assert "link efficiency 0.90 (fitted)" in out
    # The same launches twice: four per configuration.
    row = next(line for line in out.splitlines() if line.strip().startswith("llama-wide n2x1 ib"))
    assert row.split()[4] == "4"


@pytest.mark.parametrize("args, expected", [
    (["--gbit", "eth"], "--gbit 'eth': write FABRIC=GBIT"),
    (["--gbit", "eth=-1"], "--gbit 'eth=-1': write FABRIC=GBIT"),
    (["--link-efficiency", "1.5"], "--link-efficiency must be in (0, 1] or 'fit', got '1.5'"),
])
def test_calibrate_bad_options(capsys, args, expected):
    code, _, err = run(capsys, "calibrate", str(CALIBRATION_FIXTURE), *args)
    assert_one_line_error(code, err, expected)


def test_calibrate_needs_step_times(capsys, tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text(junit_text(session_store()))
    code, _, err = run(capsys, "calibrate", str(junit))
    assert_one_line_error(code, err, "holds no launch records", "--fabric-save")
