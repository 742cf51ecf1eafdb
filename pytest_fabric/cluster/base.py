"""What every launcher shares: the launch request, the torchrun command line, the rank environment."""

from __future__ import annotations

import os
import re
import shlex
import tempfile
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ..core.fabrics import Fabric
from ..core.redact import is_secret_name
from .nodelock import LockError, NodeLock, holding, lock_wait_s
from .supervisor import LaunchOutcome

# The directory that holds the pytest_fabric package: ranks must import the same code as the harness.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# The rendezvous port of clusters whose launches each have nodes of their own (the emulated
# cluster's namespaces); launchers on shared nodes (ssh, slurm) probe a free one on the head node.
RDZV_PORT = 29400
# Clusters whose ranks all run on this machine: past this many ranks per core a launch measures
# CPU contention, not the fabric.
MAX_RANKS_PER_CPU = 4
# Their ranks each stand for a GPU of one core: one compute thread each at every node count (more
# threads on a one-node launch would make its GPU faster than a multi-node launch's, and a rank of
# two threads stalls whenever anything else takes one of its cores: one-node launches here varied
# by 5.6% between launches with two threads).
THREADS_PER_RANK = 1

# What ranks need from the harness's environment where a launcher must set it explicitly (ssh
# forwards nothing; a container may keep the image's own values): the base variables rank_env
# sets, and the families that configure collectives. A request's own variables, its fabric's and
# the names the user declares (--rank-env) are added by name.
_FORWARDED = {"PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "PYTEST_FABRIC_NODE"}
_FORWARDED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "GLOO_", "FI_")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class OnThisMachine:
    """Mixin for clusters whose every rank shares this machine's cores."""

    @staticmethod
    def machine_lock_path() -> Path:
        """One launch at a time on this machine, across pytest sessions: two sessions' ranks on the
        same cores would measure each other (a session already serializes its own xdist workers)."""
        return Path(tempfile.gettempdir()) / "pytest-fabric-machine.lock"

    def max_ranks(self) -> int:
        return MAX_RANKS_PER_CPU * len(os.sched_getaffinity(0))

    @staticmethod
    def pin(node_rank: int, nodes: int, argv: list[str], procs_per_node: int = 1) -> list[str]:
        """``argv`` run on this node's own share of the cores: one core per rank (an emulated GPU
        is one core, so a GPU computes as fast at every node count and tokens/s/GPU, scaling
        efficiency above all, compares like with like); where the machine has fewer cores than
        ranks, the nodes split the cores evenly.

        Emulated nodes are separate machines; left to the scheduler, two ranks sometimes share a
        core while another idles, which showed here as +-40% between identical launches.
        """
        cpus = sorted(os.sched_getaffinity(0))
        share = max(1, min(procs_per_node, len(cpus) // nodes))
        start = (node_rank * share) % len(cpus)
        mine = cpus[start:start + share]
        return ["taskset", "-c", ",".join(map(str, mine)), *argv]


@dataclass(frozen=True)
class LaunchRequest:
    nodes: int
    procs_per_node: int
    fabric: Fabric
    # What torchrun runs in each rank, e.g. ["-m", "pytest_fabric.workload.train", "--config", p].
    program: Sequence[str]
    workdir: Path  # logs go here
    deadline_s: float
    job_id: str
    env: Mapping[str, str] | None = None
    # Nodes whose fabric link is down: an injected fault (the harness's own tests), which the emulated
    # cluster realises by taking the node's cable out; the launcher never reads faults itself.
    links_down: tuple[int, ...] = ()
    # Nodes whose link the launcher cuts mid-launch (an injected fault too), each when its request file
    # appears (a rank creates it at the step the fault names): (node index, request file).
    links_cut: tuple[tuple[int, Path], ...] = ()
    # What the launcher says while the launch cannot start yet (another session's launch holds its
    # nodes): the session's progress line. None: wait silently.
    notify: Callable[[str], None] | None = field(default=None, compare=False, repr=False)


_Node = TypeVar("_Node")


class ClusterUnavailable(RuntimeError):
    """The cluster cannot be used here; the message says what is missing and what to do."""


class Cluster(ABC):
    name: str
    # False where every fabric runs over the same links (no shaping): fabric comparisons say nothing.
    realizes_fabrics: bool
    # True where this host is one of the job's nodes, so pre-flight checks here mean something.
    checks_here: bool = True
    # True where the fabric is NCCL's real transport, so its logs must prove which one ran.
    proves_transport: bool = True
    # True where nodes are hosts of their own, checked one by one before the first launch
    # (measuring/nodes.py); False where every "node" is this machine (the local cluster).
    checks_nodes: bool = True

    def describe(self) -> str:
        return self.name

    def nccl_env(self, fabric: Fabric) -> dict[str, str]:
        """The NCCL settings ranks get for ``fabric`` on this cluster (recorded with the result)."""
        return dict(fabric.nccl_env)

    @abstractmethod
    def max_nodes(self) -> int:
        """How many nodes this cluster can run a job on."""

    def default_nodes(self) -> int:
        """--nodes when the user gives none: a real cluster's own size; 2 for one on this machine."""
        return min(2, self.max_nodes())

    def max_ranks(self) -> int | None:
        """How many ranks in all, where that is less than nodes x GPUs (None: no extra limit)."""
        return None

    def prepare(self) -> None:
        """Side effects needed before the first launch; raise ClusterUnavailable if it cannot run."""

    @abstractmethod
    def launch(self, request: LaunchRequest, on_tick: Callable[[float], None] | None = None) -> LaunchOutcome:
        """Run one torchrun per node to completion, failure or deadline; leave nothing behind."""

    # -- every node, one at a time: the node check (measuring/nodes.py) and the nodes left out ------

    def gpus_per_node(self) -> int | None:
        """GPUs (ranks) per node as the cluster itself declares them (a Slurm allocation's GPUs, a
        hostfile's slots); None: not declared (the node check's ``nvidia-smi -L`` counts, else 1)."""
        return None

    def node_names(self, wanted: int) -> list[str]:
        """Every node this cluster may launch on, by the names the node check and --exclude-nodes use:
        the allocation's or the hostfile's; ``wanted`` of them where nodes are made per launch."""
        return [f"node{i}" for i in range(wanted)]

    def run_on_each(self, args_of: Callable[[str], list[str]], names: Sequence[str], workdir: Path,
                    deadline_s: float) -> LaunchOutcome:
        """``python ARGS`` (``args_of(name)``) on each node of ``names`` the way its ranks start (same
        launcher, environment, container), each on its own: one failing stops no other. Each process
        of the outcome is named after its node."""
        raise NotImplementedError(f"the {self.name} cluster cannot run a program on each node")

    @property
    def left_out(self) -> dict[str, str]:
        """Nodes left out for the session, name -> why (the node check, --exclude-nodes)."""
        if "_left_out" not in self.__dict__:
            self._left_out: dict[str, str] = {}
        return self._left_out

    def usable(self, nodes: Sequence[_Node], name: Callable[[_Node], str], wanted: int) -> list[_Node]:
        """The first ``wanted`` of ``nodes`` not left out; ClusterUnavailable, naming the ones left out
        and why, where fewer are healthy."""
        healthy = [node for node in nodes if name(node) not in self.left_out]
        if len(healthy) >= wanted:
            return healthy[:wanted]
        why = "; ".join(f"{n}: {reason}" for n, reason in self.left_out.items())
        raise ClusterUnavailable(f"the launch needs {wanted} nodes and the {self.name} cluster has {len(healthy)} "
                                 f"healthy of {len(nodes)}" + (f" (left out: {why})" if why else ""))


def launch_on_held_nodes(locks: Sequence[tuple[str, NodeLock]], head: str, request: LaunchRequest,
                         launch: Callable[[int], LaunchOutcome]) -> LaunchOutcome:
    """``launch(port)`` while every node of ``locks`` (key, lock) is held against other sessions'
    launches, with a rendezvous port probed free on the node keyed ``head``; waits are said through
    ``request.notify``, and a node that stays busy past the bound is ClusterUnavailable."""
    try:
        with holding(locks, lock_wait_s(request.deadline_s), request.notify) as held:
            return launch(held[head].port())
    except LockError as exc:
        raise ClusterUnavailable(str(exc)) from None


def store_timeout(deadline_s: float) -> int:
    """Seconds a node's agent keeps trying to reach node 0's rendezvous store (the static rendezvous's
    ``timeout``, 600 by default): a third of the launch deadline, between 20 and 60. A node that
    cannot reach node 0 (its link is down, a firewall) then gives up on its own, with its exit code
    and its own log, well before the deadline kills every node; a node that starts late still has
    20 s to connect."""
    return int(min(60, max(20, deadline_s // 3)))


def torchrun_argv(
    request: LaunchRequest,
    node_rank: int,
    rdzv_host: str,
    local_addr: str,
    rdzv_port: int = RDZV_PORT,
) -> list[str]:
    """One node's torchrun command: the static rendezvous (node ranks given, the store on node 0), no restarts.

    The nodes of a launch are known before it starts, and a failed launch is never restarted, so the
    dynamic (c10d) rendezvous buys nothing here and costs every launch: its agents poll the shared state
    with one-second sleeps (``_Action.SYNC`` in torch's dynamic_rendezvous.py) after a random delay of up
    to 0.3 s. The static one is torchrun's own default, and what a Slurm batch script gives it
    (``--node-rank=$SLURM_NODEID``): node 0's agent hosts the store and each agent connects to it. Node 0
    hosts it by its node rank, so agents that share an address (the local cluster's loopback) cannot
    both try. The store's ``timeout`` bounds node 0's wait for the others (the launch's deadline: a node
    that never comes is reported from its own log, not node 0's) and another node's tries to reach node 0
    (``store_timeout``: it fails first, on its own). torchrun's monitor interval is its own default (0.1 s)."""
    timeout = max(30, int(request.deadline_s)) if node_rank == 0 else store_timeout(request.deadline_s)
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={request.nodes}",
        f"--nproc-per-node={request.procs_per_node}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=static",
        f"--rdzv-endpoint={rdzv_host}:{rdzv_port}",
        f"--rdzv-id={request.job_id}",
        f"--rdzv-conf=timeout={timeout}",
        f"--local-addr={local_addr}",
        "--max-restarts=0",
        *request.program,
    ]


def program_env(node_name: str) -> dict[str, str]:
    """This process's environment for a program of the package run on a node (a rank, the node
    check): the package on PYTHONPATH, output unbuffered, the node's name."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTEST_FABRIC_NODE"] = node_name
    return env


def rank_env(request: LaunchRequest, node_name: str, threads: int, extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus what every rank needs; ``extra`` (the launcher's: fabric
    settings, interface names) wins."""
    env = program_env(node_name)
    env["OMP_NUM_THREADS"] = str(threads)
    env.update(request.fabric.nccl_env)
    env.update(request.env or {})
    env.update(extra)
    return env


def remote_env(env: Mapping[str, str], explicit: Iterable[str] = ()) -> dict[str, str]:
    """The part of ``env`` a launcher sets explicitly on a node: what ranks need, plus ``explicit``
    names, minus secrets (never sent to another machine or written to a plan file, whoever asks)."""
    wanted = _FORWARDED | set(explicit)
    return {
        name: value for name, value in env.items()
        if (name in wanted or name.startswith(_FORWARDED_PREFIXES))
        and _ENV_NAME.match(name) and not is_secret_name(name)
    }


def explicit_rank_env(request: LaunchRequest, node_name: str, threads: int,
                      declared: Iterable[str] = ()) -> dict[str, str]:
    """The variables a launcher sets itself on a node (ssh's ``env NAME=VALUE``, the Slurm wrapper's):
    what every rank needs, the fabric's settings, the request's, and the ``declared`` names
    (--rank-env); from this process's environment, without secrets."""
    explicit = {*request.fabric.nccl_env, *(request.env or {}), *declared}
    return remote_env(rank_env(request, node_name, threads, {}), explicit)


def check_rank_env(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` declared for every rank (--rank-env), each once; ValueError for a name no shell could
    set, or one whose value would be a secret: remote_env would drop it, and the ranks would run
    without what the user asked for."""
    checked = tuple(dict.fromkeys(names))
    for name in checked:
        if not _ENV_NAME.match(name):
            raise ValueError(f"{name!r} is not a variable name (letters, digits and '_', not starting with a digit)")
        if is_secret_name(name):
            raise ValueError(f"{name} looks like a secret, and secrets are never sent to the ranks' nodes or "
                             "written to a launch's files; give it to the nodes another way (a file they read)")
    return checked


def launch_notes(srun_args: Sequence[str] = (), prefix: Sequence[str] = (), env_names: Sequence[str] = ()) -> str:
    """What a cluster adds to how ranks start, as ``; srun ARGS; prefix WORDS; rank env NAMES`` (empty
    when nothing): its describe() line is the header's and every result's record of the container and
    the environment the ranks ran in."""
    notes = [f"srun {shlex.join(srun_args)}" if srun_args else "", f"prefix {shlex.join(prefix)}" if prefix else "",
             f"rank env {','.join(env_names)}" if env_names else ""]
    return "".join(f"; {note}" for note in notes if note)
