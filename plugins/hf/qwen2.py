"""Hugging Face ``qwen2`` → modkit: Llama with q/k/v biases and optional sliding windows on upper layers.

Semantics: ``transformers/models/qwen2/{configuration,modeling}_qwen2.py``: q/k/v projections always carry a
bias, the output projection never; ``sliding_window`` is used only with ``use_sliding_window``, then on the
layers that ``layer_types`` marks ``sliding_attention`` or, in files without ``layer_types``, on every layer
from ``max_window_layers`` on. Those layers become per-layer overrides.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "qwen2"

FAMILY = Family(
    model_type="qwen2",
    architecture="Qwen2ForCausalLM",
    # transformers Qwen2Config defaults
    defaults=dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=False,
        sliding_window=4096,
        max_window_layers=28,
    ),
    attention_bias="qkv",
    sliding="qwen",
    expect=(("use_mrope", False, "multimodal rotary sections (Qwen2-VL) are not supported"),),
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``qwen2`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
