"""The launcher registry: `--cluster NAME` builds whatever was registered under NAME."""

from __future__ import annotations

import pytest

from pytest_fabric import cluster
from pytest_fabric.cluster import ClusterOptions, ClusterUnavailable, cluster_kinds, make_cluster, register_cluster
from pytest_fabric.cluster.local import LocalCluster


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(cluster, "_REGISTRY", dict(cluster._REGISTRY))
    return cluster._REGISTRY


def test_the_shipped_launchers_are_registered():
    assert cluster_kinds() == ("auto", "emulated", "local", "slurm", "ssh")
    assert isinstance(make_cluster("local")[0], LocalCluster)


def test_a_registered_launcher_is_built_with_the_sessions_options(registry):
    seen = []

    def factory(options: ClusterOptions):
        seen.append(options)
        return LocalCluster()

    register_cluster("lab", factory)
    assert "lab" in cluster_kinds()
    options = ClusterOptions("hosts.txt", launch_prefix=("apptainer", "exec", "x.sif"), rank_env=("HF_HOME",))
    built, note = make_cluster("lab", options)
    assert isinstance(built, LocalCluster) and note is None
    assert seen == [options]  # a registered launcher decides what it does with each option


@pytest.mark.parametrize(("kind", "options", "flag"), [
    ("ssh", ClusterOptions("hosts.txt", srun_args=("--container-image=pt.sqsh",)), "--srun-args"),
    ("local", ClusterOptions(launch_prefix=("apptainer", "exec", "pt.sif")), "--launch-prefix"),
    ("auto", ClusterOptions(launch_prefix=("apptainer", "exec", "pt.sif")), "--launch-prefix"),
])
def test_a_shipped_launcher_refuses_a_container_option_it_would_ignore(monkeypatch, kind, options, flag):
    """Ranks started outside the container asked for would be measured as if inside it."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ClusterUnavailable, match=f"^{flag} is for "):
        make_cluster(kind, options)


@pytest.mark.parametrize("name", ["auto", "two words", ""])
def test_a_launcher_name_must_be_a_plain_word_other_than_auto(registry, name):
    with pytest.raises(ValueError):
        register_cluster(name, lambda options: LocalCluster())


def test_ssh_without_a_hostfile_says_what_to_give():
    with pytest.raises(ClusterUnavailable, match="--hostfile"):
        make_cluster("ssh")


def test_auto_falls_back_to_local_processes_with_its_reason(registry, monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)

    def no_namespaces(options):
        raise ClusterUnavailable("no root")

    monkeypatch.setattr(cluster, "_emulated", no_namespaces)
    built, note = make_cluster("auto")
    assert isinstance(built, LocalCluster)
    assert note == "emulated cluster unavailable (no root); using local processes without link shaping"
