"""Named interconnect fabrics: the one table of what each fabric means.

A fabric has two faces. On a real GPU cluster it is a set of NCCL environment variables that force
one transport (``NCCL_NET`` makes a missing fabric fail at start instead of silently falling back
to sockets). On the emulated cluster it is a link rate: every emulated node's NIC is shaped to it.
Both live here so that a fabric's meaning is written down once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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
    # One node's aggregate NIC rate on a typical real cluster, Gbit/s: what the analytical model
    # (predict.py) assumes for this fabric off the emulated cluster. None: unknown.
    nominal_gbit: float | None = None
    # The per-node rate the user declared for this fabric (``fabric_link_gbit``): what the bandwidth
    # gate, the physical floor (floor.py) and the prediction assume, on any cluster
    # (measuring/link_rate.py). None: not declared.
    declared_gbit: float | None = None

    def with_rate(self, mbit: float) -> Fabric:
        return replace(self, emulated_mbit=mbit)

    def for_launch(self, crosses_fabric: bool) -> Fabric:
        """The fabric as a launch gets it: a launch that crosses no fabric (one node) gets none of
        its NCCL settings. No transport is selected there: NCCL_NET=IB on a node without an HCA
        fails at init even for a one-rank communicator (NCCL 2.28, fixtures/gpu/), and a one-node
        launch, shared between every fabric, must not depend on which fabric launched it."""
        return self if crosses_fabric else replace(self, nccl_env={})

    def settings(self) -> dict[str, object]:
        """What a measurement records about the fabric it ran on."""
        return {
            "name": self.name,
            "emulated_mbit": self.emulated_mbit,
            "nccl_env": dict(self.nccl_env),
        }


# Emulated rates keep the real ordering and a real-sized gap (RDMA several times faster than
# kernel TCP) while staying inside what gloo over veth + tbf can fill on a 2-core machine: measured
# here, all_reduce busbw reached 92% of a 2500 Mbit/s link but only 78% of 4000 (CPU-bound), so the
# fastest emulated link is 2000 Mbit/s and every link is the bottleneck it claims to be.
FABRICS: dict[str, Fabric] = {
    f.name: f
    for f in (
        Fabric(
            "ib",
            "InfiniBand (RDMA)",
            emulated_mbit=2000,
            nccl_env={"NCCL_IB_DISABLE": "0", "NCCL_NET": "IB", "NCCL_NET_GDR_LEVEL": "SYS",
                      "NCCL_IB_TIMEOUT": "22"},
            nominal_gbit=3200,  # 8 x 400 Gb/s NDR per node
        ),
        Fabric(
            "roce",
            "RoCE v2 (RDMA over Ethernet)",
            emulated_mbit=1600,
            nccl_env={
                "NCCL_IB_DISABLE": "0",
                "NCCL_NET": "IB",
                "NCCL_NET_GDR_LEVEL": "SYS",
                "NCCL_IB_TIMEOUT": "22",
                # Auto-detected since NCCL 2.21; 3 is the usual RoCEv2 IPv4 index for older NCCL.
                "NCCL_IB_GID_INDEX": "3",
            },
            nominal_gbit=3200,  # 8 x 400 Gb/s RoCE NICs per node
        ),
        Fabric(
            "efa",
            "AWS EFA (libfabric/SRD)",
            emulated_mbit=1000,
            nccl_env={"NCCL_NET": "Libfabric", "FI_PROVIDER": "efa"},
            nominal_gbit=3200,  # p5: 32 x 100 Gb/s EFA per node
        ),
        Fabric(
            "eth",
            "TCP Ethernet through the kernel",
            emulated_mbit=400,
            nccl_env={"NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket", "NCCL_SOCKET_IFNAME": "=eth0"},
            nominal_gbit=100,  # one 100 GbE NIC through the kernel's TCP
        ),
    )
}

DEFAULT_FABRICS = ("ib", "eth")
# The fabric every other one is compared with.
REFERENCE_FABRIC = "ib"


_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,31}$")
_ENV_VAR = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class FabricConfigError(ValueError):
    """A fabric definition or override that cannot be used; the message says how to write it."""


def fabric_value(item: str) -> tuple[str, float]:
    """``"NAME=NUMBER"`` (spaces allowed around ``=``) -> (NAME, NUMBER): one fabric's rate or price.

    The one reader of every per-fabric number (--fabric-rate, --fabric-link-gbit, fabric_price,
    ``pytest-fabric report --price`` and ``calibrate --gbit``). ValueError unless NAME is given and
    NUMBER is a positive finite number; each caller's message says what the number means.
    """
    name, sep, number = (x.strip() for x in item.partition("="))
    try:
        value = float(number) if sep else -1.0
    except ValueError:
        value = -1.0
    if not name or not 0 < value < float("inf"):
        raise ValueError(f"{item.strip()!r} is not NAME=NUMBER with a name and a positive number")
    return name, value


def build_table(
    defines: Iterable[str] = (),
    env_overrides: Iterable[str] = (),
    rates: Mapping[str, float] | None = None,
    link_gbit: Mapping[str, float] | None = None,
) -> dict[str, Fabric]:
    """The session's fabrics: the presets, plus user-defined ones, with the user's overrides.

    ``defines``: ``NAME: BASE`` lines (a new fabric that starts as a copy of BASE), e.g.
    ``roce-dc2: roce``. ``env_overrides``: ``FABRIC.VAR=VALUE`` lines, e.g.
    ``ib.NCCL_IB_HCA==mlx5_0,mlx5_1`` (the value may itself start with ``=``, NCCL's exact match;
    an empty value removes the variable). ``rates``: emulated link rates in Mbit/s by name.
    ``link_gbit``: declared per-node link rates in Gbit/s by name (``Fabric.declared_gbit``).
    """
    table = dict(FABRICS)
    for line in (d.strip() for d in defines):
        if not line or line.startswith("#"):
            continue
        name, sep, base = (x.strip() for x in line.partition(":"))
        if not sep or not _NAME.match(name) or base not in table or name.endswith("-hybrid"):
            raise FabricConfigError(
                f"fabric definition {line!r}: write 'NAME: BASE' with NAME in lowercase letters, digits, '-', '_' "
                f"(not ending in '-hybrid', which a case id uses for its sharding) and BASE one of "
                f"{', '.join(table)} (e.g. 'roce-dc2: roce')")
        table[name] = replace(table[base], name=name, description=f"{table[base].description}, as {name}")
    for line in (e.strip() for e in env_overrides):
        if not line or line.startswith("#"):
            continue
        target, sep, value = line.partition("=")
        fabric, dot, var = target.strip().partition(".")
        if not sep or not dot or fabric not in table or not _ENV_VAR.match(var):
            raise FabricConfigError(
                f"fabric setting {line!r}: write 'FABRIC.VARIABLE=VALUE' with FABRIC one of {', '.join(table)} "
                f"(e.g. 'ib.NCCL_IB_HCA==mlx5_0,mlx5_1' or 'eth.NCCL_SOCKET_IFNAME==ens5')")
        env = dict(table[fabric].nccl_env)
        if value.strip():
            env[var] = value.strip()
        else:
            env.pop(var, None)
        table[fabric] = replace(table[fabric], nccl_env=env)
    for name, mbit in (rates or {}).items():
        if name not in table:
            raise FabricConfigError(f"fabric rate for unknown fabric {name!r}; known fabrics: {', '.join(table)}")
        if not 0 < mbit < float("inf"):
            raise FabricConfigError(f"fabric rate for {name!r} must be positive Mbit/s, got {mbit}")
        table[name] = table[name].with_rate(mbit)
    for name, gbit in (link_gbit or {}).items():
        if name not in table:
            raise FabricConfigError(f"declared link rate for unknown fabric {name!r}; known fabrics: {', '.join(table)}")
        if not 0 < gbit < float("inf"):
            raise FabricConfigError(f"declared link rate for {name!r} must be positive Gbit/s, got {gbit}")
        table[name] = replace(table[name], declared_gbit=gbit)
    return table


def get_fabric(name: str, table: Mapping[str, Fabric] | None = None) -> Fabric:
    table = FABRICS if table is None else table
    try:
        return table[name]
    except KeyError:
        raise KeyError(f"unknown fabric {name!r}; known fabrics: {', '.join(table)}") from None
