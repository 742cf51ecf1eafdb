"""Pre-flight: what a fabric needs on a GPU node, checked before a launch is spent on it.

A missing HCA or interface otherwise shows up minutes later as an NCCL init failure, or worse as a
silent fallback: sockets instead of verbs, TCP over IPoIB instead of Ethernet, one HCA port of
eight, GPUDirect RDMA off. Each check reads sysfs (the files ``ibv_devinfo`` and ``ip link``
report from), so it needs no RDMA user-space tools:

- ``/sys/class/net/<if>/type``: 1 is Ethernet, 32 is IPoIB (ARPHRD_INFINIBAND), 772 loopback;
  ``speed`` (Mb/s; -1, or a read error, on a link that is down) and ``operstate`` (``up``, ``down``);
- ``/sys/class/infiniband/<dev>/ports/<n>/{link_layer,state,rate}`` and ``gid_attrs/types/<i>``,
  ``gids/<i>``: the HCA ports, their speed (``400 Gb/sec (4X NDR)``) and RoCE GIDs;
- ``/sys/module/nvidia_peermem`` (or the older ``/sys/kernel/mm/memory_peers/nv_mem``): GPUDirect
  RDMA through peer memory; DMA-BUF, the other way, leaves only ``/sys/kernel/dmabuf`` behind.

``read_node`` collects those facts, ``check_node`` turns them into problems. They run here
(``check``), or on every node of the cluster before the first launch (``measuring/nodes.py``: a probe
started on each node the way ranks are). ``sysfs`` is a parameter so the checks run on recorded trees.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..core.fabrics import Fabric
from .nccl_evidence import fabric_kind, select_names
from .nic_inventory import NicInventory

ARPHRD_ETHER = 1
ARPHRD_INFINIBAND = 32  # an IPoIB interface: TCP over it rides the InfiniBand fabric
ARPHRD_LOOPBACK = 772
_RATE = re.compile(r"^\s*([\d.]+) Gb/sec")
_LINK_LOCAL = "fe80:"


@dataclass
class Port:
    """One RDMA device port as sysfs shows it."""

    link_layer: str  # "InfiniBand", "Ethernet" (RoCE), "Unspecified" (EFA)
    state: str  # "4: ACTIVE"
    gbit: float | None = None  # from ``rate``
    gids: dict[int, tuple[str, str]] = field(default_factory=dict)  # index -> (gid, type "RoCE v2")

    @property
    def active(self) -> bool:
        return "ACTIVE" in self.state


@dataclass
class NodeFacts:
    """What one node offers a fabric: interfaces (name -> ARPHRD type, speed, state), RDMA ports, GDR
    support."""

    host: str
    interfaces: dict[str, int] = field(default_factory=dict)
    ports: dict[str, Port] = field(default_factory=dict)  # "mlx5_0:1"
    peermem: bool = False
    dmabuf: bool = False
    # The NCCL_* environment the probe saw: started like a rank, it sees what the ranks will.
    env: dict[str, str] = field(default_factory=dict)
    # Interface -> Mb/s; only interfaces whose link reports a speed (a down one reads -1 or fails).
    speeds: dict[str, int] = field(default_factory=dict)
    operstate: dict[str, str] = field(default_factory=dict)  # interface -> "up", "down", "unknown"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeFacts:
        ports = {name: Port(p["link_layer"], p["state"], p.get("gbit"),
                            {int(i): (g[0], g[1]) for i, g in p.get("gids", {}).items()})
                 for name, p in data.get("ports", {}).items()}
        return cls(data["host"], dict(data.get("interfaces", {})), ports, bool(data.get("peermem")),
                   bool(data.get("dmabuf")), dict(data.get("env", {})),
                   speeds={k: int(v) for k, v in data.get("speeds", {}).items()},
                   operstate=dict(data.get("operstate", {})))


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def read_node(sysfs: Path = Path("/sys"), host: str | None = None) -> NodeFacts:
    """This node's facts from ``sysfs`` (a missing file is an unknown, never an error)."""
    facts = NodeFacts(host or socket.gethostname())
    net = sysfs / "class" / "net"
    for iface in sorted(net.iterdir()) if net.is_dir() else []:
        kind = _read(iface / "type")
        facts.interfaces[iface.name] = int(kind) if kind and kind.isdigit() else ARPHRD_ETHER
        speed, state = _read(iface / "speed"), _read(iface / "operstate")
        if speed and speed.isdigit() and int(speed) > 0:
            facts.speeds[iface.name] = int(speed)
        if state:
            facts.operstate[iface.name] = state
    root = sysfs / "class" / "infiniband"
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            rate = _RATE.match(_read(port / "rate") or "")
            gids = {}
            types = port / "gid_attrs" / "types"
            for entry in sorted(types.iterdir()) if types.is_dir() else []:
                gid, kind = _read(port / "gids" / entry.name), _read(entry)
                if entry.name.isdigit() and gid and kind:
                    gids[int(entry.name)] = (gid, kind)
            facts.ports[f"{dev.name}:{port.name}"] = Port(
                _read(port / "link_layer") or "?", _read(port / "state") or "?",
                float(rate.group(1)) if rate else None, gids)
    facts.peermem = (sysfs / "module" / "nvidia_peermem").is_dir() or \
        (sysfs / "kernel" / "mm" / "memory_peers" / "nv_mem").is_dir()
    facts.dmabuf = (sysfs / "kernel" / "dmabuf").is_dir()
    return facts


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


_LAYER = {"ib": "InfiniBand", "roce": "Ethernet"}


def _fabric_ports(kind: str | None, facts: NodeFacts) -> dict[str, Port]:
    """The node's ports that belong to this kind of fabric, whatever their state."""
    if kind in _LAYER:
        return {n: p for n, p in facts.ports.items() if p.link_layer == _LAYER[kind]}
    if kind == "efa":
        return {n: p for n, p in facts.ports.items() if n.startswith(("efa", "rdmap"))}
    return {}


def usable_ports(kind: str | None, facts: NodeFacts, env: Mapping[str, str]) -> dict[str, Port]:
    """The node's ports NCCL can carry this kind of fabric over: ACTIVE ones, and for ib and roce only
    on the HCAs ``NCCL_IB_HCA`` selects (a DOWN port, or one left out, moves no byte)."""
    ports = _fabric_ports(kind, facts)
    if kind in _LAYER:
        hcas = select_names(sorted({p.split(":")[0] for p in facts.ports}), env.get("NCCL_IB_HCA"))
        ports = {n: p for n, p in ports.items() if n.split(":")[0] in hcas}
    return {n: p for n, p in ports.items() if p.active}


def socket_names(facts: NodeFacts) -> list[str]:
    """The interfaces ``NCCL_SOCKET_IFNAME`` can select from: every one but loopback."""
    return sorted(n for n, t in facts.interfaces.items() if t != ARPHRD_LOOPBACK and n != "lo")


def _ipoib(facts: NodeFacts, name: str) -> bool:
    return facts.interfaces.get(name) == ARPHRD_INFINIBAND or name.startswith("ib")


def socket_interfaces(facts: NodeFacts, env: Mapping[str, str]) -> list[str]:
    """The interfaces NCCL's sockets carry an eth fabric over: those ``NCCL_SOCKET_IFNAME`` selects,
    else every one but loopback, docker's and IPoIB (NCCL would prefer ib*, which ``check_node``
    refuses: that traffic rides the InfiniBand fabric, not this one)."""
    spec = env.get("NCCL_SOCKET_IFNAME")
    if spec:
        return select_names(socket_names(facts), spec)
    return [n for n in socket_names(facts) if not _ipoib(facts, n) and not n.startswith("docker")]


def inventory(fabric: Fabric, facts: NodeFacts) -> NicInventory | None:
    """What the transport proof compares NCCL's devices with, from this node's sysfs: every port
    of the fabric's kind (a DOWN one included: NCCL skipping it is what must show) and the fastest
    rate among them (the NICs' speed; a port below it is a slow one). None where the node shows
    no such port."""
    ports = _fabric_ports(fabric_kind(fabric), facts)
    if not ports:
        return None
    rates = [p.gbit for p in ports.values() if p.gbit]
    return NicInventory(len(ports), max(rates) if rates else None, source=f"sysfs of {facts.host}")


def check_node(fabric: Fabric, facts: NodeFacts, env: Mapping[str, str] | None = None, *,
          declared: NicInventory | None = None, require_gdr: bool = False) -> list[str]:
    """Problems that would stop ``fabric`` carrying a job on the node ``facts`` describe, or
    make it carry one silently degraded; empty when ready. ``env``: the NCCL environment the
    ranks get there (a fabric setting missing from it never arrived); None: the fabric's own."""
    kind = fabric_kind(fabric)
    on = f" on {facts.host}"
    problems: list[str] = []
    if env is None:
        env = dict(fabric.nccl_env)
    lost = [f"{k}={v}" for k, v in fabric.nccl_env.items() if k not in env]
    if lost:
        problems.append(f"fabric {fabric.name}: {', '.join(lost)} did not reach the node{on} (does the launcher "
                        f"pass the fabric's environment to every rank?)")
    if kind in _LAYER:
        ports = _fabric_ports(kind, facts)
        usable = usable_ports(kind, facts, env)
        if not usable:
            seen = ", ".join(f"{n} {p.link_layer} {p.state}" for n, p in facts.ports.items()) or "no RDMA devices"
            what = "RoCE (Ethernet link layer)" if kind == "roce" else "InfiniBand"
            hca = f" among NCCL_IB_HCA={env['NCCL_IB_HCA']}" if env.get("NCCL_IB_HCA") else ""
            return problems + [f"fabric {fabric.name} needs an ACTIVE {what} port{hca}{on}; found: {seen} "
                               f"(class/infiniband)"]
        if declared and declared.nics and len(usable) < declared.nics:
            down = [f"{n} {p.state}" for n, p in ports.items() if n not in usable]
            why = f": {', '.join(down)}" if down else ""
            problems.append(f"fabric {fabric.name}: {len(usable)} usable {_LAYER[kind]} port(s){on}, "
                            f"{declared.source} declares {declared.nics}{why}")
        if declared and declared.gbit_per_nic:
            slow = [f"{n} {p.gbit:g} Gb/sec" for n, p in usable.items()
                    if p.gbit and p.gbit < declared.gbit_per_nic * 0.9]
            if slow:
                problems.append(f"fabric {fabric.name}: port(s) slower than the declared "
                                f"{declared.gbit_per_nic:g} Gbit/s{on}: {', '.join(slow)} (ports/N/rate)")
        if kind == "roce":
            problems += _roce_gid(fabric, usable, env, on)
        if require_gdr:
            problems += _gdr(fabric, facts, on)
    elif kind == "eth":
        names = socket_names(facts)
        spec = env.get("NCCL_SOCKET_IFNAME")
        chosen = socket_interfaces(facts, env)
        if spec and not chosen:
            problems.append(f"fabric {fabric.name}: NCCL_SOCKET_IFNAME={spec} matches no interface{on}; it has: "
                            f"{', '.join(names)} (override with '{fabric.name}.NCCL_SOCKET_IFNAME==<interface>' in "
                            f"fabric_env)")
        ipoib = [n for n in (chosen if spec else [n for n in names if n.startswith("ib")]) if _ipoib(facts, n)]
        if ipoib:
            how = f"NCCL_SOCKET_IFNAME={spec} selects" if spec else "NCCL_SOCKET_IFNAME is unset, so NCCL prefers"
            problems.append(f"fabric {fabric.name}: {how} {ipoib[0]}{on}, an IPoIB interface (type "
                            f"{facts.interfaces[ipoib[0]]}): TCP over it runs on the InfiniBand fabric (set "
                            f"'{fabric.name}.NCCL_SOCKET_IFNAME==<ethernet interface>' in fabric_env)")
    elif kind == "efa":
        efa = _fabric_ports("efa", facts)
        if not efa:
            problems.append(f"fabric {fabric.name} needs EFA devices (class/infiniband/rdmap* or efa*){on}; none "
                            f"found: is this an EFA-enabled instance with the efa driver loaded?")
        elif declared and declared.nics and len(efa) < declared.nics:
            problems.append(f"fabric {fabric.name}: {len(efa)} EFA device(s){on}, {declared.source} declares "
                            f"{declared.nics}")
        if efa and require_gdr:
            problems += _gdr(fabric, facts, on)
    return problems


def _roce_gid(fabric: Fabric, ports: Mapping[str, Port], env: Mapping[str, str], on: str) -> list[str]:
    index = env.get("NCCL_IB_GID_INDEX")
    if index is None or not index.lstrip("-").isdigit() or int(index) < 0:
        return []  # NCCL >= 2.21 picks the RoCE v2 GID itself; the log's GID line proves which
    for name, port in ports.items():
        gid = port.gids.get(int(index))
        if gid and (gid[0].startswith(_LINK_LOCAL) or gid[1] != "RoCE v2"):
            return [f"fabric {fabric.name}: NCCL_IB_GID_INDEX={index} is {gid[1]} GID {gid[0]} on {name}{on}, "
                    f"not a routable RoCE v2 GID (gid_attrs/types/{index}; pick the index whose type is "
                    f"RoCE v2 and whose GID is not fe80::)"]
    return []


def _gdr(fabric: Fabric, facts: NodeFacts, on: str) -> list[str]:
    if facts.peermem or facts.dmabuf:
        return []
    return [f"fabric {fabric.name}: no GPUDirect RDMA{on}: nvidia_peermem is not loaded and the kernel shows no "
            f"DMA-BUF (/sys/kernel/dmabuf) (modprobe nvidia_peermem, or --accept-no-gdr)"]


def check(fabric: Fabric, gpus_per_node: int, env: Mapping[str, str] | None = None,
          sysfs: Path = Path("/sys"), gpus: int | None = None, network: bool = True,
          declared: NicInventory | None = None, require_gdr: bool = False) -> list[str]:
    """Problems that would stop ``fabric`` from carrying a GPU job on this node; empty when ready.

    ``network=False`` checks the GPUs only (a single-node job never touches the fabric).
    """
    problems = []
    have = visible_gpus() if gpus is None else gpus
    if have < gpus_per_node:
        problems.append(f"{have} GPU(s) visible, {gpus_per_node} needed per node "
                        f"(check CUDA_VISIBLE_DEVICES and nvidia-smi, or lower --gpus-per-node)")
    if network:
        inherited = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        env = {**inherited, **fabric.nccl_env, **(env or {})}
        problems += check_node(fabric, read_node(sysfs), env, declared=declared, require_gdr=require_gdr)
    return problems
