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

``fabric=NAME`` limits a fault to launches on that fabric (default: every launch). Defaults:
``rank=1``, ``step=1``, ``node=1``. The harness reads the variable from its own environment; the
ranks inherit it. A malformed value is refused before anything is launched.
Plain standard library: the harness parses it without importing torch.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "PYTEST_FABRIC_FAULT"
RANK_KINDS = ("crash", "abort", "hang")
KINDS = (*RANK_KINDS, "nojoin", "slow", "stall")
# Planted effects that scale steps: their factor= (and stall's p=) apply to them alone.
SCALING_KINDS = ("slow", "stall")
_INTS = ("rank", "step", "node")


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

    def applies(self, fabric: str | None) -> bool:
        return self.fabric is None or self.fabric == fabric

    def describe(self) -> str:
        if self.kind == "slow":
            return f"slow: every step x{self.factor:g}" + (f" (fabric {self.fabric})" if self.fabric else "")
        if self.kind == "stall":
            return (f"stall: {self.p:.0%} of steps x{self.factor:g}"
                    + (f" (fabric {self.fabric})" if self.fabric else ""))
        where = f"node {self.node}" if self.kind == "nojoin" else f"rank {self.rank} at step {self.step}"
        return f"{self.kind} on {where}" + (f" (fabric {self.fabric})" if self.fabric else "")


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
                                 f"factor=X, p=FRACTION")
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


def at_step(faults: list[Fault], rank: int, step: int, fabric: str | None) -> None:
    """Called by every rank at the start of every step: do what a fault for here says."""
    for fault in faults:
        if fault.kind not in RANK_KINDS or fault.rank != rank or fault.step != step or not fault.applies(fabric):
            continue
        print(f"pytest-fabric: injected fault: {fault.describe()}", file=sys.stderr, flush=True)
        if fault.kind == "crash":
            raise InjectedFault(f"injected fault: {fault.describe()}")
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
