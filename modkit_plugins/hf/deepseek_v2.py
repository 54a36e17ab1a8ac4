"""Hugging Face ``deepseek_v2`` (DeepSeek-V2, DeepSeek-V2-Lite, DeepSeek-Coder-V2) → modkit: DeepSeek-V3's multi-head
latent attention with complex-valued RoPE, dense first layers, then mixtures of fine-grained experts under a softmax
router, optionally group-limited (a group scored by its best expert), beside shared experts.

Semantics: ``transformers/models/deepseek_v2/{configuration,modeling}_deepseek_v2.py`` (``DeepseekV2Attention``,
``DeepseekV2TopkRouter``, ``DeepseekV2Moe``):

* attention is DeepSeek-V3's ``mla`` (:mod:`.deepseek_v3`; ranks, head widths, ``attention_bias``, the YaRN
  softmax-scale correction, latent norms with eps 1e-6), except the RoPE: ``apply_rotary_emb`` views each
  consecutive pair of rotated features as one complex number and multiplies it by ``e^{i m θ_j}``, which is the
  rotation of interleaved pairs (``layout: interleaved``), always (there is no ``rope_interleave`` key);
* the router takes a softmax over ``n_routed_experts`` in float32; ``topk_method`` "greedy" keeps the top
  ``num_experts_per_tok`` scores, "group_limited_greedy" keeps them inside the ``topk_group`` best of ``n_group``
  groups, a group scored by its highest score (``group_score: max``); the weights are the scores times
  ``routed_scaling_factor``, never renormalised (``norm_topk_prob`` is not read by ``DeepseekV2TopkRouter``);
* ``n_shared_experts`` shared experts form one SwiGLU of ``n_shared_experts · moe_intermediate_size``; ``mlp_bias``
  biases the dense FFNs and the shared experts (not the routed ones);
* ``num_experts_per_tok`` defaults to null in ``DeepseekV2Config`` (no routing is possible then); a config without
  it is read as DeepSeek-V2's 6.

Published configs also hold keys of DeepSeek's own modeling code: ``scoring_func`` must be "softmax",
``moe_layer_freq`` 1; ``seq_aux``, ``aux_loss_alpha`` and ``ep_size`` are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, FirstDense, Ignore, Key, Refuse, Rope, sizes
from ._weights import W
from .deepseek_v3 import DEEPSEEK_V3, LatentAttention
from .llama import L

MODEL_TYPE = "deepseek_v2"

#: topk_method → whether the experts are chosen inside the best groups
TOPK_METHODS = {"greedy": False, "group_limited_greedy": True}


@dataclass(frozen=True)
class ComplexRopeAttention(LatentAttention):
    """DeepSeek-V3's ``mla`` row without ``rope_interleave``: DeepSeek-V2 always rotates interleaved pairs (complex
    RoPE)."""

    KEYS = tuple(k for k in LatentAttention.KEYS if k != "rope_interleave")

    def read(self, r, f, name):
        super().read(r, f, name)
        f["position"] = {**f["position"], "layout": "interleaved"}

    def write(self, f, base, name):
        out = super().write(f, base, name)
        out.pop("rope_interleave")
        return out

    def describe(self, name):
        rows = [row for row in super().describe(name) if row[0] != "`rope_interleave`"]
        return rows + [("(no key)", "mapped", "–", "`position.layout`: interleaved (complex-valued RoPE)")]


@dataclass(frozen=True)
class GroupLimited(Entry):
    """``topk_method``, ``n_group``, ``topk_group`` → the router's groups: "greedy" none, "group_limited_greedy" the
    ``topk_group`` best of ``n_group`` groups, each scored by its highest softmax score (``group_score: max``)."""

    SETS = ("n_group", "topk_group", "group_score")

    def config_keys(self, name):
        return ("topk_method", "n_group", "topk_group")

    def read(self, r, f, name):
        method = r.get("topk_method", "greedy")
        n_group, topk_group = r.get("n_group"), r.get("topk_group")
        if method not in TOPK_METHODS:
            r.error(
                "topk_method",
                f"unsupported topk_method {method!r}; DeepseekV2TopkRouter implements 'greedy' and "
                "'group_limited_greedy'",
            )
            return
        if not TOPK_METHODS[method]:
            return
        for key in ("n_group", "topk_group"):
            r.number(key, None, integer=True)
        if n_group is None or topk_group is None:
            r.error("n_group", "topk_method 'group_limited_greedy' needs both n_group and topk_group")
            return
        f["n_group"], f["topk_group"], f["group_score"] = n_group, topk_group, "max"

    def write(self, f, base, name):
        if f["n_group"] is None:
            return {"topk_method": "greedy", "n_group": base.get("n_group"), "topk_group": base.get("topk_group")}
        return {"topk_method": "group_limited_greedy", "n_group": f["n_group"], "topk_group": f["topk_group"]}

    def describe(self, name):
        return [
            (
                "`topk_method`, `n_group`, `topk_group`",
                "mapped",
                "`greedy`",
                "router groups: greedy none; group_limited_greedy `n_group`, `topk_group`, group_score max",
            )
        ]


DEEPSEEK_V2 = DEEPSEEK_V3.derive(
    MODEL_TYPE,
    architecture="DeepseekV2ForCausalLM",
    notes=__doc__,
    drop=("n_group", "topk_group", "num_mtp_layers", "num_nextn_predict_layers", "scoring_func", "topk_method"),
    keys={
        # transformers DeepseekV2Config, key by key
        **sizes(
            vocab_size=102400,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
        ),
        "intermediate_size": Key("d_ff", 11008, note="the dense first layers"),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "rope_theta": Rope(10000.0),
        "q_lora_rank": ComplexRopeAttention(),
        "mlp_bias": Key(("mlp_bias", "shared_bias"), False, kind="flag", note="dense FFNs and shared experts"),
        "n_routed_experts": Key("n_experts", 64),
        "num_experts_per_tok": Key("top_k", 6, note="null in DeepseekV2Config (no routing); DeepSeek-V2's 6"),
        "moe_intermediate_size": Key("expert_d_ff", 1407),
        "n_shared_experts": Key(
            "shared_d_ff",
            2,
            kind="count",
            read_as=lambda v, f: v * f["expert_d_ff"] if v else None,
            write_as=lambda v, f: v // f["expert_d_ff"] if v else 0,
            note="n_shared_experts × moe_intermediate_size",
        ),
        "routed_scaling_factor": Key("routed_scaling_factor", 1.0, kind="number"),
        "topk_method": GroupLimited(),
        "norm_topk_prob": Ignore("not read by DeepseekV2TopkRouter: the weights are never renormalised"),
        "first_k_dense_replace": FirstDense(0),
        "scoring_func": Refuse("softmax", "the router scores are a softmax (DeepseekV2TopkRouter)"),
    },
    fixed={"router": "topk", "correction_bias": False, "renormalize": False},
    tensors=tuple(
        W(f"layers.{{i}}.ffn.shared.{x}.{{p}}", L + f"mlp.shared_experts.{x}_proj.{{p}}")
        for x in ("gate", "up", "down")
    ),
    drop_tensors=(
        "layers.{i}.ffn.router.correction_bias",
        *(f"layers.{{i}}.ffn.shared.{x}.weight" for x in ("gate", "up", "down")),
    ),
    keep=(),
    checkpoint_layout="interleaved",
)

TYPE = DEEPSEEK_V2
