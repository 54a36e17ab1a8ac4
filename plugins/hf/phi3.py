"""Hugging Face ``phi3`` → modkit: a Llama-style pre-norm SwiGLU decoder.

Semantics: ``transformers/models/phi3/{configuration,modeling}_phi3.py``. Phi-3 stores q/k/v as one fused
``qkv_proj`` and gate/up as one ``gate_up_proj``: that is a checkpoint layout (split when loading weights), the
same parameters as separate projections. No biases; RMSNorm; ``partial_rotary_factor`` rotates part of each
head; ``sliding_window`` applies to every layer. LongRoPE (``rope_scaling`` type ``longrope``, formerly ``su``;
Phi-3 128k) takes its trained length from the top-level ``original_max_position_embeddings``.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "phi3"

FAMILY = Family(
    model_type="phi3",
    architecture="Phi3ForCausalLM",
    fused=True,  # qkv_proj and gate_up_proj
    # transformers Phi3Config defaults
    defaults=dict(
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        sliding_window=None,
    ),
    attention_bias="none",
    sliding="all",
    rope_original_at_top=True,  # Phi3Config holds original_max_position_embeddings (LongRoPE's trained length)
    # with the default RoPE, original_max_position_embeddings (every Phi3Config.to_dict() has it) has no effect
    ignore=("original_max_position_embeddings",),
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``phi3`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
