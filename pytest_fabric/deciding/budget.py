"""A night that fits its budget: how many rounds each gate may take (--night-budget).

A gate's sequential design (``sequential.SequentialGate``) spends its error allowance over the
information fraction launches / budget, so its boundaries depend on its most rounds: the most must
be fixed before the gate's first look and never changed during it (stopping a gate early at a look
its design did not plan would leave allowance unspent and move the error rates; extending it would
overspend). So the budget is turned into each gate's most rounds here, deterministically from the
plan, before the gate starts: every gate gets its first look (``--repeats``), and what the budget
leaves is shared out in rounds, one round to each gate in turn, each capped by --max-repeats.

A leaf: pure arithmetic on seconds, rounds and costs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BudgetTooSmall", "GateWork", "allot", "format_duration", "parse_duration"]

_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``45m``, ``1h30m``, ``2700s``, ``1h``, or a bare number of seconds.
    ValueError, saying which forms are accepted, for anything else or for zero."""
    s = str(text).strip().lower().replace(" ", "")
    seconds: float | None = None
    if re.fullmatch(r"\d+(?:\.\d+)?", s):
        seconds = float(s)
    elif s and re.fullmatch(r"(?:\d+(?:\.\d+)?[hms])+", s):
        units = [u for _, u in _PART.findall(s)]
        if len(set(units)) == len(units) and units == sorted(units, key="hms".index):
            seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in _PART.findall(s))
    if seconds is None or seconds <= 0:
        raise ValueError(f"{text!r} is not a duration; give one such as 45m, 1h30m or 2700s")
    return seconds


def format_duration(seconds: float) -> str:
    """``4 min 10 s``, ``1 h 5 min``, ``40 s``: a duration as the plan prints it."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


@dataclass(frozen=True)
class GateWork:
    """One gate of the plan: the cost of one of its rounds (every side launched once), its first
    look and its most rounds (--repeats, --max-repeats)."""

    name: str
    round_s: float
    first: int
    most: int

    def cost(self, rounds: int) -> float:
        return rounds * self.round_s


class BudgetTooSmall(ValueError):
    """The budget does not hold even every gate's first look and the other launches."""


def allot(gates: Sequence[GateWork], other_s: float, budget_s: float, *, strict: bool = True) -> list[int]:
    """Each gate's most rounds so that the other launches (``other_s``), every gate's first look and
    the rounds added fit ``budget_s``: the rounds left after the first looks go one to each gate in
    turn (the gates in order), a gate taking no more once at its ``most`` or once its next round no
    longer fits, so that the rounds are split evenly. Never below a gate's first look: where the
    first looks alone do not fit, ``BudgetTooSmall`` says what would (``strict``), or every gate gets
    its first look only (not ``strict``: the night re-planned when it has already overrun)."""
    rounds = [g.first for g in gates]
    needed = other_s + sum(g.cost(g.first) for g in gates)
    if needed > budget_s:
        if strict:
            raise BudgetTooSmall(
                f"--night-budget {format_duration(budget_s)} does not hold the first looks: the other launches "
                f"(~{format_duration(other_s)}) and {len(gates)} gate(s) at --repeats "
                f"{min((g.first for g in gates), default=0)} need ~{format_duration(needed)}; give "
                f"--night-budget {math.ceil(needed * 1.1 / 60)}m or more, or select fewer tests (-k)")
        return rounds
    left = budget_s - needed
    growing = True
    while growing:
        growing = False
        for i, g in enumerate(gates):
            if rounds[i] < g.most and g.round_s <= left:
                rounds[i] += 1
                left -= g.round_s
                growing = True
    return rounds
