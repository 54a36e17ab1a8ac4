"""Hugging Face ``deepseek_v3`` (DeepSeek-V3, DeepSeek-R1, Kimi K2) → modkit: multi-head latent attention, dense
first layers, then mixtures of fine-grained experts under a sigmoid router with a selection-only correction bias,
group-limited routing, routed scaling and shared experts.

Semantics: ``transformers/models/deepseek_v3/{configuration,modeling}_deepseek_v3.py`` (``DeepseekV3Attention``,
``DeepseekV3TopkRouter``, ``DeepseekV3MoE``, ``DeepseekV3DecoderLayer``):

* attention is ``mla``: queries through the low-rank ``q_a_proj`` → ``q_a_layernorm`` → ``q_b_proj`` (``q_lora_rank``;
  null: one ``q_proj``), keys and values from the cached latent of ``kv_lora_rank`` (``kv_a_proj_with_mqa``, then
  ``kv_a_layernorm``, ``kv_b_proj``), per head ``qk_nope_head_dim`` unrotated and ``qk_rope_head_dim`` rotated features
  (one rotated key shared by the heads), values of ``v_head_dim``; ``attention_bias`` on ``q_a_proj``,
  ``kv_a_proj_with_mqa`` and ``o_proj``. The latent norms are RMSNorms with eps 1e-6 whatever ``rms_norm_eps``
  (``DeepseekV3RMSNorm``'s default). ``num_key_value_heads`` must equal the heads (the latent serves every head);
* RoPE: ``rope_interleave`` (default true) rotates interleaved pairs, the checkpoint's layout of the rotated rows
  (``layout: interleaved``); false: half-split. A YaRN scaling with ``mscale_all_dim`` also multiplies the softmax
  scale by ``mscale²``, ``mscale = 0.1 · mscale_all_dim · ln(factor) + 1`` (``yarn_apply_mscale``; ``yarn_mscale``);
* the first ``first_k_dense_replace`` layers hold a dense SwiGLU of ``intermediate_size``, the others a mixture:
  ``n_routed_experts`` SwiGLUs of ``moe_intermediate_size``, scores ``sigmoid(gate(x))``, experts chosen by the scores
  plus ``e_score_correction_bias`` inside the ``topk_group`` best of ``n_group`` groups (a group's score: its two
  best), weights the unbiased scores renormalised with ``norm_topk_prob`` and times ``routed_scaling_factor``; plus
  ``n_shared_experts`` shared experts, one SwiGLU of ``n_shared_experts · moe_intermediate_size``. One group
  (``n_group`` 1, Kimi K2) is no limit;
* the multi-token-prediction module (``num_nextn_predict_layers``) is not part of the causal LM transformers builds;
  its tensors (DeepSeek-V3's ``model.layers.61``) are carried along, not computed.

Published configs also hold keys of DeepSeek's own modeling code: ``scoring_func``, ``topk_method`` and
``moe_layer_freq`` are checked to be the one setting transformers implements, ``seq_aux``, ``aux_loss_alpha`` and
``ep_size`` (training and deployment settings) are ignored.

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate`` with its
``e_score_correction_bias``, the shared experts ``mlp.shared_experts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._keys import Entry, FirstDense, Ignore, Key, Refuse, Rope, _read, sizes
from ._spec import rmsnorm
from ._weights import StackExperts, W
from .llama import LLAMA, L

MODEL_TYPE = "deepseek_v3"

#: ``DeepseekV3RMSNorm``'s default eps, which the latent norms keep
LATENT_EPS = 1e-6


@dataclass(frozen=True)
class LatentAttention(Entry):
    """The ``mla`` of DeepSeek: ranks and head widths, ``attention_bias``, the RoPE layout (``rope_interleave``), the YaRN
    softmax-scale correction, and the head counts transformers derives (``head_dim``, ``qk_head_dim``) or requires
    (``num_key_value_heads`` = ``num_attention_heads``)."""

    SETS = ("mla", "position")
    #: the RoPE layout ``rope_interleave`` gives by default (what the reference page reads off a row)
    layout: ClassVar[str] = "interleaved"

    KEYS = (
        "q_lora_rank",
        "kv_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "attention_bias",
        "rope_interleave",
        "num_key_value_heads",
        "head_dim",
        "qk_head_dim",
    )

    def config_keys(self, name):
        return self.KEYS

    def read(self, r, f, name):
        mla = {
            "q_lora_rank": _read(r, "q_lora_rank", "window", 1536, ()),  # a present null: one full q_proj
            "kv_lora_rank": r.number("kv_lora_rank", 512, integer=True),
            "qk_nope_head_dim": r.number("qk_nope_head_dim", 128, integer=True),
            "qk_rope_head_dim": r.number("qk_rope_head_dim", 64, integer=True),
            "v_head_dim": r.number("v_head_dim", 128, integer=True),
        }
        if mla["q_lora_rank"] is None:
            mla.pop("q_lora_rank")
        if r.flag("attention_bias", False):
            mla["bias"] = True
        scaling = (f["position"] or {}).get("scaling") or {}
        if scaling.get("type") == "yarn" and scaling.get("mscale_all_dim"):
            mla["yarn_mscale"] = {"factor": scaling["factor"], "mscale_all_dim": scaling["mscale_all_dim"]}
        mla["latent_norm"] = rmsnorm(LATENT_EPS)
        f["mla"] = mla
        if r.flag("rope_interleave", True):
            f["position"] = {**f["position"], "layout": "interleaved"}
        kv = r.number("num_key_value_heads", None, integer=True)
        if kv is not None and kv != f["n_heads"]:
            r.error(
                "num_key_value_heads",
                f"= {kv} differs from num_attention_heads = {f['n_heads']}: latent attention "
                "serves every head from one latent, and transformers' DeepseekV3Attention fails unless they are equal",
            )
        r.ignore("head_dim", "qk_head_dim")  # DeepseekV3Config.__post_init__ recomputes both

    def write(self, f, base, name):
        mla = f["mla"] or {}
        return {
            "q_lora_rank": mla.get("q_lora_rank"),
            "kv_lora_rank": mla.get("kv_lora_rank"),
            "qk_nope_head_dim": mla.get("qk_nope_head_dim"),
            "qk_rope_head_dim": mla.get("qk_rope_head_dim"),
            "v_head_dim": mla.get("v_head_dim"),
            "attention_bias": bool(mla.get("bias")),
            "rope_interleave": getattr(f["position"], "layout", "half_split") == "interleaved",
            "num_key_value_heads": f["n_heads"],
        }

    def describe(self, name):
        return [
            (
                "`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`",
                "mapped",
                "`1536`, `512`, `128`, `64`, `128`",
                "`mla`: ranks and head widths (latent norms RMSNorm, eps 1e-6)",
            ),
            ("`attention_bias`", "mapped", "`false`", "`mla.bias`: q_a_proj, kv_a_proj_with_mqa, o_proj"),
            ("`rope_interleave`", "mapped", "`true`", "`position.layout`: interleaved (else half_split)"),
            (
                "`num_key_value_heads`",
                "refused",
                "num_attention_heads",
                "only num_attention_heads: the latent serves every head",
            ),
            ("`head_dim`, `qk_head_dim`", "ignored", "–", "recomputed by DeepseekV3Config"),
        ]


def _groups(v, f):
    return None if v == 1 else v  # one group is no limit


A, F = "layers.{i}.attention.", "layers.{i}.ffn."

DEEPSEEK_V3 = LLAMA.derive(
    MODEL_TYPE,
    architecture="DeepseekV3ForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "head_dim", "num_key_value_heads", "attention_bias"),
    keys={
        # transformers DeepseekV3Config, key by key
        **sizes(
            vocab_size=129280,
            hidden_size=7168,
            num_hidden_layers=61,
            num_attention_heads=128,
            max_position_embeddings=4096,
        ),
        "intermediate_size": Key("d_ff", 18432, note="the dense first layers"),
        "rope_theta": Rope(10000.0),
        "q_lora_rank": LatentAttention(),
        "n_routed_experts": Key("n_experts", 256),
        "num_experts_per_tok": Key("top_k", 8),
        "moe_intermediate_size": Key("expert_d_ff", 2048),
        "n_shared_experts": Key(
            "shared_d_ff",
            1,
            kind="count",
            read_as=lambda v, f: v * f["expert_d_ff"] if v else None,
            write_as=lambda v, f: v // f["expert_d_ff"] if v else 0,
            note="n_shared_experts × moe_intermediate_size",
        ),
        "routed_scaling_factor": Key("routed_scaling_factor", 2.5, kind="number"),
        "n_group": Key("n_group", 8, read_as=_groups, write_as=lambda v, f: v or 1, note="1: no limit"),
        "topk_group": Key(
            "topk_group", 4, read_as=lambda v, f: None if f["n_group"] is None else v, write_as=lambda v, f: v or 1
        ),
        "norm_topk_prob": Key("renormalize", True, kind="flag"),
        "first_k_dense_replace": FirstDense(3),
        "pretraining_tp": Ignore("Meta's tensor-parallel matmul slicing emulation: numerically the same model"),
        "num_mtp_layers": Ignore("the multi-token-prediction module is not part of the causal LM"),
        "num_nextn_predict_layers": Ignore(
            "the multi-token-prediction module is not part of the causal LM (the older name)"
        ),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
        # keys of the published configs (written for DeepSeek's own modeling code), which transformers does not read
        "scoring_func": Refuse("sigmoid", "the router scores are sigmoids (DeepseekV3TopkRouter)"),
        "topk_method": Refuse("noaux_tc", "experts are chosen by the biased scores inside the best groups (noaux_tc)"),
        "moe_layer_freq": Refuse(1, "every layer after first_k_dense_replace holds a mixture"),
        "seq_aux": Ignore("DeepSeek's sequence-wise balance loss switch (training only)"),
        "aux_loss_alpha": Ignore("weight of DeepSeek's balance loss (training only; transformers computes none)"),
        "ep_size": Ignore("expert-parallel degree of DeepSeek's inference code (a deployment setting)"),
    },
    fixed={"router": "sigmoid_topk", "correction_bias": True},
    tensors=(
        *(W(A + f"{x}.{{p}}", L + f"self_attn.{x}.{{p}}") for x in ("q_a_proj", "kv_a_proj_with_mqa")),
        *(
            W(A + f"{x}.weight", L + f"self_attn.{x}.weight")
            for x in ("q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj")
        ),
        W(F + "router.proj.weight", L + "mlp.gate.weight"),
        W(F + "router.correction_bias", L + "mlp.gate.e_score_correction_bias"),
        *(
            W(F + f"experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
        *(W(F + f"shared.{x}.weight", L + f"mlp.shared_experts.{x}_proj.weight") for x in ("gate", "up", "down")),
    ),
    keep=((r"model\.layers\.61\..*", "DeepSeek-V3's multi-token-prediction layer (not computed by the causal LM)"),),
    checkpoint_layout=lambda config: (
        "interleaved" if config.get("rope_interleave", True) is not False else "half_split"
    ),
)

TYPE = DEEPSEEK_V3
