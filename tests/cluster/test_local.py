"""The local cluster: torchrun agents on loopback, the fallback where namespaces cannot be made."""

from __future__ import annotations

import json
import socket

import pytest
from helpers import FAST_LAUNCH, session_directory

from pytest_fabric.cluster import base, local, nodelock


def test_free_port_is_below_the_ephemeral_range_and_bindable():
    low, high = nodelock._ephemeral_range()
    for _ in range(20):
        port = nodelock.free_port()
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_skips_a_port_in_use(monkeypatch):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(nodelock.random, "sample", lambda population, k: [taken, 23456, 23457])
        assert nodelock.free_port() in (23456, 23457)


@pytest.mark.slow
def test_two_local_nodes_train_and_comparisons_are_skipped(pytester, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    pytester.makepyfile(test_generated="""
        import pytest

        @pytest.mark.fabric_matrix(nodes=[2], fabrics=["eth"])
        def test_step(fabric_case, fabric_measure):
            assert fabric_measure(fabric_case).tokens_per_s > 0

        @pytest.mark.fabric_comparison
        @pytest.mark.fabric_matrix(nodes=[2], fabrics=["eth"])
        def test_compare(fabric_case, fabric_compare):
            fabric_compare.within(fabric_case, fabric_case.with_fabric("ib"), rel=0.05)
    """)
    result = pytester.runpytest_subprocess("--cluster", "local", "--nodes", "2", *FAST_LAUNCH, "-rs", timeout=300)
    result.assert_outcomes(passed=1, skipped=1)
    records = json.loads((session_directory(result.stdout.str()) / "measurements.json").read_text())
    (record,) = records.values()
    assert record["result"]["world_size"] == 2 and record["cluster"] == "local"


def test_every_node_joins_the_static_rendezvous_hosted_by_node_0(tmp_path):
    # The nodes are known before the launch: each is given its node rank, and node 0 hosts the store by
    # it (agents that share an address cannot both try), without the dynamic rendezvous's polling.
    from pytest_fabric.cluster.base import LaunchRequest, torchrun_argv
    from pytest_fabric.core.fabrics import get_fabric

    request = LaunchRequest(nodes=3, procs_per_node=1, fabric=get_fabric("eth"), program=["-m", "x"],
                            workdir=tmp_path, deadline_s=60, job_id="j")
    argvs = [torchrun_argv(request, i, "127.0.0.1", "127.0.0.1", rdzv_port=29411) for i in range(3)]
    for i, argv in enumerate(argvs):
        assert "--rdzv-backend=static" in argv and f"--node-rank={i}" in argv
        assert "--rdzv-endpoint=127.0.0.1:29411" in argv and "--nnodes=3" in argv
        assert argv[-2:] == ["-m", "x"]


@pytest.mark.parametrize(("deadline_s", "expected"), [(75, 25), (30, 20), (1800, 60), (150, 50)])
def test_a_node_gives_up_reaching_the_store_well_inside_the_deadline(tmp_path, deadline_s, expected):
    # torch's default (600 s for the static rendezvous) outlives any deadline: the node that could not
    # join would be killed with the others instead of failing on its own.
    from pytest_fabric.cluster.base import LaunchRequest, torchrun_argv
    from pytest_fabric.core.fabrics import get_fabric

    request = LaunchRequest(nodes=2, procs_per_node=1, fabric=get_fabric("eth"), program=["-m", "x"],
                            workdir=tmp_path, deadline_s=deadline_s, job_id="j")
    (conf,) = [a for a in torchrun_argv(request, 1, "h", "h") if a.startswith("--rdzv-conf=")]
    assert conf == f"--rdzv-conf=timeout={expected}"
    # Node 0, which hosts the store, waits for the others until the deadline: the node that cannot
    # reach it fails first, and the report names it from its own log.
    (host,) = [a for a in torchrun_argv(request, 0, "h", "h") if a.startswith("--rdzv-conf=")]
    assert host == f"--rdzv-conf=timeout={max(30, deadline_s)}"


@pytest.mark.parametrize(("cores", "nodes", "per_node", "expected"), [
    (2, 1, 1, ["0"]),  # one node, one GPU: one core, the other left to the harness
    (2, 2, 1, ["0", "1"]),
    (8, 2, 2, ["0,1", "2,3"]),  # a node of two GPUs: two cores
    (8, 1, 4, ["0,1,2,3"]),
    (2, 4, 1, ["0", "1", "0", "1"]),  # more GPUs than cores: nodes share cores evenly
    (4, 2, 4, ["0,1", "2,3"]),
])
def test_each_emulated_gpu_is_one_core_at_every_node_count(monkeypatch, cores, nodes, per_node, expected):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: set(range(cores)))
    pinned = [base.OnThisMachine.pin(i, nodes, ["torchrun"], per_node) for i in range(nodes)]
    assert [argv[:2] for argv in pinned] == [["taskset", "-c"]] * nodes
    assert [argv[2] for argv in pinned] == expected
    assert all(argv[3:] == ["torchrun"] for argv in pinned)
