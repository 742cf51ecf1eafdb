"""Every node checked before the first launch (measuring/nodes.py), bad nodes left out, and the
nightly sbatch recipe (examples/slurm/nightly.sbatch) run for real under the test Slurm.

The real runs use emulated nodes with private /tmp and host names (cluster/emulated.py): a node
sees the shared storage (the tests' temporary root) and its own files only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from lxml import etree

from cluster_env import netns_exec, slurm_site
from helpers import REPO
from pytest_fabric.cluster.base import ClusterUnavailable
from pytest_fabric.cluster.slurm import gpus_per_node
from pytest_fabric.cluster.ssh import SshCluster
from pytest_fabric.measuring.nodes import NodeCheck, _same_host, _same_software, left_out, socket_problems, table
from pytest_fabric.measuring.preflight import NodeFacts

RECIPE = REPO / "examples" / "slurm" / "nightly.sbatch"


@pytest.mark.parametrize(("environ", "gpus"), [
    ({"SLURM_GPUS_ON_NODE": "8"}, 8),
    ({"SLURM_GPUS_PER_NODE": "h100:4"}, 4),
    ({"SLURM_GPUS_PER_NODE": "2"}, 2),
    ({"SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}, 8),
    ({}, None),
])
def test_gpus_per_node_come_from_the_allocation(environ: dict[str, str], gpus: int | None) -> None:
    assert gpus_per_node(environ) == gpus


def test_a_hostfile_whose_hosts_all_give_slots_gives_gpus_per_node(tmp_path: Path) -> None:
    even, uneven = tmp_path / "even", tmp_path / "uneven"
    even.write_text("gpu-001 slots=8\ngpu-002 slots=8\n")
    uneven.write_text("gpu-001 slots=8\ngpu-002\n")
    assert SshCluster(even).gpus_per_node() == 8
    assert SshCluster(uneven).gpus_per_node() is None


def test_launches_take_the_first_healthy_nodes_and_say_which_were_left_out_when_too_few(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("gpu-001\ngpu-002\ngpu-003\n")
    cluster = SshCluster(hostfile)
    cluster.left_out["gpu-002"] = "link down: ib0"
    assert [h.address for h in cluster.usable(cluster.hosts, lambda h: h.address, 2)] == ["gpu-001", "gpu-003"]
    with pytest.raises(ClusterUnavailable) as refused:
        cluster.usable(cluster.hosts, lambda h: h.address, 3)
    assert "needs 3 nodes" in str(refused.value) and "2 healthy of 3" in str(refused.value)
    assert "gpu-002: link down: ib0" in str(refused.value)


def _facts(operstate: dict[str, str], env: dict[str, str] | None = None) -> NodeFacts:
    return NodeFacts("n", interfaces={"lo": 772, **{name: 1 for name in operstate}}, env=env or {},
                     operstate={"lo": "unknown", **operstate})


def test_the_link_the_sockets_use_must_be_up() -> None:
    # The named interface is down: the node cannot carry the fabric, whatever else is up.
    assert "fab0" in socket_problems(_facts({"fab0": "down", "mgmt0": "up"}, {"GLOO_SOCKET_IFNAME": "fab0"}))[0]
    assert socket_problems(_facts({"fab0": "up", "mgmt0": "up"}, {"GLOO_SOCKET_IFNAME": "fab0"})) == []
    # NCCL's spec syntax: a prefix list, '^' to exclude.
    assert socket_problems(_facts({"eth0": "down", "eth1": "up"}, {"NCCL_SOCKET_IFNAME": "eth"})) == []
    assert "matches no interface" in socket_problems(_facts({"eth0": "up"}, {"NCCL_SOCKET_IFNAME": "=ib0"}))[0]
    # Nothing named: a node with no interface but loopback up has no link at all.
    assert "link down" in socket_problems(_facts({"eth0": "down"}))[0]
    assert socket_problems(_facts({"eth0": "down", "eth1": "up"})) == []


def test_a_node_without_the_ranks_packages_or_with_other_versions_is_left_out() -> None:
    checks = [NodeCheck(f"gpu-00{i}") for i in range(4)]
    software = [{"torch": "2.6.0", "transformers": "4.48.0"}, {"torch": "2.6.0", "transformers": "4.48.0"},
                {"torch": "2.5.1", "transformers": "4.48.0"},
                {"torch": "cannot import: ImportError: libcudart.so.12", "transformers": "4.48.0"}]
    _same_software(checks, {c.name: {"software": s} for c, s in zip(checks, software, strict=True)})
    assert [c.problems for c in checks[:2]] == [[], []]
    assert checks[2].problems == ["torch 2.5.1 where the other nodes have 2.6.0"]
    assert checks[3].problems == ["torch: cannot import: ImportError: libcudart.so.12"]


def test_two_names_for_one_host_are_left_out_and_the_table_says_why() -> None:
    checks = [NodeCheck("gpu-001", hostname="a"), NodeCheck("10.0.0.1", hostname="a"), NodeCheck("gpu-002",
                                                                                                   hostname="b")]
    _same_host(checks)
    assert [c.ok for c in checks] == [True, False, True]
    assert left_out(checks) == {"10.0.0.1": checks[1].problems[0]} and "gpu-001" in checks[1].problems[0]
    lines = table(checks)
    assert lines[0].split()[:2] == ["node", "host"] and "LEFT OUT" in lines[2] and lines[3].endswith("ok")


@pytest.mark.usefixtures("needs_emulated")
def test_a_run_directory_on_a_node_private_path_is_refused_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_launches(fabric_case, fabric_measure):\n    fabric_measure(fabric_case)\n")
    private = f"/tmp/pytest-fabric-private-{uuid.uuid4().hex[:8]}"
    result = pytester.runpytest_subprocess("--nodes", "2", "--run-dir", private, "--models", "qwen2-tiny",
                                           "--fabrics", "eth")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    refusal = [line for line in result.stderr.lines + result.stdout.lines if "--run-dir" in line]
    assert len(refusal) == 1, result.stderr.str()
    assert private in refusal[0] and "node0" in refusal[0] and "node1" in refusal[0]
    assert not any("Traceback" in line for line in result.stderr.lines)


@pytest.fixture(scope="module")
def site():
    # A management link beside each node's fabric link, as real clusters have: fab0 can go down
    # while Slurm still reaches the node.
    with slurm_site(3, management=True) as started:
        yield started


# The ranks' fabric is fab0 (NCCL_SOCKET_IFNAME on GPUs); one compute thread each on 2 cores.
FABRIC_ENV = {"GLOO_SOCKET_IFNAME": "fab0", "OMP_NUM_THREADS": "1"}
QUICK = ["--steps", "2", "--warmup-steps", "1", "--measure-seconds", "0", "--launch-timeout", "120",
         "-p", "no:cacheprovider"]


@contextmanager
def killing_ranks_on(node, interval_s: float = 0.2):
    """A fault planted on ``node``, as an OOM killer or a GPU falling off the bus would: every rank
    program that starts in its namespaces is killed at once (processes of other nodes are left alone:
    ``ip netns pids`` lists only the node's)."""
    stop = threading.Event()

    def kill() -> None:
        while not stop.wait(interval_s):
            pids = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    if b"pytest_fabric.workload.train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        yield
    finally:
        stop.set()
        killer.join()


def test_a_node_whose_launches_keep_failing_is_left_out_and_the_rest_go_on(site, tmp_path):
    """node1 passes the node check, but every rank started there dies: the first two 2-node launches
    fail first on node1 (srun names it), so node1 is left out and the later launches run on node0
    and node2."""
    env = {**os.environ, **site.env, **FABRIC_ENV}
    junit = tmp_path / "fabric.xml"
    with killing_ranks_on(site.nodes[1]):
        run = subprocess.run(netns_exec(site.nodes[0], [
            "salloc", "--nodes=3", "--immediate=60", sys.executable, "-m", "pytest",
            str(REPO / "suites" / "test_throughput.py"), "-k", "tiny-n2 or wide-n2", "--models", "qwen2-tiny,llama-wide",
            "--fabrics", "ib,eth", "--run-dir", str(tmp_path / "runs"), "--junitxml", str(junit), *QUICK]),
            env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    out = run.stdout + run.stderr
    tree = etree.parse(str(junit))
    failed = tree.xpath("//testcase[failure or error]/@name")
    passed = tree.xpath("//testcase[not(failure) and not(error) and not(skipped)]/@name")
    assert len(failed) == 2 and len(passed) == 2, out[-4000:]
    assert "node node1 left out: launches failed first on it 2 times" in out, out[-4000:]
    plans = [sorted(json.loads(p.read_text())) for p in (tmp_path / "runs").glob("*/launches/*/slurm-plan.json")]
    assert sorted(plans) == [["node0", "node1"]] * 2 + [["node0", "node2"]] * 2
    left = tree.xpath("//property[@name='fabric.nodes_left_out']/@value")
    assert left and "node1: launches failed first on it 2 times" in left[0]


def test_sbatch_recipe_runs_two_ranks_per_node_and_leaves_out_the_node_whose_link_is_down(site, tmp_path):
    shared = tmp_path / "shared"  # the cluster's shared filesystem: the tests' temporary root is
    bad = site.nodes[1]
    subprocess.run(["ip", "-n", bad.netns, "link", "set", "fab0", "down"], check=True)  # the planted fault
    try:
        _run_the_recipe(site, bad, shared)
    finally:
        subprocess.run(["ip", "-n", bad.netns, "link", "set", "fab0", "up"], check=True)


def _run_the_recipe(site, bad, shared: Path) -> None:
    env = {**os.environ, **site.env, "FABRIC_SHARED": str(shared), "FABRIC_PYTHON": sys.executable,
           "FABRIC_PYTEST_ARGS": "suites/test_throughput.py -k qwen2-tiny-n2-eth --nodes 2 --gpus-per-node 2 "
                                 "--steps 2 --warmup-steps 1 --measure-seconds 0 --launch-timeout 240 "
                                 "-p no:cacheprovider", **FABRIC_ENV}
    out = shared / "job.out"
    shared.mkdir()
    # The recipe asks for 8 GPUs per node; these nodes have none, so the command line says 0 (sbatch's
    # options override the script's #SBATCH lines).
    job = subprocess.run(netns_exec(site.nodes[0], [
        "sbatch", "--wait", "--nodes=3", "--gpus-per-node=0", f"--chdir={REPO}", f"--output={out}", str(RECIPE)]),
        env=env, capture_output=True, text=True, timeout=500)
    log = out.read_text() if out.exists() else ""
    assert job.returncode == 0, f"{job.stdout}\n{job.stderr}\n{log[-4000:]}"
    # The node table, before the first launch: node1 left out for its link, the others fine.
    rows = {line.split()[1]: line for line in log.splitlines() if line.startswith("[fabric] node")}
    assert "LEFT OUT" in rows[bad.name] and "fab0" in rows[bad.name], log
    assert rows["node0"].endswith("ok") and rows["node2"].endswith("ok"), log
    assert f"node {bad.name} left out" in log  # the summary says it again
    # The launch ran on the two healthy nodes, two ranks each.
    (plan,) = shared.glob("runs/*/launches/*/slurm-plan.json")
    assert sorted(json.loads(plan.read_text())) == ["node0", "node2"]
    assert {"--nproc-per-node=2"} <= set(next(iter(json.loads(plan.read_text()).values()))["argv"])
    (junit,) = shared.glob("junit/fabric-*.xml")
    tree = etree.parse(str(junit))
    assert tree.xpath("count(//testcase)") == 1 and not tree.xpath("//failure|//error")
    left = tree.xpath("//property[@name='fabric.nodes_left_out']/@value")
    assert left and bad.name in left[0] and "fab0" in left[0]
    (night,) = shared.glob("nights/fabric-*.json")
    assert bad.name in json.loads(night.read_text())["identity"]["nodes_left_out"]


def test_on_slurm_the_bandwidth_gate_holds_busbw_to_the_declared_rate_not_the_emulated_one(site, tmp_path):
    """On a real cluster the gate's rate is the one declared (else the nodes' sysfs), never the
    preset's emulated rate: a 1000 Gbit/s declaration fails the unshaped links here, and says so."""
    env = {**os.environ, **site.env, **FABRIC_ENV}
    junit = tmp_path / "fabric.xml"
    run = subprocess.run(netns_exec(site.nodes[0], [
        "salloc", "--nodes=2", "--immediate=60", sys.executable, "-m", "pytest",
        str(REPO / "suites" / "test_bandwidth.py"), "-k", "test_busbw_reaches_the_link_rate and n2",
        "--fabrics", "eth", "--fabric-link-gbit", "eth=1000", "--run-dir", str(tmp_path / "runs"),
        "--junitxml", str(junit), *QUICK]), env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    (message,) = etree.parse(str(junit)).xpath("//testcase/failure/@message")
    assert "1000 Gbit/s (declared --fabric-link-gbit)" in message, run.stdout[-3000:]
