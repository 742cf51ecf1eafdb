"""One FSDP2 training measurement, run by every rank under torchrun.

    torchrun ... -m pytest_fabric.workload.train --config config.json

Builds a Hugging Face causal LM from its config (random weights), shards every decoder layer and
then the root with ``fully_shard``, runs warm-up steps and measured steps of AdamW training on
random tokens, and has global rank 0 write a JSON result. The step time of a step is the slowest
rank's, which is what the job waits for. This program never imports pytest.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from .config import TrainConfig


def _pick_device(requested: str) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _pick_attention(requested: str, device: torch.device) -> str:
    # transformers raises instead of falling back when flash_attention_2 is unavailable, so the
    # choice is made here, explicitly, and recorded with the result.
    if requested != "auto":
        return requested
    if device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def _versions(backend: str) -> dict[str, str | None]:
    import transformers

    nccl = None
    if backend == "nccl":
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "backend": backend,
        "nccl": nccl,
        "cuda": torch.version.cuda,
    }


class _Progress:
    """Step-by-step progress lines for the harness's live display (global rank 0 only)."""

    def __init__(self, path: str, enabled: bool, total: int) -> None:
        self._file = open(path, "a", buffering=1) if enabled else None
        self._total = total

    def step(self, phase: str, index: int, seconds: float, tokens: int) -> None:
        if self._file:
            self._file.write(json.dumps({"phase": phase, "step": index, "of": self._total,
                                         "step_s": seconds, "tokens_per_s": tokens / seconds}) + "\n")


def run(cfg: TrainConfig) -> dict | None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from ..models import ModelSpec

    device = _pick_device(cfg.device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
    dist.init_process_group(backend, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,))

    spec = ModelSpec(cfg.model["name"], cfg.model["arch"], cfg.model["config"], "")
    attention = _pick_attention(cfg.attention, device)
    # Same seed on every rank: every rank builds identical weights, so sharding needs no broadcast.
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(spec.hf_config(), attn_implementation=attention)
    model.to(device)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    vocab = spec.config["vocab_size"]
    gen = torch.Generator().manual_seed(cfg.seed + 1 + rank)
    batch = torch.randint(0, vocab, (cfg.batch_size, cfg.seq_len), generator=gen).to(device)
    tokens_per_step = cfg.batch_size * cfg.seq_len * world
    progress = _Progress(cfg.progress_path, rank == 0, cfg.warmup_steps + cfg.steps)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    times: list[float] = []
    loss = None
    for step in range(cfg.warmup_steps + cfg.steps):
        sync()
        start = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        phase = "warmup" if step < cfg.warmup_steps else "measure"
        progress.step(phase, step + 1, elapsed, tokens_per_step)

    # One collective after the loop (none inside it, so the measurement is not perturbed): the job
    # waits for the slowest rank, so that rank's time is the step time.
    local = torch.tensor(times, dtype=torch.float64, device=device)
    slowest = local.clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    nodes: list = [None] * world
    dist.all_gather_object(nodes, os.environ.get("PYTEST_FABRIC_NODE", socket.gethostname()))

    result = None
    if rank == 0:
        measured = slowest[cfg.warmup_steps:].tolist()
        median = statistics.median(measured)
        gpus = world
        result = {
            "model": spec.name,
            "world_size": world,
            "nodes": sorted(set(nodes)),
            "local_world_size": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "batch_size": cfg.batch_size,
            "seq_len": cfg.seq_len,
            "tokens_per_step": tokens_per_step,
            "warmup_step_s": slowest[: cfg.warmup_steps].tolist(),
            "step_s": measured,
            "median_step_s": median,
            "tokens_per_s": tokens_per_step / median,
            "tokens_per_s_per_gpu": tokens_per_step / median / gpus,
            "final_loss": float(loss.detach().float().cpu()) if loss is not None else None,
            "device": device.type,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "attention": attention,
            "fsdp": "fsdp2",
            "versions": _versions(backend),
            "fabric": cfg.fabric,
            "host": platform.node(),
        }
        tmp = Path(cfg.result_path + ".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, cfg.result_path)
    dist.destroy_process_group()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="TrainConfig JSON written by the harness")
    args = parser.parse_args(argv)
    run(TrainConfig.load(args.config))
    return 0


if __name__ == "__main__":
    sys.exit(main())
