"""The model catalog: Hugging Face configs by name, hyper-parameters only (nothing is downloaded).

The real models carry their published configs so FLOP and traffic figures are right on a GPU
cluster. The CPU-sized models keep the same architectures (Qwen2, Llama) at sizes this machine can
train in seconds, and each carries the batch x sequence shape that gives it its character on the
emulated cluster: ``qwen2-tiny`` does a lot of compute on few parameters (the fabric hardly
matters), ``llama-wide`` moves many parameters for little compute (the fabric decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


# How MFU counts FLOPs (named wherever MFU is shown): the output head counted, embedding lookups not,
# on the GPU's datasheet dense bf16 peak (workload/metrics.py PEAKS).
MFU_CONVENTION = "output head counted, embedding lookups not; datasheet dense bf16 peak"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    arch: str  # "qwen2" or "llama": picks the transformers config class
    config: Mapping[str, Any]
    description: str
    # Per-GPU micro-batch and sequence length used when the user does not set them.
    batch_size: int = 2
    seq_len: int = 2048
    cpu_sized: bool = False
    # On GPUs (real models): the micro-batches tried for the default shape, largest first; the largest
    # whose predicted peak fits an 80 GB GPU at the launch's world size wins (memory.default_gpu_shape).
    gpu_batch_sizes: tuple[int, ...] = (8, 4, 2, 1)

    @property
    def layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def hidden(self) -> int:
        return int(self.config["hidden_size"])

    def param_count(self) -> tuple[int, int]:
        """(total, non-embedding) parameter counts from the config alone."""
        c = self.config
        h, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
        head_dim = c.get("head_dim") or h // c["num_attention_heads"]
        q = h * c["num_attention_heads"] * head_dim
        kv = 2 * h * c["num_key_value_heads"] * head_dim
        o = c["num_attention_heads"] * head_dim * h
        # Qwen2 has biases on q/k/v; Llama has none.
        bias = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * head_dim if self.arch == "qwen2" else 0
        per_layer = q + kv + o + bias + 3 * h * inter + 2 * h
        non_embedding = c["num_hidden_layers"] * per_layer + h
        embeddings = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
        return non_embedding + embeddings, non_embedding

    @property
    def vocab(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings"))

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token of a dense decoder, under ``MFU_CONVENTION``:
        6 (N_non_embedding + H V) + 12 L H S.

        The output head (H x V, tied to the embedding or not) is a matmul every token pays for, so
        it counts; the embedding lookup is not a matmul and does not (torchtitan, llm-foundry)."""
        _, non_embedding = self.param_count()
        head = self.hidden * self.vocab
        return 6.0 * (non_embedding + head) + 12.0 * self.layers * self.hidden * seq_len

    def hf_config(self):  # -> transformers.PretrainedConfig (imported lazily: it is slow)
        import transformers

        cls = {"qwen2": transformers.Qwen2Config, "llama": transformers.LlamaConfig}[self.arch]
        return cls(**self.config)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch, "config": dict(self.config)}


def _qwen25(hidden, inter, layers, heads, kv, vocab=152064, tied=False, eps=1e-6, max_pos=32768):
    return {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": max_pos,
        "rope_theta": 1000000.0,
        "rms_norm_eps": eps,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }


def _llama31(hidden, inter, layers, heads, kv=8, vocab=128256):
    return {
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("qwen2.5-1.5b", "qwen2", _qwen25(1536, 8960, 28, 12, 2, vocab=151936, tied=True, max_pos=131072),
                  "Qwen2.5-1.5B (1B-class, fits one GPU)"),
        ModelSpec("qwen2.5-7b", "qwen2", _qwen25(3584, 18944, 28, 28, 4, max_pos=131072), "Qwen2.5-7B"),
        ModelSpec("qwen2.5-72b", "qwen2", _qwen25(8192, 29568, 80, 64, 8, eps=1e-5), "Qwen2.5-72B"),
        ModelSpec("llama-3.1-8b", "llama", _llama31(4096, 14336, 32, 32), "Llama-3.1-8B"),
        ModelSpec("llama-3.1-70b", "llama", _llama31(8192, 28672, 80, 64), "Llama-3.1-70B"),
        # CPU-sized: compute-bound. ~25 k parameters, 2 x 2048 tokens per rank per step.
        ModelSpec("qwen2-tiny", "qwen2", _qwen25(32, 64, 2, 2, 1, vocab=256, tied=True, max_pos=4096),
                  "CPU-sized Qwen2, compute-bound (many tokens, few parameters)",
                  batch_size=8, seq_len=2048, cpu_sized=True),
        # CPU-sized: communication-bound. ~7.5 M parameters, 1 x 32 tokens per rank per step.
        ModelSpec("llama-wide", "llama",
                  {**_llama31(384, 1536, 2, 6, kv=2, vocab=4096), "max_position_embeddings": 1024,
                   "rope_scaling": None, "rope_theta": 10000.0},
                  "CPU-sized Llama, communication-bound (many parameters, few tokens)",
                  batch_size=1, seq_len=32, cpu_sized=True),
    )
}

# What the embedded default (emulated cluster, CPU) runs.
DEFAULT_CPU_MODELS = ("qwen2-tiny", "llama-wide")


def get_model(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(MODELS)}") from None
