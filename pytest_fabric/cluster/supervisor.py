"""The one process supervisor every launcher shares.

Launchers only build argv lists; this module owns the process lifecycle: each process starts in its
own process group with its output in a log file, the whole launch has a deadline, the first failing
process brings the others down after a short grace, and every exit path (success, failure, deadline,
Ctrl-C) kills every process group it started before returning or re-raising.

The deadline includes the stop: the supervisor starts stopping a launch that runs out of time early
enough (``stop_budget_s``: stacks, TERM, KILL) that it returns by the deadline, whatever its length,
so the failure is reported within it (the launcher's clean-up after that takes well under 10% of it).

A rank program's own messages to the operator are lines starting with ``pytest-fabric: `` (an
injected fault says so there); a failure report lists them at its head, by node, wherever they are
in the node's log, so that the report names the node and what happened even when the log's last
lines (a stack dump, garbage) have pushed them out of its tail.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..core.redact import redact
from .proctree import process_tree
from . import flight, stacks
from .stacks import ask

# After the first process fails, the others get this long to fail or finish on their own (their
# own error messages are usually the useful ones) before they are killed.
FAILURE_GRACE_S = 5.0
# Between SIGTERM and SIGKILL.
TERM_GRACE_S = 3.0
LOG_TAIL_LINES = 30
# What a report reads of a log at most (its end), and of one line: a rank printing binary garbage or
# a runaway log must not paste megabytes into the failure, the JUnit and the store.
LOG_TAIL_BYTES = 64 * 1024
LOG_LINE_CHARS = 300
# A log that outgrows this stops the launch (a rank printing garbage fills the results disk otherwise).
LOG_LIMIT_BYTES = 32 * 1024 * 1024
# When a launch fails (its first process exits non-zero) or reaches its deadline, every rank program
# still running is asked for its stacks (stacks.py: faulthandler on SIGUSR1, into the run directory)
# before anything is killed, here and, through the launcher's ``ask_stacks``, on other nodes; then
# the supervisor waits this long for the dumps.
STACK_DUMP_WAIT_S = 1.5
# The stop at a deadline (stacks, TERM, KILL) is budgeted inside it: it starts this long before the
# deadline, a share of it (at least MIN_STOP_S, at most STOP_BUDGET_S), and each step is cut to fit.
STOP_BUDGET_S = 5.0
STOP_SHARE = 0.1
MIN_STOP_S = 1.0
# A rank program's messages to the operator (faults.py), lifted to the head of a failure report.
RANK_MESSAGE = b"pytest-fabric: "
RANK_MESSAGES_PER_NODE = 3


def stop_budget_s(deadline_s: float) -> float:
    """How long before ``deadline_s`` the supervisor starts stopping a launch that is still running."""
    return min(STOP_BUDGET_S, max(MIN_STOP_S, STOP_SHARE * deadline_s), deadline_s / 2)


@dataclass(frozen=True)
class ProcSpec:
    name: str  # e.g. "node0": names the log file and the report
    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str | None = None


@dataclass
class ProcOutcome:
    name: str
    returncode: int | None  # None: killed by the supervisor
    log_path: Path
    # Bytes of the log written before the supervisor killed anything (None: all of it). What a
    # process prints while being killed (torchrun's SignalException traceback) would push what it
    # was doing out of the tail.
    log_upto: int | None = None

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The log's last lines, secrets masked (they are shown and stored: see ``redact``)."""
        try:
            with open(self.log_path, "rb") as f:
                end = self.log_upto if self.log_upto is not None else f.seek(0, os.SEEK_END)
                start = max(0, end - LOG_TAIL_BYTES)
                f.seek(start)
                text = f.read(end - start).decode(errors="replace")
        except OSError as exc:
            return f"(log unreadable: {exc})"
        kept = text.splitlines()[-lines:]
        if start and len(kept) < lines:
            kept.insert(0, f"[... {start} earlier bytes not shown]")
        return redact("\n".join(_printable(line) for line in kept))

    def messages(self, limit: int = RANK_MESSAGES_PER_NODE) -> list[str]:
        """The rank programs' own lines (``pytest-fabric: ...``) anywhere in the log, each once, the
        first ``limit`` of them, printable and secrets masked."""
        found: list[str] = []
        try:
            with open(self.log_path, "rb") as f:
                left = self.log_upto if self.log_upto is not None else f.seek(0, os.SEEK_END)
                f.seek(0)
                carry = b""
                while left > 0 and len(found) < limit:
                    chunk = carry + f.read(min(left, 1 << 20))
                    left -= len(chunk) - len(carry)
                    lines = chunk.split(b"\n")
                    carry = lines.pop() if left > 0 else b""
                    for raw in lines:
                        at = raw.find(RANK_MESSAGE)
                        line = _printable(raw[at:].decode(errors="replace").rstrip()) if at >= 0 else ""
                        if line and line not in found:
                            found.append(line)
                            if len(found) == limit:
                                break
                    if len(carry) > LOG_LIMIT_BYTES:  # no newline for a long way: not a message
                        carry = b""
        except OSError:
            return []
        return [redact(line) for line in found]


def _printable(line: str) -> str:
    """One log line as a report shows it: control characters (binary garbage) as ``?``, cut to
    LOG_LINE_CHARS."""
    line = "".join(c if c.isprintable() or c == "\t" else "?" for c in line[:LOG_LINE_CHARS + 1])
    return line if len(line) <= LOG_LINE_CHARS else line[:LOG_LINE_CHARS] + " [line cut]"


@dataclass
class LaunchOutcome:
    procs: list[ProcOutcome]
    elapsed_s: float
    timed_out: bool = False
    killed: list[str] = field(default_factory=list)
    # A process whose log outgrew LOG_LIMIT_BYTES: the launch was stopped for it.
    log_overflow: str | None = None
    # What the launcher did to the launch besides running it (an injected fault's link cut).
    notes: list[str] = field(default_factory=list)
    # The process that failed first (a non-zero exit) and when, seconds into the launch.
    first_failure: tuple[str, float] | None = None
    deadline_s: float | None = None
    # The node whose ranks failed first, by the cluster's name for it, where the launcher knows it
    # (Cluster.left_out takes a node that keeps failing launches: Measurer.node_failed).
    failed_node: str | None = None
    # Where the ranks were (stacks.report: grouped by identical stack) and where their flight
    # recorders stop (flight.report), for a launch that did not end well; read from the run directory.
    stacks: list[str] = field(default_factory=list)
    flight: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.log_overflow is None and all(p.returncode == 0 for p in self.procs)

    def describe(self) -> str:
        """A failure report: what happened to each process, with the last lines of its log (secrets
        masked by ``tail``)."""
        head = "deadline exceeded" if self.timed_out else "log limit exceeded" if self.log_overflow else \
            "launch failed"
        parts = [f"{head} after {self.elapsed_s:.1f}s"
                 + (f" (deadline {self.deadline_s:g}s, the stop included)" if self.timed_out and self.deadline_s else "")]
        if self.first_failure is not None:
            name, at = self.first_failure
            code = next((p.returncode for p in self.procs if p.name == name), None)
            parts.append(f"{name} failed first: exit code {code} at {at:.1f}s")
        if self.log_overflow:
            parts.append(f"{self.log_overflow}: its log passed {LOG_LIMIT_BYTES >> 20} MiB (a rank printing "
                         f"garbage or a runaway log); the launch was stopped")
        parts += self.notes
        parts += self.stacks + self.flight
        parts += [f"{p.name}: {line}" for p in self.procs for line in p.messages()]
        for p in self.procs:
            state = "killed" if p.returncode is None else f"exit code {p.returncode}"
            parts.append(f"--- {p.name}: {state}; last lines of {p.log_path} ---\n{p.tail()}")
        return "\n".join(parts)


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def supervise(
    specs: Sequence[ProcSpec],
    log_dir: Path,
    deadline_s: float,
    on_tick: Callable[[float], None] | None = None,
    tick_s: float = 0.5,
    independent: bool = False,
    ask_stacks: Callable[[], None] | None = None,
) -> LaunchOutcome:
    """Run ``specs`` concurrently to completion, failure or deadline; never leave one running.

    ``independent``: the processes are not one job (a probe of each node), so one failing does not
    bring the others down; each runs to its end or the deadline. ``ask_stacks``: the launcher's way
    to ask ranks it started beyond this process tree (other nodes) for their stacks, at the first
    failure or the deadline, besides the ranks in the tree."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[ProcSpec, subprocess.Popen, Path]] = []
    start = time.monotonic()
    previous = interrupt_on_sigterm()
    try:
        for spec in specs:
            log_path = log_dir / f"{spec.name}.log"
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    list(spec.argv),
                    env=dict(spec.env),
                    cwd=spec.cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: killpg reaches its children
                )
            started.append((spec, proc, log_path))

        timed_out = False
        overflow: str | None = None
        log_upto: dict[str, int | None] = {}
        first_failure: float | None = None
        first_failed: tuple[str, float] | None = None
        asked = False
        stop_at = deadline_s - stop_budget_s(deadline_s)
        while True:
            codes = [p.poll() for _, p, _ in started]
            now = time.monotonic()
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
                first_failed = (next(spec.name for (spec, _, _), c in zip(started, codes) if c not in (None, 0)),
                                now - start)
            if all(c is not None for c in codes):
                break
            if first_failure is not None and not independent and now - first_failure > FAILURE_GRACE_S:
                break
            overflow = next((spec.name for spec, _, log_path in started
                             if (_size(log_path) or 0) > LOG_LIMIT_BYTES), None)
            if overflow is not None:
                log_upto = {spec.name: _size(log_path) for spec, _, log_path in started}
                break
            if first_failure is not None and not independent and not asked:
                asked = True  # before the grace ends in kills: the others' stacks where they wait
                _dump_stacks(started, ask_stacks, min(STACK_DUMP_WAIT_S, FAILURE_GRACE_S / 2))
                continue
            if now - start > stop_at:
                timed_out = True
                _dump_stacks(started, ask_stacks, min(STACK_DUMP_WAIT_S, 0.4 * stop_budget_s(deadline_s)))
                log_upto = {spec.name: _size(log_path) for spec, _, log_path in started}
                break
            if on_tick is not None:
                on_tick(now - start)
            # Wake when a process ends (the last one ends the launch at once), or at the next tick.
            running = next(proc for (_, proc, _), code in zip(started, codes) if code is None)
            with contextlib.suppress(subprocess.TimeoutExpired):
                running.wait(timeout=tick_s)
    finally:
        killed = _stop_all(started, min(TERM_GRACE_S, 0.4 * stop_budget_s(deadline_s)))
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

    outcome = LaunchOutcome(
        procs=[
            ProcOutcome(spec.name, None if spec.name in killed else proc.returncode, log_path,
                        log_upto.get(spec.name))
            for spec, proc, log_path in started
        ],
        elapsed_s=time.monotonic() - start,
        timed_out=timed_out,
        killed=killed,
        log_overflow=overflow,
        first_failure=first_failed,
        deadline_s=deadline_s,
    )
    if not outcome.ok and not independent:  # the ranks write into the launch's directory (workload/hangs.py)
        # Secrets masked, as in the log tails: an exception's message is the rank's own text.
        outcome.stacks = [_printable(redact(line)) for line in stacks.report(log_dir)]
        outcome.flight = [_printable(redact(line)) for line in flight.report(log_dir)]
    return outcome


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _dump_stacks(started: list[tuple[ProcSpec, subprocess.Popen, Path]], ask_stacks: Callable[[], None] | None,
                 wait_s: float = STACK_DUMP_WAIT_S) -> None:
    """Ask every rank program still running for its stacks: those in this process tree directly
    (stacks.ask), the others through the launcher; then give them ``wait_s`` to write them."""
    start = time.monotonic()
    asked = ask(pid for _, proc, _ in started for pid in process_tree(proc.pid))
    if ask_stacks is not None:
        # The launcher's way (scancel, a second ssh) may be slow to answer: it gets the wait and no
        # more, so the stop still fits inside the deadline.
        def run() -> None:
            try:
                ask_stacks()
            except Exception:  # noqa: BLE001 - a report's extra; the stop must go on
                pass

        asking = threading.Thread(target=run, name="ask-stacks", daemon=True)
        asking.start()
        asking.join(wait_s)
        asked += 1
    if asked:  # what the ranks take to write their dumps, at least half the wait after the last ask
        time.sleep(max(wait_s / 2, wait_s - (time.monotonic() - start)))


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum} while ranks were running")


def interrupt_on_sigterm():
    """While ranks run, SIGTERM (a CI job cancelled, `timeout`) unwinds like Ctrl-C, so the
    ``finally`` blocks kill the ranks and remove namespaces instead of the interpreter just dying."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, _raise_interrupt)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_all(started: list[tuple[ProcSpec, subprocess.Popen, Path]], term_grace_s: float = TERM_GRACE_S
              ) -> list[str]:
    """Kill what is still running (TERM, then KILL ``term_grace_s`` later) with every descendant, and
    reap the leaders."""
    killed = [spec.name for spec, proc, _ in started if proc.poll() is None]
    # Even a leader that exited may have left children behind (torchrun workers).
    trees = [pid for _, proc, _ in started for pid in process_tree(proc.pid)]
    for _, proc, _ in started:
        _kill_group(proc, signal.SIGTERM)
    _signal_all(trees, signal.SIGTERM)
    deadline = time.monotonic() + term_grace_s
    for _, proc, _ in started:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # Anything the TERM made fork in the meantime is in the tree now.
    trees += [pid for _, proc, _ in started if proc.poll() is None for pid in process_tree(proc.pid)]
    for _, proc, _ in started:
        _kill_group(proc, signal.SIGKILL)
    _signal_all(trees, signal.SIGKILL)
    for _, proc, _ in started:
        try:
            proc.wait(timeout=TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
    return killed
