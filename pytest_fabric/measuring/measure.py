"""Measuring one (model, nodes, fabric) configuration, once per session.

A ``Measurer`` turns a ``Case`` into a ``Measurement``: it writes the rank program's config, asks
the cluster to launch it, reads the JSON result, and caches the record in the session's
``ResultStore`` so that every test (and every xdist worker) comparing against the same
configuration reuses one launch. A failed launch is cached too: the tests that need it fail at once
with the same report instead of waiting out the same deadline again.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock, Timeout

from ..deciding.rounds import back_to_back
from ..physics import memory
from . import preflight
from ..core.case import BANDWIDTH, Case
from ..cluster import Cluster, ClusterUnavailable, LaunchRequest
from ..cluster.base import OnThisMachine
from ..core.fabrics import Fabric, get_fabric
from ..core.models import get_model
from .measurement import (BandwidthMeasurement, LaunchKey, LaunchRecord, Measurement, MeasurementError,
                          block_name)
from ..core.storage import is_storage_error, storage_problem
from .store import ResultStore
from .launch_time import launch_breakdown, read_marks
from .nccl_evidence import prove_transport
from .nccl_logs import nccl_debug_env
from .nic_inventory import NicInventory
from ..workload import faults
from ..workload.compile_cache import cache_env
from ..workload.config import CollectivesConfig, TrainConfig
from ..workload.result import CollectivesResult, TrainResult


# The process groups' own timeout when --collective-timeout is not given: a third of the launch
# deadline, at most this. A hung collective then fails in its rank, with an error naming it, and the
# launch ends (every rank's stack and flight recorder collected) long before the deadline.
DEFAULT_COLLECTIVE_TIMEOUT_S = 120.0

# Launches that must fail first on one node before it is left out for the session (_node_failed).
NODE_FAILURES = 2


@dataclass(frozen=True)
class LaunchSettings:
    """Everything besides the case that decides what a launch measures."""

    gpus_per_node: int = 1
    steps: int = 10  # measured steps at least
    warmup_steps: int = 2
    # Then measuring goes on until `measure_s` seconds of measured steps (0: exactly `steps` steps),
    # at most `max_steps` steps: one window for every launch, fixed before it starts.
    measure_s: float = 6.0
    max_steps: int = 200
    batch_size: int | None = None  # None: the model's own default shape
    seq_len: int | None = None
    launch_timeout_s: float = 300.0
    # Seconds one collective may wait (the process groups' timeout), below launch_timeout_s;
    # None: collective_timeout() derives it from the deadline.
    collective_timeout_s: float | None = None
    # The session's fabrics (presets + user definitions and overrides); None: the presets.
    fabric_table: Mapping[str, Fabric] | None = field(default=None, compare=False)
    device: str = "auto"
    fsdp: int = 2
    mixed_precision: str = "auto"
    reduce_dtype: str = "fp32"  # workload/config.REDUCE_DTYPES
    grad_accum: int = 1  # micro-batches per optimizer step
    activation_checkpointing: bool = False
    compile: str = "auto"  # per-block torch.compile: "auto" (on GPUs), "on", "off"
    # GPU memory per rank in bytes for the pre-launch memory check (--gpu-memory); None: what
    # nvidia-smi reports here where ranks run on this machine's GPUs, else no check.
    gpu_memory_bytes: float | None = field(default=None, compare=False)
    model_path: str | None = None
    # The transport proof: GPUDirect RDMA required on RDMA fabrics; NICs each node has, by fabric
    # (ini fabric_inventory; a fabric not listed is compared with what its nodes' sysfs shows).
    require_gdr: bool = True
    inventory: Mapping[str, NicInventory] = field(default_factory=dict, compare=False)

    def workload_knobs(self) -> dict[str, Any]:
        """The TrainConfig fields these settings decide (beyond model and shape)."""
        return {"device": self.device, "fsdp": self.fsdp, "mixed_precision": self.mixed_precision,
                "reduce_dtype": self.reduce_dtype, "grad_accum": self.grad_accum,
                "activation_checkpointing": self.activation_checkpointing, "compile": self.compile,
                "model_path": self.model_path,
                "steps": self.steps, "warmup_steps": self.warmup_steps, "max_steps": self.max_steps,
                "measure_s": self.measure_s}

    def fabric(self, name: str) -> Fabric:
        return get_fabric(name, self.fabric_table)

    def collective_timeout(self) -> float:
        """The ranks' process-group timeout: the user's, else a third of the launch deadline, at
        most DEFAULT_COLLECTIVE_TIMEOUT_S."""
        if self.collective_timeout_s is not None:
            return self.collective_timeout_s
        return round(min(DEFAULT_COLLECTIVE_TIMEOUT_S, self.launch_timeout_s / 3), 1)

    def measuring(self) -> str:
        """How long a launch measures, in words (the session's header line)."""
        if not self.measure_s:
            return f"{self.steps} measured steps"
        return (f"at least {self.steps} measured steps, then until {self.measure_s:g} s of measured steps "
                f"(at most {self.max_steps} steps), the same window for every launch")

    def shape(self, model: str, ranks: int = 1) -> tuple[int, int]:
        """(batch, seq) per rank: the user's, else the model's default. A CPU-sized model has one
        shape; a real (GPU) model takes the largest of its GPU batches that fits an 80 GB GPU at
        ``ranks`` ranks (memory.default_gpu_shape)."""
        spec = get_model(model)
        if spec.cpu_sized or self.batch_size:
            return self.batch_size or spec.batch_size, self.seq_len or spec.seq_len
        return memory.default_gpu_shape(spec, ranks, self.activation_checkpointing, self.compile != "off",
                                        seq=self.seq_len)


Progress = Callable[[str], None]

def _timed(launch: Callable[[], LaunchRecord], clock: Callable[[], float]) -> dict[str, Any]:
    """``launch()``'s record, with when it ran on this harness's ``clock``."""
    started = clock()
    record = launch()
    return replace(record, started=round(started, 3), ended=round(clock(), 3)).to_dict()


def _span(stored: Any) -> tuple[float, float] | None:
    """When a stored launch ran, (started, ended); None where the record does not say."""
    try:
        started, ended = float(stored["started"]), float(stored["ended"])
    except (KeyError, TypeError, ValueError):
        return None
    return (started, ended) if ended >= started > 0 else None


class Measurer:
    def __init__(self, cluster: Cluster, settings: LaunchSettings, store: ResultStore, workdir: Path,
                 progress: Progress | None = None, progress_every_s: float = 3.0,
                 nodes: Sequence[preflight.NodeFacts] = ()) -> None:
        self.cluster = cluster
        self.settings = settings
        self.store = store
        self.workdir = workdir
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.launched: list[Case] = []  # what this process actually launched
        self.clock: Callable[[], float] = time.time  # when launches run (seconds since the epoch)
        # Pre-flight facts of the nodes launches run on: the healthy nodes of the session's node check
        # (measuring/nodes.py), or this host's, read at its first pre-flight where it is a node. The
        # inventory the transport proof compares NCCL's NICs with.
        self.nodes: list[preflight.NodeFacts] = list(nodes)
        # Launches whose ranks failed first on each node, by case, and who hears of a node left out for it.
        self._first_failures: dict[str, list[str]] = {}
        self.on_left_out: Callable[[str, str], None] | None = None
        # Where compiled graphs are kept for every launch (workload/compile_cache.py): the run
        # directory's compile-cache, on the storage every node shares; None: each node's default.
        self.compile_cache: Path | None = None

    def key(self, case: Case) -> str:
        """Cache key: the case plus every setting that changes the measurement."""
        s = self.settings
        batch, seq = s.shape(case.model, case.nodes * s.gpus_per_node)
        # One node never touches the fabric: any fabric's measurement serves all of them.
        fabric = case.fabric if case.crosses_fabric else "any"
        fabric_settings = s.fabric(case.fabric).settings() if case.crosses_fabric else None
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, batch, seq, fabric_settings, s.workload_knobs()],
                           sort_keys=True)
        return f"{Case(case.model, case.nodes, fabric, case.layout).id}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"

    def measure(self, case: Case, launch: int = 0, partners: Sequence[Case] = ()) -> Measurement:
        """Launch number ``launch`` (0, 1, ...) of ``case``: each is an independent launch, cached.

        ``partners``: the configurations the same round compares ``case`` with. A round's launches
        run back to back (``in_round``): a stored launch serves this round only where it ran next to
        the round's other launches. One measured for an earlier comparison (the reference every gate
        shares, minutes of other gates ago) is launched again for this round (key ``...+partners``),
        so that a drift of the machine between two gates never reads as a difference between the
        fabrics. Every launch measures the same window (``LaunchSettings.measure_s``)."""
        key = LaunchKey(self.key(case), launch)
        if partners:
            again = replace(key, block=block_name(partners))  # once launched again, it serves its round
            # Only a stored launch can have run apart from its round.
            if self.store.get(str(again)) is not None or (self.store.get(str(key)) is not None and not self.in_round(
                    key, [self._round_key(p, case, launch, partners) for p in partners])):
                key = again
        return Measurement.from_record(case, self._cached(case, str(key), lambda: self._launch(case)), launch)

    def _round_key(self, partner: Case, case: Case, launch: int, partners: Sequence[Case]) -> LaunchKey | None:
        """The stored launch ``partner`` measured for this round: the one it measured again for
        this round's cases where it did (``measure``), else its launch of that number; None where
        it has not launched yet this round."""
        others = [case, *(p for p in partners if p != partner)]
        key = LaunchKey(self.key(partner), launch)
        for candidate in (replace(key, block=block_name(others)), key):
            if self.store.get(str(candidate)) is not None:
                return candidate
        return None

    def in_round(self, key: LaunchKey, partner_keys: Sequence[LaunchKey | None]) -> bool:
        """Whether the stored launch ``key`` (if any) ran back to back with its round's other
        launches (``rounds.back_to_back``) or, where none has launched yet, with now (they launch
        next). A key not stored launches now, in the round; a record without
        times (kept before they were) is taken as it was."""
        stored = self.store.get(str(key))
        span = _span(stored)
        if span is None:
            return True
        spans = [s for k in partner_keys if k is not None and (s := _span(self.store.get(str(k)))) is not None]
        return back_to_back(span, spans, self.clock())

    def _cached(self, case: Case, key: str, launch: Callable[[], LaunchRecord]) -> LaunchRecord:
        """The store's record of ``key``, launched if absent; MeasurementError for a failed launch, and
        for a disk that cannot take the launch's files (one line saying what to do, storage.py)."""
        try:
            stored, _ = self.store.get_or_compute(key, lambda: _timed(launch, self.clock))
        except OSError as exc:
            if not is_storage_error(exc):
                raise
            raise MeasurementError(f"{case.id}: {storage_problem(exc, 'the launch files', self.workdir)}") from None
        record = LaunchRecord.from_dict(stored)  # as stored: secrets masked, as another worker may have written it
        if record.failed:
            raise MeasurementError(record.error)
        return record

    def _launch(self, case: Case) -> LaunchRecord:
        s = self.settings
        batch, seq = s.shape(case.model, case.nodes * s.gpus_per_node)
        if problem := self._memory_refusal(case, batch, seq):  # before launching, not a CUDA OOM mid-run
            return LaunchRecord.failure(case, problem)
        run_dir = self._run_dir(case)
        config = TrainConfig(
            model=get_model(case.model).to_dict(),
            batch_size=batch,
            seq_len=seq,
            result_path=str(run_dir / "result.json"),
            progress_path=str(run_dir / "progress.jsonl"),
            collective_timeout_s=s.collective_timeout(),
            **s.workload_knobs(),
            sharding=case.layout,
            fabric=self._fabric_record(case),
        )
        # Compiled graphs shared by every launch, node and night (workload/compile_cache.py).
        cache = cache_env(self.compile_cache) if self.compile_cache is not None else {}
        return self._run(case, "pytest_fabric.workload.train", config, run_dir, Path(config.progress_path), env=cache)

    def _memory_refusal(self, case: Case, batch: int, seq: int) -> str:
        """One line naming what to change when the shape cannot fit the GPU (memory.refusal); "" on
        CPU runs and where the GPU's memory is unknown."""
        s = self.settings
        gpu_bytes = s.gpu_memory_bytes
        if gpu_bytes is None and self.cluster.checks_here and self._runs_on_gpus():
            gpu_bytes = memory.local_gpu_bytes()
        if not gpu_bytes or s.device == "cpu":
            return ""
        problem = memory.refusal(get_model(case.model), batch, seq, case.nodes * s.gpus_per_node, gpu_bytes,
                                 s.activation_checkpointing, s.compile != "off",
                                 "fp32" if s.mixed_precision == "fp32" else "bf16")
        return f"{case.id}: {problem}" if problem else ""

    def measure_bandwidth(self, case: Case) -> BandwidthMeasurement:
        """Collective bandwidth over ``case``'s nodes and fabric (``case.model`` is ignored)."""
        case = Case(BANDWIDTH, case.nodes, case.fabric)
        s = self.settings
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, s.fabric(case.fabric).settings(), s.device],
                           sort_keys=True)
        key = f"{case.id}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"
        return BandwidthMeasurement.from_record(self._cached(case, key, lambda: self._launch_bandwidth(case)))

    def _launch_bandwidth(self, case: Case) -> LaunchRecord:
        run_dir = self._run_dir(case)
        config = CollectivesConfig(result_path=str(run_dir / "result.json"), device=self.settings.device,
                                   collective_timeout_s=self.settings.collective_timeout(),
                                   fabric=self._fabric_record(case))
        return self._run(case, "pytest_fabric.workload.collectives", config, run_dir, None)

    def _run_dir(self, case: Case) -> Path:
        """A fresh directory per launch (repeats of one case may start within the same second)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f"{case.id}-{time.strftime('%H%M%S')}-", dir=self.workdir))

    def _fabric_record(self, case: Case) -> dict[str, Any]:
        fabric = self.settings.fabric(case.fabric).for_launch(case.crosses_fabric)
        return {**fabric.settings(), "nccl_env": self.cluster.nccl_env(fabric), "crosses_fabric": case.crosses_fabric}

    def _run(self, case: Case, module: str, config: Any, run_dir: Path, progress_file: Path | None,
             kind: Any = None, env: dict[str, str] | None = None) -> LaunchRecord:
        """Launch ``module`` with ``config`` on ``case``'s nodes; a record with the result or the error
        (``kind``: the result's type, with ``from_dict``; default by the config's type)."""
        s = self.settings
        fabric = s.fabric(case.fabric)
        config.dump(run_dir / "config.json")
        nccl_logs = run_dir / "nccl"
        nccl_logs.mkdir(exist_ok=True)
        if self._runs_on_gpus() and (problems := self._preflight(case)):
            return LaunchRecord.failure(case, f"{case.id}: pre-flight failed: " + "; ".join(problems))
        inventory = self._inventory(case)
        request = LaunchRequest(
            nodes=case.nodes,
            procs_per_node=s.gpus_per_node,
            fabric=fabric.for_launch(case.crosses_fabric),  # one node: no transport selected
            program=["-m", module, "--config", str(run_dir / "config.json")],
            workdir=run_dir,
            deadline_s=s.launch_timeout_s,
            job_id=re.sub(r"[^A-Za-z0-9]", "", case.id)[:40] + str(int(time.time())),
            # NCCL's own logs are the proof of which transport ran (ignored by gloo on CPU); GRAPH
            # carries port speeds before NCCL 2.27, needed where a speed is declared.
            env={**nccl_debug_env(nccl_logs, graph=bool(inventory and inventory.gbit_per_nic)), **(env or {})},
            # Harness self-tests (workload/faults.py, checked by the plugin): a node that never joins.
            links_down=tuple(sorted(faults.nodes_left_out(faults.from_env(), fabric.name))),
            links_cut=tuple((i, Path(faults.cut_request(run_dir, i)))
                            for i in sorted(faults.links_cut(faults.from_env(), fabric.name))),
            # Launchers on shared nodes (ssh, slurm) say here when another session's launch holds them.
            notify=(lambda text: self.progress(f"{case.id}: {text}")) if self.progress is not None else None,
        )
        self.launched.append(case)
        ticker = self._ticker(case, progress_file) if progress_file else None
        asked = time.time()  # another session's launch on this machine may hold it (_machine_slot)
        with self._machine_slot(case):
            started = time.time()  # before the cluster builds anything (launch_time.py)
            try:
                outcome = self.cluster.launch(request, on_tick=ticker)
            except ClusterUnavailable as exc:  # too few healthy nodes; nodes held by another session too long
                return LaunchRecord.failure(case, f"{case.id} on the {self.cluster.name} cluster: {exc}")
            returned = time.time()
        if not outcome.ok:
            self._node_failed(outcome.failed_node, case)
            return LaunchRecord.failure(case, f"{case.id} on the {self.cluster.name} cluster: {outcome.describe()}")
        kind = kind or (CollectivesResult if isinstance(config, CollectivesConfig) else TrainResult)
        try:
            result = kind.from_dict(json.loads(Path(config.result_path).read_text()), config.result_path)
        except (OSError, ValueError) as exc:  # ResultFormatError is a ValueError
            return LaunchRecord.failure(case, f"{case.id}: every rank exited 0 but the result written by "
                                              f"global rank 0 (node0) is unreadable ({exc}).\n{outcome.describe()}")
        if result.device == "cuda" and self.cluster.proves_transport:
            # The log files exist, so nccl_debug_env (ENV included) reached NCCL: env_logged.
            facts, problem = prove_transport(case.fabric, nccl_logs, crosses_fabric=case.crosses_fabric,
                                             table=s.fabric_table, require_gdr=s.require_gdr,
                                             inventory=inventory, env_logged=True)
            result.transport = facts.summary()
            result.transport_problem = problem
        result.cluster = self.cluster.describe()
        result.launch_s = round(outcome.elapsed_s, 2)
        result.run_dir = str(run_dir)
        ended = time.time()
        result.launch_time = launch_breakdown(result, run_dir, started, returned, ended)
        result.launch_marks = {"machine_asked": round(asked, 4), "launch_started": round(started, 4), **read_marks(run_dir),
                               "launch_returned": round(returned, 4), "launch_ended": round(ended, 4)}
        return LaunchRecord(case, self.cluster.name, result)

    def _node_failed(self, node: str | None, case: Case) -> None:
        """Leave out for the session a node on which launches keep failing: its ranks failed first in
        two launches, more than half of this session's failed launches. A fault of the job itself
        (every rank fails alike) spreads its first failures over the nodes; a sick node (a GPU off
        the bus, a flapping port, an OOM killer) collects them. Only launchers that know the node
        (``LaunchOutcome.failed_node``: ssh, slurm) can say."""
        if node is None:
            return
        failed = self._first_failures.setdefault(node, [])
        failed.append(case.id)
        total = sum(len(ids) for ids in self._first_failures.values())
        if len(failed) < NODE_FAILURES or 2 * len(failed) <= total or node in self.cluster.left_out:
            return
        why = f"launches failed first on it {len(failed)} times ({', '.join(failed)})"
        self.cluster.left_out[node] = why
        if self.progress is not None:
            self.progress(f"node {node} left out: {why}")
        if self.on_left_out is not None:
            self.on_left_out(node, why)

    @contextmanager
    def _machine_slot(self, case: Case) -> Iterator[None]:
        """Hold this machine's launch lock where every rank runs here (emulated, local clusters)."""
        if not isinstance(self.cluster, OnThisMachine):
            yield
            return
        lock = FileLock(str(self.cluster.machine_lock_path()))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            if self.progress is not None:
                self.progress(f"{case.id}: waiting for another pytest-fabric session's launch on this machine "
                              f"({lock.lock_file})")
            lock.acquire()
        try:
            yield
        finally:
            lock.release()

    def _preflight(self, case: Case) -> list[str]:
        """What stops ``case``'s fabric on this host, where it is one of the nodes. Elsewhere the
        session's node check judged every node before the first launch and left out the unfit ones."""
        s = self.settings
        if not self.cluster.checks_here:
            return []
        fabric = s.fabric(case.fabric)
        problems = preflight.check(fabric, s.gpus_per_node, network=case.crosses_fabric,
                                   declared=s.inventory.get(case.fabric), require_gdr=s.require_gdr)
        if case.crosses_fabric and not self.nodes:
            self.nodes = [preflight.read_node()]
        return [f"{p} ({platform.node()})" for p in problems]

    def _inventory(self, case: Case) -> NicInventory | None:
        """The NICs NCCL should have used: the ini's declaration, else the fewest any node showed."""
        declared = self.settings.inventory.get(case.fabric)
        if declared is not None:
            return declared
        fabric = self.settings.fabric(case.fabric)
        found = [inv for node in self.nodes if (inv := preflight.inventory(fabric, node))]
        return min(found, key=lambda inv: inv.nics or 0) if found else None

    def _runs_on_gpus(self) -> bool:
        device = self.settings.device
        return device == "cuda" or (device == "auto" and self.cluster.checks_here and preflight.visible_gpus() > 0)

    def _ticker(self, case: Case, progress_file: Path) -> Callable[[float], None] | None:
        if self.progress is None:
            return None
        shown = [0.0]

        def tick(elapsed: float) -> None:
            if elapsed - shown[0] < self.progress_every_s:
                return
            shown[0] = elapsed
            self.progress(f"{case.id}: {_progress_text(progress_file)} ({elapsed:.0f}s)")

        return tick


def _progress_text(progress_file: Path) -> str:
    try:
        lines = progress_file.read_text().splitlines()
    except FileNotFoundError:
        lines = []
    if not lines:
        return "starting ranks"
    try:
        last = json.loads(lines[-1])
    except ValueError:  # a line being written right now
        last = json.loads(lines[-2]) if len(lines) > 1 else None
    if last is None:
        return "starting ranks"
    phase = "warm-up" if last["phase"] == "warmup" else "measuring"
    return f"step {last['step']} of at least {last['of']} ({phase}), {last['tokens_per_s']:.0f} tokens/s"
