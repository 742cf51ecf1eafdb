"""Regression against last night: did a fabric silently degrade?

Runs only with --fabric-baseline (a saved run, its JUnit XML, or a `pytest-fabric baseline` file
built from several nights): each configuration fails when its interval lies wholly more than
--regression-threshold (default 10%) below the baseline's. A multi-node configuration is judged on
the time the fabric adds to its step (tonight's one-node launch taken out, the baseline's put in),
so a machine that computes faster or slower tonight is not read as a fabric change; one-node
configurations on their tokens/s (--regression-on chooses).
"""

import pytest


@pytest.mark.fabric_regression  # collected only with --fabric-baseline
@pytest.mark.fabric_matrix()
def test_no_regression_against_baseline(fabric_case, fabric_compare):
    fabric_compare.no_regression(fabric_case)
