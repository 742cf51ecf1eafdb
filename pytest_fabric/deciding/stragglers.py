"""A straggler: a rank (or a node) whose own work per step stays above the others'.

Every rank's step time is the same within a step (the slowest rank's compute shows as the others'
wait in the collectives), so a straggler is found in each rank's own work: its CPU time in the step
on CPU runs (``signals.StepView.rank_cpu_s``), its compute time on GPUs. A rank is named when its
median over the measured steps is more than ``STRAGGLER_MARGIN`` above the median of the other ranks'
medians, in at least ``STRAGGLER_SHARE`` of the steps too: a steady excess, not one slow step. 15%:
launch-to-launch noise on the emulated cluster is a few percent per rank, and a rank 30% slower (a
throttled GPU, a busy core) is what costs a night.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

STRAGGLER_MARGIN = 0.15
STRAGGLER_SHARE = 0.5


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: int
    excess: float  # its median work over the others' median, less 1 (0.3: 30% more)
    steps: int  # measured steps in which it exceeded the margin

    def line(self) -> str:
        return f"rank {self.rank} (node {self.node}) works {self.excess:.0%} longer per step than the others"


def stragglers(work: Sequence[Sequence[float]], local_world_size: int = 1,
               margin: float = STRAGGLER_MARGIN, share: float = STRAGGLER_SHARE) -> list[Straggler]:
    """The ranks of ``work`` (per step, every rank's own work in seconds) that straggle."""
    if not work or len(work[0]) < 2:
        return []
    ranks = len(work[0])
    medians = [statistics.median(step[r] for step in work) for r in range(ranks)]
    found = []
    for r in range(ranks):
        others = statistics.median(m for i, m in enumerate(medians) if i != r)
        if others <= 0 or medians[r] <= (1 + margin) * others:
            continue
        over = sum(1 for step in work
                   if step[r] > (1 + margin) * statistics.median(v for i, v in enumerate(step) if i != r))
        if over >= share * len(work):
            found.append(Straggler(r, r // max(1, local_world_size), medians[r] / others - 1, over))
    return found
