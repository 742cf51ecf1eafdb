"""The GPU step's table in one command on one GPU: FSDP2 eager and compiled, activation
checkpointing and FSDP1, with tokens/s, MFU (output head counted), GPU busy share, measured and
predicted peak memory.

    PYTHONPATH=. python benchmarks/gpu_step.py --out DIR            # one GPU, about 5 minutes
    PYTHONPATH=. python benchmarks/gpu_step.py --out DIR --smoke    # CPU, tiny model, under a minute

Each configuration runs in a fresh process (one rank: ``init_process_group`` on a single rank), so
its peak memory is its own and an out-of-memory in one does not end the table; each has a time
limit, and the whole run a time budget (configurations that would not fit in it are listed as
skipped). A shape whose predicted peak (``pytest_fabric.physics.memory``) exceeds the GPU is skipped before
it starts. The model is the catalog's architecture built from its config with random weights (no
download). Writes ``gpu_step.json`` and ``gpu_step.md`` into ``--out``.

Needs torch and transformers only (no pytest-fabric install, no junitparser): it imports the
modules it uses from the tree on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tree this file is in

from pytest_fabric.physics import memory  # noqa: E402  (standard library + the model catalog)
from pytest_fabric.core.models import MFU_CONVENTION, get_model  # noqa: E402


@dataclass(frozen=True)
class Config:
    name: str  # e.g. "compiled 8x2048"
    batch: int
    seq: int
    compiled: bool = False
    ac: bool = False
    fsdp: int = 2
    expected_s: float = 30.0  # what it usually takes, start to end (for the time budget)


def gpu_configs(seq: int = 2048) -> list[Config]:
    """In priority order: what the budget keeps first."""
    return [
        Config(f"compiled 8x{seq}", 8, seq, compiled=True, expected_s=80),
        Config(f"compiled 4x{seq}", 4, seq, compiled=True, expected_s=70),
        Config(f"eager 2x{seq}", 2, seq, expected_s=30),
        Config(f"eager+AC 8x{seq}", 8, seq, ac=True, expected_s=35),
        Config(f"fsdp1 4x{seq}", 4, seq, fsdp=1, expected_s=35),
        Config(f"eager 4x{seq}", 4, seq, expected_s=30),
        Config(f"eager 8x{seq}", 8, seq, expected_s=35),
        Config(f"compiled 2x{seq}", 2, seq, compiled=True, expected_s=60),
    ]


def smoke_configs() -> list[Config]:
    return [Config("eager 2x64", 2, 64, expected_s=15), Config("compiled 2x64", 2, 64, compiled=True, expected_s=30),
            Config("eager+AC 2x64", 2, 64, ac=True, expected_s=15)]


# --- One configuration, in its own process ---------------------------------------------------------


def run_one(model: str, cfg: Config, device_name: str, warmup: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from pytest_fabric.workload import fsdp, metrics, signals, weights

    cuda = device_name == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120), device_id=device if cuda else None)
    mesh = init_device_mesh(device.type, (1,))
    spec = get_model(model)
    precision = fsdp.Precision("bf16" if cuda else "fp32")
    source = weights.resolve(None, spec, "sdpa", 0)
    net, built = fsdp.build(cfg.fsdp, source, "sdpa", device, mesh, precision, cfg.ac, 0, 0, compiled=cfg.compiled)
    optimizer, kind = fsdp.adamw(net.parameters(), device)
    batch = torch.randint(0, spec.vocab, (cfg.batch, cfg.seq), generator=torch.Generator().manual_seed(1)).to(device)
    sampler = signals.NodeSampler(gpu_index=0 if cuda else None)
    times, busy = [], []
    for step in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        loss = net(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.append(elapsed)
            share = sampler.gpu_busy()
            busy.append(share if share >= 0 else None)
    peak, kind_of_peak = metrics.peak_memory(device)
    gpu = metrics.gpu_name(device)
    p = metrics.peak_for(gpu)
    dist.destroy_process_group()
    return {"step_s": times, "gpu_busy": busy, "peak_memory_bytes": peak, "peak_memory_kind": kind_of_peak,
            "gpu": gpu, "peak_gpu": p.gpu if p else None, "peak_flops": p.bf16_flops if p else None,
            "optimizer": f"adamw {kind}", "compile": built["compile"], "loss": float(loss.float().cpu()),
            "fsdp1_use_orig_params": built.get("fsdp1_use_orig_params"),
            "versions": {"torch": torch.__version__,
                         "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}}


# --- The table ---------------------------------------------------------------------------------------


def row_of(model: str, cfg: Config, out: dict | None, error: str, precision: str) -> dict:
    spec = get_model(model)
    predicted = memory.predict(spec, cfg.batch, cfg.seq, 1, cfg.ac, cfg.compiled, precision)
    row = {"config": cfg.name, "batch": cfg.batch, "seq": cfg.seq, "compile": cfg.compiled, "ac": cfg.ac,
           "fsdp": cfg.fsdp, "predicted_gib": round(predicted.gib, 1), "error": error}
    if out:
        step = statistics.median(out["step_s"])
        tokens_per_s = cfg.batch * cfg.seq / step
        busy = [b for b in out["gpu_busy"] if b is not None]
        mfu = spec.flops_per_token(cfg.seq) * tokens_per_s / out["peak_flops"] if out["peak_flops"] else None
        measured = out["peak_memory_bytes"] / memory.GIB
        on_gpu = out["peak_memory_kind"] == "cuda_max_memory_allocated"
        row.update(ms_per_step=round(step * 1000, 1), tokens_per_s=round(tokens_per_s), mfu=mfu,
                   gpu_busy=statistics.median(busy) if busy else None, measured_gib=round(measured, 1),
                   prediction_error=(predicted.gib / measured - 1) if on_gpu else None, detail=out)
    return row


def markdown(rows: list[dict], model: str, header: str) -> str:
    pct = lambda v: "n/a" if v is None else f"{v * 100:.1f}%"  # noqa: E731
    signed = lambda v: "n/a" if v is None else f"{v * 100:+.1f}%"  # noqa: E731
    lines = [header, "", "| config | ms/step | tokens/s | MFU | GPU busy | peak GiB | predicted GiB | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "ms_per_step" in r:
            lines.append(f"| {r['config']} | {r['ms_per_step']} | {r['tokens_per_s']} | {pct(r['mfu'])} | "
                         f"{pct(r['gpu_busy'])} | {r['measured_gib']} | {r['predicted_gib']} | {signed(r['prediction_error'])} |")
        else:
            lines.append(f"| {r['config']} | {r['error']} | | | | | {r['predicted_gib']} | |")
    lines += ["", f"MFU: {MFU_CONVENTION}. Model {model}, one rank, random weights, median of the measured steps."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for gpu_step.json and gpu_step.md")
    parser.add_argument("--smoke", action="store_true", help="CPU, qwen2-tiny, tiny shapes: checks the script works")
    parser.add_argument("--model", default=None, help="catalog model (default qwen2.5-1.5b; --smoke: qwen2-tiny)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=285.0, help="the whole run's time budget (default 285)")
    parser.add_argument("--config-timeout-s", type=float, default=150.0, help="one configuration's limit")
    parser.add_argument("--gpu-memory-gib", type=float, default=None, help="default: nvidia-smi's figure")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    model = args.model or ("qwen2-tiny" if args.smoke else "qwen2.5-1.5b")
    if args.run_one:
        job = json.loads(args.run_one)
        result = run_one(job["model"], Config(**job["config"]), job["device"], job["warmup"], job["steps"])
        Path(job["result"]).write_text(json.dumps(result))
        return 0

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = "cpu" if args.smoke else "cuda"
    configs = smoke_configs() if args.smoke else gpu_configs()
    warmup, steps = (1, 2) if args.smoke else (args.warmup, args.steps)
    gpu_bytes = None if args.smoke else (args.gpu_memory_gib * memory.GIB if args.gpu_memory_gib
                                         else memory.local_gpu_bytes())
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "PYTHONUNBUFFERED": "1",
           # Compiled configurations share Inductor's cache: kernels compiled once serve the next shape.
           "TORCHINDUCTOR_CACHE_DIR": str(out / "inductor-cache")}
    if args.smoke:
        env.setdefault("OMP_NUM_THREADS", "1")
    began = time.monotonic()
    rows = []
    for cfg in configs:
        error, result = "", None
        if cfg.fsdp == 1 and device != "cuda":
            error = "skipped: FSDP1 needs a GPU"
        elif gpu_bytes and memory.predict(get_model(model), cfg.batch, cfg.seq, 1, cfg.ac, cfg.compiled).total > gpu_bytes:
            error = f"skipped: predicted over the GPU's {gpu_bytes / memory.GIB:.0f} GiB"
        elif time.monotonic() - began + cfg.expected_s > args.budget_s:
            error = "skipped: time budget"
        if not error:
            result_path = out / f"{cfg.name.replace(' ', '_').replace('+', '_')}.json"
            job = {"model": model, "config": asdict(cfg), "device": device, "warmup": warmup, "steps": steps,
                   "result": str(result_path)}
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            started = time.monotonic()
            try:
                proc = subprocess.run([sys.executable, __file__, "--out", str(out), "--run-one", json.dumps(job)],
                                      env={**env, "MASTER_PORT": str(port)}, capture_output=True, text=True,
                                      timeout=args.config_timeout_s)
                if proc.returncode == 0 and result_path.exists():
                    result = json.loads(result_path.read_text())
                else:
                    tail = (proc.stderr or proc.stdout).strip().splitlines()
                    oom = any("OutOfMemoryError" in line or "out of memory" in line for line in tail)
                    error = "failed: CUDA out of memory" if oom else f"failed (exit {proc.returncode}): " + (
                        tail[-1][:160] if tail else "no output")
                    (out / f"{result_path.stem}.log").write_text(proc.stdout + proc.stderr)
            except subprocess.TimeoutExpired:
                error = f"failed: over {args.config_timeout_s:.0f} s"
            print(f"{cfg.name}: {time.monotonic() - started:.0f} s {error}", file=sys.stderr, flush=True)
        rows.append(row_of(model, cfg, result, error, "fp32" if args.smoke else "bf16"))
    gpu = next((r["detail"]["gpu"] for r in rows if r.get("detail")), None) or device
    header = (f"gpu_step: {model} on {gpu}, {warmup} warm-up + {steps} measured steps per configuration, "
              f"{time.monotonic() - began:.0f} s in all")
    table = markdown(rows, model, header)
    (out / "gpu_step.md").write_text(table)
    (out / "gpu_step.json").write_text(json.dumps({"model": model, "device": gpu, "mfu_convention": MFU_CONVENTION,
                                                   "rows": rows}, indent=1))
    print(table)
    return 0 if any("ms_per_step" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
