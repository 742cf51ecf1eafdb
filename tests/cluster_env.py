"""Real clusters on this machine for the launcher tests: sshd and Slurm in emulated node namespaces.

    node0 netns  198.18.0.1  sshd | munged, slurmctld, slurmd -N node0 | the harness
    node1 netns  198.18.0.2  sshd |                   slurmd -N node1

Nodes are the emulated cluster's nodes (``EmulatedNetwork``, unshaped): each its own network, its
own private ``/tmp`` and its own host name, sharing only the machine's other files, as real nodes
share a filesystem. Every daemon runs on its node (``EmulatedNode.exec_argv``) from a fresh
directory on that shared storage, with generated keys and configuration, and is stopped, with its
node and directory, when the context manager exits; each node runs its own munged, as a real
cluster's do, its socket in the node's own ``/tmp``. The harness side of a launch runs on
node0, as it would on a real cluster's first node: ``launch_on_node0`` runs this file as a program
there (under ``salloc`` for Slurm), which builds the cluster and the LaunchRequest, launches, and
writes the outcome as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import needs

from pytest_fabric.cluster.base import ClusterUnavailable
from pytest_fabric.cluster.emulated import EmulatedNetwork, EmulatedNode, check_available, sweep_stale_namespaces
from pytest_fabric.cluster.slurm import SlurmCluster

HERE = Path(__file__).resolve()
READY_TIMEOUT_S = 60.0
INSTALL_HINT = "run .ci/install-launchers.sh"


def require(*tools: str) -> None:
    """Skip, saying exactly what is missing, where namespaces or the daemons' programs are unavailable."""
    try:
        check_available()
    except ClusterUnavailable as exc:
        needs(str(exc))
    missing = [tool for tool in tools if shutil.which(tool) is None and not Path(tool).exists()]
    if missing:
        needs(f"not installed: {', '.join(missing)} ({INSTALL_HINT})")
    # Daemons of a test run that was killed outright live on in its namespaces: end them now.
    sweep_stale_namespaces()


def netns_exec(node: EmulatedNode, argv: Sequence[str]) -> list[str]:
    """``argv`` run on ``node``: its network, its private directories, its host name."""
    return node.exec_argv(argv)


def leftover_processes(marker: str) -> list[str]:
    """Live processes (zombies excluded) whose command line mentions ``marker``, as "pid: cmdline"."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline:
            found.append(f"{entry}: {cmdline.strip()}")
    return found


class Daemons:
    """Daemons started for one test module; each logs to a file and is stopped TERM, then KILL."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        with open(self.log_dir / f"{name}.out", "wb") as log:
            self.procs[name] = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True,
                                                env=dict(env) if env is not None else None)

    def log(self, name: str, lines: int = 15) -> str:
        try:
            text = (self.log_dir / f"{name}.out").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def skip_if_dead(self) -> None:
        """A daemon that exited at start cannot run on this machine: skip with its own words."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                needs(f"{name} exited with code {proc.returncode} at start, so it cannot run here:\n"
                      f"{self.log(name)}")

    def stop(self) -> None:
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_for(what: str, ready: Callable[[], bool], daemons: Daemons, timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        daemons.skip_if_dead()
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {name} ---\n{daemons.log(name)}" for name in daemons.procs)
            raise RuntimeError(f"{what} not ready after {timeout_s:.0f}s\n{logs}")
        time.sleep(0.3)


@dataclass
class Site:
    """A started cluster: its nodes, its files, and the environment its clients need."""

    nodes: list[EmulatedNode]
    directory: Path
    env: dict[str, str] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)


@contextmanager
def _site_directory(kind: str) -> Iterator[Path]:
    # On the storage every node sees (the tests' temporary root, tests/conftest.py), world-searchable:
    # munged refuses a key below a directory others may write.
    directory = Path(tempfile.mkdtemp(prefix=f"pytest-fabric-{kind}-", dir=os.environ.get("PYTEST_DEBUG_TEMPROOT")))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_suffix(".pub").read_text().strip()


@contextmanager
def ssh_site(nodes: int = 2) -> Iterator[Site]:
    """One sshd per node namespace, on the node's address, trusting one generated client key for root."""
    require("/usr/sbin/sshd", "ssh", "ssh-keygen")
    with ExitStack() as stack:
        directory = stack.enter_context(_site_directory("ssh"))
        net = stack.enter_context(EmulatedNetwork(nodes, None))
        daemons = Daemons(directory)
        stack.callback(daemons.stop)
        host_key = _keygen(directory / "host_key")
        (directory / "authorized_keys").write_text(_keygen(directory / "client_key") + "\n")
        (directory / "known_hosts").write_text("".join(f"{node.address} {host_key}\n" for node in net.nodes))
        ssh_config = directory / "ssh_config"
        ssh_config.write_text(
            "Host *\n"
            "  User root\n"
            f"  IdentityFile {directory / 'client_key'}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {directory / 'known_hosts'}\n"
            "  GlobalKnownHostsFile /dev/null\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        for node in net.nodes:
            config = directory / f"sshd-{node.name}.conf"
            config.write_text(
                f"ListenAddress {node.address}:22\n"
                f"HostKey {directory / 'host_key'}\n"
                f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
                f"PidFile {directory / f'sshd-{node.name}.pid'}\n"
                "PermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\n"
                "UsePAM no\n"
                "StrictModes no\n"  # the key files live in a temporary directory
                "LogLevel ERROR\n")
            daemons.start(f"sshd-{node.name}", netns_exec(node, ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)]))
        hostfile = directory / "hostfile"
        hostfile.write_text("# generated by tests/cluster_env.py\n"
                            + "".join(f"{node.address} slots=1\n" for node in net.nodes))
        head = net.nodes[0]

        def answers() -> bool:
            return all(subprocess.run(
                netns_exec(head, ["ssh", "-F", str(ssh_config), "-o", "BatchMode=yes", "-o", "ConnectTimeout=2",
                                  node.address, "true"]),
                capture_output=True, stdin=subprocess.DEVNULL).returncode == 0 for node in net.nodes)

        _wait_for("sshd", answers, daemons)
        yield Site(net.nodes, directory, files={"hostfile": hostfile, "ssh_config": ssh_config})


def _cgroup_conf() -> str:
    # slurmd initialises its cgroup plugin even when no cgroup plugin is configured for jobs.
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return "CgroupPlugin=cgroup/v2\n"
    return "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"


@contextmanager
def slurm_site(nodes: int = 2, management: bool = False) -> Iterator[Site]:
    """munged on every node, a slurmctld on node0 and one ``slurmd -N nodeK`` per node, NodeAddr = its
    address (with ``management``, its management link's: the fabric link fab0 may then go down)."""
    require("slurmctld", "slurmd", "salloc", "srun", "scontrol", "sinfo", "munged")
    with ExitStack() as stack:
        directory = stack.enter_context(_site_directory("slurm"))
        net = stack.enter_context(EmulatedNetwork(nodes, None, management=management))
        daemons = Daemons(directory)
        stack.callback(daemons.stop)
        key = directory / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # One munged per node with the cluster's key, its socket in the node's own /tmp: the same path
        # names a different socket on each node, as /run/munge does on a real cluster.
        munge_socket = "/tmp/munge/munge.sock"
        for node in net.nodes:
            daemons.start(f"munged-{node.name}", netns_exec(node, [
                "sh", "-c", 'mkdir -p -m 0755 /tmp/munge && exec "$@"', "munged",
                "munged", "--foreground", f"--socket={munge_socket}", f"--key-file={key}",
                f"--pid-file={directory / f'munged-{node.name}.pid'}",
                f"--log-file={directory / f'munged-{node.name}.log'}",
                f"--seed-file={directory / f'munged-{node.name}.seed'}"]))

        def munge_up() -> bool:
            return all(subprocess.run(netns_exec(node, ["test", "-S", munge_socket])).returncode == 0
                       for node in net.nodes)

        _wait_for("munged", munge_up, daemons)

        cpus = os.cpu_count() or 1
        (directory / "state").mkdir()
        conf = directory / "slurm.conf"
        conf.write_text("\n".join([
            "ClusterName=pytestfabric",
            f"SlurmctldHost={net.nodes[0].name}({net.nodes[0].address})",  # node0's own host name
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "CredType=cred/munge",
            f"StateSaveLocation={directory / 'state'}",
            f"SlurmdSpoolDir={directory / 'spool-%n'}",
            f"SlurmctldPidFile={directory / 'slurmctld.pid'}",
            f"SlurmdPidFile={directory / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={directory / 'slurmctld.log'}",
            f"SlurmdLogFile={directory / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc",  # no cgroups for jobs: they are not delegated here
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/linear",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=5",
            "InactiveLimit=0",
            *(f"NodeName={node.name} NodeAddr={node.address} CPUs={cpus} State=UNKNOWN" for node in net.nodes),
            # OverSubscribe=YES: a job that asks (salloc --oversubscribe) may share nodes with another,
            # as two sessions' jobs do in the concurrency test; other jobs still get whole nodes.
            f"PartitionName=fabric Nodes={','.join(node.name for node in net.nodes)} Default=YES "
            "MaxTime=INFINITE State=UP OverSubscribe=YES",
            "",
        ]))
        (directory / "cgroup.conf").write_text(_cgroup_conf())
        for node in net.nodes:
            (directory / f"spool-{node.name}").mkdir()
        env = {**os.environ, "SLURM_CONF": str(conf)}
        daemons.start("slurmctld", netns_exec(net.nodes[0], ["slurmctld", "-D", "-i", "-f", str(conf)]), env)
        for node in net.nodes:
            slurmd = ["slurmd", "-D", "-N", node.name, "-f", str(conf)]
            daemons.start(f"slurmd-{node.name}", netns_exec(node, slurmd), env)

        def idle() -> bool:
            shown = subprocess.run(netns_exec(net.nodes[0], ["sinfo", "--noheader", "--Node", "--format=%N %T"]),
                                   capture_output=True, text=True, env=env).stdout.split()
            return shown.count("idle") == nodes

        _wait_for("slurm nodes (sinfo: idle)", idle, daemons)
        yield Site(net.nodes, directory, env={"SLURM_CONF": str(conf)}, files={"slurm.conf": conf})


# A rank that hangs like one stuck in a collective: it says it started, then ignores SIGTERM and sleeps.
HANGING_RANK = """\
import os, pathlib, signal, sys, time
pathlib.Path(sys.argv[1], "rank" + os.environ["RANK"]).write_text(os.environ.get("PYTEST_FABRIC_NODE", ""))
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(3600)
"""


def train_program(run_dir: Path, steps: int = 1, collective_timeout_s: float = 120) -> list[str]:
    """The rank program for a real, small measurement: qwen2-tiny, ``steps`` steps (1), no warm-up, batch
    1 x 64 tokens."""
    from pytest_fabric.core.fabrics import get_fabric
    from pytest_fabric.core.models import get_model
    from pytest_fabric.workload.config import TrainConfig

    run_dir.mkdir(parents=True, exist_ok=True)
    config = TrainConfig(
        model=get_model("qwen2-tiny").to_dict(), batch_size=1, seq_len=64, steps=steps, warmup_steps=0,
        measure_s=0, result_path=str(run_dir / "result.json"), progress_path=str(run_dir / "progress.jsonl"),
        device="cpu", collective_timeout_s=collective_timeout_s, fabric=get_fabric("eth").settings())
    config.dump(run_dir / "config.json")
    return ["-m", "pytest_fabric.workload.train", "--config", str(run_dir / "config.json")]


# A rank that fails on one node (named by its host name), as a rank on a sick node would; elsewhere it ends well.
FAILING_ON_RANK = """\
import socket, sys
sys.exit(3 if socket.gethostname() == sys.argv[1] else 0)
"""


def failing_program(run_dir: Path, node: str) -> list[str]:
    """A rank program that exits 3 on the node whose host name is ``node`` and 0 on the others."""
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "fail_on_node.py"
    script.write_text(FAILING_ON_RANK)
    return [str(script), node]


def hanging_program(run_dir: Path) -> list[str]:
    """A rank program that never ends; each rank leaves a file ``rank<N>`` in ``run_dir`` once it runs."""
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "hang.py"
    script.write_text(HANGING_RANK)
    return [str(script), str(run_dir)]


# A rank of one session in the two-session tests: it records when it ran (from its own start to its
# end) and the rendezvous its agent used, optionally waits for the test to open a gate, then proves
# the rendezvous is its own job's: a gloo all_reduce of rank + 1 over the whole world.
SESSION_RANK = """\
import json, os, pathlib, sys, time
run, gate = pathlib.Path(sys.argv[1]), sys.argv[2]
start = time.time()
rank = int(os.environ["RANK"])
(run / f"started-rank{rank}").write_text(str(start))
deadline = time.monotonic() + 120
while gate != "-" and not pathlib.Path(gate).exists() and time.monotonic() < deadline:
    time.sleep(0.1)
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
agent = open(f"/proc/{os.getppid()}/cmdline").read().split("\\0")
endpoint = next(a for a in agent if a.startswith("--rdzv-endpoint=")).partition("=")[2]
dist.destroy_process_group()
json.dump({"start": start, "end": time.time(), "sum": total.item(), "world": int(os.environ["WORLD_SIZE"]),
           "endpoint": endpoint, "node": os.environ.get("PYTEST_FABRIC_NODE", "")}, open(run / f"rank{rank}.json", "w"))
"""


def session_program(run_dir: Path, gate: Path | None = None) -> list[str]:
    """A short real job (see SESSION_RANK); with ``gate``, its ranks start their work once that file exists."""
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "session_rank.py"
    script.write_text(SESSION_RANK)
    return [str(script), str(run_dir), str(gate) if gate else "-"]


# A launch prefix standing for a container runtime whose image sets its own LD_LIBRARY_PATH: it
# records, in the run directory every node sees, where it ran (host name, working directory) and
# PF_PLUGIN_PATH as it found it, one NAME=VALUE line each, and the words it was given (NUL-separated:
# a word may hold new lines); then it sets LD_LIBRARY_PATH as the image would and runs the rest.
RECORDING_PREFIX = """\
#!/bin/sh
record="RUN_DIR/prefix-$(uname -n)-$$"
printf 'host=%s\\ncwd=%s\\nPF_PLUGIN_PATH=%s\\n' "$(uname -n)" "$(pwd)" "${PF_PLUGIN_PATH-(unset)}" > "$record.txt"
printf '%s\\0' "$@" > "$record.args"
LD_LIBRARY_PATH=/image/lib
export LD_LIBRARY_PATH
exec "$@"
"""

# A rank that records its host, its node label and the variables named on its command line.
ENV_RANK = """\
import json, os, pathlib, socket, sys
run, names = pathlib.Path(sys.argv[1]), sys.argv[2:]
(run / f"env-rank{os.environ['RANK']}.json").write_text(json.dumps({
    "host": socket.gethostname(), "node": os.environ.get("PYTEST_FABRIC_NODE"),
    "env": {name: os.environ.get(name) for name in names}}))
"""


def recording_prefix(run_dir: Path) -> Path:
    """An executable ``--launch-prefix`` (RECORDING_PREFIX) that writes its records into ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "container-prefix.sh"
    script.write_text(RECORDING_PREFIX.replace("RUN_DIR", str(run_dir)))
    script.chmod(0o755)
    return script


def prefix_records(run_dir: Path) -> list[dict[str, Any]]:
    """What each run of ``recording_prefix`` said: its fields, its words as ``args``."""
    records = []
    for path in sorted(run_dir.glob("prefix-*.txt")):
        record: dict[str, Any] = dict(line.partition("=")[::2] for line in path.read_text().splitlines())
        record["args"] = path.with_suffix(".args").read_text().split("\0")[:-1]
        records.append(record)
    return records


def env_program(run_dir: Path, names: Sequence[str]) -> list[str]:
    """A rank program that leaves ``env-rank<N>.json`` in ``run_dir``: its host, node and ``names``' values."""
    run_dir.mkdir(parents=True, exist_ok=True)
    script = run_dir / "env_rank.py"
    script.write_text(ENV_RANK)
    return [str(script), str(run_dir), *names]


# What every test launch sets: gloo on the emulated link, one thread per rank (2 cores for everything).
RANK_ENV = {"GLOO_SOCKET_IFNAME": "fab0", "OMP_NUM_THREADS": "1"}


@dataclass
class Harness:
    """The harness side of a launch, running on node0; ``outcome`` waits for it and reads its report."""

    proc: subprocess.Popen[str]
    out_path: Path
    notes: Path  # what the launch said while it waited (LaunchRequest.notify), one line each

    def said(self) -> str:
        return self.notes.read_text() if self.notes.exists() else ""

    def outcome(self, timeout_s: float) -> dict[str, Any]:
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc, signal.SIGKILL)
            stdout, stderr = self.proc.communicate()
        if self.proc.returncode != 0 or not self.out_path.exists():
            raise AssertionError(f"the harness on node0 failed (exit code {self.proc.returncode}):\n"
                                 f"{stdout[-3000:]}\n{stderr[-3000:]}")
        return json.loads(self.out_path.read_text())


def start_on_node0(site: Site, spec: dict[str, Any], workdir: Path, salloc: bool = False,
                   salloc_options: Sequence[str] = ()) -> Harness:
    """Start the harness on node0 (inside a Slurm allocation of every node with ``salloc``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    spec_path = workdir / "launch-spec.json"
    out_path = workdir / "launch-outcome.json"
    notes = workdir / "notify.log"
    spec_path.write_text(json.dumps({**spec, "workdir": str(workdir), "out": str(out_path), "notes": str(notes)}))
    argv = [sys.executable, str(HERE), str(spec_path)]
    if salloc:
        argv = ["salloc", f"--nodes={len(site.nodes)}", "--immediate=60", "--time=15",
                "--job-name=pytest-fabric-harness", *salloc_options, *argv]
    proc = subprocess.Popen(netns_exec(site.nodes[0], argv), env={**os.environ, **site.env}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    return Harness(proc, out_path, notes)


def launch_on_node0(site: Site, spec: dict[str, Any], workdir: Path, timeout_s: float,
                    salloc: bool = False) -> dict[str, Any]:
    """Run the harness on node0 (inside a Slurm allocation of every node with ``salloc``); its outcome."""
    return start_on_node0(site, spec, workdir, salloc).outcome(timeout_s)


def wait_until(what: str, ready: Callable[[], bool], timeout_s: float, *harnesses: Harness) -> None:
    """Poll ``ready`` until it holds; fail saying ``what`` did not happen (with the harnesses' words)."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline or any(h.proc.poll() is not None for h in harnesses):
            raise AssertionError(f"{what} did not happen within {timeout_s:.0f}s; the harnesses said: "
                                 + " | ".join(h.said() for h in harnesses))
        time.sleep(0.2)


def two_sessions_take_turns(site: Site, tmp_path: Path, start: Callable[[str, Path | None], Harness]) -> None:
    """Two sessions' launches on the same nodes: the first holds its ranks at a gate until the second
    says it waits; then both must complete, one after the other, each on its own rendezvous.

    ``start(name, gate)`` starts a session whose ranks (``session_program``) write to ``tmp_path / name``."""
    gate = tmp_path / "release-first"
    first = start("first", gate)
    try:
        wait_until("the first session's ranks starting",
                   lambda: all((tmp_path / "first" / f"started-rank{r}").exists() for r in range(len(site.nodes))),
                   120, first)
        second = start("second", None)
        wait_until("the second session saying it waits for the first",
                   lambda: "waiting for another pytest-fabric session's launch on" in second.said(), 120, second)
    finally:
        gate.touch()
    reports = {"first": first.outcome(240), "second": second.outcome(240)}
    ranks = {}
    for name, report in reports.items():
        assert report.get("ok"), f"{name} session: {report}"
        ranks[name] = [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in range(len(site.nodes))]
        # The job is its own: every rank saw the whole world and the sum of its ranks only.
        assert [r["sum"] for r in ranks[name]] == [sum(range(1, len(site.nodes) + 1))] * len(site.nodes)
        assert {r["world"] for r in ranks[name]} == {len(site.nodes)}
    assert first.said() == "", "the first session had nothing to wait for"
    assert "held by pytest-fabric pid" in second.said() and site.nodes[0].address in second.said()
    # Not overlapping: the second job's first rank started after the first job's last rank ended.
    assert min(r["start"] for r in ranks["second"]) > max(r["end"] for r in ranks["first"])
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for name in reports:
        (endpoint,) = {r["endpoint"] for r in ranks[name]}
        host, _, port = endpoint.rpartition(":")
        assert host == site.nodes[0].address, f"{name}: the rendezvous is on the head node"
        assert not low <= int(port) <= high, f"{name}: port {port} is in the ephemeral range {low}-{high}"


def _drive(spec_path: str) -> None:
    """The harness side of one test launch, run on node0: build the cluster and request, launch, report."""
    from pytest_fabric.cluster.base import Cluster, LaunchRequest
    from pytest_fabric.cluster.ssh import SshCluster
    from pytest_fabric.core.fabrics import get_fabric

    spec = json.loads(Path(spec_path).read_text())
    cluster: Cluster
    # --launch-prefix and --rank-env, as the plugin gives them (ClusterOptions)
    launch = {"launch_prefix": spec.get("launch_prefix", ()), "rank_env_names": spec.get("rank_env", ())}
    if spec["cluster"] == "slurm":
        cluster = SlurmCluster(srun_args=spec.get("srun_args", ()), **launch)
    else:
        cluster = SshCluster(spec["hostfile"], ssh_config=spec["ssh_config"],
                             strict_host_key_checking="yes", connect_timeout_s=spec.get("connect_timeout_s", 10),
                             **launch)
    report: dict[str, Any] = {"describe": cluster.describe(), "max_nodes": cluster.max_nodes()}
    if spec.get("node_check"):  # the session's node check (measuring/nodes.py), through this launcher
        from pytest_fabric.measuring.nodes import check_nodes

        checks = check_nodes(cluster, cluster.node_names(spec["nodes"]), Path(spec["workdir"]) / "session",
                             [get_fabric("eth")], 1, "cpu")
        report["checks"] = [check.to_dict() for check in checks]
        Path(spec["out"]).write_text(json.dumps(report))
        return
    if spec.get("orphan_step"):
        assert isinstance(cluster, SlurmCluster)
        report.update(_orphan_step(cluster, spec["job_id"]))
        Path(spec["out"]).write_text(json.dumps(report))
        return
    try:
        cluster.prepare()
    except ClusterUnavailable as exc:
        report["unavailable"] = str(exc)
        Path(spec["out"]).write_text(json.dumps(report))
        return
    def notify(text: str) -> None:
        with open(spec["notes"], "a") as notes:
            notes.write(text + "\n")

    request = LaunchRequest(
        nodes=spec["nodes"], procs_per_node=spec.get("procs_per_node", 1), fabric=get_fabric("eth"), program=spec["program"],
        workdir=Path(spec["workdir"]), deadline_s=spec["deadline_s"], job_id=spec["job_id"], env=spec["env"],
        notify=notify)
    try:
        outcome = cluster.launch(request)
    except ClusterUnavailable as exc:
        report["unavailable"] = str(exc)
        Path(spec["out"]).write_text(json.dumps(report))
        return
    report.update(ok=outcome.ok, timed_out=outcome.timed_out, elapsed_s=outcome.elapsed_s, killed=outcome.killed,
                  failed_node=outcome.failed_node,
                  returncodes={p.name: p.returncode for p in outcome.procs},
                  logs={p.name: str(p.log_path) for p in outcome.procs}, describe_outcome=outcome.describe())
    if isinstance(cluster, SlurmCluster):
        # Steps this launch may have left in the allocation (the allocation itself has none).
        steps = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={cluster.job_id}", "--format=%i %j"],
                               capture_output=True, text=True, check=True).stdout
        report["steps_after"] = steps.splitlines()
    Path(spec["out"]).write_text(json.dumps(report))


def _orphan_step(cluster: SlurmCluster, job_id: str) -> dict[str, Any]:
    """A step whose srun was killed outright (SIGKILL, no chance to cancel it), then the launcher's cleanup."""
    name = f"pytest-fabric-{job_id}"
    srun = subprocess.Popen(["srun", f"--jobid={cluster.job_id}", "--nodes=2", "--ntasks=2", "--overlap",
                             f"--job-name={name}", sys.executable, "-c", "import time; time.sleep(600)", job_id],
                            start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while len(leftover_processes(job_id)) < 4 and time.monotonic() < deadline:  # srun, its helper, 2 tasks
        time.sleep(0.2)
    running = leftover_processes(job_id)
    os.killpg(srun.pid, signal.SIGKILL)
    srun.wait()
    listed = cluster.steps(name)
    note = cluster.cancel_step(name)
    return {"running_before_kill": running, "listed_after_kill": listed, "note": note,
            "listed_after_cancel": cluster.steps(name)}


if __name__ == "__main__":
    _drive(sys.argv[1])
