"""The local cluster: every node is a torchrun on this machine's loopback, with no link shaping.

It needs no privileges, so it is the fallback where namespaces cannot be made. Every fabric runs
over the same loopback here, so fabric comparisons on it say nothing and are skipped.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable

from .base import Cluster, LaunchRequest, OnThisMachine, rank_env, THREADS_PER_RANK, torchrun_argv
from .supervisor import LaunchOutcome, ProcSpec, supervise


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(tries: int = 200) -> int:
    """A port free now and outside the kernel's ephemeral range.

    A port the kernel handed out for ``bind(0)`` is an ephemeral one: while node 0 starts, another
    node's agent connecting over and over to that port can be given it as its own source port
    (seen here: node 0's store then failed with EADDRINUSE). Ports below the range are never handed out.
    """
    low, high = _ephemeral_range()
    candidates = range(10000, low) if low > 11000 else range(high + 1, 65536)
    for port in random.sample(candidates, min(tries, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster(OnThisMachine, Cluster):
    name = "local"
    realizes_fabrics = False

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
