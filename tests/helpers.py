"""Helpers the test modules share (plain functions; the fixtures live in conftest.py), and the builders
every test module takes from here, never from another test module: store records in the shape the
rank programs write them, measurements read as the Measurer reads them, saved nights and JUnit text
as the plugin writes them, a gate's outcome, the command run in-process, a stand-in cluster."""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import textwrap
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path

from pytest_fabric.core.case import Case
from pytest_fabric.cli import main
from pytest_fabric.cluster import Cluster, LaunchRequest
from pytest_fabric.cluster.supervisor import LaunchOutcome, ProcOutcome
from pytest_fabric.deciding.gates import GateOutcome
from pytest_fabric.history.junit import suite_properties
from pytest_fabric.history.junit import testcase_text as text_of  # not collected as a test
from pytest_fabric.measuring.measurement import BandwidthMeasurement, Measurement
from pytest_fabric.history.night_files import load_results
from pytest_fabric.history.nights import save_results
from pytest_fabric.deciding.contrasts import Interval, NoisePrior, Verdict
from pytest_fabric.workload.config import TrainConfig
from pytest_fabric.workload.result import (CollectiveRow, CollectivesResult, StepSignals, TrainResult,
                                           write_result)

REPO = Path(__file__).resolve().parents[1]

# The cheapest real launch: the compute-light CPU model, one measured step (no adaptive measuring),
# a short sequence.
FAST_LAUNCH = [
    "--models", "qwen2-tiny",
    "--steps", "1",
    "--measure-seconds", "0",
    "--warmup-steps", "0",
    "--batch-size", "1",
    "--seq-len", "64",
    "--launch-timeout", "180",
]


def needs(unavailable: str | None) -> None:
    """Skip this test, saying what is missing, where this machine cannot run it (no root, no
    namespaces, no Slurm or sshd); under CI (``CI`` set) fail instead: ``.ci/run`` installs all of
    it, so a skip there would hide that the test never ran."""
    if unavailable is None:
        return
    import pytest

    if os.environ.get("CI"):
        pytest.fail(f"CI must run this test, but this machine cannot: {unavailable}", pytrace=False)
    pytest.skip(unavailable)


def namespaces() -> set[str]:
    """Network namespaces on this machine (none where iproute2 is missing)."""
    if shutil.which("ip") is None:
        return set()
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def owner_alive(netns: str) -> bool:
    """Emulated namespaces are named ``pf<pid>-...`` after the harness process that made them;
    True when that process is alive and is not this one."""
    match = re.match(r"pf(\d+)-", netns)
    return bool(match) and int(match.group(1)) != os.getpid() and os.path.exists(f"/proc/{match.group(1)}")


def session_directory(output: str) -> Path:
    """The session's results directory, as the terminal summary prints it."""
    match = re.search(r"launch logs and results: (\S+)", output)
    assert match, "the terminal summary names no results directory"
    return Path(match.group(1))


def junit_schema_path() -> Path:
    """The Jenkins junit-10.xsd: the shared copy beside the repository (as CI checks it out), else
    the copy in fixtures/."""
    shared = Path(__file__).resolve().parents[2] / "shared" / "schemas" / "junit-10.xsd"
    return shared if shared.is_file() else REPO / "fixtures" / "junit-10.xsd"


def assert_valid_junit(schema, path: Path) -> None:
    from lxml import etree

    doc = etree.parse(str(path))
    assert schema.validate(doc), f"{path} does not validate against junit-10.xsd:\n{schema.error_log}"


def emulated_unavailable() -> str | None:
    """Why the emulated cluster cannot run on this machine; None where it can."""
    from pytest_fabric.cluster import ClusterUnavailable
    from pytest_fabric.cluster.emulated import check_available

    try:
        check_available()
    except ClusterUnavailable as exc:
        return str(exc)
    return None


# The launch recorded on one H200 (fixtures/gpu/README.md): qwen2.5-1.5b, FSDP2 bf16, 8 x 2048, one rank.
GPU_RESULT = REPO / "fixtures" / "gpu" / "result-qwen2.5-1.5b-b8-fsdp2-h200.json"
GPU_PEAK = "H200 SXM 989 TFLOP/s dense bf16"  # the peak its MFU is taken against, as every output names it


def gpu_record(fabric: str = "eth") -> dict:
    """The recorded H200 result as a session store's record of a one-node launch measured for ``fabric``."""
    import json

    return {"case": {"model": "qwen2.5-1.5b", "nodes": 1, "fabric": fabric}, "cluster": "local",
            "result": json.loads(GPU_RESULT.read_text())}


def gpu_measurement(fabric: str = "eth"):
    """The recorded H200 launch as the Measurer reads it."""
    from pytest_fabric import Case, Measurement

    return Measurement.from_record(Case("qwen2.5-1.5b", 1, fabric), gpu_record(fabric))


def gpu_expected() -> tuple[float, float]:
    """(MFU, peak memory per rank in GiB) of the recorded H200 launch, from its raw figures: FLOPs per
    token x the launch's tokens/s over the 989 TFLOP/s peak of one GPU; its allocator's peak."""
    m = gpu_measurement()
    return m.result.flops_for_mfu() * m.tokens_per_s / 989e12, m.result.peak_memory_bytes / 2**30


# -- Store records and night files as the rank programs and the plugin write them (result version 2) ---


# The versions a launch records (TRAIN_VERSIONS) and those of session_store's night.
TRAIN_VERSIONS = {"torch": "2.13.0", "nccl": None, "python": "3.11.7"}


VERSIONS = {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.23.0", "backend": "gloo",
            "nccl": None, "cuda": None}


DISTURBANCE = "cpu steal 40 ms"


# The fields of a training result that stores written before result version 2 held (with the hosts
# under "nodes" and the rank's own derived figures).


def train_record(case: Case, tokens_per_s: float, *, gpus_per_node: int = 1, steps: int = 4,
                 disturbed: int = 0, tokens_per_step: int | None = None, cluster: str = "emulated",
                 versions: dict | None = None, lost: float = 0.0, addresses: bool = False,
                 **result_fields) -> dict:
    """A store record (``{"case", "cluster", "result"}``) of one training launch of ``case`` whose
    ``steps`` measured steps all take the time that gives ``tokens_per_s``; the last ``disturbed``
    of them carry a disturbance flag (more than half: the launch is disturbed as a whole), and other
    processes took ``lost`` of each of their step's time. ``addresses``: hosts named with their
    addresses (``node0/198.18.0.1``), as the emulated cluster's saved nights hold them."""
    world = case.nodes * gpus_per_node
    tokens_per_step = tokens_per_step or 64 * world
    step = tokens_per_step / tokens_per_s
    flags = [""] * (steps - disturbed) + [DISTURBANCE] * disturbed
    fields = dict(
        model=case.model, world_size=world,
        hosts=[f"node{i}/198.18.0.{i + 1}" if addresses else f"node{i}" for i in range(case.nodes)],
        local_world_size=gpus_per_node, batch_size=1, seq_len=64, tokens_per_step=tokens_per_step,
        step_s=[step] * steps, warmup_step_s=[step * 3],
        signals=StepSignals(disturbed=flags, foreign_s=[step * lost if f else 0.0 for f in flags],
                            steal_s=[0.0] * steps) if disturbed else StepSignals(),
        stopped="time cap", versions=dict(TRAIN_VERSIONS if versions is None else versions),
        fabric={"name": case.fabric, "emulated_mbit": 2000, "nccl_env": {}, "crosses_fabric": case.crosses_fabric},
        cluster="emulated (network namespaces on this machine)")
    result = TrainResult(**{**fields, **result_fields}).to_dict()  # result_fields: any other TrainResult field
    return {"case": asdict(case), "cluster": cluster, "result": result}


def bandwidth_record(nodes: int, fabric: str, gbit: float, *, versions: dict | None = None) -> dict:
    """A store record of one collective-bandwidth launch on ``nodes`` nodes whose busbw is ``gbit``
    Gbit/s at the largest payload (16 MiB) and half that at 1 MiB, over the emulated link of ``fabric``."""
    rows = []
    for op in ("all_reduce", "all_gather"):
        for size, scale in ((1 << 20, 0.5), (16 << 20, 1.0)):
            busbw = gbit / 8 * scale
            rows.append(CollectiveRow(op, size, size / (busbw * 1e9), busbw, busbw))
    result = CollectivesResult(world_size=nodes, rows=rows,
                               versions=dict(TRAIN_VERSIONS if versions is None else versions),
                               fabric={"name": fabric, "emulated_mbit": {"ib": 2000.0, "eth": 400.0}[fabric],
                                       "nccl_env": {}, "crosses_fabric": True})
    return {"case": asdict(Case("collectives", nodes, fabric)), "cluster": "emulated", "result": result.to_dict()}


# The launches of qwen2-tiny on two nodes in session_store (tokens/s, in launch order).
IB_LAUNCHES = (1800.0, 1820.0, 1790.0)


ETH_LAUNCHES = (1700.0, 1690.0, 1710.0)


def geomean(values) -> float:
    """A configuration's value from its launches: their geometric mean (computed here, not by the package)."""
    return statistics.geometric_mean(values)


def session_store(scale: float = 1.0, versions: dict | None = None) -> dict:
    """A two-fabric, two-model session: repeated launches on two nodes, a shared single-node launch,
    collective bandwidth and one failed launch, as the emulated cluster records them (hosts with their
    addresses, ``VERSIONS`` unless ``versions``)."""

    def record(model: str, nodes: int, fabric: str, tokens_per_s: float) -> dict:
        return train_record(Case(model, nodes, fabric), tokens_per_s * scale, addresses=True,
                            versions=versions or VERSIONS)

    store = {"qwen2-tiny-n1-any#aaaa": record("qwen2-tiny", 1, "ib", 1000)}
    for i, (ib, eth) in enumerate(zip(IB_LAUNCHES, ETH_LAUNCHES)):
        suffix = f"@{i}" if i else ""
        store[f"qwen2-tiny-n2-ib#bbbb{suffix}"] = record("qwen2-tiny", 2, "ib", ib)
        store[f"qwen2-tiny-n2-eth#cccc{suffix}"] = record("qwen2-tiny", 2, "eth", eth)
    store["llama-wide-n2-ib#dddd"] = record("llama-wide", 2, "ib", 230)
    store["llama-wide-n2-eth#eeee"] = record("llama-wide", 2, "eth", 43)
    store["collectives-n2-ib#ffff"] = bandwidth_record(2, "ib", 1.8, versions=VERSIONS)
    store["collectives-n2-eth#gggg"] = bandwidth_record(2, "eth", 0.36, versions=VERSIONS)
    store["llama-wide-n1-any#hhhh"] = {"case": {"model": "llama-wide", "nodes": 1, "fabric": "ib"},
                                       "error": "llama-wide-n1-ib on the emulated cluster: rank 0 exited 1\nTraceback"}
    return store


IDENTITY = {"cluster_kind": "emulated", "nodes": 2, "gpus_per_node": 1, "fabrics": ["ib", "eth"]}


VERDICTS = [{"test": "suites/test_parity.py::test_parity[qwen2-tiny-n2-eth]", "outcome": "pass",
             "message": "pass: eth/ib = 0.941 ..."}]


def saved(tmp_path: Path, name: str = "night.json", **kw) -> Path:
    path = tmp_path / name
    save_results(path, session_store(**kw), IDENTITY, VERDICTS)
    return path


def nights(tmp_path: Path, scales: list[float], versions: list[dict] | None = None) -> list[Path]:
    paths = []
    for i, scale in enumerate(scales):
        path = tmp_path / f"night{i}.json"
        save_results(path, session_store(scale, versions[i] if versions else None),
                     {**IDENTITY, "created": f"2026-11-{10 + i:02d}T02:00:00+00:00"}, [])
        paths.append(path)
    return paths


def junit_text(store: dict, failing: str | None = None) -> str:
    """JUnit XML whose testcases carry system-out exactly as the plugin writes it."""
    from xml.sax.saxutils import escape, quoteattr

    def measured(key: str, fabric: str | None = None) -> Measurement:
        case = Case(**store[key]["case"])
        return Measurement.from_record(case.with_fabric(fabric or case.fabric), store[key])

    parity = [measured(k) for k in ("qwen2-tiny-n2-ib#bbbb", "qwen2-tiny-n2-ib#bbbb@1", "qwen2-tiny-n2-ib#bbbb@2",
                                    "qwen2-tiny-n2-eth#cccc", "qwen2-tiny-n2-eth#cccc@1", "qwen2-tiny-n2-eth#cccc@2")]
    cases = [
        ("test_parity[qwen2-tiny-n2-eth]", text_of(parity, outcomes=[outcome()]), None),
        ("test_single[qwen2-tiny-n1-eth]", text_of([measured("qwen2-tiny-n1-any#aaaa", "eth")]), None),
        ("test_advantage[llama-wide-n2-eth]",
         text_of([measured("llama-wide-n2-ib#dddd"), measured("llama-wide-n2-eth#eeee")]),
         "interval wholly below the threshold: ib/eth = 5.3"),
        ("test_busbw[collectives-n2-eth]",
         text_of([BandwidthMeasurement.from_record(store["collectives-n2-eth#gggg"])]), None),
        ("test_unrelated", "", None),
    ]
    # The suite properties over every launch of the run, as the plugin writes them.
    everything = [*parity, measured("qwen2-tiny-n1-any#aaaa", "eth"), measured("llama-wide-n2-ib#dddd"),
                  measured("llama-wide-n2-eth#eeee"), BandwidthMeasurement.from_record(store["collectives-n2-eth#gggg"])]
    props = {k: v for k, v in suite_properties(everything, {}).items()
             if not k.startswith(("fabric.version.", "fabric.attention", "fabric.device"))}
    body = []
    for name, out, failure in cases:
        fail = f"<failure message={quoteattr(failure)}>details</failure>" if failure else ""
        sysout = f"<system-out>{escape(out)}</system-out>" if out else ""
        body.append(f'<testcase classname="suites.test_x" name={quoteattr(name)} time="1.5">{fail}{sysout}</testcase>')
    return (
        '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
        '<testsuite name="pytest" errors="0" failures="1" skipped="0" tests="5" time="7.5" '
        'timestamp="2026-11-22T23:05:39.123456+00:00" hostname="vm"><properties>'
        '<property name="fabric.cluster" value="emulated (network namespaces on this machine)"/>'
        '<property name="fabric.fabrics" value="ib,eth"/>'
        '<property name="fabric.version.torch" value="2.13.0+cpu"/>'
        '<property name="fabric.attention" value="sdpa"/>'
        + "".join(f"<property name={quoteattr(k)} value={quoteattr(v)}/>" for k, v in props.items()) + "</properties>"
        + "".join(body) + "</testsuite></testsuites>")


def gpu_night(path: Path):
    """A night of the H200 launch recorded on hardware (fixtures/gpu), saved and read back."""
    save_results(path, {"qwen2.5-1.5b-n1-any#aaaa": gpu_record("eth")}, {"fabrics": ["eth"]})
    return load_results(path)


# -- Measurements read as the Measurer reads its records, and a gate's outcome -----------------------


def train_measurement(model: str, nodes: int, fabric: str, tokens_per_s: float, *, launch: int = 0,
                      shared_with: str | None = None, **record) -> Measurement:
    """Launch ``launch`` of (model, nodes, fabric) at ``tokens_per_s``, read as the Measurer reads its
    records (``shared_with``: a one-node launch measured for that fabric and serving this one)."""
    case = Case(model, nodes, fabric)
    measured_for = case.with_fabric(shared_with) if shared_with else case
    return Measurement.from_record(case, train_record(measured_for, tokens_per_s, **record), launch)


def bandwidth_measurement(nodes: int, fabric: str, gbit: float, **record) -> BandwidthMeasurement:
    """That launch read as the Measurer reads its records."""
    return BandwidthMeasurement.from_record(bandwidth_record(nodes, fabric, gbit, **record))


def outcome(verdict: Verdict = Verdict.PASS, reruns: tuple[str, ...] = ()) -> GateOutcome:
    interval = Interval(low=0.962, point=0.981, high=1.0013, confidence=0.9875, df=8.0, sigma=0.0158,
                        launches=(3, 4), noise_note="learned from 3 nights, pooled with tonight's 4 df", data_df=4,
                        source="learned from 3 nights")
    return GateOutcome("eth", "ib", 0.95, "eth at most 5% slower", interval, verdict, (981.0, 1000.0), "tokens/s",
                       "[m, 2 node(s)]", NoisePrior(0.02, 4.0, "learned from 3 nights"), reruns)


# -- Synthetic samples for the statistics' tests (deciding/) -----------------------------------------


def lognormal(median: float, sigma: float, n: int, rng: random.Random) -> list[float]:
    return [rng.lognormvariate(math.log(median), sigma) for _ in range(n)]


def side(values: list[float], within: float = 0.0) -> list[tuple[float, float]]:
    """Launch values (tokens/s) as a contrast group's (log value, within-launch variance) pairs."""
    return [(math.log(v), within) for v in values]


# -- The pytest-fabric command, in-process -----------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's own exits (usage errors, --help)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *expected: str) -> None:
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for text in expected:
        assert text in err


# -- A suite whose gates are decided without launches ------------------------------------------------


# A suite whose gates are decided without launches: the verdict comes from the parameter.
GATE_SUITE = """
    import pytest
    from pytest_fabric.deciding.gates import apply_verdict
    from pytest_fabric.running.session import OUTCOMES_KEY
    from pytest_fabric.deciding.contrasts import Verdict
    from helpers import outcome

    @pytest.fixture
    def decide(request, fabric_session):
        def run(verdict):
            gate = outcome(Verdict(verdict))
            request.node.stash.setdefault(OUTCOMES_KEY, []).append(gate)
            apply_verdict(gate, fabric_session.options.inconclusive)
        return run

    @pytest.mark.parametrize("verdict", {verdicts})
    def test_gate(decide, verdict):
        decide(verdict)

    @pytest.mark.fabric_regression
    def test_regression():
        pass

    def test_broken_setup(missing_fixture):
        pass
"""


def run_gates(pytester, verdicts, *args):
    pytester.makepyfile(test_night_gates=textwrap.dedent(GATE_SUITE.format(verdicts=list(verdicts))))
    xml = pytester.path / "night.xml"
    result = pytester.runpytest("test_night_gates.py", "-v", f"--junitxml={xml}", "-o", "junit_family=xunit2",
                                "--fabric-save", str(pytester.path / "night.json"), *args)
    return result, xml


# -- A stand-in cluster ------------------------------------------------------------------------------


class FakeCluster(Cluster):
    """Writes the result the rank program would write (or fails as asked), recording each request."""

    name = "fake"
    realizes_fabrics = True
    checks_here = False

    def __init__(self, fail_with: str | None = None, write_result: bool = True) -> None:
        self.requests: list[LaunchRequest] = []
        self.fail_with = fail_with
        self.write_result = write_result

    def max_nodes(self) -> int:
        return 8

    def launch(self, request, on_tick=None):
        self.requests.append(request)
        config = TrainConfig.load(request.program[request.program.index("--config") + 1])
        log = request.workdir / "node0.log"
        if self.fail_with:
            log.write_text("starting\n" + self.fail_with + "\n")
            return LaunchOutcome([ProcOutcome("node0", 1, log)], elapsed_s=0.1)
        log.write_text("ok\n")
        world = request.nodes * request.procs_per_node
        tokens = config.batch_size * config.seq_len * world
        if self.write_result:
            # What the rank program writes (workload/train.py): its typed result, every step 0.5 s.
            write_result(TrainResult(
                model=config.model["name"], world_size=world, hosts=[f"node{i}" for i in range(request.nodes)],
                local_world_size=request.procs_per_node, batch_size=config.batch_size, seq_len=config.seq_len,
                tokens_per_step=tokens, step_s=[0.5] * config.steps, warmup_step_s=[0.9] * config.warmup_steps,
                signals=StepSignals(disturbed=[""] * config.steps), stopped="precision", fabric=config.fabric,
            ), config.result_path)
        return LaunchOutcome([ProcOutcome(f"node{i}", 0, log) for i in range(request.nodes)], elapsed_s=0.1)


def interrupt_when(proc: subprocess.Popen, ready, sig: int, what: str, within_s: float,
                   timeout_s: float) -> tuple[str, float]:
    """Send ``sig`` to the pytest subprocess ``proc`` once ``ready()`` holds (polled every 0.5 s, for
    at most ``within_s``; the test fails saying ``what`` never happened): its output, and the seconds
    it took to stop. A run that does not stop is killed with its process group and its namespaces
    swept, so that the failure stays the calling test's alone."""
    import pytest

    from pytest_fabric.cluster.emulated import sweep_stale_namespaces

    try:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if ready():
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.5)
        else:
            pytest.fail(what)
        sent = time.monotonic()
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=timeout_s)
        return out.decode(errors="replace"), time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            sweep_stale_namespaces()


# A planted straggler (issue 33): the test's own sitecustomize, on the ranks' PYTHONPATH, makes chosen
# global ranks do ``extra`` more CPU work per step with a busy loop before each optimizer step (as a
# throttled GPU or a shared core would), with no option or variable of the harness.
_SLOW_RANK_SITE = '''
import os, sys, threading, time

def _plant():
    # Once torch.optim is imported, a global optimizer pre-hook spins for EXTRA x the CPU time the
    # rank's main thread (the one that computes) spent since the last spin ended.
    while "torch.optim.optimizer" not in sys.modules:
        time.sleep(0.01)
    import torch.optim.optimizer as optimizer
    last = [time.thread_time()]

    def spin(opt, args, kwargs):
        start = time.thread_time()
        until = start + EXTRA * (start - last[0])
        while time.thread_time() < until:
            pass
        last[0] = time.thread_time()

    optimizer.register_optimizer_step_pre_hook(spin)

with open("/proc/self/cmdline", "rb") as f:
    rank_program = b"pytest_fabric.workload.train" in f.read()
if os.environ.get("RANK") in {str(r) for r in RANKS} and rank_program:
    threading.Thread(target=_plant, daemon=True).start()
'''


def slow_rank_site(directory: Path, ranks: int | Iterable[int], extra: float = 0.3) -> Path:
    """A directory whose sitecustomize makes global rank ``ranks`` (one or several) work ``extra``
    longer per step: put it on PYTHONPATH (the ranks inherit it)."""
    directory.mkdir(parents=True, exist_ok=True)
    chosen = sorted({ranks} if isinstance(ranks, int) else set(ranks))
    (directory / "sitecustomize.py").write_text(f"RANKS = {chosen}\nEXTRA = {extra}\n" + _SLOW_RANK_SITE)
    return directory
