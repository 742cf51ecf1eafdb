"""How ranks get started: one module per launcher over one shared supervisor."""

from __future__ import annotations

from .base import Cluster, ClusterUnavailable, LaunchRequest
from .supervisor import LaunchOutcome

# Launchers by name; `auto` picks one (Slurm and SSH join this table).
CLUSTER_KINDS = ("auto", "emulated", "local")


def make_cluster(kind: str) -> tuple[Cluster, str | None]:
    """The cluster for ``kind`` and, when ``auto`` had to fall back, why.

    Raises ClusterUnavailable when an explicitly requested cluster cannot run here.
    """
    from .emulated import EmulatedCluster
    from .local import LocalCluster

    if kind == "emulated":
        return EmulatedCluster(), None
    if kind == "local":
        return LocalCluster(), None
    if kind == "auto":
        try:
            return EmulatedCluster(), None
        except ClusterUnavailable as exc:
            return LocalCluster(), f"emulated cluster unavailable ({exc}); using local processes without link shaping"
    raise ValueError(f"unknown cluster {kind!r}; choose one of {', '.join(CLUSTER_KINDS)}")


__all__ = ["CLUSTER_KINDS", "Cluster", "ClusterUnavailable", "LaunchOutcome", "LaunchRequest", "make_cluster"]
