"""Hugging Face ``lfm2_moe`` (Liquid AI LFM2-8B-A1B) → modkit: LFM2's convolution and attention layers with dense
SwiGLUs on the first layers and sigmoid-routed mixtures with an expert-bias buffer after.

Semantics: ``transformers/models/lfm2_moe/{configuration,modeling}_lfm2_moe.py`` (modular over LFM2; read through
:mod:`.lfm2` for the layers, the attention and the norms), with these differences:

* the FFN of layer ``i`` is a SwiGLU of ``intermediate_size`` itself (no auto-adjustment) iff ``i <
  num_dense_layers``, else the mixture (``Lfm2MoeSparseMoeBlock``): ``num_experts`` SwiGLU experts of
  ``moe_intermediate_size`` (``w1`` gate, ``w3`` up, ``w2`` down), ``num_experts_per_tok`` of them chosen by the
  sigmoid scores plus the float32 buffer ``expert_bias`` with ``use_expert_bias`` (selection only: modkit's
  ``correction_bias``), weighted by the unbiased scores divided by their sum plus 1e-6 with ``norm_topk_prob``
  (``renormalize_eps``), times ``routed_scaling_factor`` (``Lfm2MoeTopKRouter``); no shared expert, no
  load-balancing loss;
* the config class has no ``full_attn_idxs`` and no default ``layer_types`` (transformers cannot build a model
  without them); a config without either converts, as LFM2's does, to attention on every layer.
"""

from __future__ import annotations

from ._keys import FirstDense, Ignore, Key, Own
from ._weights import StackExperts, W
from .lfm2 import LAYER_KEYS, LFM2, L, read_layers, write_layers

MODEL_TYPE = "lfm2_moe"

LFM2_MOE = LFM2.derive(
    MODEL_TYPE,
    architecture="Lfm2MoeForCausalLM",
    notes=__doc__,
    # transformers Lfm2MoeConfig defaults
    defaults={"hidden_size": 2048, "num_hidden_layers": 32},
    keys={
        "intermediate_size": Key("d_ff", 7168, note="the dense layers' SwiGLU width, as it is"),
        "layer_types": Own(
            tuple(k for k in LAYER_KEYS if k != "full_attn_idxs"),
            "the token mixer of each layer: short_conv (kernel conv_L_cache, biases conv_bias) on conv layers, "
            "the attention on full_attention layers (see LFM2's notes)",
            fields=("mixers",),
        ),
        "num_dense_layers": FirstDense(2),
        "num_experts": Key("n_experts", 32),
        "num_experts_per_tok": Key("top_k", 4),
        "moe_intermediate_size": Key("expert_d_ff", 1792),
        "use_expert_bias": Key("correction_bias", True, kind="flag"),
        "norm_topk_prob": Key("renormalize", True, kind="flag"),
        "routed_scaling_factor": Key("routed_scaling_factor", 1.0, kind="number"),
        "output_router_logits": Ignore("returns the router logits; LFM2-MoE computes no auxiliary loss", carry=False),
    },
    fixed={"router": "sigmoid_topk", "renormalize_eps": 1e-6},
    tensors=(
        W("layers.{i}.ffn.router.proj.weight", L + "feed_forward.gate.weight"),
        W("layers.{i}.ffn.router.correction_bias", L + "feed_forward.expert_bias"),
        *(
            W(f"layers.{{i}}.ffn.experts.{x}", L + f"feed_forward.experts.{{e}}.{w}.weight", StackExperts())
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ),
    ),
    read_own=read_layers,
    write_own=write_layers,
)

TYPE = LFM2_MOE
