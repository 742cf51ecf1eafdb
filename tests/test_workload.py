"""The rank program (pytest_fabric/workload/): config checks, MFU and peaks, weights, and real torchrun launches.

The launches run the CPU paths end to end with two ranks on gloo: a checkpoint read by rank 0 alone
and broadcast while sharding (its first loss must equal transformers' own loss on the same batch),
activation checkpointing, bf16 mixed precision, and a broken checkpoint that must stop every rank
at once. What only a GPU can run (NCCL, FSDP1, FlashAttention-2, CUDA memory and MFU) is checked
here as far as it goes without one: config refusal, the FSDP1 materializer, the peak table.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from pytest_fabric.models import get_model
from pytest_fabric.workload import fsdp, metrics, train, weights
from pytest_fabric.workload.config import ConfigError, TrainConfig

REPO = Path(__file__).resolve().parents[1]

# What measure.py reads from every result; the GPU work must not lose any of them.
HARNESS_KEYS = {"tokens_per_s", "tokens_per_s_per_gpu", "median_step_s", "step_s", "world_size", "nodes",
                "local_world_size", "final_loss", "versions", "attention", "device", "dtype", "fabric",
                "tokens_per_step"}
NEW_KEYS = {"mfu", "mfu_note", "peak_flops_per_gpu", "flops_per_token", "gpu_name", "peak_memory_bytes",
            "peak_memory_kind", "activation_checkpointing", "fsdp", "mixed_precision", "reduce_dtype", "weights",
            "first_loss", "timeouts"}


def config(tmp_path: Path, model: str = "qwen2-tiny", **fields) -> TrainConfig:
    fields = {"batch_size": 1, "seq_len": 64, "steps": 1, "warmup_steps": 0, "device": "cpu",
              "collective_timeout_s": 120, **fields}
    return TrainConfig(model=get_model(model).to_dict(), result_path=str(tmp_path / "result.json"),
                       progress_path=str(tmp_path / "progress.jsonl"), **fields)


def launch(tmp_path: Path, cfg: TrainConfig, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    """Two ranks under real torchrun on this machine; the whole process group is killed on timeout."""
    cfg.dump(tmp_path / "config.json")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
            "-m", "pytest_fabric.workload.train", "--config", str(tmp_path / "config.json")]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun still running after {timeout_s} s:\n{out[-4000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out)


def result_of(run: subprocess.CompletedProcess[str], cfg: TrainConfig) -> dict:
    assert run.returncode == 0, run.stdout[-4000:]
    return json.loads(Path(cfg.result_path).read_text())


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A qwen2-tiny checkpoint as save_pretrained writes it (tied embeddings: one stored tensor).

    Weights ten times larger than the default initializer makes attention sharp, so that a wrong
    weight or a wrong RoPE buffer moves the loss far beyond the tolerance (at std 0.02 a garbage RoPE
    moves it by 1e-5).
    """
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("qwen2-tiny-checkpoint")
    hf_config = get_model("qwen2-tiny").hf_config()
    hf_config.initializer_range = 0.3
    torch.manual_seed(1234)
    AutoModelForCausalLM.from_config(hf_config).save_pretrained(path)
    return path


def reference_loss(checkpoint: Path, batch: torch.Tensor) -> float:
    """transformers' own loss for ``batch`` with the checkpoint, in one process, fp32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        return model(input_ids=batch, labels=batch).loss.item()


# --- TrainConfig -------------------------------------------------------------------------------


def test_defaults_keep_the_cpu_workload(tmp_path):
    cfg = config(tmp_path, device="auto")
    assert (cfg.fsdp, cfg.activation_checkpointing, cfg.model_path, cfg.mixed_precision) == (2, False, None, "auto")
    assert cfg.precision("cpu") == "fp32" and cfg.precision("cuda") == "bf16"
    assert config(tmp_path, mixed_precision="bf16").precision("cpu") == "bf16"
    cfg.dump(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == cfg


@pytest.mark.parametrize(("field", "value"), [("fsdp", 3), ("mixed_precision", "fp16"), ("device", "tpu")])
def test_unknown_values_are_refused(tmp_path, field, value):
    with pytest.raises(ConfigError, match=field):
        config(tmp_path, **{field: value})


def test_fsdp1_on_cpu_is_refused_before_any_rank_starts(tmp_path, capsys):
    with pytest.raises(ConfigError, match="FSDP1 refuses to run without an accelerator.*fsdp=2"):
        config(tmp_path, fsdp=1)
    # The rank program given such a config (written by hand) says so and exits 2.
    (tmp_path / "bad.json").write_text(json.dumps({**asdict(config(tmp_path)), "fsdp": 1}))
    assert train.main(["--config", str(tmp_path / "bad.json")]) == 2
    assert "fsdp=1 (FullyShardedDataParallel) needs CUDA GPUs" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="device auto picks cuda here")
def test_fsdp1_with_device_auto_is_refused_on_a_cpu_rank_before_joining_the_group(tmp_path):
    import torch.distributed as dist

    with pytest.raises(ConfigError, match="the device is cpu"):
        train.run(config(tmp_path, device="auto", fsdp=1))
    assert not dist.is_initialized()


# --- MFU, peaks, memory, versions ----------------------------------------------------------------


@pytest.mark.parametrize(("name", "table_name", "peak"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", "H100 NVL", 835e12),
    ("NVIDIA H200", "H200 SXM", 989e12),
    ("NVIDIA GH200 480GB", "GH200", 989e12),
    ("NVIDIA A100-SXM4-80GB", "A100", 312e12),
    ("NVIDIA A100 80GB PCIe", "A100", 312e12),
    ("NVIDIA L40S", "L40S", 362e12),
    ("NVIDIA L40", "L40", 181e12),
    ("NVIDIA L4", "L4", 121e12),
    ("NVIDIA A10", "A10", 125e12),
])
def test_peak_table_by_device_name(name, table_name, peak):
    assert metrics.peak_for(name) == metrics.Peak(table_name, peak)


@pytest.mark.parametrize("name", [None, "", "Tesla V100-SXM2-32GB", "NVIDIA A10G", "NVIDIA GeForce RTX 4090"])
def test_no_peak_for_a_cpu_or_an_unknown_gpu(name):
    assert metrics.peak_for(name) is None


def test_mfu_formula():
    spec = get_model("llama-3.1-8b")
    flops = spec.flops_per_token(2048)
    # 8 H100 SXM at 3000 tokens/s per GPU: 6N + 12 L H S = about 4.0e10 FLOPs per token.
    assert flops == pytest.approx(6 * spec.param_count()[1] + 12 * 32 * 4096 * 2048)
    mfu = metrics.mfu(24_000, flops, 8, metrics.peak_for("NVIDIA H100 80GB HBM3").bf16_flops)
    assert mfu == pytest.approx(flops * 24_000 / (8 * 989e12))
    assert 0.1 < mfu < 0.2
    assert metrics.mfu(24_000, flops, 8, None) is None  # CPU or unknown GPU: recorded as None


def test_peak_memory_on_cpu_is_the_peak_resident_set():
    memory, kind = metrics.peak_memory(torch.device("cpu"))
    assert kind == "cpu_max_rss"
    assert 10 * 2**20 < memory < 1024 * 2**30


def test_driver_version_from_proc_line():
    proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024"
    open_module = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
                   "(dvs-builder@U16-I3-B03-4-3)  Thu Jan 23 22:50:36 UTC 2025")
    assert metrics.parse_driver_version(proprietary) == "550.54.15"
    assert metrics.parse_driver_version(open_module) == "570.86.15"
    assert metrics.parse_driver_version("") is None


def test_timeouts_are_set_only_where_the_user_has_not(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", raising=False)
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "900")
    assert train._harden_timeouts(300) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
                                           "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "900"}
    monkeypatch.delenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    assert train._harden_timeouts(299.5)["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "300"


def test_attention_choice(monkeypatch):
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    bf16, fp32 = fsdp.Precision("bf16"), fsdp.Precision("fp32")
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # importing it raises ImportError
    assert train._pick_attention("auto", cuda, bf16) == "sdpa"
    monkeypatch.setitem(sys.modules, "flash_attn", type(sys)("flash_attn"))
    assert train._pick_attention("auto", cuda, bf16) == "flash_attention_2"
    assert train._pick_attention("auto", cuda, fp32) == "sdpa"  # FlashAttention-2 has no fp32 kernels
    assert train._pick_attention("auto", cpu, bf16) == "sdpa"
    assert train._pick_attention("eager", cuda, bf16) == "eager"


def test_batches_are_reproducible_and_differ_between_ranks():
    assert torch.equal(train.make_batch(0, 0, 2, 16, 256), train.make_batch(0, 0, 2, 16, 256))
    assert not torch.equal(train.make_batch(0, 0, 2, 16, 256), train.make_batch(0, 1, 2, 16, 256))


# --- Weights -------------------------------------------------------------------------------------


def test_a_checkpoint_of_another_model_is_refused():
    with pytest.raises(ValueError, match=r"is not model 'qwen2-tiny'.*model_type 'llama' != 'qwen2'.*hidden_size"):
        weights.check_matches(get_model("llama-wide").hf_config(), get_model("qwen2-tiny"))
    weights.check_matches(get_model("qwen2-tiny").hf_config(), get_model("qwen2-tiny"))


def test_checkpoint_files_are_checked(tmp_path, checkpoint):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        weights.read_config(tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        weights.read_config(tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        weights.read_state_dict(tmp_path)
    assert weights.read_config(checkpoint)["model_type"] == "qwen2"


def test_tied_embeddings_are_completed_and_stray_tensors_refused(checkpoint):
    state_dict = weights.read_state_dict(checkpoint)
    assert "lm_head.weight" not in state_dict  # save_pretrained stores a tied tensor once
    model = weights.build_on_meta(get_model("qwen2-tiny").hf_config(), "sdpa")
    assert weights.tied_groups(model) == [["model.embed_tokens.weight", "lm_head.weight"]]
    weights.check_keys(state_dict, model)
    assert state_dict["lm_head.weight"] is state_dict["model.embed_tokens.weight"]
    state_dict["model.extra.weight"] = torch.zeros(1)
    del state_dict["model.norm.weight"]
    with pytest.raises(ValueError, match="missing model.norm.weight, unexpected model.extra.weight"):
        weights.check_keys(state_dict, model)


@pytest.mark.parametrize("rank", [0, 1])
def test_fsdp1_materializer_fills_rank0_from_the_checkpoint(checkpoint, rank):
    """FSDP1 (GPU only) calls this per module while wrapping; here it runs alone, on CPU. Rank 0's
    model must be the checkpoint's exactly (sync_module_states then broadcasts it); every rank's
    tied embeddings must stay one parameter, or the ranks' flat parameters would disagree."""
    state_dict = weights.read_state_dict(checkpoint)
    source = weights.Weights(f"checkpoint:{checkpoint}", weights.hf_config(weights.read_config(checkpoint)),
                             state_dict if rank == 0 else None)
    model = weights.build_on_meta(source.config, "sdpa")
    if rank == 0:
        weights.check_keys(state_dict, model)
    materialize = fsdp._materializer(model, source, torch.device("cpu"), torch.Generator(), rank)
    for module in list(model.modules()):
        materialize(module)
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.lm_head.weight is model.model.embed_tokens.weight
    if rank == 0:
        batch = train.make_batch(0, 0, 1, 64, 256)
        with torch.no_grad():
            loss = model(input_ids=batch, labels=batch).loss.item()
        assert loss == pytest.approx(reference_loss(checkpoint, batch), abs=1e-5)


# --- Real launches (two ranks, gloo) -------------------------------------------------------------


@pytest.mark.slow
def test_checkpoint_read_by_rank0_is_broadcast_while_sharding(tmp_path, checkpoint):
    """Meta-device construction, rank 0 alone reading the checkpoint, set_model_state_dict broadcasting
    it: rank 0's first loss is transformers' own loss on rank 0's batch, which it cannot be unless
    every shard (half of them on rank 1) holds the checkpoint's weights and RoPE buffers are right.
    Activation checkpointing rides along: it changes no loss, and its wrapper renames parameters."""
    cfg = config(tmp_path, model_path=str(checkpoint), activation_checkpointing=True, warmup_steps=1)
    result = result_of(launch(tmp_path, cfg), cfg)

    expected = reference_loss(checkpoint, train.make_batch(cfg.seed, 0, 1, 64, 256))
    assert result["first_loss"] == pytest.approx(expected, abs=1e-4)
    assert abs(expected - math.log(256)) > 0.5  # a loss random weights would not give
    assert result["weights"] == f"checkpoint:{checkpoint}"
    assert result["activation_checkpointing"] is True
    assert (result["mixed_precision"], result["dtype"], result["reduce_dtype"]) == ("fp32", "float32", "float32")
    assert HARNESS_KEYS | NEW_KEYS <= set(result)
    assert (result["device"], result["fsdp"], result["attention"], result["world_size"]) == ("cpu", "fsdp2", "sdpa", 2)
    assert result["mfu"] is None and result["peak_flops_per_gpu"] is None and result["gpu_name"] is None
    assert result["mfu_note"] == "no bf16 peak for cpu"
    assert result["flops_per_token"] == get_model("qwen2-tiny").flops_per_token(64)
    assert result["peak_memory_kind"] == "cpu_max_rss" and result["peak_memory_bytes"] > 50 * 2**20
    assert result["timeouts"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert len(result["step_s"]) == 1 and len(result["warmup_step_s"]) == 1


@pytest.mark.slow
def test_bf16_mixed_precision_on_cpu(tmp_path):
    cfg = config(tmp_path, "llama-wide", mixed_precision="bf16", steps=2)
    result = result_of(launch(tmp_path, cfg), cfg)
    # "dtype" is what the forward produced, not what was asked for.
    assert (result["mixed_precision"], result["dtype"], result["reduce_dtype"]) == ("bf16", "bfloat16", "bfloat16")
    assert result["weights"] == "random" and result["activation_checkpointing"] is False
    # Random weights at transformers' scale: about the loss of a uniform guess over 4096 tokens.
    assert result["first_loss"] == pytest.approx(math.log(4096), abs=0.5)
    assert math.isfinite(result["final_loss"]) and len(result["step_s"]) == 2
    assert result["tokens_per_step"] == 2 * 64 and result["mfu"] is None


def _resolve_as_rank(rank: int, world: int, tmp: str, paths: list[str]) -> None:
    """One rank of test_rank0_alone_reads_the_checkpoint... (a spawned process): what resolve() gave it."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    seen = []
    for path in paths:
        try:
            got = weights.resolve(path, get_model("qwen2-tiny"), "sdpa", rank)
            seen.append({"source": got.source, "hidden": got.config.hidden_size,
                         "tensors": None if got.state_dict is None else len(got.state_dict)})
        except ConfigError as exc:
            seen.append({"error": str(exc)})
    dist.destroy_process_group()
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(seen))


@pytest.mark.slow
def test_rank0_alone_reads_the_checkpoint_and_every_rank_hears_of_a_problem(tmp_path, checkpoint):
    """Rank 0 reads and checks; rank 1 gets the config and no tensors. A broken checkpoint raises on
    rank 1 too, at once, instead of leaving it waiting for a broadcast that never comes (the group's
    timeout is 60 s; the error must come from rank 0's check, not from a timeout)."""
    import torch.multiprocessing as mp

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(get_model("qwen2-tiny").hf_config().to_json_string())
    mp.spawn(_resolve_as_rank, args=(2, str(tmp_path), [str(checkpoint), str(broken)]), nprocs=2)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    tensors = len(weights.read_state_dict(checkpoint)) + 1  # + the tied output head, completed
    assert rank0[0] == {"source": f"checkpoint:{checkpoint}", "hidden": 32, "tensors": tensors}
    assert rank1[0] == {"source": f"checkpoint:{checkpoint}", "hidden": 32, "tensors": None}
    assert rank0[1] == rank1[1] == {"error": f"checkpoint {broken}: no *.safetensors in {broken} "
                                             "(convert .bin checkpoints with save_pretrained)"}
