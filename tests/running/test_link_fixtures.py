"""The link test (suites/test_links.py) through the plugin: nodes named as the cluster names them,
one test per node, and on the emulated cluster a node whose link the test bench shapes to half its
rate named by its own test, its pairs' numbers in the message, while the other nodes pass.

The fault is planted by the bench, not by an option of the harness: the run's conftest wraps the
emulated cluster's link set-up (``EmulatedNetwork._create``) and reshapes one node's link, both
ways (node to switch, switch to node), to half its rate after the harness shaped it.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from helpers import REPO, session_directory

from pytest_fabric.core.case import LINKS, Case
from pytest_fabric.measuring.measurement import LaunchRecord, LinksMeasurement
from pytest_fabric.running.link_fixtures import node_name
from pytest_fabric.workload.pair_types import LinksResult, PairRow
from pytest_fabric.workload.result import ResultFormatError

SUITE = (REPO / "suites" / "test_links.py").read_text()

# The bench's wiring: node SLOW's link reshaped to half the fabric's rate, both ways.
HALF_RATE_CONFTEST = """
import subprocess

from pytest_fabric.cluster import emulated

SLOW = {slow}
_create = emulated.EmulatedNetwork._create


def _half_rate(self):
    _create(self)
    if self.mbit and len(self.nodes) > SLOW:
        half = self.mbit / 2
        for netns, dev in ((self.nodes[SLOW].netns, emulated.IFNAME), (self.switch, f"n{{SLOW}}")):
            subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "change", "dev", dev, "root", "tbf",
                            "rate", f"{{half}}mbit", "burst", str(emulated.burst_bytes(half)), "latency", "50ms"],
                           check=True, capture_output=True)


emulated.EmulatedNetwork._create = _half_rate
"""


def test_a_rank_names_its_node_as_the_cluster_does():
    emulated = [f"node{i}" for i in range(4)]
    assert node_name("node2/198.18.0.3", emulated) == "node2"
    # ssh names hosts by address, its ranks' PYTEST_FABRIC_NODE is node<i>/<address>
    assert node_name("node1/10.0.0.7", ["10.0.0.5", "10.0.0.7"]) == "10.0.0.7"
    assert node_name("gpu-a17/10.1.2.3", ["gpu-a16", "gpu-a17"]) == "gpu-a17"  # Slurm: the host name
    assert node_name("somehost", emulated) == "somehost"  # no PYTEST_FABRIC_NODE: the host name


def _record(pairs: list[dict]) -> dict:
    result = LinksResult(world_size=3, nodes=["node0/a", "node1/b", "node2/c"],
                         pairs=[PairRow(**p) for p in pairs])
    return LaunchRecord(Case(LINKS, 3, "eth"), "emulated", result).to_dict()


def test_a_links_record_reads_back_as_the_store_keeps_it():
    row = {"op": "all_reduce", "bytes": 8, "time_s": 0.2, "algbw_GBps": 0.04, "busbw_GBps": 0.04, "a": "node0/a",
           "b": "node1/b", "ranks": 2, "times_s": [0.2, 0.2, 0.21]}
    stored = json.loads(json.dumps(_record([row])))
    m = LinksMeasurement.from_record(stored)
    assert m.case.id == "links-n3-eth" and m.pairs[0].busbw_gbit == pytest.approx(0.32)
    assert "1 pairs" in m.summary()
    with pytest.raises(ResultFormatError):
        LinksMeasurement.from_record(_record([{**row, "time_s": 0.0}]))
    stored["result"]["format"] = "pytest-fabric-collectives-result"
    with pytest.raises(ResultFormatError):
        LinksMeasurement.from_record(stored)


def test_one_test_per_node_and_fabric_is_collected(pytester):
    pytester.makepyfile(test_suite_links=SUITE)
    result = pytester.runpytest_inprocess("--collect-only", "-q", "--cluster", "local", "--nodes", "3",
                                          "--fabrics", "ib,eth")
    ids = [line for line in result.stdout.lines if "::" in line]
    suite = "test_suite_links.py"
    assert ids == [f"{suite}::test_node_link[{f}-node{i}]" for f in ("ib", "eth") for i in range(3)] + [
        f"{suite}::test_all_nodes_against_pairs[links-n3-{f}]" for f in ("ib", "eth")]


def test_one_node_has_no_link_to_test(pytester):
    pytester.makepyfile(test_suite_links=SUITE)
    result = pytester.runpytest_inprocess("--cluster", "local", "--nodes", "1")
    result.assert_outcomes(skipped=2)  # pytest's empty parameter set: nothing launched


def _run(pytester, monkeypatch, slow: int | None, nodes: int, *args: str) -> tuple[pytest.RunResult, str, float]:
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    pytester.makepyfile(test_suite_links=SUITE)
    if slow is not None:
        pytester.makeconftest(HALF_RATE_CONFTEST.format(slow=slow))
    started = time.monotonic()
    result = pytester.runpytest_subprocess("--cluster", "emulated", "--nodes", str(nodes), "--fabrics", "eth",
                                           "--launch-timeout", "180", f"--run-dir={tmp}", "-rA",
                                           f"--junitxml={pytester.path / 'junit.xml'}", *args, timeout=400)
    return result, result.stdout.str(), time.monotonic() - started


def _pairs(output: str) -> dict[str, float]:
    """The pairs' busbw as the all-node test's output prints them (``node0-node1: busbw 0.381 Gbit/s ...``)."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(node\d-node\d): busbw ([\d.]+) Gbit/s", output,
                                                                re.M)}


def _node_pairs(output: str) -> dict[str, float]:
    """The pairs' busbw as each node's test prints its own (``pairs of node0 (busbw Gbit/s): node1 0.381, ...``)."""
    found = {}
    for m in re.finditer(r"pairs of (node\d) \(busbw Gbit/s\): ((?:node\d [\d.]+(?:, )?)+)", output):
        for other, value in re.findall(r"(node\d) ([\d.]+)", m.group(2)):
            found["-".join(sorted((m.group(1), other)))] = float(value)
    return found


@pytest.mark.slow
@pytest.mark.usefixtures("needs_emulated")
def test_a_node_at_half_rate_is_named_on_four_nodes(pytester, monkeypatch):
    result, output, took = _run(pytester, monkeypatch, 2, 4)
    print(f"4-node planted-fault run: {took:.0f} s")
    result.assert_outcomes(passed=3, failed=2)
    for node in ("node0", "node1", "node3"):
        assert re.search(rf"PASSED test_suite_links.py::test_node_link\[eth-{node}\]", output), output
    # node2's own test fails naming it, with its numbers against the link rate.
    failed = re.search(r"FAILED test_suite_links.py::test_node_link\[eth-node2\]", output)
    assert failed, output
    line = re.search(r"node2 slow: node2's best pair \((?:node\d-node2|node2-node\d)\) ([\d.]+) Gbit/s busbw = "
                     r"(\d+)% of 0.4 Gbit/s \(the emulated cluster's shaped link\), below 85%; pairs of node2 "
                     r"\(busbw Gbit/s\): "
                     r"node0 [\d.]+, node1 [\d.]+, node3 [\d.]+; pairs without node2: ([\d.]+)-([\d.]+) Gbit/s", output)
    assert line, output
    assert 40 <= int(line.group(2)) <= 60  # half the rate, as planted
    assert float(line.group(3)) >= 0.85 * 0.4  # the pairs without node2 reach the rate
    # The all-node figure, read against the pairs, names node2.
    assert re.search(r"FAILED test_suite_links.py::test_all_nodes_against_pairs\[links-n4-eth\]", output), output
    assert re.search(r"all-node all_reduce busbw [\d.]+ Gbit/s on 4 nodes = \d+% of 0.4 Gbit/s; pairs alone: "
                     r"slow node\(s\): node2 ", output), output
    pairs = _pairs(output)
    print("pairs (busbw Gbit/s):", pairs)
    assert len(pairs) == 6 and _node_pairs(output) == pairs  # each node's test shows its own pairs
    assert all((v < 0.85 * 0.4) == ("node2" in k) for k, v in pairs.items()), pairs
    # One launch of the pairs for the five tests.
    directory = session_directory(output)
    assert len(json.loads((directory / "links" / "measurements.json").read_text())) == 1
    # JUnit as dashboards read it: the failure's message names the node, its output carries its pairs.
    from lxml import etree

    cases = {c.get("name"): c for c in etree.parse(str(pytester.path / "junit.xml")).iter("testcase")}
    node2 = cases["test_node_link[eth-node2]"]
    assert "node2 slow: node2's best pair" in node2.find("failure").get("message")
    assert "pairs of node2 (busbw Gbit/s): node0 " in node2.findtext("system-out")
    assert cases["test_node_link[eth-node0]"].find("failure") is None


@pytest.mark.slow
@pytest.mark.usefixtures("needs_emulated")
def test_healthy_links_pass_on_three_nodes(pytester, monkeypatch):
    # Under xdist (two workers), as the bandwidth launches are: one launch of the pairs serves both.
    result, output, took = _run(pytester, monkeypatch, None, 3, "-k", "test_node_link", "-n", "2")
    print(f"3-node run without a fault (-n 2): {took:.0f} s")
    result.assert_outcomes(passed=3)
    pairs = _node_pairs(output)
    assert sorted(pairs) == ["node0-node1", "node0-node2", "node1-node2"]
    assert all(v >= 0.85 * 0.4 for v in pairs.values()), pairs
    # The run directory (--run-dir) holds the session's: one record, one launch. (The summary names the
    # directory only where the night's store holds launches, and this run made none there.)
    (store,) = (pytester.path / "tmp").glob("*/links/measurements.json")
    assert len(json.loads(store.read_text())) == 1
    assert len(list((pytester.path / "tmp").glob("*/launches/links-n3-eth-*"))) == 1


@pytest.mark.slow
@pytest.mark.usefixtures("needs_emulated")
def test_two_nodes_name_the_pair_and_cannot_tell_which(pytester, monkeypatch):
    result, output, took = _run(pytester, monkeypatch, 1, 2, "-k", "test_node_link")
    print(f"2-node planted-fault run: {took:.0f} s")
    result.assert_outcomes(failed=2, deselected=1)
    for node in ("node0", "node1"):
        assert re.search(rf"{node} undecided: the pair node0-node1 is slow \(([\d.]+) Gbit/s busbw = (\d+)%, below "
                         r"85% of 0.4 Gbit/s \(the emulated cluster's shaped link\)\), and with two nodes the test "
                         r"cannot tell which node's link it is", output), output
    (busbw,) = _node_pairs(output).values()
    assert 0.4 * 0.4 <= busbw <= 0.6 * 0.4  # half the rate, as planted on node1


def test_the_pairs_deadline_grows_with_the_pairs():
    from pytest_fabric.measuring.pair_measure import PAIR_ALLOWANCE_S, pairs_deadline_s

    assert pairs_deadline_s(300, 2) == 300 + PAIR_ALLOWANCE_S
    assert pairs_deadline_s(300, 8) == 300 + 28 * PAIR_ALLOWANCE_S

