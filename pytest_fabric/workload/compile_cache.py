"""The compile cache every launch of a configuration shares, on the cluster's shared storage.

Each launch is new processes on every node, so without a shared cache every launch compiles every
block afresh (the H200 run: 28 blocks in every launch). Inductor already caches compiled graphs
(its FX-graph cache) and AOTAutograd's joint graphs by default in torch 2.13, but under ``/tmp``,
which is each node's own (on the emulated cluster a fresh tmpfs per launch): the next launch on
another node, or the same node after a reboot, compiles again. ``cache_env`` points both caches,
and Triton's kernels, into ``<run-dir>/compile-cache``, which every node sees and every night reuses;
a user's own setting of any of these wins (torch's own default, which importing torch writes into the
environment, is not one). Writers replace files atomically, so ranks sharing the
directory is safe (inductor's own design for a shared cache directory).

``cache_counts`` reads the hits and misses torch counted in this process, recorded with the
result: a launch whose graphs came from the cache shows hits and no misses.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CACHE_DIR = "compile-cache"


def cache_env(root: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that put inductor's and Triton's caches under ``root``, less those the user set."""
    environ = os.environ if environ is None else environ
    wanted = {"TORCHINDUCTOR_CACHE_DIR": str(Path(root) / "inductor"), "TRITON_CACHE_DIR": str(Path(root) / "triton")}
    return {name: value for name, value in wanted.items() if not _set_by_user(name, environ)}


def _set_by_user(name: str, environ: Mapping[str, str]) -> bool:
    """Whether ``name`` holds the user's choice. Importing torch (2.13) writes inductor's default,
    ``<tmp>/torchinductor_<user>``, into the environment, and every process started after inherits
    it: that value says nothing of the user's wish (and is node-local), so it does not count."""
    value = environ.get(name)
    if value is None:
        return False
    # Torch names it after the temp directory of the process that compiled, which need not be this
    # one's (TMPDIR differs): its name is what marks it.
    return not (name == "TORCHINDUCTOR_CACHE_DIR" and Path(value).name.startswith("torchinductor_"))


def cache_counts() -> dict[str, int]:
    """This process's compile-cache hits and misses so far (FX graphs, AOTAutograd); {} where torch
    has compiled nothing."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return {}
    counters = utils.counters
    counts = {"fxgraph_hit": counters["inductor"]["fxgraph_cache_hit"],
              "fxgraph_miss": counters["inductor"]["fxgraph_cache_miss"],
              "autograd_hit": counters["aot_autograd"]["autograd_cache_hit"],
              "autograd_miss": counters["aot_autograd"]["autograd_cache_miss"]}
    return {k: int(v) for k, v in counts.items()} if any(counts.values()) else {}
