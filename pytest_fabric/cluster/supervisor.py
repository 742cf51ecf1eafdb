"""The one process supervisor every launcher shares.

Launchers only build argv lists; this module owns the process lifecycle: each process starts in its
own process group with its output in a log file, the whole launch has a deadline, the first failing
process brings the others down after a short grace, and every exit path (success, failure, deadline,
Ctrl-C) kills every process group it started before returning or re-raising.
"""

from __future__ import annotations

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
# At the deadline, processes whose command line holds this marker (the rank programs, which register
# faulthandler on SIGUSR1) are asked to print every thread's Python stack before anything is killed,
# so the report of a hang shows where each rank was waiting.
STACK_DUMP_MARKER = b"pytest_fabric.workload"
STACK_DUMP_WAIT_S = 1.5


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

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.log_overflow is None and all(p.returncode == 0 for p in self.procs)

    def describe(self) -> str:
        """A failure report: what happened to each process, with the last lines of its log (secrets
        masked by ``tail``)."""
        head = "deadline exceeded" if self.timed_out else "log limit exceeded" if self.log_overflow else \
            "launch failed"
        parts = [f"{head} after {self.elapsed_s:.1f}s"]
        if self.log_overflow:
            parts.append(f"{self.log_overflow}: its log passed {LOG_LIMIT_BYTES >> 20} MiB (a rank printing "
                         f"garbage or a runaway log); the launch was stopped")
        parts += self.notes
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
) -> LaunchOutcome:
    """Run ``specs`` concurrently to completion, failure or deadline; never leave one running."""
    log_dir.mkdir(parents=True, exist_ok=True)
    started: list[tuple[ProcSpec, subprocess.Popen, Path]] = []
    start = time.monotonic()
    previous = _interrupt_on_sigterm()
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
        while True:
            codes = [p.poll() for _, p, _ in started]
            now = time.monotonic()
            if all(c is not None for c in codes):
                break
            if first_failure is None and any(c not in (None, 0) for c in codes):
                first_failure = now
            if first_failure is not None and now - first_failure > FAILURE_GRACE_S:
                break
            overflow = next((spec.name for spec, _, log_path in started
                             if (_size(log_path) or 0) > LOG_LIMIT_BYTES), None)
            if overflow is not None:
                log_upto = {spec.name: _size(log_path) for spec, _, log_path in started}
                break
            if now - start > deadline_s:
                timed_out = True
                _dump_stacks(started)
                log_upto = {spec.name: _size(log_path) for spec, _, log_path in started}
                break
            if on_tick is not None:
                on_tick(now - start)
            time.sleep(tick_s)
    finally:
        killed = _stop_all(started)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

    return LaunchOutcome(
        procs=[
            ProcOutcome(spec.name, None if spec.name in killed else proc.returncode, log_path,
                        log_upto.get(spec.name))
            for spec, proc, log_path in started
        ],
        elapsed_s=time.monotonic() - start,
        timed_out=timed_out,
        killed=killed,
        log_overflow=overflow,
    )


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


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


def _dump_stacks(started: list[tuple[ProcSpec, subprocess.Popen, Path]]) -> None:
    """Ask every rank program still running to print its threads' stacks (SIGUSR1, faulthandler).

    Only processes that hold the marker *and* catch SIGUSR1 get it: SIGUSR1 kills a process that
    does not (the torchrun agent, whose command line names the rank program too; a rank still
    importing torch, before it registered faulthandler).
    """
    asked = 0
    for _, proc, _ in started:
        for pid in process_tree(proc.pid):
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
    if asked:
        time.sleep(STACK_DUMP_WAIT_S)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum} while ranks were running")


def _interrupt_on_sigterm():
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


def _stop_all(started: list[tuple[ProcSpec, subprocess.Popen, Path]]) -> list[str]:
    """Kill what is still running (TERM, then KILL) with every descendant, and reap the leaders."""
    killed = [spec.name for spec, proc, _ in started if proc.poll() is None]
    # Even a leader that exited may have left children behind (torchrun workers).
    trees = [pid for _, proc, _ in started for pid in process_tree(proc.pid)]
    for _, proc, _ in started:
        _kill_group(proc, signal.SIGTERM)
    _signal_all(trees, signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
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
