"""The typed results of the rank programs: written once by global rank 0, read once by the harness.

A rank program reports what it measured and what it ran on; it never turns that into a verdict or
a headline number (the harness's ``steps.launch_estimate`` does, in one place). Each result carries
a format name and version: a result written by a newer harness is refused with a message instead
of being half-read, and results of the first version (plain dicts without a format field, as older
session stores and saved nights hold them) are still read.

Plain standard library: the harness imports this without importing torch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.atomic import write_text
from ..core.units import gbyte_to_gbit

TRAIN_FORMAT = "pytest-fabric-train-result"
COLLECTIVES_FORMAT = "pytest-fabric-collectives-result"
# 2: typed results; per-step disturbance signals; no derived figures (tokens/s, MFU) from the rank.
RESULT_VERSION = 2
class ResultFormatError(ValueError):
    """A result file that is not (or not yet) readable as the rank program's result."""


T = TypeVar("T")


def _from_fields(cls: type[T], data: dict[str, Any], where: str) -> T:
    """``cls(**data)`` restricted to its fields: extra keys (written by other versions) are dropped,
    missing required ones named."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    required = {f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - set(data))
    if missing:
        raise ResultFormatError(f"{where}: missing {', '.join(missing)}")
    return cls(**{k: v for k, v in data.items() if k in names})


def _check_format(data: Any, expected: str, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ResultFormatError(f"{where}: a result is a JSON object, got {type(data).__name__}")
    fmt = data.get("format")
    if fmt is None and "version" not in data:
        raise ResultFormatError(f"{where}: a result of pytest-fabric 0.1 (no format, no version); run its "
                                f"launches again")
    if fmt != expected:
        raise ResultFormatError(f"{where}: format {fmt!r}, expected {expected!r}")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ResultFormatError(f"{where}: result version {version!r} is not a version (1, 2, ...)")
    if version > RESULT_VERSION:
        raise ResultFormatError(f"{where}: result version {version!r} is newer than this pytest-fabric reads "
                                f"({RESULT_VERSION}); upgrade pytest-fabric")
    if version < RESULT_VERSION:
        raise ResultFormatError(f"{where}: result version {version!r} was written by an older pytest-fabric; "
                                f"run its launches again")
    return data


@dataclass
class StepSignals:
    """Per measured step, what else happened on the nodes while it ran (the slowest node's view).

    On CPU runs the node's pinned cores are watched: ``steal_s`` is time the hypervisor took from
    them, ``foreign_s`` CPU time other processes ran on them (the cores' busy time from /proc/stat
    less the run time of this launch's own ranks there). On GPUs, the lowest SM clock of any GPU
    and the union of NVML's clock throttle reasons. ``disturbed`` is the reason a step was set
    aside by ``workload.signals.disturbance`` ("" for a clean step).
    """

    steal_s: list[float] = field(default_factory=list)
    foreign_s: list[float] = field(default_factory=list)
    sm_clock_mhz: list[float | None] = field(default_factory=list)
    throttle: list[list[str]] = field(default_factory=list)
    disturbed: list[str] = field(default_factory=list)
    # Wall clock (Unix seconds) at the end of each measured step on global rank 0; [] in older results.
    step_end_unix: list[float] = field(default_factory=list)
    # The GPU's busy share after each step (NVML utilization, the least busy GPU); [] where unknown.
    gpu_busy: list[float | None] = field(default_factory=list)
    # Bytes the busiest node's fabric link sent and received in each step (signals.LinkCounters); []
    # where no counter was known.
    link_tx_bytes: list[float] = field(default_factory=list)
    link_rx_bytes: list[float] = field(default_factory=list)
    # Per measured step, every rank's own step time and CPU time, by global rank (signals.StepView).
    rank_step_s: list[list[float]] = field(default_factory=list)
    rank_cpu_s: list[list[float]] = field(default_factory=list)
    # GPU runs with NVML: per measured step, every rank's SM clock (MHz) and throttle-reason mask.
    rank_sm_clock_mhz: list[list[float]] = field(default_factory=list)
    rank_throttle_mask: list[list[int]] = field(default_factory=list)


@dataclass(kw_only=True)
class LaunchFacts:
    """What the harness adds to a rank program's result after the launch."""

    cluster: str | None = None
    launch_s: float | None = None
    run_dir: str | None = None
    transport: dict[str, Any] | None = None  # the NCCL log evidence (nccl_evidence.py), GPU runs
    transport_problem: str | None = None
    # Where the launch's wall time went (measuring/launch_time.py): phase name -> seconds, in launch
    # order (startup, imports, init, build, compile, warmup, between, measured, finish, teardown,
    # harness; collectives and link launches: startup, imports, program, teardown, harness); the phases
    # add up to the launch's wall, from before the cluster built anything to after its clean-up.
    # None: recorded before launches were timed.
    launch_time: dict[str, float] | None = None
    # The clock readings behind it (Unix seconds): the harness's machine_asked (before waiting for
    # another session's launch on this machine), launch_started, launch_returned, launch_ended and
    # global rank 0's marks (workload/marks.py).
    launch_marks: dict[str, float] | None = None


@dataclass
class TrainResult(LaunchFacts):
    """One FSDP training launch, as global rank 0 saw it after every rank reported."""

    model: str
    world_size: int
    hosts: list[str]  # the hosts the ranks ran on (emulated: node names)
    local_world_size: int
    batch_size: int
    seq_len: int
    tokens_per_step: int
    step_s: list[float]  # the slowest rank's time of each measured step
    warmup_step_s: list[float] = field(default_factory=list)
    signals: StepSignals = field(default_factory=StepSignals)
    # Why measuring stopped (``window.measuring_done``).
    stopped: str = "fixed"
    flops_per_token: float = 0.0
    # How flops_per_token counts (models.MFU_CONVENTION); None: recorded before 0.2, when the output
    # head was left out, so MFU takes the catalog's count for the model instead (``flops_for_mfu``).
    flops_convention: str | None = None
    gpu_name: str | None = None
    peak_gpu: str | None = None
    peak_flops_per_gpu: float | None = None
    mfu_note: str | None = None
    peak_memory_bytes: int = 0
    peak_memory_kind: str = ""
    peak_memory_bytes_per_rank: list[int] = field(default_factory=list)
    # The node each global rank ran on (as the launcher named it, e.g. "node1/198.18.0.2"); [] before.
    rank_hosts: list[str] = field(default_factory=list)
    # Compiled runs: global rank 0's compile-cache hits and misses over the run
    # (compile_cache.cache_counts: fxgraph_hit, fxgraph_miss, autograd_hit, autograd_miss); {} eager.
    compile_cache: dict[str, int] = field(default_factory=dict)
    # Each rank's GPU at the end of the run, where NVML gives it: temperature_c, ecc_uncorrected.
    rank_gpu_health: list[dict[str, int]] = field(default_factory=list)
    first_loss: float | None = None
    final_loss: float | None = None
    device: str = "cpu"
    dtype: str = "float32"
    mixed_precision: str = "fp32"
    reduce_dtype: str = "float32"
    attention: str = "sdpa"
    fsdp: str = "fsdp2"
    sharding: str = "full"  # "full" or "hybrid" (config.SHARDINGS)
    grad_accum: int = 1  # micro-batches per optimizer step: a step's tokens count all of them
    fsdp1_min_num_params: int | None = None
    fsdp1_use_orig_params: bool | None = None  # False where weights are tied (workload/fsdp.py)
    tied_parameters: list[list[str]] = field(default_factory=list)
    activation_checkpointing: bool = False
    compile: bool = False  # per-block torch.compile
    optimizer: str = ""  # "adamw fused" (GPUs) or "adamw foreach"
    weights: str = "random"
    timeouts: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str | None] = field(default_factory=dict)
    fabric: dict[str, Any] = field(default_factory=dict)
    host: str = ""
    format: str = TRAIN_FORMAT
    version: int = RESULT_VERSION

    @property
    def crosses_fabric(self) -> bool:
        return bool(self.fabric.get("crosses_fabric", len(self.hosts) > 1))

    def mfu(self, tokens_per_s: float) -> float | None:
        """Model FLOPs utilization at ``tokens_per_s``; None where the GPU's bf16 peak is unknown (CPU)."""
        if not self.peak_flops_per_gpu or self.world_size <= 0:
            return None
        return self.flops_for_mfu() * tokens_per_s / (self.world_size * self.peak_flops_per_gpu)

    def flops_for_mfu(self) -> float:
        """FLOPs per token under today's convention (output head counted): the recorded figure, or
        for a result recorded before the head was counted, the catalog's count for its model and
        sequence length (the recorded one where the model is not in the catalog)."""
        if self.flops_convention is None and self.seq_len:
            from ..core.models import MODELS

            spec = MODELS.get(self.model)
            if spec is not None:
                return spec.flops_per_token(self.seq_len)
        return self.flops_per_token

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "train result") -> TrainResult:
        data = dict(_check_format(data, TRAIN_FORMAT, where))
        signals = data.get("signals") or {}
        if not isinstance(signals, dict):
            raise ResultFormatError(f"{where}: signals must be an object")
        data["signals"] = _from_fields(StepSignals, signals, f"{where}: signals")
        result = _from_fields(cls, data, where)
        steps = result.step_s
        if not isinstance(steps, list) or not steps or not all(
                isinstance(s, (int, float)) and s > 0 and math.isfinite(s) for s in steps):
            raise ResultFormatError(f"{where}: step_s must be a non-empty list of positive step times, got {steps!r}")
        # One entry per measured step in every signal (none at all: no signals, every step clean);
        # stats would otherwise pair step times with the wrong steps' flags, or fail later.
        for name in ("steal_s", "foreign_s", "sm_clock_mhz", "throttle", "disturbed", "gpu_busy", "step_end_unix",
                     "link_tx_bytes", "link_rx_bytes", "rank_step_s", "rank_cpu_s", "rank_sm_clock_mhz",
                     "rank_throttle_mask"):
            values = getattr(result.signals, name)
            if not isinstance(values, list) or (values and len(values) != len(steps)):
                raise ResultFormatError(f"{where}: signals.{name} must list one entry per measured step "
                                        f"({len(steps)}), got {values!r}")
        if not (isinstance(result.world_size, int) and result.world_size >= 1):
            raise ResultFormatError(f"{where}: world_size must be a positive integer, got {result.world_size!r}")
        if not (isinstance(result.tokens_per_step, int) and result.tokens_per_step >= 1):
            raise ResultFormatError(f"{where}: tokens_per_step must be a positive integer")
        return result


@dataclass
class CollectiveRow:
    """One collective at one payload, nccl-tests semantics (see workload/collectives.py)."""

    op: str
    bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float

    @property
    def busbw_gbit(self) -> float:
        return gbyte_to_gbit(self.busbw_GBps)


@dataclass
class CollectivesResult(LaunchFacts):
    """One collective-bandwidth launch: a row per collective x payload."""

    world_size: int
    rows: list[CollectiveRow]
    local_world_size: int = 1
    backend: str = "gloo"
    device: str = "cpu"
    versions: dict[str, str | None] = field(default_factory=dict)
    fabric: dict[str, Any] = field(default_factory=dict)
    format: str = COLLECTIVES_FORMAT
    version: int = RESULT_VERSION

    def largest(self, op: str) -> CollectiveRow:
        """The row gates read: the largest payload of ``op``."""
        rows = [r for r in self.rows if r.op == op]
        if not rows:
            raise KeyError(f"{op} was not measured; measured: {', '.join(self.ops())}")
        return max(rows, key=lambda r: r.bytes)

    def ops(self) -> list[str]:
        return sorted({r.op for r in self.rows})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "collectives result") -> CollectivesResult:
        data = dict(_check_format(data, COLLECTIVES_FORMAT, where))
        rows = data.get("rows")
        if not isinstance(rows, list) or not rows:
            raise ResultFormatError(f"{where}: rows must be a non-empty list")
        data["rows"] = [_from_fields(CollectiveRow, r, f"{where}: a row") if isinstance(r, dict) else r for r in rows]
        if not all(isinstance(r, CollectiveRow) for r in data["rows"]):
            raise ResultFormatError(f"{where}: every row must be an object (op, bytes, time_s, algbw_GBps, busbw_GBps)")
        data["version"] = RESULT_VERSION
        return _from_fields(cls, data, where)


def write_result(result: TrainResult | CollectivesResult, path: str | os.PathLike[str]) -> None:
    """Atomically: the harness never reads half a file."""
    write_text(path, json.dumps(result.to_dict(), indent=1))
