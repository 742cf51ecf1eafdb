"""One FSDP training measurement, run by every rank under torchrun.

    torchrun ... -m pytest_fabric.workload.train --config config.json

The same program on CPU (gloo, fp32 by default) and on GPUs (NCCL, bf16 mixed precision by default):
joins the process group with hardened timeouts, runs one small collective at once (so a broken
fabric fails here, and NCCL logs its transport before anything is measured), builds a Hugging Face
causal LM on the ``meta`` device and shards it (fsdp.py) with random weights or a checkpoint read by
global rank 0 alone (weights.py), runs warm-up and measured AdamW steps on random tokens, and has
global rank 0 write a JSON result: tokens/s, MFU, peak memory and everything that decided them.
The step time of a step is the slowest rank's, which is what the job waits for. Never imports pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import faulthandler
import json
import math
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from ..core.models import MFU_CONVENTION
from . import compile_cache, faults, fsdp, hangs, marks, metrics, signals, weights
from .window import measuring_done, warmup_done
from .config import ConfigError, TrainConfig
from .result import CollectivesResult, StepSignals, TrainResult, write_result


def _pick_device(requested: str) -> torch.device:
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _pick_attention(requested: str, device: torch.device, precision: fsdp.Precision) -> str:
    # transformers raises instead of falling back when flash_attention_2 is unavailable, so the
    # choice is made here, explicitly, and recorded with the result. FlashAttention-2 runs in bf16
    # or fp16 only: an fp32 run gets SDPA.
    if requested != "auto":
        return requested
    if device.type == "cuda" and precision.name == "bf16":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    return "sdpa"


def _harden_timeouts(collective_timeout_s: float) -> dict[str, str]:
    """NCCL watchdog settings, where the user has not set their own (read when the group starts).

    Asynchronous error handling makes a failed or timed-out collective abort the communicator and
    end the process instead of hanging; the heartbeat timeout ends a process whose watchdog thread
    is itself stuck (in a driver call, say) within the same budget as a collective.
    """
    defaults = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(max(60, math.ceil(collective_timeout_s))),
    }
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in defaults}


def _warm_up(device: torch.device) -> None:
    """One small all_reduce before the model exists: NCCL connects (and writes its transport and
    channel lines to NCCL_DEBUG logs) now, and a fabric that cannot carry it fails here, within the
    collective timeout, rather than in the middle of sharding or measuring."""
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_batch(seed: int, rank: int, batch_size: int, seq_len: int, vocab_size: int) -> torch.Tensor:
    """Rank ``rank``'s random tokens (on CPU): every step trains on the same batch."""
    generator = torch.Generator().manual_seed(seed + 1 + rank)
    return torch.randint(0, vocab_size, (batch_size, seq_len), generator=generator)


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
        "driver": metrics.driver_version(),
    }


class _Progress:
    """Step-by-step progress lines for the harness's live display (global rank 0 only)."""

    def __init__(self, path: str, enabled: bool) -> None:
        self._file = open(path, "a", buffering=1) if enabled else None

    def step(self, phase: str, index: int, seconds: float, tokens: int, at_least: int) -> None:
        if self._file:
            self._file.write(json.dumps({"phase": phase, "step": index, "of": at_least,
                                         "step_s": seconds, "tokens_per_s": tokens / seconds}) + "\n")


def run(cfg: TrainConfig) -> TrainResult | None:
    from torch.distributed.device_mesh import init_device_mesh

    from ..core.models import ModelSpec

    injected = faults.from_env()  # harness self-tests only; empty in real runs
    device = _pick_device(cfg.device)
    cfg.check_device(device.type)  # before joining the group: every rank refuses at once
    precision = fsdp.Precision(cfg.precision(device.type), cfg.reduce_dtype)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeouts = {"collective_timeout_s": cfg.collective_timeout_s, **_harden_timeouts(cfg.collective_timeout_s),
                **hangs.flight_recorder_env(os.path.dirname(cfg.result_path))}
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=cfg.collective_timeout_s),
                            device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    _warm_up(device)
    marks.mark("init")
    mesh = device_mesh(init_device_mesh, device.type, world, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), cfg.sharding)

    spec = ModelSpec(cfg.model["name"], cfg.model["arch"], cfg.model["config"], "")
    attention = _pick_attention(cfg.attention, device, precision)
    torch.manual_seed(cfg.seed)
    source = weights.resolve(cfg.model_path, spec, attention, rank)
    model, built = fsdp.build(cfg.fsdp, source, attention, device, mesh, precision,
                              cfg.activation_checkpointing, cfg.seed, rank, compiled=cfg.compiled(device.type))
    source.state_dict = None  # rank 0's full copy: sharding has broadcast it
    optimizer, optimizer_kind = fsdp.adamw(model.parameters(), device)
    marks.mark("built")

    batch = make_batch(cfg.seed, rank, cfg.batch_size, cfg.seq_len, spec.config["vocab_size"]).to(device)
    tokens_per_step = cfg.batch_size * cfg.seq_len * world * cfg.grad_accum
    progress = _Progress(cfg.progress_path, rank == 0)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    # The node's first rank reads its fabric link's byte counters (one reading per node).
    link = signals.LinkCounters.open(os.environ) if int(os.environ.get("LOCAL_RANK", "0")) == 0 else None
    sampler = signals.NodeSampler(gpu_index=device.index if device.type == "cuda" else None, link=link)
    crosses = bool(cfg.fabric.get("crosses_fabric", True))
    stretch = faults.stretch(injected, cfg.fabric.get("name"), crosses)
    warmup: list[float] = []
    measured: list[signals.StepView] = []
    step_ends: list[float] = []  # rank 0's wall clock at the end of each measured step
    losses: list[torch.Tensor] = []  # read after the loop: reading a loss would wait for the GPU
    compute_dtype = None  # what the forward really ran in, as the logits show
    stopped, step = "", 0
    warming = not warmup_done(warmup, min_steps=cfg.warmup_steps)
    while not stopped:
        faults.at_step(injected, rank, step, cfg.fabric.get("name"), os.path.dirname(cfg.result_path))
        sync()
        before = sampler.cpu()
        start = time.perf_counter()
        for micro in range(cfg.grad_accum):
            loss, compute_dtype = _micro_step(model, batch, cfg.fsdp, last=micro == cfg.grad_accum - 1,
                                              scale=1.0 / cfg.grad_accum)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        # Planted slowdowns (faults.py): every step `stretch` times as long; a stall on some steps only.
        factor = stretch * faults.stall_factor(injected, cfg.fabric.get("name"), crosses, cfg.seed, step)
        if factor > 1.0:
            time.sleep((time.perf_counter() - start) * (factor - 1.0))
        elapsed = time.perf_counter() - start
        ended = time.time()  # wall clock, to place the step among outside events (benchmarks/detector.py)
        # Outside the timed region: the node's signals, then one small all-reduce so that every
        # rank sees every rank's figures and takes the same decisions.
        row = sampler.step_row(elapsed, before, sampler.cpu())
        view = _step_view(row, rank, world, device)
        losses.append(loss.detach())
        phase = "warmup" if warming else "measure"
        if warming:
            warmup.append(view.step_s)
            warming = not warmup_done(warmup, min_steps=cfg.warmup_steps)
        else:
            measured.append(view)
            step_ends.append(round(ended, 4))
            stopped = measuring_done([v.step_s for v in measured], min_steps=cfg.steps,
                                           max_steps=cfg.max_steps, measure_s=cfg.measure_s)
        step += 1
        progress.step(phase, step, view.step_s, tokens_per_step, cfg.warmup_steps + cfg.steps)
    marks.mark("steps_done")

    memory, memory_kind = metrics.peak_memory(device)
    ranks: list[Any] = [None] * world
    dist.all_gather_object(ranks, {"node": os.environ.get("PYTEST_FABRIC_NODE", socket.gethostname()),
                                   "gpu": metrics.gpu_name(device), "peak_memory_bytes": memory,
                                   "gpu_health": sampler.gpu_health()})

    result = None
    if rank == 0:
        gpu_names = sorted({r["gpu"] for r in ranks if r["gpu"]})
        # One peak for the job: ranks on different GPU models have none.
        peak = metrics.peak_for(gpu_names[0]) if len(gpu_names) == 1 else None
        result = TrainResult(
            model=spec.name,
            world_size=world,
            hosts=sorted({r["node"] for r in ranks}),
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            batch_size=cfg.batch_size,
            seq_len=cfg.seq_len,
            tokens_per_step=tokens_per_step,
            step_s=[v.step_s for v in measured],
            warmup_step_s=warmup,
            signals=StepSignals(
                steal_s=[v.steal_s for v in measured], foreign_s=[v.foreign_s for v in measured],
                sm_clock_mhz=[v.sm_clock_mhz for v in measured],
                throttle=[v.throttle for v in measured], disturbed=signals.judge_launch(measured),
                gpu_busy=[v.gpu_busy for v in measured] if any(v.gpu_busy is not None for v in measured) else [],
                link_tx_bytes=[v.link_tx_bytes for v in measured] if all(v.link_tx_bytes is not None for v in measured)
                else [],
                link_rx_bytes=[v.link_rx_bytes for v in measured] if all(v.link_rx_bytes is not None for v in measured)
                else [],
                rank_step_s=[[round(t, 6) for t in v.rank_step_s] for v in measured],
                rank_cpu_s=[[round(t, 6) for t in v.rank_cpu_s] for v in measured],
                step_end_unix=step_ends, **signals.gpu_per_rank(measured)),
            stopped=stopped,
            flops_per_token=spec.flops_per_token(cfg.seq_len),
            flops_convention=MFU_CONVENTION,
            gpu_name=", ".join(gpu_names) or None,
            peak_gpu=peak.gpu if peak else None,
            peak_flops_per_gpu=peak.bf16_flops if peak else None,
            mfu_note=_mfu_note(device, gpu_names, peak),
            peak_memory_bytes=max(r["peak_memory_bytes"] for r in ranks),
            peak_memory_kind=memory_kind,
            peak_memory_bytes_per_rank=[r["peak_memory_bytes"] for r in ranks],
            rank_hosts=[r["node"] for r in ranks],
            rank_gpu_health=[r["gpu_health"] for r in ranks] if any(r["gpu_health"] for r in ranks) else [],
            first_loss=float(losses[0].float().cpu()) if losses else None,
            final_loss=float(losses[-1].float().cpu()) if losses else None,
            device=device.type,
            dtype=str(compute_dtype or precision.param_dtype).removeprefix("torch."),
            mixed_precision=precision.name,
            reduce_dtype=str(precision.reduce_dtype).removeprefix("torch."),
            attention=attention,
            fsdp=f"fsdp{cfg.fsdp}",
            sharding=cfg.sharding,
            grad_accum=cfg.grad_accum,
            fsdp1_min_num_params=built.get("fsdp1_min_num_params"),
            fsdp1_use_orig_params=built.get("fsdp1_use_orig_params"),
            tied_parameters=built["tied_parameters"],
            activation_checkpointing=cfg.activation_checkpointing,
            compile=built["compile"],
            compile_cache=compile_cache.cache_counts(),
            optimizer=f"adamw {optimizer_kind}",
            weights=source.source,
            timeouts=timeouts,
            versions=_versions(backend),
            fabric=cfg.fabric,
            host=platform.node(),
        )
    if result is not None and (cut := faults.truncates(injected, rank, cfg.fabric.get("name"))):
        faults.write_truncated(cut, cfg.result_path, json.dumps(result.to_dict(), indent=1))
        result = None  # the harness self-test: the file stays cut in the middle
    finish(result, cfg.result_path)
    return result


def device_mesh(init: Any, device_type: str, world: int, local_world: int, sharding: str) -> Any:
    """The ranks' mesh: 1-D over every rank (full shard), or for hybrid sharding 2-D, nodes x ranks
    per node, named ("replicate", "shard") in torchtitan's order: FSDP shards over a node's ranks and
    replicates across nodes (``init``: ``init_device_mesh``, torchrun numbers a node's ranks together)."""
    if sharding != "hybrid":
        return init(device_type, (world,))
    if local_world < 1 or world % local_world:
        raise ConfigError(f"hybrid sharding needs the same ranks on every node: {world} ranks, {local_world} per node")
    return init(device_type, (world // local_world, local_world), mesh_dim_names=("replicate", "shard"))


def _micro_step(model: Any, batch: torch.Tensor, fsdp_version: int, last: bool, scale: float) -> tuple[Any, Any]:
    """One micro-batch's forward and backward. Before the last one of an optimizer step, gradients
    accumulate unsharded: FSDP2 neither reduces them nor reshards the parameters after backward
    (``set_requires_gradient_sync``, ``set_reshard_after_backward``), FSDP1 skips the reduction
    (``no_sync``); the last reduces once."""
    context = contextlib.nullcontext()
    if fsdp_version == 2:
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)
    elif not last:
        context = model.no_sync()
    with context:
        out = model(input_ids=batch, labels=batch, use_cache=False)
        loss, dtype = out.loss, out.logits.dtype
        del out
        (loss * scale).backward()
    return loss, dtype


def _step_view(row: list[float], rank: int, world: int, device: torch.device) -> signals.StepView:
    """Every rank's signals row for this step, summed into place (each rank fills its own slot)."""
    width = len(signals.FIELDS)
    table = torch.zeros(world * width, dtype=torch.float64, device=device)
    table[rank * width:(rank + 1) * width] = torch.tensor(row, dtype=torch.float64)
    dist.all_reduce(table)
    values = table.cpu().tolist()
    rows = [values[r * width:(r + 1) * width] for r in range(world)]
    return signals.combine(rows, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def _mfu_note(device: torch.device, gpu_names: list[str], peak: metrics.Peak | None) -> str | None:
    """Why MFU is None, or None when it is not."""
    if device.type != "cuda":
        return f"no bf16 peak for {device.type}"
    if len(gpu_names) > 1:
        return f"mixed GPU models: {', '.join(gpu_names)}"
    if peak is None:
        return f"no bf16 peak known for {gpu_names[0] if gpu_names else 'this GPU'} (workload/metrics.py PEAKS)"
    return None


@record  # torchrun's failure summary then names the rank's exception, not just its exit code
def main(argv: list[str] | None = None) -> int:
    marks.mark("entry")  # where a launch's time goes (marks.py)
    _dump_stacks_on_sigusr1()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="TrainConfig JSON written by the harness")
    args = parser.parse_args(argv)
    try:
        cfg = TrainConfig.load(args.config)
        marks.begin(os.path.dirname(cfg.result_path))
        hangs.install(os.path.dirname(cfg.result_path))  # stacks and flight recorder into the run directory
        with recording():
            run(cfg)
    except ConfigError as exc:
        print(f"pytest_fabric.workload.train: {exc}", file=sys.stderr, flush=True)
        if dist.is_initialized():  # every rank raises the same error at the same point
            dist.barrier()
            dist.destroy_process_group()
            _exit_now(2)  # a gloo group was up: leave as a finished launch does (see _exit_now)
        return 2
    _exit_now(0)
    return 0


@contextlib.contextmanager
def recording():
    """A Python exception that ends the rank (a collective's timeout, a crash) goes to its stack file
    with its flight recorder (hangs.py) before it propagates."""
    try:
        yield
    except Exception as exc:
        hangs.record_exception(exc)
        raise


def rank_main(argv: list[str] | None, description: str, load: Callable[[str], Any],
              run_program: Callable[[Any], object]) -> int:
    """A measuring rank program's main (collectives.py, pairs.py): its config, its stacks and flight
    recorder into the run directory (hangs.py), then the program; a Python exception that ends it is
    recorded there before it propagates (to torchrun's ``@record`` on the caller)."""
    marks.mark("entry")
    _dump_stacks_on_sigusr1()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", required=True, help="the config JSON written by the harness")
    cfg = load(parser.parse_args(argv).config)
    run_dir = os.path.dirname(cfg.result_path)
    marks.begin(run_dir)
    hangs.install(run_dir)
    hangs.flight_recorder_env(run_dir)
    with recording():
        run_program(cfg)
    _exit_now(0)
    return 0


def _dump_stacks_on_sigusr1() -> None:
    """Until hangs.install has a stack file for them, SIGUSR1's stacks go to the log. Best effort: a stderr without a file descriptor (a test capturing it) has no dump."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both OSError and ValueError
        pass


def finish(result: TrainResult | CollectivesResult | None, result_path: str) -> None:
    """Global rank 0 writes the result atomically (the harness never reads half a file); then every
    rank leaves the process group at the same point."""
    if result is not None:
        write_result(result, result_path)
    dist.barrier()
    dist.destroy_process_group()


def _exit_now(code: int) -> None:
    """Exit without running C++ static destructors, once the result is on disk.

    Seen here on torch 2.13 CPU/gloo: a non-zero rank that had finished, written nothing more and
    destroyed its process group still aborted at interpreter exit ("terminate called without an
    active exception", SIGABRT) in about one launch in twenty, turning a good measurement into a
    failed launch. Everything the harness reads is written and flushed before this point.
    """
    marks.write()  # global rank 0's marks, the last thing it does
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
