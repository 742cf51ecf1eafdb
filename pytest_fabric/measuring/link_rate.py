"""The per-node link rate collective bandwidth is held to, and where that figure comes from.

On a real cluster the rate a fabric's busbw must approach is what its NICs carry, neither the
emulated cluster's shaped rate (2 Gbit/s for ib: a 400 Gbit/s NDR port at 10% of its rate would
pass) nor a preset's nominal one (8 x 400 NDR: a node with a port down, or cabled at HDR, would be
failed for what it is). So the rate comes, first found wins:

1. the user's declaration (``--fabric-link-gbit ib=3200``, ``Fabric.declared_gbit``): they know
   their cluster, and it is the only way to state a rate sysfs cannot show;
2. on the emulated cluster, the rate ``tc`` shapes every node's link to: exactly what the link
   carries, while its sysfs shows the veth's fictional 10000 Mb/s;
3. on a real cluster, the nodes' own NIC inventory from sysfs (the pre-flight probe's
   ``NodeFacts``): per node, the sum over the ports or interfaces NCCL would use, and of the nodes,
   the slowest, since a collective moves at the pace of its slowest link.

Nothing else: where neither a declaration nor every node's inventory is at hand, a real cluster has
no rate to gate against (``missing_rate`` says how to declare one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.fabrics import Fabric
from ..core.units import mbit_to_gbit
from .nccl_evidence import fabric_kind
from .preflight import NodeFacts, socket_interfaces, usable_ports

DECLARED = "declared --fabric-link-gbit"
EMULATED = "the emulated cluster's shaped link"


@dataclass(frozen=True)
class LinkRate:
    """One node's link rate for a fabric, Gbit/s, and where it comes from (``DECLARED``,
    ``"sysfs of node3"``, ``EMULATED``): a failure must say which figure it held busbw to."""

    gbit: float
    source: str

    def __str__(self) -> str:
        return f"{self.gbit:g} Gbit/s ({self.source})"


def node_gbit(fabric: Fabric, facts: NodeFacts) -> float | None:
    """What the ports (ib, roce, efa) or interfaces (eth) NCCL would use for ``fabric`` on this node
    carry together, Gbit/s; None where none of them reports a rate. NCCL sees the node's environment
    with the fabric's settings on top, as ranks get it (``check``)."""
    env = {**facts.env, **fabric.nccl_env}
    kind = fabric_kind(fabric)
    if kind == "eth":
        rates = [mbit_to_gbit(facts.speeds[n]) for n in socket_interfaces(facts, env)
                 if n in facts.speeds and facts.operstate.get(n) != "down"]
    else:
        rates = [p.gbit for p in usable_ports(kind, facts, env).values() if p.gbit]
    return sum(rates) or None


def inventoried(fabric: Fabric, nodes: Sequence[NodeFacts]) -> LinkRate | None:
    """The slowest node's rate, named by its node; None unless every node shows one (an unknown
    node may be the slowest)."""
    rates = [(node_gbit(fabric, facts), facts.host) for facts in nodes]
    if not rates or any(gbit is None for gbit, _ in rates):
        return None
    gbit, host = min(rates)
    return LinkRate(gbit, f"sysfs of {host}")


def link_rate(fabric: Fabric, nodes: Sequence[NodeFacts], emulated: bool) -> LinkRate | None:
    """``fabric``'s per-node rate: declared, else the emulated link's shaped rate on the emulated
    cluster, else inventoried from ``nodes``' sysfs; None where none is known."""
    if fabric.declared_gbit:
        return LinkRate(fabric.declared_gbit, DECLARED)
    if emulated:
        return LinkRate(mbit_to_gbit(fabric.emulated_mbit), EMULATED)
    return inventoried(fabric, nodes)


def missing_rate(fabric: Fabric, cluster: str) -> str:
    """Why a link-rate gate cannot judge ``fabric`` on a real cluster, and how to give it a rate."""
    example = f"{fabric.name}={fabric.nominal_gbit or 400:g}"
    return (f"no link rate known for fabric {fabric.name} on the {cluster} cluster (none declared, and not every "
            f"node's sysfs shows the rate of its {fabric.name} NICs): declare the per-node rate in Gbit/s, e.g. "
            f"--fabric-link-gbit {example} (ini: fabric_link_gbit = {example})")
