"""Each rank's peak GPU memory, predicted before a launch, and the refusal of a shape that cannot fit.

The peak of an FSDP training step comes at one of two moments (``predict`` takes the larger):

- **end of the forward** (the usual peak): fp32 parameters and AdamW's m and v, sharded over the
  world (12 bytes per parameter / world; the gradients were freed by ``zero_grad(set_to_none=True)``),
  the bf16 blocks FSDP has all-gathered (the root, which holds the embedding and the output head, and
  two decoder blocks: the current one and the prefetched next), every decoder block's saved
  activations and the logits;
- **end of the backward**: the same state plus the fp32 gradients (16 bytes per parameter / world)
  when the activations are small (activation checkpointing of a large model over few tokens).

Activations, per token and decoder block, at the compute dtype's 2 bytes (bf16; fp32 doubles them):
``32 H + 8 I`` bytes in eager mode (H hidden, I MLP width: the fp32 copies HF's RMSNorm saves, q, k,
v, RoPE's outputs, attention output; the MLP's gate, up, SiLU and product), ``COMPILED_ACTIVATIONS``
of that with per-block ``torch.compile`` (Inductor fuses the norms, RoPE and SiLU x up and saves
less). With activation checkpointing a block keeps only its input (2 H bytes; ``AC_COMPILED_KEPT`` H
when the checkpointed block is compiled, measured) and one block's full activations live again while
it is recomputed. Logits: ``LOGIT_BYTES`` per token and vocabulary entry: bf16 logits (2), their fp32
copy for the loss (4), log-softmax's saved output (4), and the start of their gradient.

Calibrated on peaks measured on one H200 (``CALIBRATION``, qwen2.5-1.5b, one rank, bf16, seq 2048);
``errors()`` gives the prediction's error on each, all within 5% (tests/test_memory.py holds them to
it; README "Memory before launching" lists them).

Standard library only: the harness and ``benchmarks/gpu_step.py`` import it without torch.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache

from ..core.models import ModelSpec
from ..core.units import GIB, MIB

# What "80 GB" means when a default shape must fit an H100 80GB: its 81,559 MiB, less 10% kept free
# for the allocator's fragmentation and NCCL's buffers.
H100_BYTES = 81_559 * MIB
HEADROOM = 0.90

COMPILED_ACTIVATIONS = 0.74  # compiled block's saved activations / eager's (calibrated)
AC_COMPILED_KEPT = 13  # bytes x H per token a compiled, checkpointed block keeps (calibrated; eager: 2 H)
LOGIT_BYTES = 11  # per token x vocabulary entry (see the module docstring)
GATHERED_BLOCKS = 2  # decoder blocks all-gathered at once: the current one and the prefetched next

# Measured peaks (torch.cuda.max_memory_allocated, GiB), one rank of qwen2.5-1.5b, seq 2048, bf16,
# one H200 (torch 2.11.0+cu130): (batch, activation checkpointing, compiled) -> GiB.
CALIBRATION: dict[tuple[int, bool, bool], float] = {
    (2, False, False): 37.0, (4, False, False): 56.2, (8, False, False): 94.6,
    (2, False, True): 33.8, (4, False, True): 49.7, (8, False, True): 81.7,
    (8, True, False): 47.1,
    (8, True, True): 51.7, (16, True, True): 85.7,
}
CALIBRATION_MODEL, CALIBRATION_SEQ = "qwen2.5-1.5b", 2048


@dataclass(frozen=True)
class MemoryPrediction:
    """One rank's predicted peak, in bytes, and its parts at the peak's moment."""

    state: float  # parameters, optimizer state (and gradients at the end of the backward), this rank's shard
    gathered: float  # unsharded compute-dtype blocks: root and the blocks being gathered
    activations: float
    logits: float
    moment: str  # "forward" or "backward": when the peak comes

    @property
    def total(self) -> float:
        return self.state + self.gathered + self.activations + self.logits

    @property
    def gib(self) -> float:
        return self.total / GIB

    def describe(self) -> str:
        return (f"{self.gib:.1f} GiB predicted per rank (state {self.state / GIB:.1f}, activations "
                f"{self.activations / GIB:.1f}, logits {self.logits / GIB:.1f}, gathered {self.gathered / GIB:.1f})")


def _block_params(spec: ModelSpec) -> float:
    _, non_embedding = spec.param_count()
    return (non_embedding - spec.hidden) / spec.layers


def predict(spec: ModelSpec, batch: int, seq: int, ranks: int = 1, activation_checkpointing: bool = False,
            compiled: bool = False, precision: str = "bf16") -> MemoryPrediction:
    """Each rank's peak memory for ``batch`` x ``seq`` tokens per rank on ``ranks`` ranks in all."""
    total, _ = spec.param_count()
    h, i, layers = spec.hidden, int(spec.config["intermediate_size"]), spec.layers
    tokens = batch * seq
    width = 2 if precision == "bf16" else 4  # the compute dtype's bytes
    scale = width / 2
    block = (32 * h + 8 * i) * scale * (COMPILED_ACTIVATIONS if compiled else 1.0)  # per token
    if activation_checkpointing:
        kept = (AC_COMPILED_KEPT if compiled else 2) * h * scale
        activations = tokens * (layers * kept + block)
    else:
        activations = tokens * layers * block
    logits = tokens * spec.vocab * LOGIT_BYTES * scale
    root = spec.hidden * spec.vocab * (1 if spec.tied else 2) + spec.hidden
    gathered = width * (root + GATHERED_BLOCKS * _block_params(spec)) if ranks > 1 or width == 2 else 0.0
    forward = MemoryPrediction(12 * total / ranks, gathered, activations, logits, "forward")
    # End of the backward: the gradients exist, the logits and all but one block's activations are gone.
    backward = MemoryPrediction(16 * total / ranks, gathered, tokens * block, 0.0, "backward")
    return max(forward, backward, key=lambda p: p.total)


def errors() -> dict[tuple[int, bool, bool], float]:
    """The prediction's relative error on each calibration point: (predicted - measured) / measured."""
    from ..core.models import get_model

    spec = get_model(CALIBRATION_MODEL)
    return {key: predict(spec, key[0], CALIBRATION_SEQ, 1, key[1], key[2]).gib / measured - 1
            for key, measured in CALIBRATION.items()}


def refusal(spec: ModelSpec, batch: int, seq: int, ranks: int, gpu_bytes: float | None,
            activation_checkpointing: bool, compiled: bool, precision: str = "bf16") -> str:
    """One line saying why this shape cannot fit the GPU and what to change; "" when it fits or the
    GPU's memory is unknown (CPU runs)."""
    if not gpu_bytes:
        return ""
    p = predict(spec, batch, seq, ranks, activation_checkpointing, compiled, precision)
    if p.total <= gpu_bytes:
        return ""
    fixes = []
    if not activation_checkpointing and predict(spec, batch, seq, ranks, True, compiled, precision).total <= gpu_bytes:
        fixes.append("add --activation-checkpointing")
    fitting = next((b for b in range(batch - 1, 0, -1)
                    if predict(spec, b, seq, ranks, activation_checkpointing, compiled, precision).total <= gpu_bytes),
                   None)
    if fitting:
        fixes.append(f"lower --batch-size to {fitting}")
    if not fixes:
        fixes.append("use more GPUs (the parameters and optimizer state shard over them), activation "
                     "checkpointing, or a shorter --seq-len")
    return (f"{spec.name} at {batch} x {seq} per rank on {ranks} rank(s) does not fit the GPU: "
            f"{p.describe()} > {gpu_bytes / GIB:.1f} GiB; {' or '.join(fixes)}")


def default_gpu_shape(spec: ModelSpec, ranks: int, activation_checkpointing: bool = False,
                      compiled: bool = True, gpu_bytes: float = H100_BYTES, seq: int | None = None) -> tuple[int, int]:
    """The model's default shape on GPUs: its sequence length and the largest of its GPU batch sizes
    (``ModelSpec.gpu_batch_sizes``, largest first: enough tokens to keep the step GPU-bound) whose
    predicted peak fits ``HEADROOM`` of an 80 GB H100 at ``ranks`` ranks; the smallest when none does
    (the launch is then refused with what to change)."""
    seq = seq or spec.seq_len
    for batch in spec.gpu_batch_sizes:
        if predict(spec, batch, seq, ranks, activation_checkpointing, compiled).total <= HEADROOM * gpu_bytes:
            return batch, seq
    return spec.gpu_batch_sizes[-1], seq


@lru_cache(maxsize=1)
def local_gpu_bytes() -> int | None:
    """The smallest memory of this machine's GPUs (nvidia-smi), or None without GPUs or the tool."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
        sizes = [int(float(line)) * MIB for line in out.split() if line.strip()]  # MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return min(sizes) if sizes else None
