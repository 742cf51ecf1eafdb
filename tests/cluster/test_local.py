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


def test_only_node_0_hosts_the_rendezvous_store(tmp_path):
    # Left to guess, torch lets every agent on 127.0.0.1 try to host it: one of them fails EADDRINUSE.
    from pytest_fabric.cluster.base import LaunchRequest, torchrun_argv
    from pytest_fabric.core.fabrics import get_fabric

    request = LaunchRequest(nodes=3, procs_per_node=1, fabric=get_fabric("eth"), program=["-m", "x"],
                            workdir=tmp_path, deadline_s=60, job_id="j")
    confs = [next(a for a in torchrun_argv(request, i, "127.0.0.1", "127.0.0.1") if a.startswith("--rdzv-conf="))
             for i in range(3)]
    assert confs[0].endswith(",is_host=true")
    assert confs[1].endswith(",is_host=false") and confs[2].endswith(",is_host=false")


@pytest.mark.parametrize(("deadline_s", "expected"), [(75, 25), (30, 20), (1800, 60), (150, 50)])
def test_a_node_gives_up_reaching_the_store_well_inside_the_deadline(tmp_path, deadline_s, expected):
    # torch's default (60 s, plus its retry backoff) outlived a 75 s deadline: the node that could not
    # join was killed with the others instead of failing on its own.
    from pytest_fabric.cluster.base import LaunchRequest, torchrun_argv
    from pytest_fabric.core.fabrics import get_fabric

    request = LaunchRequest(nodes=2, procs_per_node=1, fabric=get_fabric("eth"), program=["-m", "x"],
                            workdir=tmp_path, deadline_s=deadline_s, job_id="j")
    (conf,) = [a for a in torchrun_argv(request, 1, "h", "h") if a.startswith("--rdzv-conf=")]
    assert f"read_timeout={expected}," in conf


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
