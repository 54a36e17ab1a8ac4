"""Hugging Face ``kimi_linear`` (Moonshot Kimi Linear, Kimi-Linear-48B-A3B) → modkit: Kimi Delta Attention layers and
latent attention without positions, DeepSeek-V3's mixture after dense first layers.

Semantics: ``transformers/models/kimi_linear/{configuration,modeling}_kimi_linear.py`` (``KimiLinearConfig`` derives
from ``DeepseekV3Config``; its ``attribute_map`` writes several keys under other names: ``num_experts``,
``num_experts_per_token``, ``num_shared_experts``, ``num_expert_group``, ``moe_renormalize``, ``model_max_length``,
each read here under both names):

* layer ``i`` is ``layer_types[i]``: ``linear_attention`` (``KimiLinearDeltaAttention``, modkit's ``kimi_delta``:
  ``linear_num_heads`` heads of ``linear_head_dim``, low-rank forget and output gates of rank ``linear_head_dim``, a
  bias-free convolution of ``linear_conv_kernel_dim`` with ``hidden_act`` (silu only), the gated output norm with
  ``rms_norm_eps``) or ``full_attention`` (``KimiLinearAttention``: DeepSeek's latent attention, ``q_lora_rank``
  default null, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``attention_bias``,
  with **no** rotary embedding at all: the "rope" part of the keys is one shared head read as it is, the position
  scheme ``none``; softmax scale ``1 / sqrt(qk_nope_head_dim + qk_rope_head_dim)``). Without ``layer_types``, the
  1-indexed ``full_attn_layers`` / ``kda_layers`` of a published ``linear_attn_config`` (which also holds
  ``head_dim``, ``num_heads``, ``short_conv_kernel_size``), else layers 4, 8, ... are attention;
* ``mlp_layer_types[i]``: ``dense`` (a SwiGLU of ``intermediate_size``) or ``sparse`` (``KimiLinearMoE``, DeepSeek-V3's
  ``DeepseekV3MoE``: sigmoid scores, the selection-only ``e_score_correction_bias``, ``num_expert_group`` /
  ``topk_group``, renormalised with ``moe_renormalize``, times ``routed_scaling_factor``, plus
  ``num_shared_experts`` shared SwiGLUs of ``moe_intermediate_size``); without it the first
  ``first_k_dense_replace`` (default 1) layers are dense;
* ``num_key_value_heads`` must equal ``num_attention_heads`` (one latent serves every head; transformers' attention
  fails otherwise); ``head_dim`` and ``qk_head_dim`` are recomputed by the config class.

On disk the Kimi Delta Attention's ``A_log`` is ``[1, 1, n_heads, 1]`` (modkit's ``[n_heads]``) and its convolution is
three, ``q_conv1d``, ``k_conv1d``, ``v_conv1d``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import Entry, Ignore, Key, Own, _read, sizes
from ._reader import HFConfig
from ._spec import rmsnorm
from ._transforms import Transform
from ._type import HFType
from ._weights import Head, StackExperts, W
from .deepseek_v3 import LATENT_EPS, _groups
from .olmo_hybrid import SplitConv

MODEL_TYPE = "kimi_linear"

LINEAR, FULL = "linear_attention", "full_attention"
#: the Kimi Delta Attention's keys with ``KimiLinearConfig``'s defaults, and their names in ``linear_attn_config``
LINEAR_DEFAULTS = {"linear_num_heads": 32, "linear_head_dim": 128, "linear_conv_kernel_dim": 4}
IN_LINEAR_CONFIG = {"linear_num_heads": "num_heads", "linear_head_dim": "head_dim", "linear_conv_kernel_dim": "short_conv_kernel_size"}  # fmt: skip
LAYER_KEYS = ("layer_types", "linear_attn_config", *LINEAR_DEFAULTS)
MLP_KEYS = ("mlp_layer_types", "first_k_dense_replace")


@dataclass(frozen=True)
class KimiLatent(Entry):
    """The ``mla`` of the full-attention layers: DeepSeek's ranks and widths without any rotary embedding."""

    SETS = ("mla",)
    KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "attention_bias")

    def config_keys(self, name):
        return (*self.KEYS, "num_key_value_heads", "head_dim", "qk_head_dim")

    def read(self, r, f, name):
        mla = {
            "q_lora_rank": _read(r, "q_lora_rank", "window", None, ()),
            "kv_lora_rank": r.number("kv_lora_rank", 512, integer=True),
            "qk_nope_head_dim": r.number("qk_nope_head_dim", 128, integer=True),
            "qk_rope_head_dim": r.number("qk_rope_head_dim", 64, integer=True),
            "v_head_dim": r.number("v_head_dim", 128, integer=True),
        }
        if mla["q_lora_rank"] is None:
            mla.pop("q_lora_rank")
        if r.flag("attention_bias", False):
            mla["bias"] = True
        mla["latent_norm"] = rmsnorm(LATENT_EPS)
        f["mla"] = mla
        kv = r.number("num_key_value_heads", None, integer=True)
        if kv is not None and kv != f["n_heads"]:
            r.error(
                "num_key_value_heads",
                f"= {kv} differs from num_attention_heads = {f['n_heads']}: latent attention serves every head from "
                "one latent, and transformers' KimiLinearAttention fails unless they are equal",
            )
        r.ignore("head_dim", "qk_head_dim")

    def write(self, f, base, name):
        mla = f["mla"] or {}
        keys = {k: mla.get(k) for k in self.KEYS[:-1]}
        if not mla:  # no attention layer: the source config's sizes
            keys = {k: base.get(k) for k in self.KEYS[:-1] if base.get(k) is not None}
        return {**keys, "attention_bias": bool(mla.get("bias")), "num_key_value_heads": f["n_heads"]}

    def describe(self, name):
        return [
            (", ".join(f"`{k}`" for k in self.KEYS), "mapped", "`null`, `512`, `128`, `64`, `128`, `false`",
             "`mla` (no rotary embedding; latent norms RMSNorm, eps 1e-6)"),
            ("`num_key_value_heads`", "refused", "num_attention_heads", "only num_attention_heads: one latent serves every head"),
            ("`head_dim`, `qk_head_dim`", "ignored", "–", "recomputed by KimiLinearConfig"),
        ]  # fmt: skip


@dataclass(frozen=True)
class HeadVector(Transform):
    """Kimi Delta Attention's ``A_log``: ``[1, 1, n_heads, 1]`` on disk, ``[n_heads]`` in modkit."""

    def to_ours(self, ts, ctx):
        return [ts[0].reshape(ctx.shape(0))]

    def to_hf(self, ts, ctx, extras):
        return [ts[0].reshape(1, 1, -1, 1)]

    def describe(self) -> str:
        return "reshaped: [1, 1, n_heads, 1] on disk"


def _linear_config(r: HFConfig) -> dict:
    cfg = r.get("linear_attn_config") or {}
    if not isinstance(cfg, dict):
        r.error("linear_attn_config", f"must be an object, got {json_value(cfg)}")
        return {}
    return cfg


def _layer_types(r: HFConfig, n: int, lin: Mapping[str, Any]) -> list[str]:
    """``layer_types``, else ``linear_attn_config``'s 1-indexed lists, else attention on layers 4, 8, ...."""
    types = r.get("layer_types")
    if types is None and "full_attn_layers" in lin and "kda_layers" in lin:
        types = [None] * n
        for key, kind in (("full_attn_layers", FULL), ("kda_layers", LINEAR)):
            for i in lin[key]:
                if isinstance(i, int) and 1 <= i <= n:
                    types[i - 1] = kind
    if types is None:
        return [FULL if i and i % 4 == 0 else LINEAR for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in (LINEAR, FULL) for t in types):
        r.error(
            "layer_types",
            f"must give each of the {n} layers {LINEAR!r} or {FULL!r} (KimiLinearDecoderLayer builds no other), got "
            f"{json_value(types)}",
        )
        return [FULL] * n
    return types


def _mlp_types(r: HFConfig, f: dict) -> list[bool]:
    """Per layer, whether it holds the mixture (``mlp_layer_types``, else after ``first_k_dense_replace``)."""
    n = f["n_layers"]
    types = r.get("mlp_layer_types")
    k = r.number("first_k_dense_replace", 1, integer=True, positive=False, minimum=0)
    if types is None:
        return [i >= k for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in ("dense", "sparse") for t in types):
        r.error("mlp_layer_types", f"must give each of the {n} layers 'dense' or 'sparse', got {json_value(types)}")
        return [False] * n
    return [t == "sparse" for t in types]


def read_layers(r: HFConfig, f: dict) -> None:
    """Per layer the mixer (``mixers``: ``kimi_delta`` on linear layers) and the FFN (``moe_layers``)."""
    lin = _linear_config(r)
    size = {
        key: r.number(key, lin.get(IN_LINEAR_CONFIG[key], default), integer=True)
        for key, default in LINEAR_DEFAULTS.items()
    }
    mixer = {
        "type": "kimi_delta",
        "n_heads": size["linear_num_heads"],
        "head_dim": size["linear_head_dim"],
        "d_conv": size["linear_conv_kernel_dim"],
        "norm_eps": f["eps"],
    }
    types = _layer_types(r, f["n_layers"], lin)
    f["mixers"] = [mixer if t == LINEAR else None for t in types]
    flags = _mlp_types(r, f)
    f["moe"], f["moe_layers"] = any(flags), flags
    if LINEAR in types and f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the Kimi Delta Attention convolution, which modkit's kimi_delta computes "
            f"with silu only; got {json_value(r.get('hidden_act'))}",
        )


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types``, ``mlp_layer_types`` and the Kimi Delta Attention's keys (the source config's, else the
    defaults, when no layer is linear)."""
    cfg["layer_types"] = [LINEAR if m is not None else FULL for m in f["mixers"]]
    flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
    cfg["mlp_layer_types"] = ["sparse" if x else "dense" for x in flags]
    m = f["mixer"]
    if getattr(m, "type", None) == "kimi_delta":
        cfg.update(linear_num_heads=m.n_heads, linear_head_dim=m.head_dim, linear_conv_kernel_dim=m.d_conv)
    else:
        cfg.update({k: base.get(k, v) for k, v in LINEAR_DEFAULTS.items()})


L, A, F = "model.layers.{i}.", "layers.{i}.attention.", "layers.{i}.ffn."
S = L + "self_attn."
M = L + "block_sparse_moe."

KIMI_LINEAR = HFType(
    model_type=MODEL_TYPE,
    architecture="KimiLinearForCausalLM",
    notes=__doc__,
    # transformers KimiLinearConfig, key by key
    keys={
        **sizes(
            vocab_size=163840,
            hidden_size=2304,
            num_hidden_layers=27,
            num_attention_heads=32,
            max_position_embeddings=1048576,
        ),
        "max_position_embeddings": Key("max_seq_len", 1048576, aliases=("model_max_length",)),
        "intermediate_size": Key("d_ff", 9216, note="the dense layers"),
        "hidden_act": Key("act", "silu", kind="act"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "q_lora_rank": KimiLatent(),
        "num_experts": Key("n_experts", 256, aliases=("num_local_experts",)),
        "num_experts_per_token": Key("top_k", 8, aliases=("num_experts_per_tok",)),
        "moe_intermediate_size": Key("expert_d_ff", 1024),
        "num_shared_experts": Key(
            "shared_d_ff",
            1,
            kind="count",
            aliases=("n_shared_experts",),
            read_as=lambda v, f: v * f["expert_d_ff"] if v else None,
            write_as=lambda v, f: v // f["expert_d_ff"] if v else 0,
            note="num_shared_experts × moe_intermediate_size",
        ),
        "routed_scaling_factor": Key("routed_scaling_factor", 2.446, kind="number"),
        "num_expert_group": Key(
            "n_group", 1, aliases=("n_group",), read_as=_groups, write_as=lambda v, f: v or 1, note="1: no limit"
        ),
        "topk_group": Key(
            "topk_group", 1, read_as=lambda v, f: None if f["n_group"] is None else v, write_as=lambda v, f: v or 1
        ),
        "moe_renormalize": Key("renormalize", True, kind="flag", aliases=("norm_topk_prob",)),
        "layer_types": Own(
            (*LAYER_KEYS, *MLP_KEYS),
            "per layer: kimi_delta on linear_attention layers, latent attention on full_attention layers; a dense "
            "SwiGLU or the mixture by mlp_layer_types (see the notes)",
            fields=("mixers", "moe", "moe_layers"),
        ),
        "pretraining_tp": Ignore("Meta's tensor-parallel matmul slicing emulation: numerically the same model"),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={
        "norm": "rmsnorm",
        "placement": {"type": "pre"},
        "ffn": "gated",
        "position": {"type": "none"},
        "router": "sigmoid_topk",
        "correction_bias": True,
    },
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.weight", "model.norm.weight"),
        W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.weight"),
        # both mixers' q_proj, k_proj (Kimi Delta), v_proj (Kimi Delta) and o_proj are self_attn's
        *(W(A + f"{x}.{{p}}", S + f"{x}.{{p}}") for x in ("q_proj", "k_proj", "v_proj", "o_proj")),
        *(W(A + f"{x}.{{p}}", S + f"{x}.{{p}}") for x in ("q_a_proj", "kv_a_proj_with_mqa")),
        *(
            W(A + f"{x}.weight", S + f"{x}.weight")
            for x in ("q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj")
        ),
        W(A + "conv1d.weight", tuple(S + f"{x}_conv1d.weight" for x in "qkv"), SplitConv()),
        W(A + "A_log", S + "A_log", HeadVector()),
        *(
            W(A + x, S + x)
            for x in ("dt_bias", "o_norm.weight", *(f"{p}_proj.weight" for p in ("f_a", "f_b", "b", "g_a", "g_b")))
        ),
        *(W(F + f"{x}.weight", M + f"{x}_proj.weight") for x in ("gate", "up", "down")),
        W(F + "router.proj.weight", M + "gate.weight"),
        W(F + "router.correction_bias", M + "gate.e_score_correction_bias"),
        *(
            W(F + f"experts.{x}", M + f"experts.{{e}}.{w}.weight", StackExperts())
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ),
        *(W(F + f"shared.{x}.weight", M + f"shared_experts.{x}_proj.weight") for x in ("gate", "up", "down")),
        Head(),
    ),  # fmt: skip
    read_own=read_layers,
    write_own=write_layers,
)

TYPE = KIMI_LINEAR
