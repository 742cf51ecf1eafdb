"""Process trees read from /proc, and the remote cleanup that kills one.

The supervisor kills what a launch started on this machine by walking /proc (``process_tree``):
process groups are not enough, since torchrun starts its workers in sessions of their own. The
SSH launcher needs the same on each host after a failed launch, where the harness holds no
process handle: ``python -m pytest_fabric.cluster.proctree PIDFILE`` kills the tree under the pid
a launch's wrapper wrote to PIDFILE (if that process is still the launch's: a reused pid is not),
TERM then KILL, and prints what it did. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable

__all__ = ["children_map", "kill_pidfile_tree", "process_tree"]


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may hold spaces and parentheses: the fields follow the last ')'.
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0].decode(), int(fields[1]), fields[19].decode()
    except (OSError, IndexError, ValueError):
        return None


def children_map() -> dict[int, list[int]]:
    """parent pid -> its children's pids, from /proc now."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (s := _stat(int(entry))) is not None:
            children.setdefault(s[1], []).append(int(entry))
    return children


def process_tree(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and all its descendants, read from /proc now (before anything is killed), or from
    ``children`` (a ``children_map`` already read)."""
    children = children_map() if children is None else children
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def _descendants(roots: Iterable[int]) -> dict[int, str]:
    """{pid: start time} of ``roots`` and everything below them (one read of /proc for them all);
    the start time tells a reused pid."""
    children = children_map()
    found: dict[int, str] = {}
    for root in roots:
        for pid in process_tree(root, children):
            if pid not in found and (s := _stat(pid)) is not None:
                found[pid] = s[2]
    return found


def _running(procs: dict[int, str]) -> list[int]:
    return [pid for pid, start in procs.items() if (s := _stat(pid)) and s[2] == start and s[0] != "Z"]


def kill_pidfile_tree(pidfile: str, grace_s: float = 3.0) -> tuple[str, int]:
    """Kill the tree under the pid in ``pidfile`` (TERM, then KILL after ``grace_s``), remove the
    file; (what happened, exit code: 0 unless something survived SIGKILL)."""
    try:
        with open(pidfile) as f:
            root = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return "nothing to stop: the launch never started, or it finished cleanly", 0
    try:
        with open(f"/proc/{root}/cmdline", "rb") as f:
            ours = pidfile.encode() in f.read()  # the wrapper names its pidfile: a reused pid does not
    except OSError:
        ours = False
    procs = _descendants([root]) if ours else {}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        procs.update(_descendants(_running(procs)))  # children started since
        for pid in _running(procs):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while _running(procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _running(procs):
            break
    try:
        os.remove(pidfile)
    except OSError:
        pass
    left = _running(procs)
    if left:
        return f"processes {left} survived SIGKILL", 1
    return f"stopped {len(procs)} process(es)", 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pytest_fabric.cluster.proctree PIDFILE", file=sys.stderr)
        return 2
    message, code = kill_pidfile_tree(args[0])
    print(message)
    return code


if __name__ == "__main__":
    sys.exit(main())
