"""What one measurement is of: a (model, nodes, fabric, sharding) case, and the id everything names it by.

A hub type with no dependencies: the matrix, the suite file, saved nights and the JUnit reader
all speak in cases, and none of them should pull in the launch stack to do so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The model name of a collective-bandwidth case: it trains nothing, it only needs nodes and a fabric.
BANDWIDTH = "collectives"
# The model name of a link-test case: every pair of its nodes measured alone (workload/pairs.py).
LINKS = "links"

# How parameters are sharded (workload/config.SHARDINGS): "full" over every rank, "hybrid" within a
# node and replicated across nodes. A case id names a sharding other than "full" at its end.
SHARDINGS = ("full", "hybrid")
# Case.id is "<model>-n<nodes>-<fabric>[-<sharding>]"; fabric names are lowercase letters, digits,
# '_', '.', '-' (one that ends in "-hybrid" is refused: fabrics.py).
FABRIC_NAME = r"[a-z][a-z0-9_.-]*"
_CASE_ID = re.compile(rf"^(?P<model>.+)-n(?P<nodes>\d+)-(?P<fabric>[a-z][a-z0-9_.-]*?)"
                      rf"(?:-(?P<sharding>{'|'.join(s for s in SHARDINGS if s != 'full')}))?$")


@dataclass(frozen=True, order=True)
class Case:
    model: str
    nodes: int  # how many nodes (a count; the hosts a launch ran on are in its result)
    fabric: str
    sharding: str = "full"

    @property
    def id(self) -> str:
        return f"{self.model}-n{self.nodes}-{self.fabric}" + ("" if self.sharding == "full" else f"-{self.sharding}")

    def with_fabric(self, fabric: str) -> Case:
        return Case(self.model, self.nodes, fabric, self.sharding)

    def with_nodes(self, nodes: int) -> Case:
        """The same case on ``nodes`` nodes; on one node, full sharding (every layout is one replica)."""
        return Case(self.model, nodes, self.fabric, self.sharding if nodes > 1 else "full")

    def with_sharding(self, sharding: str) -> Case:
        return Case(self.model, self.nodes, self.fabric, sharding)

    @property
    def layout(self) -> str:
        """How a launch of this case shards: on one node every sharding is the same layout (one
        replica), so one launch serves them all (``Measurer.key``)."""
        return self.sharding if self.crosses_fabric else "full"

    @property
    def crosses_fabric(self) -> bool:
        # On one node no traffic crosses the inter-node fabric (NVLink / loopback does the work).
        return self.nodes > 1

    def serves(self, fabrics: list[str] | tuple[str, ...]) -> list[Case]:
        """The cases a launch of this one measures: itself, or on one node (no traffic crosses the
        fabric) the same launch under each of ``fabrics``. The one statement of that rule."""
        return [self] if self.crosses_fabric else [self.with_fabric(f) for f in fabrics]

    @property
    def is_bandwidth(self) -> bool:
        return self.model == BANDWIDTH

    @classmethod
    def parse(cls, case_id: str) -> Case:
        """``Case`` from its id (``qwen2-tiny-n2-eth``, ``qwen2-tiny-n2-eth-hybrid``); ValueError when it
        is not one."""
        match = _CASE_ID.match(case_id)
        if not match:
            raise ValueError(f"{case_id!r} is not a case id (MODEL-nNODES-FABRIC[-SHARDING])")
        return cls(match["model"], int(match["nodes"]), match["fabric"], match["sharding"] or "full")
