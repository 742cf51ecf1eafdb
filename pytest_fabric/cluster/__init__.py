"""How ranks get started: one module per launcher over one shared supervisor."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from .base import Cluster, ClusterUnavailable, LaunchRequest
from .supervisor import LaunchOutcome


@dataclass(frozen=True)
class ClusterOptions:
    """What a cluster may need from the command line."""

    hostfile: str | None = None
    ssh_config: str | None = None
    ssh_host_key_checking: str = "accept-new"
    srun_args: tuple[str, ...] = ()  # slurm: a site's srun options for the step that runs ranks (pyxis)
    launch_prefix: tuple[str, ...] = ()  # ssh, slurm: words before each node's rank command (a container)
    rank_env: tuple[str, ...] = ()  # ssh, slurm: variables every rank gets by name (LD_LIBRARY_PATH)


# name -> how to build it (ReFrame's launcher registry); each factory imports its launcher module
# on first use, so a session never imports the launchers it does not use.
_REGISTRY: dict[str, Callable[[ClusterOptions], Cluster]] = {}


def register_cluster(name: str, factory: Callable[[ClusterOptions], Cluster]) -> None:
    """Make ``--cluster NAME`` build its cluster with ``factory`` (a plugin adds a launcher here)."""
    if name == "auto" or not name.isidentifier():
        raise ValueError(f"a cluster name must be a plain word other than 'auto', got {name!r}")
    _REGISTRY[name] = factory


def _emulated(_: ClusterOptions) -> Cluster:
    from .emulated import EmulatedCluster

    return EmulatedCluster()


def _local(_: ClusterOptions) -> Cluster:
    from .local import LocalCluster

    return LocalCluster()


def _slurm(o: ClusterOptions) -> Cluster:
    from .slurm import SlurmCluster

    return SlurmCluster(srun_args=o.srun_args, launch_prefix=o.launch_prefix, rank_env_names=o.rank_env)


def _ssh(o: ClusterOptions) -> Cluster:
    if not o.hostfile:
        raise ClusterUnavailable("the ssh cluster needs --hostfile FILE (one host per line)")
    from .ssh import SshCluster

    return SshCluster(o.hostfile, ssh_config=o.ssh_config, strict_host_key_checking=o.ssh_host_key_checking,
                      launch_prefix=o.launch_prefix, rank_env_names=o.rank_env)


register_cluster("emulated", _emulated)
register_cluster("local", _local)
register_cluster("slurm", _slurm)
register_cluster("ssh", _ssh)


def cluster_kinds() -> tuple[str, ...]:
    """``auto`` and every registered cluster name."""
    return ("auto", *_REGISTRY)


CLUSTER_KINDS = cluster_kinds()


def local_fallback(exc: Exception) -> tuple[Cluster, str]:
    """Where ``auto`` cannot make the emulated cluster (no root, no iproute2): local processes, and
    the note that says why (the header, skip reasons and the exit status repeat it)."""
    return _local(ClusterOptions()), f"emulated cluster unavailable ({exc}); using local processes without link shaping"


# Options the shipped launchers that do not read them refuse: ranks started outside the container a
# user asked for would be measured as if inside it. A registered launcher reads what it needs.
_NOT_READ = {"emulated": ("srun_args", "launch_prefix"), "local": ("srun_args", "launch_prefix"),
             "ssh": ("srun_args",)}
_READ_BY = {"srun_args": "the slurm cluster's srun step", "launch_prefix": "the ssh and slurm clusters"}


def _refuse_unread(kind: str, options: ClusterOptions) -> None:
    for field in _NOT_READ.get(kind, ()):
        if getattr(options, field):
            flag = "--" + field.replace("_", "-")
            raise ClusterUnavailable(f"{flag} is for {_READ_BY[field]}; the {kind} cluster would start its ranks "
                                     f"without it: leave {flag} out (or give {flag}= over an ini value)")


def make_cluster(kind: str, options: ClusterOptions = ClusterOptions()) -> tuple[Cluster, str | None]:
    """The cluster for ``kind`` and, when ``auto`` had to fall back, why.

    ``auto``: Slurm inside an allocation, SSH with a hostfile, else the emulated cluster (local
    processes where namespaces cannot be made). Construction is cheap and side-effect free; a
    cluster's ``prepare()`` does the real work. Raises ClusterUnavailable when an explicitly
    requested cluster cannot run here, or would ignore a launch option it was given.
    """
    if kind == "auto":
        if os.environ.get("SLURM_JOB_ID") and os.environ.get("SLURM_JOB_NODELIST"):
            kind = "slurm"
        elif options.hostfile:
            kind = "ssh"
        else:
            _refuse_unread("emulated", options)
            try:
                return _emulated(options), None
            except ClusterUnavailable as exc:
                return local_fallback(exc)
    factory = _REGISTRY.get(kind)
    if factory is None:
        raise ValueError(f"unknown cluster {kind!r}; choose one of {', '.join(cluster_kinds())}")
    _refuse_unread(kind, options)
    return factory(options), None


__all__ = ["CLUSTER_KINDS", "Cluster", "ClusterOptions", "ClusterUnavailable", "LaunchOutcome", "LaunchRequest",
           "cluster_kinds", "local_fallback", "make_cluster", "register_cluster"]
