"""The model x nodes x sharding x fabric matrix a test is parametrized over."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..core.case import Case


def powers_of_two_up_to(n: int) -> list[int]:
    out, k = [], 1
    while k <= n:
        out.append(k)
        k *= 2
    return out


def expand(
    models: Sequence[str],
    max_nodes: int,
    fabrics: Sequence[str],
    nodes: Iterable[int] | None = None,
    min_nodes: int = 1,
    shardings: Sequence[str] = ("full",),
) -> list[Case]:
    """Cases in a fixed order (model, then nodes ascending, then sharding, then fabric) so ids match
    on every worker.

    ``nodes`` defaults to the powers of two up to ``max_nodes``; explicit node counts above
    ``max_nodes`` are dropped: the matrix never asks for more nodes than the cluster has. On one node
    every sharding is one layout (a single replica): it appears once, as full sharding.
    """
    node_counts = sorted({n for n in (nodes if nodes is not None else powers_of_two_up_to(max_nodes))
                          if min_nodes <= n <= max_nodes})
    return [Case(m, n, f, s) for m in models for n in node_counts for s in (shardings if n > 1 else ("full",))
            for f in fabrics]
