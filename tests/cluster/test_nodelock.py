"""The launch lock of shared nodes (cluster/nodelock.py), with real holder processes on this machine:
what a waiting session hears, that a killed session never leaves a node locked, and the bound on waiting.
The same holders run over real ssh and srun in test_ssh.py and test_slurm.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pytest_fabric.cluster.base import _PACKAGE_ROOT
from pytest_fabric.cluster.nodelock import LockError, NodeLock, _ephemeral_range, holder_program, holding


def local_lock(tmp_path: Path, who: str) -> NodeLock:
    return NodeLock("node-a", [sys.executable, *holder_program("10.0.0.1", who), "--dir", str(tmp_path)],
                    {"PYTHONPATH": _PACKAGE_ROOT})


def test_a_second_session_waits_says_who_holds_the_node_and_gives_up_at_its_bound(tmp_path: Path) -> None:
    first = local_lock(tmp_path, "session one")
    heard: list[str] = []
    with holding([("10.0.0.1", first)], 30, heard.append) as held:
        port = held["10.0.0.1"].port()
        low, high = _ephemeral_range()
        assert not low <= port <= high
        with pytest.raises(LockError) as info:
            with holding([("10.0.0.1", local_lock(tmp_path, "session two"))], 1, heard.append):
                pass
    assert heard[0].startswith("waiting for another pytest-fabric session's launch on node-a (held by session one")
    assert "still busy with another pytest-fabric session's launch" in str(info.value)
    # Released with the block: the next session takes it without waiting.
    with holding([("10.0.0.1", local_lock(tmp_path, "session three"))], 30, heard.append):
        pass
    assert len(heard) == 1


HARNESS = textwrap.dedent("""\
    import sys, time
    from pytest_fabric.cluster.nodelock import NodeLock, holder_program
    lock = NodeLock("node-a", [sys.executable, *holder_program("10.0.0.1", "doomed"), "--dir", sys.argv[1]])
    lock.acquire(30, None)
    print("held", flush=True)
    time.sleep(600)
""")


@pytest.mark.parametrize("waiting", [False, True], ids=["holding", "waiting"])
def test_a_killed_session_leaves_no_lock_and_no_holder(tmp_path: Path, waiting: bool) -> None:
    """SIGKILL gives the harness no chance to release: the holder's input ends with it, and so does the lock.
    A killed session that was itself waiting leaves no waiter behind to take the node later."""
    env = {"PYTHONPATH": _PACKAGE_ROOT}
    blocker = local_lock(tmp_path, "blocker")
    if waiting:
        blocker.acquire(30, None)
    harness = subprocess.Popen([sys.executable, "-c", HARNESS, str(tmp_path)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        if not waiting:
            assert harness.stdout.readline().strip() == "held", harness.stderr.read()
        else:  # it is blocked behind `blocker`: wait for its holder to say so in the lock file's queue
            wait_for_waiter(tmp_path)
        holders = children(harness.pid)
        assert holders
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        if waiting:
            blocker.release()
        taken = local_lock(tmp_path, "next")
        heard: list[str] = []
        taken.acquire(30, heard.append)  # the lock is free (or freed at once), never left to the dead session
        taken.release()
        assert all("held by doomed" not in text for text in heard)
        for pid in holders:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    finally:
        harness.kill()
        blocker.release()


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def opened_by_others(path: Path) -> int:
    """How many processes other than this one have ``path`` open (from /proc)."""
    found = 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        if fd_dir.parent.name == str(os.getpid()):
            continue
        try:
            found += any(os.readlink(fd) == str(path) for fd in fd_dir.iterdir())
        except OSError:
            continue
    return found


def wait_for_waiter(directory: Path) -> None:
    """Until a second process has the lock file open (the harness's holder, queued behind the blocker)."""
    lock = next(directory.glob("pytest-fabric-node-*.lock"))
    deadline = time.monotonic() + 30
    while opened_by_others(lock) < 2:
        if time.monotonic() > deadline:
            raise AssertionError("the harness's holder never queued for the lock")
        time.sleep(0.1)
