"""Which node's link is slow: every pair of nodes measured alone, one test per node.

The collective suite runs over all nodes at once, where one node's link at half its rate lowers
every figure and names nobody. Here one launch per fabric measures each pair of the session's nodes
alone, one pair after the other (N(N-1)/2 pairs: 6 on 4 nodes, 28 on 8), with one all_reduce
payload sized from the link rate (about 0.2 s per iteration on a healthy link, a warm-up and three
timed iterations, the median), busbw by nccl-tests' formula as in ``test_bandwidth.py``. A pair is
slow below 85% of the per-node link rate (declared, the emulated link's shaped rate, the nodes'
sysfs; where none is known, the fastest pair); a node is slow when even its best pair is slow, so
a good node paired with a slow one passes through its other pairs (``deciding/slow_links.py``). With
two nodes a slow pair is named, and the message says the test cannot tell which node.
"""

import pytest

from pytest_fabric.deciding.gates import busbw
from pytest_fabric.deciding.slow_links import OK, all_nodes_line


def test_node_link(fabric_link_node, fabric_links):
    """One node's link: its best pair alone reaches 85% of the link rate."""
    node = fabric_link_node.node
    verdict = fabric_links(fabric_link_node.case, node)
    if node not in verdict.states:
        pytest.skip(f"{node} was not among the nodes the link test ran on ({', '.join(verdict.nodes)})")
    if verdict.states[node] != OK:
        pytest.fail(verdict.node_line(node), pytrace=False)


def test_all_nodes_against_pairs(fabric_links_case, fabric_links, fabric_measure):
    """The fabric's all-node all_reduce busbw, read against each pair alone: the slow nodes named."""
    verdict = fabric_links(fabric_links_case)
    case = fabric_links_case
    all_nodes = fabric_measure.bandwidth(case)  # the bandwidth suite's launch on the same nodes, shared
    ok, line = all_nodes_line(busbw(all_nodes).value, case.nodes, verdict)
    if not ok:
        pytest.fail(line, pytrace=False)
