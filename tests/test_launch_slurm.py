"""The Slurm launcher: its srun command line, then real launches inside a real allocation of a real
Slurm (munge, slurmctld, one slurmd per emulated node namespace: tests/cluster_env.py)."""

from __future__ import annotations

import json
import secrets
import sys
from pathlib import Path

import pytest

from cluster_env import (RANK_ENV, hanging_program, launch_on_node0, leftover_processes, session_program, slurm_site,
                         start_on_node0, train_program, two_sessions_take_turns)
from pytest_fabric.cluster.base import ClusterUnavailable
from pytest_fabric.cluster.nodelock import _ephemeral_range
from pytest_fabric.cluster.slurm import SlurmCluster, SlurmNode, cpus_per_node, srun_argv


def test_outside_an_allocation_says_how_to_get_one() -> None:
    with pytest.raises(ClusterUnavailable, match="salloc"):
        SlurmCluster(environ={"PATH": "/usr/bin"})


@pytest.mark.parametrize(("value", "cpus"), [("32(x2)", 32), ("32(x2),16", 16), ("8", 8), ("", None)])
def test_cpus_per_node_is_the_smallest_share(value: str, cpus: int | None) -> None:
    assert cpus_per_node({"SLURM_JOB_CPUS_PER_NODE": value}) == cpus


def test_one_step_one_task_per_node_on_exactly_the_chosen_nodes() -> None:
    nodes = [SlurmNode("gpu-001", "10.0.0.1"), SlurmNode("gpu-002", "10.0.0.2")]
    argv = srun_argv("4242", nodes, "pytest-fabric-ab12", Path("/shared/run/slurm-plan.json"))
    assert argv[0] == "srun"
    for option in ("--jobid=4242", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=gpu-001,gpu-002",
                   "--kill-on-bad-exit=1", "--job-name=pytest-fabric-ab12"):
        assert option in argv
    assert argv[-4:-2] == [sys.executable, "-c"] and argv[-1] == "/shared/run/slurm-plan.json"


@pytest.fixture(scope="module")
def site():
    with slurm_site(nodes=2) as started:
        yield started


def _spec(program: list[str], job_id: str, deadline_s: float) -> dict:
    return {"cluster": "slurm", "nodes": 2, "program": program, "job_id": job_id, "deadline_s": deadline_s,
            "env": RANK_ENV}


@pytest.mark.slow
def test_two_node_measurement_in_an_allocation(site, tmp_path: Path) -> None:
    job_id = f"slurmtrain{secrets.token_hex(3)}"
    report = launch_on_node0(site, _spec(train_program(tmp_path), job_id, 240), tmp_path, timeout_s=400, salloc=True)
    assert report["ok"], report["describe_outcome"]
    assert report["max_nodes"] == 2  # the allocation's size: --nodes defaults to it
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["hosts"] == [f"node0/{site.nodes[0].address}", f"node1/{site.nodes[1].address}"]
    plan = json.loads((tmp_path / "slurm-plan.json").read_text())
    (endpoint,) = [a.partition("=")[2] for a in plan["node1"]["argv"] if a.startswith("--rdzv-endpoint=")]
    host, _, port = endpoint.rpartition(":")
    assert host == site.nodes[0].address  # on the first node, at a port probed free there
    low, high = _ephemeral_range()
    assert not low <= int(port) <= high
    assert report["steps_after"] == []
    assert leftover_processes(job_id) == []


@pytest.mark.slow
def test_hung_launch_is_killed_at_the_deadline_with_its_step(site, tmp_path: Path) -> None:
    job_id = f"slurmhang{secrets.token_hex(3)}"
    run_dir = tmp_path / job_id  # in every rank's command line, so leftovers are easy to find
    report = launch_on_node0(site, _spec(hanging_program(run_dir), job_id, 25), tmp_path, timeout_s=120, salloc=True)
    assert report["timed_out"], report["describe_outcome"]
    started = sorted(p.name for p in run_dir.glob("rank*"))
    assert started == ["rank0", "rank1"], f"ranks never started before the deadline:\n{report['describe_outcome']}"
    assert report["steps_after"] == []
    assert leftover_processes(job_id) == []


@pytest.mark.slow
def test_step_of_a_killed_srun_is_cancelled(site, tmp_path: Path) -> None:
    """srun killed outright cannot cancel its step; the launcher's scancel must, leaving nothing."""
    job_id = f"slurmorphan{secrets.token_hex(3)}"
    report = launch_on_node0(site, {"cluster": "slurm", "orphan_step": True, "job_id": job_id}, tmp_path,
                             timeout_s=120, salloc=True)
    assert len(report["running_before_kill"]) >= 3, report  # srun and a task on each node
    assert report["listed_after_kill"], report  # Slurm still holds the step without its srun ...
    assert report["note"].startswith("cancelled step"), report  # ... so the launcher cancels it
    assert report["listed_after_cancel"] == []
    assert leftover_processes(job_id) == []


@pytest.mark.slow
def test_two_sessions_in_jobs_sharing_the_nodes_take_turns(site, tmp_path: Path) -> None:
    """Two allocations that share both nodes (--oversubscribe), one harness in each: the second
    launch waits for the first, says so, and both jobs complete on their own rendezvous."""
    def start(name: str, gate: Path | None):
        job_id = f"slurmsession{name}{secrets.token_hex(3)}"
        return start_on_node0(site, _spec(session_program(tmp_path / name, gate), job_id, 120), tmp_path / name,
                              salloc=True, salloc_options=["--oversubscribe"])

    two_sessions_take_turns(site, tmp_path, start)
    assert leftover_processes("session_rank.py") == []
    assert leftover_processes("pytest_fabric.cluster.nodelock") == []
