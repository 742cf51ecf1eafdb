"""The compile cache: where the harness points inductor's and Triton's caches, and what a rank counts."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from helpers import FAST_LAUNCH, REPO, session_directory

from pytest_fabric.workload.compile_cache import cache_counts, cache_env


def test_the_caches_go_under_the_shared_directory_unless_the_user_set_them():
    root = Path("/lustre/runs/compile-cache")
    assert cache_env(root, {}) == {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"),
                                   "TRITON_CACHE_DIR": str(root / "triton")}
    assert cache_env(root, {"TRITON_CACHE_DIR": "/home/me/triton"}) == {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
    assert cache_env(root, {"TORCHINDUCTOR_CACHE_DIR": "/lustre/me/inductor"}) == {"TRITON_CACHE_DIR": str(root / "triton")}


def test_torchs_own_default_in_the_environment_is_not_the_users_choice(monkeypatch):
    """Inductor writes <tmp>/torchinductor_<user> into os.environ once a process has compiled (its
    cache_dir()), and a harness started by such a process inherits it: that is no reason to leave the
    cache on each node's own /tmp."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache_dir()  # what a compile in this process does
    inherited = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    assert inherited and Path(inherited).parent == Path(tempfile.gettempdir())
    assert "TORCHINDUCTOR_CACHE_DIR" in cache_env(Path("/shared/cc"), {"TORCHINDUCTOR_CACHE_DIR": inherited})


def test_counts_are_read_from_torchs_counters(monkeypatch):
    import torch._dynamo.utils as utils

    monkeypatch.setattr(utils, "counters", {"inductor": {"fxgraph_cache_hit": 3, "fxgraph_cache_miss": 0},
                                            "aot_autograd": {"autograd_cache_hit": 2, "autograd_cache_miss": 1}})
    assert cache_counts() == {"fxgraph_hit": 3, "fxgraph_miss": 0, "autograd_hit": 2, "autograd_miss": 1}
    zero = {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 0, "autograd_cache_hit": 0, "autograd_cache_miss": 0}
    monkeypatch.setattr(utils, "counters", {"inductor": zero, "aot_autograd": zero})
    assert cache_counts() == {}  # nothing compiled


@pytest.mark.slow
@pytest.mark.usefixtures("needs_emulated")
def test_the_second_launch_of_a_compiled_configuration_takes_its_graphs_from_the_cache(pytester, monkeypatch):
    """Two launches of one compiled CPU configuration in a session, each on a fresh emulated node
    (its own /tmp, where torch would cache by default): the first compiles and fills the run
    directory's compile-cache, the second finds every graph there."""
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    result = pytester.runpytest_subprocess(
        str(REPO / "suites" / "test_throughput.py"), "-k", "qwen2-tiny and n1-ib", "--nodes", "1",
        "--compile", "--throughput-launches", "2", f"--run-dir={pytester.path / 'runs'}", *FAST_LAUNCH, timeout=900)
    result.assert_outcomes(passed=1)
    stored = json.loads((session_directory(result.stdout.str()) / "measurements.json").read_text())
    first, second = [r["result"] for r in sorted((r for r in stored.values() if "result" in r),
                                                  key=lambda r: r["started"])]
    assert first["compile"] and first["compile_cache"]["fxgraph_miss"] > 0
    assert second["compile_cache"]["fxgraph_hit"] > 0 and second["compile_cache"]["fxgraph_miss"] == 0
    assert any((pytester.path / "runs" / "compile-cache" / "inductor").iterdir())
