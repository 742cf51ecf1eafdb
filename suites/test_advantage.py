"""Advantage: where the job is communication-bound, InfiniBand must be clearly ahead.

This is the test that catches a degraded fast fabric (a bad cable, a driver update, NCCL silently
falling back to sockets): parity tests stay green when IB slows down to Ethernet's level; this fails.
Decided on repeated launches like the parity suite. The required lead is 20% unless the
--fabric-suite file sets `ahead`.
"""

import pytest
from workloads import COMMUNICATION_BOUND

from pytest_fabric import REFERENCE_FABRIC
from pytest_fabric.deciding.gates import DEFAULT_AHEAD


@pytest.mark.fabric_comparison(expect="ahead")
@pytest.mark.fabric_matrix(models=COMMUNICATION_BOUND, exclude_fabrics=[REFERENCE_FABRIC], min_nodes=2)
def test_reference_shows_its_advantage(fabric_case, fabric_compare, fabric_references):
    fabric_compare.ahead(fabric_case.with_fabric(REFERENCE_FABRIC), fabric_case,
                         by=fabric_references.ahead(fabric_case, default=DEFAULT_AHEAD))
