"""Hugging Face ``flex_olmo`` (Ai2 FlexOlmo) → modkit: OLMo 2's block (reordered norms, full-width QK-norm) with a
mixture of SwiGLU experts in every layer.

Semantics: ``transformers/models/flex_olmo/{configuration,modeling}_flex_olmo.py`` (``FlexOlmoAttention``,
``FlexOlmoTopKRouter``, ``FlexOlmoSparseMoeBlock``, ``FlexOlmoDecoderLayer``): the attention and its norms are
OLMo 2's (:mod:`.olmo2`: the sublayer outputs normalised before they join the residual stream, ``q_norm`` over all
query heads and ``k_norm`` over all key heads); the router (no bias) takes a softmax over ``num_experts`` and keeps the
top ``num_experts_per_tok``, renormalised only with ``norm_topk_prob``; each expert is a SwiGLU of
``intermediate_size``; ``router_aux_loss_coef`` weights the load-balancing loss. On disk each expert is
``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate``.
"""

from __future__ import annotations

from ._keys import Ignore, Key, Rope, sizes
from .olmo2 import OLMO2
from .qwen3_moe import QWEN_MOE_TENSORS

MODEL_TYPE = "flex_olmo"

FLEX_OLMO = OLMO2.derive(
    MODEL_TYPE,
    architecture="FlexOlmoForCausalLM",
    notes=__doc__,
    keys={
        # transformers FlexOlmoConfig, key by key
        **sizes(
            vocab_size=100352,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=4096,
        ),
        "intermediate_size": Key("d_ff", 11008, note="each expert's width"),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "rope_theta": Rope(500000.0),
        "num_experts": Key("n_experts", 7, aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 5),
        "norm_topk_prob": Key("renormalize", False, kind="flag"),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.01, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
    },
    fixed={"moe": True},
    tensors=QWEN_MOE_TENSORS,
)

TYPE = FLEX_OLMO
