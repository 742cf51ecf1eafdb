"""The Slurm cluster: inside an allocation, one ``srun`` step runs one ``torchrun`` per node.

    srun --nodes=N --ntasks=N --ntasks-per-node=1 --kill-on-bad-exit=1 ... python -c WRAPPER plan.json
      on each node the wrapper finds its node name in the plan and execs that node's torchrun

Every torchrun command line is built here, by ``torchrun_argv``, before the step starts; the wrapper
only picks its own line, so the plan file in the run directory is exactly what ran. The rendezvous
is hosted on the allocation's first node (its ``NodeAddr``), with the Slurm job id in the
rendezvous id. The run directory must be on storage every node sees, as it already must be for the
rank program (ranks read its config there and rank 0 writes the result there).

Containers: ``--srun-args`` adds a site's srun options to the step that runs ranks (pyxis's
``--container-image=... --container-mounts=...``), after the launcher's own and before the program;
the options that say where and as what the step runs (nodes, tasks, node list, job, step name) are
the launcher's and refused. ``--launch-prefix`` puts words before the wrapper in each task
(``apptainer exec --nv IMAGE``), so the wrapper and the ranks run inside the container; the node
lock steps run on the node itself, outside any container.

srun gives its tasks the caller's environment (Slurm's default ``--export=ALL``), but a container
may not keep it: pyxis sets the step's variables after the image's entrypoint, where a variable the
image defines (LD_LIBRARY_PATH, PATH in NVIDIA's images) keeps the image's value; apptainer never
passes LD_LIBRARY_PATH in. So the wrapper, the first thing to run inside whatever container there
is, sets the ranks' variables itself from the plan: what every rank needs, the fabric's settings,
the request's, and the names declared with ``--rank-env`` (never a secret: the plan is a file on
shared storage). Without a container this changes nothing, and the plan says what the ranks got.

When a launch fails or reaches its deadline, ``scancel --signal=USR1 JOB.STEP`` asks every rank of
the step for its stacks before anything is killed (cluster/stacks.py); the wrapper sets SIGUSR1 to
be ignored before it becomes torchrun, so the agent (which has no handler, and would die of it)
and everything else of the step but the ranks, which register faulthandler on it, ignore it.

At the deadline the supervisor stops srun: SIGTERM makes srun cancel
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

from .base import (_PACKAGE_ROOT, Cluster, ClusterUnavailable, LaunchRequest, explicit_rank_env, launch_notes,
                   launch_on_held_nodes, rank_env, torchrun_argv)
from .nodelock import NodeLock, holder_program, session_name
from .supervisor import LaunchOutcome, ProcSpec, supervise

# How long a cancelled step may take to disappear from squeue before it is cancelled harder.
CANCEL_WAIT_S = 10.0
# A Slurm client command that gets no answer from slurmctld in this long has failed.
COMMAND_TIMEOUT_S = 30.0

# Options of srun that say where and as what the step runs: the launcher sets them, --srun-args may
# not. srun (getopt_long) also takes an unambiguous abbreviation of a long option (--nodel=).
OWNED_SRUN_OPTIONS = ("--nodes", "--ntasks", "--ntasks-per-node", "--nodelist", "--jobid", "--job-name")
OWNED_SRUN_SHORT = {"-N": "--nodes", "-n": "--ntasks", "-w": "--nodelist", "-J": "--job-name"}

# Runs as each task of the step (argv, no shell), inside the container where there is one: pick this
# node's torchrun from the plan, set the ranks' variables, become it.
_NODE_WRAPPER = """\
import json, os, sys
plan = json.load(open(sys.argv[1]))
name = os.environ.get("SLURMD_NODENAME", "")
if name not in plan:
    sys.exit(f"pytest-fabric: node {name!r} is not in the launch plan {sys.argv[1]} ({', '.join(plan)})")
os.environ.update(plan[name]["env"])
import signal
signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # torchrun keeps it ignored; its ranks dump their stacks on it
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


# srun's own line for a task that ended badly: "srun: error: gpu-003: task 2: Exited with exit code 1".
_TASK_FAILED = re.compile(rb"^srun: error: (\S+): tasks? [\d,-]+: (?:Exited|Killed|Terminated)")


def first_failed_task_node(log_path: Path) -> str | None:
    """The node of the first task srun reports as failed in its log (None: none reported)."""
    try:
        with open(log_path, "rb") as log:
            for line in log:
                if found := _TASK_FAILED.match(line):
                    return found.group(1).decode(errors="replace")
    except OSError:
        pass
    return None


def gpus_per_node(environ: Mapping[str, str]) -> int | None:
    """GPUs the job holds on each node, where it asked for them (``--gpus-per-node``, ``--gres=gpu:N``,
    ``--gpus``): SLURM_GPUS_ON_NODE "8", else SLURM_GPUS_PER_NODE "h100:8", else the count of
    SLURM_JOB_GPUS "0,1,2,3"; None where the job holds no GPUs by name."""
    on_node = environ.get("SLURM_GPUS_ON_NODE", "")
    if on_node.isdigit():
        return int(on_node)
    per_node = re.fullmatch(r"(?:[^:,]+:)?(\d+)", environ.get("SLURM_GPUS_PER_NODE", ""))
    if per_node:
        return int(per_node.group(1))
    ids = [g for g in environ.get("SLURM_JOB_GPUS", "").split(",") if g.strip()]
    return len(ids) or None


def cpus_per_node(environ: Mapping[str, str]) -> int | None:
    """The fewest CPUs the job holds on any node: SLURM_JOB_CPUS_PER_NODE "32(x2),16" -> 16."""
    counts = [int(c) for c in re.findall(r"(\d+)(?:\(x\d+\))?", environ.get("SLURM_JOB_CPUS_PER_NODE", ""))]
    return min(counts) if counts else None


def check_srun_args(args: Sequence[str]) -> None:
    """ValueError for a word of --srun-args that would change where or as what the step runs: the
    rendezvous host, the plan's node names and the step's cancellation all rest on those options."""
    for word in args:
        option = word.partition("=")[0]
        if word == "--":
            raise ValueError("'--' would end srun's options, and what follows would run instead of the ranks")
        if option.startswith("--") and len(option) > 2:
            owned = [name for name in OWNED_SRUN_OPTIONS if name.startswith(option)]
            if owned:
                raise ValueError(f"{word!r}: the launcher sets {' / '.join(owned)} itself (one task per node on "
                                 "exactly the nodes it chose, in this allocation, under a step name it can cancel)")
        elif word[:2] in OWNED_SRUN_SHORT:
            raise ValueError(f"{word!r}: {word[:2]} is {OWNED_SRUN_SHORT[word[:2]]}, which the launcher sets itself "
                             "(one task per node on exactly the nodes it chose, under a step name it can cancel)")


def srun_argv(job_id: str, nodes: Sequence[SlurmNode], step_name: str, plan_path: Path,
              cpus: int | None = None, extra: Sequence[str] = (), prefix: Sequence[str] = ()) -> list[str]:
    """The one step that starts a torchrun on each of ``nodes``, with ``cpus`` CPUs each where known;
    ``extra`` srun options (a site's, after the launcher's so that they win where both set one) and
    the ``prefix`` each task runs the wrapper under (a container runtime)."""
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
        *extra,
        *prefix, sys.executable, "-c", _NODE_WRAPPER, str(plan_path),
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

    def __init__(self, environ: Mapping[str, str] | None = None, *, srun_args: Sequence[str] = (),
                 launch_prefix: Sequence[str] = (), rank_env_names: Sequence[str] = ()) -> None:
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
        self._gpus = gpus_per_node(env)
        self._nodes: list[SlurmNode] | None = None
        self.srun_args = tuple(srun_args)  # a site's srun options for the step that runs ranks (pyxis)
        self.launch_prefix = tuple(launch_prefix)  # words before each task's wrapper (apptainer)
        self.rank_env_names = tuple(rank_env_names)  # variables every rank gets by name, besides what ranks need

    def describe(self) -> str:
        notes = launch_notes(self.srun_args, self.launch_prefix, self.rank_env_names)
        return f"slurm (job {self.job_id} on {self.nodelist}{notes})"

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
        if len(self.nodes()) < request.nodes:
            raise ClusterUnavailable(f"the allocation (job {self.job_id}) has {len(self.nodes())} nodes; the launch "
                                     f"needs {request.nodes}: allocate more with `salloc -N {request.nodes}`")
        nodes = self.usable(self.nodes(), lambda node: node.name, request.nodes)
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

    def node_names(self, wanted: int) -> list[str]:
        return [node.name for node in self.nodes()]

    def gpus_per_node(self) -> int | None:
        return self._gpus

    def run_on_each(self, args_of: Callable[[str], list[str]], names: Sequence[str], workdir: Path,
                    deadline_s: float) -> LaunchOutcome:
        """One step per node, as the ranks' (the site's srun arguments, the launch prefix), all at once;
        a step still listed when they end (the deadline) is cancelled."""
        step_name = f"pytest-fabric-check-{secrets.token_hex(4)}"
        specs = [ProcSpec(name, ["srun", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={name}",
                                 "--overlap", "--mpi=none", f"--job-name={step_name}", *self.srun_args,
                                 *self.launch_prefix, "env", f"PYTHONPATH={_PACKAGE_ROOT}", sys.executable,
                                 *args_of(name)], srun_env(os.environ))
                 for name in names]
        try:
            return supervise(specs, workdir, deadline_s, independent=True)
        finally:
            self.cancel_step(step_name)

    def _step_argv(self, node: SlurmNode, step_name: str, args: Sequence[str]) -> list[str]:
        """One task on ``node`` running this Python on the package the ranks import, its input from srun's."""
        return ["srun", f"--jobid={self.job_id}", "--nodes=1", "--ntasks=1", f"--nodelist={node.name}", "--overlap",
                "--mpi=none", "--input=all", f"--job-name={step_name}",
                "env", f"PYTHONPATH={_PACKAGE_ROOT}", sys.executable, *args]

    def _launch(self, request: LaunchRequest, nodes: list[SlurmNode], port: int,
                on_tick: Callable[[float], None] | None) -> LaunchOutcome:
        head = nodes[0].address
        threads = max(1, (self._cpus or len(os.sched_getaffinity(0))) // request.procs_per_node)
        names = self.rank_env_names
        plan = {
            node.name: {"env": explicit_rank_env(request, f"{node.name}/{node.address}", threads, names),
                        "argv": torchrun_argv(request, i, head, node.address, port)}
            for i, node in enumerate(nodes)
        }
        request.workdir.mkdir(parents=True, exist_ok=True)
        plan_path = request.workdir / "slurm-plan.json"
        plan_path.write_text(json.dumps(plan, indent=2))
        step_name = f"pytest-fabric-{secrets.token_hex(4)}"
        argv = srun_argv(self.job_id, nodes, step_name, plan_path, self._cpus, self.srun_args, self.launch_prefix)
        spec = ProcSpec("srun", argv, srun_env(rank_env(request, "(set on each node)", threads, {})))
        try:
            outcome = supervise([spec], request.workdir, request.deadline_s, on_tick,
                                ask_stacks=lambda: self.signal_step(step_name, "USR1"))
        except BaseException:  # Ctrl-C, SIGTERM: the supervisor stopped srun; the step must go too
            self.cancel_step(step_name)
            raise
        if not outcome.ok:
            outcome.failed_node = first_failed_task_node(outcome.procs[0].log_path)
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

    def signal_step(self, step_name: str, sig: str) -> None:
        """``sig`` to every process of the step named ``step_name`` (``scancel --signal``): SIGUSR1 asks
        its ranks for their stacks; the wrapper made every other process of the step ignore it."""
        for step in self.steps(step_name):
            _run(["scancel", f"--signal={sig}", step])

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
