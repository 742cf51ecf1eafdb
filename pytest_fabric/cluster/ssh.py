"""The SSH cluster: one ``torchrun`` per host of a hostfile, each started over ``ssh``.

A hostfile names one host per line, optionally with how many processes (GPUs) it runs; ``#``
starts a comment::

    gpu-001 slots=8
    admin@gpu-002 slots=8   # user@host logs in as that user

The first host hosts the rendezvous. ssh hands the remote side one string for the login shell (a
POSIX shell: sh, bash, dash, zsh), so every word of it is quoted with ``shlex.quote`` and hosts
must match a strict pattern: neither a host nor a model name can become a command or an ssh option.
ssh forwards no environment, so the ranks' environment is passed explicitly (``env NAME=VALUE``),
limited to what ranks need, the names declared with ``--rank-env`` (LD_LIBRARY_PATH for an NCCL
net plugin), and never a variable whose name says it is a secret.

A launch prefix (``--launch-prefix "apptainer exec --nv IMAGE"``) runs each host's torchrun inside
a container: ``sh -c WRAPPER PIDFILE PREFIX... env NAME=VALUE... torchrun ...``. The variables are
set inside the prefix, where the container cannot drop them.

Killing the local ssh stops nothing remote: without a terminal there is no hangup, and torchrun
starts its workers in sessions of their own, out of reach of any process group. So each host runs
torchrun under a one-line sh wrapper that writes its pid to a pidfile, and after a launch that did
not end cleanly (deadline, failure, Ctrl-C) a second ssh kills that wrapper's whole process tree,
found through /proc: TERM, then KILL. The prefix runs inside that wrapper, so whatever it starts
as its own children (apptainer, whose container processes stay descendants of the host's) is
killed with it. ``docker exec`` is the exception: the container's daemon starts the command, and
killing the client leaves it running; after a failed launch those ranks end on their own, when
torchrun's rendezvous or a collective times out (at most the launch deadline). Hosts are assumed to
be like this one: the same Python at the same path (inside the prefix's container, where there is
one), and the run directory on storage they all see (ranks read their config there).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .base import (_PACKAGE_ROOT, Cluster, ClusterUnavailable, LaunchRequest, explicit_rank_env, launch_notes,
                   launch_on_held_nodes, program_env, remote_env, torchrun_argv)
from .nodelock import NodeLock, holder_program, session_name
from .supervisor import LaunchOutcome, ProcSpec, supervise

# user@ (optional), then a DNS name or IPv4 address: letters, digits, '.', '-', never a leading '-'.
_HOST = re.compile(r"^(?:(?P<user>[A-Za-z_][A-Za-z0-9_.-]{0,31})@)?"
                   r"(?P<address>[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?)$")
_SLOTS = re.compile(r"^slots=(\d+)$")
# StrictHostKeyChecking modes, the default first (--ssh-host-key-checking takes them from here).
STRICT_HOST_KEY_CHECKING = ("accept-new", "yes", "no")

# Runs on each host around torchrun: records the pid the cleanup starts from, removes it when done.
_REMOTE_WRAPPER = 'pidfile=$1; shift; echo $$ > "$pidfile"; "$@"; status=$?; rm -f "$pidfile"; exit $status'

class HostfileError(ClusterUnavailable):
    """A hostfile that cannot be used; the message names the line and shows the format."""


@dataclass(frozen=True)
class Host:
    destination: str  # what ssh connects to: [user@]address
    address: str  # what other hosts connect to (rendezvous, torchrun's --local-addr)
    slots: int | None  # processes it may run; None: not limited by the hostfile

    def __str__(self) -> str:
        return self.destination


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """Hosts from hostfile text: ``[user@]HOST [slots=N]`` per line, ``#`` comments, blank lines."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    usage = "write one host per line as 'HOST' or 'HOST slots=N' (user@HOST to log in as another user)"
    for number, raw in enumerate(text.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{source}, line {number}"
        match = _HOST.match(words[0])
        if not match:
            raise HostfileError(f"{where}: {words[0]!r} is not a host name or IPv4 address "
                                f"(letters, digits, '.', '-'; IPv6 literals are not supported); {usage}")
        slots = None
        for option in words[1:]:
            slots_match = _SLOTS.match(option)
            if not slots_match or slots is not None:
                raise HostfileError(f"{where}: unexpected {option!r} after the host; {usage}")
            slots = int(slots_match.group(1))
            if slots < 1:
                raise HostfileError(f"{where}: slots must be at least 1, got {slots}")
        address = match.group("address")
        if address in seen:
            raise HostfileError(f"{where}: {address} is already listed on line {seen[address]}; "
                                "list each host once (slots=N gives it N processes)")
        seen[address] = number
        hosts.append(Host(words[0], address, slots))
    if not hosts:
        raise HostfileError(f"{source} lists no hosts; {usage}")
    return hosts


def read_hostfile(path: str | Path) -> list[Host]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise HostfileError(f"cannot read the hostfile {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise HostfileError(f"cannot read the hostfile {path}: not UTF-8 text; write one host per line") from None
    return parse_hostfile(text, str(path))


def remote_command(argv: Sequence[str], env: Mapping[str, str], pidfile: str, prefix: Sequence[str] = ()) -> str:
    """The string ssh runs on a host, every word quoted: the pidfile wrapper, then ``prefix`` (a
    container runtime), then ``env`` set by ``env`` right before ``argv``.

    The wrapper runs on the host, outside the prefix, so its pidfile is where the cleanup looks and
    the prefix's processes are its descendants. The variables are set inside the prefix: ``docker
    exec`` passes none of the host's, ``apptainer exec`` never passes LD_LIBRARY_PATH."""
    assignments = [f"{name}={value}" for name, value in env.items()]
    return shlex.join(["exec", "sh", "-c", _REMOTE_WRAPPER, "pytest-fabric", pidfile, *prefix,
                       "env", *assignments, *argv])


class SshCluster(Cluster):
    name = "ssh"
    realizes_fabrics = True
    # The harness usually runs on a login node: local pre-flight says nothing about the hosts.
    checks_here = False

    def __init__(
        self,
        hostfile: str | Path,
        *,
        ssh_config: str | Path | None = None,
        strict_host_key_checking: str = "accept-new",
        connect_timeout_s: int = 10,
        launch_prefix: Sequence[str] = (),
        rank_env_names: Sequence[str] = (),
    ) -> None:
        if shutil.which("ssh") is None:
            raise ClusterUnavailable("the ssh cluster needs the OpenSSH client "
                                     "(Debian: apt-get install openssh-client)")
        if strict_host_key_checking not in STRICT_HOST_KEY_CHECKING:
            raise ClusterUnavailable(f"StrictHostKeyChecking must be one of {', '.join(STRICT_HOST_KEY_CHECKING)}, "
                                     f"got {strict_host_key_checking!r}")
        self.hostfile = Path(hostfile)
        self.hosts = read_hostfile(self.hostfile)
        self.ssh_config = Path(ssh_config) if ssh_config else None
        self.strict_host_key_checking = strict_host_key_checking
        self.connect_timeout_s = connect_timeout_s
        self.launch_prefix = tuple(launch_prefix)  # words before each host's rank command (a container)
        self.rank_env_names = tuple(rank_env_names)  # variables every rank gets by name, besides what ranks need

    def describe(self) -> str:
        notes = launch_notes(prefix=self.launch_prefix, env_names=self.rank_env_names)
        return f"ssh ({len(self.hosts)} hosts from {self.hostfile}{notes})"

    def max_nodes(self) -> int:
        return len(self.hosts)

    def default_nodes(self) -> int:
        return len(self.hosts)

    def gpus_per_node(self) -> int | None:
        """The hostfile's ``slots=N`` where every host gives the same N (MPI's and DeepSpeed's hostfiles
        give a node's GPUs so)."""
        slots = {host.slots for host in self.hosts}
        return slots.pop() if len(slots) == 1 and None not in slots else None

    def max_ranks(self) -> int | None:
        if any(host.slots is None for host in self.hosts):
            return None
        return sum(host.slots or 0 for host in self.hosts)

    def ssh_argv(self, host: Host, command: str) -> list[str]:
        """ssh to ``host`` running ``command``: never a password prompt, bounded connection time."""
        options = {
            "BatchMode": "yes",
            "ConnectTimeout": str(self.connect_timeout_s),
            "StrictHostKeyChecking": self.strict_host_key_checking,
            "ServerAliveInterval": "15",  # a host that vanishes ends its ssh instead of hanging it
            "ServerAliveCountMax": "4",
            "LogLevel": "ERROR",  # no "Permanently added ..." lines in the rank logs
        }
        argv = ["ssh", "-T"]
        if self.ssh_config is not None:
            argv += ["-F", str(self.ssh_config)]
        for key, value in options.items():
            argv += ["-o", f"{key}={value}"]
        return [*argv, "--", host.destination, command]

    def prepare(self) -> None:
        """Check that every host answers over ssh and has this Python, all at once; through the launch
        prefix, where there is one, so that a missing image or container is said before any launch."""
        probe = shlex.join([*self.launch_prefix, "test", "-x", sys.executable])
        with ThreadPoolExecutor(max_workers=min(32, len(self.hosts))) as pool:
            results = list(pool.map(lambda host: self._ssh(host, probe), self.hosts))
        problems = []
        for host, (code, err) in zip(self.hosts, results, strict=True):
            if code == 1:
                where = f" through --launch-prefix {shlex.join(self.launch_prefix)}" if self.launch_prefix else ""
                problems.append(f"{host}: no {sys.executable} there{where} (hosts need the same Python at the same "
                                f"path){f': {err}' if err else ''}")
            elif code != 0:
                problems.append(f"{host}: {err or f'ssh exit code {code}'}")
        if problems:
            raise ClusterUnavailable(
                f"hosts from {self.hostfile} not usable (ssh runs with BatchMode=yes: set up key authentication "
                f"and known host keys first):\n  " + "\n  ".join(problems))

    def _ssh(self, host: Host, command: str, stdin: str | None = None) -> tuple[int, str]:
        try:
            proc = subprocess.run(self.ssh_argv(host, command), input=stdin, capture_output=True, text=True,
                                  timeout=self.connect_timeout_s + 20)
        except subprocess.TimeoutExpired:
            return 124, f"no answer within {self.connect_timeout_s + 20}s"
        return proc.returncode, (proc.stdout.strip() + "\n" + proc.stderr.strip()).strip()

    def launch(self, request: LaunchRequest, on_tick: Callable[[float], None] | None = None) -> LaunchOutcome:
        if len(self.hosts) < request.nodes:
            raise ClusterUnavailable(f"{self.hostfile} lists {len(self.hosts)} hosts; the launch needs {request.nodes}")
        hosts = self.usable(self.hosts, lambda host: host.address, request.nodes)
        for host in hosts:
            if host.slots is not None and request.procs_per_node > host.slots:
                raise ClusterUnavailable(f"{host} has slots={host.slots} in {self.hostfile}; "
                                         f"the launch runs {request.procs_per_node} processes per node")
        # Another session's launch on any of these hosts waits for ours, and ours for theirs; the
        # rendezvous port is probed on the first host while every host is held.
        locks = [(host.address, NodeLock(str(host), self.ssh_argv(host, self._python(
            holder_program(host.address, f"{session_name()}, job {request.job_id}"))))) for host in hosts]
        return launch_on_held_nodes(locks, hosts[0].address, request,
                                    lambda port: self._launch(request, hosts, port, on_tick))

    def node_names(self, wanted: int) -> list[str]:
        return [host.address for host in self.hosts]

    def run_on_each(self, args_of: Callable[[str], list[str]], names: Sequence[str], workdir: Path,
                    deadline_s: float) -> LaunchOutcome:
        """One ssh per host, all at once, with the environment and prefix its ranks get: the variables
        set inside the prefix, as ``remote_command`` sets the ranks' (a container may drop the rest)."""
        hosts = {host.address: host for host in self.hosts}
        specs = []
        for name in names:
            env = remote_env(program_env(name), self.rank_env_names)
            command = shlex.join(["exec", *self.launch_prefix, "env", *(f"{k}={v}" for k, v in env.items()),
                                  sys.executable, *args_of(name)])
            specs.append(ProcSpec(name, self.ssh_argv(hosts[name], command), dict(os.environ)))
        return supervise(specs, workdir, deadline_s, independent=True)

    def _python(self, args: Sequence[str]) -> str:
        """The remote command running this Python on the package the ranks import."""
        return shlex.join(["exec", "env", f"PYTHONPATH={_PACKAGE_ROOT}", sys.executable, *args])

    def _launch(self, request: LaunchRequest, hosts: list[Host], port: int,
                on_tick: Callable[[float], None] | None) -> LaunchOutcome:
        # Hosts are assumed to be like this one: its cores shared among the ranks of one node.
        threads = max(1, len(os.sched_getaffinity(0)) // request.procs_per_node)
        tag = f"{re.sub(r'[^A-Za-z0-9_.-]', '', request.job_id)[:40]}-{secrets.token_hex(4)}"
        pidfiles = [f"/tmp/pytest-fabric-{tag}-node{i}.pid" for i in range(len(hosts))]
        specs = []
        for i, host in enumerate(hosts):
            env = explicit_rank_env(request, f"node{i}/{host.address}", threads, self.rank_env_names)
            command = remote_command(torchrun_argv(request, i, hosts[0].address, host.address, port), env,
                                     pidfiles[i], self.launch_prefix)
            specs.append(ProcSpec(f"node{i}", self.ssh_argv(host, command), dict(os.environ)))
        try:
            outcome = supervise(specs, request.workdir, request.deadline_s, on_tick,
                                ask_stacks=lambda: self._ask_stacks(list(zip(hosts, pidfiles, strict=True))))
        except BaseException:  # Ctrl-C, SIGTERM: the local ssh processes are gone, the remote ones are not
            self._stop_remote(list(zip(hosts, pidfiles, strict=True)), None)
            raise
        if outcome.first_failure is not None:
            outcome.failed_node = {f"node{i}": host.address for i, host in enumerate(hosts)}[outcome.first_failure[0]]
        unclean = [i for i, proc in enumerate(outcome.procs) if proc.returncode != 0]
        if unclean:
            self._stop_remote([(hosts[i], pidfiles[i]) for i in unclean], [outcome.procs[i].log_path for i in unclean])
        return outcome

    def _ask_stacks(self, targets: list[tuple[Host, str]]) -> None:
        """A second ssh per host asks the ranks under its wrapper for their stacks (SIGUSR1, to the rank
        programs that catch it: cluster/stacks.py), all hosts at once."""
        with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            list(pool.map(lambda t: self._ssh(t[0], self._python(["-m", "pytest_fabric.cluster.stacks", t[1]])),
                          targets))

    def _stop_remote(self, targets: list[tuple[Host, str]], logs: list[Path] | None) -> None:
        """Kill what a launch left running on each host; say so at the end of that node's log."""
        def stop(target: tuple[Host, str]) -> tuple[int, str]:
            host, pidfile = target
            # The module the ranks' hosts run anyway (proctree: the same /proc walk as the supervisor's).
            return self._ssh(host, self._python(["-m", "pytest_fabric.cluster.proctree", pidfile]))

        with ThreadPoolExecutor(max_workers=min(32, len(targets))) as pool:
            results = list(pool.map(stop, targets))
        for i, ((host, pidfile), (code, text)) in enumerate(zip(targets, results, strict=True)):
            state = "" if code == 0 else f" (exit code {code}: processes may remain; their pid is in {pidfile})"
            if logs is not None:
                with open(logs[i], "a") as log:
                    log.write(f"pytest-fabric: remote cleanup on {host}: {text}{state}\n")
