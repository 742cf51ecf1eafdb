"""The SSH launcher: hostfile parsing, quoting and environment rules, then real launches through real
sshd daemons, one per emulated node namespace (tests/cluster_env.py)."""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

from cluster_env import (RANK_ENV, env_program, failing_program, hanging_program, launch_on_node0, leftover_processes, prefix_records,
                         recording_prefix, session_program, ssh_site, start_on_node0, train_program,
                         two_sessions_take_turns)
from pytest_fabric.cluster.base import ClusterUnavailable, remote_env
from pytest_fabric.cluster.ssh import Host, HostfileError, SshCluster, parse_hostfile, remote_command


def test_hostfile_hosts_slots_and_comments() -> None:
    text = "# the cluster\n\ngpu-001 slots=8\nadmin@gpu-002.example.org   # spare\n  10.0.0.3 slots=4  \n"
    assert parse_hostfile(text) == [
        Host("gpu-001", "gpu-001", 8),
        Host("admin@gpu-002.example.org", "gpu-002.example.org", None),
        Host("10.0.0.3", "10.0.0.3", 4),
    ]


@pytest.mark.parametrize(("text", "message"), [
    ("node1\n-oProxyCommand=touch/tmp/x\n", "line 2: '-oProxyCommand=touch/tmp/x' is not a host name"),
    ("node1;reboot\n", "line 1: 'node1;reboot' is not a host name"),
    ("$(id)\n", "is not a host name"),
    ("node1 slots=x\n", "line 1: unexpected 'slots=x'"),
    ("node1 slots=0\n", "slots must be at least 1"),
    ("node1 slots=2 slots=3\n", "unexpected 'slots=3'"),
    ("node1 extra\n", "unexpected 'extra'"),
    ("node1\nroot@node1\n", "line 2: node1 is already listed on line 1"),
    ("# nothing\n\n", "lists no hosts"),
    ("fe80::1\n", "IPv6 literals are not supported"),
])
def test_malformed_hostfile_is_refused_with_the_line(text: str, message: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, "hosts.txt")
    assert message in str(info.value)
    assert "hosts.txt" in str(info.value)


def test_missing_hostfile_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterUnavailable, match="cannot read the hostfile"):
        SshCluster(tmp_path / "absent")


def test_remote_command_survives_a_real_shell_word_for_word(tmp_path: Path) -> None:
    """Every word reaches the program unchanged, whatever it contains; nothing is executed."""
    canary = tmp_path / "canary"
    hostile = [f"$(touch {canary})", f"`touch {canary}`", "a; touch " + str(canary), "it's \"quoted\"", "*", "\n"]
    env = {"NCCL_IB_HCA": "=mlx5_0,mlx5_1", "WEIRD": f"$(touch {canary})"}
    pidfile = tmp_path / "node0.pid"
    program = [sys.executable, "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['NCCL_IB_HCA'], "
               "os.environ['WEIRD'], open(os.environ['PIDFILE']).read().strip()]))", *hostile]
    command = remote_command(["env", f"PIDFILE={pidfile}", *program], env, str(pidfile))
    # ssh hands this string to the login shell exactly like this.
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    args, hca, weird, pid = json.loads(out)
    assert args == hostile and hca == "=mlx5_0,mlx5_1" and weird == f"$(touch {canary})"
    assert pid.isdigit()  # the wrapper recorded itself before running the program ...
    assert not pidfile.exists()  # ... and removed the record when it finished
    assert not canary.exists()
    assert shlex.split(command)[:2] == ["exec", "sh"]


def test_a_launch_prefix_runs_inside_the_pidfile_wrapper_and_the_variables_inside_the_prefix(tmp_path: Path) -> None:
    """The command ssh hands the login shell, run by a real shell: the prefix (a real wrapper program
    that drops LD_LIBRARY_PATH for its own, as a container image does) runs as a child of the pidfile
    wrapper, so the cleanup's process tree holds it; the variables are set inside it, so the program
    gets them whatever the prefix does to its environment."""
    prefix = tmp_path / "my container"
    prefix.write_text('#!/bin/sh\necho "prefix: $1 $PPID LD_LIBRARY_PATH=${LD_LIBRARY_PATH-}"\nshift\n'
                      'LD_LIBRARY_PATH=/image/lib exec "$@"\n')
    prefix.chmod(0o755)
    pidfile = tmp_path / "node0.pid"
    program = [sys.executable, "-c", "import os; print('program:', os.environ['LD_LIBRARY_PATH'], os.getppid())"]
    command = remote_command(program, {"LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib"}, str(pidfile),
                             [str(prefix), "--nv"])
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"}).stdout.splitlines()
    (said_prefix,) = [line for line in out if line.startswith("prefix: ")]
    (said_program,) = [line for line in out if line.startswith("program: ")]
    _, first_word, parent, library_path = said_prefix.split(" ")
    assert first_word == "--nv" and library_path == "LD_LIBRARY_PATH="  # its own words; not yet the variables
    assert said_program.split(" ")[1] == "/opt/aws-ofi-nccl/lib"
    # The prefix's parent is the wrapper (the sh that recorded its pid), and the prefix became the program.
    assert said_program.split(" ")[2] == parent


RECORDER = """import json, os, sys
json.dump({"argv": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("NCCL_HOSTILE", "NCCL_SOCKET_IFNAME",
                                                                        "MY_SETTING", "HF_TOKEN")}},
          open(os.environ["RECORD_TO"], "w"))
"""


def test_every_user_supplied_piece_of_a_launch_reaches_the_host_as_literal_data(tmp_path, monkeypatch) -> None:
    """The whole command SshCluster.launch builds (run dir, program and its config path, job id, fabric
    settings, the request's env) goes through a real shell as ssh's login shell would run it: every
    hostile value arrives word for word, and nothing in it runs."""
    from pytest_fabric.cluster import ssh as ssh_module
    from pytest_fabric.cluster.base import LaunchRequest
    from pytest_fabric.cluster.supervisor import LaunchOutcome, ProcOutcome
    from pytest_fabric.core.fabrics import get_fabric
    from dataclasses import replace

    monkeypatch.chdir(tmp_path)  # a hostile value that ran would make ./pwned
    canary = "pwned"
    hostile = [f"$(touch {canary})", f"`touch {canary}`", f"'; touch {canary}; '", f'"; touch {canary}; "',
               f"a\nb; touch {canary}", "*", "-rf"]
    workdir = tmp_path / f"run $(touch {canary}) '; touch {canary}; '"
    workdir.mkdir()
    recorder = tmp_path / "python-recorder"  # stands for the hosts' Python: records what it was given
    recorder.write_text(f"#!{sys.executable}\n{RECORDER}")
    recorder.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(recorder))
    monkeypatch.setenv("HF_TOKEN", "hf_never_sent_anywhere")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\n")
    captured = []

    def fake_supervise(specs, log_dir, deadline_s, on_tick=None, ask_stacks=None):
        captured.extend(specs)
        return LaunchOutcome([ProcOutcome(s.name, 0, log_dir / f"{s.name}.log") for s in specs], 0.0)

    monkeypatch.setattr(ssh_module, "supervise", fake_supervise)
    lock_commands = []

    class FakeLock:  # no host to hold: the lock holder's command is checked like the ranks'
        def port(self):
            return 23456

    @contextmanager
    def fake_holding(locks, wait_s, notify):
        lock_commands.extend(lock.argv[-1] for _, lock in locks)
        yield {key: FakeLock() for key, _ in locks}

    from pytest_fabric.cluster import base as base_module
    monkeypatch.setattr(base_module, "holding", fake_holding)
    fabric = replace(get_fabric("eth"), nccl_env={"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_HOSTILE": hostile[0]})
    request = LaunchRequest(nodes=1, procs_per_node=1, fabric=fabric,
                            program=["-m", "pytest_fabric.workload.train", "--config", str(workdir / "config.json"),
                                     *hostile],
                            workdir=workdir, deadline_s=30, job_id=f"job$(touch {canary})",
                            env={"MY_SETTING": hostile[2]})
    SshCluster(hostfile).launch(request)
    (spec,) = captured
    assert spec.argv[-3:-1] == ["--", "node1"], "the host comes after '--': never an ssh option"
    command = spec.argv[-1]
    record = tmp_path / "record.json"
    # ssh hands `command` to the login shell; here the shell runs on this machine instead.
    # The remote side's environment is its own: only what the command line sets reaches the program.
    subprocess.run(["sh", "-c", command], check=True, env={"PATH": "/usr/bin:/bin", "RECORD_TO": str(record)})
    got = json.loads(record.read_text())
    assert not (tmp_path / canary).exists(), "a value was executed by the shell"
    assert got["argv"][-len(hostile) - 2:] == ["--config", str(workdir / "config.json"), *hostile]
    assert f"--rdzv-id=job$(touch {canary})" in got["argv"]
    assert got["env"] == {"NCCL_HOSTILE": hostile[0], "NCCL_SOCKET_IFNAME": "=eth0", "MY_SETTING": hostile[2],
                          "HF_TOKEN": None}
    assert "hf_never_sent_anywhere" not in command
    assert "--rdzv-endpoint=node1:23456" in got["argv"]
    (lock_command,) = lock_commands
    subprocess.run(["sh", "-c", lock_command], check=True, env={"PATH": "/usr/bin:/bin", "RECORD_TO": str(record)})
    assert not (tmp_path / canary).exists(), "a value was executed by the shell"
    who = json.loads(record.read_text())["argv"]
    assert who[:4] == ["-m", "pytest_fabric.cluster.nodelock", "--key", "node1"]
    assert who[-1].endswith(f"job job$(touch {canary})")


def test_only_needed_variables_go_to_the_hosts_and_never_secrets() -> None:
    local = {"PATH": "/usr/bin", "HOME": "/root", "PYTHONPATH": "/src", "OMP_NUM_THREADS": "4",
             "NCCL_IB_HCA": "=mlx5_0", "NCCL_IB_PKEY": "0x8001", "GLOO_SOCKET_IFNAME": "ib0", "FI_PROVIDER": "efa",
             "HF_TOKEN": "hf_x", "AWS_SECRET_ACCESS_KEY": "s", "NCCL_API_KEY": "k", "SSH_AUTH_SOCK": "/tmp/agent",
             "MY_SETTING": "1", "MY_PASSWORD": "p"}
    forwarded = remote_env(local, explicit=["MY_SETTING", "MY_PASSWORD"])
    assert forwarded == {"PYTHONPATH": "/src", "OMP_NUM_THREADS": "4", "NCCL_IB_HCA": "=mlx5_0",
                         "NCCL_IB_PKEY": "0x8001", "GLOO_SOCKET_IFNAME": "ib0", "FI_PROVIDER": "efa",
                         "MY_SETTING": "1"}


def test_ssh_runs_in_batch_mode_and_ends_options_before_the_host(tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1\n")
    cluster = SshCluster(hostfile, strict_host_key_checking="yes", connect_timeout_s=7)
    argv = cluster.ssh_argv(cluster.hosts[0], "true")
    assert argv[-3:] == ["--", "node1", "true"]
    options = " ".join(argv)
    assert "BatchMode=yes" in options and "ConnectTimeout=7" in options and "StrictHostKeyChecking=yes" in options
    with pytest.raises(ClusterUnavailable, match="StrictHostKeyChecking"):
        SshCluster(hostfile, strict_host_key_checking="ask")


@pytest.fixture(scope="module")
def site():
    with ssh_site(nodes=2) as started:
        yield started


def _spec(site, program: list[str], job_id: str, deadline_s: float, **extra) -> dict:
    return {"cluster": "ssh", "hostfile": str(site.files["hostfile"]), "ssh_config": str(site.files["ssh_config"]),
            "nodes": 2, "program": program, "job_id": job_id, "deadline_s": deadline_s, "env": RANK_ENV, **extra}


@pytest.mark.slow
def test_two_node_measurement_over_ssh(site, tmp_path: Path) -> None:
    job_id = f"sshtrain{secrets.token_hex(3)}"
    report = launch_on_node0(site, _spec(site, train_program(tmp_path), job_id, 240), tmp_path, timeout_s=400)
    assert report["ok"], report["describe_outcome"]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2
    assert result["hosts"] == [f"node0/{site.nodes[0].address}", f"node1/{site.nodes[1].address}"]
    assert report["max_nodes"] == 2
    assert leftover_processes(job_id) == []


@pytest.mark.slow
@pytest.mark.parametrize("prefixed", [False, True], ids=["plain", "under-a-launch-prefix"])
def test_hung_launch_is_killed_at_the_deadline_on_every_host(site, tmp_path: Path, prefixed: bool) -> None:
    """Also under a launch prefix: it runs inside the pidfile wrapper, so the cleanup's tree holds it."""
    job_id = f"sshhang{secrets.token_hex(3)}"
    run_dir = tmp_path / job_id  # in every rank's command line, so leftovers are easy to find
    spec = _spec(site, hanging_program(run_dir), job_id, 25)
    if prefixed:
        spec["launch_prefix"] = [str(recording_prefix(run_dir))]
    report = launch_on_node0(site, spec, tmp_path, timeout_s=120)
    assert report["timed_out"], report["describe_outcome"]
    started = sorted(p.name for p in run_dir.glob("rank*"))
    assert started == ["rank0", "rank1"], f"ranks never started before the deadline:\n{report['describe_outcome']}"
    assert leftover_processes(job_id) == []
    for log in report["logs"].values():
        assert "remote cleanup on" in Path(log).read_text()
    if prefixed:
        launched = [r for r in prefix_records(run_dir) if "torch.distributed.run" in r["args"]]
        assert sorted(r["host"] for r in launched) == [node.name for node in site.nodes]


@pytest.mark.slow
def test_launch_prefix_and_declared_variables_reach_every_rank_over_ssh(site, tmp_path: Path, monkeypatch) -> None:
    """A real prefix program on every host (standing for a container whose image sets its own
    LD_LIBRARY_PATH): the pre-launch probe and each host's torchrun run through it, and every rank
    gets the --rank-env variables from the harness's environment, set inside the prefix; a variable
    nobody declared, or a secret, stays behind."""
    monkeypatch.setenv("PF_PLUGIN_PATH", "/opt/x")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/aws-ofi-nccl/lib")
    monkeypatch.setenv("PF_NOT_DECLARED", "1")
    monkeypatch.setenv("HF_TOKEN", "hf_stays_on_the_harness")
    job_id = f"sshprefix{secrets.token_hex(3)}"
    run_dir = tmp_path / "run"
    names = ["PF_PLUGIN_PATH", "LD_LIBRARY_PATH", "PF_NOT_DECLARED", "HF_TOKEN"]
    spec = {**_spec(site, env_program(run_dir, names), job_id, 120),
            "launch_prefix": [str(recording_prefix(run_dir))], "rank_env": ["PF_PLUGIN_PATH", "LD_LIBRARY_PATH"]}
    report = launch_on_node0(site, spec, tmp_path, timeout_s=240)
    assert report["ok"], report.get("describe_outcome") or report
    assert f"prefix {run_dir / 'container-prefix.sh'}; rank env PF_PLUGIN_PATH,LD_LIBRARY_PATH" in report["describe"]
    records = prefix_records(run_dir)
    probes = [r for r in records if r["args"][:2] == ["test", "-x"]]
    launched = sorted((r for r in records if "torch.distributed.run" in r["args"]), key=lambda r: r["host"])
    hosts = [node.name for node in site.nodes]
    assert sorted(r["host"] for r in probes) == hosts  # prepare() checked each host through the prefix
    assert [r["host"] for r in launched] == hosts  # one torchrun per host, each under the prefix
    for i, record in enumerate(launched):
        assert record["PF_PLUGIN_PATH"] == "(unset)"  # ssh forwards nothing: the variables come after
        assert record["args"][0] == "env" and "PF_PLUGIN_PATH=/opt/x" in record["args"]
        assert f"--node-rank={i}" in record["args"]
        assert "hf_stays_on_the_harness" not in " ".join(record["args"])
    ranks = [json.loads((run_dir / f"env-rank{r}.json").read_text()) for r in range(len(hosts))]
    assert sorted(rank["host"] for rank in ranks) == hosts
    for rank in ranks:
        assert rank["env"] == {"PF_PLUGIN_PATH": "/opt/x", "LD_LIBRARY_PATH": "/opt/aws-ofi-nccl/lib",
                               "PF_NOT_DECLARED": None, "HF_TOKEN": None}
    assert leftover_processes(job_id) == []


@pytest.mark.slow
def test_unreachable_host_is_reported_before_any_launch(site, tmp_path: Path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"{site.nodes[0].address}\n198.18.0.99  # nobody there\n")
    spec = {**_spec(site, ["-c", "pass"], "never", 10), "hostfile": str(hostfile), "connect_timeout_s": 3}
    report = launch_on_node0(site, spec, tmp_path, timeout_s=60)
    assert "198.18.0.99" in report["unavailable"]
    assert site.nodes[0].address not in report["unavailable"].split("not usable")[1]


@pytest.mark.slow
def test_two_sessions_on_one_hostfile_take_turns(site, tmp_path: Path) -> None:
    """Two harnesses on the same hosts at once: the second waits, says so, and runs after the first;
    both jobs complete on their own rendezvous, at a port probed free on the head host."""
    def start(name: str, gate: Path | None):
        job_id = f"sshsession{name}{secrets.token_hex(3)}"
        return start_on_node0(site, _spec(site, session_program(tmp_path / name, gate), job_id, 120), tmp_path / name)

    two_sessions_take_turns(site, tmp_path, start)
    assert leftover_processes("session_rank.py") == []
    assert leftover_processes("pytest_fabric.cluster.nodelock") == []


def test_the_node_whose_ranks_failed_first_is_named_by_its_host(site, tmp_path: Path) -> None:
    """What leaves a sick node out (Measurer._node_failed): the launch names the host whose ranks failed."""
    report = launch_on_node0(site, _spec(site, failing_program(tmp_path, site.nodes[1].name),
                                         f"sshfail{secrets.token_hex(3)}", 60), tmp_path, timeout_s=120)
    assert not report["ok"] and report["failed_node"] == site.nodes[1].address, report["describe_outcome"]


def test_every_host_is_checked_through_the_prefix_with_the_ranks_environment(site, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """The node check runs on each host the way its ranks start: inside the launch prefix, with the
    declared variables set inside it; each host is judged on its own host name and links."""
    prefix = recording_prefix(tmp_path)
    spec = _spec(site, [], "sshcheck", 60, node_check=True, launch_prefix=[str(prefix)], rank_env=["PF_PLUGIN_PATH"])
    monkeypatch.setenv("PF_PLUGIN_PATH", "/opt/x")
    report = launch_on_node0(site, spec, tmp_path, timeout_s=120)
    checks = {c["name"]: c for c in report["checks"]}
    assert set(checks) == {node.address for node in site.nodes}
    for node in site.nodes:
        check = checks[node.address]
        assert check["problems"] == [] and check["hostname"] == node.name, check
    records = [r for r in prefix_records(tmp_path) if "pytest_fabric.measuring.nodes" in r["args"]]
    assert sorted(r["host"] for r in records) == sorted(node.name for node in site.nodes)
    assert {r["PF_PLUGIN_PATH"] for r in records} == {"(unset)"}  # the prefix saw none: set inside it
    for record in records:
        assert record["args"][0] == "env" and "PF_PLUGIN_PATH=/opt/x" in record["args"]
