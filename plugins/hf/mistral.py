"""Hugging Face ``mistral`` → modkit: Llama with GQA defaults and one sliding window on every layer.

Semantics: ``transformers/models/mistral/{configuration,modeling}_mistral.py``: no attention or MLP biases;
``sliding_window`` (default 4096, ``null`` for global attention) applies to every layer.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "mistral"

FAMILY = Family(
    model_type="mistral",
    architecture="MistralForCausalLM",
    # transformers MistralConfig defaults
    defaults=dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096 * 32,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=False,
        sliding_window=4096,
    ),
    attention_bias="none",
    sliding="all",
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``mistral`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
