"""The link test's rank program: every pair of nodes measured alone, under torchrun.

    torchrun ... -m pytest_fabric.workload.pairs --config config.json

One launch over all the nodes. Each rank names its node (``PYTEST_FABRIC_NODE``, else the host
name); then, pair after pair (node0-node1, node0-node2, ..., N(N-1)/2 of them), the ranks of those
two nodes form a process group (``new_group``, created by every rank, as torch requires) and run
one large all_reduce: warm-up iterations, then timed iterations, each between the pair's barriers
and taken as its slowest rank's time. The other ranks wait at a barrier of the whole job, so no
other traffic shares the fabric while a pair is timed. The pair's time is the median of its timed
iterations; algbw = bytes / time and busbw = algbw x 2(n-1)/n for the n ranks of the pair
(nccl-tests' all_reduce), comparable with the per-node link rate as the all-node busbw is.
"""

from __future__ import annotations

import datetime
import itertools
import os
import platform
import socket
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from .collectives import bus_factor
from .pair_types import LinksConfig, LinksResult, PairRow
from . import marks
from .train import finish, rank_main
from ..core.units import gbyte_per_s


def node_ranks(ranks: list[tuple[int, str]]) -> dict[str, list[int]]:
    """Each node's global ranks by its name, nodes in the order of their first rank, from every
    rank's (torchrun's node rank, ``GROUP_RANK``: -1 where unknown; the name it gives its node).
    Nodes are told apart by their node rank where torchrun gives one, so that two nodes calling
    themselves alike (one host name in every container) stay two, named ``NAME (node rank K)``."""
    groups: dict[object, list[int]] = {}
    for rank, (group, name) in enumerate(ranks):
        groups.setdefault(group if group >= 0 else name, []).append(rank)
    names = [ranks[members[0]][1] for members in groups.values()]
    return {(name if names.count(name) == 1 else f"{name} (node rank {ranks[members[0]][0]})"): members
            for name, members in zip(names, groups.values())}


def _time_pair(buf: torch.Tensor, group: Any, cfg: LinksConfig, sync) -> list[float]:
    """This rank's time of each timed iteration of all_reduce(``buf``) over ``group``."""
    for _ in range(cfg.warmup_iters):
        dist.all_reduce(buf, group=group)
    sync()
    times = []
    for _ in range(cfg.iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        dist.all_reduce(buf, group=group)
        sync()
        times.append(time.perf_counter() - start)
    return times


def run(cfg: LinksConfig) -> LinksResult | None:
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize()

    named: list[Any] = [None] * world
    dist.all_gather_object(named, (int(os.environ.get("GROUP_RANK", "-1")),
                                   os.environ.get("PYTEST_FABRIC_NODE") or socket.gethostname()))
    nodes = node_ranks([tuple(n) for n in named])
    payload = cfg.payload(backend)
    mine: list[dict[str, Any]] = []  # the pairs whose lowest rank this is: their times, slowest rank's
    for a, b in itertools.combinations(nodes, 2):
        members = sorted(nodes[a] + nodes[b])
        group = dist.new_group(members, timeout=timeout)  # every rank calls it, in the same order
        if rank in members:
            elements = max(len(members), payload // 4 // len(members) * len(members))
            buf = torch.ones(elements, device=device)
            times = torch.tensor(_time_pair(buf, group, cfg, sync), dtype=torch.float64, device=device)
            dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
            if rank == members[0]:
                mine.append({"a": a, "b": b, "ranks": len(members), "bytes": elements * 4,
                             "times_s": [float(t) for t in times.tolist()]})
            del buf
            dist.destroy_process_group(group)
        dist.barrier()  # the next pair starts when this one is done: each pair is measured alone
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    result = None
    if rank == 0:
        rows = []
        for found in itertools.chain.from_iterable(gathered):
            marks.measured(sum(found["times_s"]))  # every pair's timed iterations, rank 0 in them or not
            median = statistics.median(found["times_s"])
            algbw = gbyte_per_s(found["bytes"], median)
            busbw = algbw * bus_factor("all_reduce", found["ranks"])
            rows.append(PairRow("all_reduce", found["bytes"], median, algbw, busbw, found["a"], found["b"],
                                found["ranks"], found["times_s"]))
        order = {pair: i for i, pair in enumerate(itertools.combinations(nodes, 2))}
        rows.sort(key=lambda r: order[(r.a, r.b)])
        result = LinksResult(
            world_size=world, nodes=list(nodes), pairs=rows,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), backend=backend, device=device.type,
            versions={"python": platform.python_version(), "torch": torch.__version__, "backend": backend,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None},
            fabric=cfg.fabric)
    finish(result, cfg.result_path)  # type: ignore[arg-type]
    return result


@record  # torchrun's failure summary then names the rank's exception, not just its exit code
def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, __doc__.splitlines()[0], LinksConfig.load, run)


if __name__ == "__main__":
    sys.exit(main())
