#!/usr/bin/env python
"""Plugin overhead: tokens/s measured through pytest-fabric vs the same workload under a bare torchrun.

    python benchmarks/bench_plugin_overhead.py [--rounds 3] [--model qwen2-tiny] [--nodes 2] [--fabric eth]

Each round runs, one after the other (never at once: the ranks would measure each other):

  plugin  `python -m pytest <generated test> --cluster emulated --nodes N --fabrics F --models M ...`
          in a subprocess; tokens/s is read from the session's measurements.json (the directory the
          terminal summary names), or from the JUnit system-out line `fabric.<id>.tokens_per_s=` if
          that fails.
  bare    what a user does by hand: the same emulated network (EmulatedNetwork: namespaces, a bridge,
          tbf-shaped links), a TrainConfig JSON, and one plain `torchrun` per node started with
          subprocess inside its namespace, pinned to the same cores with the same OMP_NUM_THREADS
          as the plugin uses; tokens/s is read from result.json.

Rounds alternate plugin, bare, plugin, bare, ... so that drift on the machine hits both. The table
gives tokens/s per round, the medians, the ratio plugin/bare, and wall-clock per launch; rounds
during which other processes used the cores are marked. The exit status is 0 whatever the ratio;
it is non-zero only when a launch failed or produced no result, the two sides trained different
workloads, or a network namespace was left behind. Needs root (network namespaces), like the
emulated cluster itself. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a bare checkout works too

from pytest_fabric.cluster.base import RDZV_PORT  # noqa: E402
from pytest_fabric.cluster.emulated import IFNAME, EmulatedNetwork, check_available, owned_namespaces  # noqa: E402
from pytest_fabric.core.fabrics import FABRICS, Fabric, get_fabric  # noqa: E402
from pytest_fabric.measuring.measure import LaunchSettings  # noqa: E402
from pytest_fabric.measuring.measurement import launch_value  # noqa: E402
from pytest_fabric.workload.result import TrainResult  # noqa: E402
from pytest_fabric.core.models import MODELS, get_model  # noqa: E402
from pytest_fabric.workload.config import TrainConfig  # noqa: E402

_DEFAULTS = LaunchSettings()

# The test the plugin side runs: the embedded throughput suite's test, restricted to one node count
# (the suite's matrix only has powers of two up to --nodes; this works for any --nodes).
TEST_FILE = '''\
import math

import pytest


@pytest.mark.fabric_matrix(nodes=[{nodes}])
def test_training_step(fabric_case, fabric_measure):
    m = fabric_measure(fabric_case)
    assert m.gpus == fabric_case.nodes * {gpus_per_node}
    assert math.isfinite(m.result.final_loss)
    assert m.tokens_per_s > 0
'''


# Pids of the pytest processes started here: their namespaces are tagged with them.
LAUNCHER_PIDS: list[int] = []


class BenchError(RuntimeError):
    """A launch that failed to run or produced no result."""


@dataclass
class Run:
    tokens_per_s: float
    launch_s: float  # torchrun processes started -> all exited
    total_s: float  # plugin: the whole pytest process; bare: network up, launch, network down
    result: dict
    config: dict  # the TrainConfig the ranks ran
    foreign: list[int]  # other sessions' rank processes seen on this machine during the run
    others_load: float  # cores' worth of other processes' CPU time, on average, during the run
    steal_load: float  # cores' worth of CPU time the hypervisor gave elsewhere, during the run


# -- the plugin side ---------------------------------------------------------------------------

def run_plugin(args: argparse.Namespace, work: Path, index: int) -> Run:
    case_id = f"{args.model}-n{args.nodes}-{args.fabric}"
    here = work / f"plugin-{index}"
    here.mkdir()
    test = here / "test_overhead.py"
    test.write_text(TEST_FILE.format(nodes=args.nodes, gpus_per_node=args.gpus_per_node))
    (here / "pytest.ini").write_text("[pytest]\n")  # keep the repository's ini options out of it
    junit = here / "junit.xml"
    cmd = [
        sys.executable, "-m", "pytest", str(test),
        "-c", str(here / "pytest.ini"), "--rootdir", str(here), "-p", "no:cacheprovider", "-q",
        "--junitxml", str(junit),
        "--cluster", "emulated",
        "--nodes", str(args.nodes),
        "--gpus-per-node", str(args.gpus_per_node),
        "--fabrics", args.fabric,
        "--models", args.model,
        "--steps", str(args.steps),
        "--measure-seconds", "0",  # a fixed number of steps, as the bare side runs
        "--warmup-steps", str(args.warmup_steps),
        "--launch-timeout", str(args.timeout),
    ]
    if args.rate:
        cmd += ["--fabric-rate", f"{args.fabric}={args.rate:g}"]
    if not any(ep.value == "pytest_fabric.plugin" for ep in entry_points(group="pytest11")):
        cmd += ["-p", "pytest_fabric.plugin"]  # not installed: load it from this checkout
    env = with_repo_on_path(os.environ)  # this checkout's plugin, whatever is installed
    with Watch() as watch:
        start = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=here, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=args.timeout + 120)
        except BaseException:
            # pytest's own handler stops its ranks and removes its namespaces on SIGTERM.
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            LAUNCHER_PIDS.append(proc.pid)
        total = time.monotonic() - start
    (here / "pytest.out").write_text(out)
    if proc.returncode != 0:
        raise BenchError(f"plugin run {index}: pytest exited {proc.returncode}:\n{tail(out, 40)}")

    found = re.search(r"launch logs and results: (\S+)", out)
    result, config = None, {}
    if found:
        session_dir = Path(found.group(1))
        store = json.loads((session_dir / "measurements.json").read_text())
        want = {"model": args.model, "nodes": args.nodes, "fabric": args.fabric}
        records = [r for r in store.values() if r.get("case") == want]
        if len(records) == 1 and "error" not in records[0]:
            result = records[0]["result"]
            config = json.loads((Path(result["run_dir"]) / "config.json").read_text())
        if not args.keep:
            shutil.rmtree(session_dir, ignore_errors=True)
    if result is None:
        # Fallback: the JUnit testcase system-out carries `fabric.<id>.tokens_per_s=<value>`.
        text = junit.read_text() if junit.exists() else ""
        value = re.search(rf"fabric\.{re.escape(case_id)}\.tokens_per_s=([0-9.]+)", text)
        if value is None:
            raise BenchError(f"plugin run {index}: no tokens/s for {case_id} in measurements.json or {junit}:\n"
                             f"{tail(out, 30)}")
        print(f"(measurements.json unreadable; tokens/s read from {junit}, workloads not compared)",
              end=" ", file=sys.stderr)
        return Run(float(value.group(1)), float("nan"), total, {}, {}, *watch.findings())
    return Run(tokens_per_s(result), result.get("launch_s", float("nan")), total, result, config, *watch.findings())


def tokens_per_s(result: dict) -> float:
    """A launch's tokens/s as the harness values it (``measurement.launch_value``)."""
    r = TrainResult.from_dict(result)
    return r.tokens_per_step / launch_value(r).step_s


# -- the bare side: what a user does by hand ---------------------------------------------------

def _torchrun() -> str:
    # The torchrun of this interpreter (a pyenv shim or another environment's would be a different
    # program, or add a shell script's start-up to every launch).
    local = Path(sys.executable).with_name("torchrun")
    found = str(local) if local.exists() else shutil.which("torchrun")
    if not found:
        raise BenchError("no `torchrun` next to this Python or on PATH")
    return found


def the_fabric(args: argparse.Namespace) -> Fabric:
    fabric = get_fabric(args.fabric)
    return fabric.with_rate(args.rate) if args.rate else fabric


def _cores(node_rank: int, nodes: int) -> str:
    # The cores the plugin gives each emulated node (OnThisMachine.pin): an equal, disjoint share.
    cpus = sorted(os.sched_getaffinity(0))
    share = max(1, len(cpus) // nodes)
    start = (node_rank * share) % len(cpus)
    return ",".join(map(str, cpus[start:start + share]))


def run_bare(args: argparse.Namespace, work: Path, index: int) -> Run:
    here = work / f"bare-{index}"
    here.mkdir()
    spec = get_model(args.model)
    fabric = the_fabric(args)
    # Only what a user writes by hand: model, shape, steps; everything else keeps TrainConfig's
    # defaults. check_same_workload compares the result with the config the plugin wrote.
    config = TrainConfig(
        model=spec.to_dict(),
        batch_size=spec.batch_size,
        seq_len=spec.seq_len,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        measure_s=0,
        result_path=str(here / "result.json"),
        progress_path=str(here / "progress.jsonl"),
        collective_timeout_s=args.timeout,
        fabric={**fabric.settings(), "crosses_fabric": args.nodes > 1},
    )
    config.dump(here / "config.json")
    ranks = args.nodes * args.gpus_per_node
    env = with_repo_on_path(os.environ)
    env["OMP_NUM_THREADS"] = str(max(1, len(os.sched_getaffinity(0)) // ranks))  # as threads_per_rank
    env["GLOO_SOCKET_IFNAME"] = IFNAME
    torchrun = _torchrun()
    rdzv_id = f"bench{os.getpid()}r{index}"

    procs: list[subprocess.Popen] = []
    with Watch() as watch, EmulatedNetwork(args.nodes, fabric.emulated_mbit) as net:
        start = watch.started_at
        head = net.nodes[0].address
        try:
            launch_start = time.monotonic()
            for i, node in enumerate(net.nodes):
                cmd = [
                    "ip", "netns", "exec", node.netns, "taskset", "-c", _cores(i, args.nodes),
                    torchrun,
                    "--nnodes", str(args.nodes), "--nproc-per-node", str(args.gpus_per_node),
                    "--node-rank", str(i),
                    "--rdzv-backend", "static", "--rdzv-endpoint", f"{head}:{RDZV_PORT}", "--rdzv-id", rdzv_id,
                    "--local-addr", node.address,
                    "-m", "pytest_fabric.workload.train", "--config", str(here / "config.json"),
                ]
                with open(here / f"{node.name}.log", "wb") as log:
                    procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True))
            # Wait for every torchrun; one that fails leaves the others waiting for it at the next
            # collective, so they get a few seconds to fail on their own and are then killed.
            failed_at = None
            while True:
                codes = [p.poll() for p in procs]
                now = time.monotonic()
                if all(c is not None for c in codes):
                    break
                if failed_at is None and any(c not in (None, 0) for c in codes):
                    failed_at = now
                if failed_at is not None and now - failed_at > 5:
                    break
                if now - launch_start > args.timeout:
                    raise BenchError(f"bare run {index}: torchrun did not finish in {args.timeout:g}s; "
                                     f"logs in {here} (use --keep to keep them)")
                time.sleep(0.2)
            launch = time.monotonic() - launch_start
        finally:
            for p in procs:  # whatever is left (a failure, Ctrl-C): the whole process group
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    p.wait()
    total = time.monotonic() - start
    if any(codes):
        logs = "\n".join(f"--- node{i} (exit {c}) ---\n{tail((here / f'node{i}.log').read_text(errors='replace'), 20)}"
                         for i, c in enumerate(codes))
        raise BenchError(f"bare run {index}: torchrun failed:\n{logs}")
    try:
        result = json.loads((here / "result.json").read_text())
    except (OSError, ValueError) as exc:
        raise BenchError(f"bare run {index}: every torchrun exited 0 but result.json is unreadable: {exc}") from exc
    return Run(tokens_per_s(result), launch, total, result, asdict(config), *watch.findings())


# -- helpers -----------------------------------------------------------------------------------

def with_repo_on_path(environ: Mapping[str, str]) -> dict[str, str]:
    env = dict(environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def foreign_trainers() -> list[int]:
    """Rank programs (pytest_fabric.workload.*) on this machine that this benchmark did not start."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "pytest_fabric.workload." in cmdline and "torch.distributed.run" not in cmdline \
                and "torchrun" not in cmdline and not _descends_from(int(entry.name), os.getpid()):
            out.append(int(entry.name))
    return out


def _descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # "pid (comm) state ppid ...": comm may hold spaces
    return False


@dataclass(frozen=True)
class CpuSample:
    """Machine-wide CPU seconds since boot (/proc/stat) and this benchmark's own."""

    busy_s: float  # every core's busy time, steal excluded
    steal_s: float  # time the hypervisor ran something else while a core wanted to run
    own_s: float  # this process and every descendant it has reaped (torchrun, ranks, pytest)
    at: float

    @classmethod
    def now(cls) -> CpuSample:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[:8])
        tick = os.sysconf("SC_CLK_TCK")
        t = os.times()
        return cls((user + nice + system + irq + softirq) / tick, steal / tick,
                   t.user + t.system + t.children_user + t.children_system, time.monotonic())

    def load_since(self, before: CpuSample) -> tuple[float, float]:
        """(other processes, steal) between the two samples, in cores' worth on average."""
        wall = max(1e-6, self.at - before.at)
        others = (self.busy_s - before.busy_s) - (self.own_s - before.own_s)
        return max(0.0, others) / wall, max(0.0, self.steal_s - before.steal_s) / wall


class Watch(threading.Thread):
    """What else ran during a launch (2 cores: anything else changes the figures).

    ``others_load``: machine-wide busy CPU time minus this benchmark's own (its reaped children
    included), i.e. what other processes took, in cores; ``steal_load``: CPU time the hypervisor
    gave to other machines while this one wanted it; ``seen``: other sessions' rank programs,
    looked for every few seconds.
    """

    def __init__(self, every_s: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.every_s = every_s
        self.seen: list[int] = []
        self._done = threading.Event()
        self.started_at = 0.0
        self.others_load = 0.0
        self.steal_load = 0.0

    def __enter__(self) -> Watch:
        self.started_at = time.monotonic()
        self._before = CpuSample.now()
        self.seen = foreign_trainers()
        self.start()
        return self

    def run(self) -> None:
        while not self._done.wait(self.every_s):
            self.seen += [p for p in foreign_trainers() if p not in self.seen]

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()
        self.seen += [p for p in foreign_trainers() if p not in self.seen]
        self.others_load, self.steal_load = CpuSample.now().load_since(self._before)

    def findings(self) -> tuple[list[int], float, float]:
        """Run's last three fields."""
        return self.seen, self.others_load, self.steal_load


def _comparable(key: str, value: object) -> object:
    # The fabric entry is a record of the fabric; only its link rate shapes this workload (gloo on
    # CPU reads no NCCL variable, and the plugin points NCCL_SOCKET_IFNAME at the emulated NIC).
    if key == "fabric" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k != "nccl_env"}
    return value


def check_same_workload(plugin: Run, bare: Run) -> list[str]:
    """Differences between what the two launches trained (there should be none)."""
    if not plugin.result:
        return []  # read from JUnit only (run_plugin said so): nothing to compare with
    problems = []
    for key in sorted(set(plugin.config) | set(bare.config)):
        mine, theirs = _comparable(key, plugin.config.get(key)), _comparable(key, bare.config.get(key))
        if key not in ("result_path", "progress_path") and mine != theirs:
            problems.append(f"config {key}: plugin {plugin.config.get(key)!r} != bare {bare.config.get(key)!r}")
    for key in ("model", "world_size", "batch_size", "seq_len", "tokens_per_step", "attention", "dtype", "device"):
        if plugin.result.get(key) != bare.result.get(key):
            problems.append(f"{key}: plugin {plugin.result.get(key)!r} != bare {bare.result.get(key)!r}")
    if len(plugin.result.get("step_s", [])) != len(bare.result.get("step_s", [])):
        problems.append(f"measured steps: plugin {len(plugin.result['step_s'])} != bare {len(bare.result['step_s'])}")
    rate_p = plugin.result.get("fabric", {}).get("emulated_mbit")
    rate_b = bare.result.get("fabric", {}).get("emulated_mbit")
    if rate_p != rate_b:
        problems.append(f"link rate: plugin {rate_p} != bare {rate_b} Mbit/s")
    return problems


def spread(values: list[float]) -> float:
    """(max - min) / median, in percent."""
    return (max(values) - min(values)) / statistics.median(values) * 100 if len(values) > 1 else 0.0


# Above this many cores' worth of other processes' CPU time during a launch, its round is marked.
BUSY_LOAD = 0.1


def disturbed(run: Run) -> bool:
    return bool(run.foreign) or run.others_load > BUSY_LOAD or run.steal_load > BUSY_LOAD


def report(args: argparse.Namespace, plugin: list[Run], bare: list[Run]) -> None:
    med = statistics.median
    print()
    print(f"{args.model}, {args.nodes} nodes x {args.gpus_per_node}, fabric {args.fabric} "
          f"({the_fabric(args).emulated_mbit:g} Mbit/s), "
          f"{args.warmup_steps} warm-up + {args.steps} measured steps, {len(os.sched_getaffinity(0))} cores")
    header = ["round", "plugin tok/s", "bare tok/s", "plugin/bare", "plugin launch s", "bare launch s",
              "plugin total s", "bare total s", "others p/b", "steal p/b"]
    rows = []
    for i, (p, b) in enumerate(zip(plugin, bare), 1):
        rows.append([f"{i}{' *' if disturbed(p) or disturbed(b) else ''}",
                     f"{p.tokens_per_s:.1f}", f"{b.tokens_per_s:.1f}", f"{p.tokens_per_s / b.tokens_per_s:.3f}",
                     f"{p.launch_s:.1f}", f"{b.launch_s:.1f}", f"{p.total_s:.1f}", f"{b.total_s:.1f}",
                     f"{p.others_load:.2f}/{b.others_load:.2f}", f"{p.steal_load:.2f}/{b.steal_load:.2f}"])
    rows.append(["median", f"{med(r.tokens_per_s for r in plugin):.1f}", f"{med(r.tokens_per_s for r in bare):.1f}",
                 f"{med(r.tokens_per_s for r in plugin) / med(r.tokens_per_s for r in bare):.3f}",
                 f"{med(r.launch_s for r in plugin):.1f}", f"{med(r.launch_s for r in bare):.1f}",
                 f"{med(r.total_s for r in plugin):.1f}", f"{med(r.total_s for r in bare):.1f}", "", ""])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))

    ratio = med(r.tokens_per_s for r in plugin) / med(r.tokens_per_s for r in bare)
    spread_p, spread_b = spread([r.tokens_per_s for r in plugin]), spread([r.tokens_per_s for r in bare])
    paired = [p.tokens_per_s / b.tokens_per_s for p, b in zip(plugin, bare)]
    print()
    print(f"ratio plugin/bare of the medians: {ratio:.3f} ({(ratio - 1) * 100:+.1f}%); "
          f"round-to-round spread (max-min)/median: plugin {spread_p:.1f}%, bare {spread_b:.1f}%")
    print(f"median of the per-round ratios (each plugin launch against the bare launch right after it): "
          f"{med(paired):.3f} ({(med(paired) - 1) * 100:+.1f}%), range {min(paired):.3f} .. {max(paired):.3f}")
    if len(paired) > 1:
        if min(paired) <= 1.0 <= max(paired):
            print("the per-round ratios lie on both sides of 1.000: no difference is measurable at this noise")
        else:
            side = "faster" if min(paired) > 1.0 else "slower"
            print(f"the plugin side was {side} in every round")
    clean = [(p, b) for p, b in zip(plugin, bare) if not (disturbed(p) or disturbed(b))]
    if clean and len(clean) < len(plugin):
        r_clean = med(p.tokens_per_s / b.tokens_per_s for p, b in clean)
        print(f"median per-round ratio over the {len(clean)} unmarked round(s) only: {r_clean:.3f} "
              f"({(r_clean - 1) * 100:+.1f}%)")
    elif not clean:
        print("every round is marked *: these figures measure the other load as much as the harness")
    launch = med(r.launch_s for r in plugin) - med(r.launch_s for r in bare)
    print(f"wall-clock per launch (medians): plugin {med(r.total_s for r in plugin):.1f}s "
          f"(torchrun {med(r.launch_s for r in plugin):.1f}s), bare {med(r.total_s for r in bare):.1f}s "
          f"(torchrun {med(r.launch_s for r in bare):.1f}s): {launch:+.1f}s in the torchrun part")
    print("launch s: torchrun processes started -> all exited (plugin: result.launch_s); total s: plugin = the "
          "whole pytest process, bare = network up + launch + network down; others / steal: cores' worth of "
          "CPU time other processes on this machine / the hypervisor took during the launch")
    if any(disturbed(r) for r in plugin + bare):
        print(f"* other processes or the hypervisor took more than {BUSY_LOAD} core on average, or another "
              "session's ranks ran, during this round: its figures measure contention too")


def wait_for_quiet(max_s: float, sample_s: float = 3.0) -> None:
    """Wait (at most ``max_s``) until other processes leave the cores alone."""
    deadline = time.monotonic() + max_s
    said = False
    while True:
        before = CpuSample.now()
        time.sleep(sample_s)
        # Steal is not looked at: it accrues only while this machine has work to run, so an idle
        # machine never shows it; the launches report it instead.
        others, _ = CpuSample.now().load_since(before)
        if others <= BUSY_LOAD and not foreign_trainers():
            return
        if time.monotonic() > deadline:
            print(f"(other processes still use {others:.2f} cores after {max_s:g}s; going on)", end=" ", flush=True)
            return
        if not said:
            print(f"(waiting for the machine to go quiet: other processes use {others:.2f} cores)",
                  end=" ", flush=True)
            said = True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="plugin+bare pairs, interleaved (default 3)")
    parser.add_argument("--model", default="qwen2-tiny", choices=list(MODELS), help="default qwen2-tiny")
    parser.add_argument("--nodes", type=int, default=2, help="emulated nodes (default 2)")
    parser.add_argument("--gpus-per-node", type=int, default=1, help="ranks per node (default 1)")
    parser.add_argument("--fabric", default="eth", choices=list(FABRICS), help="default eth")
    parser.add_argument("--rate", type=float, default=None, help="override the fabric's emulated Mbit/s")
    parser.add_argument("--steps", type=int, default=_DEFAULTS.steps, help=f"default {_DEFAULTS.steps}")
    parser.add_argument("--warmup-steps", type=int, default=_DEFAULTS.warmup_steps,
                        help=f"default {_DEFAULTS.warmup_steps}")
    parser.add_argument("--timeout", type=float, default=_DEFAULTS.launch_timeout_s,
                        help=f"seconds per launch (default {_DEFAULTS.launch_timeout_s:g})")
    parser.add_argument("--wait-idle", type=float, default=300, metavar="S",
                        help="before each launch, wait up to S seconds for other processes to leave the "
                             "cores alone (default 300; 0: do not wait)")
    parser.add_argument("--keep", action="store_true", help="keep configs, logs and results (the path is printed)")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.nodes < 1 or args.gpus_per_node < 1 or args.steps < 1 or args.warmup_steps < 0:
        parser.error("--rounds, --nodes, --gpus-per-node and --steps must be >= 1, --warmup-steps >= 0")
    if not get_model(args.model).cpu_sized:
        print(f"warning: {args.model} is not CPU-sized; on this machine it may not fit or finish", file=sys.stderr)

    # SIGTERM (a CI job cancelled, `timeout`) unwinds like Ctrl-C: ranks killed, namespaces removed.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        check_available()
    except Exception as exc:  # ClusterUnavailable: no root, no iproute2
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    if foreign_trainers():
        print("warning: another session's training processes are running on this machine; "
              "rounds they overlap are marked *", file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="bench-plugin-overhead-"))
    plugin: list[Run] = []
    bare: list[Run] = []
    started = time.monotonic()
    status = 0
    try:
        for i in range(1, args.rounds + 1):
            for side, runner, runs in (("plugin", run_plugin, plugin), ("bare", run_bare, bare)):
                print(f"round {i}/{args.rounds}: {side} ...", end=" ", flush=True)
                if args.wait_idle:
                    wait_for_quiet(args.wait_idle)
                run = runner(args, work, i)
                runs.append(run)
                print(f"{run.tokens_per_s:.1f} tokens/s (launch {run.launch_s:.1f}s, total {run.total_s:.1f}s, "
                      f"others {run.others_load:.2f} cores, steal {run.steal_load:.2f}"
                      + (", another session's ranks ran)" if run.foreign else ")"), flush=True)
            for problem in check_same_workload(plugin[-1], bare[-1]):
                print(f"error: the two sides trained different workloads: {problem}", file=sys.stderr)
                status = 1
    except BenchError as exc:
        print(f"\nfailed: {exc}", file=sys.stderr)
        status = 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        status = 130
    finally:
        # EmulatedNetwork removes its namespaces on every exit path; say so rather than assume it.
        left = [ns for pid in (os.getpid(), *LAUNCHER_PIDS) for ns in owned_namespaces(pid)]
        if left:
            print(f"error: namespaces left behind: {', '.join(left)}", file=sys.stderr)
            status = status or 1
        if args.keep:
            print(f"configs, logs and results kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    n = min(len(plugin), len(bare))
    if n:
        report(args, plugin[:n], bare[:n])
    remaining = [line.split()[0] for line in
                 subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.splitlines()
                 if line.strip()]
    print(f"network namespaces left by this benchmark: {', '.join(left) or 'none'}; "
          f"`ip netns list` now (other sessions' included): {', '.join(remaining) or 'empty'}")
    print(f"benchmark wall-clock: {time.monotonic() - started:.0f}s")
    return status


if __name__ == "__main__":
    sys.exit(main())
