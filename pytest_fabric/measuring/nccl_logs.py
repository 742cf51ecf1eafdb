"""NCCL's own debug log, read: which network, ports, channels and settings NCCL really used.

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

``nccl_evidence.check_transport`` judges the facts read here. Plain module: no pytest imports; the
workload sets the environment (``nccl_debug_env``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.units import gbyte_to_gbit, mbit_to_gbit

# A log source: a file, a directory of ``nccl.*`` files, or the text of a log.
LogSource = str | Path | bytes

LOG_FILE_PREFIX = "nccl."

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
PLUGIN_FAILED = re.compile(r"Failed to initialize (?:any )?NET plugin|Error: network .+ not found|initialization failed")
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


def normalize_network(raw: str) -> str:
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
                facts.networks.setdefault(normalize_network(um.group(1)), ev)
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
