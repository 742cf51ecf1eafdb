"""The measurer proves the transport of GPU runs from NCCL's logs.

No GPU or HCA exists here, so the launch is a stand-in cluster that does what a real GPU launch
leaves behind: per-rank NCCL log files (recorded-format samples from fixtures/nccl) in the
directory NCCL_DEBUG_FILE names, and a result.json with device "cuda". Everything after the launch
(parsing, checking, recording, caching) is the real code.
"""

import json
import shutil
from pathlib import Path

import pytest

from pytest_fabric.cluster.base import Cluster
from pytest_fabric.cluster.supervisor import LaunchOutcome
from pytest_fabric.core.case import Case
from pytest_fabric.measuring.measure import Measurer, LaunchSettings
from pytest_fabric.measuring.store import ResultStore
from pytest_fabric.measuring.nic_inventory import NicInventory
from pytest_fabric.workload.result import TrainResult, write_result

NCCL = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"


class RecordedGpuCluster(Cluster):
    name = "recorded-gpu"
    realizes_fabrics = True
    checks_here = False  # no local pre-flight: there is no GPU here, and the measurer is given no node

    def __init__(self, sample: str) -> None:
        self.sample = sample
        self.subsystems: list[str] = []

    def max_nodes(self) -> int:
        return 8

    def launch(self, request, on_tick=None):
        log_dir = Path(request.env["NCCL_DEBUG_FILE"]).parent
        self.subsystems.append(request.env["NCCL_DEBUG_SUBSYS"])
        for f in (NCCL / self.sample).glob("nccl.*"):
            shutil.copy(f, log_dir / f.name)
        config = json.loads((request.workdir / "config.json").read_text())
        write_result(TrainResult(
            model="qwen2-tiny", world_size=16, hosts=["a", "b"], local_world_size=8, batch_size=1, seq_len=64,
            tokens_per_step=1000, step_s=[1.0, 1.0], device="cuda", dtype="bfloat16", fabric=config["fabric"]),
            config["result_path"])
        return LaunchOutcome(procs=[], elapsed_s=0.1)


def measure(tmp_path, sample, fabric, **settings):
    measurer = Measurer(RecordedGpuCluster(sample), LaunchSettings(**settings), ResultStore(tmp_path / "store"),
                        tmp_path / "runs")
    return measurer.measure(Case("qwen2-tiny", 2, fabric))


def test_socket_fallback_is_named_with_its_evidence(tmp_path):
    m = measure(tmp_path, "socket_fallback", "ib")
    assert m.result.transport["network"] == "Socket"
    problem = m.result.transport_problem
    assert problem.startswith("requested ib; NCCL used Socket") and "Failed to initialize NET plugin IB" in problem
    # The proof is part of the cached record: a test reusing the launch sees the same problem.
    assert measure(tmp_path, "ib", "ib").result.transport_problem == problem


@pytest.mark.parametrize(("sample", "fabric"), [("ib", "ib"), ("roce", "roce"), ("eth", "eth"), ("efa", "efa")])
def test_the_requested_transport_passes(tmp_path, sample, fabric):
    m = measure(tmp_path, sample, fabric)
    assert m.result.transport_problem is None
    assert m.result.transport["network"] in ("IB", "Socket", "Libfabric")


def test_roce_is_not_ib(tmp_path):
    assert "RoCE" in measure(tmp_path, "roce", "ib").result.transport_problem


def test_gdr_is_required_unless_accepted(tmp_path):
    assert "GPUDirect RDMA is off" in measure(tmp_path / "a", "gdr_off", "ib").result.transport_problem
    assert measure(tmp_path / "b", "gdr_off", "ib", require_gdr=False).result.transport_problem is None


def test_declared_inventory_reaches_the_proof_and_asks_nccl_for_speeds(tmp_path):
    cluster = RecordedGpuCluster("ib_missing_port")
    settings = LaunchSettings(inventory={"ib": NicInventory(nics=8, gbit_per_nic=400)})
    measurer = Measurer(cluster, settings, ResultStore(tmp_path / "store"), tmp_path / "runs")
    m = measurer.measure(Case("qwen2-tiny", 2, "ib"))
    assert "NCCL used 1 HCA port(s) on gpu-g01, the node has 8" in m.result.transport_problem
    assert cluster.subsystems == ["INIT,BOOTSTRAP,ENV,NET,GRAPH"]
    # Without a known speed NCCL is not asked for its GRAPH dump.
    plain = RecordedGpuCluster("ib")
    m = Measurer(plain, LaunchSettings(), ResultStore(tmp_path / "s2"), tmp_path / "r2").measure(Case("qwen2-tiny", 2, "ib"))
    assert m.result.transport_problem is None and plain.subsystems == ["INIT,BOOTSTRAP,ENV,NET"]
