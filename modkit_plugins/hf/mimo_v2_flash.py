"""Hugging Face ``mimo_v2_flash`` (Xiaomi MiMo-V2-Flash) → modkit: full and sliding-window layers with their own
RoPE and key/value heads, sinks on the sliding layers, value heads narrower than the query/key heads, and
DeepSeek-V3-style mixtures without shared experts.

Semantics: ``transformers/models/mimo_v2_flash/{configuration,modular}_mimo_v2_flash.py``:

* ``layer_types``: by default layer ``i`` is ``full_attention`` iff ``i == 0`` or ``(i + 1) % 6 == 0``, else
  ``sliding_attention`` with ``sliding_window`` (129; a config's ``sliding_window_size`` means that plus one);
* ``MiMoV2FlashAttention``: q and k heads of ``head_dim`` (192), value heads of ``v_head_dim`` (128: the
  attention's ``v_head_dim``), values times ``attention_value_scale`` (0.707; null: 1; ``value_scale``);
  ``num_key_value_heads`` (4) on the full layers and twice as many on the sliding ones, which also hold a learned
  sink logit per query head (``self_attn.sinks``, saved as ``attention_sink_bias``): per-layer overrides of
  ``n_kv_heads`` and ``sinks``. ``attention_bias`` on q/k/v, never on ``o_proj``;
* RoPE per layer type (``rope_parameters`` nested: full layers base 5,000,000, sliding 10,000, each rotating
  ``int(head_dim · partial_rotary_factor)`` features, factor 0.334 when a dict leaves it out);
* ``mlp_layer_types`` (``dense`` / ``sparse``; default the first layer dense): dense layers a SwiGLU of
  ``intermediate_size``, sparse ones ``MiMoV2FlashMoE``: DeepSeek-V3's router (sigmoid scores, selection-only
  correction bias ``e_score_correction_bias``, ``n_group`` / ``topk_group``, ``norm_topk_prob``,
  ``routed_scaling_factor``; null reads as 1) over ``n_routed_experts`` SwiGLU experts of
  ``moe_intermediate_size``, no shared expert;
* pre-norm RMSNorm blocks, untied head. The checkpoint's multi-token-prediction layers (``model.mtp.*``), which
  transformers does not load, are carried through.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, HeadDim, Ignore, Key, KVHeads, _read, _types, rope_parameters, sizes
from ._rope import rope
from ._weights import StackExperts, W
from .deepseek_v3 import _groups
from .llama import LLAMA, L

MODEL_TYPE = "mimo_v2_flash"

#: ``MiMoV2FlashConfig.__post_init__``'s RoPE when a config gives none
ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334},
}


@dataclass(frozen=True)
class RopePerType(Entry):
    """``rope_parameters`` nested per layer type (absent: :data:`ROPE`), each rotating ``partial_rotary_factor``
    (default 0.334) of the head; written back nested, the factor always given."""

    SETS = ("position", "position_by_type")

    def config_keys(self, name):
        return ("rope_parameters",)

    def read(self, r, f, name):
        by_type = {}
        for t in ("full_attention", "sliding_attention"):
            theta = ROPE[t]["rope_theta"]
            kw = dict(default_theta=theta, layer_type=t, scaling_key=None, max_seq_len=f["max_seq_len"])
            by_type[t] = rope(r, default_partial=0.334, default_parameters=ROPE, **kw)
        f["position"], f["position_by_type"] = by_type["full_attention"], by_type

    def write(self, f, base, name):
        by_type = f["position_by_type"]
        out = {}
        for t in ("full_attention", "sliding_attention"):
            p = by_type.get(t) or next(iter(by_type.values()))
            out[t] = {**rope_parameters(p), "partial_rotary_factor": p.partial_rotary}
        return {"rope_parameters": out}

    def describe(self, name):
        return [
            (
                "`rope_parameters`",
                "mapped",
                "full: theta 5e6, sliding: 1e4, partial 0.334",
                "`position` per layer type (overrides)",
            )
        ]


@dataclass(frozen=True)
class Layers(Entry):
    """``layer_types``, ``sliding_window`` (or ``sliding_window_size`` + 1), ``v_head_dim``, ``attention_value_scale``:
    the kind of every layer and the attention fields that differ between kinds (``attention_by_layer``)."""

    SETS = ("layer_types", "sliding_window", "sinks", "attention_by_layer")

    def config_keys(self, name):
        return (name, "sliding_window", "sliding_window_size", "v_head_dim", "attention_value_scale")

    def read(self, r, f, name):
        n, kv, heads = f["n_layers"], f["n_kv_heads"] or f["n_heads"], f["n_heads"]
        window = _read(r, "sliding_window", "window", 129, ())
        size = r.number("sliding_window_size", None, integer=True)
        window = size + 1 if size is not None else window
        types = r.get(name)
        if types is None:
            types = ["full_attention" if i == 0 or not (i + 1) % 6 else "sliding_attention" for i in range(n)]
        types = _types(r, types, n, ("full_attention", "sliding_attention")) or ["full_attention"] * n
        if window is None and "sliding_attention" in types:
            r.error("sliding_window", f"is null, but {name} has sliding_attention layers; give the window")
        if "sliding_attention" in types and (heads % (2 * kv) or 2 * kv > heads):
            r.error(
                "num_key_value_heads",
                f"= {kv}: the sliding layers hold twice as many key/value heads, {2 * kv}, which must divide "
                f"num_attention_heads = {heads}",
            )
        if r.cfg.get("attention_value_scale", 0) is None:  # null: no scaling (MiMoV2FlashAttention.v_scale)
            r.get("attention_value_scale")
            scale = 1.0
        else:
            scale = r.number("attention_value_scale", 0.707)
        common = {"v_head_dim": r.number("v_head_dim", 128, integer=True), "value_scale": float(scale)}
        sliding = {**common, "type": "gqa", "n_kv_heads": 2 * kv, "sinks": True}
        f["layer_types"], f["sliding_window"] = types, window
        f["attention_by_layer"] = [sliding if t == "sliding_attention" else common for t in types]

    def write(self, f, base, name):
        atts, windows = f["attentions"], f["windows"]
        full = next((a for a, w in zip(atts, windows) if w is None), None)
        kv = full.kv_heads if full is not None else next(a.kv_heads for a in atts) // 2
        return {
            name: ["sliding_attention" if w is not None else "full_attention" for w in windows],
            "sliding_window": next((w for w in windows if w is not None), base.get("sliding_window") or 129),
            "v_head_dim": atts[0].v_head_dim,
            "attention_value_scale": atts[0].value_scale,
            "num_key_value_heads": kv,
        }

    def describe(self, name):
        return [
            (
                "`layer_types`, `sliding_window` / `sliding_window_size`",
                "mapped",
                "full on layer 0 and every 6th, window 129",
                "`sliding_window`, twice the key/value heads and sinks on the sliding layers (overrides)",
            ),
            ("`v_head_dim`, `attention_value_scale`", "mapped", "`128`, `0.707`", "`v_head_dim`, `value_scale`"),
        ]


@dataclass(frozen=True)
class MlpLayerTypes(Entry):
    """``mlp_layer_types``: ``dense`` (a SwiGLU of ``intermediate_size``) or ``sparse`` (a mixture) per layer; default
    the first layer dense."""

    SETS = ("moe", "moe_layers")

    def read(self, r, f, name):
        n = f["n_layers"]
        kinds = r.get(name)
        if kinds is None:
            kinds = ["dense"] + ["sparse"] * (n - 1)
        if not (isinstance(kinds, list) and len(kinds) == n and set(kinds) <= {"dense", "sparse"}):
            r.error(name, f"must list 'dense' or 'sparse' for each of the {n} layers, got {kinds!r}")
            kinds = ["sparse"] * n
        f["moe_layers"] = [k == "sparse" for k in kinds]
        f["moe"] = any(f["moe_layers"])

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        return {name: ["sparse" if m else "dense" for m in flags]}

    def describe(self, name):
        return [(f"`{name}`", "mapped", "first dense, then sparse", "`moe_layers`")]


F = "layers.{i}.ffn."

MIMO_V2_FLASH = LLAMA.derive(
    MODEL_TYPE,
    architecture="MiMoV2FlashForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "rope_theta"),
    keys={
        **sizes(
            vocab_size=152576,
            hidden_size=4096,
            num_hidden_layers=48,
            num_attention_heads=64,
            max_position_embeddings=131072,
        ),
        "num_key_value_heads": KVHeads(4),
        "head_dim": HeadDim(192),
        "intermediate_size": Key("d_ff", 16384, note="the dense layers"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "attention_bias": Key("qkv_bias", False, kind="flag", note="q, k and v (never o_proj)"),
        "rope_parameters": RopePerType(),
        "layer_types": Layers(),
        "n_routed_experts": Key("n_experts", 256, aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 8),
        "moe_intermediate_size": Key("expert_d_ff", 2048),
        "routed_scaling_factor": Key(
            "routed_scaling_factor", 1.0, kind="number", read_as=lambda v, f: 1.0 if v is None else v
        ),
        "n_group": Key("n_group", 1, read_as=_groups, write_as=lambda v, f: v or 1, note="1: no limit"),
        "topk_group": Key(
            "topk_group", 1, read_as=lambda v, f: None if f["n_group"] is None else v, write_as=lambda v, f: v or 1
        ),
        "norm_topk_prob": Key("renormalize", True, kind="flag"),
        "mlp_layer_types": MlpLayerTypes(),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={"router": "sigmoid_topk", "correction_bias": True},
    tensors=(
        W("layers.{i}.attention.sinks", L + "self_attn.attention_sink_bias"),
        W(F + "router.proj.weight", L + "mlp.gate.weight"),
        W(F + "router.correction_bias", L + "mlp.gate.e_score_correction_bias"),
        *(
            W(F + f"experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
    ),
    keep=((r"model\.mtp\..*", "the multi-token-prediction layers (not computed by the causal LM)"),),
)

TYPE = MIMO_V2_FLASH
