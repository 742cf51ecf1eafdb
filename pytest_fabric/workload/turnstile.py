"""Interleaved launches: the sides of a comparison round take turns on one machine, seconds each.

On a machine whose speed wanders over minutes, two launches run one after the other are measured
on two different machines. Measured here (2026-11-26, three nights of the stall gates): a 60 s
launch's mean is known only to 1.5-3.3% from its own steps (batch means), its steps' slow phases
last tens of seconds to minutes, and rounds of back-to-back launches of one configuration against a
copy of itself differed by 2-11% from round to round (by night). No window a launch can afford
shrinks that, and a gate of 6 rounds cannot decide 5% on it.

Interleaving does: the round's launches start together, warm up, and then take turns, one chunk of
about ``chunk_s`` seconds of measured steps each (side 0, side 1, ..., side 0, ...), the sides not
on turn idle in a poll. Each side's steps then sit seconds from the other's, and a drift of the
machine hits both alike. Each side pays the same wake-up after its wait (a vCPU runs slower for
tens of ms after it idles) once per chunk of equal length, so their ratio keeps what each pays.

The protocol, files in one directory that every rank of every side sees (the sides run on this
machine: emulated and local clusters), standard library only::

    <dir>/s<side>.r<rank>   "<chunks>": how many chunks this rank has completed; written 0 when it
                            is ready to measure (after warm-up), after each chunk, and ``DONE`` when
                            it stops measuring (the harness writes it too when a side's launch ends)

Side s starts its chunk c when every side t < s has completed c + 1 chunks and every side t > s has
completed c (all of that side's ranks), or is done. A side whose files stop moving for ``wait_s``
(``ready_wait_s`` before it is ready) is not waited for again, and the launch records it
(``summary``). A chunk ends on the all-reduced step times, so every rank of a side ends it at the
same step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["CHUNK_S", "DONE", "TurnConfig", "Turnstile", "mark_done"]

# A turn: long enough that the hand-over (a poll, a vCPU waking) is a small part of it, short
# against the machine's slow phases (tens of seconds and more).
CHUNK_S = 2.0
DONE = 1 << 40  # a side that stopped measuring: never waited for again
POLL_S = 0.005  # a waiting rank's poll: 5 ms hands a turn over well inside a step, at about 1% of a core


@dataclass(frozen=True)
class TurnConfig:
    """One side's place in an interleaved round: the shared ``directory``, this launch's ``side``,
    the world size of every side (``worlds``), the chunk length, and how long a silent side is
    waited for."""

    directory: str
    side: int
    worlds: tuple[int, ...]
    chunk_s: float = CHUNK_S
    wait_s: float = 120.0
    ready_wait_s: float = 600.0

    def __post_init__(self) -> None:
        if len(self.worlds) < 2 or not 0 <= self.side < len(self.worlds) or min(self.worlds) < 1:
            raise ValueError(f"an interleaved round needs 2 or more sides of 1 or more ranks and a side among them, "
                             f"got side {self.side} of {self.worlds}")
        if not (self.chunk_s > 0 and self.wait_s > 0 and self.ready_wait_s > 0):
            raise ValueError(f"chunk_s, wait_s and ready_wait_s must be positive, got {self}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "worlds": list(self.worlds)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnConfig:
        return cls(**{**data, "worlds": tuple(int(w) for w in data["worlds"])})


def _path(directory: str | Path, side: int, rank: int) -> Path:
    return Path(directory) / f"s{side}.r{rank}"


def _write(path: Path, value: int) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(str(value))
    os.replace(tmp, path)  # a reader sees the old count or the new one, never half of one


def mark_done(directory: str | Path, side: int, world: int) -> None:
    """Mark every rank of ``side`` done: the harness, when that side's launch has ended (however it
    ended), so that no other side waits for it."""
    for rank in range(world):
        try:
            _write(_path(directory, side, rank), DONE)
        except OSError:
            pass  # the directory is gone: nobody is waiting in it


@dataclass
class Turnstile:
    """One rank's turns (``wait`` before each measured step, ``stepped`` after it)."""

    config: TurnConfig
    rank: int
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    poll_s: float = POLL_S
    completed: int = -1  # chunks this side completed (-1: not ready yet)
    in_chunk: bool = False
    chunk_time: float = 0.0
    waited_s: float = 0.0
    alone_steps: int = 0  # measured steps taken after every other side was done or gone
    gone: set[int] = field(default_factory=set)
    _done: bool = False

    def _publish(self, value: int) -> None:
        _write(_path(self.config.directory, self.config.side, self.rank), value)

    def count(self, side: int) -> int:
        """The chunks every rank of ``side`` has completed (-1: not all ready yet; ``DONE``: done)."""
        counts = []
        for rank in range(self.config.worlds[side]):
            try:
                counts.append(int(_path(self.config.directory, side, rank).read_text() or -1))
            except (OSError, ValueError):
                counts.append(-1)
        return min(counts)

    def _others(self) -> list[int]:
        return [t for t in range(len(self.config.worlds)) if t != self.config.side and t not in self.gone]

    def ready(self) -> None:
        """Say this rank is ready to measure (its warm-up is over); ``wait`` says it too."""
        if self.completed < 0:
            self.completed = 0
            self._publish(0)

    def wait(self) -> None:
        """Before a measured step: at once inside a chunk; otherwise until this side's turn."""
        self.ready()
        if self.in_chunk:
            return
        c, side = self.completed, self.config.side
        start = self.clock()
        seen: dict[int, tuple[int, float]] = {}
        while True:
            now = self.clock()
            pending = []
            for t in self._others():
                n = self.count(t)
                if n >= (c + 1 if t < side else c):
                    continue
                if t not in seen or seen[t][0] != n:
                    seen[t] = (n, now)
                elif now - seen[t][1] > (self.config.ready_wait_s if n < 0 else self.config.wait_s):
                    self.gone.add(t)  # silent too long: never waited for again
                    continue
                pending.append(t)
            if not pending:
                break
            self.sleep(self.poll_s)
        self.waited_s += self.clock() - start
        self.in_chunk, self.chunk_time = True, 0.0

    def stepped(self, step_s: float, done: bool = False) -> None:
        """After a measured step of ``step_s`` (the all-reduced figure, the same on every rank of the
        side); ``done``: the launch stops measuring here."""
        if all(self.count(t) >= DONE for t in self._others()):
            self.alone_steps += 1
        if done:
            self.finish()
            return
        self.chunk_time += step_s
        if self.chunk_time >= self.config.chunk_s:
            self.completed += 1
            self._publish(self.completed)
            self.in_chunk = False

    def finish(self) -> None:
        if not self._done:
            self._done = True
            self._publish(DONE)

    def summary(self) -> dict[str, Any]:
        """What the launch records of its interleaving."""
        return {"side": self.config.side, "sides": len(self.config.worlds), "chunk_s": self.config.chunk_s,
                "chunks": max(self.completed, 0), "waited_s": round(self.waited_s, 3),
                "alone_steps": self.alone_steps, "partners_lost": sorted(self.gone)}
