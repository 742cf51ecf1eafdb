"""What every launcher shares: the launch request, the torchrun command line, the rank environment."""

from __future__ import annotations

import os
import tempfile
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest_fabric

from ..core.fabrics import Fabric
from .nodelock import LockError, NodeLock, holding, lock_wait_s
from .supervisor import LaunchOutcome

# The directory that holds the pytest_fabric package: ranks must import the same code as the harness.
_PACKAGE_ROOT = str(Path(pytest_fabric.__file__).resolve().parent.parent)
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
    # True where pre-flight can run on the nodes through this launcher (preflight.probe_nodes).
    probes_nodes: bool = True

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
    """Seconds a node's agent keeps trying to reach the rendezvous store (torch's ``read_timeout``,
    60 by default): a third of the launch deadline, between 20 and 60. A node that cannot reach node 0
    (its link is down, a firewall) then gives up on its own, with its exit code and its own log,
    well before the deadline kills every node; a node that starts late still has 20 s to connect."""
    return int(min(60, max(20, deadline_s // 3)))


def torchrun_argv(
    request: LaunchRequest,
    node_rank: int,
    rdzv_host: str,
    local_addr: str,
    rdzv_port: int = RDZV_PORT,
) -> list[str]:
    """One node's torchrun command: c10d rendezvous hosted on node 0, no restarts, bounded joins."""
    join_timeout = max(30, int(request.deadline_s))
    conf = f"join_timeout={join_timeout},read_timeout={store_timeout(request.deadline_s)}"
    # Say who hosts the rendezvous store. Left to guess, torch makes every agent whose address
    # matches the endpoint try to host it (all of them on the local cluster's loopback: node 1 could
    # bind first and node 0 then fail with EADDRINUSE), and none when the hostname does not resolve
    # to the local address.
    conf += ",is_host=true" if node_rank == 0 else ",is_host=false"
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={request.nodes}",
        f"--nproc-per-node={request.procs_per_node}",
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_host}:{rdzv_port}",
        f"--rdzv-id={request.job_id}",
        f"--rdzv-conf={conf}",
        f"--local-addr={local_addr}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
        *request.program,
    ]


def rank_env(request: LaunchRequest, node_name: str, threads: int, extra: Mapping[str, str]) -> dict[str, str]:
    """This process's environment plus what every rank needs; ``extra`` (the launcher's: fabric
    settings, interface names) wins."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTEST_FABRIC_NODE"] = node_name
    env.update(request.fabric.nccl_env)
    env.update(request.env or {})
    env.update(extra)
    return env
