"""Fixtures for the project's own tests.

The plugin loads through its ``pytest11`` entry point, so every ``pytester`` run gets it. Runs that
launch real training go through ``runpytest_subprocess`` (a fresh interpreter, as a user's run);
option and collection checks run in-process, where they launch nothing.

The tests' temporary directories live on the emulated cluster's shared storage. Emulated nodes have
private ``/tmp``, ``/var/tmp`` and ``/dev/shm``, as real nodes do (``cluster/emulated.py``): a run
directory, a test site's configuration or a rank program under pytest's usual
``/tmp/pytest-of-<user>`` would be seen by the harness and by no node. So ``tmp_path`` (and the
pytester runs', which inherit the environment) are made under the user's cache directory, which
every emulated node sees, as a real cluster's nodes see an NFS home (not under the checkout: a
pytester run there would take the project's pyproject.toml for its own). ``PYTEST_DEBUG_TEMPROOT``
is pytest's documented root for them; a value already set wins.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import emulated_unavailable, junit_schema_path, namespaces, needs, owner_alive

pytest_plugins = ["pytester"]

SHARED_TMP = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pytest-fabric" / "test-tmp"
SHARED_TMP.mkdir(parents=True, exist_ok=True)
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(SHARED_TMP))


@pytest.fixture(autouse=True)
def no_namespace_left_behind():
    """Every test leaves the network namespaces as it found them.

    A namespace that appeared during the test and is still there afterwards is a leak, unless a
    live process other than this one owns it (another pytest-fabric run on the same machine).
    """
    before = namespaces()
    yield
    leaked = sorted(n for n in namespaces() - before if not owner_alive(n))
    assert not leaked, f"network namespaces left behind: {leaked}"


@pytest.fixture(scope="session")
def needs_emulated():
    """Tests that launch on the emulated cluster: skipped where namespaces cannot be made, failed
    under CI (``helpers.needs``). Session-scoped, so it runs before any module's launches."""
    needs(emulated_unavailable())


@pytest.fixture(scope="session")
def junit_schema():
    from lxml import etree

    return etree.XMLSchema(etree.parse(str(junit_schema_path())))


@pytest.fixture
def pytester(pytester, monkeypatch):
    """``pytester`` whose inner runs skip unrelated plugins that may be installed beside this one.

    Inner runs load every installed plugin; some cost seconds per run (hypothesis' terminal summary)
    and none of them is under test here. Blocking a plugin that is not installed is harmless.
    """
    monkeypatch.setenv("PYTEST_ADDOPTS", "-p no:hypothesispytest -p no:benchmark -p no:anyio")
    return pytester
