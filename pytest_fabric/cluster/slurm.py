"""The Slurm cluster: inside an allocation, one ``srun`` step runs one ``torchrun`` per node.

    srun --nodes=N --ntasks=N --ntasks-per-node=1 --kill-on-bad-exit=1 ... python -c WRAPPER plan.json
      on each node the wrapper finds its node name in the plan and execs that node's torchrun

Every torchrun command line is built here, by ``torchrun_argv``, before the step starts; the wrapper
only picks its own line, so the plan file in the run directory is exactly what ran. The rendezvous
is hosted on the allocation's first node (its ``NodeAddr``), with the Slurm job id in the
rendezvous id. The run directory must be on storage every node sees, as it already must be for the
rank program (ranks read its config there and rank 0 writes the result there).

srun gives its tasks the caller's environment (Slurm's default ``--export=ALL``), so the rank
environment is simply srun's. At the deadline the supervisor stops srun: SIGTERM makes srun cancel
the step, but a srun killed outright leaves remote tasks to slurmd, so any step of this launch that
Slurm still lists afterwards is cancelled with ``scancel``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .base import (_PACKAGE_ROOT, Cluster, ClusterUnavailable, LaunchRequest, launch_on_held_nodes, rank_env,
                   torchrun_argv)
from .nodelock import NodeLock, holder_program, session_name
from .supervisor import LaunchOutcome, ProcSpec, supervise

# How long a cancelled step may take to disappear from squeue before it is cancelled harder.
CANCEL_WAIT_S = 10.0
# A Slurm client command that gets no answer from slurmctld in this long has failed.
COMMAND_TIMEOUT_S = 30.0

# Runs as each task of the step (argv, no shell): pick this node's torchrun from the plan, become it.
_NODE_WRAPPER = """\
import json, os, sys
plan = json.load(open(sys.argv[1]))
name = os.environ.get("SLURMD_NODENAME", "")
if name not in plan:
    sys.exit(f"pytest-fabric: node {name!r} is not in the launch plan {sys.argv[1]} ({', '.join(plan)})")
os.environ["PYTEST_FABRIC_NODE"] = plan[name]["label"]
os.execv(plan[name]["argv"][0], plan[name]["argv"])
"""


@dataclass(frozen=True)
class SlurmNode:
    name: str  # Slurm's node name (SLURMD_NODENAME on the node)
    address: str  # NodeAddr: what other nodes connect to


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(list(argv), 124, "", f"no answer in {COMMAND_TIMEOUT_S:.0f}s")


def cpus_per_node(environ: Mapping[str, str]) -> int | None:
    """The fewest CPUs the job holds on any node: SLURM_JOB_CPUS_PER_NODE "32(x2),16" -> 16."""
    counts = [int(c) for c in re.findall(r"(\d+)(?:\(x\d+\))?", environ.get("SLURM_JOB_CPUS_PER_NODE", ""))]
    return min(counts) if counts else None


def srun_argv(job_id: str, nodes: Sequence[SlurmNode], step_name: str, plan_path: Path,
              cpus: int | None = None) -> list[str]:
    """The one step that starts a torchrun on each of ``nodes``, with ``cpus`` CPUs each where known."""
    n = len(nodes)
    return [
        "srun",
        f"--jobid={job_id}",
        f"--nodes={n}",
        f"--ntasks={n}",
        "--ntasks-per-node=1",
        # One task per node runs every rank of that node: it gets the node's whole share of the job.
        *([f"--cpus-per-task={cpus}"] if cpus else []),
        # The rendezvous host is the first of these, so the step must run on exactly these nodes.
        f"--nodelist={','.join(node.name for node in nodes)}",
        "--kill-on-bad-exit=1",  # one torchrun failing ends the others at once
        "--overlap",  # the harness may itself run inside a step (`srun pytest`) that holds the nodes
        "--mpi=none",  # torchrun does its own rendezvous; a site's PMIx default only slows the start
        f"--job-name={step_name}",  # names the step, so that it can be found and cancelled
        "--label",  # one log for all nodes: "1: ..." is node rank 1
        sys.executable, "-c", _NODE_WRAPPER, str(plan_path),
    ]


def srun_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` for srun without the harness's own SLURM_* settings.

    srun reads SLURM_* variables as defaults for its options: inside an sbatch script with
    ``--gpus-per-task=1`` or ``--cpus-per-task=4`` they would shrink this step's one task per node
    to one GPU or four CPUs. The step is described by its command line alone; SLURM_CONF still says
    where the configuration is.
    """
    return {name: value for name, value in env.items() if not name.startswith("SLURM_") or name == "SLURM_CONF"}


class SlurmCluster(Cluster):
    name = "slurm"
    realizes_fabrics = True

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = dict(os.environ if environ is None else environ)
        self.job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        self.nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
        if not self.job_id or not self.nodelist:
            raise ClusterUnavailable(
                "the slurm cluster runs inside an allocation, and SLURM_JOB_ID / SLURM_JOB_NODELIST are not set: "
                "run pytest from an sbatch script or under `salloc -N 4 pytest ...`")
        missing = [tool for tool in ("srun", "scontrol", "squeue", "scancel") if shutil.which(tool) is None]
        if missing:
            raise ClusterUnavailable("the slurm cluster needs the Slurm client commands; "
                                     f"not on PATH: {', '.join(missing)}")
        size = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
        self._size = int(size) if size.isdigit() else None
        self._cpus = cpus_per_node(env)
        self._nodes: list[SlurmNode] | None = None

    def describe(self) -> str:
        return f"slurm (job {self.job_id} on {self.nodelist})"

    def max_nodes(self) -> int:
        return self._size if self._size is not None else len(self.nodes())

    def default_nodes(self) -> int:
        return self.max_nodes()

    def prepare(self) -> None:
        self.nodes()

    def nodes(self) -> list[SlurmNode]:
        """The allocation's nodes in Slurm's order, each with the address Slurm itself uses."""
        if self._nodes is None:
            proc = _run(["scontrol", "show", "hostnames", self.nodelist])
            names = proc.stdout.split()
            if proc.returncode != 0 or not names:
                raise ClusterUnavailable(f"`scontrol show hostnames {self.nodelist}` failed: "
                                         f"{proc.stderr.strip() or 'no hosts'}")
            # NodeAddr, where the site sets one (it may differ from the name); else the name resolves.
            shown = _run(["scontrol", "--oneliner", "show", "node", ",".join(names)]).stdout
            addresses = dict(re.findall(r"NodeName=(\S+).*?NodeAddr=(\S+)", shown))
            self._nodes = [SlurmNode(name, addresses.get(name, name)) for name in names]
        return self._nodes

    def launch(self, request: LaunchRequest, on_tick: Callable[[float], None] | None = None) -> LaunchOutcome:
        nodes = self.nodes()[: request.nodes]
        if len(nodes) < request.nodes:
            raise ClusterUnavailable(f"the allocation (job {self.job_id}) has {len(nodes)} nodes; the launch needs "
                                     f"{request.nodes}: allocate more with `salloc -N {request.nodes}`")
        # The Slurm job id keeps rendezvous ids of different allocations apart; the request's keeps
        # launches within one allocation apart.
        request = replace(request, job_id=f"{self.job_id}-{request.job_id}")
        # Jobs may share nodes (OverSubscribe, or sessions started inside one allocation): another
        # session's launch on any of these nodes waits for ours, and ours for theirs; the rendezvous
        # port is probed on the first node while every node is held.
        tag = secrets.token_hex(4)
        locks = [(node.address, NodeLock(node.name, self._step_argv(
            node, f"pytest-fabric-lock-{tag}", holder_program(node.address, f"{session_name()}, job {self.job_id}")),
            srun_env(os.environ))) for node in nodes]
        try:
            return launch_on_held_nodes(locks, nodes[0].address, request,
                                        lambda port: self._launch(request, nodes, port, on_tick))
        finally:
            self.cancel_step(f"pytest-fabric-lock-{tag}")  # a holder whose srun was killed before it ended

    def _step_argv(self, node: SlurmNode, step_name: str, args: Sequence[str]) -> list[str]:
        """One task on ``node`` running this Python on the package the ranks import, its input from srun's."""
        return ["srun", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node.name}", "--overlap",
                "--mpi=none", "--input=all", f"--job-name={step_name}",
                "env", f"PYTHONPATH={_PACKAGE_ROOT}", sys.executable, *args]

    def _launch(self, request: LaunchRequest, nodes: list[SlurmNode], port: int,
                on_tick: Callable[[float], None] | None) -> LaunchOutcome:
        head = nodes[0].address
        plan = {
            node.name: {"label": f"{node.name}/{node.address}",
                        "argv": torchrun_argv(request, i, head, node.address, port)}
            for i, node in enumerate(nodes)
        }
        request.workdir.mkdir(parents=True, exist_ok=True)
        plan_path = request.workdir / "slurm-plan.json"
        plan_path.write_text(json.dumps(plan, indent=2))
        step_name = f"pytest-fabric-{secrets.token_hex(4)}"
        threads = max(1, (self._cpus or len(os.sched_getaffinity(0))) // request.procs_per_node)
        spec = ProcSpec("srun", srun_argv(self.job_id, nodes, step_name, plan_path, self._cpus),
                        srun_env(rank_env(request, "(set on each node)", threads, {})))
        try:
            outcome = supervise([spec], request.workdir, request.deadline_s, on_tick)
        except BaseException:  # Ctrl-C, SIGTERM: the supervisor stopped srun; the step must go too
            self.cancel_step(step_name)
            raise
        # A clean srun exit means a finished step; after anything else, make sure it is gone.
        if not outcome.ok and (note := self.cancel_step(step_name)):
            with open(outcome.procs[0].log_path, "a") as log:
                log.write(f"pytest-fabric: {note}\n")
        return outcome

    def steps(self, step_name: str) -> list[str]:
        """Ids ("JOB.STEP") of the steps named ``step_name`` that Slurm lists in this allocation."""
        listed = _run(["squeue", "--steps", "--noheader", f"--jobs={self.job_id}", "--format=%i %j"])
        if listed.returncode != 0:
            raise RuntimeError(f"`squeue --steps --jobs={self.job_id}` failed: {listed.stderr.strip()}")
        return [step for step, _, name in (line.strip().partition(" ") for line in listed.stdout.splitlines())
                if name.strip() == step_name]

    def cancel_step(self, step_name: str) -> str | None:
        """Cancel the step named ``step_name`` if Slurm still lists it; say what happened (None: nothing to do)."""
        try:
            return self._cancel_step(step_name)
        except RuntimeError as exc:
            return f"could not make sure step {step_name} is gone ({exc}); check `squeue --steps --jobs={self.job_id}`"

    def _cancel_step(self, step_name: str) -> str | None:
        steps = self.steps(step_name)
        if not steps:
            return None
        # The supervisor already gave srun SIGTERM and its grace: what is left is hung, so KILL it.
        for step in steps:
            _run(["scancel", "--signal=KILL", step])
        deadline = time.monotonic() + CANCEL_WAIT_S
        while (remaining := self.steps(step_name)) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not remaining:
            return f"cancelled step {', '.join(steps)} with scancel"
        for step in remaining:
            _run(["scancel", step])
        return (f"step {', '.join(remaining)} still listed {CANCEL_WAIT_S:.0f}s after `scancel --signal=KILL`; "
                f"cancelled it again (check `squeue --steps --jobs={self.job_id}`)")
