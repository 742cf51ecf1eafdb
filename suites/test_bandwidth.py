"""Collective bandwidth per fabric, nccl-tests semantics: busbw of the largest payload.

Busbw must reach 85% of the fabric's per-node link rate (``fabric_link_rate``): on the emulated
cluster the exact shaped rate, where less means the harness, not the link, is the bottleneck (or the
link is not shaped as configured); on a real cluster the rate declared with --fabric-link-gbit, else
the one the nodes' NICs report in sysfs (the slowest node's), and never the emulated or a nominal
rate: without either the gate skips, saying how to declare it. The ratio gate is the bandwidth
counterpart of the advantage suite: the fast fabric must really be faster.
Whatever the test asserts, a payload that needed more than its link can carry (busbw above the rate,
with one rank per node on 2 nodes) fails it when measured: those bytes did not cross that link.
"""

import pytest

from pytest_fabric import REFERENCE_FABRIC
from pytest_fabric.deciding.gates import assert_ahead, assert_at_least, busbw

# gloo's all_gather and reduce_scatter are not bandwidth-optimal algorithms (reduce_scatter moves
# the whole buffer), so on CPU only all_reduce is held to the link rate; NCCL's are all optimal.
LINK_GATED_OPS = {"gloo": ["all_reduce"], "nccl": ["all_reduce", "all_gather", "reduce_scatter"]}


def test_busbw_reaches_the_link_rate(fabric_bandwidth_case, fabric_measure, fabric_link_rate):
    link = fabric_link_rate(fabric_bandwidth_case.fabric)  # before the launch: skips when none is known
    bw = fabric_measure.bandwidth(fabric_bandwidth_case)
    for op in LINK_GATED_OPS[bw.result.backend]:
        assert_at_least(busbw(bw, op), 0.85 * link.gbit, f"{op} busbw >= 85% of the link, {link}")


@pytest.mark.fabric_comparison
@pytest.mark.fabric_matrix(exclude_fabrics=[REFERENCE_FABRIC])  # the reference is not compared with itself
def test_reference_fabric_has_more_bandwidth(fabric_bandwidth_case, fabric_measure):
    reference = fabric_measure.bandwidth(fabric_bandwidth_case.with_fabric(REFERENCE_FABRIC))
    candidate = fabric_measure.bandwidth(fabric_bandwidth_case)
    assert_ahead(busbw(reference), busbw(candidate), by=0.20, unit="Gbit/s busbw")
