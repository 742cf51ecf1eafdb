"""What one measurement is of: a (model, nodes, fabric) case, and the id everything names it by.

A hub type with no dependencies: the matrix, the suite file, saved nights and the JUnit reader
all speak in cases, and none of them should pull in the launch stack to do so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The model name of a collective-bandwidth case: it trains nothing, it only needs nodes and a fabric.
BANDWIDTH = "collectives"

# Case.id is "<model>-n<nodes>-<fabric>"; fabric names are lowercase letters, digits, '_', '.', '-'.
FABRIC_NAME = r"[a-z][a-z0-9_.-]*"
_CASE_ID = re.compile(rf"^(?P<model>.+)-n(?P<nodes>\d+)-(?P<fabric>{FABRIC_NAME})$")


@dataclass(frozen=True, order=True)
class Case:
    model: str
    nodes: int  # how many nodes (a count; the hosts a launch ran on are in its result)
    fabric: str

    @property
    def id(self) -> str:
        return f"{self.model}-n{self.nodes}-{self.fabric}"

    def with_fabric(self, fabric: str) -> Case:
        return Case(self.model, self.nodes, fabric)

    def with_nodes(self, nodes: int) -> Case:
        return Case(self.model, nodes, self.fabric)

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
        """``Case`` from its id (``qwen2-tiny-n2-eth``); ValueError when it is not one."""
        match = _CASE_ID.match(case_id)
        if not match:
            raise ValueError(f"{case_id!r} is not a case id (MODEL-nNODES-FABRIC)")
        return cls(match["model"], int(match["nodes"]), match["fabric"])
