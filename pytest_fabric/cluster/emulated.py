"""The emulated cluster: N nodes are N network namespaces on this machine, wired to one switch.

    node ns "pf<pid>-<k>-n<i>"  fab0 (198.18.0.<i+1>/24) --veth-- n<i> [bridge br0]  ns "pf<pid>-<k>-sw"

Each node's link is shaped in both directions with ``tc tbf`` to the fabric's rate (netem is not
available here), so a node's NIC has that bandwidth full-duplex, as on a real fabric. Traffic
between ranks of one node stays inside its namespace (loopback), like NVLink inside a real node.

A node shares with the others only what real nodes share. Each has its own mount and UTS
namespaces, held by one small process per node (``EmulatedNode.holder``) that every process of the
node joins with ``nsenter``: private ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (fresh tmpfs), its own
host name (``node<i>``) and an ``/etc/hosts`` naming every node. The rest of the machine's files
are the cluster's shared filesystem (Lustre or NFS on a real cluster: the run directory must be
there) and its software image; the software a node runs (this Python, the package) stays visible
even where it lies under ``/tmp``, as it would be installed on every node.

Everything lives inside namespaces created for one launch, so deleting them deletes every link and
ends every node's processes; namespaces left by a harness that was killed outright are swept on
the next start.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import site
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import count
from pathlib import Path

from .base import (_PACKAGE_ROOT, Cluster, ClusterUnavailable, LaunchRequest, OnThisMachine, program_env,
                   rank_env, THREADS_PER_RANK, torchrun_argv)
from .supervisor import LaunchOutcome, ProcSpec, supervise
from ..core.units import mbit_to_bytes_per_s

# RFC 2544 benchmark range: never routed, never anybody's real network.
SUBNET = "198.18.0"
IFNAME = "fab0"
# The management network of a cluster whose nodes also have one (EmulatedNetwork(management=True)).
MANAGEMENT_SUBNET = "198.18.1"
MANAGEMENT_IFNAME = "mgmt0"
PREFIX = "pf"
_launches = count()


# What every real node has of its own: these directories are a fresh tmpfs on each emulated node.
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm")
# Where a node's set-up sees the machine's own private directories while it mounts its own over them.
_STAGE = "/run/pytest-fabric-stage"
# How long a node's holder may take to set its namespaces up.
NODE_READY_S = 20.0

# Run by each node's holder (argv: node name, /etc/hosts text, paths to keep visible): private
# directories, host name, hosts file, then it waits, holding the namespaces for the node's processes.
_NODE_SETUP = r"""
set -e
name=$1; hosts=$2; shift 2
for dir in /tmp /var/tmp /dev/shm; do
  [ -d "$dir" ] || continue
  mount --rbind "$dir" "$STAGE"
  mount -t tmpfs -o mode=1777 "pytest-fabric-$name" "$dir"
  for keep in "$@"; do
    case "$keep" in "$dir"/*)
      rel=${keep#"$dir"/}; mkdir -p "$dir/$rel"; mount --rbind "$STAGE/$rel" "$dir/$rel";;
    esac
  done
  umount -l "$STAGE"
done
printf '%s' "$hosts" > /tmp/.pytest-fabric-hosts
mount --bind /tmp/.pytest-fabric-hosts /etc/hosts
hostname "$name"
echo ready
exec sleep infinity
"""


@dataclass(frozen=True)
class EmulatedNode:
    name: str
    netns: str
    address: str
    # The process holding this node's mount and UTS namespaces (0: not started).
    holder: int = 0

    def exec_argv(self, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` run on this node: in its network, mount and UTS namespaces, in ``cwd`` (default
        the caller's) where the node sees that directory, else in ``/``."""
        if not self.holder:
            raise RuntimeError(f"{self.name} has no namespaces yet (EmulatedNetwork not entered)")
        wd = cwd or os.getcwd()
        return ["nsenter", f"--target={self.holder}", "--net", "--mount", "--uts",
                f"--wd={wd if visible_on_nodes(wd) else '/'}", *argv]


def software_paths() -> list[str]:
    """What a node runs that must be there on every node, as a real cluster installs it (or mounts
    it into the container): this Python, its packages, and the package the ranks import."""
    paths = {_PACKAGE_ROOT, sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *site.getsitepackages()}
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        paths.add(site.getusersitepackages())
    return sorted(os.path.realpath(p) for p in paths if p)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def visible_on_nodes(path: str | os.PathLike[str]) -> bool:
    """Whether an emulated node sees the machine's ``path``: anywhere but the node-private
    directories, except the software every node has."""
    real = os.path.realpath(path)
    if not any(_under(real, d) for d in PRIVATE_DIRS):
        return True
    return any(_under(real, keep) for keep in software_paths())


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterUnavailable(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


# How long the token bucket lets traffic through at the veth's own speed. A full bucket passes at
# once, so a transfer short against it beats the link: with a bucket of two 4 ms timer ticks
# (390 KB at 400 Mbit/s) all_reduce at 16 KiB measured 1.5 Gbit/s busbw on the 0.4 Gbit/s link.
# Too small a bucket loses the rate instead whenever the sender waits for a CPU (300 us: ib all_reduce
# busbw 83-93% of its 2 Gbit/s on this loaded machine; 8 ms: 95%). 4 ms keeps the rate, and the
# bandwidth workload times every payload over at least 0.1 s (25 buckets), so that no payload can
# appear more than 4% faster than the link (a bucket's worth of bytes over the time).
BURST_S = 4e-3
# tbf drops a packet larger than its bucket: two full-size Ethernet frames at least.
MIN_BURST_BYTES = 3200


def burst_bytes(mbit: float) -> int:
    """The token bucket of a link shaped to ``mbit``."""
    return max(MIN_BURST_BYTES, int(mbit_to_bytes_per_s(mbit) * BURST_S))


def _tbf(netns: str, dev: str, mbit: float) -> None:
    _ip("netns", "exec", netns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
        "rate", f"{mbit}mbit", "burst", str(burst_bytes(mbit)), "latency", "50ms")


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _delete_namespace(netns: str) -> None:
    # Processes inside keep a namespace's network alive after `ip netns del`: kill them first.
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "del", netns], capture_output=True)


def sweep_stale_namespaces() -> list[str]:
    """Delete namespaces of harness processes that no longer exist (killed with SIGKILL, say)."""
    removed = []
    for netns in _namespaces():
        owner = netns[len(PREFIX):].split("-", 1)[0] if netns.startswith(PREFIX) else ""
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            _delete_namespace(netns)
            removed.append(netns)
    return removed


def owned_namespaces(pid: int | None = None) -> list[str]:
    tag = f"{PREFIX}{pid or os.getpid()}-"
    return [n for n in _namespaces() if n.startswith(tag)]


class EmulatedNetwork:
    """Namespaces, a switch and shaped links for one launch; a context manager that always cleans up."""

    def __init__(self, nodes: int, mbit: float | None, management: bool = False) -> None:
        """``management``: each node also gets a management link (``mgmt0``, unshaped, on a switch of
        its own), whose address is the node's ``address`` (what daemons, ssh and the rendezvous use),
        as a real cluster's Ethernet beside its fabric: the fabric link (``fab0``) can then go down
        while the node stays reachable."""
        self.tag = f"{PREFIX}{os.getpid()}-{next(_launches)}"
        self.switch = f"{self.tag}-sw"
        self.mbit = mbit
        self.management = management
        subnet = MANAGEMENT_SUBNET if management else SUBNET
        self.nodes = [EmulatedNode(f"node{i}", f"{self.tag}-n{i}", f"{subnet}.{i + 1}") for i in range(nodes)]
        self._created: list[str] = []
        self._holders: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> EmulatedNetwork:
        try:
            self._create()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _start_holders(self) -> None:
        """One holder per node (``_NODE_SETUP``), all started before any is waited for."""
        os.makedirs(_STAGE, exist_ok=True)
        hosts = "127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{n.address} {n.name}\n" for n in self.nodes)
        procs = [subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--uts", "--propagation", "private", "--fork",
             "sh", "-c", _NODE_SETUP, "pytest-fabric-node", node.name, hosts, *software_paths()],
            env={**os.environ, "STAGE": _STAGE}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True) for node in self.nodes]
        self._holders = procs
        for i, (node, proc) in enumerate(zip(self.nodes, procs, strict=True)):
            if not _ready(proc, NODE_READY_S):
                proc.kill()
                err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                raise ClusterUnavailable(f"cannot give emulated {node.name} its own /tmp and host name "
                                         f"(unshare --mount --uts): {err or 'no answer in %gs' % NODE_READY_S}")
            # The holder is unshare's child (--fork): the process whose namespaces the node's processes join.
            self.nodes[i] = replace(node, holder=_only_child(proc.pid))

    def _add_namespace(self, netns: str) -> None:
        _ip("netns", "add", netns)
        self._created.append(netns)
        _ip("-n", netns, "link", "set", "lo", "up")

    def _create(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        if self.management:
            _ip("-n", self.switch, "link", "add", "br1", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br1", "up")
        for i, node in enumerate(self.nodes):
            port = f"n{i}"
            self._add_namespace(node.netns)
            self._wire(node.netns, IFNAME, f"{SUBNET}.{i + 1}", port, "br0")
            if self.management:
                self._wire(node.netns, MANAGEMENT_IFNAME, node.address, f"m{i}", "br1")
            if self.mbit:
                _tbf(node.netns, IFNAME, self.mbit)  # node -> switch
                _tbf(self.switch, port, self.mbit)  # switch -> node
        self._start_holders()

    def _wire(self, netns: str, ifname: str, address: str, port: str, bridge: str) -> None:
        """A veth from the node's ``ifname`` (``address``/24) to ``port`` on the switch's ``bridge``."""
        _ip("-n", netns, "link", "add", ifname, "type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", ifname)
        _ip("-n", netns, "link", "set", ifname, "up")
        _ip("-n", self.switch, "link", "set", port, "master", bridge)
        _ip("-n", self.switch, "link", "set", port, "up")

    def remove(self) -> None:
        # A node's holder and every process that joined it are in its network namespace: deleting
        # the namespace kills them (``_delete_namespace``), and with them the node's private mounts.
        for netns in reversed(self._created):
            _delete_namespace(netns)
        self._created.clear()
        for proc in self._holders:
            proc.kill()
            proc.wait()
        self._holders.clear()


def _ready(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether ``proc`` printed its ``ready`` line within ``timeout_s``."""
    assert proc.stdout is not None
    if not select.select([proc.stdout], [], [], timeout_s)[0]:
        return False
    return proc.stdout.readline().strip() == b"ready"


def _only_child(pid: int, timeout_s: float = 5.0) -> int:
    """The one child of ``pid`` (unshare --fork's), waiting for it to appear."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            children = []
        if children:
            return int(children[0])
        if time.monotonic() > deadline:
            raise ClusterUnavailable(f"the namespace holder {pid} started no process")
        time.sleep(0.01)


def check_available() -> None:
    """Raise ClusterUnavailable, saying what is missing, when namespaces clearly cannot be made here.

    Cheap (no side effects): it runs at option parsing. ``EmulatedCluster.prepare`` does the real probe.
    """
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise ClusterUnavailable("the emulated cluster needs `ip` and `tc` (Debian: apt-get install iproute2)")
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        raise ClusterUnavailable("the emulated cluster needs `unshare` and `nsenter` (Debian: apt-get install "
                                 "util-linux)")
    if os.geteuid() != 0:
        raise ClusterUnavailable("the emulated cluster needs root to create network namespaces "
                                 "(run as root, or use --cluster local)")


class EmulatedCluster(OnThisMachine, Cluster):
    name = "emulated"
    realizes_fabrics = True
    # The fabric here is the shaped link, not an HCA: NCCL pre-flight and transport proof do not apply.
    checks_here = False
    proves_transport = False

    def nccl_env(self, fabric) -> dict[str, str]:
        # Whatever the fabric, the only network between emulated nodes is the shaped veth link,
        # so NCCL (on a GPU host) must use sockets on it; gloo is told the same interface.
        return {**fabric.nccl_env, "NCCL_NET": "Socket", "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": f"={IFNAME}"}

    def __init__(self) -> None:
        check_available()

    def prepare(self) -> None:
        sweep_stale_namespaces()
        probe = f"{PREFIX}{os.getpid()}-probe"
        proc = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"cannot create a network namespace: {proc.stderr.strip()}")
        _delete_namespace(probe)

    def describe(self) -> str:
        return "emulated (network namespaces on this machine, links shaped with tc tbf)"

    def max_nodes(self) -> int:
        return 250  # one /24 subnet

    def launch(self, request: LaunchRequest, on_tick: Callable[[float], None] | None = None) -> LaunchOutcome:
        with EmulatedNetwork(request.nodes, request.fabric.emulated_mbit) as net:
            for i in request.links_down:
                if i < len(net.nodes):  # an injected fault: this node's cable is out
                    _ip("-n", net.nodes[i].netns, "link", "set", IFNAME, "down")
            on_tick, notes = self._cutting_links(request, net, on_tick)
            notes += [f"injected fault: nojoin: {net.nodes[i].name}'s link left down by the harness"
                      for i in request.links_down if i < len(net.nodes)]
            head = net.nodes[0].address
            specs = [
                ProcSpec(
                    node.name,
                    node.exec_argv(self.pin(i, request.nodes, torchrun_argv(request, i, head, node.address),
                                            request.procs_per_node)),
                    rank_env(request, f"{node.name}/{node.address}", THREADS_PER_RANK,
                             {**self.nccl_env(request.fabric), "GLOO_SOCKET_IFNAME": IFNAME}),
                )
                for i, node in enumerate(net.nodes)
            ]
            outcome = supervise(specs, request.workdir, request.deadline_s, on_tick)
            outcome.notes += notes
            return outcome

    def run_on_each(self, args_of: Callable[[str], list[str]], names: Sequence[str], workdir: Path,
                    deadline_s: float) -> LaunchOutcome:
        """Each program on a node of its own, made for it as a launch's are (private /tmp, own name)."""
        with EmulatedNetwork(len(names), None) as net:
            specs = [ProcSpec(name, node.exec_argv([sys.executable, *args_of(name)]),
                              {**program_env(f"{name}/{node.address}"), "GLOO_SOCKET_IFNAME": IFNAME})
                     for name, node in zip(names, net.nodes, strict=True)]
            return supervise(specs, workdir, deadline_s, independent=True)

    @staticmethod
    def _cutting_links(request: LaunchRequest, net: EmulatedNetwork, on_tick: Callable[[float], None] | None
                       ) -> tuple[Callable[[float], None] | None, list[str]]:
        """``on_tick`` that also cuts each requested node's link once its request file appears (an
        injected fault), and the notes saying when it did."""
        pending = {i: path for i, path in request.links_cut if i < len(net.nodes)}
        notes: list[str] = []
        if not pending:
            return on_tick, notes

        def tick(elapsed: float) -> None:
            for i, path in list(pending.items()):
                if os.path.exists(path):
                    _ip("-n", net.nodes[i].netns, "link", "set", IFNAME, "down")
                    notes.append(f"injected fault: linkcut: {net.nodes[i].name}'s link cut by the harness at "
                                 f"{elapsed:.1f}s")
                    del pending[i]
            if on_tick is not None:
                on_tick(elapsed)
        return tick, notes
