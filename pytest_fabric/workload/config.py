"""The typed contract between the harness and the rank program: a config in, a JSON result out."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The choices of a run, the default first (the --device, --fsdp and --mixed-precision options take them from here).
MIXED_PRECISION = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
FSDP_VERSIONS = (2, 1)
COMPILE = ("auto", "on", "off")
# How parameters are sharded (--sharding): "full" shards over every rank (FSDP2 fully_shard on a 1-D
# mesh, FSDP1 FULL_SHARD); "hybrid" shards within a node and replicates across nodes (HSDP: a 2-D
# mesh, replicate x shard in torchtitan's order; FSDP1 HYBRID_SHARD), so only gradients cross nodes.
SHARDINGS = ("full", "hybrid")
# What gradients are reduced in (--reduce-dtype), torchtitan's default (fp32) first.
REDUCE_DTYPES = ("fp32", "bf16")


class ConfigError(ValueError):
    """A TrainConfig that cannot run here. Raised on every rank at the same point (before the
    process group where it can be), so the rank program exits with the reason instead of hanging."""


@dataclass
class TrainConfig:
    model: dict[str, Any]  # ModelSpec.to_dict(): name, arch, config
    batch_size: int
    seq_len: int
    steps: int  # measured steps at least, after the warm-up (clean ones: see workload/signals.py)
    warmup_steps: int
    result_path: str  # written by global rank 0
    progress_path: str  # one JSON line per step, appended by global rank 0
    device: str = "auto"  # "auto": cuda when available, else cpu
    seed: int = 0
    # Seconds a collective (and process-group init) may take before the rank gives up.
    collective_timeout_s: float = 300.0
    attention: str = "auto"  # "auto", "sdpa", "eager", "flash_attention_2"
    fabric: dict[str, Any] = field(default_factory=dict)  # recorded with the result
    fsdp: int = 2  # 2: fully_shard; 1: FullyShardedDataParallel (GPU only)
    # "auto": bf16 on cuda, fp32 on cpu (bf16 matmuls are slow on most CPUs); "bf16"; "fp32".
    mixed_precision: str = "auto"
    activation_checkpointing: bool = False  # non-reentrant, one checkpoint per decoder layer
    # Per-block torch.compile (FSDP2): "auto" (on cuda, off on cpu), "on", "off".
    compile: str = "auto"
    # A local Hugging Face checkpoint directory (config.json + *.safetensors), read by global rank 0
    # only and broadcast while sharding; None: random weights.
    model_path: str | None = None
    # Measuring goes on past ``steps`` until ``measure_s`` seconds of measured steps (0: exactly
    # ``steps``), at most ``max_steps`` steps (window.measuring_done): one window fixed before the launch.
    max_steps: int = 200
    measure_s: float = 6.0
    sharding: str = "full"  # SHARDINGS
    reduce_dtype: str = "fp32"  # REDUCE_DTYPES; under fp32 compute it is fp32 whatever is asked
    # Micro-batches per optimizer step (--grad-accum): gradients accumulate unsharded, without a
    # reduction or a reshard between them (FSDP2), and are reduced once; a step is an optimizer step.
    grad_accum: int = 1

    def __post_init__(self) -> None:
        if self.fsdp not in FSDP_VERSIONS:
            raise ConfigError(f"fsdp={self.fsdp!r}: use 2 (fully_shard) or 1 (FullyShardedDataParallel)")
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"mixed_precision={self.mixed_precision!r}: use one of {', '.join(MIXED_PRECISION)}")
        if self.compile not in COMPILE:
            raise ConfigError(f"compile={self.compile!r}: use one of {', '.join(COMPILE)}")
        if self.sharding not in SHARDINGS:
            raise ConfigError(f"sharding={self.sharding!r}: use one of {', '.join(SHARDINGS)}")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise ConfigError(f"reduce_dtype={self.reduce_dtype!r}: use one of {', '.join(REDUCE_DTYPES)}")
        if not (isinstance(self.grad_accum, int) and self.grad_accum >= 1):
            raise ConfigError(f"grad_accum={self.grad_accum!r}: need a whole number of micro-batches >= 1")
        if self.device not in DEVICES:
            raise ConfigError(f"device={self.device!r}: use auto, cpu or cuda")
        if self.device == "cpu":
            self.check_device("cpu")
        if self.steps < 1 or self.max_steps < self.steps:
            raise ConfigError(f"steps={self.steps}, max_steps={self.max_steps}: need 1 <= steps <= max_steps")
        if not self.measure_s >= 0:
            raise ConfigError(f"measure_s={self.measure_s}: need measure_s >= 0 (0: exactly `steps` steps)")

    def check_device(self, device_type: str) -> None:
        """Refuse what cannot run on ``device_type``, before any process group exists."""
        if self.fsdp == 1 and device_type != "cuda":
            raise ConfigError("fsdp=1 (FullyShardedDataParallel) needs CUDA GPUs: FSDP1 refuses to run without an "
                              f"accelerator, and the device is {device_type}. Use fsdp=2 (fully_shard), "
                              "which runs on CPU with gloo.")

    def precision(self, device_type: str) -> str:
        """The mixed precision that runs on ``device_type``: "bf16" or "fp32"."""
        if self.mixed_precision == "auto":
            return "bf16" if device_type == "cuda" else "fp32"
        return self.mixed_precision

    def compiled(self, device_type: str) -> bool:
        """Whether the decoder blocks are compiled on ``device_type``: "auto" compiles on GPUs (the
        eager step of a small model is host-bound there), not on CPU; FSDP1 is never compiled."""
        if self.fsdp == 1:
            return False
        return self.compile == "on" or (self.compile == "auto" and device_type == "cuda")

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))


# Payload sweeps (nccl-tests' bytes), powers of 4 from 4 KiB, by backend: the largest is the gated one,
# so the link must reach its bus bandwidth there. NCCL on 400 Gbit/s links gets there only near 1 GiB
# (nccl-tests' usual top); gloo over the emulated cluster's links (0.4 to 2 Gbit/s) does by 16 MiB,
# where one all_reduce of 1 GiB would take 4 to 21 s, and every payload is timed several times.
PAYLOADS = {"nccl": [4 ** k for k in range(6, 16)], "gloo": [4 ** k for k in range(6, 13)]}  # ..1 GiB, ..16 MiB


@dataclass
class CollectivesConfig:
    result_path: str
    ops: list[str] = field(default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter"])
    # None: the backend's sweep (``payloads``), which only the rank knows: "auto" picks it there.
    sizes: list[int] | None = None
    iters: int = 5
    warmup_iters: int = 2
    # Each payload is timed for at least this many seconds (more iterations for fast ones), so that
    # a link's token bucket, which lets its first bytes through at full speed, is a small part of
    # what is timed and no payload can appear faster than the link.
    min_timed_s: float = 0.1
    device: str = "auto"
    collective_timeout_s: float = 300.0
    fabric: dict[str, Any] = field(default_factory=dict)

    def payloads(self, backend: str) -> list[int]:
        """The payload sizes to time on ``backend`` ("nccl" or "gloo"): ``sizes`` where given."""
        return self.sizes if self.sizes is not None else PAYLOADS[backend]

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CollectivesConfig:
        return cls(**json.loads(Path(path).read_text()))
