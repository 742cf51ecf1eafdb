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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from filelock import FileLock, Timeout

from . import preflight
from .cluster import Cluster, LaunchRequest
from .cluster.base import OnThisMachine
from .fabrics import Fabric, get_fabric
from .models import get_model
from .stats import launch_value
from .transport import nccl_debug_env, prove_transport
from .store import ResultStore
from .workload.config import CollectivesConfig, TrainConfig


@dataclass(frozen=True, order=True)
class Case:
    model: str
    nodes: int
    fabric: str

    @property
    def id(self) -> str:
        return f"{self.model}-n{self.nodes}-{self.fabric}"

    def with_fabric(self, fabric: str) -> Case:
        return Case(self.model, self.nodes, fabric)

    @property
    def crosses_fabric(self) -> bool:
        # On one node no traffic crosses the inter-node fabric (NVLink / loopback does the work).
        return self.nodes > 1


@dataclass(frozen=True)
class Settings:
    """Everything besides the case that decides what a launch measures."""

    gpus_per_node: int = 1
    steps: int = 8
    warmup_steps: int = 2
    batch_size: int | None = None  # None: the model's own default shape
    seq_len: int | None = None
    launch_timeout_s: float = 300.0
    # The session's fabrics (presets + user definitions and overrides); None: the presets.
    fabric_table: Mapping[str, Fabric] | None = field(default=None, compare=False)
    device: str = "auto"
    fsdp: int = 2
    mixed_precision: str = "auto"
    activation_checkpointing: bool = False
    model_path: str | None = None

    def workload_knobs(self) -> dict[str, Any]:
        """The TrainConfig fields these settings decide (beyond model, shape and steps)."""
        return {"device": self.device, "fsdp": self.fsdp, "mixed_precision": self.mixed_precision,
                "activation_checkpointing": self.activation_checkpointing, "model_path": self.model_path}

    def fabric(self, name: str) -> Fabric:
        return get_fabric(name, self.fabric_table)

    def shape(self, model: str) -> tuple[int, int]:
        spec = get_model(model)
        return self.batch_size or spec.batch_size, self.seq_len or spec.seq_len


class MeasurementError(Exception):
    """A launch that produced no result; the message carries the ranks' last log lines."""


@dataclass
class Measurement:
    case: Case
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    median_step_s: float
    step_s: list[float]
    gpus: int
    cluster: str
    result: dict[str, Any] = field(repr=False)
    # Set when this measurement was taken for another fabric and serves this one too (one node).
    shared_with: str | None = None

    @property
    def label(self) -> str:
        return f"{self.case.fabric} ({self.case.model}, {self.case.nodes} node{'s' * (self.case.nodes > 1)})"

    def summary(self) -> str:
        shared = f" [one node: shared with {self.shared_with}]" if self.shared_with else ""
        return (f"{self.case.id}: {self.tokens_per_s:.1f} tokens/s, {self.tokens_per_s_per_gpu:.1f} tokens/s/GPU, "
                f"median step {self.median_step_s * 1000:.1f} ms over {len(self.step_s)} steps, "
                f"{self.gpus} GPU(s){shared}")

    def metrics(self) -> dict[str, str]:
        """Flat name -> value pairs for JUnit properties and system-out."""
        p = f"fabric.{self.case.id}"
        r = self.result
        versions = r.get("versions", {})
        return {
            f"{p}.tokens_per_s": f"{self.tokens_per_s:.3f}",
            f"{p}.tokens_per_s_per_gpu": f"{self.tokens_per_s_per_gpu:.3f}",
            f"{p}.median_step_s": f"{self.median_step_s:.6f}",
            f"{p}.steps": str(len(self.step_s)),
            f"{p}.gpus": str(self.gpus),
            f"{p}.cluster": self.cluster,
            f"{p}.nodes": ",".join(r.get("nodes", [])),
            f"{p}.fabric_settings": json.dumps(r.get("fabric", {}), sort_keys=True),
            f"{p}.attention": str(r.get("attention")),
            f"{p}.device": f"{r.get('device')}/{r.get('dtype')}",
            f"{p}.versions": ", ".join(f"{k} {v}" for k, v in versions.items() if v),
        }

    def to_record(self) -> dict[str, Any]:
        return {"case": asdict(self.case), "cluster": self.cluster, "result": self.result}

    @classmethod
    def from_record(cls, case: Case, record: dict[str, Any]) -> Measurement:
        r = record["result"]
        measured_for = Case(**record["case"])
        # One value per launch: the median of its steady window (leading warm-up-like steps dropped).
        step = launch_value(r["step_s"])
        return cls(
            case=case,
            tokens_per_s=r["tokens_per_step"] / step,
            tokens_per_s_per_gpu=r["tokens_per_step"] / step / r["world_size"],
            median_step_s=step,
            step_s=r["step_s"],
            gpus=r["world_size"],
            cluster=record["cluster"],
            result=r,
            shared_with=measured_for.fabric if measured_for != case else None,
        )


BANDWIDTH = "collectives"  # the model name of a collective-bandwidth case


@dataclass
class BandwidthMeasurement:
    """Collective bandwidth of one (nodes, fabric), nccl-tests semantics (see workload/collectives.py)."""

    case: Case
    rows: list[dict[str, Any]]
    cluster: str
    result: dict[str, Any] = field(repr=False)

    def largest(self, op: str) -> dict[str, Any]:
        """The row gates read: the largest payload of ``op``."""
        rows = [r for r in self.rows if r["op"] == op]
        if not rows:
            raise KeyError(f"{op} was not measured; measured: {', '.join(sorted({r['op'] for r in self.rows}))}")
        return max(rows, key=lambda r: r["bytes"])

    def busbw_gbit(self, op: str) -> float:
        return self.largest(op)["busbw_GBps"] * 8

    def summary(self) -> str:
        ops = sorted({r["op"] for r in self.rows})
        parts = [f"{op} {self.busbw_gbit(op):.3f} Gbit/s at {self.largest(op)['bytes'] / 2**20:g} MiB" for op in ops]
        return f"{self.case.id}: busbw " + ", ".join(parts)

    def metrics(self) -> dict[str, str]:
        p = f"fabric.{self.case.id}"
        out = {f"{p}.{r['op']}.{r['bytes']}.busbw_gbit": f"{r['busbw_GBps'] * 8:.4f}" for r in self.rows}
        out[f"{p}.fabric_settings"] = json.dumps(self.result.get("fabric", {}), sort_keys=True)
        out[f"{p}.versions"] = ", ".join(f"{k} {v}" for k, v in self.result.get("versions", {}).items() if v)
        return out

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BandwidthMeasurement:
        r = record["result"]
        return cls(Case(**record["case"]), r["rows"], record["cluster"], r)


Progress = Callable[[str], None]


class Measurer:
    def __init__(self, cluster: Cluster, settings: Settings, store: ResultStore, workdir: Path,
                 progress: Progress | None = None, progress_every_s: float = 3.0) -> None:
        self.cluster = cluster
        self.settings = settings
        self.store = store
        self.workdir = workdir
        self.progress = progress
        self.progress_every_s = progress_every_s
        self.launched: list[Case] = []  # what this process actually launched

    def key(self, case: Case) -> str:
        """Cache key: the case plus every setting that changes the measurement."""
        s = self.settings
        batch, seq = s.shape(case.model)
        # One node never touches the fabric: any fabric's measurement serves all of them.
        fabric = case.fabric if case.crosses_fabric else "any"
        fabric_settings = s.fabric(case.fabric).settings() if case.crosses_fabric else None
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, s.steps, s.warmup_steps, batch, seq,
                            fabric_settings, s.workload_knobs()], sort_keys=True)
        return f"{case.model}-n{case.nodes}-{fabric}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"

    def measure(self, case: Case, launch: int = 0) -> Measurement:
        """Launch number ``launch`` (0, 1, ...) of ``case``: each is an independent launch, cached."""
        key = self.key(case) + (f"@{launch}" if launch else "")
        record, _ = self.store.get_or_compute(key, lambda: self._launch(case))
        if "error" in record:
            raise MeasurementError(record["error"])
        return Measurement.from_record(case, record)

    def _launch(self, case: Case) -> dict[str, Any]:
        s = self.settings
        batch, seq = s.shape(case.model)
        run_dir = self._run_dir(case)
        config = TrainConfig(
            model=get_model(case.model).to_dict(),
            batch_size=batch,
            seq_len=seq,
            steps=s.steps,
            warmup_steps=s.warmup_steps,
            result_path=str(run_dir / "result.json"),
            progress_path=str(run_dir / "progress.jsonl"),
            collective_timeout_s=s.launch_timeout_s,
            **s.workload_knobs(),
            fabric=self._fabric_record(case),
        )
        return self._run(case, "pytest_fabric.workload.train", config, run_dir, Path(config.progress_path))

    def measure_bandwidth(self, case: Case) -> BandwidthMeasurement:
        """Collective bandwidth over ``case``'s nodes and fabric (``case.model`` is ignored)."""
        case = Case(BANDWIDTH, case.nodes, case.fabric)
        s = self.settings
        knobs = json.dumps([self.cluster.name, s.gpus_per_node, s.fabric(case.fabric).settings(), s.device],
                           sort_keys=True)
        key = f"{case.id}#{hashlib.sha1(knobs.encode()).hexdigest()[:10]}"
        record, _ = self.store.get_or_compute(key, lambda: self._launch_bandwidth(case))
        if "error" in record:
            raise MeasurementError(record["error"])
        return BandwidthMeasurement.from_record(record)

    def _launch_bandwidth(self, case: Case) -> dict[str, Any]:
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
        fabric = self.settings.fabric(case.fabric)
        return {**fabric.settings(), "nccl_env": self.cluster.nccl_env(fabric), "crosses_fabric": case.crosses_fabric}

    def _run(self, case: Case, module: str, config: Any, run_dir: Path, progress_file: Path | None) -> dict[str, Any]:
        """Launch ``module`` with ``config`` on ``case``'s nodes; a record with the result or the error."""
        s = self.settings
        fabric = s.fabric(case.fabric)
        config.dump(run_dir / "config.json")
        nccl_logs = run_dir / "nccl"
        nccl_logs.mkdir(exist_ok=True)
        request = LaunchRequest(
            nodes=case.nodes,
            procs_per_node=s.gpus_per_node,
            fabric=fabric,
            program=["-m", module, "--config", str(run_dir / "config.json")],
            workdir=run_dir,
            deadline_s=s.launch_timeout_s,
            job_id=re.sub(r"[^A-Za-z0-9]", "", case.id)[:40] + str(int(time.time())),
            # NCCL's own logs are the proof of which transport ran (ignored by gloo on CPU).
            env=nccl_debug_env(nccl_logs),
        )
        if self._runs_on_gpus() and self.cluster.checks_here:
            problems = preflight.check(fabric, s.gpus_per_node, network=case.crosses_fabric)
            if problems:
                return {"case": asdict(case),
                        "error": f"{case.id}: pre-flight failed on {platform.node()}: " + "; ".join(problems)}
        self.launched.append(case)
        ticker = self._ticker(case, progress_file) if progress_file else None
        with self._machine_slot(case):
            outcome = self.cluster.launch(request, on_tick=ticker)
        if not outcome.ok:
            return {"case": asdict(case), "error": f"{case.id} on the {self.cluster.name} cluster: {outcome.describe()}"}
        try:
            result = json.loads(Path(config.result_path).read_text())
        except (OSError, ValueError) as exc:
            return {"case": asdict(case), "error": f"{case.id}: every rank exited 0 but the result is unreadable "
                                                   f"({exc}).\n{outcome.describe()}"}
        if result.get("device") == "cuda" and self.cluster.proves_transport:
            facts, problem = prove_transport(case.fabric, nccl_logs, crosses_fabric=case.crosses_fabric,
                                             table=s.fabric_table)
            result["transport"] = facts.summary()
            result["transport_problem"] = problem
        result["cluster"] = self.cluster.describe()
        result["launch_s"] = round(outcome.elapsed_s, 2)
        result["run_dir"] = str(run_dir)
        return {"case": asdict(case), "cluster": self.cluster.name, "result": result}

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
    return f"step {last['step']}/{last['of']} ({phase}), {last['tokens_per_s']:.0f} tokens/s"
