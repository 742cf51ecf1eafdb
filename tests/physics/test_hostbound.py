"""The GPU step on CPU: the memory prediction, the host-bound rule, one-node launches without a
transport, and the recorded H200 evidence (fixtures/gpu/, recorded on hardware) read back."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from helpers import FakeCluster

from pytest_fabric import Case, LaunchSettings
from pytest_fabric.physics import memory
from pytest_fabric.core.fabrics import FABRICS
from pytest_fabric.physics.hostbound import BUSY_SHARE, MIN_MFU, host_bound
from pytest_fabric.measuring.measure import Measurer
from pytest_fabric.core.models import get_model
from pytest_fabric.measuring.nccl_logs import parse_nccl_logs
from pytest_fabric.measuring.store import ResultStore
from pytest_fabric.workload.result import TrainResult


GPU = Path(__file__).resolve().parents[2] / "fixtures" / "gpu"
QWEN = get_model("qwen2.5-1.5b")


def recorded() -> TrainResult:
    return TrainResult.from_dict(json.loads((GPU / "result-qwen2.5-1.5b-b8-fsdp2-h200.json").read_text()))


# --- Memory before launching -----------------------------------------------------------------------


def test_prediction_is_within_15_percent_of_every_measured_peak():
    """The calibration points (one H200, qwen2.5-1.5b, seq 2048): the errors README states."""
    errors = memory.errors()
    assert set(errors) == set(memory.CALIBRATION)
    assert all(abs(e) < 0.15 for e in errors.values()), errors


def test_prediction_matches_the_recorded_result():
    r = recorded()
    predicted = memory.predict(QWEN, r.batch_size, r.seq_len, r.world_size, r.activation_checkpointing, r.compile)
    assert predicted.total == pytest.approx(r.peak_memory_bytes, rel=0.15)


def test_prediction_moves_the_way_memory_does():
    at = lambda batch=4, ranks=1, ac=False, compiled=False: memory.predict(QWEN, batch, 2048, ranks, ac, compiled).total  # noqa: E731
    assert at(2) < at(4) < at(8)
    assert at(ranks=8) < at(ranks=2) < at(ranks=1)  # state shards over the world
    assert at(8, ac=True) < at(8) and at(8, compiled=True) < at(8)
    # The logits alone: tokens x vocabulary x about 11 bytes, tens of GB at 16k tokens per rank.
    assert 20e9 < memory.predict(QWEN, 8, 2048).logits < 35e9


def test_a_shape_that_cannot_fit_is_refused_in_one_line_naming_the_fix():
    line = memory.refusal(QWEN, 8, 2048, 1, 80 * 2**30, activation_checkpointing=False, compiled=False)
    assert line and "\n" not in line
    assert "--activation-checkpointing" in line and "--batch-size" in line
    assert memory.refusal(QWEN, 2, 2048, 1, 80 * 2**30, False, False) == ""
    assert memory.refusal(QWEN, 8, 2048, 1, None, False, False) == ""  # unknown GPU memory: no check
    # Nothing fits one GPU: more GPUs named.
    assert "more GPUs" in memory.refusal(get_model("llama-3.1-70b"), 1, 2048, 1, 80 * 2**30, True, True)


def test_default_gpu_shape_fits_an_h100_and_grows_with_the_world():
    one = memory.default_gpu_shape(QWEN, 1)
    eight = memory.default_gpu_shape(QWEN, 8)
    assert one[0] < eight[0] and one[1] == eight[1] == QWEN.seq_len
    for ranks, (batch, seq) in ((1, one), (8, eight)):
        assert memory.predict(QWEN, batch, seq, ranks, compiled=True).total <= memory.H100_BYTES
        assert batch * seq >= 8192  # enough tokens per rank to keep the step GPU-bound


def test_the_measurer_refuses_before_launching(tmp_path):
    cluster = FakeCluster()
    settings = LaunchSettings(steps=1, warmup_steps=0, gpu_memory_bytes=80 * 2**30, device="cuda", compile="off",
                              batch_size=16)
    m = Measurer(cluster, settings, ResultStore(tmp_path / "store"), tmp_path / "launches")
    with pytest.raises(Exception, match="does not fit the GPU") as caught:
        m.measure(Case("qwen2.5-1.5b", 1, "eth"))
    assert cluster.requests == [] and "\n" not in str(caught.value)
    # Real models take their GPU default shape at the launch's world size when none is given.
    default = LaunchSettings(compile="on")
    assert default.shape("qwen2.5-1.5b", 1) == memory.default_gpu_shape(QWEN, 1)
    assert default.shape("qwen2-tiny", 8) == (get_model("qwen2-tiny").batch_size, get_model("qwen2-tiny").seq_len)


# --- The host-bound rule -----------------------------------------------------------------------------


def test_the_recorded_gpu_bound_step_is_not_host_bound():
    r = recorded()
    assert r.mfu(r.tokens_per_step / 0.456) > MIN_MFU
    assert host_bound(r) == ""


def test_a_host_bound_step_is_named_with_its_figures():
    r = recorded()
    # The catalog's old default on the same GPU: 2 x 2048, 339 ms per step (measured), NVML 61-78%.
    small = dataclasses.replace(r, batch_size=2, tokens_per_step=4096, step_s=[0.339] * len(r.step_s))
    reason = host_bound(small)
    assert reason.startswith("the step is host-bound") and "MFU" in reason
    busy = dataclasses.replace(r, signals=dataclasses.replace(r.signals, gpu_busy=[0.7] * len(r.step_s)))
    assert "GPU busy 70%" in host_bound(busy)
    fully = dataclasses.replace(r, signals=dataclasses.replace(r.signals, gpu_busy=[1.0] * len(r.step_s)))
    assert host_bound(fully) == "" and BUSY_SHARE < 1


def test_mfu_judges_one_node_launches_only_and_cpu_runs_never():
    r = recorded()
    slow = dataclasses.replace(r, step_s=[3.0] * len(r.step_s))  # MFU ~6%
    assert host_bound(slow)
    across = dataclasses.replace(slow, fabric={**r.fabric, "crosses_fabric": True}, hosts=["a", "b"])
    assert host_bound(across) == ""  # a slow fabric lowers MFU by itself: busy share decides there
    assert host_bound(dataclasses.replace(slow, device="cpu")) == ""


# --- One-node launches select no transport -----------------------------------------------------------


def test_one_node_launches_get_no_transport_selection(tmp_path):
    cluster = FakeCluster()
    m = Measurer(cluster, LaunchSettings(steps=1, warmup_steps=0, batch_size=1, seq_len=8),
                 ResultStore(tmp_path / "store"), tmp_path / "launches")
    one = m.measure(Case("qwen2-tiny", 1, "ib"))
    m.measure(Case("qwen2-tiny", 2, "ib"))
    one_node, two_nodes = cluster.requests
    assert dict(one_node.fabric.nccl_env) == {} and one.result.fabric["nccl_env"] == {}
    assert two_nodes.fabric.nccl_env["NCCL_NET"] == "IB"
    assert FABRICS["ib"].for_launch(True) == FABRICS["ib"]


def test_the_recorded_logs_show_why():
    """On the H200 without an HCA, the ib preset's NCCL_NET=IB failed at init; the socket launch ran."""
    failed = parse_nccl_logs(GPU / "nccl-h200-1rank-ib-requested-no-hca.log")
    socket = parse_nccl_logs(GPU / "nccl-h200-1rank-socket.log")
    assert failed.network is None and failed.warnings and failed.fallback
    assert socket.network == "Socket" and socket.nccl_version.startswith("2.28")
    assert socket.gdr_disabled


# --- benchmarks/gpu_step.py --------------------------------------------------------------------------


@pytest.mark.slow
def test_the_gpu_benchmark_runs_in_smoke_mode(tmp_path):
    """The script as the lead runs it on a GPU (PYTHONPATH=. from the repository root), on CPU with a
    tiny model: every configuration measured or skipped with a reason, the table's columns stable
    (MFU n/a without a GPU peak), both files written."""
    import os
    import subprocess
    import sys

    repo = GPU.parents[1]
    proc = subprocess.run([sys.executable, "benchmarks/gpu_step.py", "--out", str(tmp_path), "--smoke"], cwd=repo,
                          env={**os.environ, "PYTHONPATH": "."}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_step.json").read_text())
    rows = data["rows"]
    assert {r["compile"] for r in rows} == {True, False} and any(r["ac"] for r in rows)
    for row in rows:
        assert row.get("ms_per_step") or row["error"].startswith("skipped"), row
        if row.get("ms_per_step"):
            assert row["tokens_per_s"] == pytest.approx(row["batch"] * row["seq"] / (row["ms_per_step"] / 1000), rel=0.01)
            assert row["mfu"] is None and row["predicted_gib"] >= 0
    compiled = next(r for r in rows if r["compile"] and r.get("detail"))
    assert compiled["detail"]["compile"] is True and compiled["detail"]["optimizer"] == "adamw foreach"
    table = (tmp_path / "gpu_step.md").read_text()
    assert "| config | ms/step | tokens/s | MFU |" in table and "n/a" in table and data["mfu_convention"] in table


def test_a_result_recorded_before_the_head_was_counted_takes_the_catalogs_count():
    """The H200 fixture's flops_per_token left the output head out (8.92 GFLOP/token); MFU, which
    every output labels 'output head counted', takes the catalog's count for the model instead,
    while a result that records today's convention keeps its own figure."""
    import dataclasses
    import json

    from pytest_fabric.core.models import MFU_CONVENTION, get_model
    from pytest_fabric.workload.result import TrainResult

    old = TrainResult.from_dict(json.loads((GPU / "result-qwen2.5-1.5b-b8-fsdp2-h200.json").read_text()))
    assert old.flops_convention is None
    assert old.flops_for_mfu() == get_model("qwen2.5-1.5b").flops_per_token(old.seq_len) > 1.1 * old.flops_per_token
    new = dataclasses.replace(old, flops_convention=MFU_CONVENTION)
    assert new.flops_for_mfu() == new.flops_per_token
    assert old.mfu(1000.0) > new.mfu(1000.0)
