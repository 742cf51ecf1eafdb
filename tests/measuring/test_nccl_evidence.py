"""Proof of transport: parsing NCCL INFO logs (fixtures/nccl, written in NCCL's real line formats:
no HCA exists on this machine) and checking them against the requested fabric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_fabric.core.fabrics import build_table
from pytest_fabric.measuring.nccl_evidence import check_transport, fabric_kind, prove_transport
from pytest_fabric.measuring.nccl_logs import find_nccl_logs, nccl_debug_env, parse_nccl_logs
from pytest_fabric.measuring.nic_inventory import NicInventory

NCCL = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"
CASES = ("ib", "roce", "socket_fallback", "eth", "efa", "efa_tcp", "gdr_off")
BLIND_SPOTS = ("eth_ipoib", "eth_ifname_lost", "ib_missing_port", "ib_slow_port", "ib_slow_graph", "ib_merged",
               "ib_sharp", "roce_linklocal", "mnnvl", "efa_one_nic")


def facts(case: str):
    return parse_nccl_logs(NCCL / case)


# -- the environment --------------------------------------------------------------------------------


def test_debug_env_writes_one_file_per_rank(tmp_path):
    env = nccl_debug_env(tmp_path)
    # The subsystem list replaces NCCL's default: ENV (settings arrived) and BOOTSTRAP must be named.
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV,NET",
                   "NCCL_DEBUG_FILE": f"{tmp_path}/nccl.%h.%p"}
    assert nccl_debug_env(tmp_path, graph=True)["NCCL_DEBUG_SUBSYS"] == "INIT,BOOTSTRAP,ENV,NET,GRAPH"


def test_fixtures_are_named_as_nccl_debug_file_names_them():
    for case in CASES + BLIND_SPOTS:
        files = find_nccl_logs(NCCL / case)
        assert len(files) >= 2, case
        assert all(f.name.startswith("nccl.") and f.name.rsplit(".", 1)[1].isdigit() for f in files), files


# -- the parser on every fixture case ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "network", "layers", "gdr", "provider", "version"),
    [
        ("ib", "IB", {"mlx5_0:1": "IB", "mlx5_1:1": "IB"}, True, None, "2.21.5+cuda12.4"),
        ("roce", "IB", {"mlx5_0:1": "RoCE", "mlx5_1:1": "RoCE"}, True, None, "2.23.4+cuda12.6"),
        ("gdr_off", "IB", {"mlx5_0:1": "IB", "mlx5_1:1": "IB"}, False, None, "2.23.4+cuda12.6"),
        ("socket_fallback", "Socket", {}, False, None, "2.28.3+cuda12.9"),
        ("eth", "Socket", {}, False, None, "2.21.5+cuda12.4"),
        ("efa", "Libfabric", {}, True, "efa", "2.21.5+cuda12.4"),
        ("efa_tcp", "Libfabric", {}, False, "tcp", "2.27.7+cuda12.9"),
    ],
)
def test_parser_recognises_each_case(case, network, layers, gdr, provider, version):
    f = facts(case)
    assert f.network == network and list(f.networks) == [network]
    assert f.link_layers == layers
    assert f.gdr is gdr
    assert f.provider == provider
    assert f.nccl_version == version
    assert f.problems == []
    assert len(f.hosts) == 2 and f.sources >= 2
    # Every headline fact carries the exact log line behind it, prefix stripped.
    assert f.evidence["network"].line == f"Using network {network}"
    assert f.evidence["nccl_version"].line == f"NCCL version {version}"
    if layers:
        assert f.evidence["link_layer"].line.startswith("NET/IB : Using [0]mlx5_0:1/")
    if provider:
        assert f.evidence["provider"].line.startswith("NET/OFI Selected")
    if gdr:
        assert f.evidence["gdr"].line.endswith("/GDRDMA")
    else:
        assert "[send]" in f.evidence["gdr"].line or "[receive]" in f.evidence["gdr"].line
        assert "GDRDMA" not in f.evidence["gdr"].line


def test_fallback_lines_are_collected():
    f = facts("socket_fallback")
    assert [e.line for e in f.fallback] == ["NET/IB : No device found.", "Failed to initialize NET plugin IB"] * 2
    assert f.socket_interfaces == ["eth0:10.40.0.13<0>", "eth0:10.40.0.14<0>"]
    # Healthy runs carry no fallback evidence.
    for case in ("ib", "roce", "eth", "efa", "efa_tcp", "gdr_off"):
        assert facts(case).fallback == [], case


def test_evidence_says_where_the_line_is():
    ev = facts("socket_fallback").fallback[1]
    assert ev.source == "nccl.gpu-c03.112734:7"
    assert ev.host == "gpu-c03"
    assert str(ev) == "Failed to initialize NET plugin IB"


def test_channel_counts_show_how_much_uses_gdr():
    assert (facts("ib").net_channels, facts("ib").gdr_channels) == (32, 32)
    assert (facts("gdr_off").net_channels, facts("gdr_off").gdr_channels) == (8, 0)


def test_summary_is_json_ready_and_describe_is_one_line():
    f = facts("efa_tcp")
    record = json.loads(json.dumps(f.summary()))
    assert record["network"] == "Libfabric" and record["provider"] == "tcp" and record["gdr"] is False
    assert record["evidence"]["provider"].startswith("NET/OFI Selected provider is tcp")
    line = facts("socket_fallback").describe()
    assert "\n" not in line
    assert "network=Socket" in line and "fallback=`NET/IB : No device found.`" in line


# -- check_transport: the right fabric passes, every wrong one fails with its evidence ---------------

PASSES = {"ib": "ib", "roce": "roce", "eth": "eth", "efa": "efa", "socket_fallback": "eth"}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("fabric", ["ib", "roce", "eth", "efa"])
def test_only_the_fabric_that_ran_passes(case, fabric):
    message = check_transport(fabric, facts(case))
    if PASSES.get(case) == fabric:
        assert message is None
    else:
        assert message and message.startswith(f"requested {fabric}; "), message
        assert "`" in message  # quotes a log line


def test_silent_socket_fallback_names_the_failed_plugin():
    message = check_transport("ib", facts("socket_fallback"))
    assert message.startswith("requested ib; NCCL used Socket: `Failed to initialize NET plugin IB`")
    assert "nccl.gpu-c03.112734:7" in message
    assert "`NET/IB : No device found.`" in message and "`Using network Socket`" in message


def test_ib_over_roce_is_not_ib():
    message = check_transport("ib", facts("roce"))
    assert message.startswith("requested ib; NCCL used IB verbs over RoCE on mlx5_0:1, mlx5_1:1, not IB: ")
    assert "`NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB ens1f0np0:192.168.50.17<0>`" in message
    assert check_transport("roce", facts("ib")).startswith("requested roce; NCCL used IB verbs over IB on ")


def test_efa_over_tcp_provider_fails():
    message = check_transport("efa", facts("efa_tcp"))
    assert message.startswith("requested efa; libfabric picked tcp, not efa: "
                              "`NET/OFI Selected provider is tcp, fabric is 10.50.0.0/24 (found 1 nics)`")


def test_eth_requested_but_rdma_used():
    assert check_transport("eth", facts("ib")).startswith("requested eth; NCCL used IB: `Using network IB`")


def test_efa_without_the_plugin_quotes_the_plugin_line():
    message = check_transport("efa", facts("eth"))
    assert message.startswith("requested efa; NCCL used Socket: `NET/Plugin: No plugin found (libnccl-net.so)`")


def test_gdr_off_fails_by_default_quoting_why():
    f = facts("gdr_off")
    message = check_transport("ib", f)
    assert message.startswith("requested ib; GPUDirect RDMA is off: none of 8 network channels uses GDRDMA: "
                              "`NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'`")
    assert "`Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0`" in message
    assert check_transport("ib", f, require_gdr=False) is None
    assert check_transport("ib", facts("ib"), require_gdr=True) is None
    assert check_transport("efa", facts("efa"), require_gdr=True) is None
    # Sockets never do GDR: requiring it there is not held against the eth fabric.
    assert check_transport("eth", facts("eth"), require_gdr=True) is None


def test_a_multi_node_job_needs_a_channel_via_net():
    init_only = "\n".join(
        line for line in (NCCL / "roce" / "nccl.r760-n07.71402").read_text().splitlines() if "via NET/" not in line)
    f = parse_nccl_logs([init_only])
    assert f.gdr is None and f.nnodes == 2
    message = check_transport("roce", f, require_gdr=False)
    assert message.startswith("requested roce; the job crosses nodes (2 nodes) but no channel goes `via NET/`")
    assert "warm-up collective" in message


# -- missing, single-node, user-defined --------------------------------------------------------------


def test_no_using_network_line_is_a_failure():
    f = parse_nccl_logs(["host:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"])
    assert f.network is None and f.nccl_lines == 1
    message = check_transport("ib", f)
    assert message.startswith("requested ib; no `Using network` line in 1 NCCL log source(s) (1 NCCL lines)")
    assert "NCCL_DEBUG=INFO" in message and "crosses_fabric=False" in message


def test_single_node_has_nothing_to_prove():
    empty = parse_nccl_logs([])
    assert check_transport("ib", empty, crosses_fabric=False) is None
    assert check_transport("ib", empty).startswith("requested ib; no NCCL log files were found")


def test_empty_directory_says_so(tmp_path):
    f = parse_nccl_logs(tmp_path)
    assert f.sources == 0 and f.problems == [f"no nccl.* files in {tmp_path}"]
    message = check_transport("eth", f)
    assert "no NCCL log files were found" in message and "no nccl.* files in" in message


@pytest.mark.parametrize(
    "source",
    [
        "",
        "garbage \x00\x01 not a log\nNCCL\nNCCL INFO\n[0] NCCL WARN\n",
        b"\xff\xfe\x00binary NCCL junk",
        "host:1:1 [0] NCCL INFO NET/IB : Using [0]broken ; OOB\nhost:1:1 [0] NCCL INFO via NET/\n",
        12345,
        None,
    ],
)
def test_malformed_input_gives_a_clear_result_not_a_traceback(source):
    f = parse_nccl_logs(source)
    assert f.network is None and f.link_layers == {} and f.gdr is None
    message = check_transport("ib", f)
    assert message.startswith("requested ib; no ")


def test_unreadable_file_is_a_problem_not_a_crash(tmp_path):
    f = parse_nccl_logs([tmp_path / "nccl.gone.1"])
    assert f.sources == 0 and f.problems and "cannot read" in f.problems[0]


def test_sources_mix_paths_dirs_and_texts():
    ib_file = find_nccl_logs(NCCL / "ib")[0]
    f = parse_nccl_logs([ib_file, str(NCCL / "eth"), "h:1:2 [0] NCCL INFO Using network IB\n"])
    assert f.sources == 4
    assert list(f.networks) == ["IB", "Socket"]
    assert "ranks report different networks: IB, Socket" in f.problems
    # Ranks that disagree fail whichever fabric was asked for.
    assert check_transport("ib", f).startswith("requested ib; NCCL used Socket")
    assert check_transport("eth", f).startswith("requested eth; NCCL used IB")


def test_user_defined_fabric_is_checked_as_its_base():
    table = build_table(defines=["roce-dc2: roce", "tcp-lab: eth"])
    assert fabric_kind("roce-dc2", table) == "roce"
    assert fabric_kind(table["tcp-lab"]) == "eth"
    assert check_transport("roce-dc2", facts("roce"), table=table) is None
    assert check_transport(table["roce-dc2"], facts("ib")).startswith("requested roce-dc2 (roce); NCCL used IB verbs")
    assert check_transport("nosuch", facts("ib")).startswith("requested nosuch: cannot tell")


def test_prove_transport_reads_a_log_directory():
    f, message = prove_transport("ib", NCCL / "socket_fallback")
    assert f.network == "Socket" and message.startswith("requested ib; NCCL used Socket")


# -- other real-world spellings ----------------------------------------------------------------------


def test_other_line_spellings():
    text = "\n".join([
        # older aws-ofi-nccl name, ring lines of old NCCL, mpirun output prefix
        "[1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Using network AWS Libfabric",
        "[1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0",
        "ip-172-32-38-1:21471:22316 [7] NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)",
    ])
    f = parse_nccl_logs([text])
    assert f.network == "Libfabric" and f.provider == "tcp" and f.gdr is False
    assert f.hosts == ["ip-172-32-38-1"]
    assert "libfabric picked tcp, not efa" in check_transport("efa", f)

    newer = "\n".join([
        "n1:5:6 [0] NCCL INFO NCCL version 2.28.3+cuda13.0",
        "n1:5:6 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1:0/IB [1]mlx5_1:1::2/RoCE [RO]; OOB eth0:10.0.0.1<0>",
        "n1:5:6 [0] NCCL INFO Using network IB",
        "n1:5:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0(1)/GDRDMA(PCI)/Shared",
        "n1:5:7 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1",
        "n1:5:7 [0] transport/net.cc:626 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<4242> with status=12",
    ])
    f = parse_nccl_logs([newer])
    assert f.link_layers == {"mlx5_0:1": "IB", "mlx5_1:1": "RoCE"}
    assert f.gdr is True and (f.net_channels, f.gdr_channels) == (2, 1)
    assert f.nccl_version == "2.28.3+cuda13.0"
    assert len(f.warnings) == 1 and f.fallback == []
    assert "not IB" in check_transport("ib", f) and "mlx5_1:1" in check_transport("ib", f)

    forced = "n1:5:6 [0] init.cc:626 NCCL WARN Error: network IB not found.\n"
    f = parse_nccl_logs([forced])
    assert [e.line for e in f.fallback] == ["Error: network IB not found."]
    assert "no `Using network` line" in check_transport("ib", f)


def test_rdma_claims_need_their_refining_line():
    # "Using network IB" alone cannot tell InfiniBand from RoCE; "Libfabric" alone cannot tell efa from tcp.
    ib_only = parse_nccl_logs(["n1:5:6 [0] NCCL INFO Using network IB\n"])
    assert "no `NET/IB : Using` line lists the HCA ports" in check_transport("ib", ib_only)
    ofi_only = parse_nccl_logs(["n1:5:6 [0] NCCL INFO Using network Libfabric\n"])
    assert "no `NET/OFI Selected Provider` line" in check_transport("efa", ofi_only)


# -- the blind spots: each fails for its own reason, quoting the line that proves it ----------------


def quoted(message: str, line: str) -> bool:
    return f"`{line}`" in message


def test_eth_over_ipoib_fails():
    message = check_transport("eth", facts("eth_ipoib"))
    assert message.startswith("requested eth; NCCL's sockets run over IPoIB interface ib0")
    assert quoted(message, "NET/Socket : Using [0]ib0:10.30.0.11<0> [1]eth0:10.20.0.11<0>")
    # Even a fabric that lets NCCL choose (no NCCL_SOCKET_IFNAME) never accepts ib*.
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME="])
    assert "IPoIB" in check_transport("eth", facts("eth_ipoib"), table=table)


def test_socket_ifname_that_never_arrived_fails():
    f = facts("eth_ifname_lost")
    message = check_transport("eth", f, env_logged=True)
    assert message.startswith("requested eth; NCCL_SOCKET_IFNAME==eth0 did not reach the ranks")
    assert quoted(message, "NET/Socket : Using [0]eno1:10.21.0.31<0>")
    # Without ENV logging the interface NCCL chose is still judged against the fabric's setting.
    assert "which NCCL_SOCKET_IFNAME==eth0 does not select" in check_transport("eth", f)
    # The healthy eth fixture shows the setting arriving.
    assert facts("eth").env["NCCL_SOCKET_IFNAME"][0] == "=eth0"
    assert check_transport("eth", facts("eth"), env_logged=True) is None


def test_the_ranks_got_another_socket_ifname():
    table = build_table(env_overrides=["eth.NCCL_SOCKET_IFNAME==ens5"])
    message = check_transport("eth", facts("eth"), table=table, env_logged=True)
    assert message.startswith("requested eth; the ranks got NCCL_SOCKET_IFNAME==eth0, the fabric sets =ens5")
    assert quoted(message, "NCCL_SOCKET_IFNAME set by environment to =eth0")


def test_missing_hca_port_fails_against_the_inventory():
    f = facts("ib_missing_port")
    message = check_transport("ib", f, inventory=NicInventory(nics=8))
    assert message.startswith("requested ib; NCCL used 1 HCA port(s) on gpu-g01, the node has 8 (ini fabric_inventory)")
    assert quoted(message, "NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.10.1.21<0>")
    assert check_transport("ib", f, inventory=NicInventory(nics=1, gbit_per_nic=400)) is None


def test_slow_port_fails_from_the_speed_line_of_nccl_2_27():
    f = facts("ib_slow_port")
    assert f.speeds["gpu-h01/mlx5_3:1"][0] == 200
    message = check_transport("ib", f, inventory=NicInventory(nics=8, gbit_per_nic=400))
    assert message.startswith("requested ib; port mlx5_3:1 on gpu-h01 runs at 200 Gbit/s, the node's NICs are 400")
    assert "speed=200000" in message and quoted(message, f.speeds["gpu-h01/mlx5_3:1"][1].line)
    assert check_transport("ib", f, inventory=NicInventory(nics=8, gbit_per_nic=200)) is None


def test_slow_port_fails_from_the_graph_dump_of_older_nccl():
    f = facts("ib_slow_graph")
    message = check_transport("ib", f, inventory=NicInventory(nics=2, gbit_per_nic=400))
    assert message.startswith("requested ib; port mlx5_1:1 on gpu-j01 runs at 200 Gbit/s")
    assert quoted(message, "+ NET[25.0] - NET/1 (a088c20300e8d4f8/1/25.000000)")
    # Speeds declared but not logged (NCCL < 2.27 without GRAPH): the proof is missing, not passed.
    message = check_transport("ib", facts("ib"), inventory=NicInventory(gbit_per_nic=400))
    assert "no port speed" in message and "GRAPH" in message


def test_merged_dual_port_nic_parses_and_a_genuine_ib_run_passes():
    f = facts("ib_merged")
    assert f.link_layers == {"mlx5_0:1": "IB", "mlx5_0:2": "IB"}
    assert f.host_devices["gpu-k01"] == [["mlx5_0:1", "mlx5_0:2"]]
    assert check_transport("ib", f) is None
    assert check_transport("ib", f, inventory=NicInventory(nics=2)) is None
    assert "NCCL used 2 HCA port(s)" in check_transport("ib", f, inventory=NicInventory(nics=4))


def test_gdr_can_be_turned_off_but_is_required_by_default():
    f = facts("gdr_off")
    assert "GPU Direct RDMA Disabled for HCA 0" in check_transport("ib", f)
    assert check_transport("ib", f, require_gdr=False) is None


def test_roce_on_a_link_local_gid_fails():
    message = check_transport("roce", facts("roce_linklocal"))
    assert message.startswith("requested roce; NCCL's RoCE queue pairs use link-local GID index 0 (fe80::)")
    assert "GID 0 (80FE/B3FE4A9B6E0248E0)`" in message
    v1 = parse_nccl_logs([(NCCL / "roce" / "nccl.r760-n07.71402").read_text()
                          + "r760-n07:71402:71402 [0] NCCL INFO NCCL_IB_ROCE_VERSION_NUM set by environment to 1.\n"])
    assert check_transport("roce", v1).startswith("requested roce; the ranks run RoCE v1")


def test_mnnvl_domain_never_touches_the_network():
    message = check_transport("ib", facts("mnnvl"))
    assert message.startswith("requested ib; no byte crossed the network")
    assert quoted(message, "MNNVL 1 cliqueId 7f00 cliqueSize 2 cliqueRank 0")


def test_efa_with_one_of_many_nics_fails():
    f = facts("efa_one_nic")
    assert check_transport("efa", f) is None  # without an inventory one NIC cannot be told from one of 32
    message = check_transport("efa", f, inventory=NicInventory(nics=32, source="sysfs of ip-10-70-0-41"))
    assert message.startswith("requested efa; aws-ofi-nccl found 1 of the 32 EFA NICs each node has")
    assert quoted(message, "NET/OFI Selected provider is efa, fabric is efa (found 1 nics)")


def test_collnet_sharp_is_recorded_not_judged():
    f = facts("ib_sharp")
    assert f.network == "IB" and check_transport("ib", f) is None
    assert f.summary()["collnet"] == "CollNet 00/0 : 0 [receive] via COLLNET/SHARP/0/GDRDMA"
    assert "collnet=`CollNet 00/0" in f.describe()
    assert facts("ib").summary()["collnet"] is None
