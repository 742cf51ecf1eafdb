"""The local cluster: every node is a torchrun on this machine's loopback, with no link shaping.

It needs no privileges, so it is the fallback where namespaces cannot be made. Every fabric runs
over the same loopback here, so fabric comparisons on it say nothing and are skipped.
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Cluster, LaunchRequest, OnThisMachine, rank_env, THREADS_PER_RANK, torchrun_argv
from .nodelock import free_port
from .supervisor import LaunchOutcome, ProcSpec, supervise


class LocalCluster(OnThisMachine, Cluster):
    name = "local"
    realizes_fabrics = False
    checks_nodes = False  # every node is this machine

    def describe(self) -> str:
        return "local (processes on this machine's loopback, no link shaping)"

    def max_nodes(self) -> int:
        return self.max_ranks()

    def launch(self, request: LaunchRequest, on_tick: Callable[[float], None] | None = None) -> LaunchOutcome:
        port = free_port()
        specs = [
            ProcSpec(
                f"node{i}",
                self.pin(i, request.nodes, torchrun_argv(request, i, "127.0.0.1", "127.0.0.1", rdzv_port=port),
                         request.procs_per_node),
                rank_env(request, f"node{i}/127.0.0.1", THREADS_PER_RANK, {"GLOO_SOCKET_IFNAME": "lo"}),
            )
            for i in range(request.nodes)
        ]
        return supervise(specs, request.workdir, request.deadline_s, on_tick)
