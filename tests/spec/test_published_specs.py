"""Specs of models without a config in ``tests/data/real-models``: GPT-1, GPT-3 175B, Llama 3 70B, Llama 3.1 405B.

Each spec's exact parameter count is computed here from the published architecture (layers, widths, heads,
vocabulary, tying, biases) with the textbook formula, and must match what modkit builds; the Llama specs must also
be what the Hugging Face converter makes of their published ``config.json`` values. The rounded figures the papers
and model cards quote (117M, 175.0B, 70.6B, 405.9B) are checked against the exact counts.
"""

from __future__ import annotations

import pytest

import modkit
from tests.conftest import SPECS


def gpt_params(layers: int, d: int, d_ff: int, vocab: int, context: int, final_norm: bool) -> int:
    """GPT-1/2/3 layout: token and learned position tables, per layer q/k/v/o and two MLP matrices with biases and
    two LayerNorms (weight and bias), the head tied to the token table."""
    per_layer = (4 * d * d + 4 * d) + (2 * d * d_ff + d_ff + d) + 2 * 2 * d
    return vocab * d + context * d + layers * per_layer + (2 * d if final_norm else 0)


def llama_params(layers: int, d: int, d_ff: int, heads: int, kv_heads: int, vocab: int) -> int:
    """Llama layout: untied embedding and head, per layer q/o [d, d], k/v [d, kv_heads · head_dim], SwiGLU's three
    matrices, two RMSNorm weights; a final RMSNorm; no biases."""
    head_dim = d // heads
    per_layer = 2 * d * d + 2 * d * kv_heads * head_dim + 3 * d * d_ff + 2 * d
    return 2 * vocab * d + layers * per_layer + d


CASES = {
    # Radford et al. 2018, section 4.1 (12 layers, 768, 12 heads, 3072, 512 tokens); 40478 BPE ids; post-norm, no final norm
    "gpt-1.json": (gpt_params(12, 768, 3072, 40478, 512, final_norm=False), 117e6, 1e6),
    # Brown et al. 2020, Table 2.1 (96 layers, 12288, 96 heads, 2048 tokens, d_ff = 4 d); GPT-2 vocabulary 50257
    "gpt-3-175b.json": (gpt_params(96, 12288, 4 * 12288, 50257, 2048, final_norm=True), 175.0e9, 0.5e9),
    # meta-llama/Meta-Llama-3-70B config.json
    "llama-3-70b.json": (llama_params(80, 8192, 28672, 64, 8, 128256), 70.6e9, 0.05e9),
    # meta-llama/Llama-3.1-405B config.json
    "llama-3.1-405b.json": (llama_params(126, 16384, 53248, 128, 8, 128256), 405.9e9, 0.05e9),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_exact_parameter_count(name):
    exact, quoted, tolerance = CASES[name]
    spec = modkit.load_spec(SPECS / name)
    assert modkit.count_params(spec) == exact
    assert abs(exact - quoted) < tolerance  # the figure the paper / model card rounds to
    assert str(f"{exact:,}") in spec.description  # the description states the number it was checked against


def test_the_counts():
    assert CASES["gpt-1.json"][0] == 116_534_784
    assert CASES["gpt-3-175b.json"][0] == 174_604_259_328
    assert CASES["llama-3-70b.json"][0] == 70_553_706_496
    assert CASES["llama-3.1-405b.json"][0] == 405_853_388_800


LLAMA_CONFIGS = {
    "llama-3-70b.json": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
    },
    "llama-3.1-405b.json": {
        "model_type": "llama",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
}


@pytest.mark.parametrize("name", sorted(LLAMA_CONFIGS))
def test_llama_specs_are_the_converted_configs(name):
    shipped = modkit.load_spec(SPECS / name).to_dict()
    converted = modkit.from_hf_config(LLAMA_CONFIGS[name]).to_dict()
    for d in (shipped, converted):
        d.pop("name", None), d.pop("description", None)
    assert shipped == converted


def test_kv_cache_per_token():
    """Llama 3 70B keeps 8 KV heads of 128 per layer: 2 x 80 x 8 x 128 x 2 bytes = 320 KiB per token in bf16, not
    the 64-head figure (2.5 MiB) a multi-head cache would need."""
    assert modkit.kv_cache_bytes_per_token(SPECS / "llama-3-70b.json", "bfloat16") == 2 * 80 * 8 * 128 * 2 == 327_680
    assert modkit.kv_cache_bytes_per_token(SPECS / "llama-3.1-405b.json", "bfloat16") == 2 * 126 * 8 * 128 * 2
