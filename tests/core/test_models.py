"""The model catalog: parameter counts from configs match the published sizes and transformers itself."""

from __future__ import annotations

import pytest

from pytest_fabric import MODELS
from pytest_fabric.core.models import MFU_CONVENTION, get_model

# Published totals (model cards / safetensors metadata).
PUBLISHED = {
    "qwen2.5-1.5b": 1.54e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "llama-3.1-8b": 8.03e9,
    "llama-3.1-70b": 70.6e9,
}


@pytest.mark.parametrize(("name", "published"), PUBLISHED.items())
def test_param_count_matches_published_size(name, published):
    total, non_embedding = get_model(name).param_count()
    assert total == pytest.approx(published, rel=0.005)
    assert 0 < non_embedding < total


def test_qwen25_7b_non_embedding_matches_model_card():
    # The Qwen2.5-7B card: 7.61 B parameters, 6.53 B non-embedding.
    assert get_model("qwen2.5-7b").param_count()[1] == pytest.approx(6.53e9, rel=0.005)


def test_tied_embeddings_are_counted_once():
    spec = get_model("qwen2.5-1.5b")
    assert spec.config["tie_word_embeddings"]
    total, non_embedding = spec.param_count()
    assert total - non_embedding == spec.config["vocab_size"] * spec.hidden


@pytest.mark.parametrize("name", ["qwen2-tiny", "llama-wide", "qwen2.5-7b", "llama-3.1-8b"])
def test_param_count_equals_transformers_model(name):
    """Build the model on the meta device (no memory) and count what transformers really makes."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    spec = get_model(name)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(spec.hf_config())
    assert spec.param_count()[0] == sum(p.numel() for p in model.parameters())


def test_flops_per_token_counts_the_output_head_even_when_tied():
    # The head is a hidden x vocab matmul every token pays for, tied to the embedding or not.
    untied, tied = get_model("llama-3.1-8b"), get_model("qwen2.5-1.5b")
    for spec in (untied, tied):
        _, non_embedding = spec.param_count()
        without_head = 6 * non_embedding + 12 * spec.layers * spec.hidden * 4096
        assert spec.flops_per_token(4096) - without_head == pytest.approx(6 * spec.hidden * spec.vocab)
    assert "head counted" in MFU_CONVENTION


@pytest.mark.parametrize("name", ["qwen2-tiny", "llama-wide"])
def test_flops_per_token_matches_what_torch_counts_for_a_training_step(name):
    """The convention against torch's own FLOP counter (matmuls and attention, forward and backward):
    a formula that left out the head (a large share of these small-vocabulary models) is far off."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    spec = get_model(name)
    seq = 64
    model = transformers.AutoModelForCausalLM.from_config(spec.hf_config(), attn_implementation="eager")  # matmuls torch counts
    tokens = torch.randint(0, spec.vocab, (2, seq))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=tokens, labels=tokens).loss.backward()
    counted = counter.get_total_flops() / tokens.numel()
    assert spec.flops_per_token(seq) == pytest.approx(counted, rel=0.05)


def test_cpu_models_have_the_advertised_character():
    # Compute-bound: few parameters, many tokens; communication-bound: the reverse.
    tiny, wide = get_model("qwen2-tiny"), get_model("llama-wide")
    assert tiny.cpu_sized and wide.cpu_sized
    assert tiny.param_count()[0] < 100_000 < 1_000_000 < wide.param_count()[0]
    assert tiny.batch_size * tiny.seq_len > 100 * wide.batch_size * wide.seq_len


def test_unknown_model_names_the_catalog():
    with pytest.raises(KeyError, match="unknown model 'gpt-5'; known models: .*qwen2.5-7b"):
        get_model("gpt-5")


def test_every_catalog_entry_is_keyed_by_its_name():
    assert all(name == spec.name for name, spec in MODELS.items())
