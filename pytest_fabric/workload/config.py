"""The typed contract between the harness and the rank program: a config in, a JSON result out."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class TrainConfig:
    model: dict[str, Any]  # ModelSpec.to_dict(): name, arch, config
    batch_size: int
    seq_len: int
    steps: int  # measured steps, after the warm-up
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
    mixed_precision: str = "auto"  # "auto" (bf16 on cuda, fp32 on cpu), "bf16", "fp32"
    activation_checkpointing: bool = False
    model_path: str | None = None  # HF checkpoint directory; None: random weights

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> TrainConfig:
        return cls(**json.loads(Path(path).read_text()))


@dataclass
class CollectivesConfig:
    result_path: str
    ops: list[str] = field(default_factory=lambda: ["all_reduce", "all_gather", "reduce_scatter"])
    sizes: list[int] = field(default_factory=lambda: [1 << k for k in range(12, 25, 2)])  # 4 KiB .. 16 MiB
    iters: int = 5
    warmup_iters: int = 2
    device: str = "auto"
    collective_timeout_s: float = 300.0
    fabric: dict[str, Any] = field(default_factory=dict)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> CollectivesConfig:
        return cls(**json.loads(Path(path).read_text()))
