"""Collective bandwidth, run by every rank under torchrun, with nccl-tests semantics.

    torchrun ... -m pytest_fabric.workload.collectives --config config.json

For each collective and payload size: warm-up iterations, then timed iterations between barriers;
the time of a size is the slowest rank's mean per iteration. ``bytes`` is the payload nccl-tests
reports: the buffer for all_reduce, the whole gathered (or scattered) buffer for all_gather and
reduce_scatter. algbw = bytes / time; busbw = algbw x the collective's factor, so that busbw is
comparable to the link rate whatever the collective and the rank count. Gates read the largest size
only: small sizes measure latency, and an average over sizes measures nothing in particular. The
sweep depends on the backend the rank ends up with (``CollectivesConfig.payloads``): to 1 GiB on
NCCL, to 16 MiB on gloo.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from .config import CollectivesConfig
from .result import CollectiveRow, CollectivesResult
from . import marks
from .train import finish, rank_main
from ..core.units import gbyte_per_s

OPS = ("all_reduce", "all_gather", "reduce_scatter")


def bus_factor(op: str, ranks: int) -> float:
    """nccl-tests' busbw factor: what each rank's link carries relative to algbw."""
    if op == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if op in ("all_gather", "reduce_scatter"):
        return (ranks - 1) / ranks
    if op == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(OPS)}, broadcast")


# A payload whose probe took next to nothing is not timed forever.
MAX_TIMED_ITERS = 5000


def timed_iterations(cfg: CollectivesConfig, probe_s: float) -> int:
    """``cfg.iters``, or more where one iteration (``probe_s``, the slowest rank's) is short: enough
    for ``cfg.min_timed_s`` in all. A probe sped up by a full token bucket only adds iterations."""
    if probe_s <= 0:
        return MAX_TIMED_ITERS
    return min(MAX_TIMED_ITERS, max(cfg.iters, math.ceil(cfg.min_timed_s / probe_s)))


def _run_op(op: str, buf: torch.Tensor, out: torch.Tensor | None) -> None:
    if op == "all_reduce":
        dist.all_reduce(buf)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, buf)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf)
    else:
        raise ValueError(op)


def run(cfg: CollectivesConfig) -> CollectivesResult | None:
    use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    backend = "nccl" if use_cuda else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.collective_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize()

    rows = []
    for op in cfg.ops:
        for size in cfg.payloads(backend):
            # ``size`` is nccl-tests' bytes: the all_reduce buffer, or the whole gathered/scattered one.
            total = max(world, size // 4 // world * world)  # float32 elements, divisible by world
            if op == "all_gather":
                buf, out = torch.ones(total // world, device=device), torch.empty(total, device=device)
            elif op == "reduce_scatter":
                buf, out = torch.ones(total, device=device), torch.empty(total // world, device=device)
            else:
                buf, out = torch.ones(total, device=device), None
            for _ in range(cfg.warmup_iters):
                _run_op(op, buf, out)
            sync()
            dist.barrier()
            probe = time.perf_counter()
            _run_op(op, buf, out)
            sync()
            probe_s = torch.tensor([time.perf_counter() - probe], dtype=torch.float64, device=device)
            dist.all_reduce(probe_s, op=dist.ReduceOp.MAX)  # every rank runs the same number of iterations
            iters = timed_iterations(cfg, float(probe_s.item()))
            dist.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                _run_op(op, buf, out)
            sync()
            marks.measured(time.perf_counter() - start)
            elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            seconds = float(elapsed.item())
            nbytes = total * 4
            algbw = gbyte_per_s(nbytes, seconds)
            rows.append(CollectiveRow(op, nbytes, seconds, algbw, algbw * bus_factor(op, world)))
    result = None
    if rank == 0:
        import platform

        result = CollectivesResult(
            world_size=world,
            rows=rows,
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            backend=backend,
            device=device.type,
            versions={"python": platform.python_version(), "torch": torch.__version__, "backend": backend,
                      "nccl": ".".join(map(str, torch.cuda.nccl.version())) if use_cuda else None},
            fabric=cfg.fabric,
        )
    finish(result, cfg.result_path)
    return result


@record  # torchrun's failure summary then names the rank's exception, not just its exit code
def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, __doc__.splitlines()[0], CollectivesConfig.load, run)


if __name__ == "__main__":
    sys.exit(main())
