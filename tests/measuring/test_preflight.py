"""Pre-flight checks on recorded sysfs trees (fixtures/sysfs: no HCA exists on this machine)."""

from pathlib import Path

import pytest
from helpers import needs

from pytest_fabric.core.fabrics import build_table
from pytest_fabric.measuring.preflight import check

SYSFS = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"
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


# -- the same facts the transport proof judges, learned before a launch -------------------------------

from pytest_fabric.measuring.preflight import NodeFacts, inventory, check_node, read_node  # noqa: E402
from pytest_fabric.measuring.nic_inventory import NicInventory  # noqa: E402


def test_read_node_knows_ipoib_rates_gids_and_gdr():
    ib = read_node(SYSFS / "ib_node", host="gpu-a01")
    assert ib.interfaces == {"eth0": 1, "ib0": 32, "lo": 772}
    assert ib.ports["mlx5_0:1"].gbit == 400 and ib.ports["mlx5_0:1"].active and not ib.ports["mlx5_1:1"].active
    assert ib.peermem and not ib.dmabuf
    roce = read_node(SYSFS / "roce_node")
    assert roce.ports["mlx5_0:1"].gids[3] == ("0000:0000:0000:0000:0000:ffff:c0a8:3211", "RoCE v2")
    assert roce.dmabuf and not roce.peermem
    # The facts travel as JSON from remote nodes unchanged.
    assert NodeFacts.from_dict(ib.to_dict()) == ib


def test_eth_left_to_nccl_on_an_ipoib_node_is_refused():
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME="])
    facts = read_node(SYSFS / "ib8_node", host="gpu-g01")
    [problem] = check_node(table["eth"], facts)
    assert problem.startswith("fabric eth: NCCL_SOCKET_IFNAME is unset, so NCCL prefers ib0 on gpu-g01, "
                              "an IPoIB interface (type 32)")
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME=ib"])
    assert "NCCL_SOCKET_IFNAME=ib selects ib0" in check_node(table["eth"], facts)[0]
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME==eno1"])
    assert check_node(table["eth"], facts) == []


def test_missing_and_slow_ports_against_the_declaration():
    facts = read_node(SYSFS / "ib8_node", host="gpu-g01")
    problems = check_node(FABRICS["ib"], facts, declared=NicInventory(8, 400))
    assert problems[0] == ("fabric ib: 7 usable InfiniBand port(s) on gpu-g01, ini fabric_inventory declares 8: "
                           "mlx5_6:1 1: DOWN")
    assert problems[1].endswith("port(s) slower than the declared 400 Gbit/s on gpu-g01: mlx5_3:1 200 Gb/sec "
                                "(ports/N/rate)")
    # From sysfs alone the node's inventory is what the transport proof compares NCCL's ports with.
    assert inventory(FABRICS["ib"], facts) == NicInventory(8, 400, source="sysfs of gpu-g01")
    assert inventory(FABRICS["eth"], facts) is None


def test_a_fabric_setting_that_never_reached_the_node():
    facts = read_node(SYSFS / "ib8_node", host="gpu-g01")
    env = {k: v for k, v in FABRICS["eth"].nccl_env.items() if k != "NCCL_SOCKET_IFNAME"}
    problems = check_node(FABRICS["eth"], facts, env)
    assert problems[0] == ("fabric eth: NCCL_SOCKET_IFNAME==eth0 did not reach the node on gpu-g01 (does the "
                           "launcher pass the fabric's environment to every rank?)")
    assert "NCCL prefers ib0" in problems[1]  # and what NCCL does without it


def test_gdr_needs_peer_memory_or_dmabuf():
    facts = read_node(SYSFS / "ib8_node", host="gpu-g01")
    [problem] = check_node(FABRICS["ib"], facts, require_gdr=True)
    assert "no GPUDirect RDMA on gpu-g01: nvidia_peermem is not loaded" in problem
    assert check_node(FABRICS["ib"], read_node(SYSFS / "ib_node"), require_gdr=True) == []
    assert check_node(FABRICS["roce"], read_node(SYSFS / "roce_node"), require_gdr=True) == []


def test_roce_gid_index_must_be_routable_v2():
    facts = read_node(SYSFS / "roce_node", host="r760-n07")
    assert check_node(FABRICS["roce"], facts) == []  # the preset's index 3 is RoCE v2, IPv4-mapped
    for index, why in (("0", "IB/RoCE v1 GID fe80:"), ("1", "RoCE v2 GID fe80:"), ("2", "IB/RoCE v1 GID 0000:")):
        [problem] = check_node(FABRICS["roce"], facts, {**FABRICS["roce"].nccl_env, "NCCL_IB_GID_INDEX": index})
        assert problem.startswith(f"fabric roce: NCCL_IB_GID_INDEX={index} is {why}"), problem


def _check_emulated(tmp_path, fabrics, device):
    """The session's node check (measuring/nodes.py) on two emulated nodes."""
    from pytest_fabric.cluster.base import ClusterUnavailable
    from pytest_fabric.cluster.emulated import EmulatedCluster
    from pytest_fabric.measuring.nodes import check_nodes

    try:
        cluster = EmulatedCluster()
        cluster.prepare()
    except ClusterUnavailable as exc:
        needs(str(exc))
    return check_nodes(cluster, ["node0", "node1"], tmp_path / "session", fabrics, 1, device)




def test_emulated_node_interfaces_are_real_ethernet(tmp_path):
    """The node check runs on every node through the launcher; on the emulated cluster each node's own
    sysfs shows the veth it has: Ethernet (type 1), no IPoIB, no RDMA port, and its own host name."""
    from pytest_fabric.cluster.emulated import IFNAME

    checks = _check_emulated(tmp_path, [FABRICS["eth"]], "cpu")
    assert [(c.name, c.hostname, c.ok) for c in checks] == [("node0", "node0", True), ("node1", "node1", True)]
    for node_check in checks:
        node = node_check.facts
        assert node.interfaces == {"lo": 772, IFNAME: 1} and node.ports == {} and node.operstate[IFNAME] == "up"
        # The probe starts like a rank, so it sees the settings the ranks get.
        assert node.env["GLOO_SOCKET_IFNAME"] == IFNAME
        assert check_node(FABRICS["eth"], node, {**FABRICS["eth"].nccl_env, "NCCL_SOCKET_IFNAME": f"={IFNAME}"}) == []
        assert "needs an ACTIVE InfiniBand port on node" in check_node(FABRICS["ib"], node)[0]


def test_gpu_nodes_without_the_fabric_or_the_gpus_are_left_out_before_any_launch(tmp_path):
    """On GPUs every node is held to each fabric and to --gpus-per-node before the first launch: the
    emulated nodes have no HCA and no GPU, so an ib GPU night leaves both out, saying why."""
    checks = _check_emulated(tmp_path, [FABRICS["ib"]], "cuda")
    for node_check in checks:
        assert not node_check.ok
        assert any("0 GPU(s) visible, 1 needed" in p for p in node_check.problems), node_check.problems
        assert any(f"fabric ib needs an ACTIVE InfiniBand port on {node_check.name}" in p
                   for p in node_check.problems)
