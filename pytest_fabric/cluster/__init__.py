"""How ranks get started: one module per launcher over one shared supervisor."""

from __future__ import annotations

import os

from .base import Cluster, ClusterUnavailable, LaunchRequest
from .supervisor import LaunchOutcome

CLUSTER_KINDS = ("auto", "emulated", "local", "slurm", "ssh")


def make_cluster(kind: str, hostfile: str | None = None, ssh_config: str | None = None,
                 ssh_host_key_checking: str = "accept-new") -> tuple[Cluster, str | None]:
    """The cluster for ``kind`` and, when ``auto`` had to fall back, why.

    ``auto``: Slurm inside an allocation, SSH with a hostfile, else the emulated cluster (local
    processes where namespaces cannot be made). Construction is cheap and side-effect free; a
    cluster's ``prepare()`` does the real work. Raises ClusterUnavailable when an explicitly
    requested cluster cannot run here.
    """
    from .emulated import EmulatedCluster
    from .local import LocalCluster

    if kind == "auto":
        if os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_JOB_NODELIST"):
            kind = "slurm"
        elif hostfile:
            kind = "ssh"
        else:
            try:
                return EmulatedCluster(), None
            except ClusterUnavailable as exc:
                return LocalCluster(), f"emulated cluster unavailable ({exc}); using local processes without link shaping"
    if kind == "emulated":
        return EmulatedCluster(), None
    if kind == "local":
        return LocalCluster(), None
    if kind == "slurm":
        from .slurm import SlurmCluster

        return SlurmCluster(), None
    if kind == "ssh":
        if not hostfile:
            raise ClusterUnavailable("the ssh cluster needs --hostfile FILE (one host per line)")
        from .ssh import SshCluster

        return SshCluster(hostfile, ssh_config=ssh_config, strict_host_key_checking=ssh_host_key_checking), None
    raise ValueError(f"unknown cluster {kind!r}; choose one of {', '.join(CLUSTER_KINDS)}")


__all__ = ["CLUSTER_KINDS", "Cluster", "ClusterUnavailable", "LaunchOutcome", "LaunchRequest", "make_cluster"]
