"""Pre-flight checks on recorded sysfs trees (fixtures/sysfs: no HCA exists on this machine)."""

from pathlib import Path

import pytest

from pytest_fabric.fabrics import build_table
from pytest_fabric.preflight import check

SYSFS = Path(__file__).resolve().parent.parent / "fixtures" / "sysfs"
FABRICS = build_table()


@pytest.mark.parametrize(
    ("fabric", "node", "ok"),
    [
        ("ib", "ib_node", True),
        ("ib", "roce_node", False),  # an Ethernet link layer is RoCE, not InfiniBand
        ("ib", "plain_node", False),
        ("roce", "roce_node", True),
        ("roce", "ib_node", False),
        ("efa", "efa_node", True),
        ("efa", "ib_node", False),
        ("eth", "plain_node", True),
        ("eth", "roce_node", False),  # the preset's NCCL_SOCKET_IFNAME==eth0 does not exist there
    ],
)
def test_fabric_needs(fabric, node, ok):
    problems = check(FABRICS[fabric], 1, env={}, sysfs=SYSFS / node, gpus=1)
    assert (problems == []) == ok, problems


def test_missing_hca_message_names_what_was_found():
    [problem] = check(FABRICS["ib"], 1, env={}, sysfs=SYSFS / "roce_node", gpus=1)
    assert "InfiniBand" in problem and "mlx5_0:1 Ethernet 4: ACTIVE" in problem


def test_hca_selection_follows_nccl_ib_hca():
    # mlx5_1 exists but its port is DOWN: selecting only it must fail, selecting mlx5_0 passes.
    table = build_table(env_overrides=["ib.NCCL_IB_HCA==mlx5_1"])
    [problem] = check(table["ib"], 1, env={}, sysfs=SYSFS / "ib_node", gpus=1)
    assert "NCCL_IB_HCA==mlx5_1" in problem
    table = build_table(env_overrides=["ib.NCCL_IB_HCA==mlx5_0"])
    assert check(table["ib"], 1, env={}, sysfs=SYSFS / "ib_node", gpus=1) == []


def test_socket_interface_override_and_exclusion():
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME==ens5"])
    assert check(table["eth"], 1, env={}, sysfs=SYSFS / "roce_node", gpus=1) == []
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME=^lo,ens"])
    [problem] = check(table["eth"], 1, env={}, sysfs=SYSFS / "roce_node", gpus=1)
    assert "matches no interface" in problem and "ens5" in problem


def test_too_few_gpus_and_single_node_skips_network():
    problems = check(FABRICS["ib"], 8, env={}, sysfs=SYSFS / "plain_node", gpus=4)
    assert len(problems) == 2 and "4 GPU(s) visible, 8 needed" in problems[0]
    assert check(FABRICS["ib"], 4, env={}, sysfs=SYSFS / "plain_node", gpus=4, network=False) == []
