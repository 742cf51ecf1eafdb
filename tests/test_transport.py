"""Proof of transport: parsing NCCL INFO logs (fixtures/nccl, written in NCCL's real line formats:
no HCA exists on this machine) and checking them against the requested fabric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_fabric.fabrics import build_table
from pytest_fabric.transport import (
    check_transport,
    fabric_kind,
    find_nccl_logs,
    nccl_debug_env,
    parse_nccl_logs,
    prove_transport,
)

NCCL = Path(__file__).resolve().parent.parent / "fixtures" / "nccl"
CASES = ("ib", "roce", "socket_fallback", "eth", "efa", "efa_tcp", "gdr_off")


def facts(case: str):
    return parse_nccl_logs(NCCL / case)


# -- the environment --------------------------------------------------------------------------------


def test_debug_env_writes_one_file_per_rank(tmp_path):
    env = nccl_debug_env(tmp_path)
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                   "NCCL_DEBUG_FILE": f"{tmp_path}/nccl.%h.%p"}


def test_fixtures_are_named_as_nccl_debug_file_names_them():
    for case in CASES:
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
        ("socket_fallback", "Socket", {}, False, None, "2.27.7+cuda12.9"),
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

PASSES = {"ib": "ib", "roce": "roce", "gdr_off": "ib", "eth": "eth", "efa": "efa", "socket_fallback": "eth"}


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


def test_gdr_off_is_a_fact_and_a_failure_only_when_required():
    f = facts("gdr_off")
    assert check_transport("ib", f) is None
    message = check_transport("ib", f, require_gdr=True)
    assert message.startswith("requested ib with GPUDirect RDMA; none of 8 network channels uses GDRDMA: "
                              "`Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0`")
    assert check_transport("ib", facts("ib"), require_gdr=True) is None
    assert check_transport("efa", facts("efa"), require_gdr=True) is None
    # Sockets never do GDR: requiring it there is not held against the eth fabric.
    assert check_transport("eth", facts("eth"), require_gdr=True) is None


def test_gdr_required_but_no_collective_ran_yet():
    init_only = "\n".join(
        line for line in (NCCL / "roce" / "nccl.r760-n07.71402").read_text().splitlines() if "via NET/" not in line)
    f = parse_nccl_logs([init_only])
    assert f.gdr is None and check_transport("roce", f) is None
    message = check_transport("roce", f, require_gdr=True)
    assert "no NCCL network channel line" in message and "warm-up collective" in message


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
