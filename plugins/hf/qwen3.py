"""Hugging Face ``qwen3`` → modkit: Qwen2's layout with per-head QK-RMSNorm and a free ``head_dim``.

Semantics: ``transformers/models/qwen3/{configuration,modeling}_qwen3.py``: ``q_norm``/``k_norm`` are RMSNorms
over ``head_dim`` applied before RoPE; ``attention_bias`` sets all four projection biases; ``head_dim`` defaults
to 128 (not ``hidden_size // num_attention_heads``); sliding windows as in Qwen2.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "qwen3"

FAMILY = Family(
    model_type="qwen3",
    architecture="Qwen3ForCausalLM",
    # transformers Qwen3Config defaults
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
    attention_bias="flag",
    qk_norm="head",
    sliding="qwen",
    head_dim_default=128,
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``qwen3`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
