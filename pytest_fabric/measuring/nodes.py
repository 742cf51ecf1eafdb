"""Every node checked before the first launch, and the bad ones left out.

A real cluster's first night fails on one node: its shared filesystem is not mounted, its GPU is
missing, its link is down. Found by a launch, such a node errors every case that includes it, every
night, and nothing says which node it is. So before the first launch every node of the cluster (the
Slurm allocation, the hostfile, the emulated nodes) runs ``python -m pytest_fabric.measuring.nodes``
the way ranks are started (``Cluster.run_on_each``: the same launcher, environment and container),
each on its own, so that one bad node cannot hide the others. Each writes what it found into the
run directory with the session's token; the harness reads them back and judges each node:

- it ran: this Python and the package import there, and what the ranks import (torch, transformers)
  imports at the version most nodes have;
- it sees the run directory (ranks read their configuration there and write their results): its
  token reached the harness; a node that wrote it into a directory of its own (``/tmp`` is per node)
  or could not write it at all does not share the storage;
- it is a host of its own (two names for one machine would put two nodes' ranks on one set of GPUs);
- its GPUs: at least ``--gpus-per-node`` visible, where ranks run on GPUs;
- its links: the interface the sockets use (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``, else any
  but loopback) is up, and on GPUs whatever ``preflight.check_node`` asks of each fabric (HCA ports
  ACTIVE, their rate, RoCE GIDs, GPUDirect RDMA).

A node with a problem is left out for the session (``Cluster.leave_out``): launches take N of the
healthy nodes, and the header, the summary and the JUnit properties name the ones left out and why.
Where no node sees the run directory the directory is wrong, not the nodes: the session is refused
in one line naming the option.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..cluster.base import Cluster
from ..core.fabrics import Fabric
from .nccl_evidence import select_names
from .preflight import NodeFacts, check_node, read_node, socket_names, visible_gpus

# The probe's exit status where the run directory is not there on its node.
NO_RUN_DIR = 3
# How long the probe may take on every node together (python start, sysfs, nvidia-smi).
CHECK_DEADLINE_S = 120.0
_RUN_DIR = "cannot see the run directory"
# Where the session keeps its nodes' verdicts, in its directory: xdist workers share one check.
NODES_FILE = "nodes.json"
# What every rank imports: a node whose image lacks one, or has another version than the other nodes,
# would fail its launches or measure another job.
RANK_PACKAGES = ("torch", "transformers")
_CANNOT_IMPORT = "cannot import"
# Variables naming the interface sockets use: NCCL's (GPU) and gloo's (CPU).
SOCKET_IFNAME = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


@dataclass
class NodeCheck:
    """One node's verdict: what it showed, and its problems (none: healthy)."""

    name: str
    problems: list[str] = field(default_factory=list)
    hostname: str | None = None
    gpus: int | None = None
    mem_available_gib: float | None = None
    links: str = ""  # the interfaces and ports the node showed, in a few words
    facts: NodeFacts | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["facts"] = self.facts.to_dict() if self.facts is not None else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeCheck:
        facts = NodeFacts.from_dict(data["facts"]) if data.get("facts") else None
        return cls(data["name"], list(data.get("problems", [])), data.get("hostname"), data.get("gpus"),
                   data.get("mem_available_gib"), data.get("links", ""), facts)


class RunDirError(RuntimeError):
    """No node sees the run directory: the option is wrong, not the nodes."""


def check_nodes(cluster: Cluster, names: Sequence[str], directory: Path, fabrics: Sequence[Fabric],
                gpus_per_node: int, device: str, deadline_s: float = CHECK_DEADLINE_S) -> list[NodeCheck]:
    """Run the probe on every node of ``names`` and judge each (the module docstring says how).

    ``directory``: the session's, under --run-dir. ``device``: --device; ``auto`` runs on GPUs where
    any node shows one, and then a node without enough is unfit. Raises RunDirError where no node
    sees the run directory."""
    token = uuid.uuid4().hex
    out = directory / "nodes" / token[:12]
    out.mkdir(parents=True, exist_ok=True)
    outcome = cluster.run_on_each(
        lambda name: ["-m", "pytest_fabric.measuring.nodes", "--node", name, "--out", str(out), "--token", token],
        names, out, deadline_s)
    procs = {p.name: p for p in outcome.procs}
    reports = {name: _read_report(out / f"{name}.json", token) for name in names}
    on_gpus = device == "cuda" or (device == "auto" and any((r or {}).get("gpus") for r in reports.values()))
    checks = []
    for name in names:
        check = NodeCheck(name)
        proc = procs.get(name)
        report = reports[name]
        if proc is None or proc.returncode != 0:
            code = "killed at the deadline" if proc is None or proc.returncode is None else \
                f"exit code {proc.returncode}"
            if proc is not None and proc.returncode == NO_RUN_DIR:
                check.problems.append(f"{_RUN_DIR} {directory.parent} (--run-dir): it is not on storage this node "
                                      f"mounts")
            else:
                last = _last_line(proc.tail() if proc is not None else "")
                check.problems.append(f"the node probe (python -m pytest_fabric.measuring.nodes) failed, {code}: "
                                      f"{last or 'no output'}")
        elif report is None:
            check.problems.append(f"{_RUN_DIR} {directory.parent} (--run-dir): it wrote its token into a directory "
                                  f"of its own by that name (node-local there: /tmp, /var/tmp and /dev/shm are per "
                                  f"node)")
        else:
            _judge(check, report, fabrics, gpus_per_node, on_gpus)
        checks.append(check)
    _same_host(checks)
    _same_software(checks, reports)
    if checks and all(any(_RUN_DIR in p for p in c.problems) for c in checks):
        raise RunDirError(f"--run-dir {directory.parent}: no node sees it ({', '.join(c.name for c in checks)} "
                          f"wrote nothing the harness can read): /tmp, /var/tmp and /dev/shm are per node; give a "
                          f"directory on storage every node mounts (Lustre, GPFS, an NFS home)")
    return checks


def _read_report(path: Path, token: str) -> dict[str, Any] | None:
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) and report.get("token") == token else None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _judge(check: NodeCheck, report: Mapping[str, Any], fabrics: Sequence[Fabric], gpus_per_node: int,
           on_gpus: bool) -> None:
    facts = NodeFacts.from_dict(report["facts"])
    check.facts, check.hostname = facts, report.get("hostname")
    check.gpus, check.mem_available_gib = report.get("gpus"), report.get("mem_available_gib")
    check.links = ", ".join(
        [f"{n} {facts.operstate.get(n, '?')}" + (f" {facts.speeds[n] / 1000:g}G" if n in facts.speeds else "")
         for n in socket_names(facts)]
        + [f"{n} {p.state.split(':')[-1].strip()} {p.gbit:g}G" if p.gbit else f"{n} {p.state}"
           for n, p in facts.ports.items()])
    if on_gpus and (check.gpus or 0) < gpus_per_node:
        check.problems.append(f"{check.gpus or 0} GPU(s) visible, {gpus_per_node} needed (--gpus-per-node)")
    check.problems += socket_problems(facts)
    if on_gpus:
        for fabric in fabrics:
            check.problems += check_node(fabric, facts, {**facts.env, **fabric.nccl_env})


def socket_problems(facts: NodeFacts) -> list[str]:
    """Whether the interface the ranks' sockets use is up: the one ``NCCL_SOCKET_IFNAME`` or
    ``GLOO_SOCKET_IFNAME`` names where the node's environment sets one, else any but loopback."""
    candidates = socket_names(facts)
    for variable in SOCKET_IFNAME:
        spec = facts.env.get(variable)
        if not spec:
            continue
        chosen = select_names(candidates, spec)
        if not chosen:
            return [f"{variable}={spec} matches no interface (it has: {', '.join(candidates) or 'none'})"]
        down = [n for n in chosen if facts.operstate.get(n, "unknown") in ("down", "lowerlayerdown", "notpresent")]
        if len(down) == len(chosen):
            return [f"link down: {', '.join(down)} ({variable}={spec}; /sys/class/net/*/operstate)"]
        return []
    if candidates and all(facts.operstate.get(n) == "down" for n in candidates):
        return [f"link down: {', '.join(candidates)} (no interface but loopback is up; /sys/class/net/*/operstate)"]
    return []


def _same_software(checks: list[NodeCheck], reports: Mapping[str, Mapping[str, Any] | None]) -> None:
    """Each node imports what the ranks import, at the version most nodes have: a node without it,
    or with another version (a stale image), would fail its launches or measure another job."""
    versions: dict[str, dict[str, str]] = {}
    for check in checks:
        for package, version in ((reports.get(check.name) or {}).get("software") or {}).items():
            versions.setdefault(package, {})[check.name] = version
    for package, by_node in versions.items():
        imported = [v for v in by_node.values() if not v.startswith(_CANNOT_IMPORT)]
        usual = max(set(imported), key=imported.count) if imported else None
        for check in checks:
            version = by_node.get(check.name)
            if version is not None and version.startswith(_CANNOT_IMPORT):
                check.problems.append(f"{package}: {version}")
            elif version is not None and version != usual:
                check.problems.append(f"{package} {version} where the other nodes have {usual}")


def _same_host(checks: list[NodeCheck]) -> None:
    """Two nodes that are one machine (a hostfile naming a host twice, by name and address)."""
    seen: dict[str, str] = {}
    for check in checks:
        if check.hostname is None:
            continue
        if check.hostname in seen:
            check.problems.append(f"is the same host as {seen[check.hostname]} (hostname {check.hostname}): their "
                                  f"ranks would share its GPUs")
        else:
            seen[check.hostname] = check.name


def table(checks: Sequence[NodeCheck]) -> list[str]:
    """The nodes as one table: name, host, GPUs, memory, links, and the verdict."""
    rows = [("node", "host", "GPUs", "mem GiB", "links", "verdict")]
    for c in checks:
        rows.append((c.name, c.hostname or "?", "?" if c.gpus is None else str(c.gpus),
                     "?" if c.mem_available_gib is None else f"{c.mem_available_gib:.0f}", c.links or "-",
                     "ok" if c.ok else "LEFT OUT: " + "; ".join(c.problems)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]


def left_out(checks: Sequence[NodeCheck]) -> dict[str, str]:
    """Node -> why, for every node with a problem."""
    return {c.name: "; ".join(c.problems) for c in checks if not c.ok}


def save(checks: Sequence[NodeCheck], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([c.to_dict() for c in checks], indent=1))
    tmp.replace(path)


def load(path: Path) -> list[NodeCheck] | None:
    try:
        return [NodeCheck.from_dict(c) for c in json.loads(path.read_text())]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / (1 << 20)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _software() -> dict[str, str]:
    """What the ranks import, as this node has it: each package's version, or why it cannot import."""
    found = {}
    for name in RANK_PACKAGES:
        try:
            found[name] = importlib.import_module(name).__version__
        except Exception as exc:  # noqa: BLE001 - a broken install raises anything; it is this node's problem
            found[name] = f"{_CANNOT_IMPORT}: {type(exc).__name__}: {exc}"
    return found


def main(argv: list[str] | None = None) -> int:
    """On one node: write what this node shows, with the session's token, as OUT/<NODE>.json."""
    parser = argparse.ArgumentParser(prog="python -m pytest_fabric.measuring.nodes", description=main.__doc__)
    parser.add_argument("--node", required=True, help="the node's name in the cluster")
    parser.add_argument("--out", required=True, help="the session's directory for the reports (the run directory)")
    parser.add_argument("--token", required=True, help="the session's token")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not out.is_dir():
        print(f"pytest-fabric: {socket.gethostname()} ({args.node}) cannot see {out}: the run directory is not on "
              f"storage this node mounts", file=sys.stderr)
        return NO_RUN_DIR
    facts = read_node(host=args.node)
    facts.env = {k: v for k, v in os.environ.items()
                 if (k.startswith("NCCL_") and "DEBUG" not in k) or k in SOCKET_IFNAME}
    report = {"token": args.token, "hostname": socket.gethostname(), "facts": facts.to_dict(),
              "gpus": visible_gpus(), "mem_available_gib": _mem_available_gib(), "python": sys.executable,
              "software": _software()}
    target = out / f"{args.node}.json"
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
