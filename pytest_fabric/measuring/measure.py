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
import math
import platform
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from filelock import FileLock, Timeout

from ..physics import memory
from . import preflight
from ..core.case import BANDWIDTH, Case
from ..cluster import Cluster, ClusterUnavailable, LaunchRequest
from ..cluster.base import OnThisMachine
from ..cluster.supervisor import interrupt_on_sigterm
from ..core.fabrics import Fabric, get_fabric
from ..core.models import get_model
from .measurement import (BandwidthMeasurement, LaunchKey, LaunchRecord, Measurement, MeasurementError,  # noqa: F401 (public names)
                          block_name, launch_number, configuration_tokens_per_s, counted, launch_value, result_estimate, step_loss)
from ..deciding.stats import (FIRST_LAUNCH_FACTOR, STALL_MAX_FACTOR, STALL_TARGET_SE, LaunchEstimate, Window,
                              measure_window)
from ..core.storage import is_storage_error, storage_problem
from .store import ResultStore
from .nccl_evidence import NicInventory, nccl_debug_env, prove_transport
from ..workload import faults
from ..workload.signals import launch_probe, usual_probe
from ..workload.config import CollectivesConfig, TrainConfig
from ..workload.result import CollectivesResult, TrainResult
from ..workload.turnstile import CHUNK_S, TurnConfig, mark_done


# Launches that must fail first on one node before it is left out for the session (_node_failed).
NODE_FAILURES = 2


@dataclass(frozen=True)
class LaunchSettings:
    """Everything besides the case that decides what a launch measures."""

    gpus_per_node: int = 1
    steps: int = 10  # measured steps at least
    warmup_steps: int = 2
    # Then measuring goes on until the launch's step time is known to `step_precision`, for at most
    # `measure_s` seconds of measured steps (0: exactly `steps` steps) and `max_steps` steps.
    measure_s: float = 6.0
    step_precision: float = 0.01
    max_steps: int = 200
    batch_size: int | None = None  # None: the model's own default shape
    seq_len: int | None = None
    launch_timeout_s: float = 300.0
    # The session's fabrics (presets + user definitions and overrides); None: the presets.
    fabric_table: Mapping[str, Fabric] | None = field(default=None, compare=False)
    device: str = "auto"
    fsdp: int = 2
    mixed_precision: str = "auto"
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
                "activation_checkpointing": self.activation_checkpointing, "compile": self.compile,
                "model_path": self.model_path,
                "steps": self.steps, "warmup_steps": self.warmup_steps, "max_steps": self.max_steps,
                "measure_s": self.measure_s, "step_precision": self.step_precision}

    def fabric(self, name: str) -> Fabric:
        return get_fabric(name, self.fabric_table)

    def measuring(self) -> str:
        """How long a launch measures, in words (the session's header line)."""
        if not self.measure_s:
            return f"{self.steps} measured steps"
        return (f"at least {self.steps} measured steps, then to {self.step_precision:.0%} precision within "
                f"{self.measure_s:g} s (a configuration's first launch: all of {self.measure_s * FIRST_LAUNCH_FACTOR:g} s; "
                f"after its steps stall: as long as their mean needs to be known to {STALL_TARGET_SE:.0%}, "
                f"up to {self.measure_s * STALL_MAX_FACTOR:g} s)")

    def shape(self, model: str, ranks: int = 1) -> tuple[int, int]:
        """(batch, seq) per rank: the user's, else the model's default. A CPU-sized model has one
        shape; a real (GPU) model takes the largest of its GPU batches that fits an 80 GB GPU at
        ``ranks`` ranks (memory.default_gpu_shape)."""
        spec = get_model(model)
        if spec.cpu_sized or self.batch_size:
            return self.batch_size or spec.batch_size, self.seq_len or spec.seq_len
        return memory.default_gpu_shape(spec, ranks, self.activation_checkpointing, self.compile != "off",
                                        seq=self.seq_len)


# The name of 0.1, kept for suites written against it.
Settings = LaunchSettings


Progress = Callable[[str], None]

# The least gap between two launches that still counts as back to back (``Measurer.in_round``): what
# starting the next launch takes (the harness between launches, another xdist worker's launch
# holding the machine); beyond it, the longer of the two launches (one launch between them).
ROUND_GAP_S = 5.0


def _timed(launch: Callable[[], LaunchRecord], clock: Callable[[], float]) -> dict[str, Any]:
    """``launch()``'s record, with when it ran on this harness's ``clock``."""
    started = clock()
    record = launch()
    return replace(record, started=round(started, 3), ended=round(clock(), 3)).to_dict()


def _cancellable(tick: Callable[[float], None] | None, cancel: threading.Event) -> Callable[[float], None]:
    """``tick``, raising KeyboardInterrupt once ``cancel`` is set: the supervisor's loop unwinds as on
    Ctrl-C (its ``finally`` kills the ranks), in a thread that no signal reaches."""
    def cancellable(elapsed: float) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt("the launch's interleaved round was interrupted")
        if tick is not None:
            tick(elapsed)
    return cancellable


def _span(stored: Any) -> tuple[float, float] | None:
    """When a stored launch ran, (started, ended); None where the record does not say."""
    try:
        started, ended = float(stored["started"]), float(stored["ended"])
    except (KeyError, TypeError, ValueError):
        return None
    return (started, ended) if ended >= started > 0 else None


def _gap(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Seconds between two time spans (0.0 where they overlap)."""
    return max(0.0, max(a[0], b[0]) - min(a[1], b[1]))


def _stored_value(stored: Any) -> LaunchEstimate | None:
    """The launch value of a stored record; None for a failed, unreadable or non-training one."""
    try:
        record = LaunchRecord.from_dict(stored) if stored else None
    except (KeyError, TypeError, ValueError):
        return None
    if record is None or not isinstance(record.result, TrainResult) or not record.result.step_s:
        return None
    return launch_value(record.result)


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
        # Launch values of stored records by store key, for the windows (a stored launch never changes).
        self._values: dict[str, LaunchEstimate | None] = {}
        # The typical judged CPU probe of stored records by store key (0.0: fewer than 3 judged).
        self._probes: dict[str, float] = {}

    def key(self, case: Case) -> str:
        """Cache key: the case plus every setting that changes the measurement."""
        s = self.settings
        batch, seq = s.shape(case.model, case.nodes * s.gpus_per_node)
        # One node never touches the fabric: any fabric's measurement serves all of them.
        fabric = case.fabric if case.crosses_fabric else "any"
        fabric_settings = s.fabric(case.fabric).settings() if case.crosses_fabric else None
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, batch, seq, fabric_settings, s.workload_knobs()],
                           sort_keys=True)
        return f"{case.model}-n{case.nodes}-{fabric}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"

    def measure(self, case: Case, launch: int = 0, partners: Sequence[Case] = ()) -> Measurement:
        """Launch number ``launch`` (0, 1, ...) of ``case``: each is an independent launch, cached.

        ``partners``: the configurations the same round compares ``case`` with. Where one of them
        measures a longer window this round (its steps stalled), ``case`` measures that window too,
        as a launch of its own (key ``...@N~Ws``): a launch's mean depends on how long it ran (here
        a 60 s launch's steps averaged 5-15% slower than its own first 6 s), so the two sides of a
        comparison must measure alike, and a launch measured shorter for another comparison serves
        that one only.

        A round's launches run back to back (``in_round``): a stored launch serves this round only
        where it ran next to the round's other launches. One measured for an earlier comparison
        (the reference every gate shares, minutes of other gates ago) is launched again for this
        round (key ``...+partners``), so that a drift of the machine between two gates never reads as
        a difference between the fabrics."""
        key = LaunchKey(self.key(case), launch, self.matched_window(case, launch, partners))
        if partners:
            again = replace(key, block=block_name(partners))  # once launched again, it serves its round
            # Only a stored launch can have run apart from its round: the partners' keys (their
            # windows, from the store) are looked up for those alone.
            if self.store.get(str(again)) is not None or (self.store.get(str(key)) is not None and not self.in_round(
                    key, [self._round_key(p, case, launch, partners) for p in partners])):
                key = again
        return Measurement.from_record(
            case, self._cached(case, str(key), lambda: self._launch(case, launch, key.window)), launch)

    def measure_round(self, cases: Sequence[Case], launch: int) -> list[Measurement]:
        """Launch number ``launch`` of every case of a round, interleaved (``workload/turnstile.py``):
        the launches start together, warm up, and then their measured steps take turns, a chunk of
        about ``turnstile.CHUNK_S`` seconds each, in the order given (``cases[0]`` first), so that
        a drift of the machine hits every side alike instead of the side that ran in its slow
        minute. Every side measures the round's longest window whole (no stop on precision: sides
        that stopped apart would not be paired to the end). Keyed ``...@N[~Ws]&partners``: such a
        launch serves its round alone. Where some of the round is stored already (a resumed
        session), the rest launches interleaved with each other, or on its own where one is left."""
        windows = [self.window(case, launch) for case in cases]
        seconds = max(w.seconds for w in windows)
        keys = [LaunchKey(self.key(case), launch, round(seconds, 1) if round(seconds, 1) > w.seconds else 0.0,
                          block_name([c for c in cases if c is not case]), interleaved=True)
                for case, w in zip(cases, windows)]
        missing = [i for i, key in enumerate(keys) if self.store.get(str(key)) is None]
        if len(missing) > 1:
            with self._machine_slot(cases[missing[0]]):
                records = self._launch_together([cases[i] for i in missing], launch, seconds)
            for i, record in zip(missing, records):
                self.store.get_or_compute(str(keys[i]), lambda record=record: record)
        return [Measurement.from_record(case, self._cached(
                    case, str(key), lambda case=case: self._launch(case, launch, seconds, whole=True)), launch)
                for case, key in zip(cases, keys)]

    def _launch_together(self, cases: Sequence[Case], launch: int, seconds: float) -> list[dict[str, Any]]:
        """Launch ``cases`` at once, taking turns (``measure_round``): their stored records, in order.
        A side that ends, however it ends, is marked done in the turnstile, so that no other side
        waits for it; an interrupt of the session stops every side's ranks."""
        s = self.settings
        self.workdir.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="turns-", dir=self.workdir))
        worlds = tuple(case.nodes * s.gpus_per_node for case in cases)
        cancel = threading.Event()

        def side(i: int) -> dict[str, Any]:
            turns = TurnConfig(str(directory), i, worlds, CHUNK_S)
            try:
                return _timed(lambda: self._launch(cases[i], launch, seconds, whole=True, turns=turns, cancel=cancel),
                              self.clock)
            finally:
                mark_done(directory, i, worlds[i])

        # The sides' supervisors run in threads, where no signal handler can be set: SIGTERM (a CI
        # job cancelled) unwinds this thread as Ctrl-C does, and the sides with it.
        previous = interrupt_on_sigterm()
        try:
            with ThreadPoolExecutor(len(cases), thread_name_prefix="round") as pool:
                futures = [pool.submit(side, i) for i in range(len(cases))]
                try:
                    return [f.result() for f in futures]
                except BaseException:
                    cancel.set()  # every side's supervisor unwinds at its next tick: ranks killed, links gone
                    raise
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            shutil.rmtree(directory, ignore_errors=True)

    def _round_key(self, partner: Case, case: Case, launch: int, partners: Sequence[Case]) -> LaunchKey | None:
        """The stored launch ``partner`` measured for this round: the one it measured again for
        this round's cases where it did (``measure``), else its launch of that number; None where
        it has not launched yet this round."""
        others = [case, *(p for p in partners if p != partner)]
        key = LaunchKey(self.key(partner), launch, self.matched_window(partner, launch, others))
        for candidate in (replace(key, block=block_name(others)), key):
            if self.store.get(str(candidate)) is not None:
                return candidate
        return None

    def in_round(self, key: LaunchKey, partner_keys: Sequence[LaunchKey | None]) -> bool:
        """Whether the stored launch ``key`` (if any) ran back to back with its round's other
        launches: at most the longer of the two launches (at least ``ROUND_GAP_S``) between it and
        each partner's stored launch of the round, or, where none has launched yet, between it and
        now (they launch next). A key not stored launches now, in the round; a record without
        times (kept before they were) is taken as it was."""
        stored = self.store.get(str(key))
        span = _span(stored)
        if span is None:
            return True
        spans = [s for k in partner_keys if k is not None and (s := _span(self.store.get(str(k)))) is not None]
        now = self.clock()
        return all(_gap(span, other) <= max(ROUND_GAP_S, span[1] - span[0], other[1] - other[0])
                   for other in (spans or [(now, now)]))

    def window(self, case: Case, launch: int) -> Window:
        """The window launch number ``launch`` of ``case`` measures on its own (``measure_window``)."""
        s = self.settings
        earlier, machine_stall = self._earlier(case, launch)
        return measure_window(s.measure_s, launch, earlier, s.launch_timeout_s, machine_stall)

    def matched_window(self, case: Case, launch: int, partners: Sequence[Case]) -> float:
        """The longer window a partner measures this round, where it is longer than ``case``'s own
        (rounded to 0.1 s, as it is keyed); 0.0 where ``case``'s own window is as long."""
        if not partners or not launch or not self.settings.measure_s:
            return 0.0
        own = self.window(case, launch).seconds
        longest = max(self.window(p, launch).seconds for p in partners)
        return round(longest, 1) if round(longest, 1) > own else 0.0

    def _earlier(self, case: Case, launch: int) -> tuple[list[LaunchEstimate], float]:
        """The values of ``case``'s configuration's earlier launches this session (how far each sat
        above its fast steps, how well its mean was known), and how far the machine puts a mean above
        its fast steps: the least any other configuration shows (its launches' median; 0 with none:
        a configuration that stalls itself never hides another's), for ``stats.measure_window``.
        Only launches numbered below ``launch`` count, so that a round's windows (``measure``, which
        matches a comparison's sides) are the same whichever of its launches has already run."""
        if not launch:
            return [], 0.0
        key, mine, others = self.key(case), {}, {}
        for stored_key, stored in self.store.all().items():  # one read of the store, not one per launch
            if stored_key not in self._values:
                self._values[stored_key] = _stored_value(stored)
            value = self._values[stored_key]
            if value is None:  # failed, unreadable, or not a training launch: says nothing of stalls
                continue
            parsed = LaunchKey.parse(stored_key)
            base, number = parsed.base, parsed.number
            # This round's launches: its windows are planned before any of them lands. A launch
            # measured over its partner's longer window (``~``) is not a window of its own: a long
            # window's mean sits further above its fast steps on a machine that slows under load.
            if number >= launch or parsed.window:
                continue
            if base == key:
                mine[number] = value
            else:
                others.setdefault(base, []).append(value.stall)
        machine = min((statistics.median(stalls) for stalls in others.values()), default=0.0)
        return [mine[j] for j in sorted(mine)], machine

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

    def _launch(self, case: Case, launch: int = 0, at_least: float = 0.0, whole: bool = False,
                turns: TurnConfig | None = None, cancel: threading.Event | None = None) -> LaunchRecord:
        s = self.settings
        batch, seq = s.shape(case.model, case.nodes * s.gpus_per_node)
        if problem := self._memory_refusal(case, batch, seq):  # before launching, not a CUDA OOM mid-run
            return LaunchRecord.failure(case, problem)
        # A configuration's first launch, and one whose steps stalled earlier, measure longer (stats.py);
        # so does one compared in this round with a configuration that measures longer (``measure``).
        window = self.window(case, launch)
        if at_least > window.seconds:
            window = Window(at_least, True, f"its comparison partner measures all of {at_least:g} s this round "
                                            f"(its steps stall): measuring as long, so that both sides measure alike")
        elif whole and not window.whole:
            window = replace(window, whole=True)  # interleaved: every side to the end of the window
        if window.why and self.progress is not None:
            self.progress(f"{case.id}: {window.why}")
        run_dir = self._run_dir(case)
        config = TrainConfig(
            model=get_model(case.model).to_dict(),
            batch_size=batch,
            seq_len=seq,
            result_path=str(run_dir / "result.json"),
            progress_path=str(run_dir / "progress.jsonl"),
            collective_timeout_s=s.launch_timeout_s,
            **{**s.workload_knobs(), "measure_s": window.seconds,
               "step_precision": 0.0 if window.whole else s.step_precision, "max_steps": self._step_cap(window.seconds)},
            fabric=self._fabric_record(case),
            turnstile=turns.to_dict() if turns is not None else None,
        )
        record = self._run(case, "pytest_fabric.workload.train", config, run_dir, Path(config.progress_path),
                           slot=turns is None, cancel=cancel)
        return replace(record, measured_longer=window.why) if window.why else record

    def _step_cap(self, seconds: float) -> int:
        """The most steps a launch measuring ``seconds`` may take: the settings' cap bounds the usual
        window (--measure-seconds) of very short steps, and a window stretched to N times it may take
        N times the steps, so that the window, not the cap, ends it: a side matched to its partner's
        60 s must measure 60 s even where its steps are short (a 70 ms step hit 200 steps after 14 s)."""
        s = self.settings
        if not s.measure_s:
            return s.max_steps
        return max(s.max_steps, math.ceil(s.max_steps * seconds / s.measure_s - 1e-9))

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
                                   collective_timeout_s=self.settings.launch_timeout_s,
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
             slot: bool = True, cancel: threading.Event | None = None) -> LaunchRecord:
        """Launch ``module`` with ``config`` on ``case``'s nodes; a record with the result or the error.
        ``slot``: hold the machine's launch lock (an interleaved round holds it for all its sides);
        ``cancel``: set, the launch stops at its supervisor's next tick (its round was interrupted)."""
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
            env=nccl_debug_env(nccl_logs, graph=bool(inventory and inventory.gbit_per_nic)),
            # Harness self-tests (workload/faults.py, checked by the plugin): a node that never joins.
            links_down=tuple(sorted(faults.nodes_left_out(faults.from_env(), fabric.name))),
            links_cut=tuple((i, Path(faults.cut_request(run_dir, i)))
                            for i in sorted(faults.links_cut(faults.from_env(), fabric.name))),
            # Launchers on shared nodes (ssh, slurm) say here when another session's launch holds them.
            notify=(lambda text: self.progress(f"{case.id}: {text}")) if self.progress is not None else None,
        )
        self.launched.append(case)
        ticker = self._ticker(case, progress_file) if progress_file else None
        if cancel is not None:
            ticker = _cancellable(ticker, cancel)
        with self._machine_slot(case) if slot else nullcontext():
            try:
                outcome = self.cluster.launch(request, on_tick=ticker)
            except ClusterUnavailable as exc:  # too few healthy nodes; nodes held by another session too long
                return LaunchRecord.failure(case, f"{case.id} on the {self.cluster.name} cluster: {exc}")
        if not outcome.ok:
            self._node_failed(outcome.failed_node, case)
            return LaunchRecord.failure(case, f"{case.id} on the {self.cluster.name} cluster: {outcome.describe()}")
        kind = CollectivesResult if isinstance(config, CollectivesConfig) else TrainResult
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
        if isinstance(result, TrainResult):
            self._judge_speed(case, result)
        result.cluster = self.cluster.describe()
        result.launch_s = round(outcome.elapsed_s, 2)
        result.run_dir = str(run_dir)
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

    def _judge_speed(self, case: Case, result: TrainResult) -> None:
        """Record with the result its configuration's usual CPU probe: the lower median of the typical
        busy-step probes of every launch of the same configuration this session, this one included,
        so that a launch run in another phase of the machine is known as such for good
        (``stats.launch_estimate``, ``signals.slow_phase``). Per configuration: the job's own load
        sets the vCPU's speed (two busy cores probe slower than one; a node idling on the network
        slower still), so only launches of the same job are comparable; the first launch of a
        configuration is its own reference."""
        speed = launch_probe(result.signals.probe_s, result.signals.cpu_busy)
        if speed:
            result.signals.probe_usual_s = usual_probe([*self._stored_speeds(self.key(case)), speed])

    def _stored_speeds(self, key: str) -> list[float]:
        """The typical judged probe of each of the store's launches of configuration ``key`` (its
        own-window, matched and again-launched ones alike: the same job): launches this process did
        not measure count too, those of a killed session this one resumed and those of another
        xdist worker, so a launch is judged against every launch of its configuration tonight."""
        speeds = []
        for stored_key, stored in self.store.all().items():
            if LaunchKey.parse(stored_key).base != key:
                continue
            if stored_key not in self._probes:
                signals = ((stored or {}).get("result") or {}).get("signals") or {}
                self._probes[stored_key] = launch_probe(signals.get("probe_s") or [], signals.get("cpu_busy") or [])
            if self._probes[stored_key]:
                speeds.append(self._probes[stored_key])
        return speeds

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
