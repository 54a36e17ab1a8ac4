"""Hugging Face ``qwen3_moe`` (Qwen3-30B-A3B, Qwen3-235B-A22B) → modkit: Qwen3's attention (per-head QK-RMSNorm)
with a sparse MoE of SwiGLU experts, dense FFNs on the layers the config keeps dense.

Semantics: ``transformers/models/qwen3_moe/{configuration,modeling}_qwen3_moe.py``:

* the router (no bias) takes a softmax over ``num_experts`` and keeps the top ``num_experts_per_tok``, renormalised
  only with ``norm_topk_prob`` (``Qwen3MoeTopKRouter``); each expert a SwiGLU of ``moe_intermediate_size``;
* layer ``i`` holds the mixture iff ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in ``mlp_only_layers``;
  the other layers a dense SwiGLU of ``intermediate_size`` (``Qwen3MoeDecoderLayer``);
* attention: ``q_norm``/``k_norm`` RMSNorms over ``head_dim`` before RoPE; ``attention_bias`` on all four
  projections; ``head_dim`` defaults to ``hidden_size // num_attention_heads`` (unlike Qwen3's 128);
  ``sliding_window`` applies to every layer, only with ``use_sliding_window``;
* ``router_aux_loss_coef`` weights the load-balancing loss; ``output_router_logits`` only switches it on in
  training. On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate``.

Published configs also carry ``max_window_layers``, which ``Qwen3MoeConfig`` does not read.
"""

from __future__ import annotations

from ._keys import HeadDim, Ignore, Key, SparseStep, UseSlidingWindow
from ._weights import StackExperts, W
from .llama import L
from .qwen3 import QWEN3

MODEL_TYPE = "qwen3_moe"

#: the router and the stacked experts of a Qwen-MoE layer, as transformers 5 writes them back to disk
QWEN_MOE_TENSORS = (
    W("layers.{i}.ffn.router.proj.weight", L + "mlp.gate.weight"),
    *(
        W(f"layers.{{i}}.ffn.experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
        for x in ("gate", "up", "down")
    ),
)

#: the MoE keys Qwen2-MoE and Qwen3-MoE share (transformers defaults of Qwen3-MoE)
QWEN_MOE_KEYS = {
    "num_experts": Key("n_experts", 128, kind="count", aliases=("num_local_experts",)),
    "num_experts_per_tok": Key("top_k", 8),
    "moe_intermediate_size": Key("expert_d_ff", 768),
    "norm_topk_prob": Key("renormalize", False, kind="flag"),
    "decoder_sparse_step": SparseStep(),
    "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
    "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
}

QWEN3_MOE = QWEN3.derive(
    MODEL_TYPE,
    architecture="Qwen3MoeForCausalLM",
    notes=__doc__,
    # transformers Qwen3MoeConfig defaults
    defaults={
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
    },
    drop=("sliding_window",),
    keys={
        "head_dim": HeadDim(),
        "sliding_window": UseSlidingWindow(4096),
        "max_window_layers": Ignore("a key of published configs that Qwen3MoeConfig does not read"),
        **QWEN_MOE_KEYS,
    },
    fixed={"moe": True},
    tensors=QWEN_MOE_TENSORS,
)

TYPE = QWEN3_MOE
