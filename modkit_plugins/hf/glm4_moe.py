"""Hugging Face ``glm4_moe`` (GLM-4.5, GLM-4.5-Air, GLM-4.6) → modkit: GQA with partial RoPE and optional per-head
QK-norm, dense first layers, then mixtures of fine-grained experts under DeepSeek-V3's sigmoid router (selection-only
correction bias, group-limited routing, routed scaling) beside a shared expert.

Semantics: ``transformers/models/glm4_moe/{configuration,modeling}_glm4_moe.py`` (``Glm4MoeAttention``,
``Glm4MoeTopkRouter``, ``Glm4MoeMoE``, ``Glm4MoeDecoderLayer``):

* attention: pre-norm blocks (unlike GLM-4's sandwich norms); ``attention_bias`` on q, k and v, never on the output
  projection; ``use_qk_norm``: RMSNorms over ``head_dim`` on q and k before RoPE; ``head_dim`` defaults to
  ``hidden_size // num_attention_heads``;
* RoPE rotates the first ``partial_rotary_factor`` (default 0.5, ``Glm4MoeConfig.__post_init__``) of each head in
  half-split pairs (unlike GLM-4's interleaved ones);
* the first ``first_k_dense_replace`` layers hold a dense SwiGLU of ``intermediate_size``, the others a mixture:
  ``n_routed_experts`` SwiGLUs of ``moe_intermediate_size`` under ``Glm4MoeTopkRouter``, DeepSeek-V3's router
  (``sigmoid_topk``, ``correction_bias``, ``n_group``/``topk_group`` with the top-2 group score, ``norm_topk_prob``,
  ``routed_scaling_factor``), plus ``n_shared_experts`` shared experts as one SwiGLU of ``n_shared_experts ·
  moe_intermediate_size``;
* the multi-token-prediction layers (``num_nextn_predict_layers``; GLM-4.5's ``model.layers.92``, GLM-4.5-Air's
  ``model.layers.46``) are not part of the causal LM; their tensors are carried along, not computed.

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate`` with its
``e_score_correction_bias``, the shared experts ``mlp.shared_experts``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._keys import HeadDim, Ignore, Key, KVHeads, Rope, sizes
from .deepseek_v3 import DEEPSEEK_V3
from .llama import LLAMA

MODEL_TYPE = "glm4_moe"

#: DeepSeek-V3's mixture rows (router, experts, shared experts, dense first layers), shared by its descendants
MOE_KEYS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "routed_scaling_factor",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "first_k_dense_replace",
)

#: DeepSeek-V3's weight rows of a mixture layer (router, correction bias, experts, shared experts)
MOE_TENSORS = tuple(e for e in DEEPSEEK_V3.tensors if e.ours[0].startswith("layers.{i}.ffn."))


def moe_keys(**defaults) -> dict:
    """DeepSeek-V3's mixture rows with other transformers class ``defaults`` (``{config key: default}``)."""
    rows = {k: DEEPSEEK_V3.keys[k] for k in MOE_KEYS}
    return {k: replace(row, default=defaults[k]) if k in defaults else row for k, row in rows.items()}


@dataclass(frozen=True)
class FloorHeadDim(HeadDim):
    """``head_dim``: the config's value, else ``hidden_size // num_attention_heads`` rounded down, as
    ``Glm4MoeAttention`` computes it (its class defaults, 4096 over 96 heads, give 42; published configs give 128)."""

    def read(self, r, f, name):
        value = r.number(name, None, integer=True)
        f["head_dim"] = value if value is not None else f["d_model"] // f["n_heads"]

    def write(self, f, base, name):
        hd = f["head_dim"]
        return {name: hd} if hd is not None and hd != f["d_model"] // f["n_heads"] else {}


GLM4_MOE = LLAMA.derive(
    MODEL_TYPE,
    architecture="Glm4MoeForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    keys={
        # transformers Glm4MoeConfig, key by key
        **sizes(
            vocab_size=151552,
            hidden_size=4096,
            num_hidden_layers=46,
            num_attention_heads=96,
            max_position_embeddings=131072,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": FloorHeadDim(),
        "intermediate_size": Key("d_ff", 10944, note="the dense first layers"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "rope_theta": Rope(10000.0, partial=0.5, always_partial=True),
        "attention_bias": Key("qkv_bias", False, kind="flag", note="q, k and v (never the output projection)"),
        "use_qk_norm": Key(
            "qk_norm",
            False,
            kind="flag",
            read_as=lambda v, f: "head" if v else None,
            write_as=lambda v, f: v is not None,
            note="per-head RMSNorms of q and k before RoPE",
        ),
        **moe_keys(
            n_routed_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1408,
            n_shared_experts=1,
            routed_scaling_factor=1.0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=True,
            first_k_dense_replace=1,
        ),
        "num_nextn_predict_layers": Ignore("the multi-token-prediction layers are not part of the causal LM"),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={"router": "sigmoid_topk", "correction_bias": True},
    tensors=MOE_TENSORS,
    keep=(
        (r"model\.layers\.(46|92)\..*", "GLM-4.5(-Air)'s multi-token-prediction layer (not computed by the causal LM)"),
    ),
)

TYPE = GLM4_MOE
