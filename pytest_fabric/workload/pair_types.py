"""The link test's contract with its rank program (``workload/pairs.py``): a config in, a JSON result
out. Plain standard library: the harness imports this without importing torch.

Every pair of nodes is measured alone, one pair after the other: an all_reduce of one large
payload between the ranks of those two nodes (all of each node's ranks), nccl-tests semantics,
so that a pair's busbw is comparable with the per-node link rate, as the all-node figure is.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .result import RESULT_VERSION, CollectiveRow, LaunchFacts, ResultFormatError

LINKS_FORMAT = "pytest-fabric-links-result"

# One payload per pair where no link rate is known: the largest of the collectives' sweeps
# (config.PAYLOADS), where NCCL and gloo reach their bus bandwidth.
DEFAULT_PAYLOAD = {"nccl": 4 ** 15, "gloo": 4 ** 12}  # 1 GiB, 16 MiB
# A payload sized from the link rate takes about this long per iteration on a healthy link: long
# against the emulated link's 4 ms token bucket (at most 2% of it), short enough that N(N-1)/2 pairs
# of (warm-up + timed) iterations take seconds.
ITERATION_S = 0.2
MIN_PAYLOAD = 1 << 20
MAX_PAYLOAD = 1 << 30


def payload_for(link_gbit: float | None, ranks_per_pair: int = 2) -> int | None:
    """Bytes of the pairs' all_reduce on a link of ``link_gbit`` (None: unknown, the backend's
    default): about ``ITERATION_S`` on a healthy link (a 2-rank all_reduce moves its whole payload
    across each node's link once each way), between 1 MiB and 1 GiB, whole float32 elements that
    ``ranks_per_pair`` divides."""
    if not link_gbit:
        return None
    raw = int(link_gbit * 1e9 / 8 * ITERATION_S)
    unit = 4 * ranks_per_pair
    return max(MIN_PAYLOAD, min(MAX_PAYLOAD, raw)) // unit * unit


@dataclass
class LinksConfig:
    result_path: str
    # nccl-tests' bytes of the all_reduce each pair runs; None: DEFAULT_PAYLOAD of the rank's backend.
    payload_bytes: int | None = None
    iters: int = 3  # timed iterations per pair; the pair's time is their median
    warmup_iters: int = 1
    device: str = "auto"
    collective_timeout_s: float = 300.0
    fabric: dict[str, Any] = field(default_factory=dict)

    def payload(self, backend: str) -> int:
        return self.payload_bytes or DEFAULT_PAYLOAD[backend]

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> LinksConfig:
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class PairRow(CollectiveRow):
    """Two nodes measured alone: ``op`` (all_reduce) of ``bytes`` over their ``ranks``; ``time_s`` the
    median of the timed iterations (each the slowest rank's), ``times_s`` all of them."""

    a: str  # the nodes as their ranks name themselves (PYTEST_FABRIC_NODE, else the host name)
    b: str
    ranks: int
    times_s: list[float]


@dataclass
class LinksResult(LaunchFacts):
    """One link-test launch: every pair of its nodes, in order (node0-node1, node0-node2, ...)."""

    world_size: int
    nodes: list[str]  # each node once, in rank order, as its ranks name themselves
    pairs: list[PairRow]
    local_world_size: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    versions: dict[str, str | None] = field(default_factory=dict)
    fabric: dict[str, Any] = field(default_factory=dict)
    format: str = LINKS_FORMAT
    version: int = RESULT_VERSION

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "links result") -> LinksResult:
        if not isinstance(data, dict) or data.get("format") != LINKS_FORMAT:
            raise ResultFormatError(f"{where}: not a links result (format {LINKS_FORMAT!r})")
        if data.get("version") != RESULT_VERSION:
            raise ResultFormatError(f"{where}: result version {data.get('version')!r}, this pytest-fabric reads "
                                    f"{RESULT_VERSION}; run the link test again")
        names = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items() if k in names}
        pairs = data.get("pairs")
        if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
            raise ResultFormatError(f"{where}: pairs must be a list of objects")
        row_names = {f.name for f in dataclasses.fields(PairRow)}
        try:
            data["pairs"] = [PairRow(**{k: v for k, v in p.items() if k in row_names}) for p in pairs]
            result = cls(**data)
        except TypeError as exc:
            raise ResultFormatError(f"{where}: {exc}") from None
        if not all(r.time_s > 0 for r in result.pairs):
            raise ResultFormatError(f"{where}: every pair needs a positive time")
        return result
