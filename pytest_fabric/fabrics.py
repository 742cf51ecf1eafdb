"""Named interconnect fabrics: the one table of what each fabric means.

A fabric has two faces. On a real GPU cluster it is a set of NCCL environment variables that force
one transport (``NCCL_NET`` makes a missing fabric fail at start instead of silently falling back
to sockets). On the emulated cluster it is a link rate: every emulated node's NIC is shaped to it.
Both live here so that a fabric's meaning is written down once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping


@dataclass(frozen=True)
class Fabric:
    name: str
    description: str
    # Link rate of each emulated node's NIC in Mbit/s (both directions shaped with tc tbf).
    emulated_mbit: float
    # NCCL settings that select this transport on a real cluster.
    nccl_env: Mapping[str, str] = field(default_factory=dict)

    def with_rate(self, mbit: float) -> Fabric:
        return replace(self, emulated_mbit=mbit)

    def settings(self) -> dict[str, object]:
        """What a measurement records about the fabric it ran on."""
        return {
            "name": self.name,
            "emulated_mbit": self.emulated_mbit,
            "nccl_env": dict(self.nccl_env),
        }


# Emulated rates keep the real ordering and a real-sized gap (RDMA several times faster than
# kernel TCP) while staying inside what veth + tbf can carry on a 2-core machine.
FABRICS: dict[str, Fabric] = {
    f.name: f
    for f in (
        Fabric(
            "ib",
            "InfiniBand (RDMA)",
            emulated_mbit=4000,
            nccl_env={"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_NET_GDR_LEVEL": "SYS"},
        ),
        Fabric(
            "roce",
            "RoCE v2 (RDMA over Ethernet)",
            emulated_mbit=3200,
            nccl_env={
                "NCCL_IB_DISABLE": "0",
                "NCCL_NET": "IB",
                "NCCL_NET_GDR_LEVEL": "SYS",
                "NCCL_IB_GID_INDEX": "3",
            },
        ),
        Fabric(
            "efa",
            "AWS EFA (libfabric/SRD)",
            emulated_mbit=2000,
            nccl_env={"NCCL_NET": "Libfabric", "FI_PROVIDER": "efa"},
        ),
        Fabric(
            "eth",
            "TCP Ethernet through the kernel",
            emulated_mbit=400,
            nccl_env={"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket"},
        ),
    )
}

DEFAULT_FABRICS = ("ib", "eth")
# The fabric every other one is compared with.
REFERENCE_FABRIC = "ib"


def get_fabric(name: str, rates: Mapping[str, float] | None = None) -> Fabric:
    try:
        fabric = FABRICS[name]
    except KeyError:
        raise KeyError(f"unknown fabric {name!r}; known fabrics: {', '.join(FABRICS)}") from None
    if rates and name in rates:
        fabric = fabric.with_rate(rates[name])
    return fabric
