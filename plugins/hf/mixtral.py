"""Hugging Face ``mixtral`` → modkit: Mistral with a sparse MoE of SwiGLU experts in every layer.

Semantics: ``transformers/models/mixtral/{configuration,modeling}_mixtral.py``: the router (no bias) takes a
softmax over all ``num_local_experts`` and keeps the top ``num_experts_per_tok`` renormalised to sum to 1;
``router_aux_loss_coef`` weights the Switch load-balancing loss; ``sliding_window`` (default null) applies to
every layer.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "mixtral"

FAMILY = Family(
    model_type="mixtral",
    architecture="MixtralForCausalLM",
    # transformers MixtralConfig defaults
    defaults=dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096 * 32,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        sliding_window=None,
        rope_theta=1e6,
        num_local_experts=8,
        num_experts_per_tok=2,
        router_aux_loss_coef=0.001,
    ),
    attention_bias="none",
    sliding="all",
    moe="mixtral",
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``mixtral`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
