"""What a rank leaves behind for the report of a hang or a crash, in the launch's run directory.

The run directory is on storage every node sees, so the harness reads every rank's files after the
launch, whichever node the rank ran on:

- ``stacks/rank<N>.txt``: a header line (rank, node, pid, the main thread's id), then every stack
  dump of the rank: faulthandler's, all threads, on SIGUSR1 (the harness asks, through the launcher,
  when a launch fails or reaches its deadline), on SIGTERM (whoever kills the rank: its torchrun
  agent, Slurm, the harness) and on a fatal signal (SIGABRT, SIGSEGV); and, when the rank dies of a
  Python exception (a collective's timeout among them), its traceback in the same frame format,
  after a ``--- exception`` line.
- ``flight/rank<N>.json``: torch's flight recorder (``_dump_fr_trace_json``): the process groups'
  last collectives, each with its sequence id, op, sizes and state, written by the rank itself when
  it dies of an exception or is asked (SIGUSR1) while its main thread runs Python. On NCCL, torch's
  watchdog also dumps it on a collective timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT``) to
  ``flight/nccl_trace_rank_<N>`` (pickle). Torch 2.13's gloo records its collectives in the same
  recorder (``gloo:all_gather``...) but leaves them all ``scheduled`` (no start or completion is
  tracked) and never dumps on a timeout: the rank's own dump at its exception is all there is.

Plain standard library at import (torch is imported only to dump the recorder), never pytest.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import threading
import traceback
from typing import IO, Any

STACKS_DIR = "stacks"
FLIGHT_DIR = "flight"
EXCEPTION_MARK = "--- exception"
# The flight recorder's ring buffer (events per process group) where the user has not set one.
TRACE_BUFFER = "2000"
# One line of the exception's message in the stack file at most.
MESSAGE_CHARS = 400

_state: dict[str, Any] = {}


def stack_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, STACKS_DIR, f"rank{rank}.txt")


def flight_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, FLIGHT_DIR, f"rank{rank}.json")


def flight_recorder_env(run_dir: str) -> dict[str, str]:
    """The flight recorder on, its dumps on a timeout in ``run_dir/flight``, where the user has not
    set these (read when the process group starts). Names from torch 2.13: FlightRecorder.hpp reads
    TORCH_FR_BUFFER_SIZE then TORCH_NCCL_TRACE_BUFFER_SIZE; ProcessGroupNCCL's watchdog dumps with
    TORCH_NCCL_DUMP_ON_TIMEOUT to TORCH_NCCL_DEBUG_INFO_TEMP_FILE (TORCH_FR_DUMP_TEMP_FILE in newer
    code) followed by the rank."""
    prefix = os.path.join(run_dir, FLIGHT_DIR, "nccl_trace_rank_")
    defaults = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
                "TORCH_FR_DUMP_TEMP_FILE": prefix}
    # The buffer's size under the name this torch reads without a warning: TORCH_FR_BUFFER_SIZE from
    # torch 2.11 (the NCCL name is deprecated there, and a warning in every rank's log), before it the
    # NCCL name; none where the user has set either.
    if not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(os.environ):
        defaults[buffer_size_variable(_torch_version())] = TRACE_BUFFER
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in (*defaults, "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
            if name in os.environ}


def buffer_size_variable(version: tuple[int, int]) -> str:
    """The variable that sizes the flight recorder's buffer in torch ``version`` (major, minor)."""
    return "TORCH_FR_BUFFER_SIZE" if version >= (2, 11) else "TORCH_NCCL_TRACE_BUFFER_SIZE"


def _torch_version() -> tuple[int, int]:
    """torch's (major, minor) from its installed metadata, without importing it; (0, 0) if unknown."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        major, minor, *_ = version("torch").split(".")
        return int(major), int(minor)
    except (PackageNotFoundError, ValueError):
        return 0, 0


def install(run_dir: str) -> None:
    """This rank's stack file opened and faulthandler registered on it (see the module's doc);
    the flight recorder's directory made. Best effort: a run directory that cannot be written
    leaves the rank as it was (its log still says what happened)."""
    rank = int(os.environ.get("RANK", "0"))
    try:
        os.makedirs(os.path.join(run_dir, STACKS_DIR), exist_ok=True)
        os.makedirs(os.path.join(run_dir, FLIGHT_DIR), exist_ok=True)
        out: IO[str] = open(stack_path(run_dir, rank), "a", buffering=1)
    except OSError:
        return
    node = os.environ.get("PYTEST_FABRIC_NODE") or socket.gethostname()
    out.write(f"# rank {rank} node {node} pid {os.getpid()} main 0x{threading.main_thread().ident:016x} "
              f"world {os.environ.get('WORLD_SIZE', '?')}\n")
    _state.update(file=out, run_dir=run_dir, rank=rank)
    # A Python handler first (it runs in the main thread once that runs Python again: a rank asleep or
    # in a Python loop dumps its flight recorder), then faulthandler's, which dumps the stacks at once
    # from C and chains to it; SIGTERM chains to the default action, so the rank still ends.
    # faulthandler keeps its first registration's handler: an earlier one (to the log, before the
    # config was read) would otherwise be replaced by the Python handler and never dump again.
    faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, lambda signum, frame: dump_flight())
    faulthandler.register(signal.SIGUSR1, file=out, all_threads=True, chain=True)
    faulthandler.register(signal.SIGTERM, file=out, all_threads=True, chain=True)
    faulthandler.enable(file=out, all_threads=True)


def record_exception(exc: BaseException) -> None:
    """The traceback of the exception this rank dies of, in its stack file (innermost frame first,
    as faulthandler writes them), and its flight recorder."""
    out = _state.get("file")
    if out is None:
        return
    try:
        lines = [EXCEPTION_MARK, f"{type(exc).__name__}: {_first_line(exc)}", "Current thread (most recent call first):"]
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            lines.append(f'  File "{frame.filename}", line {frame.lineno} in {frame.name}')
        out.write("\n".join(lines) + "\n")
        out.flush()
    except (OSError, ValueError):
        pass
    dump_flight()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:MESSAGE_CHARS]


def dump_flight() -> None:
    """This rank's flight recorder, as JSON, in the run directory (replacing an earlier dump)."""
    torch = sys.modules.get("torch")  # never imported here: a rank without torch has no recorder
    if "run_dir" not in _state or torch is None:
        return
    try:
        data = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
        path = flight_path(_state["run_dir"], _state["rank"])
        with open(path + ".part", "wb") as f:
            f.write(data if isinstance(data, bytes) else str(data).encode())
        os.replace(path + ".part", path)
    except Exception:  # noqa: BLE001 - best effort, in a dying rank or a signal handler
        pass
