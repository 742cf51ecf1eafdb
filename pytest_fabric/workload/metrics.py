"""Throughput's companions, computed in one place: MFU from a per-GPU bf16 peak, peak memory, versions.

MFU (model FLOPs utilization) = FLOPs per token x tokens/s / (GPUs x per-GPU dense bf16 peak).
FLOPs per token is the model's training cost (6 (N_non_embedding + H V) + 12 L H S,
``ModelSpec.flops_per_token``: the output head counted, embedding lookups not, as torchtitan and
llm-foundry count; ``models.MFU_CONVENTION``), so the forward recomputed by activation checkpointing
does not count: MFU compares models and fabrics, not kernels. The peak is the datasheet dense bf16
figure below. A CPU, or a GPU missing from the table, has no peak: MFU is then None, recorded as such.
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Peak:
    gpu: str  # the table's name for it
    bf16_flops: float  # dense (no sparsity), per GPU


# Datasheet dense bf16 peaks. Patterns match torch.cuda.get_device_name(), e.g. "NVIDIA H100 80GB HBM3"
# (the SXM part), "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB"; first match wins, so variants precede
# the families they belong to.
PEAKS: tuple[tuple[str, Peak], ...] = (
    (r"GH200", Peak("GH200", 989e12)),
    (r"H200.*NVL", Peak("H200 NVL", 835e12)),
    (r"H200", Peak("H200 SXM", 989e12)),
    (r"H100.*PCIE", Peak("H100 PCIe", 756e12)),
    (r"H100.*NVL", Peak("H100 NVL", 835e12)),
    (r"H100", Peak("H100 SXM", 989e12)),
    (r"H800", Peak("H800", 989e12)),
    (r"H20\b", Peak("H20", 148e12)),
    (r"B200", Peak("B200", 2250e12)),
    (r"A100", Peak("A100", 312e12)),
    (r"A800", Peak("A800", 312e12)),
    (r"L40S", Peak("L40S", 362e12)),
    (r"L40\b", Peak("L40", 181e12)),
    (r"\bL4\b", Peak("L4", 121e12)),
    (r"\bA10\b", Peak("A10", 125e12)),
    (r"MI300X", Peak("MI300X", 1307e12)),
)


def peak_for(gpu_name: str | None) -> Peak | None:
    """The bf16 peak of a GPU by its device name; None for a CPU (None) or a GPU not in the table."""
    if not gpu_name:
        return None
    name = gpu_name.upper()
    for pattern, peak in PEAKS:
        if re.search(pattern, name):
            return peak
    return None


def mfu(tokens_per_s: float, flops_per_token: float, gpus: int, peak_flops_per_gpu: float | None) -> float | None:
    """Model FLOPs utilization of the whole job, or None where the peak is unknown."""
    if not peak_flops_per_gpu or gpus <= 0:
        return None
    return flops_per_token * tokens_per_s / (gpus * peak_flops_per_gpu)


def gpu_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def peak_memory(device: torch.device) -> tuple[int, str]:
    """This process's peak memory in bytes and what was measured: the CUDA caching allocator's peak
    on a GPU, the process's peak resident set on a CPU (Linux reports ru_maxrss in KiB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device), "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "cpu_max_rss"


def driver_version() -> str | None:
    """The NVIDIA kernel driver, e.g. "550.54.15": NCCL and driver upgrades both move bandwidth."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            return parse_driver_version(f.readline())
    except OSError:
        return None


def parse_driver_version(line: str) -> str | None:
    """The version in the first line of /proc/driver/nvidia/version (proprietary or open module)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", line)
    return match.group(1) if match else None
