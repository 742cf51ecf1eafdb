"""The objects behind the link test's fixtures (``fabric_link_node``, ``fabric_links_case``,
``fabric_links``): which nodes a session's link test names, its one launch per fabric (every pair
of nodes measured alone, ``measuring/pair_measure.py``), and the pairs judged by
``deciding/slow_links.py``.

Nodes are named as the cluster names them (``Cluster.node_names``): the allocation's host names on
Slurm, the hostfile's hosts on SSH, ``node0..nodeN-1`` on the emulated and local clusters. A rank
names its node by ``PYTEST_FABRIC_NODE`` (``name/address``, set by every launcher), read back here
as whichever part the cluster knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from ..core.case import LINKS, Case
from ..deciding.slow_links import CannotJudge, LinkVerdict, Pair, judge
from ..measuring.measurement import LinksMeasurement, MeasurementError
from ..measuring.pair_measure import STORE_DIR, PairsMeasurer, links_case, pairs_deadline_s
from ..measuring.store import ResultStore
from ..physics.floor import impossible_payloads
from .matrix import expand
from .session import ERRORED_KEY, NOTES_KEY, FabricSession, progress_writer


@dataclass(frozen=True)
class LinkNode:
    """One node's link on one fabric: a parameter of the per-node link test."""

    case: Case  # the link test's case (all the session's nodes)
    node: str

    @property
    def id(self) -> str:
        return f"{self.case.fabric}-{self.node}"


def link_cases(session: FabricSession, excluded: Sequence[str] = ()) -> list[Case]:
    """One link-test case per fabric of the session, over all its nodes (none below two nodes)."""
    fabrics = [f for f in session.options.fabrics if f not in excluded]
    return [links_case(c.nodes, c.fabric) for c in expand([LINKS], session.nodes, fabrics, nodes=[session.nodes],
                                                          min_nodes=2)]


def planned_nodes(session: FabricSession) -> list[str]:
    """The names of the nodes a launch of all the session's nodes runs on, as far as collection
    knows: the cluster's first ``session.nodes`` names not left out (--exclude-nodes)."""
    cluster = session.cluster
    return [n for n in cluster.node_names(session.nodes) if n not in cluster.left_out][:session.nodes]


def link_nodes(session: FabricSession, excluded: Sequence[str] = ()) -> list[LinkNode]:
    """Each node x fabric of the link test, in a fixed order (the ids match on every xdist worker)."""
    nodes = planned_nodes(session)
    return [LinkNode(case, node) for case in link_cases(session, excluded) for node in nodes]


def node_name(label: str, known: Sequence[str]) -> str:
    """A rank's ``PYTEST_FABRIC_NODE`` (``name/address``) or host name as the cluster names the node:
    the part of it the cluster knows, else its first part."""
    parts = label.split("/")
    return next((p for p in parts if p in known), parts[0])


@dataclass
class LinkReport:
    """One fabric's link test: the launch and its pairs judged, nodes by the cluster's names."""

    measurement: LinksMeasurement
    verdict: LinkVerdict

    def lines(self, node: str | None = None) -> str:
        """The test's output: the launch, then ``node``'s line, or every pair (N(N-1)/2 lines), then
        the verdict."""
        middle = [self.verdict.node_line(node)] if node is not None else self.verdict.table()
        return "\n".join([self.measurement.summary(), *middle, self.verdict.summary()])


class LinkPairs:
    """The session's link tests: one launch per fabric (cached in the session's ``links`` store,
    shared with every xdist worker), judged once per process."""

    def __init__(self, session: FabricSession) -> None:
        self._session = session
        self._measurer: PairsMeasurer | None = None
        self._reports: dict[Case, LinkReport] = {}

    def measurer(self) -> PairsMeasurer:
        if self._measurer is None:
            s = self._session
            cluster = s.prepared_cluster()
            store = ResultStore(s.directory / STORE_DIR)
            settings = s.options.settings
            settings = replace(settings, launch_timeout_s=pairs_deadline_s(settings.launch_timeout_s, s.nodes))
            self._measurer = PairsMeasurer(cluster, settings, store, s.directory / "launches",
                                           progress=progress_writer(s.config), nodes=s.node_facts)
        return self._measurer

    def report(self, case: Case) -> LinkReport:
        """``case``'s pairs judged; MeasurementError for a failed launch, CannotJudge where the pairs
        say nothing (one pair, no rate)."""
        if case not in self._reports:
            s = self._session
            rate = s.link_rate(case.fabric) if s.prepared_cluster().realizes_fabrics else None
            # Under the night's store lock too, which every other launch of the session holds while it
            # runs (xdist workers): no launch of theirs runs beside the pairs on the same nodes.
            with s.store.locked():
                m = self.measurer().measure_links(case, rate.gbit if rate else None)
            known = s.cluster.node_names(case.nodes)
            names = {label: node_name(label, known) for label in m.result.nodes}
            pairs = [Pair(names[p.a], names[p.b], p.busbw_gbit) for p in m.pairs]
            verdict = judge([names[n] for n in m.result.nodes], pairs, rate.gbit if rate else None,
                            rate.source if rate else "")
            self._reports[case] = LinkReport(m, verdict)
        return self._reports[case]


class LinksFixture:
    """``fabric_links(case)`` -> LinkVerdict of ``case``'s fabric: every pair of the session's nodes
    measured alone, judged against the link rate. Fails the test for a failed launch, a wrong
    transport, or a pair faster than its link can carry; skips where the cluster has no fabric links
    (local processes) or the pairs cannot be judged. The pairs' lines go to the test's output."""

    def __init__(self, pairs: LinkPairs, session: FabricSession, item: pytest.Item) -> None:
        self._pairs = pairs
        self._session = session
        self._item = item

    def __call__(self, case: Case, node: str | None = None) -> LinkVerdict:
        """``node``: the test is about that node; its output shows that node's pairs, not all of them."""
        cluster = self._session.prepared_cluster()
        if not cluster.realizes_fabrics:
            pytest.skip(f"the {cluster.name} cluster has no {case.fabric} links to tell apart")
        message = None
        try:
            report = self._pairs.report(case)
        except MeasurementError as exc:
            self._item.stash[ERRORED_KEY] = True
            message = f"measurement failed: {exc}"
        except CannotJudge as exc:
            pytest.skip(f"{case.id}: {exc}")
        if message is not None:  # outside the except: the launch's failure shown once, unchained
            pytest.fail(message, pytrace=False)
        self._item.stash.setdefault(NOTES_KEY, []).append(report.lines(node))
        result = report.measurement.result
        if result.transport_problem:
            pytest.fail(f"wrong transport: {result.transport_problem}", pytrace=False)
        rate = self._session.link_rate(case.fabric)
        if rate is not None:
            rows = report.measurement.pairs
            tolerance = self._session.options.floor_tolerance
            if flagged := impossible_payloads(rows, 2, rate.gbit, tolerance):
                pytest.fail(f"faster than physically possible: a pair of nodes: {'; '.join(flagged)}; the link is "
                            f"{rate} (+{tolerance:.0%} tolerance)", pytrace=False)
        return report.verdict
