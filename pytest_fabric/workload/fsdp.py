"""The sharded model: activation checkpointing, FSDP2 (default) or FSDP1, and its weights.

FSDP2 (torchtitan's order): checkpoint-wrap each decoder layer, compile each layer
(``layer.compile()``, when asked: on GPUs by default), ``fully_shard`` each layer then the root, ``to_empty`` to allocate the shards, then fill them: random values drawn shard by shard, or
``set_model_state_dict(full_state_dict=True, broadcast_from_rank0=True)`` from rank 0's checkpoint.

FSDP1 (GPU only): ``FullyShardedDataParallel`` with a size-based wrap policy sized to one decoder
layer, ``sync_module_states=True`` and ``device_id``. Every rank starts on ``meta``; as FSDP1
materializes each unit, rank 0 fills it (checkpoint or random) and sync_module_states broadcasts
it. Activation checkpointing is applied after wrapping, as the FSDP1 recipes do. Tied weights (the
output head sharing the embedding) get ``use_orig_params=False``: with ``use_orig_params=True`` and
MixedPrecision the head's matmul meets the fp32 original of the shared weight ("expected mat1 and
mat2 to have the same dtype, BFloat16 != float", seen on an H200 with torch 2.11); untied models keep
``use_orig_params=True``. Both choices are recorded with the result. FSDP1 is not compiled.

The optimizer is AdamW, fused on GPUs (torchtitan's default; 427 vs 475 ms per step for the foreach
implementation on qwen2.5-1.5b, 8 x 2048, H200), foreach elsewhere (``adamw``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from . import weights as W
from .weights import Weights

BF16 = torch.bfloat16


@dataclass(frozen=True)
class Precision:
    """What the forward and backward run in, and what gradients are reduced in."""

    name: str  # "bf16" or "fp32"
    reduce: str = "fp32"  # "fp32" (torchtitan's default) or "bf16": the gradient reduction's dtype

    @property
    def param_dtype(self) -> torch.dtype:
        return BF16 if self.name == "bf16" else torch.float32

    @property
    def reduce_dtype(self) -> torch.dtype:
        # Under bf16 compute the reduction runs in fp32 (2x the reduce-scatter's bytes of bf16, as
        # torchtitan does) unless bf16 is asked; fp32 compute reduces in fp32. The traffic model counts
        # the recorded dtype (step_model.recorded_bytes).
        return BF16 if self.name == "bf16" and self.reduce == "bf16" else torch.float32


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.get_decoder().layers


def _checkpoint_wrapper() -> Callable[[nn.Module], nn.Module]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    return functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def build(fsdp: int, weights: Weights, attention: str, device: torch.device, mesh: Any, precision: Precision,
          activation_checkpointing: bool, seed: int, rank: int,
          compiled: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """The sharded model, ready to train, and what was built (recorded with the result)."""
    model = W.build_on_meta(weights.config, attention)
    generator = torch.Generator(device=device).manual_seed(seed * 1_000_003 + rank)
    tied = tied_parameters(model)
    if fsdp == 2:
        model = _fsdp2(model, weights, device, mesh, precision, activation_checkpointing, generator, rank, compiled)
        return model, {"tied_parameters": tied, "compile": compiled}
    model, built = _fsdp1(model, weights, device, mesh, precision, activation_checkpointing, generator, rank)
    return model, {**built, "tied_parameters": tied, "compile": False}


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """The groups of parameter names that share one tensor (tied embeddings: the embedding and the
    output head), in module order; [] for an untied model. Works on the meta device."""
    names: dict[int, list[str]] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        for name, param in module._parameters.items():
            if param is not None:
                names.setdefault(id(param), []).append(f"{prefix}.{name}" if prefix else name)
    return [group for group in names.values() if len(group) > 1]


def fsdp1_use_orig_params(tied: list[list[str]]) -> bool:
    """FSDP1's ``use_orig_params``: False where weights are tied (see the module docstring), True
    otherwise (the original parameters stay visible, as the optimizer and FSDP2 see them)."""
    return not tied


def adamw(params: Any, device: torch.device, lr: float = 1e-5) -> tuple[torch.optim.Optimizer, str]:
    """AdamW and its implementation's name: "fused" on GPUs, "foreach" elsewhere."""
    kind = "fused" if device.type == "cuda" else "foreach"
    return torch.optim.AdamW(params, lr=lr, **{kind: True}), kind


def _fsdp2(model: nn.Module, weights: Weights, device: torch.device, mesh: Any, precision: Precision,
           activation_checkpointing: bool, generator: torch.Generator, rank: int, compiled: bool) -> nn.Module:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    layers = decoder_layers(model)
    if activation_checkpointing:
        wrap = _checkpoint_wrapper()
        for i, layer in enumerate(layers):
            layers[i] = wrap(layer)
    if compiled:  # each block on its own (torchtitan): small graphs, compiled once for all blocks
        for layer in layers:
            layer.compile()
    policy = MixedPrecisionPolicy(param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=device)  # allocates this rank's shards (tied parameters stay tied)
    W.init_buffers(model)
    if weights.random:
        std = W.std_of(weights.config)
        for fqn, param in model.named_parameters():
            W.init_random_(_local(param), fqn.rsplit(".", 1)[-1], std, generator)
    else:
        set_model_state_dict(model, weights.state_dict if rank == 0 else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model


def _local(param: torch.Tensor) -> torch.Tensor:
    """The shard of a DTensor parameter this rank holds (a view: writing to it writes the parameter)."""
    from torch.distributed.tensor import DTensor

    return param.to_local() if isinstance(param, DTensor) else param


def _fsdp1(model: nn.Module, weights: Weights, device: torch.device, mesh: Any, precision: Precision,
           activation_checkpointing: bool, generator: torch.Generator, rank: int) -> tuple[nn.Module, dict[str, Any]]:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    layers = decoder_layers(model)
    layer_class = type(layers[0])
    # One unit per decoder layer: a layer holds exactly this many parameters, none of its parts does.
    # Embeddings and the output head stay in the root unit (as with FSDP2), which also keeps tied
    # embeddings in one unit, as FSDP1 requires.
    min_params = sum(p.numel() for p in layers[0].parameters())
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=min_params,
                               exclude_wrap_modules={nn.ModuleList, nn.ModuleDict, nn.Embedding, nn.Linear})
    use_orig_params = fsdp1_use_orig_params(tied_parameters(model))
    mixed = None
    if precision.name == "bf16":
        mixed = MixedPrecision(param_dtype=precision.param_dtype, reduce_dtype=precision.reduce_dtype)
    # A 2-D mesh (replicate x shard) is hybrid sharding: FSDP1's HYBRID_SHARD over the same mesh.
    layout = ({"sharding_strategy": ShardingStrategy.HYBRID_SHARD, "device_mesh": mesh} if mesh.ndim == 2
              else {"sharding_strategy": ShardingStrategy.FULL_SHARD})
    model = FullyShardedDataParallel(
        model, auto_wrap_policy=policy, device_id=device, sync_module_states=True, mixed_precision=mixed,
        param_init_fn=_materializer(model, weights, device, generator, rank), use_orig_params=use_orig_params,
        **layout)
    if activation_checkpointing:
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=_checkpoint_wrapper(),
                                       check_fn=lambda m: isinstance(m, layer_class))
    return model, {"fsdp1_min_num_params": min_params, "fsdp1_use_orig_params": use_orig_params}


def _materializer(model: nn.Module, weights: Weights, device: torch.device, generator: torch.Generator,
                  rank: int) -> Callable[[nn.Module], None]:
    """FSDP1's ``param_init_fn``: allocate one module's own tensors on ``device`` and, on rank 0, fill
    them (the other ranks' values are overwritten by sync_module_states). A parameter shared by two
    modules (tied embeddings) is allocated once, so it stays shared."""
    names = {module: prefix for prefix, module in model.named_modules()}
    allocated: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # id(meta) -> (meta, real)
    std = W.std_of(weights.config)

    @torch.no_grad()
    def materialize(module: nn.Module) -> None:
        prefix = names.get(module, "")
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in allocated:
                real = nn.Parameter(torch.empty_like(param, device=device), requires_grad=param.requires_grad)
                if rank == 0 and weights.random:
                    W.init_random_(real, name, std, generator)
                elif rank == 0:
                    real.copy_(weights.state_dict[f"{prefix}.{name}" if prefix else name])
                allocated[id(param)] = (param, real)
            module._parameters[name] = allocated[id(param)][1]
        buffers = [name for name, b in module._buffers.items() if b is not None and b.is_meta]
        for name in buffers:
            module._buffers[name] = torch.empty_like(module._buffers[name], device=device)
        if buffers:
            W.init_buffers(model, module)
            if rank == 0 and not weights.random:
                for name in buffers:
                    key = f"{prefix}.{name}" if prefix else name
                    if key in weights.state_dict:  # persistent buffers are in the checkpoint
                        module._buffers[name].copy_(weights.state_dict[key])

    return materialize
