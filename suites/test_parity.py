"""Parity: where the job is compute-bound, the cheaper fabric keeps up with InfiniBand.

The allowed slowdown is 5% unless the --fabric-suite file sets `within` for the case.
"""

import pytest
from workloads import CANDIDATES, COMPUTE_BOUND

from pytest_fabric import REFERENCE_FABRIC, assert_within


@pytest.mark.fabric_comparison
@pytest.mark.fabric_matrix(models=COMPUTE_BOUND, fabrics=CANDIDATES, min_nodes=2)
def test_within_5_percent_of_ib(fabric_case, fabric_measure, fabric_references):
    candidate = fabric_measure(fabric_case)
    reference = fabric_measure(fabric_case.with_fabric(REFERENCE_FABRIC))
    assert_within(candidate, reference, rel=fabric_references.within(fabric_case, default=0.05))
