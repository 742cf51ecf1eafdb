"""The link rate busbw is held to: declared, the nodes' sysfs (fixtures/sysfs), or the emulated link's,
never an assumed one on a real cluster; and the payload sweep whose top is gated."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_fabric.core.fabrics import FABRICS, build_table
from pytest_fabric.measuring.link_rate import DECLARED, EMULATED, LinkRate, inventoried, link_rate, node_gbit
from pytest_fabric.measuring.measure import LaunchSettings
from pytest_fabric.measuring.preflight import NodeFacts, read_node
from pytest_fabric.running.fixtures import link_rate_or_skip
from pytest_fabric.running.session import FabricSession
from pytest_fabric.workload.config import CollectivesConfig

SYSFS = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs"


def node(tree: str, host: str | None = None, **env: str) -> NodeFacts:
    facts = read_node(SYSFS / tree, host=host or tree)
    facts.env = env
    return facts


def test_sysfs_speeds_and_states_are_read_and_a_down_link_has_no_speed():
    ndr = node("ndr8_node")
    assert ndr.ports["mlx5_0:1"].gbit == 400 and ndr.speeds["ib0"] == 400000
    eth = node("eth_node")
    assert eth.speeds == {"ens5": 100000, "ens6": 50000, "ib0": 200000}  # ens7 reads -1, lo fails
    assert eth.operstate["ens7"] == "down" and eth.operstate["ens5"] == "up"
    assert NodeFacts.from_dict(eth.to_dict()) == eth
    # A record written before these fields existed (an older probe) still reads.
    old = {k: v for k, v in eth.to_dict().items() if k not in ("speeds", "operstate")}
    assert NodeFacts.from_dict(old).speeds == {} and NodeFacts.from_dict(old).operstate == {}


def test_rdma_rate_counts_the_active_ports_nccl_would_use():
    assert node_gbit(FABRICS["ib"], node("ndr8_node")) == 3200  # 8 x NDR
    assert node_gbit(FABRICS["ib"], node("ib_node")) == 400  # mlx5_1 is DOWN: not counted
    assert node_gbit(FABRICS["ib"], node("ib8_node")) == 2600  # 6 x NDR + mlx5_3 at HDR; mlx5_6 DOWN
    assert node_gbit(FABRICS["roce"], node("roce_node")) == 100
    assert node_gbit(FABRICS["ib"], node("roce_node")) is None  # a RoCE port is not InfiniBand
    assert node_gbit(FABRICS["efa"], node("efa_node")) == 100


def test_nccl_ib_hca_selects_the_ports_counted():
    two = build_table(env_overrides=["ib.NCCL_IB_HCA==mlx5_0,mlx5_3"])["ib"]
    assert node_gbit(two, node("ib8_node")) == 600
    assert node_gbit(two, node("ndr8_node")) == 800
    # The node's own environment (exported in the job script) counts too, the fabric's on top.
    assert node_gbit(FABRICS["ib"], node("ib8_node", NCCL_IB_HCA="^mlx5_3")) == 2400
    assert node_gbit(FABRICS["ib"], node("ib_node", NCCL_IB_HCA="=mlx5_1")) is None  # only a DOWN port


def test_eth_rate_is_the_interfaces_nccl_socket_ifname_selects():
    facts = node("eth_node")
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME==ens5"])
    assert node_gbit(table["eth"], facts) == 100
    assert node_gbit(FABRICS["eth"], facts) is None  # the preset's =eth0: no such interface here
    prefix = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME=ens"])["eth"]
    assert node_gbit(prefix, facts) == 150  # ens5 + ens6; ens7 is down
    unset = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME="])["eth"]
    assert node_gbit(unset, facts) == 150  # not IPoIB's 200: that is the InfiniBand fabric
    assert node_gbit(FABRICS["eth"], node("eth_down_node")) is None
    # A driver that keeps the last speed of a link gone down: its state says it carries nothing.
    stale = NodeFacts("n1", {"eth0": 1}, speeds={"eth0": 25000}, operstate={"eth0": "down"})
    assert node_gbit(FABRICS["eth"], stale) is None


def test_the_slowest_node_sets_the_rate_and_an_unknown_node_leaves_none():
    nodes = [node("ndr8_node", "gpu-a01"), node("ib8_node", "gpu-g01"), node("ndr8_node", "gpu-a02")]
    assert inventoried(FABRICS["ib"], nodes) == LinkRate(2600, "sysfs of gpu-g01")
    assert inventoried(FABRICS["ib"], [*nodes, node("plain_node", "gpu-x")]) is None
    assert inventoried(FABRICS["ib"], []) is None


def test_declared_beats_inventory_and_the_emulated_rate_only_on_the_emulated_cluster():
    nodes = [node("ib8_node", "gpu-g01")]
    declared = build_table(link_gbit={"ib": 1600})["ib"]
    assert link_rate(declared, nodes, emulated=False) == LinkRate(1600, DECLARED)
    assert link_rate(declared, [], emulated=True) == LinkRate(1600, DECLARED)
    assert link_rate(FABRICS["ib"], nodes, emulated=False) == LinkRate(2600, "sysfs of gpu-g01")
    assert link_rate(FABRICS["ib"], [], emulated=False) is None  # never the emulated 2 Gbit/s
    # The emulated cluster's veth reports 10000 Mb/s; tc shapes it to the fabric's rate.
    veth = NodeFacts("node0", {"lo": 772, "eth0": 1}, speeds={"eth0": 10000}, operstate={"eth0": "up"})
    assert link_rate(FABRICS["eth"], [veth], emulated=True) == LinkRate(FABRICS["eth"].emulated_mbit / 1000, EMULATED)


class Session(SimpleNamespace):
    """The real session's link lookups on a stand-in cluster, fabrics and probed nodes."""

    link = FabricSession.link
    link_rate = FabricSession.link_rate

    def prepared_cluster(self):
        return self.cluster


def session(cluster: str, nodes=(), realizes: bool = True, **table) -> Session:
    options = SimpleNamespace(settings=LaunchSettings(fabric_table=build_table(**table)))
    return Session(options=options, cluster=SimpleNamespace(name=cluster, realizes_fabrics=realizes),
                   node_facts=list(nodes))


def test_the_gate_skips_on_a_real_cluster_without_a_rate_saying_how_to_declare_it():
    with pytest.raises(pytest.skip.Exception) as skipped:
        link_rate_or_skip(session("slurm"), "ib")
    assert "--fabric-link-gbit ib=3200" in str(skipped.value)
    with pytest.raises(pytest.skip.Exception):  # local processes: no ib link at all, declared or not
        link_rate_or_skip(session("local", realizes=False, link_gbit={"ib": 100}), "ib")
    probed = session("slurm", [node("ib8_node", "gpu-g01")])
    assert str(link_rate_or_skip(probed, "ib")) == "2600 Gbit/s (sysfs of gpu-g01)"
    assert link_rate_or_skip(session("emulated"), "ib") == LinkRate(FABRICS["ib"].emulated_mbit / 1000, EMULATED)


def test_the_floor_uses_the_nodes_rate_before_the_nominal_one():
    _, gbit, source = session("slurm", [node("ib8_node", "gpu-g01")]).link("ib")
    assert (gbit, source) == (2600, "sysfs of gpu-g01")
    _, gbit, source = session("slurm").link("ib")
    assert (gbit, source) == (FABRICS["ib"].nominal_gbit, "nominal")


def test_payload_sweep_tops_at_1_gib_on_nccl_and_16_mib_on_gloo(tmp_path):
    config = CollectivesConfig(result_path="unused")
    assert config.payloads("nccl")[0] == config.payloads("gloo")[0] == 4 << 10
    assert config.payloads("nccl")[-1] == 1 << 30 and config.payloads("gloo")[-1] == 16 << 20
    # The rank decides: the harness writes no sweep, and sizes it does write are kept.
    config.dump(tmp_path / "config.json")
    assert CollectivesConfig.load(tmp_path / "config.json").payloads("nccl")[-1] == 1 << 30
    assert CollectivesConfig(result_path="unused", sizes=[1 << 20]).payloads("nccl") == [1 << 20]


def test_the_rank_sweeps_its_backends_payloads(tmp_path, monkeypatch):
    """One gloo rank in this process: the sweep the rank runs is its backend's, up to 16 MiB on CPU."""
    from pytest_fabric.cluster.nodelock import free_port
    from pytest_fabric.workload import collectives

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port(host="127.0.0.1")), "RANK": "0",
                        "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    config = CollectivesConfig(result_path=str(tmp_path / "result.json"), ops=["all_reduce"], iters=1,
                               warmup_iters=0, min_timed_s=0, device="cpu")
    result = collectives.run(config)
    assert result.backend == "gloo" and [r.bytes for r in result.rows] == config.payloads("gloo")
