"""Hugging Face ``bailing_hybrid`` (inclusionAI Ling 3, Ling-3.0-Flash) → modkit: Kimi Delta Attention layers with a
bounded forget gate and full-rank gates, gated latent attention with interleaved RoPE, DeepSeek-V3's mixture after
dense first layers.

Semantics: ``transformers/models/bailing_hybrid/{configuration,modeling}_bailing_hybrid.py`` (``BailingHybridConfig``
derives from ``DeepseekV3Config``; its ``attribute_map`` writes several keys under other names: ``num_experts``,
``num_experts_per_token``, ``num_shared_experts``, ``num_expert_group``, ``moe_renormalize``, ``model_max_length``,
``num_nextn_predict_layers``, ``expert_swiglu_limit_list``, ``share_expert_swiglu_limit_list``, each read here under
both names):

* layer ``i`` is ``layer_types[i]``, by default attention on every ``layer_group_size``-th layer (6: layers 5, 11,
  ...): ``linear_attention`` (``BailingHybridDeltaAttention``, modkit's ``kimi_delta`` with ``full_rank_gates``:
  separate ``q_proj``, ``k_proj``, ``v_proj`` of ``linear_num_heads`` (default ``num_attention_heads``) heads of
  ``linear_head_dim`` (default ``head_dim``, 128), one bias-free convolution of ``linear_conv_kernel_dim`` (default
  ``short_conv_kernel_size``, 4) with ``hidden_act`` (silu only), the forget gate ``BailingHybridForgetGate`` from a
  full ``f_proj``: with ``kda_safe_gate`` (default true) ``kda_lower_bound · sigmoid(exp(A_log) · (f + dt_bias))``
  (``forget_gate: bounded``, ``gate_lower_bound``), else ``-exp(A_log) · softplus(f + dt_bias)``; a full ``g_proj``
  output gate through the sigmoid-gated RMSNorm with ``rms_norm_eps``) or ``full_attention``
  (``BailingHybridAttention``: DeepSeek's latent attention, ``q_lora_rank`` default null, ``kv_lora_rank``,
  ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``, ``attention_bias``, RoPE of ``rope_parameters``
  (``rope_theta`` 6e6) on interleaved pairs always, the YaRN ``mscale²`` on the softmax scale as DeepSeek's, and
  each head's output times ``sigmoid(g_proj(x))``, one gate per head: ``mla.head_gate``);
* ``mlp_layer_types[i]``: ``dense`` (a SwiGLU of ``intermediate_size``) or ``sparse`` (``BailingHybridMoE``,
  DeepSeek-V3's: sigmoid scores, the selection-only ``e_score_correction_bias``, ``num_expert_group`` /
  ``topk_group``, renormalised with ``moe_renormalize``, times ``routed_scaling_factor``, plus
  ``num_shared_experts`` shared SwiGLUs of ``moe_intermediate_size``); without it the first ``first_k_dense_replace``
  (default 2) layers are dense;
* the SwiGLU clipping limits (``expert_swiglu_limit_list``, ``share_expert_swiglu_limit_list``, Step3p7's clamp of
  the activated gate and of the up projection) must be zero (no clipping, the default): modkit has no such FFN, so
  a non-zero limit is refused by key;
* ``num_key_value_heads`` must equal ``num_attention_heads`` (one latent serves every head); ``head_dim`` is the
  linear head width on input and recomputed as ``qk_rope_head_dim`` by the config class, ``qk_head_dim`` too.

The multi-token-prediction layers (``num_nextn_predict_layers``) are not part of the causal LM transformers builds.
On disk (Ling's layout, which transformers' conversion mapping reads and writes back): ``model.word_embeddings``,
each layer's mixer under ``attention.`` with ``dense`` for ``o_proj``, the forget gate's ``f_proj``, ``dt_bias`` and
``A_log [n_heads]`` beside the projections, the convolution as three tensors ``q_conv1d``, ``k_conv1d``,
``v_conv1d``, each expert ``mlp.experts.{e}.{gate,up,down}_proj`` and the correction bias ``mlp.gate.expert_bias``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

from modkit.plugin import CheckpointError, json_value

from ._keys import Ignore, Key, Own, Rope, sizes
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, StackExperts, W
from .kimi_linear import KIMI_LINEAR, KimiLatent
from .olmo_hybrid import SplitConv

MODEL_TYPE = "bailing_hybrid"

LINEAR, FULL = "linear_attention", "full_attention"
#: the delta attention's keys, the config keys transformers derives each from, and their class defaults
LINEAR_FROM = {
    "linear_num_heads": ("num_attention_heads", 32),
    "linear_head_dim": ("head_dim", 128),
    "linear_conv_kernel_dim": ("short_conv_kernel_size", 4),
}
LIMITS = {"expert_swiglu_limit_list": "swiglu_limits", "share_expert_swiglu_limit_list": "swiglu_limits_shared"}
LAYER_KEYS = ("layer_types", "layer_group_size", "mlp_layer_types", "first_k_dense_replace")
GATE_KEYS = ("kda_safe_gate", "kda_lower_bound", "head_dim", "short_conv_kernel_size", *LINEAR_FROM)
#: the bounded gate's class default (``BailingHybridConfig.kda_lower_bound``) and the range modkit accepts
LOWER_BOUND, BOUND_RANGE = -5.0, (-1000.0, -1e-6)


@dataclass(frozen=True)
class GatedLatent(KimiLatent):
    """The ``mla`` of the full-attention layers: DeepSeek's ranks and widths (``q_lora_rank`` default null), the YaRN
    ``mscale²`` of ``rope_parameters``, and Ling's per-head output gate (``head_gate``)."""

    SETS = ("mla",)

    def config_keys(self, name):
        return (*self.KEYS, "num_key_value_heads", "qk_head_dim")

    def read(self, r, f, name):
        super().read(r, f, name)
        f["mla"]["head_gate"] = True
        scaling = (f["position"] or {}).get("scaling") or {}
        if scaling.get("type") == "yarn" and scaling.get("mscale_all_dim"):
            f["mla"]["yarn_mscale"] = {"factor": scaling["factor"], "mscale_all_dim": scaling["mscale_all_dim"]}

    def write(self, f, base, name):
        mla = f["mla"]
        if mla is not None and not mla.get("head_gate"):
            raise CheckpointError(
                f"a {MODEL_TYPE} checkpoint's latent attention gates each head's output (g_proj); the spec's mla has "
                "head_gate false: set head_gate true"
            )
        out = super().write(f, base, name)
        out.pop("head_dim", None)
        return out

    def describe(self, name):
        rows = [row for row in super().describe(name) if "head_dim`, `qk_head_dim" not in row[0]]
        return rows + [("`qk_head_dim`", "ignored", "–", "recomputed by BailingHybridConfig")]


def _list(r: HFConfig, key: str, n: int, allowed: tuple[str, str], cls: str) -> list[str] | None:
    """A per-layer list of ``allowed`` values, or ``None`` when absent; an error names the key otherwise."""
    types = r.get(key)
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != n or any(t not in allowed for t in types):
        r.error(
            key, f"must give each of the {n} layers {allowed[0]!r} or {allowed[1]!r} ({cls}), got {json_value(types)}"
        )
        return [allowed[0]] * n
    return types


def _layer_types(r: HFConfig, n: int) -> list[str]:
    """``layer_types``, else attention on every ``layer_group_size``-th layer (the last of each group)."""
    size = r.number("layer_group_size", 6, integer=True)
    types = _list(r, "layer_types", n, (LINEAR, FULL), "BailingHybridDecoderLayer builds no other mixer")
    return types if types is not None else [FULL if (i + 1) % size == 0 else LINEAR for i in range(n)]


def _mixture_flags(r: HFConfig, n: int) -> list[bool]:
    """Per layer, whether it holds the mixture (``mlp_layer_types``, else after ``first_k_dense_replace``)."""
    k = r.number("first_k_dense_replace", 2, integer=True, positive=False, minimum=0)
    types = _list(r, "mlp_layer_types", n, ("dense", "sparse"), "BailingHybridDecoderLayer builds no other MLP")
    return [i >= k for i in range(n)] if types is None else [t == "sparse" for t in types]


def _no_limits(r: HFConfig) -> None:
    """The SwiGLU clipping limits: absent, null or all zero (no clipping), else refused by key."""
    for key, alias in LIMITS.items():
        name = key if key in r.cfg else alias
        limits = r.get(name)
        if limits is not None and (not isinstance(limits, list) or any(x != 0 for x in limits)):
            r.error(
                name,
                f"= {json_value(limits)} clips the SwiGLU (Step3p7's clamp after the activation), which modkit's "
                "FFNs do not compute; only zero limits (no clipping, the default) convert",
            )


def _mixer(r: HFConfig, f: dict) -> dict:
    """The ``kimi_delta`` of the linear layers."""
    size = {key: r.number(key, r.get(src, default), integer=True) for key, (src, default) in LINEAR_FROM.items()}
    r.number("short_conv_kernel_size", 4, integer=True)
    r.ignore("head_dim")  # read above as the linear head width; the config class recomputes it
    mixer = {
        "type": "kimi_delta",
        "n_heads": size["linear_num_heads"],
        "head_dim": size["linear_head_dim"],
        "d_conv": size["linear_conv_kernel_dim"],
        "norm_eps": f["eps"],
        "full_rank_gates": True,
    }
    if r.flag("kda_safe_gate", True):
        bound = r.number("kda_lower_bound", LOWER_BOUND, positive=False)
        if isinstance(bound, (int, float)) and not BOUND_RANGE[0] <= bound <= BOUND_RANGE[1]:
            r.error(
                "kda_lower_bound",
                f"= {bound} must lie in [{BOUND_RANGE[0]:g}, {BOUND_RANGE[1]:g}]: it is the bounded forget gate's "
                "lowest log decay per token (a weaker bound decays nothing in float32, a stronger one forgets all)",
            )
        mixer.update(forget_gate="bounded", gate_lower_bound=float(bound))
    else:
        r.ignore("kda_lower_bound")
    return mixer


def read_layers(r: HFConfig, f: dict) -> None:
    """Per layer the mixer (``mixers``: ``kimi_delta`` on linear layers) and the FFN (``moe_layers``)."""
    mixer = _mixer(r, f)
    types = _layer_types(r, f["n_layers"])
    f["mixers"] = [dict(mixer) if t == LINEAR else None for t in types]
    flags = _mixture_flags(r, f["n_layers"])
    f["moe"], f["moe_layers"] = any(flags), flags
    _no_limits(r)
    if LINEAR in types and f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the delta attention's convolution, which modkit's kimi_delta computes with "
            f"silu only; got {json_value(r.get('hidden_act'))}",
        )


def _check_mixer(m: Any) -> None:
    """A linear layer's mixer must be ``kimi_delta`` with full-rank gates (what the checkpoint holds)."""
    if getattr(m, "type", None) != "kimi_delta" or not m.full_rank_gates:
        raise CheckpointError(
            f"a {MODEL_TYPE} checkpoint's linear layers hold Kimi Delta Attention with full-rank forget and output "
            f"gates (f_proj, g_proj); the spec's mixer is {getattr(m, 'type', None)!r}"
            f"{'' if getattr(m, 'type', None) != 'kimi_delta' else ' with low-rank gates'}: use kimi_delta with "
            "full_rank_gates true"
        )


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types``, ``mlp_layer_types``, the delta attention's keys (the source config's, else the defaults, when
    no layer is linear) and the (zero) clipping limits."""
    n = f["n_layers"]
    cfg["layer_types"] = [LINEAR if m is not None else FULL for m in f["mixers"]]
    flags = f["moe_layers"] if f["moe"] else [False] * n
    cfg["mlp_layer_types"] = ["sparse" if x else "dense" for x in flags]
    cfg.update({key: [0] * n for key in LIMITS})
    m = f["mixer"]
    if m is None:
        cfg.update({k: base.get(k, default) for k, (_, default) in LINEAR_FROM.items()})
        return
    for each in f["mixers"]:
        if each is not None:
            _check_mixer(each)
    bounded = m.forget_gate == "bounded"
    cfg.update(linear_num_heads=m.n_heads, linear_head_dim=m.head_dim, linear_conv_kernel_dim=m.d_conv)
    cfg.update(head_dim=m.head_dim, short_conv_kernel_size=m.d_conv, kda_safe_gate=bounded)
    cfg["kda_lower_bound"] = m.lower_bound if bounded else base.get("kda_lower_bound", LOWER_BOUND)


L, A, F = "model.layers.{i}.", "layers.{i}.attention.", "layers.{i}.ffn."
S = L + "attention."

BAILING_HYBRID = HFType(
    model_type=MODEL_TYPE,
    architecture="BailingHybridForCausalLM",
    notes=__doc__,
    # transformers BailingHybridConfig, key by key
    keys={
        **sizes(
            vocab_size=157184,
            hidden_size=2560,
            num_hidden_layers=42,
            num_attention_heads=32,
            max_position_embeddings=262144,
        ),
        "max_position_embeddings": Key("max_seq_len", 262144, aliases=("model_max_length",)),
        "intermediate_size": Key("d_ff", 6144, note="the dense layers"),
        "hidden_act": Key("act", "silu", kind="act"),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "rope_theta": Rope(6_000_000.0, layout="interleaved"),
        "q_lora_rank": GatedLatent(),
        # Kimi Linear's mixture keys, the same names and meanings, with BailingHybridConfig's defaults
        **{
            k: replace(KIMI_LINEAR.keys[k], default=v)
            for k, v in {
                "num_experts": 512,
                "num_experts_per_token": 8,
                "moe_intermediate_size": 768,
                "num_shared_experts": 1,
                "routed_scaling_factor": 2.5,
                "num_expert_group": 8,
                "topk_group": 4,
                "moe_renormalize": True,
            }.items()
        },
        "layer_types": Own(
            (*LAYER_KEYS, *GATE_KEYS, *LIMITS, *LIMITS.values()),
            "per layer: kimi_delta (full-rank gates; the bounded forget gate with kda_safe_gate) on linear_attention "
            "layers, gated latent attention on full_attention layers; a dense SwiGLU or the mixture by "
            "mlp_layer_types; zero SwiGLU limits only (see the notes)",
            fields=("mixers", "moe", "moe_layers"),
        ),
        "pretraining_tp": Ignore("Meta's tensor-parallel matmul slicing emulation: numerically the same model"),
        "num_nextn_predict_layers": Ignore("the multi-token-prediction layers are not part of the causal LM"),
        "num_mtp_layers": Ignore("the multi-token-prediction layers (the other name of num_nextn_predict_layers)"),
        "mtp_loss_scaling_factor": Ignore("weight of the multi-token-prediction loss (training only)"),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={
        "norm": "rmsnorm",
        "placement": {"type": "pre"},
        "ffn": "gated",
        "router": "sigmoid_topk",
        "correction_bias": True,
    },
    tensors=(
        W("embed.weight", "model.word_embeddings.weight"),
        W("final_norm.weight", "model.norm.weight"),
        W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.weight"),
        # the delta attention's q_proj, k_proj, v_proj, g_proj, and both mixers' o_proj (Ling's dense)
        *(W(A + f"{x}.{{p}}", S + f"{x}.{{p}}") for x in ("q_proj", "k_proj", "v_proj", "g_proj")),
        W(A + "o_proj.{p}", S + "dense.{p}"),
        *(W(A + f"{x}.{{p}}", S + f"{x}.{{p}}") for x in ("q_a_proj", "kv_a_proj_with_mqa")),
        *(
            W(A + f"{x}.weight", S + f"{x}.weight")
            for x in ("q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj")
        ),
        W(A + "conv1d.weight", tuple(S + f"{x}_conv1d.weight" for x in "qkv"), SplitConv()),
        *(W(A + x, S + x) for x in ("A_log", "dt_bias", "o_norm.weight", "f_proj.weight", "b_proj.weight")),
        *(W(F + f"{x}.weight", L + f"mlp.{x}_proj.weight") for x in ("gate", "up", "down")),
        W(F + "router.proj.weight", L + "mlp.gate.weight"),
        W(F + "router.correction_bias", L + "mlp.gate.expert_bias"),
        *(
            W(F + f"experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
        *(W(F + f"shared.{x}.weight", L + f"mlp.shared_experts.{x}_proj.weight") for x in ("gate", "up", "down")),
        Head(),
    ),  # fmt: skip
    checkpoint_layout="interleaved",
    read_own=read_layers,
    write_own=write_layers,
)

TYPE = BAILING_HYBRID
