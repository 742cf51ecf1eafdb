"""The analytical step model: what the fabric should cost a configuration, before (or instead of) measuring it.

A comparison is only worth running, and a gate only worth its threshold, if the configuration can
show the fabric at all. This module is the analytical model that says which: from the model's
size and FLOPs, the shape of the job, the compute throughput a GPU (or CPU rank) achieves and the
link rates, it predicts the step time, what bounds it, and how much slower a slower fabric makes it.

The model (CONTEXT.md, "Why the fabric sometimes does not matter"):

- FSDP full-shard moves (n-1)/n x N x (2 b_param + b_grad) bytes per rank per step: an
  all-gather of the parameters in forward, another in backward, a reduce-scatter of the gradients.
- NCCL's ring crosses each node boundary once per channel, so a whole node pushes about one rank's
  share across the fabric, spread over its NICs: the usable inter-node bandwidth is one node's
  aggregate NIC bandwidth. A ring runs at the pace of its slowest edge, so with several GPUs per
  node the collective takes max(fabric time, intra-node time).
- FSDP prefetches the next layer's all-gather while the current layer computes, so per layer the
  step pays max(compute, transfer). What cannot overlap is the first all-gather (before any
  compute) and the last reduce-scatter (after all compute). Going from one node to several adds a
  fixed coordination overhead on any fabric; it is not a bandwidth effect.
- Bounds: max(T_compute, T_comm) + exposed <= T_step <= T_compute + T_comm + exposed (plus the
  overhead on both sides), where T_comm is the traffic that can overlap.

``predict`` re-exports every name here and ``comparison``'s (the model next to a measured comparison).

Plain standard library; no torch: the plugin predicts while collecting tests, long before any launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ..core.models import ModelSpec
from ..core.units import gbit_to_bytes_per_s

__all__ = [
    "BYTES_PER_DTYPE",
    "COMMUNICATION_BOUND_ABOVE",
    "COMPUTE_BOUND_BELOW",
    "DEFAULT_LINK_EFFICIENCY",
    "DEFAULT_RESOLUTION",
    "JobShape",
    "Observation",
    "Penalty",
    "Prediction",
    "bytes_per_param",
    "fsdp_bytes_per_rank",
    "predict_penalty",
    "predict_step",
    "recorded_bytes",
]

BYTES_PER_DTYPE = {"bf16": 2, "fp16": 2, "fp32": 4}

# Fraction of the line rate a large collective reaches: nccl-tests show ~80-90 Gb/s busbw on a
# healthy 100 GbE link and ~180-190 Gb/s on HDR IB; gloo reached ~88% of a tbf-shaped link here.
DEFAULT_LINK_EFFICIENCY = 0.9

# Traffic / compute below which a step is compute-bound (the traffic hides behind compute with
# room to spare), and above which it is communication-bound (no overlap can hide it).
COMPUTE_BOUND_BELOW = 0.5
COMMUNICATION_BOUND_ABOVE = 1.0

# A predicted slowdown smaller than this is within launch-to-launch noise: no gate can see it.
DEFAULT_RESOLUTION = 0.02


def bytes_per_param(dtype: str) -> int:
    try:
        return BYTES_PER_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(BYTES_PER_DTYPE)}") from None


# torch's dtype names, as a measurement records them ("dtype", "reduce_dtype").
_TORCH_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def recorded_bytes(result: Any) -> tuple[int, int]:
    """(parameter bytes, gradient bytes) per element of what a measurement ran: its compute dtype
    and its reduce dtype (default: the compute dtype); 2 where either is unknown. ``result``: a
    ``TrainResult`` or its dict form."""
    get = result.get if isinstance(result, dict) else (lambda name: getattr(result, name, None))
    param = _TORCH_DTYPE_BYTES.get(str(get("dtype")), 2)
    return param, _TORCH_DTYPE_BYTES.get(str(get("reduce_dtype")), param)


def fsdp_bytes_per_rank(params: float, world: int, param_bytes: float = 2, grad_bytes: float = 2,
                        root_params: float = 0) -> float:
    """Bytes one rank sends (and receives) per step under FSDP full-shard.

    (n-1)/n x N x (2 b_param + b_grad): parameters gathered in forward and again in backward,
    gradients reduce-scattered once. Zero on a single rank. ``root_params`` of the ``params``
    belong to a unit that stays gathered from forward through backward (FSDP2 does not reshard the
    root module after forward: the embeddings and head) and are gathered once:
    (n-1)/n x (N_root (b_param + b_grad) + (N - N_root)(2 b_param + b_grad)).
    """
    if world < 1:
        raise ValueError(f"world size must be at least 1, got {world}")
    if not 0 <= root_params <= params:
        raise ValueError(f"root_params must be between 0 and params, got {root_params}")
    share = (world - 1) / world
    return share * ((params - root_params) * (2 * param_bytes + grad_bytes) + root_params * (param_bytes + grad_bytes))


@dataclass(frozen=True)
class JobShape:
    """What one step of a job computes and moves, whatever the link it runs on: the model, nodes and
    ranks per node, tokens per rank (``batch`` x ``seq``, default the model's own shape), bytes per
    parameter and per gradient (``dtype``, or ``param_bytes`` / ``grad_bytes`` where they differ:
    bf16 parameters with fp32 gradient reduction are 2 and 4), and whether the forward is
    recomputed (activation checkpointing). The one spelling of a job's shape: predictions, fits,
    calibration and the audit all take one."""

    spec: ModelSpec
    nodes: int
    gpus_per_node: int = 1
    batch: int | None = None
    seq: int | None = None
    dtype: str = "bf16"
    param_bytes: float | None = None
    grad_bytes: float | None = None
    activation_checkpointing: bool = False

    def __hash__(self) -> int:  # ModelSpec holds a dict: hash by its name (equal shapes have equal names)
        return hash((self.spec.name, self.nodes, self.gpus_per_node, self.batch, self.seq, self.dtype,
                     self.param_bytes, self.grad_bytes, self.activation_checkpointing))

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank processes per step."""
        return (self.batch or self.spec.batch_size) * (self.seq or self.spec.seq_len)

    @property
    def bytes(self) -> tuple[float, float]:
        """(bytes per parameter, bytes per gradient element)."""
        return (bytes_per_param(self.dtype) if self.param_bytes is None else self.param_bytes,
                bytes_per_param(self.dtype) if self.grad_bytes is None else self.grad_bytes)

    def flops(self) -> float:
        """FLOPs one rank computes per step (8N per token with the forward recomputed, else 6N)."""
        seq = self.seq or self.spec.seq_len
        f = self.tokens_per_rank * self.spec.flops_per_token(seq)
        return f * (8.0 / 6.0 if self.activation_checkpointing else 1.0)

    def with_nodes(self, nodes: int) -> JobShape:
        return replace(self, nodes=nodes)


@dataclass(frozen=True)
class Prediction:
    step_s: float
    compute_s: float
    # Traffic that can overlap with compute (prefetched all-gathers, reduce-scatters behind the
    # next layer's backward).
    comm_s: float
    # Traffic that cannot: the first all-gather and the last reduce-scatter.
    exposed_s: float
    overhead_s: float
    tokens_per_s: float
    bound: str  # "compute", "communication" or "overlap"
    lower_s: float
    upper_s: float
    world: int = 1
    # What the timing assumes each rank moves: the root unit (embeddings, head) gathered once.
    bytes_per_rank: float = 0.0

    @property
    def traffic_s(self) -> float:
        """All transfer time, overlappable or not."""
        return self.comm_s + self.exposed_s

    @property
    def traffic_ratio(self) -> float:
        """Transfer time over compute time: << 1 hides behind compute, > 1 cannot."""
        return self.traffic_s / self.compute_s if self.compute_s > 0 else math.inf

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.world

    def summary(self) -> str:
        return (f"{self.tokens_per_s:.1f} tokens/s, step {self.step_s * 1000:.1f} ms = compute "
                f"{self.compute_s * 1000:.1f} ms, transfer {self.traffic_s * 1000:.1f} ms "
                f"({self.exposed_s * 1000:.1f} exposed), overhead {self.overhead_s * 1000:.1f} ms: "
                f"{self.bound}-bound")


def _bound(traffic_s: float, compute_s: float) -> str:
    if compute_s <= 0:
        return "communication" if traffic_s > 0 else "compute"
    r = traffic_s / compute_s
    if r < COMPUTE_BOUND_BELOW:
        return "compute"
    if r > COMMUNICATION_BOUND_ABOVE:
        return "communication"
    return "overlap"


def predict_step(
    shape: JobShape,
    *,
    flops_per_s: float,
    inter_gbit: float | None = None,
    intra_gbit: float | None = None,
    link_efficiency: float = DEFAULT_LINK_EFFICIENCY,
    overhead_s: float = 0.0,
) -> Prediction:
    """Predicted FSDP full-shard step of ``shape``: nodes x gpus_per_node ranks, batch x seq tokens
    per rank per step.

    ``flops_per_s``: the compute throughput one rank achieves (not the datasheet peak).
    ``inter_gbit``: one node's aggregate NIC rate in Gbit/s (the fabric; required with > 1 node).
    ``intra_gbit``: per-GPU intra-node rate in Gbit/s (NVLink; H100 ~3600 per direction); None:
    never the bottleneck. Both are scaled by ``link_efficiency``. ``overhead_s`` is added per step
    once the job spans more than one node. Activation checkpointing recomputes the forward: 8N
    instead of 6N.
    """
    spec, nodes, gpus_per_node = shape.spec, shape.nodes, shape.gpus_per_node
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be at least 1, got {nodes} and {gpus_per_node}")
    if flops_per_s <= 0:
        raise ValueError(f"flops_per_s must be positive, got {flops_per_s}")
    if nodes > 1 and not (inter_gbit and inter_gbit > 0):
        raise ValueError(f"{nodes} nodes need a positive inter-node rate inter_gbit, got {inter_gbit}")
    if not 0 < link_efficiency <= 1:
        raise ValueError(f"link_efficiency must be in (0, 1], got {link_efficiency}")
    pb, gb = shape.bytes
    world = nodes * gpus_per_node
    layers = spec.layers
    total, non_embedding = spec.param_count()
    layer_params = non_embedding / layers
    root_params = total - non_embedding  # embeddings and head: the root FSDP unit

    # Seconds per byte of a collective's per-rank share: the ring's slowest edge sets the pace.
    rates = []
    if nodes > 1:
        rates.append(gbit_to_bytes_per_s(inter_gbit) * link_efficiency)
    if gpus_per_node > 1 and intra_gbit:
        rates.append(gbit_to_bytes_per_s(intra_gbit) * link_efficiency)
    spb = 1.0 / min(rates) if rates else 0.0
    share = (world - 1) / world

    def gather(params: float) -> float:
        return share * params * pb * spb

    def scatter(params: float) -> float:
        return share * params * gb * spb

    tokens = shape.tokens_per_rank
    compute_s = shape.flops() / flops_per_s
    compute_l = compute_s / layers
    a_l, r_l = gather(layer_params), scatter(layer_params)
    # Exposed: the root unit's and the first layer's all-gather before any compute, the first
    # layer's and the root's reduce-scatter after all of it (the root stays gathered through
    # backward, so it is gathered once).
    exposed_s = gather(root_params) + a_l + r_l + scatter(root_params)
    # Overlappable, per layer: layer 0 keeps only its backward re-gather, every other layer its
    # forward gather, backward re-gather and gradient reduce-scatter.
    comm_layers = [a_l] + [2 * a_l + r_l] * (layers - 1)
    comm_s = sum(comm_layers)
    overlapped_s = sum(max(compute_l, m) for m in comm_layers)
    overhead = overhead_s if nodes > 1 else 0.0
    step_s = overlapped_s + exposed_s + overhead
    return Prediction(
        step_s=step_s,
        compute_s=compute_s,
        comm_s=comm_s,
        exposed_s=exposed_s,
        overhead_s=overhead,
        tokens_per_s=world * tokens / step_s,
        bound=_bound(comm_s + exposed_s, compute_s),
        lower_s=max(compute_s, comm_s) + exposed_s + overhead,
        upper_s=compute_s + comm_s + exposed_s + overhead,
        world=world,
        bytes_per_rank=fsdp_bytes_per_rank(total, world, pb, gb, root_params=root_params),
    )


@dataclass(frozen=True)
class Penalty:
    """What the slow fabric is predicted to cost against the fast one, for one configuration."""

    ratio: float  # slow tokens/s / fast tokens/s (1.0: no difference)
    label: str  # "single-node", "compute-bound", "overlap-bound" or "communication-bound"
    message: str
    fast: Prediction
    slow: Prediction
    # False where the predicted gap is below launch-to-launch noise: no gate can see the fabric.
    distinguishable: bool

    @property
    def slowdown(self) -> float:
        """Fraction of tokens/s the slow fabric loses (0.25: 25% fewer tokens/s)."""
        return 1.0 - self.ratio

    @property
    def advantage(self) -> float:
        """How much faster the fast fabric is (fast/slow - 1), the quantity ``assert_ahead`` gates."""
        return 1.0 / self.ratio - 1.0


def predict_penalty(
    shape: JobShape,
    *,
    flops_per_s: float,
    fast_gbit: float,
    slow_gbit: float,
    resolution: float = DEFAULT_RESOLUTION,
    **options,
) -> Penalty:
    """Predicted slow/fast tokens/s ratio and what it means for a gate.

    ``resolution``: the smallest slowdown launch-to-launch noise lets a gate see. A configuration
    whose predicted slowdown is below it is labelled compute-bound (or single-node): a comparison
    there "cannot tell the fabrics apart", so it can only check that the slow fabric keeps up
    (``assert_within``), never that the fast one is worth having (``assert_ahead``). Other
    ``options`` (intra_gbit, link_efficiency, overhead_s) go to ``predict_step`` for both fabrics.
    """
    fast = predict_step(shape, flops_per_s=flops_per_s, inter_gbit=fast_gbit, **options)
    slow = predict_step(shape, flops_per_s=flops_per_s, inter_gbit=slow_gbit, **options)
    ratio = slow.tokens_per_s / fast.tokens_per_s
    slowdown = 1.0 - ratio
    name, nodes = shape.spec.name, shape.nodes
    if nodes == 1:
        label = "single-node"
        message = f"{name} on one node: no traffic crosses the fabric; cannot tell the fabrics apart"
    elif slowdown < resolution:
        label = "compute-bound"
        message = (f"{name} on {nodes} nodes is compute-bound (slow-fabric transfer "
                   f"{slow.traffic_ratio * 100:.1f}% of compute): predicted slowdown {slowdown * 100:.1f}% "
                   f"< {resolution * 100:g}% noise; cannot tell the fabrics apart")
    else:
        label = "communication-bound" if slow.bound == "communication" else "overlap-bound"
        message = (f"{name} on {nodes} nodes is {label} on the slow fabric (transfer "
                   f"{slow.traffic_ratio:.2f}x compute): predicted {slowdown * 100:.1f}% fewer tokens/s "
                   f"(fast fabric {(1 / ratio - 1) * 100:.1f}% ahead)")
    return Penalty(ratio, label, message, fast, slow, distinguishable=label in ("overlap-bound", "communication-bound"))


# --------------------------------------------------------------------------------------------
# Calibration against measurements on the emulated cluster (link rates known)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One measured configuration: its shape, the links it ran on and its median step time."""

    shape: JobShape
    step_s: float
    inter_gbit: float | None = None  # the link rate it ran on (emulated: fabric.emulated_mbit / 1000)
    intra_gbit: float | None = None

    def predict(self, flops_per_s: float, overhead_s: float, link_efficiency: float) -> Prediction:
        return predict_step(self.shape, flops_per_s=flops_per_s, inter_gbit=self.inter_gbit,
                            intra_gbit=self.intra_gbit, link_efficiency=link_efficiency, overhead_s=overhead_s)

    def flops(self) -> float:
        """FLOPs one rank computes per step."""
        return self.shape.flops()
