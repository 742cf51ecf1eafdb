"""The link test's launch: every pair of a fabric's nodes measured alone, once per session.

A ``PairsMeasurer`` is a ``Measurer`` (same cluster, settings, node facts, machine lock, deadline
and clean-up) whose records live in a store of their own (``links/`` in the session's directory):
shared by every test and xdist worker of the session as the other launches are, and kept out of
the night's store, whose readers (nights, JUnit, dashboards) know training and collective results
only. The link test's figures travel in its tests' messages and output.
"""

from __future__ import annotations

import hashlib
import json

from ..core.case import LINKS, Case
from ..workload.pair_types import LinksConfig, LinksResult, payload_for
from .measure import Measurer
from .measurement import LaunchRecord, LinksMeasurement

STORE_DIR = "links"
# What each pair adds to the launch's deadline (--launch-timeout): a process group made for it (an
# NCCL communicator takes about a second to set up on a large job), a warm-up and three iterations
# of at most ~0.2 s on a healthy link (twice that at half rate). N(N-1)/2 pairs: 6 on 4 nodes, 496 on 32.
PAIR_ALLOWANCE_S = 5.0


def pairs_deadline_s(launch_timeout_s: float, nodes: int) -> float:
    """The link test's launch deadline: the session's, plus ``PAIR_ALLOWANCE_S`` a pair."""
    return launch_timeout_s + PAIR_ALLOWANCE_S * nodes * (nodes - 1) / 2


def links_case(nodes: int, fabric: str) -> Case:
    """The link test's case: ``nodes`` nodes on ``fabric`` (id ``links-n4-ib``)."""
    return Case(LINKS, nodes, fabric)


class PairsMeasurer(Measurer):
    def measure_links(self, case: Case, link_gbit: float | None) -> LinksMeasurement:
        """Every pair of ``case``'s nodes on its fabric, measured alone; the payload sized from the
        per-node ``link_gbit`` (None: unknown, the backend's largest payload)."""
        case = links_case(case.nodes, case.fabric)
        s = self.settings
        payload = payload_for(link_gbit, 2 * s.gpus_per_node)
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, s.fabric(case.fabric).settings(), s.device, payload],
                           sort_keys=True)
        key = f"{case.id}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"
        return LinksMeasurement.from_record(self._cached(case, key, lambda: self._launch_links(case, payload)))

    def _launch_links(self, case: Case, payload: int | None) -> LaunchRecord:
        run_dir = self._run_dir(case)
        config = LinksConfig(result_path=str(run_dir / "result.json"), payload_bytes=payload,
                             device=self.settings.device, collective_timeout_s=self.settings.collective_timeout(),
                             fabric=self._fabric_record(case))
        return self._run(case, "pytest_fabric.workload.pairs", config, run_dir, None, kind=LinksResult)
