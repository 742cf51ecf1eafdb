"""The analytical step model: what the fabric should cost a configuration, before (or instead of) measuring it.

A comparison is only worth running, and a gate only worth its threshold, if the configuration can
show the fabric at all. This module is the analytical model that says which: from the model's
size and FLOPs, the shape of the job, the compute throughput a GPU (or CPU rank) achieves and the
link rates, it predicts the step time, what bounds it, and how much slower a slower fabric makes it.

The model (CONTEXT.md, "Why the fabric sometimes does not matter"):

- FSDP full-shard moves (n-1)/n x N x (2 b_param + b_grad) bytes per rank per step: an
  all-gather of the parameters in forward, another in backward, a reduce-scatter of the gradients.
  Hybrid sharding (HSDP) gathers and reduce-scatters within a node and crosses nodes only with an
  all-reduce of each rank's gradient shard among the ranks holding the same shard, one per node:
  2 (n-1)/n x N x b_grad per node. Gradient accumulation over k micro-batches gathers in the first
  forward and every backward (the parameters stay unsharded between micro-batches) and reduces once.
  gloo runs a reduce-scatter as an all-reduce (its reduce_scatter busbw is half its all_reduce's on
  the same link), so its gradients cost twice a ring reduce-scatter (``RING_BYTES``).
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
    "node_traffic_bytes",
    "predict_penalty",
    "predict_step",
    "recorded_bytes",
    "recorded_shape",
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

# Bytes one rank sends per byte of a collective's whole buffer, for a ring over w ranks, by backend:
# NCCL's rings move (w-1)/w for an all-gather or a reduce-scatter and 2 (w-1)/w for an all-reduce;
# gloo runs a reduce-scatter as an all-reduce (measured: its reduce_scatter busbw is half its
# all_reduce busbw at every payload, benchmarks/results/default-nodes2-*.txt).
RING_BYTES = {
    "nccl": {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0},
    "gloo": {"all_gather": 1.0, "reduce_scatter": 2.0, "all_reduce": 2.0},
}


def ring_bytes(op: str, ranks: int, backend: str = "nccl") -> float:
    """Bytes one rank of a ring over ``ranks`` sends per byte of the collective's whole buffer."""
    if ranks <= 1:
        return 0.0
    return RING_BYTES.get(backend, RING_BYTES["nccl"])[op] * (ranks - 1) / ranks


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
    sharding: str = "full"  # "full" or "hybrid" (HSDP: sharded within a node, replicated across nodes)
    grad_accum: int = 1  # micro-batches per optimizer step (a step is an optimizer step)
    backend: str = "nccl"  # the collectives' library: its algorithms set the bytes (RING_BYTES)

    def __hash__(self) -> int:  # ModelSpec holds a dict: hash by its name (equal shapes have equal names)
        return hash((self.spec.name, self.nodes, self.gpus_per_node, self.batch, self.seq, self.dtype,
                     self.param_bytes, self.grad_bytes, self.activation_checkpointing, self.sharding,
                     self.grad_accum, self.backend))

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def tokens_per_rank(self) -> int:
        """Tokens one rank processes per (optimizer) step: every micro-batch's."""
        return (self.batch or self.spec.batch_size) * (self.seq or self.spec.seq_len) * self.grad_accum

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


def recorded_shape(spec: ModelSpec, nodes: int, result: Any, gpus_per_node: int = 1) -> JobShape:
    """The shape a measurement ran (a ``TrainResult`` or its dict form): ranks per node, batch and
    sequence, bytes per parameter and gradient, activation checkpointing, sharding, micro-batches per
    step and the collectives' backend, each as recorded (``gpus_per_node`` where none was)."""
    get = result.get if isinstance(result, dict) else (lambda name: getattr(result, name, None))
    param_bytes, grad_bytes = recorded_bytes(result)
    return JobShape(spec, nodes, int(get("local_world_size") or gpus_per_node), get("batch_size"), get("seq_len"),
                    param_bytes=param_bytes, grad_bytes=grad_bytes,
                    activation_checkpointing=bool(get("activation_checkpointing")), sharding=get("sharding") or "full",
                    grad_accum=int(get("grad_accum") or 1),
                    backend=str((get("versions") or {}).get("backend") or "nccl"))


def node_traffic_bytes(shape: JobShape) -> float:
    """Bytes each node sends (and receives) across the fabric per optimizer step, as the collectives'
    rings move them (``RING_BYTES``): under full sharding a ring over every rank, whose node boundary
    carries one rank's share; under hybrid sharding one all-reduce of the gradients across nodes (a
    node's ranks each reduce their shard with its replicas). What a node's link counters read per step
    (``signals.LinkCounters``), protocol headers aside."""
    if shape.nodes <= 1:
        return 0.0
    pb, gb = shape.bytes
    total, non_embedding = shape.spec.param_count()
    root = total - non_embedding  # embeddings and head: the root unit, gathered once
    if shape.sharding == "hybrid":
        return ring_bytes("all_reduce", shape.nodes, shape.backend) * total * gb
    gathered = (shape.grad_accum + 1) * non_embedding + root
    return (ring_bytes("all_gather", shape.world, shape.backend) * gathered * pb
            + ring_bytes("reduce_scatter", shape.world, shape.backend) * total * gb)


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
    # What the timing assumes each node sends across the fabric per step (``node_traffic_bytes``).
    node_bytes: float = 0.0

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
    """Predicted FSDP step of ``shape``: nodes x gpus_per_node ranks, batch x seq tokens per rank per
    micro-batch, ``shape.grad_accum`` micro-batches per step, fully or hybrid sharded.

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

    # Seconds per byte at each link: the node's NICs and a GPU's NVLink (None: never the bottleneck).
    inter = 1.0 / (gbit_to_bytes_per_s(inter_gbit) * link_efficiency) if nodes > 1 else 0.0
    intra = 1.0 / (gbit_to_bytes_per_s(intra_gbit) * link_efficiency) if gpus_per_node > 1 and intra_gbit else 0.0
    backend = shape.backend
    if shape.sharding == "hybrid":
        # Gathers and reduce-scatters stay in the node; the gradient shards are then all-reduced across
        # nodes, the node's ranks sharing its NICs.
        def gather(params: float) -> float:
            return ring_bytes("all_gather", gpus_per_node, backend) * params * pb * intra

        def scatter(params: float) -> float:
            return (ring_bytes("reduce_scatter", gpus_per_node, backend) * params * gb * intra
                    + ring_bytes("all_reduce", nodes, backend) * params * gb * inter)
    else:
        spb = max(inter, intra)  # one ring over every rank: its slowest edge sets the pace

        def gather(params: float) -> float:
            return ring_bytes("all_gather", world, backend) * params * pb * spb

        def scatter(params: float) -> float:
            return ring_bytes("reduce_scatter", world, backend) * params * gb * spb

    tokens = shape.tokens_per_rank
    compute_s = shape.flops() / flops_per_s
    compute_l = compute_s / layers
    a_l, r_l = gather(layer_params), scatter(layer_params)
    # Exposed: the root unit's and the first layer's all-gather before any compute, the first
    # layer's and the root's reduce-scatter after all of it (the root stays gathered through
    # backward, so it is gathered once).
    exposed_s = gather(root_params) + a_l + r_l + scatter(root_params)
    # Overlappable, per layer: layer 0 keeps only its backward re-gathers, every other layer its
    # forward gather (the first micro-batch's: later ones find it unsharded), a re-gather in each
    # micro-batch's backward, and one gradient reduction.
    k = shape.grad_accum
    comm_layers = [k * a_l] + [(k + 1) * a_l + r_l] * (layers - 1)
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
        node_bytes=node_traffic_bytes(shape),
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
