"""A straggler: a rank (or a node) whose own work per step stays above the others'.

Every rank's step time is the same within a step (the slowest rank's compute shows as the others'
wait in the collectives), so a straggler is found in each rank's own work: its CPU time in the step
on CPU runs (``signals.StepView.rank_cpu_s``). On GPUs a rank's compute cannot be told from its wait
without a profiler (its kernels wait on the collectives' streams), so GPU runs name what NVML shows
(``gpu_lines``): each node's slowed-down steps and a GPU whose clock stays low. A rank is named when its median over the measured
steps is more than ``STRAGGLER_MARGIN`` above the median of the other ranks' medians, and it exceeds
the others' median by that margin in at least ``STRAGGLER_SHARE`` of the steps: a steady excess, not
one slow step. A node whose every rank straggles is named as the node.

Why 15%: a rank 30% slower (a throttled GPU, a core shared with something else, a busy loop) is what
costs a night, since the job runs at its slowest rank's pace, while healthy ranks doing the same work
stay within a few percent of each other: on the emulated cluster, with the night's measuring window,
the largest excess of any rank in 10 A/A launches was 7.8% (median 3.4%), and ranks planted 30% slower
measured 27-30% (benchmarks/results/stragglers-2026-11-27.txt). Half of the steps: a straggler slows
most steps, a burst does not. A window of one second is too short for it: there one A/A launch showed
a whole emulated node (one core of this machine) 17.7% slower through all 8 of its steps.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..workload.signals import DISTURBING_THROTTLE, throttle_names

STRAGGLER_MARGIN = 0.15
STRAGGLER_SHARE = 0.5


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str  # the node's name as the launcher gave it ("node1/198.18.0.2"), else "node <index>"
    excess: float  # its median work over the others' median, less 1 (0.3: 30% more)
    steps: int  # measured steps in which it exceeded the margin
    of_steps: int  # measured steps in all
    work_s: float  # its median work per step
    others_s: float  # the other ranks' median

    def line(self) -> str:
        return (f"rank {self.rank} on {self.node} works {self.excess:.0%} longer per step than the others "
                f"({self.work_s * 1000:.0f} ms against {self.others_s * 1000:.0f} ms, in {self.steps} of "
                f"{self.of_steps} steps)")


def stragglers(work: Sequence[Sequence[float]], local_world_size: int = 1, hosts: Sequence[str] = (),
               margin: float = STRAGGLER_MARGIN, share: float = STRAGGLER_SHARE) -> list[Straggler]:
    """The ranks of ``work`` (per step, every rank's own work in seconds) that straggle; ``hosts``:
    the node of each global rank (else a node is named by its index, torchrun's numbering)."""
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
            node = hosts[r] if len(hosts) == ranks else f"node {r // max(1, local_world_size)}"
            found.append(Straggler(r, node, medians[r] / others - 1, over, len(work), medians[r], others))
    return found


def straggler_lines(found: Sequence[Straggler], ranks_of: dict[str, int] | None = None) -> list[str]:
    """One line per straggling rank; a node whose every rank (``ranks_of``: ranks per node name)
    straggles is one line naming the node."""
    by_node: dict[str, list[Straggler]] = {}
    for s in found:
        by_node.setdefault(s.node, []).append(s)
    out = []
    for node, group in by_node.items():
        if ranks_of and len(group) > 1 and len(group) == ranks_of.get(node):
            low = min(s.excess for s in group)
            out.append(f"{node}: all {len(group)} ranks ({', '.join(str(s.rank) for s in group)}) work at "
                       f"least {low:.0%} longer per step than the other nodes' ranks")
        else:
            out += [s.line() for s in group]
    return out


def gpu_lines(clocks: Sequence[Sequence[float]], masks: Sequence[Sequence[int]], hosts: Sequence[str] = (),
              local_world_size: int = 1, health: Sequence[Mapping[str, int]] = (),
              margin: float = STRAGGLER_MARGIN) -> list[str]:
    """GPU runs: per node, the steps in which any of its GPUs reported a slowdown NVML counts as
    outside the job (``signals.DISTURBING_THROTTLE``: thermal, hardware, power brake), with the
    reasons and ranks, and each rank whose median SM clock stays more than ``margin`` below the
    others'; with the GPU's temperature and uncorrected ECC errors where known. ``clocks`` and
    ``masks``: per measured step, every rank's SM clock (MHz, 0 unknown) and throttle mask."""
    if not clocks or not clocks[0]:
        return []
    ranks = len(clocks[0])
    nodes: dict[str, list[int]] = {}
    for r in range(ranks):
        nodes.setdefault(hosts[r] if len(hosts) == ranks else f"node {r // max(1, local_world_size)}", []).append(r)
    medians = [statistics.median([step[r] for step in clocks if step[r] > 0] or [0.0]) for r in range(ranks)]
    out = []
    for node, members in nodes.items():
        hit = [[r for r in members if _disturbing(step[r])] for step in masks]
        parts = []
        if throttled := sum(1 for h in hit if h):
            reasons = sorted({n for step in masks for r in members for n in _disturbing(step[r])})
            on = sorted({r for h in hit for r in h})
            parts.append(f"GPU slowed down in {throttled} of {len(masks)} steps ({', '.join(reasons)}) on rank "
                         f"{', '.join(map(str, on))}")
        for r in members:
            known = [m for i, m in enumerate(medians) if i != r and m > 0]
            if medians[r] > 0 and known and medians[r] < (1 - margin) * statistics.median(known):
                parts.append(f"rank {r}'s SM clock {medians[r]:.0f} MHz against {statistics.median(known):.0f} MHz "
                             f"on the other GPUs")
        if parts:
            facts = [f"rank {r} {h['temperature_c']} C" for r in members if r < len(health)
                     and (h := health[r]).get("temperature_c") is not None]
            facts += [f"rank {r} {h['ecc_uncorrected']} uncorrected ECC errors" for r in members
                      if r < len(health) and health[r].get("ecc_uncorrected")]
            out.append(f"{node}: " + "; ".join(parts) + (f" ({', '.join(facts)})" if facts else ""))
    return out


def _disturbing(mask: int) -> list[str]:
    return [n for n in throttle_names(int(mask)) if n in DISTURBING_THROTTLE]
