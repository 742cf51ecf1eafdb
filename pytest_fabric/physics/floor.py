"""The physical floor: the shortest step a sharded job can take on a given fabric link.

A fabric gate is only worth running if a green result means the traffic crossed the fabric the
test names. Whatever the collective algorithm (ring, tree, in-network reduction), every byte of
the parameters a node does not hold must enter it before it can compute with them, and the node's
own gradient contribution to every shard it does not hold must leave it. Those bytes over the
node's link rate are a hard lower bound on the step; a measured step shorter than that did not
cross that link (or the link is faster than declared). ``step_model.py`` and ``comparison.py`` model how long a step
*should* take; this module says what no step *can* undercut, so a contradiction is an error.

Per node and per step, with n nodes, P the parameter bytes gathered per step and G the gradient
bytes (the node's GPUs first combine over NVLink, so the node, not each GPU, is what counts):

- full shard (FSDP2 ``fully_shard``, FSDP1 ``FULL_SHARD``): parameters gathered in forward and
  again in backward, except the root unit (embeddings, head), which stays gathered through
  backward: P = b_param (2 N - N_root). In >= (n-1)/n P (the foreign shards) + G/n (the node's
  own reduced shard, however it was reduced); out >= (n-1)/n G (its contributions to the foreign
  shards) + P/n (its own shard, sent at least once even with multicast).
- no reshard after forward (``reshard_after_forward=False``, FSDP1 ``SHARD_GRAD_OP``): P = b_param N.
- hybrid (HSDP: sharded inside a node, replicated across nodes): only the gradients cross
  nodes, as an all-reduce: every element's result depends on the other nodes and every node's
  contribution is needed elsewhere, so in >= G and out >= G (in-network reduction reaches it;
  a ring moves 2 (n-1)/n G).

The link is full duplex, so the floor is the larger direction over the rate. The bandwidth suite
obeys the same physics: a collective payload whose bytes need more than the link's rate is flagged
(``impossible_payloads``). Plain standard library: the plugin and ``pytest-fabric audit`` both use
it without torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..core.models import ModelSpec
from ..core.units import gbit_per_s, transfer_s

__all__ = ["DEFAULT_RATE_TOLERANCE", "SHARDINGS", "Floor", "collective_node_gbit", "floor_for", "impossible_payloads",
           "node_bytes", "run_floor", "transport_hint"]

SHARDINGS = {
    "full": "FSDP full shard",
    "no-reshard": "FSDP without reshard after forward",
    "hybrid": "hybrid sharding (HSDP)",
}

# How far a measurement may appear to beat the declared link rate before it is an error: a
# declared rate is a line rate with some rounding (400 Gb/s NDR, "100 GbE"), and a step time is
# measured with some noise. Stated in every floor line.
DEFAULT_RATE_TOLERANCE = 0.10


def node_bytes(params: float, nodes: int, param_bytes: float = 2, grad_bytes: float = 2,
               root_params: float = 0, sharding: str = "full", grad_accum: int = 1) -> tuple[float, float]:
    """(bytes into, bytes out of) one node per step that no collective algorithm can avoid.

    ``params``: all parameters; ``root_params`` of them stay gathered from forward through backward
    under full shard (FSDP's root unit). ``grad_accum`` micro-batches per step gather the other
    parameters once more each (every backward; the first forward) and reduce once. Zero on one node.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown sharding {sharding!r}; known: {', '.join(SHARDINGS)}")
    if not 0 <= root_params <= params:
        raise ValueError(f"root_params must be between 0 and params, got {root_params}")
    if nodes == 1:
        return 0.0, 0.0
    grads = params * grad_bytes
    if sharding == "hybrid":
        return grads, grads
    gathered = params * param_bytes * (1 if sharding == "no-reshard" else grad_accum + 1) - (
        root_params * param_bytes * grad_accum if sharding == "full" else 0)
    share = (nodes - 1) / nodes
    return share * gathered + grads / nodes, share * grads + gathered / nodes


@dataclass(frozen=True)
class Floor:
    """The floor of one configuration on one link."""

    nodes: int
    bytes_in: float  # per node per step
    bytes_out: float
    link_gbit: float  # the node's link rate, per direction
    sharding: str = "full"
    tolerance: float = DEFAULT_RATE_TOLERANCE

    @property
    def bytes(self) -> float:
        """The busier direction's bytes: what the full-duplex link must carry one way."""
        return max(self.bytes_in, self.bytes_out)

    @property
    def step_s(self) -> float:
        """The shortest possible step on this link."""
        return transfer_s(self.bytes, self.link_gbit)

    def implied_gbit(self, step_s: float) -> float:
        """The per-node rate a measured step needs: the floor's bytes over the step."""
        if not step_s > 0:
            raise ValueError(f"a step must be positive, got {step_s}")
        return gbit_per_s(self.bytes, step_s)

    def impossible(self, step_s: float) -> bool:
        """The step needs more than the link (plus the tolerance) can carry."""
        return self.nodes > 1 and self.implied_gbit(step_s) > self.link_gbit * (1 + self.tolerance)

    def line(self, step_s: float, fabric: str) -> str:
        """Measured next to the floor, for the test's output."""
        if self.nodes == 1:
            return f"floor: {fabric} one node: nothing has to cross the fabric"
        verdict = "IMPOSSIBLE" if self.impossible(step_s) else "plausible"
        return (f"floor: {fabric} measured {_ms(step_s)}/step >= floor {_ms(self.step_s)}/step over {fabric}'s "
                f"{_gbit(self.link_gbit)} Gbit/s link ({_size(self.bytes)} per node per step for "
                f"{SHARDINGS[self.sharding]} on {self.nodes} nodes; the step needs {_gbit(self.implied_gbit(step_s))} "
                f"Gbit/s per node, {self.implied_gbit(step_s) / self.link_gbit:.0%} of the link; tolerance "
                f"{self.tolerance:.0%}): {verdict}")

    def problem(self, step_s: float, fabric: str, hint: str = "") -> str | None:
        """The error message for a step faster than the floor, None for a plausible one."""
        if not self.impossible(step_s):
            return None
        more = f" ({hint})" if hint else ""
        return (f"{fabric}: {step_s:.3g} s/step needs >= {_gbit(self.implied_gbit(step_s))} Gbit/s per node "
                f"across the fabric; {fabric}'s link is {_gbit(self.link_gbit)} Gbit/s: this traffic did not "
                f"cross {fabric}{more}")


def floor_for(spec: ModelSpec, nodes: int, link_gbit: float, *, param_bytes: float = 2, grad_bytes: float = 2,
              sharding: str = "full", tolerance: float = DEFAULT_RATE_TOLERANCE, grad_accum: int = 1) -> Floor:
    """The floor of ``spec`` trained on ``nodes`` nodes linked at ``link_gbit`` per node, per step of
    ``grad_accum`` micro-batches."""
    if not (link_gbit and 0 < link_gbit < math.inf):
        raise ValueError(f"a floor needs a positive link rate, got {link_gbit}")
    total, non_embedding = spec.param_count()
    b_in, b_out = node_bytes(total, nodes, param_bytes, grad_bytes, root_params=total - non_embedding,
                             sharding=sharding, grad_accum=grad_accum)
    return Floor(nodes, b_in, b_out, link_gbit, sharding, tolerance)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _gbit(gbit: float) -> str:
    return f"{gbit:.3g}" if gbit < 100 else f"{gbit:.0f}"


def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def run_floor(spec: ModelSpec, nodes: int, link_gbit: float, result: object,
              tolerance: float = DEFAULT_RATE_TOLERANCE) -> Floor:
    """The floor of a measured run: its model and nodes, and the parameter and gradient precision
    the run recorded (``result``: a ``TrainResult``), its sharding and micro-batches per step. FSDP2
    ``fully_shard`` and FSDP1 as the workload runs them reshard after forward."""
    from .step_model import recorded_shape

    shape = recorded_shape(spec, nodes, result)
    param_bytes, grad_bytes = shape.bytes
    return floor_for(spec, nodes, link_gbit, param_bytes=param_bytes, grad_bytes=grad_bytes, tolerance=tolerance,
                     sharding=shape.sharding, grad_accum=shape.grad_accum)


def transport_hint(nccl_env: dict, rate_source: str) -> str:
    """Where the bytes may have gone instead, for a fabric with these NCCL settings whose rate is
    ``rate_source``: where the rate comes from, "declared ..." (fabric_link_gbit), "nominal" (the
    preset's), or one measured (the emulated link's, a node's sysfs: no other rate to suspect)."""
    if nccl_env.get("NCCL_NET") == "Socket":
        hint = "check NCCL's socket interface: NCCL prefers ib* interfaces"
    else:
        hint = "check which transport and NICs NCCL used"
    if rate_source.startswith("declared"):
        hint += "; or the link is faster than its declared fabric_link_gbit"
    elif rate_source == "nominal":
        hint += "; or the link is faster than the fabric's nominal rate: declare it with fabric_link_gbit"
    return hint


def collective_node_gbit(op: str, nbytes: float, time_s: float, nodes: int) -> float:
    """The per-node rate a collective of ``nbytes`` (nccl-tests' bytes) in ``time_s`` needs across
    ``nodes`` nodes, whatever the algorithm: all_reduce and broadcast at least the whole buffer into
    each node (in-network reduction included), all_gather the (n-1)/n of it the node lacks,
    reduce_scatter the (n-1)/n of its contribution the other nodes own. With one rank per node and
    two nodes this is nccl-tests' busbw."""
    if not time_s > 0:
        raise ValueError(f"a collective's time must be positive, got {time_s}")
    share = 1.0 if op in ("all_reduce", "broadcast") else (nodes - 1) / nodes
    return gbit_per_s(share * nbytes, time_s)


def impossible_payloads(rows: Iterable[Any], nodes: int, link_gbit: float,
                        tolerance: float = DEFAULT_RATE_TOLERANCE) -> list[str]:
    """One description per collective row (``op``, ``bytes``, ``time_s``, ``busbw_gbit``) that needs
    more than the link (plus the tolerance) can carry."""
    if nodes < 2:
        return []
    out = []
    for r in rows:
        needed = collective_node_gbit(r.op, r.bytes, r.time_s, nodes)
        if needed > link_gbit * (1 + tolerance):
            out.append(f"{r.op} at {_size(r.bytes)} needs >= {_gbit(needed)} Gbit/s per node "
                       f"(busbw {_gbit(r.busbw_gbit)} Gbit/s)")
    return out
