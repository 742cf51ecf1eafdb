"""Which node's link is slow, from every pair of nodes measured alone (the link test's rule).

A pair's all_reduce moves at the pace of the slower of its two links, so a pair is *fast* when its
busbw reaches ``FRACTION`` (85%, the bandwidth suite's threshold) of the reference, and *slow*
otherwise. The reference is the per-node link rate where one is known (declared, the emulated
link's, the nodes' sysfs); where none is, the fastest pair: what this fabric carried between two
nodes tonight (not the median pair, which with one slow node in three is a slow pair).

- A node in at least one fast pair has a good link: it carried the rate with someone.
- A node none of whose pairs is fast, where some node is good, is *slow*: its pair with a good
  node is slow, so its own link is. Two slow nodes among four are each named, since each still has
  its pairs with the good nodes.
- Where no pair is fast, nothing says which node it is (any node but one could be): with two
  nodes the pair is named and the message says it cannot tell which; with more, every pair is slow
  (the whole fabric, or all nodes but one).
- A slow pair of two good nodes is the path between them (a switch, a route, a cable between
  switches), not either node's link: it is named as a pair.

Plain standard library: pure functions of the pairs' figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

FRACTION = 0.85

OK, SLOW, UNDECIDED = "ok", "slow", "undecided"


@dataclass(frozen=True)
class Pair:
    a: str
    b: str
    busbw_gbit: float

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a

    @property
    def name(self) -> str:
        return f"{self.a}-{self.b}"


@dataclass
class LinkVerdict:
    """The pairs judged against one reference: each node's state and the lines that say why."""

    nodes: list[str]
    pairs: list[Pair]
    reference_gbit: float
    reference: str  # where the reference comes from, in words
    fraction: float = FRACTION
    states: dict[str, str] = field(default_factory=dict)

    @property
    def floor_gbit(self) -> float:
        return self.fraction * self.reference_gbit

    def fast(self, pair: Pair) -> bool:
        return pair.busbw_gbit >= self.floor_gbit

    def pairs_of(self, node: str) -> list[Pair]:
        return [p for p in self.pairs if node in (p.a, p.b)]

    def best(self, node: str) -> Pair | None:
        return max(self.pairs_of(node), key=lambda p: p.busbw_gbit, default=None)

    @property
    def slow_nodes(self) -> list[str]:
        return [n for n in self.nodes if self.states.get(n) == SLOW]

    @property
    def undecided(self) -> bool:
        return any(s == UNDECIDED for s in self.states.values())

    @property
    def slow_paths(self) -> list[Pair]:
        """Slow pairs between two good nodes: the path between them, not a node's link."""
        return [p for p in self.pairs if not self.fast(p) and self.states.get(p.a) == OK
                and self.states.get(p.b) == OK]

    def _pct(self, gbit: float) -> str:
        return f"{gbit / self.reference_gbit:.0%}"

    def _figures(self, pairs: Sequence[Pair], node: str | None = None) -> str:
        return ", ".join(f"{p.other(node) if node else p.name} {p.busbw_gbit:.3f}" for p in pairs)

    def against(self) -> str:
        return f"{self.fraction:.0%} of {self.reference_gbit:g} Gbit/s ({self.reference})"

    def node_line(self, node: str) -> str:
        """One line on ``node``'s link: its state, its best pair against the reference, its pairs."""
        state, best = self.states.get(node), self.best(node)
        if best is None:
            return f"{node}: no pair measured"
        pairs = (f"pairs of {node} (busbw Gbit/s): {self._figures(self.pairs_of(node), node)}")
        head = (f"{node}'s best pair ({best.name}) {best.busbw_gbit:.3f} Gbit/s busbw = "
                f"{self._pct(best.busbw_gbit)} of {self.reference_gbit:g} Gbit/s ({self.reference})")
        if state == OK:
            return f"{node} ok: {head}, at least {self.fraction:.0%}; {pairs}"
        if state == SLOW:
            others = [p for p in self.pairs if node not in (p.a, p.b)]
            rest = (f"; pairs without {node}: {min(p.busbw_gbit for p in others):.3f}-"
                    f"{max(p.busbw_gbit for p in others):.3f} Gbit/s" if others else "")
            return f"{node} slow: {head}, below {self.fraction:.0%}; {pairs}{rest}"
        return f"{node} undecided: {self.undecided_reason()}; {pairs}"

    def undecided_reason(self) -> str:
        if len(self.nodes) == 2:
            (pair,) = self.pairs
            return (f"the pair {pair.name} is slow ({pair.busbw_gbit:.3f} Gbit/s busbw = "
                    f"{self._pct(pair.busbw_gbit)}, below {self.against()}), and with two nodes the test "
                    f"cannot tell which node's link it is: run it with a third node")
        return (f"every pair is below {self.against()} ({min(p.busbw_gbit for p in self.pairs):.3f}-"
                f"{max(p.busbw_gbit for p in self.pairs):.3f} Gbit/s): the whole fabric is slow, or all "
                f"nodes but one, and no pair says which")

    def summary(self) -> str:
        """The verdict in one line: the slow nodes, the slow paths, or that every link is good."""
        if self.undecided:
            return self.undecided_reason()
        parts = []
        if self.slow_nodes:
            parts.append("slow node(s): " + "; ".join(
                f"{n} (best pair {self.best(n).busbw_gbit:.3f} Gbit/s = {self._pct(self.best(n).busbw_gbit)})"
                for n in self.slow_nodes) + f", below {self.against()}")
        if self.slow_paths:
            parts.append("slow pair(s) of good nodes, the path between them (a switch, a route), not a node's "
                         "link: " + ", ".join(f"{p.name} {p.busbw_gbit:.3f} Gbit/s" for p in self.slow_paths))
        if not parts:
            low = min(self.pairs, key=lambda p: p.busbw_gbit)
            return (f"every node's link reaches {self.against()} with some pair; slowest pair {low.name} "
                    f"{low.busbw_gbit:.3f} Gbit/s")
        return "; ".join(parts)

    def table(self) -> list[str]:
        """One line per pair: busbw and its share of the reference."""
        return [f"{p.name}: busbw {p.busbw_gbit:.3f} Gbit/s = {self._pct(p.busbw_gbit)} of {self.reference_gbit:g}"
                + ("" if self.fast(p) else " (slow)") for p in self.pairs]


class CannotJudge(ValueError):
    """The pairs say nothing about the links (one pair and no link rate); the message says what to give."""


def judge(nodes: Sequence[str], pairs: Sequence[Pair], rate_gbit: float | None = None, rate_source: str = "",
          fraction: float = FRACTION) -> LinkVerdict:
    """Each node of ``nodes`` judged from ``pairs`` (every pair of them, each measured alone)
    against ``rate_gbit`` (the per-node link rate; None: unknown, the fastest pair instead)."""
    if not pairs:
        raise CannotJudge("no pair of nodes was measured: the link test needs two nodes at least")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction}: need 0 < fraction <= 1")
    if rate_gbit:
        reference, source = float(rate_gbit), rate_source or "the link rate"
    else:
        if len(pairs) == 1:
            raise CannotJudge("one pair and no link rate known: nothing to hold the pair to; declare the rate "
                              "(--fabric-link-gbit) or run the test on three nodes or more")
        best = max(pairs, key=lambda p: p.busbw_gbit)
        reference, source = best.busbw_gbit, f"no link rate known: the fastest pair, {best.name}"
    verdict = LinkVerdict(list(nodes), list(pairs), reference, source, fraction)
    good = {n for p in pairs if verdict.fast(p) for n in (p.a, p.b)}
    for node in nodes:
        if not verdict.pairs_of(node):
            continue
        verdict.states[node] = OK if node in good else SLOW if good else UNDECIDED
    return verdict


def all_nodes_line(busbw_gbit: float, nodes: int, verdict: LinkVerdict) -> tuple[bool, str]:
    """(whether the all-node all_reduce busbw on ``nodes`` nodes and the pairs both pass, the line
    that reads one against the other). A ring moves at its slowest link, so a slow node holds the
    all-node figure down to about its own pairs' figure; an all-node figure below the reference with
    every node good alone is lost at scale (the switch, contention, the algorithm), not to a link."""
    head = (f"all-node all_reduce busbw {busbw_gbit:.3f} Gbit/s on {nodes} nodes = "
            f"{busbw_gbit / verdict.reference_gbit:.0%} of {verdict.reference_gbit:g} Gbit/s")
    low = busbw_gbit < verdict.floor_gbit
    if verdict.undecided:
        return False, f"{head}; pairs alone: {verdict.undecided_reason()}"
    slow = verdict.slow_nodes
    if slow:
        worst = min((verdict.best(n) for n in slow), key=lambda p: p.busbw_gbit)
        reading = (f"it reads the slowest node's link: {busbw_gbit / worst.busbw_gbit:.2f} x the best pair of "
                   f"{', '.join(slow)}" if low else
                   "the all-node figure hides it (an algorithm that does not cross every link at its pace)")
        return False, f"{head}; pairs alone: {verdict.summary()}; {reading}"
    if verdict.slow_paths:
        return False, f"{head}; pairs alone: {verdict.summary()}"
    if low:
        fast = [p.busbw_gbit for p in verdict.pairs]
        return False, (f"{head}, below {verdict.against()}, yet every node reaches it with some pair alone "
                       f"({min(fast):.3f}-{max(fast):.3f} Gbit/s): the all-node figure is lost at scale (the "
                       f"switch, contention, the collective's algorithm), not to one node's link")
    return True, f"{head}, at least {verdict.against()}; pairs alone: {verdict.summary()}"
