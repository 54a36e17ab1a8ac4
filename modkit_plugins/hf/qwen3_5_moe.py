"""Hugging Face ``qwen3_5_moe_text`` (the language model of Qwen3.5-MoE, Qwen3.5-35B-A3B) → modkit: Qwen3-Next's
hybrid with Qwen3.5's unfused Gated DeltaNet projections and a mixture in every layer.

Semantics: ``transformers/models/qwen3_5_moe/{configuration,modeling}_qwen3_5_moe.py`` (``Qwen3_5MoeTextConfig``
derives from ``Qwen3NextConfig``; read through :mod:`.qwen3_next` and :mod:`.qwen3_5`), with these differences from
Qwen3-Next:

* every layer's FFN is the mixture (``Qwen3_5MoeSparseMoeBlock``): the config class has no ``intermediate_size``,
  ``decoder_sparse_step`` or ``mlp_only_layers``; the router (``Qwen3_5MoeTopKRouter``, Qwen3-VL-MoE's) always
  renormalises its top-``num_experts_per_tok`` probabilities (no ``norm_topk_prob``); beside the routed experts a
  shared expert of ``shared_expert_intermediate_size`` times ``sigmoid(shared_expert_gate · x)``;
* the Gated DeltaNet's projections and the multimodal RoPE keys are Qwen3.5's (:mod:`.qwen3_5`).

The ``qwen3_5_moe`` vision-language checkpoints (the text model's config under ``text_config``) load as their
language model, this type (:mod:`.qwen3_5_moe_vl`; the vision tower is left out).
"""

from __future__ import annotations

from ._keys import Key
from .qwen3_5 import LINEAR_TENSORS, NEXT_LINEAR, TextRope
from .qwen3_next import QWEN3_NEXT

MODEL_TYPE = "qwen3_5_moe_text"

QWEN3_5_MOE = QWEN3_NEXT.derive(
    MODEL_TYPE,
    architecture="Qwen3_5MoeForCausalLM",
    notes=__doc__,
    drop=("intermediate_size", "decoder_sparse_step", "norm_topk_prob"),
    # transformers Qwen3_5MoeTextConfig defaults
    defaults={
        "vocab_size": 248320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
    },
    keys={
        "rope_theta": TextRope(10000.0, partial=0.25, always_partial=True),
        "num_experts": Key("n_experts", 256, aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 8),
    },
    fixed={"renormalize": True},
    tensors=LINEAR_TENSORS,
    drop_tensors=NEXT_LINEAR,
)

TYPE = QWEN3_5_MOE
