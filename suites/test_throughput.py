"""Throughput of every selected model x nodes x fabric: the summary table is built from these runs.

With a --fabric-suite file, each case is also held to its expected values ([[expect]] entries).
"""

import math

import pytest

from pytest_fabric.measuring.measurement import configuration_tokens_per_s


@pytest.mark.fabric_matrix()
def test_training_step(fabric_case, fabric_measure, fabric_session, fabric_references):
    # --throughput-launches N: N launches of each configuration (a baseline learns their spread).
    launches = [fabric_measure(fabric_case, launch=i) for i in range(fabric_session.options.throughput_launches)]
    for m in launches:
        # The job really spanned the nodes and ranks it was asked for, and trained (finite loss).
        assert len(m.result.hosts) == fabric_case.nodes, m.result.hosts
        assert m.gpus == fabric_case.nodes * fabric_session.options.settings.gpus_per_node
        assert m.result.final_loss is not None and math.isfinite(m.result.final_loss), m.result.final_loss
        assert m.tokens_per_s > 0
    misses = fabric_references.violations(fabric_case, {
        "tokens_per_s": configuration_tokens_per_s(launches),
        "tokens_per_s_per_gpu": configuration_tokens_per_s(launches, per_gpu=True),
        "median_step_s": launches[0].result.tokens_per_step / configuration_tokens_per_s(launches)})
    if misses:
        pytest.fail("\n".join(misses), pytrace=False)
