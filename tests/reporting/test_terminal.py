"""The terminal's tables: throughput per model x nodes x fabric, and collective bandwidth.

The testcase text and the JUnit additions are junit.py's, tested in test_junit.py. A launch is
``helpers.train_measurement``'s: one GPU per node unless a test says otherwise, so that tokens/s/GPU is
tokens/s over the nodes.
"""

from __future__ import annotations

import math

import pytest
from helpers import bandwidth_measurement, train_measurement

from pytest_fabric.measuring.measurement import configuration_tokens_per_s
from pytest_fabric.reporting.terminal import bandwidth_table, summary_tables


def test_summary_table_per_model_with_delta_against_ib():
    rows = summary_tables(
        [train_measurement("m", 1, "ib", 100.0), train_measurement("m", 1, "eth", 100.0, shared_with="ib"),
         train_measurement("m", 2, "ib", 200.0), train_measurement("m", 2, "eth", 150.0)],
        ["ib", "eth"])
    assert rows[0] == "m:"
    assert rows[1].split()[:13] == ["nodes", "GPUs", "ib", "tok/s", "eth", "tok/s", "eth", "vs", "ib",
                                    "ib", "tok/s/GPU", "eth", "tok/s/GPU"]
    two_nodes = rows[3].split()
    assert two_nodes[:7] == ["2", "2", "200.0", "150.0", "-25.0%", "100.0", "75.0"]
    # One node never crosses the fabric: no delta is claimed there.
    assert rows[2].split()[:5] == ["1", "1", "100.0", "100.0", "n/a"]


def test_summary_table_shows_the_configuration_value_over_repeated_launches_and_their_number():
    # The comparison gates launch a configuration several times: the table shows the value they
    # judged (the geometric mean of the launches), not the arithmetic mean.
    ib = [200.0, 220.0, 242.0]
    rows = summary_tables([train_measurement("m", 2, "ib", v, launch=i) for i, v in enumerate(ib)]
                          + [train_measurement("m", 2, "eth", 110.0)], ["ib", "eth"])
    value = 220.0  # geometric mean of 200, 220, 242 (220 / 1.1, 220, 220 x 1.1)
    assert math.exp(sum(map(math.log, ib)) / 3) == pytest.approx(value)
    assert sum(ib) / 3 != pytest.approx(value, abs=0.05)
    assert rows[2].split()[:8] == ["2", "2", "220.0", "(3)", "110.0", "-50.0%", "110.0", "55.0"]


def test_summary_table_leaves_a_disturbed_launch_out_and_names_it():
    ms = [train_measurement("m", 2, "ib", 200.0, launch=0),
          train_measurement("m", 2, "ib", 50.0, launch=1, disturbed=4),
          train_measurement("m", 2, "ib", 200.0, launch=2)]
    rows = summary_tables(ms, ["ib"])
    # Three launches were made, one of them disturbed as a whole: it is not counted, and the table
    # says so, with the value JUnit shows.
    value = configuration_tokens_per_s(ms)
    assert value == pytest.approx(200.0)
    assert rows[2].split()[:6] == ["2", "2", f"{value:.1f}", "(3,", "1", "disturbed)"]
    assert rows[-1].startswith("(n, k disturbed): n launches, k of them disturbed as a whole")


def test_summary_table_lists_models_separately_and_marks_missing_cells():
    rows = summary_tables([train_measurement("b", 2, "ib", 10.0), train_measurement("a", 2, "eth", 5.0)], ["ib", "eth"])
    assert [r for r in rows if r.endswith(":")] == ["a:", "b:"]
    a_row = rows[rows.index("a:") + 2].split()
    assert a_row[2] == "-" and a_row[3] == "5.0" and a_row[4] == "-"


def test_summary_table_per_gpu_uses_every_gpu():
    rows = summary_tables([train_measurement("m", 2, "ib", 800.0, gpus_per_node=4)], ["ib"])
    assert rows[2].split()[:4] == ["2", "8", "800.0", "100.0"]


def test_bandwidth_table_per_nodes_and_fabric_at_the_largest_payload():
    rows = bandwidth_table([bandwidth_measurement(2, "ib", 2.0), bandwidth_measurement(2, "eth", 0.4)])
    assert rows[0] == "collective bandwidth (Gbit/s, largest payload):"
    assert rows[1].split() == ["nodes", "fabric", "link", "Gbit/s", "all_gather", "busbw", "all_reduce", "busbw", "MiB"]
    # Sorted by nodes, then fabric; the emulated link rate beside the measured busbw.
    assert rows[2].split() == ["2", "eth", "0.4", "0.400", "0.400", "16"]
    assert rows[3].split() == ["2", "ib", "2", "2.000", "2.000", "16"]


def test_no_bandwidth_no_table():
    assert bandwidth_table([]) == []


def test_mfu_and_peak_memory_columns_on_the_recorded_gpu_result_and_na_on_cpu():
    """The H200 result (fixtures/gpu, recorded on hardware): its MFU at the configuration's value,
    under the named convention, and its peak memory; a CPU run keeps the columns with "n/a"."""
    from helpers import gpu_expected, gpu_measurement

    gpu = gpu_measurement("eth")
    cpu = train_measurement("qwen2.5-1.5b", 1, "ib", 1000.0)
    rows = summary_tables([gpu], ["eth"])
    header, row = rows[1].split(), rows[2].split()
    assert header[-5:] == ["eth", "MFU", "eth", "peak", "GiB"]
    expected_mfu, expected_gib = gpu_expected()
    assert row[-2] == f"{expected_mfu * 100:.1f}%" and float(row[-1]) == pytest.approx(expected_gib, abs=0.05)
    assert expected_gib == pytest.approx(90.0, abs=0.1)
    assert "head counted" in rows[-1]
    cpu_rows = summary_tables([cpu], ["ib"])
    assert cpu_rows[2].split()[-2] == "n/a"
