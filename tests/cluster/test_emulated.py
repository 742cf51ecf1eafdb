"""The emulated network: namespaces made and all removed (also on errors), and tbf really limits the rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from helpers import namespaces

from pytest_fabric.cluster import ClusterUnavailable
from pytest_fabric.cluster import emulated
from pytest_fabric.cluster.emulated import EmulatedCluster, EmulatedNetwork, owned_namespaces, sweep_stale_namespaces

try:
    emulated.check_available()
    probe = subprocess.run(["ip", "netns", "add", f"pf{os.getpid()}-canary"], capture_output=True)
    subprocess.run(["ip", "netns", "del", f"pf{os.getpid()}-canary"], capture_output=True)
    UNAVAILABLE = None if probe.returncode == 0 else probe.stderr.decode().strip()
except ClusterUnavailable as exc:
    UNAVAILABLE = str(exc)

pytestmark = pytest.mark.usefixtures("needs_emulated")

PORT = 5201

RECEIVER = """
import json, socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen(1)
print("ready", flush=True)
conn, _ = server.accept()
total, first = 0, None
while True:
    chunk = conn.recv(1 << 20)
    if not chunk:
        break
    if first is None:
        first = time.perf_counter()
    total += len(chunk)
print(json.dumps({"bytes": total, "seconds": time.perf_counter() - first}), flush=True)
"""

SENDER = """
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
block = b"x" * (1 << 16)
left = int(sys.argv[3])
while left > 0:
    sock.sendall(block[:left])
    left -= len(block)
sock.close()
"""


def in_namespace(netns: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", netns, *argv]


def tcp_mbit(net: EmulatedNetwork, nbytes: int, sender: int = 0, receiver: int = 1) -> float:
    """Send ``nbytes`` over TCP from one emulated node to another; the receiver's Mbit/s."""
    dst = net.nodes[receiver]
    recv = subprocess.Popen(in_namespace(dst.netns, sys.executable, "-c", RECEIVER, dst.address, str(PORT)),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        subprocess.run(in_namespace(net.nodes[sender].netns, sys.executable, "-c", SENDER, dst.address, str(PORT),
                                    str(nbytes)), check=True, timeout=60)
        out, _ = recv.communicate(timeout=60)
    finally:
        recv.kill()
        recv.wait()
    result = json.loads(out)
    assert result["bytes"] == nbytes
    return result["bytes"] * 8 / result["seconds"] / 1e6


def test_namespaces_exist_inside_and_are_all_removed_after():
    with EmulatedNetwork(3, 1000) as net:
        mine = set(owned_namespaces())
        assert mine == {net.switch, *(n.netns for n in net.nodes)}
        assert mine <= namespaces()
        for node in net.nodes:
            addr = subprocess.run(["ip", "-n", node.netns, "-4", "addr", "show", emulated.IFNAME],
                                  capture_output=True, text=True, check=True).stdout
            assert f"{node.address}/24" in addr
            qdisc = subprocess.run(["ip", "netns", "exec", node.netns, "tc", "qdisc", "show", "dev", emulated.IFNAME],
                                   capture_output=True, text=True, check=True).stdout
            assert "tbf" in qdisc and "1Gbit" in qdisc
        assert len({n.address for n in net.nodes}) == 3
    assert owned_namespaces() == []
    assert not mine & namespaces()


def test_namespaces_are_removed_when_the_body_raises():
    with pytest.raises(RuntimeError, match="inside"):
        with EmulatedNetwork(2, 100) as net:
            created = {net.switch, *(n.netns for n in net.nodes)}
            assert created <= namespaces()
            raise RuntimeError("inside")
    assert not created & namespaces()


def test_namespaces_are_removed_when_creation_fails_halfway(monkeypatch):
    def broken_tbf(netns, dev, mbit):
        raise ClusterUnavailable("tc refused")

    monkeypatch.setattr(emulated, "_tbf", broken_tbf)
    with pytest.raises(ClusterUnavailable, match="tc refused"):
        with EmulatedNetwork(2, 100):
            pytest.fail("the body must not run when the network could not be built")
    assert owned_namespaces() == []


def test_processes_inside_are_killed_and_the_namespace_still_removed():
    with EmulatedNetwork(1, None) as net:
        sleeper = subprocess.Popen(in_namespace(net.nodes[0].netns, "sleep", "120"))
        time.sleep(0.2)
    try:
        assert sleeper.wait(timeout=10) is not None
        assert net.nodes[0].netns not in namespaces()
    finally:
        sleeper.kill()


@pytest.mark.parametrize("mbit", [100, 400])
def test_tbf_limits_a_tcp_transfer_to_the_fabric_rate(mbit):
    # About two seconds of traffic at the shaped rate: the initial burst is a small part of it.
    nbytes = int(mbit * 1e6 / 8 * 2)
    with EmulatedNetwork(2, mbit) as net:
        measured = tcp_mbit(net, nbytes)
    assert 0.5 * mbit < measured < 1.1 * mbit, f"shaped to {mbit} Mbit/s, measured {measured:.1f} Mbit/s"


def test_a_transfer_timed_over_25_buckets_cannot_beat_the_link():
    # A full bucket passes at the veth's speed; over 25 buckets' worth of the rate (what the bandwidth
    # workload times at least) that is at most 4% above the rate, inside the floor's 10% tolerance.
    assert emulated.burst_bytes(400) == 200_000  # 4 ms at 400 Mbit/s
    with EmulatedNetwork(2, 400) as net:
        measured = tcp_mbit(net, 25 * emulated.burst_bytes(400))
    assert measured < 1.1 * 400, f"shaped to 400 Mbit/s, 5 MB measured {measured:.1f} Mbit/s"


def test_tbf_shapes_both_directions():
    with EmulatedNetwork(2, 100) as net:
        measured = tcp_mbit(net, int(100e6 / 8 * 2), sender=1, receiver=0)
    assert 50 < measured < 110, f"node1 -> node0 measured {measured:.1f} Mbit/s"


def test_unshaped_link_is_much_faster_than_the_shaped_one():
    """The limit comes from tbf, not from veth or Python: without shaping the same transfer is fast."""
    with EmulatedNetwork(2, None) as net:
        measured = tcp_mbit(net, 50_000_000)
    assert measured > 400, f"unshaped veth measured only {measured:.1f} Mbit/s"


def test_sweep_removes_namespaces_of_dead_harnesses_only():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = f"pf{dead.pid}-0-n0", f"pf{os.getpid()}-999-n0"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = sweep_stale_namespaces()
        assert stale in removed and live not in removed
        assert stale not in namespaces() and live in namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def test_cluster_prepare_leaves_no_probe_behind():
    EmulatedCluster().prepare()
    assert owned_namespaces() == []
