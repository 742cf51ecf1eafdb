"""Paired rounds: how a comparison's launches are gathered and counted, disturbed rounds re-run.

A comparison launches every side once per round (reference, candidate; the order alternates by
round) and judges the mean of the rounds' log ratios (``contrasts.contrast_interval``, blocked),
a paired design (Kalibera & Jones 2013: compare within the level that varies most). Every counted
round counts alike: no launch is weighed down or set aside.

A launch disturbed as a whole (``steps.LaunchEstimate.disturbed``: most of its steps taken by
something outside the job) makes its whole round be launched again,
under a rule fixed before the night: at most ``reruns`` re-runs per gate (``--reruns``); after that
a disturbed round counts as it is, and the verdict line says so. The rule never looks at the
values, only at the detector's flags, so it cannot move the estimate toward either verdict.

A leaf: the fixtures call ``run_rounds`` with a function that launches a round, and
``benchmarks/gate_power.py`` calls it with simulated launches, so both run the same code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from .contrasts import Verdict
from .sequential import Look, SequentialGate

__all__ = ["RERUNS", "Rounds", "run_rounds"]

# Re-runs of disturbed rounds a gate may take (--reruns): at 1-3% of launches disturbed on a quiet
# cluster, two re-runs cover a night's gate without lengthening it much.
RERUNS = 2

T = TypeVar("T")
Sample = Sequence[float]  # (log value, within-launch variance of the log value)


@dataclass
class Rounds(Generic[T]):
    """What ``run_rounds`` gathered: the counted rounds' launches, side by side, and the last look."""

    runs: list[list[T]]  # per side, the launches of the counted rounds, in round order
    look: Look
    launched: int = 0  # rounds launched, re-runs included (launches per side)
    reruns: list[str] = field(default_factory=list)  # one note per re-run round: which launch, why
    kept: list[str] = field(default_factory=list)  # disturbed rounds counted (re-runs spent): which, why

    def notes(self) -> tuple[str, ...]:
        """The re-runs and disturbed rounds counted, for the verdict line."""
        return (*(f"re-run: {r}" for r in self.reruns), *(f"counted although disturbed (re-runs spent): {k}"
                                                          for k in self.kept))


def round_order(index: int, n: int) -> list[int]:
    """The order the ``n`` sides of round ``index`` (0-based) launch in: as given in even rounds,
    reversed in odd ones, so that an order effect (the second launch of a round warmer, or colder)
    cancels over pairs of rounds."""
    order = list(range(n))
    return order[::-1] if index % 2 else order


def run_rounds(launch: Callable[[int, int], T], sides: int, gate: SequentialGate, *,
               signs: Sequence[float], sample: Callable[[T], Sample], disturbed: Callable[[T], str],
               fixed: tuple[float, float] = (0.0, 0.0), reruns: int = RERUNS,
               combine: Callable[[Sequence[T]], Sample] | None = None,
               name: Callable[[int, T], str] | None = None, launch_cap: int | None = None) -> Rounds[T]:
    """Launch rounds until ``gate.start`` rounds are counted and a look decides, or ``gate.budget``
    rounds are counted.

    ``launch(side, number)``: launch number ``number`` (0, 1, ...: every round, re-runs included,
    takes the next number) of side ``side``; ``sides`` sides launch per round in ``round_order``.
    ``sample``: a launch's (log value, within-launch variance), signed by ``signs`` in the contrast;
    ``combine``: instead, one sample from a round's launches (side order). ``disturbed``: why a
    launch is disturbed as a whole ("" when it is not): such a round is launched again while the
    gate has re-runs left. ``name(side, launch)``: how a note names a launch. ``launch_cap``: the most
    rounds launched, re-runs included (a night's budget pays for launches, not counted rounds): a
    disturbed round is launched again only while the first look still fits in it, and once that many
    have been launched, the gate stops at its next look; the first look is had in any case."""
    runs: list[list[T]] = [[] for _ in range(sides)]
    result: Rounds[T] = Rounds(runs, None)  # type: ignore[arg-type]
    left = reruns
    number = 0
    while True:
        got = {j: launch(j, number) for j in round_order(number, sides)}
        round_ = [got[j] for j in range(sides)]
        number += 1
        why = [(j, d) for j, g in enumerate(round_) if (d := disturbed(g))]
        if why:
            text = "; ".join(f"{name(j, round_[j]) if name else f'side {j}'} launch {number}: {d}" for j, d in why)
            # Under a cap, a re-run only where the first look still fits: the rounds launched, this
            # re-run's and those the first look still needs.
            room = launch_cap is None or number + gate.start - len(runs[0]) <= launch_cap
            if left > 0 and room:
                left -= 1
                result.reruns.append(text)
                continue
            result.kept.append(text)
        for j, g in enumerate(round_):
            runs[j].append(g)
        counted = len(runs[0])
        if counted < gate.start:
            continue
        spent = counted >= gate.budget or (launch_cap is not None and number >= launch_cap)
        groups = ([(+1.0, [combine(r) for r in zip(*runs)])] if combine else
                  [(sign, [sample(m) for m in launches]) for sign, launches in zip(signs, runs)])
        result.look = gate.look(groups, fixed, blocked=True, launches=counted)
        result.launched = number
        if result.look.verdict is not Verdict.INCONCLUSIVE or spent:
            return result


# The least gap between two launches that still counts as back to back: what starting the next
# launch takes (the harness between launches, another xdist worker's launch holding the machine);
# beyond it, the longer of the two launches (one launch between them).
ROUND_GAP_S = 5.0


def back_to_back(span: tuple[float, float], others: Sequence[tuple[float, float]], now: float) -> bool:
    """Whether a launch that ran over ``span`` (started, ended) ran in one round with the launches
    that ran over ``others``: at most the longer of the two launches (at least ``ROUND_GAP_S``)
    between it and each of them; with none, between it and ``now`` (they launch next)."""
    return all(max(0.0, max(span[0], o[0]) - min(span[1], o[1])) <= max(ROUND_GAP_S, span[1] - span[0], o[1] - o[0])
               for o in (others or [(now, now)]))
