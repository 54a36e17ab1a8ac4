"""Hugging Face ``olmoe`` → modkit: pre-norm blocks, full-width QK-norm and a sparse MoE in every layer.

Semantics: ``transformers/models/olmoe/{configuration,modeling}_olmoe.py``: ``q_norm`` over ``hidden_size`` and
``k_norm`` over ``n_kv_heads * head_dim`` (``head_dim = hidden_size // num_attention_heads``); the router (no
bias) takes a softmax over all ``num_experts`` and keeps the top ``num_experts_per_tok``, renormalised only with
``norm_topk_prob``; ``router_aux_loss_coef`` weights the load-balancing loss; ``clip_qkv`` must be null. On disk
each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate``.
"""

from __future__ import annotations

from ._keys import HeadDim, Ignore, Key, Refuse
from ._weights import StackExperts, W
from .llama import LLAMA, L

MODEL_TYPE = "olmoe"

OLMOE = LLAMA.derive(
    MODEL_TYPE,
    architecture="OlmoeForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    # transformers OlmoeConfig defaults
    defaults={
        "vocab_size": 50304,
        "hidden_size": 2048,
        "intermediate_size": 2048,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
    },
    keys={
        # OLMoE sizes its QK-norms from hidden_size, so transformers only works with the derived head_dim
        "head_dim": HeadDim(derived="OLMoE derives head_dim = hidden_size // num_attention_heads"),
        "num_experts": Key("n_experts", 64, aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 8),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.01, kind="nonneg"),
        "norm_topk_prob": Key("renormalize", False, kind="flag"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "clip_qkv": Refuse(None, "clamping q/k/v activations is not supported by modkit's attention"),
    },
    fixed={"qk_norm": "full", "moe": True},
    tensors=(
        W("layers.{i}.ffn.router.proj.weight", L + "mlp.gate.weight"),
        *(
            W(f"layers.{{i}}.ffn.experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
    ),
)

TYPE = OLMOE
