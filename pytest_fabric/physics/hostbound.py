"""Is a GPU step host-bound? A host-bound step cannot tell fabrics apart.

When the GPU waits on Python (kernel launches of an eager step of a small model, a few tokens per
rank), the step's time is the host's, and a slower fabric's transfers hide in the GPU's idle time:
a parity gate on such a step would pass whatever the fabric. The rule (README "Host-bound steps"):

    a GPU step is host-bound when its GPU busy share (NVML utilization read after each step, the
    median over the launch's steps) is below ``BUSY_SHARE`` (80%), or, for a one-node launch, its MFU
    (output head counted, datasheet dense bf16 peak) is below ``MIN_MFU`` (25%).

The MFU criterion is for one-node launches only: across nodes a slow fabric lowers MFU by itself,
which is what a gate measures, not a host-bound step (the GPU busy share stays high there: NCCL's
kernels count as busy while they wait on the network). CPU runs are never judged (no busy share,
no MFU).

Calibration (qwen2.5-1.5b, seq 2048, bf16, one H200; MFU head counted): eager 2 x 2048: NVML 61-78%,
MFU 12.6-21.2% (kernels busy 57% of the step in torch.profiler): host-bound. Compiled 2 x 2048:
83-90%, 34%; eager 8 x 2048: 99-100%, 37.5%; compiled 8 x 2048: 99-100%, 51%: GPU-bound.

Standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from ..core.units import GIB

BUSY_SHARE = 0.80
MIN_MFU = 0.25


def step_load(launch: Any) -> tuple[float | None, float | None, bool]:
    """(MFU, GPU busy share, one node) of a launch: a ``measure.Measurement`` (its value's MFU) or a
    ``TrainResult`` (MFU at its median step); MFU and busy share are None where unknown."""
    result = getattr(launch, "result", launch)
    if hasattr(launch, "result"):
        mfu = launch.mfu
    else:
        mfu = result.mfu(result.tokens_per_step / statistics.median(result.step_s))
    busy = [b for b in result.signals.gpu_busy if b is not None]
    return mfu, (statistics.median(busy) if busy else None), not result.crosses_fabric


def host_bound(launches: Any) -> str:
    """Why the step of ``launches`` (one launch or several of the same configuration or comparison)
    is host-bound under the rule above, in one sentence; "" when it is not, or cannot be judged."""
    if not isinstance(launches, Iterable):
        launches = [launches]
    loads = [step_load(m) for m in launches if getattr(getattr(m, "result", m), "device", "cpu") == "cuda"]
    if not loads:
        return ""
    busy = [b for _, b, _ in loads if b is not None]
    mfus = [m for m, _, one_node in loads if m is not None and one_node]
    all_mfus = [m for m, _, _ in loads if m is not None]
    busy_share = statistics.median(busy) if busy else None
    mfu = statistics.median(mfus) if mfus else None
    if not ((busy_share is not None and busy_share < BUSY_SHARE) or (mfu is not None and mfu < MIN_MFU)):
        return ""
    shown = mfu if mfu is not None else (statistics.median(all_mfus) if all_mfus else None)
    figures = ", ".join(part for part in (f"{shown:.0%} MFU" if shown is not None else "",
                                          f"GPU busy {busy_share:.0%}" if busy_share is not None else "") if part)
    return f"the step is host-bound: {figures}; a slower fabric can hide behind it"


# --- The step's figures every renderer shows per configuration ---------------------------------------


def configuration_mfu(launches: Any, tokens_per_s: float) -> float | None:
    """MFU of a configuration at its value ``tokens_per_s`` (models.MFU_CONVENTION); None on CPU."""
    return launches[0].result.mfu(tokens_per_s)


def mfu_peak(launches: Any) -> str | None:
    """The peak MFU is taken against, as every output names it ("H200 SXM 989 TFLOP/s dense bf16");
    None on CPU."""
    r = launches[0].result
    return f"{r.peak_gpu} {r.peak_flops_per_gpu / 1e12:g} TFLOP/s dense bf16" if r.peak_flops_per_gpu else None


def mfu_text(mfu: float | None) -> str:
    """MFU as the tables show it: "43.9%", or "n/a" where there is no GPU peak (columns stay put)."""
    return "n/a" if mfu is None else f"{mfu * 100:.1f}%"


def peak_memory_gib(launches: Any) -> float | None:
    """The largest peak memory per rank over a configuration's launches, GiB (GPU: the caching
    allocator's peak; CPU: the peak resident set); None where no launch recorded one (results
    written before peak memory was)."""
    peak = max(m.result.peak_memory_bytes for m in launches)
    return peak / GIB if peak else None


def gib_text(gib: float | None) -> str:
    """Peak memory as the tables show it: "90.0", or "n/a" where a night did not record it."""
    return "n/a" if gib is None else f"{gib:.1f}"


def link_bytes_per_step(launches: Any) -> float | None:
    """Bytes the busiest node's fabric link moved per measured step (the larger direction, the mean
    over every step of the launches, ``signals.LinkCounters``); None where no launch counted them."""
    steps = [max(tx, rx) for m in launches
             for tx, rx in zip(m.result.signals.link_tx_bytes, m.result.signals.link_rx_bytes)]
    return statistics.fmean(steps) if steps else None


def model_bytes_per_step(launches: Any) -> float | None:
    """What the traffic model counts each node sends across the fabric per step of what the launches
    ran (``step_model.node_traffic_bytes``), set beside ``link_bytes_per_step``; None for a model
    the catalog does not know."""
    from ..core.models import get_model
    from .step_model import node_traffic_bytes, recorded_shape

    first = launches[0]
    try:
        spec = get_model(first.case.model)
    except (KeyError, ValueError):
        return None
    return node_traffic_bytes(recorded_shape(spec, first.case.nodes, first.result))

