"""Hugging Face ``afmoe`` (Arcee Trinity) → modkit: sandwich-norm blocks, gated attention with per-head QK-norm, RoPE
on the sliding-window layers only (NoPE on the global ones), dense first layers, then mixtures under a sigmoid router
with a selection-only expert bias beside shared experts.

Semantics: ``transformers/models/afmoe/{configuration,modeling}_afmoe.py`` (``AfmoeAttention``,
``AfmoeTokenChoiceRouter``, ``AfmoeSparseMoeBlock``, ``AfmoeDecoderLayer``, ``AfmoeModel``):

* every sublayer has a norm before and after it (``input_layernorm``/``post_attention_layernorm``,
  ``pre_mlp_layernorm``/``post_mlp_layernorm``: ``placement: sandwich``);
* attention: ``q_norm``/``k_norm`` RMSNorms over ``head_dim``; the merged head outputs are multiplied by
  ``sigmoid(gate_proj(x))`` before ``o_proj`` (``output_gate``); ``attention_bias`` is refused (transformers biases
  q, k, v and o but never ``gate_proj``, whose bias modkit ties to q's);
* ``layer_types`` (default: every ``global_attn_every_n_layers``-th layer ``full_attention``, the others
  ``sliding_attention`` with ``sliding_window``); RoPE is applied on the sliding layers only, the full-attention
  layers use no position encoding (``position: none`` overrides);
* the first ``num_dense_layers`` layers hold a dense SwiGLU of ``intermediate_size``, the others a mixture: sigmoid
  scores, the top ``num_experts_per_tok`` of the scores plus ``expert_bias`` (a never-trained parameter: modkit's
  ``correction_bias`` buffer), weighted by the unbiased scores renormalised to sum 1 and times ``route_scale``; plus
  ``num_shared_experts`` shared experts as one SwiGLU of ``num_shared_experts · moe_intermediate_size``;
* ``mup_enabled`` multiplies the token embeddings by ``sqrt(hidden_size)``.

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.router.gate``, its bias
``mlp.expert_bias``, the shared experts ``mlp.shared_experts``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, FirstDense, HeadDim, Ignore, Key, LayerTypes, Refuse, Rope, sizes
from ._weights import W
from .glm4_moe import MOE_TENSORS
from .llama import LLAMA, L

MODEL_TYPE = "afmoe"


@dataclass(frozen=True)
class NoPEOnGlobal(Entry):
    """No config key: the full-attention layers take no position encoding, the sliding ones the RoPE
    (``AfmoeAttention`` rotates only when ``is_local_attention``)."""

    SETS = ("positions",)

    def config_keys(self, name):
        return ()

    def read(self, r, f, name):
        types = f["layer_types"] or ["full_attention"] * f["n_layers"]
        f["positions"] = [f["position"] if t == "sliding_attention" else {"type": "none"} for t in types]

    def describe(self, name):
        return [("(no key)", "mapped", "–", "`positions`: RoPE on sliding layers, `none` on full-attention layers")]


def _renamed(entry: W, theirs: str) -> W:
    return W(entry.ours, L + theirs, entry.transform)


F = "layers.{i}.ffn."
#: GLM-4.5's mixture rows under AFMoE's names (router ``mlp.router.gate``, its bias ``mlp.expert_bias``)
RENAMED = {F + "router.proj.weight": "mlp.router.gate.weight", F + "router.correction_bias": "mlp.expert_bias"}

AFMOE = LLAMA.derive(
    MODEL_TYPE,
    architecture="AfmoeForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "attention_bias"),
    keys={
        # transformers AfmoeConfig, key by key
        **sizes(
            vocab_size=200192,
            hidden_size=2048,
            num_hidden_layers=32,
            num_attention_heads=16,
            max_position_embeddings=16384,
        ),
        "head_dim": HeadDim(128),
        "intermediate_size": Key("d_ff", 6144, note="the dense first layers"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "layer_types": LayerTypes(1024, pattern=4, pattern_key="global_attn_every_n_layers"),
        "rope_theta": Rope(10000.0),
        "(nope)": NoPEOnGlobal(),
        "attention_bias": Refuse(False, "gate_proj has no bias beside biased q/k/v/o projections"),
        "mup_enabled": Key(
            "embedding_scale",
            False,
            kind="flag",
            read_as=lambda v, f: "sqrt_d_model" if v else None,
            write_as=lambda v, f: v is not None,
            note="embeddings times sqrt(hidden_size)",
        ),
        "num_experts": Key("n_experts", 64),
        "num_experts_per_tok": Key("top_k", 6),
        "moe_intermediate_size": Key("expert_d_ff", 1408),
        "num_shared_experts": Key(
            "shared_d_ff",
            2,
            kind="count",
            read_as=lambda v, f: v * f["expert_d_ff"] if v else None,
            write_as=lambda v, f: v // f["expert_d_ff"] if v else 0,
            note="num_shared_experts × moe_intermediate_size",
        ),
        "route_scale": Key("routed_scaling_factor", 1.0, kind="number"),
        "num_dense_layers": FirstDense(1),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={
        "placement": {"type": "sandwich"},
        "qk_norm": "head",
        "attn_output_gate": True,
        "router": "sigmoid_topk",
        "correction_bias": True,
        "renormalize": True,
    },
    tensors=(
        W("layers.{i}.attn_post_norm.weight", L + "post_attention_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "pre_mlp_layernorm.weight"),
        W("layers.{i}.ffn_post_norm.weight", L + "post_mlp_layernorm.weight"),
        W("layers.{i}.attention.gate_proj.weight", L + "self_attn.gate_proj.weight"),
        *(_renamed(e, RENAMED[e.ours[0]]) if e.ours[0] in RENAMED else e for e in MOE_TENSORS),
    ),
)

TYPE = AFMOE
