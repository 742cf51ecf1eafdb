"""Proof of transport: which network NCCL really used, read from NCCL's own debug log.

A fabric preset only *asks* NCCL for a transport. NCCL decides at communicator init and, unless
``NCCL_NET`` forces the choice, falls back silently: an IB cluster whose container lacks the verbs
library runs over TCP sockets, and every throughput number still looks plausible. The only
authoritative record is NCCL's INFO log. So every GPU measurement runs with ``nccl_debug_env`` (one
log file per rank), the files are parsed into ``TransportFacts`` after at least one warm-up
collective (``nccl_logs.py``, which lists the line formats read), and ``check_transport`` here turns
"the facts do not show the requested fabric" into a failure message that quotes the log line
proving it. A node's NICs, declared or read from sysfs, are a ``nic_inventory.NicInventory``.

Beyond "which network", the blind spots a job can hide in (``check_transport`` judges each):

- ``NET/Socket : Using [0]ib0:...`` with ``eth`` requested: TCP over IPoIB, i.e. the InfiniBand
  fabric. NCCL prefers ``ib*`` interfaces when ``NCCL_SOCKET_IFNAME`` is unset, and the ENV lines
  (``NCCL_SOCKET_IFNAME set by environment to =eth0``, misc/socket.cc) prove the setting arrived.
- No ``via NET/`` channel on a multi-node job (``comm ... nNodes 2 ... MNNVL 1``): MNNVL or NVLS
  carried every byte, nothing crossed the network fabric.
- Fewer HCA ports, or slower ones, than the node has: the ports of ``NET/IB : Using`` (also the
  merged form ``[0]={[0] mlx5_0:1/IB, [1] mlx5_0:2/IB}`` of NCCL 2.20-2.23) against a
  ``NicInventory``; speeds from ``NET/IB: [0] mlx5_0:uverbs0:1/IB provider=Mlx5 speed=400000 ...``
  (NCCL 2.27+, NET) or the GRAPH dump's ``+ NET[50.0] - NET/0 (.../1/50.000000)`` (GB/s).
- GPUDirect RDMA off (``NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'``, channels without
  ``/GDRDMA``), required by default on RDMA fabrics.
- RoCE on a link-local GID (``... GID 0 (80FE/...)``: fe80::/64 as NCCL prints it on a
  little-endian host) or RoCE v1 (``NCCL_IB_ROCE_VERSION_NUM set by environment to 1.``).
- EFA with fewer NICs than the instance has (``(found 1 nics)``).
- CollNet/SHARP use (``CollNet 00/0 : 0 [send] via COLLNET/SHARP/0``) is recorded, not judged.

Plain module: no pytest imports; the workload sets the environment, the plugin turns a message into
a test failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..core.fabrics import FABRICS, Fabric
from .nccl_logs import (PLUGIN_FAILED, Evidence, LogSource, TransportFacts, normalize_network,
                        parse_nccl_logs)
from .nic_inventory import NicInventory

# Which NCCL network each transport kind must show. RoCE runs through NCCL's IB plugin; only the
# link layer of its ports tells it from InfiniBand.
EXPECTED_NETWORK = {"ib": "IB", "roce": "IB", "eth": "Socket", "efa": "Libfabric"}
EXPECTED_LINK_LAYER = {"ib": "IB", "roce": "RoCE"}
RDMA_KINDS = ("ib", "roce", "efa")


# A port may train a little below its nominal rate in what NCCL prints (e.g. HDR100 speed=100000 is
# exact, but some providers round); anything below this share of the declared rate is a slow port.
SPEED_TOLERANCE = 0.9
# The IPv6 link-local prefix fe80::/64 as NCCL prints a GID's subnet prefix (%lX of the raw
# big-endian bytes on a little-endian host); a routable RoCE v2 GID never starts there.
LINK_LOCAL_PREFIX = "80FE"


def fabric_kind(fabric: str | Fabric, table: Mapping[str, Fabric] | None = None) -> str | None:
    """Which transport a fabric asks for: "ib", "roce", "eth", "efa", or None if it cannot tell.

    User-defined fabrics (``roce-dc2: roce``) copy their base's description, so the base is found
    from it; failing that, ``NCCL_NET`` in the fabric's environment decides.
    """
    if isinstance(fabric, str):
        if fabric in EXPECTED_NETWORK:
            return fabric
        fab = (FABRICS if table is None else table).get(fabric)
        if fab is None:
            return None
    else:
        fab = fabric
    if fab.name in EXPECTED_NETWORK:
        return fab.name
    for kind in EXPECTED_NETWORK:
        base = FABRICS.get(kind)
        if base and (fab.description == base.description or fab.description.startswith(base.description + ",")):
            return kind
    net = normalize_network(fab.nccl_env.get("NCCL_NET", ""))
    if net == "Socket":
        return "eth"
    if net == "Libfabric":
        return "efa"
    if net == "IB":
        return "roce" if "NCCL_IB_GID_INDEX" in fab.nccl_env else "ib"
    return None


def check_transport(
    requested: str | Fabric,
    facts: TransportFacts,
    *,
    crosses_fabric: bool = True,
    require_gdr: bool = True,
    table: Mapping[str, Fabric] | None = None,
    inventory: NicInventory | None = None,
    env_logged: bool | None = None,
) -> str | None:
    """None when the logs prove the requested fabric carried the traffic; otherwise why not,
    quoting the evidence line, e.g. ``requested ib; NCCL used Socket: `Failed to initialize NET
    plugin IB```.

    ``crosses_fabric=False`` (one node: NVLink or shared memory does the work) has nothing to
    prove. GPUDirect RDMA is required on RDMA fabrics unless ``require_gdr=False`` (sockets never
    do GDR). ``inventory``: the NICs a node has, to fail a run that used fewer or slower ones.
    ``env_logged``: NCCL ran with the ENV subsystem (``nccl_debug_env`` reached it, which the log
    files themselves prove), so a fabric setting without its ``set by environment`` line never
    arrived; None: known only when some ENV line was logged.
    """
    name = requested if isinstance(requested, str) else requested.name
    if not crosses_fabric:
        return None
    fabric = requested if isinstance(requested, Fabric) else (FABRICS if table is None else table).get(requested)
    kind = fabric_kind(requested, table)
    if kind is None:
        return (f"requested {name}: cannot tell which NCCL transport this fabric should use "
                f"(define it from a preset, e.g. '{name}: ib', or set NCCL_NET)")
    label = name if name == kind else f"{name} ({kind})"
    expected = EXPECTED_NETWORK[kind]

    if not facts.networks:
        if facts.sources == 0:
            where = "no NCCL log files were found"
        else:
            where = (f"no `Using network` line in {facts.sources} NCCL log source(s) "
                     f"({facts.nccl_lines} NCCL lines)")
        hint = ("is NCCL_DEBUG=INFO with NCCL_DEBUG_FILE applied to every rank, and did a NCCL "
                "communicator start? On one node nothing crosses the fabric: pass crosses_fabric=False")
        extra = f"; {facts.problems[0]}" if facts.problems else ""
        return f"requested {label}; {where}{extra} ({hint})"

    wrong = [n for n in facts.networks if n != expected]
    if wrong:
        used = wrong[0]
        using = facts.networks[used]
        cause, because = _cause(facts, kind)
        if cause is None:
            return f"requested {label}; NCCL used {used}: {using.cite()}"
        after = f"; after `{because.line}`" if because else ""
        return f"requested {label}; NCCL used {used}: `{cause.line}` ({cause.source}{after}; then `{using.line}`)"

    if env_logged is None:
        env_logged = bool(facts.env)
    if kind == "eth" and (problem := _check_sockets(label, facts, fabric, env_logged)):
        return problem

    if kind in EXPECTED_LINK_LAYER:
        want = EXPECTED_LINK_LAYER[kind]
        if not facts.link_layers:
            return (f"requested {label}; NCCL used IB verbs but no `NET/IB : Using` line lists the HCA ports, "
                    f"so {want} cannot be told from {'RoCE' if want == 'IB' else 'InfiniBand'} "
                    f"(NCCL_DEBUG_SUBSYS must include INIT or NET)")
        other = {port: layer for port, layer in facts.link_layers.items() if layer != want}
        if other:
            port, layer = next(iter(other.items()))
            ev = facts.link_layer_evidence[port]
            return (f"requested {label}; NCCL used IB verbs over {layer} on {', '.join(other)}, not {want}: "
                    f"{ev.cite()}")

    if kind == "efa":
        if not facts.providers:
            return (f"requested {label}; NCCL used Libfabric but no `NET/OFI Selected Provider` line names "
                    f"the libfabric provider (NCCL_DEBUG_SUBSYS must include INIT or NET)")
        other_providers = [p for p in facts.providers if p != "efa"]
        if other_providers:
            p = other_providers[0]
            return f"requested {label}; libfabric picked {p}, not efa: {facts.providers[p].cite()}"

    if facts.net_channels == 0:
        if facts.mnnvl is not None:
            return (f"requested {label}; no byte crossed the network: the nodes share a multi-node NVLink "
                    f"domain and no channel goes `via NET/`: {facts.mnnvl.cite()} (set NCCL_MNNVL_ENABLE=0 "
                    f"to measure the network fabric)")
        nodes = f" ({facts.nnodes} nodes)" if facts.nnodes else ""
        return (f"requested {label}; the job crosses nodes{nodes} but no channel goes `via NET/` "
                f"(channel lines appear only after the first collective: read the logs after a warm-up "
                f"collective; NCCL_DEBUG_SUBSYS must include NET)")

    if kind == "roce" and (problem := _check_roce_gid(label, facts)):
        return problem
    if inventory is not None and (problem := _check_inventory(label, kind, facts, inventory)):
        return problem

    if require_gdr and kind in RDMA_KINDS and not facts.gdr:
        cause = f"{facts.gdr_disabled[0].cite()}; " if facts.gdr_disabled else ""
        return (f"requested {label}; GPUDirect RDMA is off: none of {facts.net_channels} network channels "
                f"uses GDRDMA: {cause}{facts.evidence['gdr'].cite()} (load nvidia-peermem or use a DMA-BUF "
                f"capable driver; --accept-no-gdr accepts a run without it)")
    return None


def _check_sockets(label: str, facts: TransportFacts, fabric: Fabric | None, env_logged: bool) -> str | None:
    """eth: the socket interfaces must be the fabric's, never IPoIB, and its setting must arrive."""
    ipoib = [i for i in facts.socket_interfaces if i.startswith("ib")]
    if ipoib:
        return (f"requested {label}; NCCL's sockets run over IPoIB interface {ipoib[0].split(':')[0]}, i.e. TCP "
                f"over the InfiniBand fabric, not Ethernet: {facts.socket_evidence[ipoib[0]].cite()} "
                f"(NCCL prefers ib* interfaces: set {label.split()[0]}.NCCL_SOCKET_IFNAME in fabric_env)")
    wanted = (fabric.nccl_env.get("NCCL_SOCKET_IFNAME") if fabric else None) or ""
    if not wanted:
        return None
    if env_logged:  # NCCL logged ENV, so the setting's missing line means it never reached NCCL
        arrived = facts.env.get("NCCL_SOCKET_IFNAME")
        if arrived is None:
            chose = next(iter(facts.socket_evidence.values()), None)
            then = f"; NCCL chose for itself: {chose.cite()}" if chose else ""
            return (f"requested {label}; NCCL_SOCKET_IFNAME={wanted} did not reach the ranks: NCCL logged with "
                    f"ENV but no `NCCL_SOCKET_IFNAME set by environment to {wanted}` line{then} (does the "
                    f"launcher pass the fabric's environment to every rank?)")
        if arrived[0] != wanted:
            return (f"requested {label}; the ranks got NCCL_SOCKET_IFNAME={arrived[0]}, the fabric sets "
                    f"{wanted}: {arrived[1].cite()}")
    names = [i.split(":")[0] for i in facts.socket_interfaces]
    stray = [n for n in names if n not in select_names(names, wanted)]
    if stray:
        iface = facts.socket_interfaces[names.index(stray[0])]
        return (f"requested {label}; NCCL's sockets use {stray[0]}, which NCCL_SOCKET_IFNAME={wanted} does not "
                f"select: {facts.socket_evidence[iface].cite()}")
    return None


def select_names(names: list[str], spec: str | None) -> list[str]:
    """NCCL's list syntax for NCCL_SOCKET_IFNAME / NCCL_IB_HCA (misc/socket.cc matchIfList):
    prefixes, ``=`` exact, ``^`` excludes; no spec selects all."""
    if not spec:
        return names
    exclude = spec.startswith("^")
    body = spec[1:] if exclude else spec
    exact = body.startswith("=")
    body = body[1:] if exact else body
    wanted = [w.split(":")[0] for w in body.split(",") if w]
    match = (lambda n: n in wanted) if exact else (lambda n: any(n.startswith(w) for w in wanted))
    return [n for n in names if match(n) != exclude]


def _check_roce_gid(label: str, facts: TransportFacts) -> str | None:
    """RoCE must route: a link-local GID (fe80::, what GID index 0 holds) or RoCE v1 does not."""
    link_local = [(i, ev) for i, prefix, ev in facts.roce_gids if prefix == LINK_LOCAL_PREFIX]
    if link_local:
        index, ev = link_local[0]
        return (f"requested {label}; NCCL's RoCE queue pairs use link-local GID index {index} (fe80::), which "
                f"does not route and on older NCCL means RoCE v1: {ev.cite()} (set NCCL_IB_GID_INDEX to the "
                f"RoCE v2 IPv4 GID, usually 3, or use NCCL >= 2.21, which picks it)")
    version = facts.env.get("NCCL_IB_ROCE_VERSION_NUM")
    if version and version[0] == "1":
        return f"requested {label}; the ranks run RoCE v1, which does not route: {version[1].cite()}"
    return None


def _check_inventory(label: str, kind: str, facts: TransportFacts, inventory: NicInventory) -> str | None:
    """Fewer NICs, or slower ones, than each node has: a down port or a copied NCCL_IB_HCA."""
    where = inventory.source
    if kind == "efa":
        for host, (found, ev) in facts.efa_nics.items():
            if inventory.nics and found < inventory.nics:
                return (f"requested {label}; aws-ofi-nccl found {found} of the {inventory.nics} EFA NICs each node "
                        f"has ({where}) on {host}: {ev.cite()}")
        return None
    if kind not in EXPECTED_LINK_LAYER:
        return None
    for host, devices in facts.host_devices.items():
        ports = [p for dev in devices for p in dev]
        if inventory.nics and len(ports) < inventory.nics:
            return (f"requested {label}; NCCL used {len(ports)} HCA port(s) on {host}, the node has "
                    f"{inventory.nics} ({where}): {facts.host_devices_evidence[host].cite()} (a port is down, or "
                    f"NCCL_IB_HCA lists too few)")
    if not inventory.gbit_per_nic:
        return None
    if not facts.speeds:
        return (f"requested {label}; {where} declares {inventory.gbit_per_nic:g} Gbit/s per NIC but the logs show "
                f"no port speed (NCCL >= 2.27 prints it with NET; older NCCL only with NCCL_DEBUG_SUBSYS "
                f"including GRAPH)")
    floor = inventory.gbit_per_nic * SPEED_TOLERANCE
    for key, (gbit, ev) in facts.speeds.items():
        host, _, dev = key.partition("/")
        ports = 1
        if dev.startswith("NET/"):  # the GRAPH dump names NCCL's device index: a merged device sums its ports
            devices = facts.host_devices.get(host, [])
            index = int(dev[4:])
            ports = len(devices[index]) if index < len(devices) else 1
            dev = "+".join(devices[index]) if index < len(devices) else dev
        if gbit < floor * ports:
            return (f"requested {label}; port {dev} on {host} runs at {gbit:g} Gbit/s, the node's NICs are "
                    f"{inventory.gbit_per_nic * ports:g} Gbit/s ({where}): {ev.cite()}")
    return None


def _cause(facts: TransportFacts, kind: str) -> tuple[Evidence | None, Evidence | None]:
    """The fallback line that best explains why the requested transport was not used, and the
    line before it that says why (e.g. ``Failed to initialize NET plugin IB`` after ``NET/IB : No
    device found.``). Lines about the requested transport win; a plugin's own failure verdict
    beats its symptoms."""
    about = {
        "ib": ("IB", "ibverbs"),
        "roce": ("IB", "ibverbs"),
        "efa": ("OFI", "Libfabric", "libfabric"),
        "eth": ("Socket",),
    }[kind]
    relevant = [ev for ev in facts.fallback if any(word in ev.line for word in about)]
    if not relevant and kind == "efa":
        # No aws-ofi-nccl line at all: the plugin library itself did not load.
        relevant = [ev for ev in facts.plugin_lines if "Could not find" in ev.line or "No plugin found" in ev.line]
    candidates = relevant or facts.fallback
    if not candidates:
        return None, None
    verdicts = [ev for ev in candidates if PLUGIN_FAILED.search(ev.line)]
    main = verdicts[0] if verdicts else candidates[0]
    because = next((ev for ev in candidates if ev is not main and ev.line != main.line), None)
    return main, because


def prove_transport(
    requested: str | Fabric,
    logs: LogSource | Iterable[LogSource] | None,
    *,
    crosses_fabric: bool = True,
    require_gdr: bool = True,
    table: Mapping[str, Fabric] | None = None,
    inventory: NicInventory | None = None,
    env_logged: bool | None = None,
) -> tuple[TransportFacts, str | None]:
    """Parse ``logs`` (e.g. the measurement's NCCL log directory) and check them in one call."""
    facts = parse_nccl_logs(logs)
    return facts, check_transport(requested, facts, crosses_fabric=crosses_fabric,
                                  require_gdr=require_gdr, table=table, inventory=inventory,
                                  env_logged=env_logged)
