"""Where every rank was when a launch failed or hung: its stack files read and grouped.

Each rank writes ``<run dir>/stacks/rank<N>.txt`` (workload/hangs.py): a header naming it, then
faulthandler's dumps (on SIGUSR1, which the harness sends every rank still running, through the
launcher, before anything is killed; on SIGTERM; on a fatal signal) and the traceback of the
exception it died of. The report keeps one stack per rank, its main thread's, from the most telling
dump (the exception it died of, else its last dump), and groups ranks whose stacks are identical:

    ranks 0-2 (node0, node1): all_gather_into_tensor (distributed_c10d.py:3790) <- ... <- run (train.py:170)
    rank 3 (node1): hang (sitecustomize.py:12) <- all_gather_into_tensor <- ...

Run as a module on a node (``python -m pytest_fabric.cluster.stacks PIDFILE``), it asks every rank
program under the process whose pid the file holds for its stacks: the ssh launcher's second ssh.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .proctree import process_tree

STACKS_DIR = "stacks"
EXCEPTION_MARK = "--- exception"
# At a stop, processes whose command line holds this marker (the rank programs) and that catch
# SIGUSR1 (faulthandler, registered by every rank program) are asked for their stacks.
STACK_DUMP_MARKER = b"pytest_fabric.workload"
# Frames a group's line shows at most, innermost first, within LINE_CHARS; the rest are counted.
FRAMES_SHOWN = 6
LINE_CHARS = 290
ERROR_CHARS = 120
# Lines of the report at most (a group each): thousands of ranks in few states stay a few lines.
GROUPS_SHOWN = 12
_HEADER = re.compile(r"^# rank (\d+) node (\S+) pid (\d+) main (0x[0-9a-f]+)(?: world (\d+))?")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (\S+)')


@dataclass(frozen=True)
class RankStack:
    rank: int
    node: str
    frames: tuple[tuple[str, int, str], ...]  # (file, line, function), innermost first
    error: str | None = None  # "Type: message" of the exception it died of
    dumps: int = 0  # how many stack dumps its file holds
    world: int | None = None  # the job's ranks, as the rank knew them

    def frame_text(self, shown: int = FRAMES_SHOWN, width: int = LINE_CHARS) -> str:
        """The innermost frames, at most ``shown`` and ``width`` characters (the innermost always)."""
        if not self.frames:
            return "no stack written (the rank ended before it could dump one, or never started)"
        parts: list[str] = []
        for path, line, func in self.frames[:shown]:
            part = f"{func} ({os.path.basename(path)}:{line})"
            if parts and len(" <- ".join([*parts, part])) > width - 20:
                break
            parts.append(part)
        more = len(self.frames) - len(parts)
        return " <- ".join(parts) + (f" <- ... {more} more" if more > 0 else "")


def parse(text: str) -> RankStack | None:
    """One rank's stack file; None without the header line."""
    lines = text.splitlines()
    header = next((m for m in map(_HEADER.match, lines[:1]) if m), None)
    if header is None:
        return None
    rank, node, main_thread = int(header.group(1)), header.group(2), int(header.group(4), 16)
    dumps: list[list[tuple[str, int, str]]] = []  # the main thread's frames, per dump
    error: str | None = None
    error_frames: list[tuple[str, int, str]] = []
    state = ""  # "error": the exception's message is next; "exception", "main": whose frames follow
    for line in lines[1:]:
        if line == EXCEPTION_MARK:
            state, error_frames = "error", []
            continue
        if state == "error":
            error, state = line.strip(), "exception"
            continue
        thread = _THREAD.match(line)
        if thread:
            state = "main" if int(thread.group(2), 16) == main_thread else ""
            if state:
                dumps.append([])
            continue
        frame = _FRAME.match(line)
        if frame and state:
            (error_frames if state == "exception" else dumps[-1]).append(
                (frame.group(1), int(frame.group(2)), frame.group(3)))
    # The exception it died of says most; else where its main thread was at its last dump.
    frames = error_frames if error is not None else (dumps[-1] if dumps else [])
    return RankStack(rank, node, tuple(frames), error, len(dumps), int(header.group(5)) if header.group(5) else None)


def read(run_dir: Path) -> list[RankStack]:
    """Every rank's stack written under ``run_dir``, by rank."""
    found = []
    for path in sorted((run_dir / STACKS_DIR).glob("rank*.txt")):
        try:
            stack = parse(path.read_text(errors="replace"))
        except OSError:
            continue
        if stack is not None:
            found.append(stack)
    return sorted(found, key=lambda s: s.rank)


def ranges(numbers: Iterable[int]) -> str:
    """3, 0, 1, 2, 5 -> "0-3, 5"."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and spans[-1][1] == n - 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


def group(stacks: list[RankStack], shown: int = GROUPS_SHOWN) -> list[str]:
    """One line per set of ranks with the identical stack (and the same exception, where they died
    of one): the ranks, their nodes, the frames innermost first. Smallest groups first: the odd rank
    out (the hung one) leads."""
    groups: dict[tuple, list[RankStack]] = {}
    for stack in stacks:
        key = (stack.frames, stack.error.split(":")[0] if stack.error else None)
        groups.setdefault(key, []).append(stack)
    ordered = sorted(groups.values(), key=lambda members: (len(members), members[0].rank))
    lines = []
    for members in ordered[:shown]:
        ranks = [m.rank for m in members]
        nodes = ", ".join(dict.fromkeys(m.node.split("/")[0] for m in members))
        who = f"rank{'s' if len(ranks) > 1 else ''} {ranges(ranks)} ({nodes})"
        first = members[0]
        # gloo's and c10's messages start with their C++ source location: "[.../pair.cc:553] ..."
        error = re.sub(r"^(\w+: )\[[^\]]*\] ", r"\1", first.error or "")
        error = error if len(error) <= ERROR_CHARS else error[:ERROR_CHARS] + "..."
        died = f" died of {error}; at" if error else ""
        head = f"{who}:{died}"
        lines.append(f"{head} {first.frame_text(width=max(60, LINE_CHARS - len(head)))}")
    if len(ordered) > shown:
        lines.append(f"... {len(ordered) - shown} more groups, {sum(len(g) for g in ordered[shown:])} ranks "
                     f"(every rank's file: stacks/rank<N>.txt in the run directory)")
    return lines


def report(run_dir: Path) -> list[str]:
    """The grouped stacks of a launch, headed by one line, and the ranks that wrote no file (of the
    world the ranks knew); [] where no rank wrote one."""
    stacks = read(run_dir)
    if not stacks:
        return []
    world = max((s.world for s in stacks if s.world), default=None)
    missing = sorted(set(range(world)) - {s.rank for s in stacks}) if world else []
    head = f"stacks by rank ({len(stacks)} ranks; {run_dir / STACKS_DIR}/rank<N>.txt)"
    tail = [f"rank{'s' if len(missing) > 1 else ''} {ranges(missing)}: no stack file (never started, or ended "
             f"before it could open one)"] if missing else []
    return [head, *[f"  {line}" for line in group(stacks) + tail]]


def _catches(pid: int, sig: int) -> bool:
    """Whether ``pid`` has a handler for ``sig`` now (its SigCgt mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def ask(pids: Iterable[int]) -> int:
    """SIGUSR1 to each of ``pids`` that runs a rank program and catches it; how many were asked.

    Only processes that hold the marker *and* catch SIGUSR1 get it: SIGUSR1 kills a process that
    does not (the torchrun agent, whose command line names the rank program too; a rank still
    importing torch, before it registered faulthandler)."""
    asked = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if STACK_DUMP_MARKER not in f.read():
                    continue
            if not _catches(pid, signal.SIGUSR1):
                continue
            os.kill(pid, signal.SIGUSR1)
            asked += 1
        except (OSError, ProcessLookupError):
            continue
    return asked


def main(argv: list[str]) -> int:
    """Ask every rank program under the pid in ``argv[0]`` (a pidfile) for its stacks."""
    try:
        root = int(Path(argv[0]).read_text().strip())
    except (IndexError, OSError, ValueError) as exc:
        print(f"no pid to ask for stacks: {exc}", file=sys.stderr)
        return 2
    asked = ask(process_tree(root))
    time.sleep(0.2 if asked else 0)
    print(f"asked {asked} ranks for their stacks")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
