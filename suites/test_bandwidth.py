"""Collective bandwidth per fabric, nccl-tests semantics: busbw of the largest payload.

On the emulated cluster each link's rate is known exactly, so busbw must reach 85% of it: less means
the harness, not the link, is the bottleneck (or the link is not shaped as configured). On a real
cluster give the nominal per-node rate in the --fabric-suite file or skip that gate. The ratio gate
is the bandwidth counterpart of the advantage suite: the fast fabric must really be faster.
Whatever the test asserts, a payload that needed more than its link can carry (busbw above the rate,
with one rank per node on 2 nodes) fails it when measured: those bytes did not cross that link.
"""

import pytest

from pytest_fabric import REFERENCE_FABRIC
from pytest_fabric.deciding.gates import assert_ahead, assert_at_least, busbw

# gloo's all_gather and reduce_scatter are not bandwidth-optimal algorithms (reduce_scatter moves
# the whole buffer), so on CPU only all_reduce is held to the link rate; NCCL's are all optimal.
LINK_GATED_OPS = {"gloo": ["all_reduce"], "nccl": ["all_reduce", "all_gather", "reduce_scatter"]}


def test_busbw_reaches_the_link_rate(fabric_bandwidth_case, fabric_measure, fabric_cluster):
    if not fabric_cluster.realizes_fabrics:
        pytest.skip(f"the {fabric_cluster.name} cluster has no known link rate to compare with")
    bw = fabric_measure.bandwidth(fabric_bandwidth_case)
    link_gbit = bw.result.fabric["emulated_mbit"] / 1000
    for op in LINK_GATED_OPS[bw.result.backend]:
        assert_at_least(busbw(bw, op), 0.85 * link_gbit, f"{op} busbw >= 85% of the {link_gbit:g} Gbit/s link")


@pytest.mark.fabric_comparison
@pytest.mark.fabric_matrix(exclude_fabrics=[REFERENCE_FABRIC])  # the reference is not compared with itself
def test_reference_fabric_has_more_bandwidth(fabric_bandwidth_case, fabric_measure):
    reference = fabric_measure.bandwidth(fabric_bandwidth_case.with_fabric(REFERENCE_FABRIC))
    candidate = fabric_measure.bandwidth(fabric_bandwidth_case)
    assert_ahead(busbw(reference), busbw(candidate), by=0.20, unit="Gbit/s busbw")
