"""The physical floor on real launches of the emulated 2-node cluster.

A fabric declared slower than its link really is (``slowib``: ib's 2000 Mbit/s emulated link,
declared 0.2 Gbit/s) makes a real measured step, and real collective payloads, beat the declared
floor: the tests must fail with the floor's message, never pass. A comparison of plausible launches shows the floor next to the
measurement and the prediction, in the terminal and in JUnit.
"""

from __future__ import annotations

import pytest
from helpers import emulated_unavailable, session_directory
from lxml import etree

UNAVAILABLE = emulated_unavailable()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("needs_emulated"),
]

SUITE = """
import pytest

from pytest_fabric.core.case import BANDWIDTH, Case


@pytest.mark.fabric_comparison
@pytest.mark.fabric_matrix(models=["qwen2-tiny"], fabrics=["eth"], min_nodes=2)
def test_compare(fabric_case, fabric_compare):
    fabric_compare.within(fabric_case, fabric_case.with_fabric("ib"), rel=0.99)


@pytest.mark.fabric_matrix(models=["llama-wide"], fabrics=["slowib"], min_nodes=2)
def test_declared_too_slow(fabric_case, fabric_measure):
    fabric_measure(fabric_case)


def test_bandwidth_declared_too_slow(fabric_measure):
    fabric_measure.bandwidth(Case(BANDWIDTH, 2, "slowib"))
"""


@pytest.fixture(scope="module")
def _cache():
    return {}


@pytest.fixture
def run(_cache, pytester, monkeypatch):
    if not _cache:
        tmp = pytester.path / "tmp"
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))
        pytester.makepyfile(test_generated=SUITE)
        junit = pytester.path / "junit.xml"
        result = pytester.runpytest_subprocess(
            "--nodes", "2", "--fabrics", "ib,eth,slowib", "--models", "qwen2-tiny,llama-wide",
            "-o", "fabric_define=slowib: ib", "--fabric-link-gbit", "slowib=0.2",
            "--repeats", "1", "--max-repeats", "1", "--inconclusive", "warn", "--steps", "2", "--measure-seconds", "0",
            "--warmup-steps", "1", "--batch-size", "1", "--seq-len", "32", "--launch-timeout", "180",
            f"--junitxml={junit}", timeout=400)
        _cache["result"], _cache["junit"] = result, junit
    return _cache


def _testcase(junit, name: str) -> etree._Element:
    (case,) = [c for c in etree.parse(str(junit)).iter("testcase") if c.get("name").startswith(name)]
    return case


def test_a_step_faster_than_the_declared_link_fails_with_the_floor(run):
    result = run["result"]
    output = result.stdout.str()
    session_directory(output)  # the run got as far as its summary
    # The two impossible tests fail; the plausible comparison does not (under --inconclusive warn an
    # undecided one is reported "inconclusive", a decided one passes).
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 2, outcomes
    assert outcomes.get("passed", 0) + outcomes.get("inconclusive", 0) == 1, outcomes
    case = _testcase(run["junit"], "test_declared_too_slow")
    failure = case.find("failure")
    assert failure is not None, "a step faster than the declared link passed"
    message = failure.get("message")
    assert "faster than physically possible: slowib:" in message
    assert "per node across the fabric; slowib's link is 0.2 Gbit/s: this traffic did not cross slowib" in message
    # The rate the step needed is above the declared 0.2 (x1.1 tolerance) and below the real 2 Gbit/s link.
    needed = float(message.split("needs >= ")[1].split(" Gbit/s")[0])
    assert 0.22 < needed < 2.0


def test_a_collective_faster_than_the_declared_link_fails_naming_the_payloads(run):
    failure = _testcase(run["junit"], "test_bandwidth_declared_too_slow").find("failure")
    message = failure.get("message")
    # The message attribute is capped ("[truncated; full report in element text]") when many payloads
    # are flagged, how many depends on the run's speed: the sentence that closes it is in the full report.
    report = f"{message}\n{failure.text or ''}"
    assert "faster than physically possible: slowib: " in message
    assert "all_reduce at 16.8 MB needs >= " in report  # the largest payload, among others
    assert "slowib's link is 0.2 Gbit/s per node (+10% tolerance): these bytes did not cross slowib" in report


def test_a_comparison_shows_floor_next_to_measurement_and_prediction(run):
    case = _testcase(run["junit"], "test_compare")
    text = case.findtext("system-out")
    lines = text.splitlines()
    predicted = next(i for i, line in enumerate(lines) if line.startswith("predicted:"))
    floors = [line for line in lines if line.startswith("floor: ")]
    assert [f.split()[1] for f in floors] == ["eth", "ib"]
    assert lines.index(floors[0]) == predicted + 1
    # The emulated links' exact rates, and a real step that respects them.
    assert "over eth's 0.4 Gbit/s link" in floors[0] and "over ib's 2 Gbit/s link" in floors[1]
    assert all(f.endswith(": plausible") for f in floors)
