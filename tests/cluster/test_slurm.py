"""The Slurm launcher: its srun command line, then real launches inside a real allocation of a real
Slurm (munge, slurmctld, one slurmd per emulated node namespace: tests/cluster_env.py)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from cluster_env import (RANK_ENV, env_program, failing_program, hanging_program, launch_on_node0, leftover_processes, prefix_records,
                         recording_prefix, session_program, slurm_site, start_on_node0, train_program,
                         two_sessions_take_turns)
from pytest_fabric.cluster.base import ClusterUnavailable
from pytest_fabric.cluster.nodelock import _ephemeral_range
from pytest_fabric.cluster.slurm import _NODE_WRAPPER, SlurmCluster, SlurmNode, cpus_per_node, srun_argv


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


def test_site_options_follow_the_launchers_and_the_prefix_comes_before_the_wrapper() -> None:
    nodes = [SlurmNode("gpu-001", "10.0.0.1"), SlurmNode("gpu-002", "10.0.0.2")]
    pyxis = ["--container-image=nvcr.io#nvidia/pytorch:24.05-py3", "--container-mounts=/lustre:/lustre"]
    prefix = ["apptainer", "exec", "--nv", "/images/pt.sif"]
    argv = srun_argv("4242", nodes, "pytest-fabric-ab12", Path("/shared/run/slurm-plan.json"), extra=pyxis,
                     prefix=prefix)
    wrapper = argv.index(sys.executable)
    assert argv[wrapper - 4:wrapper] == prefix and argv[wrapper - 6:wrapper - 4] == pyxis
    # srun takes the last value of an option: the site's come after every option of the launcher's.
    assert max(argv.index(option) for option in argv[1:wrapper - 6]) < argv.index(pyxis[0])
    assert argv[wrapper:] == [sys.executable, "-c", _NODE_WRAPPER, "/shared/run/slurm-plan.json"]


def test_the_node_wrapper_sets_the_plans_variables_over_what_a_container_left(tmp_path: Path) -> None:
    """The wrapper, run for real as a task would run it: whatever the environment it starts in says
    (an image's LD_LIBRARY_PATH), the node's torchrun gets the plan's values, and its own node's."""
    plan = {name: {"env": {"LD_LIBRARY_PATH": f"/opt/{name}/lib", "PYTEST_FABRIC_NODE": f"{name}/10.0.0.1"},
                   "argv": [sys.executable, "-c", "import os; print(os.environ['LD_LIBRARY_PATH'], "
                                                  "os.environ['PYTEST_FABRIC_NODE'], os.environ['KEPT'])"]}
            for name in ("gpu-001", "gpu-002")}
    plan_path = tmp_path / "slurm-plan.json"
    plan_path.write_text(json.dumps(plan))
    out = subprocess.run([sys.executable, "-c", _NODE_WRAPPER, str(plan_path)], capture_output=True, text=True,
                         check=True, env={"SLURMD_NODENAME": "gpu-002", "LD_LIBRARY_PATH": "/image/lib",
                                          "KEPT": "yes"}).stdout
    assert out.split() == ["/opt/gpu-002/lib", "gpu-002/10.0.0.1", "yes"]


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
def test_srun_args_launch_prefix_and_declared_variables_reach_every_rank(site, tmp_path: Path, monkeypatch) -> None:
    """A site's srun option (--chdir, standing for pyxis's) and a real prefix program (standing for
    apptainer, its image setting LD_LIBRARY_PATH) on every node: each task runs the wrapper under the
    prefix in the directory srun was told, and every rank gets the --rank-env values from the
    harness's environment over the image's; the plan on shared storage holds no secret."""
    monkeypatch.setenv("PF_PLUGIN_PATH", "/opt/x")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/aws-ofi-nccl/lib")
    monkeypatch.setenv("HF_TOKEN", "hf_stays_out_of_the_plan")
    job_id = f"slurmprefix{secrets.token_hex(3)}"
    run_dir = tmp_path / "run"
    workdir = run_dir / "chdir"
    workdir.mkdir(parents=True)
    spec = {**_spec(env_program(run_dir, ["PF_PLUGIN_PATH", "LD_LIBRARY_PATH"]), job_id, 120),
            "srun_args": [f"--chdir={workdir}"], "launch_prefix": [str(recording_prefix(run_dir))],
            "rank_env": ["PF_PLUGIN_PATH", "LD_LIBRARY_PATH"]}
    report = launch_on_node0(site, spec, tmp_path, timeout_s=240, salloc=True)
    assert report["ok"], report.get("describe_outcome") or report
    assert f"; srun --chdir={workdir}; prefix {run_dir / 'container-prefix.sh'}; rank env " in report["describe"]
    records = sorted(prefix_records(run_dir), key=lambda r: r["host"])
    hosts = [node.name for node in site.nodes]
    assert [r["host"] for r in records] == hosts  # the lock steps ran outside it: only the ranks' tasks
    for record in records:
        assert record["cwd"] == str(workdir)
        assert record["args"] == [sys.executable, "-c", _NODE_WRAPPER, str(tmp_path / "slurm-plan.json")]
    ranks = [json.loads((run_dir / f"env-rank{r}.json").read_text()) for r in range(len(hosts))]
    assert sorted(rank["host"] for rank in ranks) == hosts
    for rank in ranks:
        assert rank["env"] == {"PF_PLUGIN_PATH": "/opt/x", "LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib"}
        assert rank["node"].startswith(f"{rank['host']}/")
    assert "hf_stays_out_of_the_plan" not in (tmp_path / "slurm-plan.json").read_text()
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


def test_the_node_whose_task_failed_first_is_named_from_sruns_report(site, tmp_path: Path) -> None:
    """What leaves a sick node out (Measurer._node_failed): srun's own line names the node whose task failed."""
    report = launch_on_node0(site, _spec(failing_program(tmp_path, site.nodes[1].name),
                                         f"slurmfail{secrets.token_hex(3)}", 60), tmp_path, timeout_s=120, salloc=True)
    assert not report["ok"] and report["failed_node"] == site.nodes[1].name, report["describe_outcome"]
