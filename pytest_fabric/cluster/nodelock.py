"""Launches of different pytest sessions never share a node, and each rendezvous gets its own port.

Two sessions on one hostfile (or two Slurm jobs sharing nodes) would otherwise start torchrun's
rendezvous on the same port of the same head node and time each other's steps. So for the life of
a launch the harness holds a lock on every node of it: a small holder process, started on the node
through the launcher itself (``ssh``, ``srun``), takes ``flock`` on a lock file in the node's
temporary directory and keeps it until its standard input closes::

    python -m pytest_fabric.cluster.nodelock --key 10.0.0.1 --who "pid 42 on login1"
      -> "waiting <who holds it>"   (only when another session's launch holds the node)
      -> "locked"
      <- "port"  -> "port 23456"    (a free port outside the ephemeral range, probed on this node)
      <- EOF: the holder exits, and the lock goes with its file descriptor

The harness closes that input when the launch ends, and so does the kernel when the harness dies
however it dies: ssh or srun exits, the holder reads end of file and exits, and the node is free
again. A flock belongs to an open file, so no lock outlives its process: a killed session never
leaves a node locked. Nodes are locked one at a time in a fixed order (by key), so two sessions
wanting overlapping nodes cannot each hold a part and wait for the other's.

Standard library only: the holder runs on the nodes with nothing but the package on its path.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import queue
import random
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

_KEY = re.compile(r"[^A-Za-z0-9_.-]")
RELEASE_WAIT_S = 10.0


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = map(int, open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(tries: int = 200, host: str = "") -> int:
    """A port free now on ``host`` ("": every address of this machine) and outside the kernel's
    ephemeral range.

    A port the kernel handed out for ``bind(0)`` is an ephemeral one: while node 0 starts, another
    node's agent connecting over and over to that port can be given it as its own source port
    (seen here: node 0's store then failed with EADDRINUSE). Ports below the range are never handed out.
    """
    low, high = _ephemeral_range()
    candidates = range(10000, low) if low > 11000 else range(high + 1, 65536)
    for port in random.sample(candidates, min(tries, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything below the range is taken: let the kernel choose
        s.bind((host, 0))
        return s.getsockname()[1]


def lock_path(key: str, directory: str | None = None) -> str:
    """The lock file of the node known as ``key`` (its address), in that node's temporary directory.

    The key is in the name because nodes that share one temporary directory (the emulated nodes of
    the launcher tests, all on one machine) must still be locked separately."""
    return os.path.join(directory or tempfile.gettempdir(), f"pytest-fabric-node-{_KEY.sub('_', key)}.lock")


# ---------------------------------------------------------------------------------------------
# The holder: runs on the node.

def _say(text: str) -> None:
    try:
        os.write(1, (text + "\n").encode())
    except OSError:  # the harness is gone: nothing to hold for
        os._exit(3)


def _lines(fd: int) -> Iterator[str]:
    """Lines of ``fd`` as they arrive; ends at end of file."""
    buffered = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return
        buffered += chunk
        while b"\n" in buffered:
            line, buffered = buffered.split(b"\n", 1)
            yield line.decode(errors="replace").strip()


def hold(key: str, who: str, directory: str | None = None) -> int:
    """Take the node's lock (saying ``waiting`` first if another session holds it), answer ``port``
    requests, and release when standard input ends. Exit status 3: the harness left while waiting."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    path = lock_path(key, directory)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        with open(path, errors="replace") as f:
            holder = f.read(300).strip() or "another pytest-fabric session"
        _say(f"waiting {holder}")
        # Blocked in the kernel's queue (woken first when the lock is released), while this thread
        # watches the harness: input that ends means it is gone, and so must this waiter be.
        taken = threading.Event()
        threading.Thread(target=lambda: (fcntl.flock(fd, fcntl.LOCK_EX), taken.set()), daemon=True).start()
        while not taken.is_set():
            readable, _, _ = select.select([0], [], [], 0.2)
            if readable and not os.read(0, 4096):
                os._exit(3)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{who} since {time.strftime('%Y-%m-%d %H:%M:%S')} (lock {path})\n".encode(), 0)
    _say("locked")
    for line in _lines(0):
        if line == "port":
            _say(f"port {free_port()}")
    os.close(fd)  # the lock goes with it
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_fabric.cluster.nodelock", description=hold.__doc__)
    parser.add_argument("--key", required=True, help="this node's name among the cluster's (its address)")
    parser.add_argument("--who", default=f"pid {os.getppid()}", help="who holds the lock, for whoever waits")
    parser.add_argument("--dir", default=None, help="where the lock file is (default: the temporary directory)")
    args = parser.parse_args(argv)
    return hold(args.key, args.who, args.dir)


# ---------------------------------------------------------------------------------------------
# The harness side.

def session_name() -> str:
    """Who holds a lock, in the words a waiting session shows."""
    return f"pytest-fabric pid {os.getpid()} on {socket.gethostname()}"


def holder_program(key: str, who: str) -> list[str]:
    """What runs on the node (after the launcher's own prefix: ``ssh host``, ``srun -w node``)."""
    return ["-m", "pytest_fabric.cluster.nodelock", "--key", key, "--who", who]


class LockError(RuntimeError):
    """A node's lock could not be taken; the message says which node, why, and what to do."""


@dataclass
class NodeLock:
    """One node's lock, held by its holder process (started with ``argv``) until ``release``."""

    node: str  # the node's name, for messages
    argv: Sequence[str]
    env: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._said: list[str] = []

    def acquire(self, wait_s: float, notify: Callable[[str], None] | None) -> None:
        self._proc = subprocess.Popen(list(self.argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                      env=dict(self.env) if self.env is not None else None)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + wait_s
        holder = ""
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.release()
                raise LockError(f"{self.node} is still busy with another pytest-fabric session's launch after "
                                f"{wait_s:.0f}s ({holder}); run again when it is done, or give the sessions "
                                "different hosts") from None
            if line is None:
                code = self._proc.wait()
                said = "; ".join(self._said) or "no output"
                raise LockError(f"could not take {self.node}'s launch lock: {said} (exit code {code})")
            if line == "locked":
                return
            if line.startswith("waiting "):
                holder = "held by " + line[len("waiting "):]
                if notify is not None:
                    notify(f"waiting for another pytest-fabric session's launch on {self.node} ({holder})")
            else:
                self._said.append(line)

    def port(self) -> int:
        """A free port on this node, outside its ephemeral range, probed there now."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write("port\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise LockError(f"{self.node}'s lock holder is gone ({exc}): cannot probe a port there") from None
        while True:
            try:
                line = self._lines.get(timeout=30)
            except queue.Empty:
                line = None
            if line is None:
                raise LockError(f"{self.node}'s lock holder did not answer for a free port "
                                f"({'; '.join(self._said) or 'no output'})")
            if line.startswith("port ") and line[5:].isdigit():
                return int(line[5:])
            self._said.append(line)

    def release(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # the holder reads end of file and exits: the lock is released
        except OSError:
            pass
        try:
            proc.wait(timeout=RELEASE_WAIT_S)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait(timeout=RELEASE_WAIT_S)

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)


def lock_wait_s(deadline_s: float) -> float:
    """How long a launch waits for other sessions' launches on its nodes: one of theirs may take its
    whole deadline (assumed like this one's) and its cleanup; two of them in a row before giving up."""
    return 2 * deadline_s + 120


@contextmanager
def holding(locks: Sequence[tuple[str, NodeLock]], wait_s: float,
            notify: Callable[[str], None] | None) -> Iterator[dict[str, NodeLock]]:
    """Every lock of ``locks`` (key, lock) held for the block, taken in the order of their keys."""
    held: list[NodeLock] = []
    try:
        deadline = time.monotonic() + wait_s
        for _, lock in sorted(locks, key=lambda pair: pair[0]):
            held.append(lock)  # before it is taken: an interrupted wait must end its holder too
            lock.acquire(max(1.0, deadline - time.monotonic()), notify)
        yield {key: lock for key, lock in locks}
    finally:
        for lock in reversed(held):
            lock.release()


if __name__ == "__main__":
    sys.exit(main())
