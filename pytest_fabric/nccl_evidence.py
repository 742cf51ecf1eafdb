"""Proof of transport: which network NCCL really used, read from NCCL's own debug log.

A fabric preset only *asks* NCCL for a transport. NCCL decides at communicator init and, unless
``NCCL_NET`` forces the choice, falls back silently: an IB cluster whose container lacks the verbs
library runs over TCP sockets, and every throughput number still looks plausible. The only
authoritative record is NCCL's INFO log. So every GPU measurement runs with ``nccl_debug_env`` (one
log file per rank), the files are parsed into ``TransportFacts`` after at least one warm-up
collective, and ``check_transport`` turns "the facts do not show the requested fabric" into a
failure message that quotes the log line proving it.

The line formats come from NCCL's source (2.19 to 2.28) and aws-ofi-nccl 1.x; a line looks like
``node-1:12345:12400 [0] NCCL INFO <message>`` and only the message matters here:

- ``Using network IB`` / ``Socket`` / ``Libfabric`` (init.cc): the network plugin the communicator
  uses. The authoritative fact; everything else refines it.
- ``NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE ; OOB eth0:10.0.0.1<0>`` (net_ib): the HCA ports
  and their link layer, the only place IB is told from RoCE (both run through the IB plugin).
  Newer releases add ``:rail``/``::plane`` after the port and ``[RO]`` before the ``;``.
- ``Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA`` (transport/net.cc): one connection;
  ``/GDRDMA`` marks GPUDirect RDMA (``(1)`` after the device is a PXN proxy rank, ``(PCI)`` and
  ``/Shared`` may follow). Since NCCL 2.22 connections are made lazily, so these lines only appear
  after the first collective: read the logs after a warm-up collective, not after init.
- ``NET/OFI Selected Provider is efa (found 4 nics)`` (aws-ofi-nccl; newer: ``Selected provider is
  efa, fabric is efa-direct (found 32 nics)``): the libfabric provider behind ``Libfabric``.
  libfabric can pick ``tcp``, which is EFA in name only.
- ``NCCL version 2.21.5+cuda12.4``: printed by rank 0, an INFO line in the debug file (and a bare
  line on stdout, which the parser also reads).
- Fallback evidence: ``Failed to initialize NET plugin IB``, ``NET/IB : No device found.``,
  ``Failed to open libibverbs.so[.1]``, ``Error: network IB not found.`` and the like.

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

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fabrics import FABRICS, Fabric
from .units import gbyte_to_gbit, mbit_to_gbit

# A log source: a file, a directory of ``nccl.*`` files, or the text of a log.
LogSource = str | Path | bytes

LOG_FILE_PREFIX = "nccl."

# Which NCCL network each transport kind must show. RoCE runs through NCCL's IB plugin; only the
# link layer of its ports tells it from InfiniBand.
EXPECTED_NETWORK = {"ib": "IB", "roce": "IB", "eth": "Socket", "efa": "Libfabric"}
EXPECTED_LINK_LAYER = {"ib": "IB", "roce": "RoCE"}
RDMA_KINDS = ("ib", "roce", "efa")


def nccl_debug_env(log_dir: str | os.PathLike[str], *, graph: bool = False) -> dict[str, str]:
    """The environment that makes every rank write its NCCL INFO log to its own file.

    ``%h`` and ``%p`` are expanded by NCCL to the host name and pid, so ranks never share a file.
    ``NCCL_DEBUG_SUBSYS`` replaces NCCL's default set instead of adding to it, so every subsystem
    the proof reads is named: INIT (``Using network``, version, devices), BOOTSTRAP (its own
    subsystem since 2.23), ENV (``... set by environment to ...``: the proof that settings reached
    the ranks), NET (channels, GDR, per-device speed since 2.27). ``graph`` adds GRAPH, the only
    place NCCL before 2.27 prints port speeds. NCCL does not create ``log_dir``: the caller must,
    before launch, or NCCL silently logs to stdout instead.
    """
    return {
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,NET" + (",GRAPH" if graph else ""),
        "NCCL_DEBUG_FILE": str(Path(log_dir) / f"{LOG_FILE_PREFIX}%h.%p"),
    }


def find_nccl_logs(log_dir: str | os.PathLike[str]) -> list[Path]:
    """The per-rank files ``nccl_debug_env`` made NCCL write into ``log_dir`` (sorted; [] if none)."""
    d = Path(log_dir)
    if not d.is_dir():
        return []
    return sorted(p for p in d.glob(f"{LOG_FILE_PREFIX}*") if p.is_file())


@dataclass(frozen=True)
class Evidence:
    """One log line that proves a fact: the NCCL message (host/pid/thread prefix stripped)."""

    line: str
    source: str  # "nccl.node-1.12345:17": file (or "<text N>") and line number
    host: str | None = None

    def __str__(self) -> str:
        return self.line

    def cite(self) -> str:
        """The line quoted with where it came from, for failure messages."""
        return f"`{self.line}` ({self.source})"


@dataclass
class TransportFacts:
    """What the NCCL logs of one measurement prove about its transport.

    Each fact keeps the first line that shows it (``evidence``), so a report or a failure can quote
    the line instead of asserting a conclusion. Facts the logs do not show stay None/empty: a
    missing line is not evidence of anything.
    """

    # Every distinct network seen in ``Using network`` lines (normalized: IB, Socket, Libfabric),
    # in order of first appearance, with that first line. More than one means ranks disagree.
    networks: dict[str, Evidence] = field(default_factory=dict)
    # HCA port -> link layer ("IB", "RoCE"), from ``NET/IB : Using [0]mlx5_0:1/IB ...``.
    link_layers: dict[str, str] = field(default_factory=dict)
    link_layer_evidence: dict[str, Evidence] = field(default_factory=dict)
    # Network channel lines (``[send|receive] via NET/...``) and how many carry ``/GDRDMA``.
    net_channels: int = 0
    gdr_channels: int = 0
    # libfabric providers (normalized: "tcp;ofi_rxm" -> "tcp") and NCCL versions, first line each.
    providers: dict[str, Evidence] = field(default_factory=dict)
    nccl_versions: dict[str, Evidence] = field(default_factory=dict)
    socket_interfaces: list[str] = field(default_factory=list)  # "eth0:10.0.0.1<0>" from NET/Socket
    # Lines saying a transport was unavailable or disabled (the cause of a fallback).
    fallback: list[Evidence] = field(default_factory=list)
    # ``NET/Plugin`` lines: which external net plugin loaded or why not (matters for EFA).
    plugin_lines: list[Evidence] = field(default_factory=list)
    warnings: list[Evidence] = field(default_factory=list)  # NCCL WARN lines
    # ENV lines: variable -> (value as NCCL printed it, first line). Present only with ENV logged.
    env: dict[str, tuple[str, Evidence]] = field(default_factory=dict)
    socket_evidence: dict[str, Evidence] = field(default_factory=dict)  # interface -> its Using line
    # Per host: NCCL's network devices in index order, each a list of HCA ports (several when
    # NCCL merged a dual-port NIC), and the line that listed them.
    host_devices: dict[str, list[list[str]]] = field(default_factory=dict)
    host_devices_evidence: dict[str, Evidence] = field(default_factory=dict)
    # "host/port" or "host/NET/0" -> (Gbit/s, line): the 2.27+ device line or the GRAPH dump.
    speeds: dict[str, tuple[float, Evidence]] = field(default_factory=dict)
    nnodes: int | None = None  # from ``comm ... nNodes N ... MNNVL M``
    mnnvl: Evidence | None = None  # the first line with MNNVL 1
    gdr_disabled: list[Evidence] = field(default_factory=list)  # "GPU Direct RDMA Disabled for HCA"
    roce_gids: list[tuple[int, str, Evidence]] = field(default_factory=list)  # (index, prefix, line)
    efa_nics: dict[str, tuple[int, Evidence]] = field(default_factory=dict)  # host -> (found N nics, line)
    collnet: list[Evidence] = field(default_factory=list)  # CollNet (SHARP) channel lines
    # The line behind each headline fact: network, link_layer, gdr, provider, nccl_version.
    evidence: dict[str, Evidence] = field(default_factory=dict)
    sources: int = 0  # log files/texts read
    nccl_lines: int = 0  # lines recognised as NCCL log lines
    hosts: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # unreadable sources, inconsistent ranks

    @property
    def network(self) -> str | None:
        """The network NCCL used ("IB", "Socket", "Libfabric", another plugin's name, or None)."""
        return next(iter(self.networks), None)

    @property
    def provider(self) -> str | None:
        return next(iter(self.providers), None)

    @property
    def nccl_version(self) -> str | None:
        return next(iter(self.nccl_versions), None)

    @property
    def gdr(self) -> bool | None:
        """GPUDirect RDMA: True if any network channel uses it, False if none does, None if no
        network channel line was logged (no collective ran yet, or nothing crossed a node).

        Partial use is normal (GDR *read* for the send side is off by default on PCIe-only
        systems), so ``gdr_channels``/``net_channels`` tell how much.
        """
        if self.net_channels == 0:
            return None
        return self.gdr_channels > 0

    def summary(self) -> dict[str, Any]:
        """A JSON-ready record of the facts, to store with the measurement."""
        return {
            "network": self.network,
            "networks": list(self.networks),
            "link_layers": dict(self.link_layers),
            "gdr": self.gdr,
            "net_channels": self.net_channels,
            "gdr_channels": self.gdr_channels,
            "provider": self.provider,
            "nccl_version": self.nccl_version,
            "socket_interfaces": list(self.socket_interfaces),
            "env": {k: v for k, (v, _) in self.env.items()},
            "devices": {h: [list(d) for d in devs] for h, devs in self.host_devices.items()},
            "gbit": {k: g for k, (g, _) in self.speeds.items()},
            "nnodes": self.nnodes,
            "mnnvl": self.mnnvl is not None,
            "efa_nics": {h: n for h, (n, _) in self.efa_nics.items()},
            "collnet": self.collnet[0].line if self.collnet else None,
            "fallback": [e.line for e in self.fallback],
            "evidence": {k: e.line for k, e in self.evidence.items()},
            "hosts": list(self.hosts),
            "sources": self.sources,
            "nccl_lines": self.nccl_lines,
            "problems": list(self.problems),
        }

    def describe(self) -> str:
        """One line for a report or testcase system-out."""
        parts = [f"network={'/'.join(self.networks) or 'unknown'}"]
        if self.link_layers:
            layers = sorted(set(self.link_layers.values()))
            parts.append(f"link={'/'.join(layers)} ({', '.join(self.link_layers)})")
        if self.provider:
            parts.append(f"provider={'/'.join(self.providers)}")
        gdr = {True: "on", False: "off", None: "not seen"}[self.gdr]
        if self.net_channels:
            gdr += f" ({self.gdr_channels}/{self.net_channels} channels)"
        parts.append(f"gdr={gdr}")
        parts.append(f"nccl={self.nccl_version or 'unknown'}")
        if self.collnet:
            parts.append(f"collnet=`{self.collnet[0].line}`")
        if self.fallback:
            parts.append(f"fallback=`{self.fallback[0].line}`")
        return " ".join(parts)


# -- parsing ----------------------------------------------------------------------------------------

_LEVEL = re.compile(r"\bNCCL (INFO|WARN|TRACE) ")
_PREFIX = re.compile(r"([^\s:\]>]+):(\d+):(\d+) \[\d+\]")
_VERSION = re.compile(r"(?:^|\s)NCCL version (\d+\.\d+\.\d+\S*)")
_USING_NETWORK = re.compile(r"^Using network (\S.*?)\s*$")
_IB_USING = re.compile(r"^NET/IB ?: Using(?P<devs>.*?)\s*; OOB\b")
# One network device of that line: "[0]mlx5_0:1/IB" or the merged form of NCCL 2.20-2.23 and the
# HPC-X plugin, "[0]={[0] mlx5_0:1/IB, [1] mlx5_0:2/IB}".
_IB_NETDEV = re.compile(r"\[\d+\](?:=\{(?P<merged>[^}]*)\}|(?P<single>\S+))")
# "[0]mlx5_0:1/IB", "[1]mlx5_1:1:2/RoCE" (rail), "[2]mlx5_2:1::3/IB" (plane), "[0]mlx5_0:1/IB/SHARP"
_IB_DEV = re.compile(r"\[\d+\] ?([^\s:\[\]/]+):(\d+)(?::[^/\s]*)?/(IB|RoCE|UNSPECIFIED)\b")
# NET subsystem detail, newer releases: "NET/IB: [0] mlx5_0:uverbs0:1/RoCE provider=Mlx5 speed=..."
_IB_DEV_DETAIL = re.compile(r"^NET/IB ?: \[\d+\] ([^\s:]+):[^\s:]+:(\d+)/(IB|RoCE|UNSPECIFIED)\b")
# NCCL 2.27+ adds " provider=Mlx5 speed=400000 " (Mbit/s) to that device line.
_IB_SPEED = re.compile(r" speed=(\d+)\b")
# GRAPH dump (topo.cc ncclTopoPrintRec): "+ NET[50.0] - NET/0 (a0e3b90003e24c/1/50.000000)", GB/s
_GRAPH_NET = re.compile(r"^\+ NET\[[\d.]+\] - NET/([0-9A-Fa-f]+) \([0-9a-fA-F]+/\d+/([\d.]+)\)")
_ENV = re.compile(r"^(NCCL_[A-Z0-9_]+) set by environment to (.*?)\.?$")
_ENV_NET = re.compile(r"^(NCCL_SOCKET_IFNAME) set to (.*)$")
_COMM = re.compile(r"^comm 0x[0-9a-f]+ rank \d+ nRanks \d+ nNodes (\d+) .*MNNVL (\d+)")
_MNNVL = re.compile(r"^MNNVL (\d+) cliqueId")
_GDR_DISABLED = re.compile(r"^NET/\S+ ?: GPU Direct RDMA Disabled for HCA")
# RoCE QP line (net_ib.cc): "... GID 3 (0/1132A8C0FFFF0000) ..." or older "... GID 0 (80FE/...)"
_ROCE_GID = re.compile(r"^NET/IB: .*\bGID (-?\d+) \(([0-9A-Fa-f]+)/[0-9A-Fa-f]+\)")
_OFI_NICS = re.compile(r"^NET/OFI Selected [Pp]rovider is .*\(found (\d+) nics\)")
_COLLNET = re.compile(r"^CollNet \d+/\d+ : \d+ \[(?:send|receive)\] via COLLNET/")
_SOCKET_USING = re.compile(r"^NET/Socket ?: Using (.+)$")
_SOCKET_IF = re.compile(r"\[\d+\](\S+)")
_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is ([^\s,(]+)")
# "[send] via NET/IB/0/GDRDMA", "via NET/IB/1(9)/GDRDMA(PCI)/Shared", "via NET/AWS Libfabric/0"
_CHANNEL = re.compile(r"\[(?:send|receive)\] via NET/(?P<net>[^/\n]+?)/(?P<dev>\d+)(?:\(\d+\))?(?P<flags>\S*)")
# A plugin's own verdict on itself, preferred over its symptoms when quoting the cause.
_VERDICT = re.compile(r"Failed to initialize (?:any )?NET plugin|Error: network .+ not found|initialization failed")
_FALLBACK = re.compile(
    "|".join(
        (
            r"Failed to initialize (?:any )?NET plugin",
            r"NET/IB ?: No device found",
            r"NET/IB ?: No IP interface found",
            r"(?:Failed to|Could not|Unable to) (?:open|load) libibverbs",
            r"Error: network .+ not found",
            r"NCCL_IB_DISABLE set by environment to 1\b",
            (r"NET/OFI .*(?:initialization failed|fi_getinfo\(\) call failed"
             r"|Couldn't find any optimal provider|No eligible providers)"),
        )
    )
)


def _normalize_network(raw: str) -> str:
    """NCCL's plugin name -> the transport family: the HPC-X ``IBext_v8`` plugin is IB verbs, and
    aws-ofi-nccl called itself ``AWS Libfabric`` before 1.12."""
    low = raw.strip().lower()
    if low == "ib" or low.startswith("ibext"):
        return "IB"
    if low == "socket":
        return "Socket"
    if "libfabric" in low or low == "ofi":
        return "Libfabric"
    return raw.strip()


def _sources(items: LogSource | Iterable[LogSource] | None, problems: list[str]) -> list[tuple[str, str]]:
    """(label, text) for each log: a Path is a file or a directory of nccl.* files; a str is a
    path if it names an existing file or directory, otherwise the text of a log."""
    if items is None:
        return []
    if isinstance(items, (str, bytes, os.PathLike)) or not isinstance(items, Iterable):
        items = [items]
    out: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        if isinstance(item, bytes):
            out.append((f"<text {i}>", item.decode("utf-8", errors="replace")))
            continue
        if isinstance(item, str):
            looks_like_path = item and "\n" not in item and len(item) < 4096
            if not (looks_like_path and os.path.exists(item)):
                out.append((f"<text {i}>", item))
                continue
        if not isinstance(item, (str, os.PathLike)):
            problems.append(f"ignored log source of type {type(item).__name__}: give a path or the log's text")
            continue
        path = Path(item)
        files = find_nccl_logs(path) if path.is_dir() else [path]
        if path.is_dir() and not files:
            problems.append(f"no {LOG_FILE_PREFIX}* files in {path}")
        for f in files:
            try:
                out.append((f.name, f.read_text(encoding="utf-8", errors="replace")))
            except OSError as e:
                problems.append(f"cannot read {f}: {e.strerror or e}")
    return out


def parse_nccl_logs(paths_or_texts: LogSource | Iterable[LogSource] | None) -> TransportFacts:
    """Read NCCL INFO logs (per-rank files, a directory of them, or texts) into ``TransportFacts``.

    Never raises on bad input: unreadable files and foreign text end up in ``problems`` or simply
    prove nothing, and ``check_transport`` says what is missing.
    """
    facts = TransportFacts()
    sources = _sources(paths_or_texts, facts.problems)
    facts.sources = len(sources)
    hosts: dict[str, None] = {}
    first_net_line: Evidence | None = None
    first_gdr_line: Evidence | None = None
    for label, text in sources:
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if "NCCL" not in line and "NET/" not in line:
                continue
            m = _LEVEL.search(line)
            if m:
                level, msg = m.group(1), line[m.end():].strip()
                pm = _PREFIX.search(line[: m.start()])
                host = pm.group(1) if pm else None
            else:
                vm = _VERSION.search(line)
                if not vm:
                    continue
                level, msg, host = "INFO", line[vm.start():].strip(), None
            facts.nccl_lines += 1
            if host:
                hosts.setdefault(host, None)
            ev = Evidence(msg, f"{label}:{lineno}", host)

            if level == "WARN":
                facts.warnings.append(ev)
            if (vm := _VERSION.search(msg)) and msg.startswith("NCCL version"):
                facts.nccl_versions.setdefault(vm.group(1), ev)
            elif um := _USING_NETWORK.match(msg):
                facts.networks.setdefault(_normalize_network(um.group(1)), ev)
            elif im := _IB_USING.match(msg):
                devices = []
                for nd in _IB_NETDEV.finditer(im.group("devs")):
                    ports = _IB_DEV.findall(f"[0]{nd.group('single')}" if nd.group("single") else nd.group("merged"))
                    for dev, port, layer in ports:
                        _add_link_layer(facts, f"{dev}:{port}", layer, ev)
                    if ports:
                        devices.append([f"{dev}:{port}" for dev, port, _ in ports])
                if devices:
                    facts.host_devices.setdefault(host or label, devices)
                    facts.host_devices_evidence.setdefault(host or label, ev)
            elif gn := _GRAPH_NET.match(msg):
                facts.speeds.setdefault(f"{host or label}/NET/{int(gn.group(1), 16)}", (gbyte_to_gbit(float(gn.group(2))), ev))
            elif en := (_ENV.match(msg) or _ENV_NET.match(msg)):
                facts.env.setdefault(en.group(1), (en.group(2).strip(), ev))
            elif cn := _COMM.match(msg):
                facts.nnodes = max(facts.nnodes or 0, int(cn.group(1)))
                if cn.group(2) != "0" and facts.mnnvl is None:
                    facts.mnnvl = ev
            elif (mn := _MNNVL.match(msg)) and mn.group(1) != "0":
                facts.mnnvl = facts.mnnvl or ev
            elif _GDR_DISABLED.match(msg):
                facts.gdr_disabled.append(ev)
            elif gm := _ROCE_GID.match(msg):
                facts.roce_gids.append((int(gm.group(1)), gm.group(2).upper(), ev))
            elif _COLLNET.match(msg):
                facts.collnet.append(ev)
            elif dm := _IB_DEV_DETAIL.match(msg):
                _add_link_layer(facts, f"{dm.group(1)}:{dm.group(2)}", dm.group(3), ev)
                if sp := _IB_SPEED.search(msg):
                    port = f"{host or label}/{dm.group(1)}:{dm.group(2)}"
                    facts.speeds.setdefault(port, (mbit_to_gbit(int(sp.group(1))), ev))
            elif sm := _SOCKET_USING.match(msg):
                for iface in _SOCKET_IF.findall(sm.group(1)):
                    if iface not in facts.socket_interfaces:
                        facts.socket_interfaces.append(iface)
                        facts.socket_evidence[iface] = ev
            elif pr := _PROVIDER.match(msg):
                facts.providers.setdefault(pr.group(1).split(";")[0].lower(), ev)
                if nm := _OFI_NICS.match(msg):
                    facts.efa_nics.setdefault(host or label, (int(nm.group(1)), ev))
            elif cm := _CHANNEL.search(msg):
                facts.net_channels += 1
                if "GDRDMA" in cm.group("flags"):
                    facts.gdr_channels += 1
                    first_gdr_line = first_gdr_line or ev
                else:
                    first_net_line = first_net_line or ev
            elif msg.startswith("NET/Plugin"):
                facts.plugin_lines.append(ev)
            if _FALLBACK.search(msg) or (level == "WARN" and msg.startswith("NET/OFI")):
                facts.fallback.append(ev)

    facts.hosts = list(hosts)
    for key, found in (("network", facts.networks), ("provider", facts.providers),
                       ("nccl_version", facts.nccl_versions)):
        if found:
            facts.evidence[key] = next(iter(found.values()))
    if facts.link_layer_evidence:
        facts.evidence["link_layer"] = next(iter(facts.link_layer_evidence.values()))
    if facts.gdr is not None:
        facts.evidence["gdr"] = first_gdr_line if facts.gdr else first_net_line  # type: ignore[assignment]
    if len(facts.networks) > 1:
        facts.problems.append(f"ranks report different networks: {', '.join(facts.networks)}")
    if len(facts.nccl_versions) > 1:
        facts.problems.append(f"ranks report different NCCL versions: {', '.join(facts.nccl_versions)}")
    return facts


def _add_link_layer(facts: TransportFacts, port: str, layer: str, ev: Evidence) -> None:
    # Hosts usually share HCA names; a port whose link layer differs on another host is kept under
    # its own key so that a mixed cluster stays visible instead of one host hiding the other.
    known = facts.link_layers.get(port)
    if known is None:
        facts.link_layers[port] = layer
        facts.link_layer_evidence[port] = ev
    elif known != layer:
        key = f"{port}@{ev.host or ev.source}"
        facts.link_layers.setdefault(key, layer)
        facts.link_layer_evidence.setdefault(key, ev)


# -- checking ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NicInventory:
    """What one node of a fabric has: how many NICs (HCA ports, EFA devices) and how fast each is.

    From the ini (``fabric_inventory``: ``ib.nics = 8``, ``ib.gbit_per_nic = 400``) or from a node's
    sysfs (``preflight.inventory``). None: not known, so not judged.
    """

    nics: int | None = None
    gbit_per_nic: float | None = None
    source: str = "ini fabric_inventory"


_INVENTORY_KEYS = {"nics": int, "gbit_per_nic": float}


def parse_inventory(lines: Iterable[str], fabrics: Iterable[str]) -> dict[str, NicInventory]:
    """The ini's ``fabric_inventory`` lines (``ib.nics = 8``, ``ib.gbit_per_nic = 400``) by fabric.

    Raises ValueError naming the line and how to write it.
    """
    known = list(fabrics)
    values: dict[str, dict[str, Any]] = {}
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        target, sep, value = (x.strip() for x in line.partition("="))
        fabric, _, key = target.partition(".")
        try:
            number = _INVENTORY_KEYS[key](value) if sep and fabric in known else None
        except (KeyError, ValueError):
            number = None
        if number is None or not 0 < number < float("inf"):
            raise ValueError(f"fabric inventory {line!r}: write 'FABRIC.nics = N' or 'FABRIC.gbit_per_nic = GBIT' "
                             f"with a positive number and FABRIC one of {', '.join(known)} (e.g. 'ib.nics = 8')")
        values.setdefault(fabric, {})[key] = number
    return {name: NicInventory(**v) for name, v in values.items()}


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
    net = _normalize_network(fab.nccl_env.get("NCCL_NET", ""))
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
    verdicts = [ev for ev in candidates if _VERDICT.search(ev.line)]
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
