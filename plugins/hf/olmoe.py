"""Hugging Face ``olmoe`` → modkit: pre-norm blocks, full-width QK-norm and a sparse MoE in every layer.

Semantics: ``transformers/models/olmoe/{configuration,modeling}_olmoe.py``: ``q_norm`` over ``hidden_size`` and
``k_norm`` over ``n_kv_heads * head_dim`` (``head_dim = hidden_size // num_attention_heads``); the router (no
bias) takes a softmax over all ``num_experts`` and keeps the top ``num_experts_per_tok``, renormalised only with
``norm_topk_prob``; ``router_aux_loss_coef`` weights the load-balancing loss; ``clip_qkv`` must be null.
"""

from __future__ import annotations

from .llama import Family, convert_family, family_weights

MODEL_TYPE = "olmoe"

FAMILY = Family(
    model_type="olmoe",
    architecture="OlmoeForCausalLM",
    # transformers OlmoeConfig defaults
    defaults=dict(
        vocab_size=50304,
        hidden_size=2048,
        intermediate_size=2048,
        num_hidden_layers=16,
        num_attention_heads=16,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        tie_word_embeddings=False,
        num_experts=64,
        num_experts_per_tok=8,
        router_aux_loss_coef=0.01,
    ),
    attention_bias="flag",
    qk_norm="full",
    moe="olmoe",
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``olmoe`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
