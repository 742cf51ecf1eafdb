"""Where the weights come from: a checkpoint read by global rank 0 alone, or random initialization.

Every rank builds the model on the ``meta`` device (no memory, no init time); sharding then
materializes only each rank's shard. Values come from one of two places:

- a local Hugging Face checkpoint (``config.json`` + ``*.safetensors``, e.g. on shared storage):
  global rank 0 alone reads it, checks it against the model spec, and sharding broadcasts it;
  the other ranks never touch the files and receive the config from rank 0;
- random: the checkpoint-free benchmark. Same distribution as transformers' own initialization
  (normal(0, initializer_range), zero biases, unit norms), drawn shard by shard.

Non-persistent buffers (RoPE inverse frequencies) are in no checkpoint and are garbage after
``to_empty``: every rank recomputes them with the model's own initializer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..core.models import ModelSpec
from .config import ConfigError

# The config fields that set FLOPs per token and parameter counts: a checkpoint that differs in any
# of them is not the model the result would be labelled with.
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings")


@dataclass
class Weights:
    """The weight source every rank agrees on; the tensors themselves live on global rank 0 only."""

    source: str  # "random" or "checkpoint:<path>", recorded with the result
    config: Any  # transformers.PretrainedConfig the model is built from
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # rank 0, checkpoint only

    @property
    def random(self) -> bool:
        return self.source == "random"


def hf_config(config: Mapping[str, Any]):  # -> transformers.PretrainedConfig
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[config["model_type"]].from_dict(dict(config))


def build_on_meta(config, attention: str) -> nn.Module:
    """The model with every parameter and buffer on ``meta``: shapes only, nothing allocated."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attention, dtype=torch.float32)
    return model.train()


def resolve(model_path: str | None, spec: ModelSpec, attention: str, rank: int) -> Weights:
    """Agree on the weights (a collective: every rank calls it). Rank 0 reads and checks the
    checkpoint and sends its config; a problem found there is raised on every rank at once, instead
    of leaving the other ranks waiting for a broadcast that never comes."""
    if model_path is None:
        return Weights("random", spec.hf_config())
    payload: dict[str, Any] = {}
    state_dict = None
    if rank == 0:
        try:
            path = Path(model_path)
            config = read_config(path)
            check_matches(hf_config(config), spec)
            state_dict = read_state_dict(path)
            check_keys(state_dict, build_on_meta(hf_config(config), attention))
            payload = {"config": config}
        except Exception as exc:  # noqa: BLE001 -- whatever it is, the other ranks must hear of it
            payload = {"error": f"checkpoint {model_path}: {exc}"}
    box = [payload]
    dist.broadcast_object_list(box, src=0)
    if "error" in box[0]:
        raise ConfigError(box[0]["error"])
    return Weights(f"checkpoint:{model_path}", hf_config(box[0]["config"]), state_dict)


def read_config(path: Path) -> dict[str, Any]:
    """config.json of a Hugging Face checkpoint directory."""
    if not path.is_dir():
        raise FileNotFoundError("no such directory (model_path is a local checkpoint directory that global "
                                "rank 0 can read)")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no config.json in {path}")
    return json.loads(config_file.read_text())


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """Every ``*.safetensors`` shard of a Hugging Face checkpoint directory, on CPU."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path} (convert .bin checkpoints with save_pretrained)")
    state_dict: dict[str, torch.Tensor] = {}
    for file in files:
        state_dict.update(load_file(file, device="cpu"))
    return state_dict


def check_matches(config: Any, spec: ModelSpec) -> None:
    """Refuse a checkpoint (its transformers config) whose shape differs from the model spec: FLOPs,
    MFU and the result's model name would all be wrong."""
    want = spec.hf_config()
    diffs = [f"{k} {getattr(config, k, None)!r} != {getattr(want, k, None)!r}"
             for k in ("model_type", *SHAPE_FIELDS) if getattr(config, k, None) != getattr(want, k, None)]
    if diffs:
        raise ValueError(f"is not model {spec.name!r} (checkpoint != spec: {', '.join(diffs)}); pick the model "
                         "that matches the checkpoint, or a checkpoint of that model")


def tied_groups(model: nn.Module) -> list[list[str]]:
    """Names that share one parameter (tied input and output embeddings): a checkpoint stores one."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def check_keys(state_dict: dict[str, torch.Tensor], model: nn.Module) -> None:
    """Complete tied names in ``state_dict`` (in place) and refuse missing or unexpected tensors."""
    for group in tied_groups(model):
        stored = next((name for name in group if name in state_dict), None)
        for name in group:
            if stored is not None:
                state_dict.setdefault(name, state_dict[stored])
    expected = set(model.state_dict())
    missing, unexpected = expected - set(state_dict), set(state_dict) - expected
    if missing or unexpected:
        raise ValueError(f"its tensors do not match the model: missing {_few(missing)}, unexpected {_few(unexpected)}")


def _few(names: set[str], shown: int = 5) -> str:
    listed = sorted(names)
    return ", ".join(listed[:shown]) + (f" and {len(listed) - shown} more" if len(listed) > shown else "") or "none"


@torch.no_grad()
def init_random_(tensor: torch.Tensor, name: str, std: float, generator: torch.Generator) -> None:
    """transformers' initialization for these architectures (normal(0, std) matrices, zero biases,
    unit norm scales), on whatever part of the parameter this rank holds."""
    if name == "bias":
        tensor.zero_()
    elif tensor.dim() > 1:
        tensor.normal_(0.0, std, generator=generator)
    else:
        tensor.fill_(1.0)


@torch.no_grad()
def init_buffers(model: nn.Module, module: nn.Module | None = None) -> None:
    """Recompute the buffers of ``module`` (default: every module) with the model's own initializer."""
    for m in [module] if module is not None else model.modules():
        if any(True for _ in m.buffers(recurse=False)):
            model._init_weights(m)  # transformers' per-module initializer; the only one that knows RoPE


def std_of(config) -> float:
    return float(getattr(config, "initializer_range", None) or 0.02)
