"""Parity: where the job is compute-bound, the cheaper fabric keeps up with InfiniBand.

Decided on repeated launches (--repeats, --max-repeats): passes when the confidence interval of
candidate/ib clears 0.95, fails when it lies wholly below, and is reported inconclusive otherwise
(--inconclusive). The allowed slowdown is 5% unless the --fabric-suite file sets `within`.
"""

import pytest
from workloads import COMPUTE_BOUND

from pytest_fabric import REFERENCE_FABRIC
from pytest_fabric.deciding.gates import DEFAULT_WITHIN


@pytest.mark.fabric_comparison(expect="within")
@pytest.mark.fabric_matrix(models=COMPUTE_BOUND, exclude_fabrics=[REFERENCE_FABRIC], min_nodes=2)
def test_candidate_keeps_up_with_the_reference(fabric_case, fabric_compare, fabric_references):
    fabric_compare.within(fabric_case, fabric_case.with_fabric(REFERENCE_FABRIC),
                          rel=fabric_references.within(fabric_case, default=DEFAULT_WITHIN))
