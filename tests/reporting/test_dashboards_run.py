"""One real night through every output: the parity suite on the emulated cluster with one launch per
side (a budget that usually leaves the gate inconclusive), then the gate's word and numbers read
from the terminal, JUnit, the saved night, the metrics, the Bencher JSON and the job summary: they
must agree, whatever the gate decided.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from helpers import FAST_LAUNCH, REPO, assert_valid_junit
from lxml import etree

from pytest_fabric.cluster import ClusterUnavailable
from pytest_fabric.cluster.emulated import check_available

try:
    check_available()
    UNAVAILABLE = None
except ClusterUnavailable as exc:
    UNAVAILABLE = str(exc)

pytestmark = [pytest.mark.slow,
              pytest.mark.usefixtures("needs_emulated")]


def test_one_night_says_the_same_in_every_output(pytester, monkeypatch, junit_schema):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families

    (pytester.path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(pytester.path / "tmp"))
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    shutil.copy(REPO / "suites" / "test_parity.py", pytester.path)
    shutil.copy(REPO / "suites" / "workloads.py", pytester.path)
    out = {name: pytester.path / name for name in ("night.xml", "night.json", "metrics.txt", "bench.json")}
    result = pytester.runpytest_subprocess(
        "test_parity.py", "-v", "--nodes", "2", "--repeats", "1", "--max-repeats", "1", *FAST_LAUNCH,
        f"--junitxml={out['night.xml']}", f"--fabric-save={out['night.json']}",
        f"--fabric-metrics={out['metrics.txt']}", f"--fabric-benchmark-json={out['bench.json']}", timeout=400)
    output = result.stdout.str()
    word = re.search(r"test_candidate_keeps_up_with_the_reference\[qwen2-tiny-n2-eth\] (PASSED|FAILED|INCONCLUSIVE)", output)
    assert word, output
    word = {"PASSED": "pass", "FAILED": "fail", "INCONCLUSIVE": "inconclusive"}[word.group(1)]
    # A night whose only gate is inconclusive decided nothing: exit 1, one line why.
    assert result.ret == (0 if word == "pass" else 1)
    if word == "inconclusive":
        assert "fabric: no verdict tonight (exit 1): all 1 gate(s) inconclusive" in output

    assert_valid_junit(junit_schema, out["night.xml"])
    tree = etree.parse(str(out["night.xml"]))
    (case,) = tree.iter("testcase")
    text = case.find("system-out").text
    # Short enough for a dashboard: the verdict line (with, for one launch a side, why it cannot
    # decide), the prediction, the floors and the machine lines.
    assert len(text) < 1100, text
    gate = dict(line.split("=", 1) for line in text.splitlines() if line.startswith("fabric.gate.eth_vs_ib."))
    assert gate["fabric.gate.eth_vs_ib.verdict"] == word
    skipped = case.find("skipped")
    assert (skipped is not None) == (word == "inconclusive")
    if skipped is not None:
        assert skipped.get("message").startswith(f"INCONCLUSIVE: eth/ib = {float(gate['fabric.gate.eth_vs_ib.ratio']):.3f}")
    props = {p.get("name"): p.get("value") for p in tree.iter("property")}
    assert props[f"fabric.outcome.{word}"] == "1" and props["fabric.repeats"] == "1 to 1 launches per side"

    (saved,) = [v for v in json.loads(out["night.json"].read_text())["verdicts"]]
    assert saved["outcome"] == word and saved["gates"][0]["ratio"] == pytest.approx(
        float(gate["fabric.gate.eth_vs_ib.ratio"]), rel=1e-5)

    families = {f.name: f for f in text_string_to_metric_families(out["metrics.txt"].read_text())}
    (ratio,) = families["fabric_gate_ratio"].samples
    assert ratio.value == pytest.approx(float(gate["fabric.gate.eth_vs_ib.ratio"]), rel=1e-5)
    assert {s.labels["fabric"] for s in families["fabric_tokens_per_second"].samples} == {"ib", "eth"}
    outcome = {s.labels["outcome"]: s.value for s in families["fabric_gate_outcome"].samples}
    assert outcome[word] == 1 and sum(outcome.values()) == 1

    bench = json.loads(out["bench.json"].read_text())
    assert bench["gate eth/ib qwen2-tiny n2"]["ratio"]["value"] == pytest.approx(ratio.value, rel=1e-6)
    assert f"| {word.upper()} | eth/ib | qwen2-tiny n2 |" in summary.read_text()

    # One number and one launch count per configuration, in every output: the gate's line (whose
    # ratio is the ratio of the values it shows), the terminal table, JUnit, the saved night, the
    # metrics, the Bencher JSON and the job summary.
    from pytest_fabric.history.night_files import load_results

    line = re.search(r"eth/ib = ([\d.]+), .* over (\d+)\+(\d+) launches.*; eth ([\d.]+) vs ib ([\d.]+) tokens/s",
                     text)  # the gate's verdict line, as its testcase carries it
    assert line, text
    shown = {"eth": float(line.group(4)), "ib": float(line.group(5))}
    assert float(line.group(1)) == pytest.approx(shown["eth"] / shown["ib"], abs=0.0015)
    counts = {"eth": int(line.group(2)), "ib": int(line.group(3))}
    cell = r"([\d.]+)(?: \((\d+)(?:, \d+ disturbed)?\))?"
    row = next(m for r in output.splitlines() if (m := re.match(rf"^\s+2\s+2\s+{cell}\s+{cell}\s", r)))  # n2
    terminal = {"ib": float(row.group(1)), "eth": float(row.group(3))}
    terminal_counts = {"ib": int(row.group(2) or 1), "eth": int(row.group(4) or 1)}
    night = load_results(out["night.json"])
    from_junit = load_results(out["night.xml"])
    metric = {s.labels["fabric"]: s.value for s in families["fabric_tokens_per_second"].samples}
    # Where a round ran again (a launch disturbed as a whole), the gate counted fewer launches than
    # the night measured, and the line names them: the night's outputs still agree with each other.
    rerun = "re-run" in text or "counted although disturbed" in text
    for fabric in ("ib", "eth"):
        cid = f"qwen2-tiny-n2-{fabric}"
        values = [terminal[fabric], night.cases[cid].mean, from_junit.cases[cid].mean,
                  float(props[f"fabric.{cid}.tokens_per_s"]), metric[fabric],
                  bench[cid]["tokens-per-second"]["value"]] + ([] if rerun else [shown[fabric]])
        assert max(values) - min(values) <= 0.1 + 1e-6 * max(values), (fabric, values)
        launch_counts = {terminal_counts[fabric], night.cases[cid].launches,
                         from_junit.cases[cid].launches, int(props[f"fabric.{cid}.launches"])}
        assert launch_counts == {night.cases[cid].launches}, (fabric, launch_counts)
        if not rerun:
            assert counts[fabric] == night.cases[cid].launches
            assert f"| qwen2-tiny | 2 | {fabric} | 2 | {shown[fabric]:.1f} |" in summary.read_text()
