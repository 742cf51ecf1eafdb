"""The straggler rule on real launches: one rank made slower by the test is named, with its node.

Two emulated nodes of two ranks each. The test plants the fault itself: a ``sitecustomize`` on the
ranks' PYTHONPATH (``helpers.slow_rank_site``) makes global rank 3, on node1, spin 30% more CPU time
(of its main thread) before each optimizer step, as a throttled GPU or a shared core would slow a rank; the harness has no
option for it. The terminal, JUnit and the saved night must name that rank and node; the same launch
without the fault must name nobody.
"""

from __future__ import annotations

import pytest
from helpers import REPO, emulated_unavailable, slow_rank_site
from junitparser import JUnitXml

from pytest_fabric.history.night_files import load_results

UNAVAILABLE = emulated_unavailable()

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("needs_emulated")]

# The night's own measuring window and shape (benchmarks/stragglers.py measured these A/A and planted).
ARGS = ["-k", "qwen2-tiny and n2-ib", "--nodes", "2", "--gpus-per-node", "2", "--launch-timeout", "180"]
CASE = "qwen2-tiny-n2-ib"


def launch(pytester, monkeypatch, slow_rank: int | None):
    monkeypatch.setenv("TMPDIR", str(pytester.mkdir("tmp")))
    if slow_rank is not None:
        site = slow_rank_site(pytester.path / "site", slow_rank, extra=0.3)
        monkeypatch.setenv("PYTHONPATH", str(site))
    junit, saved = pytester.path / "junit.xml", pytester.path / "night.json"
    result = pytester.runpytest_subprocess(str(REPO / "suites" / "test_throughput.py"), *ARGS, f"--junitxml={junit}",
                                           f"--fabric-save={saved}", timeout=300)
    result.assert_outcomes(passed=1)
    props = {p.name: p.value for s in JUnitXml.fromfile(str(junit)) for p in s.properties()}
    return result.stdout.str(), props[f"fabric.{CASE}.stragglers"], load_results(saved).cases[CASE].stragglers


def test_a_rank_planted_slower_is_named_with_its_node(pytester, monkeypatch):
    out, junit, saved = launch(pytester, monkeypatch, slow_rank=3)
    (line,) = saved
    assert line.startswith("rank 3 on node1/") and "longer per step than the others" in line
    assert junit == line
    assert f"straggler in {CASE}: {line}" in out
    assert "stragglers: 1 of 1 configuration(s)" in out


def test_without_a_fault_nobody_is_named(pytester, monkeypatch):
    out, junit, saved = launch(pytester, monkeypatch, slow_rank=None)
    assert saved == [] and junit == "none"
    assert "stragglers: 0 of 1 configuration(s)" in out and "straggler in" not in out
