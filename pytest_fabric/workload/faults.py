"""Fault injection, for testing the harness itself on the emulated (or local) cluster.

    PYTEST_FABRIC_FAULT="crash:fabric=eth,rank=1,step=1; hang:fabric=roce; nojoin:fabric=efa,node=1"

One or more faults separated by ``;``, each ``KIND[:key=value,...]``:

- ``crash``: global rank ``rank`` raises an exception at the start of step ``step`` (0-based, warm-up
  steps count), as an out-of-memory or a CUDA error would, mid-run with its peers inside FSDP.
- ``abort``: the same rank dies by SIGABRT there, with no Python clean-up (a C++ crash).
- ``hang``: the same rank stops there forever, so its peers block inside the step's collectives.
- ``nojoin``: node ``node`` never joins the rendezvous: the harness leaves its link down, so its
  torchrun cannot reach node 0 (emulated cluster only).
- ``slow``: every rank stretches each step by ``factor`` (default 1.10: a step 10% longer), on
  launches that cross the fabric (more than one node) only: a known effect planted on the
  compute side, for measuring what the gates catch (``benchmarks/nightly_gates.py``).
- ``stall``: a fraction ``p`` (default 0.2) of the steps of a launch that crosses the fabric take
  ``factor`` (default 1.6) times as long, the same steps on every rank and with no CPU signal (the
  ranks sleep): a flapping link, congestion bursts or retransmits, which cost the job its mean
  throughput and leave the fast steps alone. Which steps stall is drawn per launch (seeded by the
  launch's rendezvous id and the step), so every rank agrees.
- ``garbage``: global rank ``rank`` prints ``mb`` (default 50) MB of binary garbage and long lines to
  its stdout and stderr at step ``step``, then goes on: the harness must keep its report (and the
  node's log it reads) bounded, and stops a launch whose log outgrows its limit.
- ``truncate``: global rank ``rank`` (default 0, the one that writes it) writes its result.json cut
  in the middle (the file exists, half of it) and exits 0: the harness reports an unreadable result.
- ``linkcut``: node ``node``'s fabric link is cut mid-step: when that node's first rank reaches step
  ``step`` it asks the harness (a request file in the launch's directory), which takes the node's
  cable out (emulated cluster only); the ranks then fail or hang until the launch deadline.

``fabric=NAME`` limits a fault to launches on that fabric (default: every launch). Defaults:
``rank=1``, ``step=1``, ``node=1``. The harness reads the variable from its own environment; the
ranks inherit it. A malformed value is refused before anything is launched.
Plain standard library: the harness parses it without importing torch.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "PYTEST_FABRIC_FAULT"
RANK_KINDS = ("crash", "abort", "hang")
KINDS = (*RANK_KINDS, "nojoin", "slow", "stall", "garbage", "truncate", "linkcut")
# Planted effects that scale steps: their factor= (and stall's p=) apply to them alone.
SCALING_KINDS = ("slow", "stall")
_INTS = ("rank", "step", "node", "mb")


class InjectedFault(RuntimeError):
    """What a ``crash`` fault raises inside a rank."""


@dataclass(frozen=True)
class Fault:
    kind: str
    fabric: str | None = None
    rank: int = 1
    step: int = 1
    node: int = 1
    factor: float = 1.10
    p: float = 0.2  # stall: the fraction of steps that stall
    mb: int = 50  # garbage: megabytes printed

    def applies(self, fabric: str | None) -> bool:
        return self.fabric is None or self.fabric == fabric

    def describe(self) -> str:
        what = {
            "slow": lambda: f"slow: every step x{self.factor:g}",
            "stall": lambda: f"stall: {self.p:.0%} of steps x{self.factor:g}",
            "garbage": lambda: f"garbage: rank {self.rank} prints {self.mb} MB of binary garbage at step {self.step}",
            "truncate": lambda: f"truncate: rank {self.rank} writes result.json cut mid-write",
            "linkcut": lambda: f"linkcut: node {self.node}'s link cut at step {self.step}",
            "nojoin": lambda: f"nojoin on node {self.node}",
        }.get(self.kind, lambda: f"{self.kind} on rank {self.rank} at step {self.step}")()
        return what + (f" (fabric {self.fabric})" if self.fabric else "")


def parse(text: str) -> list[Fault]:
    """The faults ``text`` names; ValueError saying what to write when it is malformed."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        kind, _, args = item.partition(":")
        kind = kind.strip()
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault {kind!r} in {item!r}; use one of {', '.join(KINDS)}, "
                             f"e.g. {ENV}='crash:fabric=eth,rank=1,step=1'")
        fields: dict[str, object] = {}
        for pair in filter(None, (a.strip() for a in args.split(","))):
            key, sep, value = (s.strip() for s in pair.partition("="))
            if not sep or key not in ("fabric", "factor", "p", *_INTS) or not value:
                raise ValueError(f"{ENV}: {pair!r} in {item!r} is not one of fabric=NAME, rank=N, step=N, node=N, "
                                 f"factor=X, p=FRACTION, mb=N")
            if key == "factor":
                try:
                    fields[key] = float(value)
                except ValueError:
                    fields[key] = 0.0
                if not 1.0 <= fields[key] <= 100.0:  # type: ignore[operator]
                    raise ValueError(f"{ENV}: factor={value!r} in {item!r} must be a number from 1 to 100 (1.10: "
                                     f"steps 10% longer)")
            elif key == "p":
                try:
                    fields[key] = float(value)
                except ValueError:
                    fields[key] = -1.0
                if not 0.0 < fields[key] <= 1.0:  # type: ignore[operator]
                    raise ValueError(f"{ENV}: p={value!r} in {item!r} must be a fraction in (0, 1] (0.2: one step "
                                     f"in five stalls)")
            elif key in _INTS:
                if not value.isdigit():
                    raise ValueError(f"{ENV}: {key}={value!r} in {item!r} must be a whole number >= 0")
                fields[key] = int(value)
            else:
                fields[key] = value
        if ("factor" in fields or "p" in fields) and kind not in SCALING_KINDS:
            raise ValueError(f"{ENV}: factor= and p= in {item!r} apply to slow and stall faults only")
        if "mb" in fields and kind != "garbage":
            raise ValueError(f"{ENV}: mb= in {item!r} applies to garbage faults only")
        if kind == "truncate":
            fields.setdefault("rank", 0)  # global rank 0 writes the result
        if kind == "stall":
            fields.setdefault("factor", 1.6)
        elif "p" in fields:
            raise ValueError(f"{ENV}: p= in {item!r} applies to stall faults only")
        faults.append(Fault(kind, **fields))  # type: ignore[arg-type]
    return faults


def from_env(environ: Mapping[str, str] | None = None) -> list[Fault]:
    return parse((os.environ if environ is None else environ).get(ENV, ""))


def nodes_left_out(faults: list[Fault], fabric: str) -> set[int]:
    """The node indexes that must never join a launch on ``fabric``."""
    return {f.node for f in faults if f.kind == "nojoin" and f.applies(fabric)}


def links_cut(faults: list[Fault], fabric: str) -> set[int]:
    """The node indexes whose link the harness cuts mid-launch on ``fabric`` (on request)."""
    return {f.node for f in faults if f.kind == "linkcut" and f.applies(fabric)}


def cut_request(run_dir: str | os.PathLike[str], node: int) -> str:
    """The file node ``node``'s rank creates to ask the harness to cut its link now."""
    return os.path.join(os.fspath(run_dir), f"linkcut-node{node}.request")


def truncates(faults: list[Fault], rank: int, fabric: str | None) -> Fault | None:
    """The ``truncate`` fault that makes ``rank`` write its result cut in the middle, if any."""
    return next((f for f in faults if f.kind == "truncate" and f.rank == rank and f.applies(fabric)), None)


def here() -> str:
    """The node this rank runs on, as the launcher named it (``node1/198.18.0.2``), else the host name."""
    return os.environ.get("PYTEST_FABRIC_NODE") or socket.gethostname()


def announcement(fault: Fault) -> str:
    """What a rank says when it does what ``fault`` says: the fault's kind and where (its node), so
    that the failure report names both (the supervisor lifts such lines to its head)."""
    return f"injected fault: {fault.describe()}, on {here()}"


def _announce(fault: Fault) -> None:
    print(f"pytest-fabric: {announcement(fault)}", file=sys.stderr, flush=True)


def write_truncated(fault: Fault, path: str, text: str) -> None:
    """``text`` cut in the middle at ``path``, written in place (not atomically): a writer that died mid-write."""
    _announce(fault)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[: len(text) // 2])


def _print_garbage(fault: Fault) -> None:
    """``fault.mb`` MB of random bytes and newline-free lines on stdout and stderr, every 32 KiB
    followed by the fault's line (so that a log's tail still says what happened)."""
    line = f"\npytest-fabric: {announcement(fault)}\n".encode()
    for i in range(fault.mb * 32):
        chunk = os.urandom(1 << 15) if i % 2 == 0 else b"x" * (1 << 15)
        os.write(1 + i % 2, chunk + line)


def _cut_my_link(fault: Fault, run_dir: str | None) -> None:
    """Node ``fault.node``'s first rank asks the harness to cut its link, and waits (10 s at most) until
    it is down, so that the cut falls inside this step."""
    if run_dir is None or int(os.environ.get("GROUP_RANK", "0")) != fault.node \
            or int(os.environ.get("LOCAL_RANK", "0")) != 0:
        return
    _announce(fault)
    open(cut_request(run_dir, fault.node), "w").close()
    state = f"/sys/class/net/{os.environ.get('GLOO_SOCKET_IFNAME', 'fab0')}/operstate"
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        try:
            with open(state) as f:
                if f.read().strip() != "up":
                    return
        except OSError:
            return
        time.sleep(0.1)


def at_step(faults: list[Fault], rank: int, step: int, fabric: str | None, run_dir: str | None = None) -> None:
    """Called by every rank at the start of every step: do what a fault for here says."""
    for fault in faults:
        if fault.kind == "linkcut" and fault.step == step and fault.applies(fabric):
            _cut_my_link(fault, run_dir)
            continue
        if fault.kind == "garbage" and fault.rank == rank and fault.step == step and fault.applies(fabric):
            _print_garbage(fault)
            continue
        if fault.kind not in RANK_KINDS or fault.rank != rank or fault.step != step or not fault.applies(fabric):
            continue
        _announce(fault)
        if fault.kind == "crash":
            raise InjectedFault(announcement(fault))
        if fault.kind == "abort":
            os.kill(os.getpid(), signal.SIGABRT)
        while True:  # hang
            time.sleep(3600)


def stretch(faults: list[Fault], fabric: str | None, crosses_fabric: bool) -> float:
    """The factor a ``slow`` fault stretches this launch's steps by (1.0: none)."""
    factor = 1.0
    if crosses_fabric:
        for fault in faults:
            if fault.kind == "slow" and fault.applies(fabric):
                factor *= fault.factor
    return factor


def stall_factor(faults: list[Fault], fabric: str | None, crosses_fabric: bool, seed: int, step: int,
                 launch_id: str | None = None) -> float:
    """The factor a ``stall`` fault stretches step ``step`` of this launch by (1.0: this step does
    not stall). The same on every rank: drawn from the launch's id (torchrun's run id) and the step."""
    factor = 1.0
    if not crosses_fabric:
        return factor
    launch = os.environ.get("TORCHELASTIC_RUN_ID", "") if launch_id is None else launch_id
    for i, fault in enumerate(faults):
        if fault.kind == "stall" and fault.applies(fabric):
            draw = random.Random(f"{launch}:{seed}:{step}:{i}").random()
            if draw < fault.p:
                factor *= fault.factor
    return factor
