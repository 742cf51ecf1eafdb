"""Pre-flight: what a fabric needs on a GPU node, checked before a launch is spent on it.

A missing HCA or interface otherwise shows up minutes later as an NCCL init failure, or worse as a
silent fallback to sockets. Each check reads sysfs (the files ``ibv_devinfo`` reports from), so it
needs no RDMA user-space tools; ``sysfs`` is a parameter so the checks run on recorded trees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .fabrics import Fabric
from .transport import select_names


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _rdma_ports(sysfs: Path) -> dict[str, tuple[str, str]]:
    """{"mlx5_0:1": (link_layer, state)} for every RDMA device port."""
    ports = {}
    root = sysfs / "class" / "infiniband"
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").is_dir() else []:
            layer = (port / "link_layer").read_text().strip() if (port / "link_layer").exists() else "?"
            state = (port / "state").read_text().strip() if (port / "state").exists() else "?"
            ports[f"{dev.name}:{port.name}"] = (layer, state)
    return ports


def check(fabric: Fabric, gpus_per_node: int, env: Mapping[str, str] | None = None,
          sysfs: Path = Path("/sys"), gpus: int | None = None, network: bool = True) -> list[str]:
    """Problems that would stop ``fabric`` from carrying a GPU job on this node; empty when ready.

    ``network=False`` checks the GPUs only (a single-node job never touches the fabric).
    """
    env = {**os.environ, **fabric.nccl_env, **(env or {})}
    problems = []
    have = visible_gpus() if gpus is None else gpus
    if have < gpus_per_node:
        problems.append(f"{have} GPU(s) visible, {gpus_per_node} needed per node "
                        f"(check CUDA_VISIBLE_DEVICES and nvidia-smi, or lower --gpus-per-node)")
    net = env.get("NCCL_NET", "") if network else ""
    if net == "IB":
        ports = _rdma_ports(sysfs)
        hcas = select_names(sorted({p.split(":")[0] for p in ports}), env.get("NCCL_IB_HCA"))
        want = "Ethernet" if "NCCL_IB_GID_INDEX" in fabric.nccl_env else "InfiniBand"
        usable = [p for p, (layer, state) in ports.items()
                  if p.split(":")[0] in hcas and layer == want and "ACTIVE" in state]
        if not usable:
            seen = ", ".join(f"{p} {layer} {state}" for p, (layer, state) in ports.items()) or "no RDMA devices"
            kind = "RoCE (Ethernet link layer)" if want == "Ethernet" else "InfiniBand"
            problems.append(f"fabric {fabric.name} needs an ACTIVE {kind} port"
                            f"{' among NCCL_IB_HCA=' + env['NCCL_IB_HCA'] if env.get('NCCL_IB_HCA') else ''}; "
                            f"found: {seen} ({sysfs}/class/infiniband)")
    elif net == "Socket":
        interfaces = sorted(p.name for p in (sysfs / "class" / "net").iterdir()) \
            if (sysfs / "class" / "net").is_dir() else []
        chosen = select_names(interfaces, env.get("NCCL_SOCKET_IFNAME"))
        if not chosen:
            problems.append(f"fabric {fabric.name}: NCCL_SOCKET_IFNAME={env.get('NCCL_SOCKET_IFNAME')} matches no "
                            f"interface; this node has: {', '.join(interfaces)} (override with "
                            f"'{fabric.name}.NCCL_SOCKET_IFNAME==<interface>' in fabric_env)")
    elif net.startswith("Libfabric") or net == "AWS Libfabric":
        root = sysfs / "class" / "infiniband"
        efa = [d.name for d in root.iterdir()] if root.is_dir() else []
        efa = [d for d in efa if d.startswith(("efa", "rdmap"))]
        if not efa:
            problems.append(f"fabric {fabric.name} needs EFA devices ({sysfs}/class/infiniband/rdmap* or efa*); "
                            f"none found: is this an EFA-enabled instance with the efa driver loaded?")
    return problems
