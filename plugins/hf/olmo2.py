"""Hugging Face ``olmo2`` → modkit: norms on the sublayer outputs (``reordered``) and full-width QK-norm.

Semantics: ``transformers/models/olmo2/{configuration,modeling}_olmo2.py``: each block computes
``x + post_attention_layernorm(attn(x))`` then ``x + post_feedforward_layernorm(mlp(x))`` (no input norm);
``q_norm``/``k_norm`` are RMSNorms over the whole q (``n_heads * head_dim``) and k (``n_kv_heads * head_dim``)
projections, before RoPE; ``attention_bias`` sets all four projection biases.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "olmo2"

FAMILY = Family(
    model_type="olmo2",
    architecture="Olmo2ForCausalLM",
    # transformers Olmo2Config defaults
    defaults=dict(
        vocab_size=50304,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
    ),
    attention_bias="flag",
    qk_norm="full",
    placement="reordered",
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``olmo2`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
