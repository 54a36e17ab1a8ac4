"""Hugging Face ``minimax`` (MiniMax-Text-01) → modkit: lightning attention and softmax attention layers in DeepNorm-style
blocks whose residual is the normalised stream, a Mixtral mixture in every layer.

Semantics: ``transformers/models/minimax/{configuration,modeling}_minimax.py``:

* layer ``i`` is ``layer_types[i]``: ``linear_attention`` (``MiniMaxLightningAttention``, modkit's
  ``lightning_attention``: ``num_attention_heads`` heads of ``head_dim``, ``hidden_act`` on q, k, v (silu only in
  modkit), the per-layer ALiBi decays, an RMSNorm of eps 1e-6 over the read-out, the sigmoid output gate; its block
  form over ``block_size`` tokens gives the numbers of the recurrence) or ``full_attention`` (Mixtral's: GQA with
  RoPE, ``sliding_window`` when set); without ``layer_types`` even layers are ``full_attention``, odd ones linear
  (``MiniMaxConfig.__post_init__``);
* each block (``MiniMaxDecoderLayer``) normalises first and keeps the normalised stream as its residual: ``h =
  input_layernorm(x); x = α_a h + β_a attn(h); h = post_attention_layernorm(x); y = α_m h + β_m moe(h)`` with
  ``α_a, β_a`` = ``full_attn_alpha_factor``, ``full_attn_beta_factor`` on attention layers and
  ``linear_attn_alpha_factor``, ``linear_attn_beta_factor`` on linear ones, ``α_m, β_m`` = ``mlp_alpha_factor``,
  ``mlp_beta_factor``: modkit's ``deepnorm`` placement, per layer (``placements``); ``model.norm`` after the last;
* the FFN is Mixtral's mixture (:mod:`.mixtral`).

The lightning layers' decay tables (``slope_rate``, ``query_decay``, ``key_decay``, ``diagonal_decay``) are saved
buffers that transformers computes from the config; modkit computes the same rates, and carries the tables along.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import Own, SlidingWindow
from ._reader import HFConfig
from ._weights import W
from .llama import L
from .mixtral import MIXTRAL

MODEL_TYPE = "minimax"

LINEAR, FULL = "linear_attention", "full_attention"
#: the multipliers of the blocks: (config key, placement field, layer type or None for both)
FACTORS = (
    ("full_attn_alpha_factor", "attn_alpha", FULL),
    ("full_attn_beta_factor", "attn_beta", FULL),
    ("linear_attn_alpha_factor", "attn_alpha", LINEAR),
    ("linear_attn_beta_factor", "attn_beta", LINEAR),
    ("mlp_alpha_factor", "ffn_alpha", None),
    ("mlp_beta_factor", "ffn_beta", None),
)
LAYER_KEYS = ("layer_types", "block_size", *(k for k, _, _ in FACTORS))


def _types(r: HFConfig, n: int) -> list[str]:
    types = r.get("layer_types")
    if types is None:
        return [FULL if (i + 1) % 2 else LINEAR for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in (LINEAR, FULL) for t in types):
        r.error(
            "layer_types",
            f"must give each of the {n} layers {LINEAR!r} or {FULL!r} (MiniMaxDecoderLayer builds no other), got "
            f"{json_value(types)}",
        )
        return [FULL] * n
    return types


def read_layers(r: HFConfig, f: dict) -> None:
    """Per layer the mixer (``mixers``: ``lightning_attention`` on linear layers) and the ``deepnorm`` placement of
    its type (``placements``)."""
    types = _types(r, f["n_layers"])
    factors = {k: float(r.number(k, 1.0)) for k, _, _ in FACTORS}
    placements = []
    for t in types:
        p: dict[str, Any] = {"type": "deepnorm"}
        for key, fld, kind in FACTORS:
            if kind in (None, t) and factors[key] != 1:
                p[fld] = factors[key]
        placements.append(p)
    mixer: dict[str, Any] = {
        "type": "lightning_attention",
        "n_heads": f["n_heads"],
        "chunk_size": r.number("block_size", 256, integer=True),
    }
    if f["head_dim"] * f["n_heads"] != f["d_model"]:
        mixer["head_dim"] = f["head_dim"]
    f["mixers"] = [mixer if t == LINEAR else None for t in types]
    f["placements"], f["placement"] = placements, placements[0]
    if LINEAR in types and f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the lightning attention's q, k and v, which modkit's lightning_attention "
            f"computes with silu only; got {json_value(r.get('hidden_act'))}",
        )


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types``, ``block_size`` and the six factors, from the first layer of each type (the check of the export
    names a spec whose layers of one type differ)."""
    types = [LINEAR if m is not None else FULL for m in f["mixers"]]
    cfg["layer_types"] = types
    m = f["mixer"]
    cfg["block_size"] = (
        m.chunk_size if getattr(m, "type", None) == "lightning_attention" else base.get("block_size", 256)
    )
    for key, fld, kind in FACTORS:
        value = None
        for t, p in zip(types, f["placements"]):
            if kind in (None, t):
                value = getattr(p, fld, 1.0)
                break
        cfg[key] = base.get(key, 1) if value is None else value


@dataclass(frozen=True)
class AttentionWindow(SlidingWindow):
    """``sliding_window`` of the full-attention layers (the lightning layers have none)."""

    def write(self, f, base, name):
        return {name: next((w for w in f["windows"] if w is not None), None)}


A = "layers.{i}.attention."

MINIMAX = MIXTRAL.derive(
    MODEL_TYPE,
    architecture="MiniMaxForCausalLM",
    notes=__doc__,
    # transformers MiniMaxConfig defaults
    defaults={"max_position_embeddings": 4096 * 32},
    keys={
        "sliding_window": AttentionWindow(None),
        "layer_types": Own(
            LAYER_KEYS,
            "per layer: lightning_attention (chunk_size block_size) on linear_attention layers, GQA on "
            "full_attention layers, and the deepnorm placement with that type's factors (see the notes)",
            fields=("mixers", "placements"),
        ),
    },
    tensors=tuple(W(A + x, L + f"self_attn.{x}") for x in ("qkv_proj.weight", "output_gate.weight", "norm.weight", "out_proj.weight")),
    keep=(
        (
            r"model\.layers\.\d+\.self_attn\.(slope_rate|query_decay|key_decay|diagonal_decay)",
            "the lightning attention's decay tables, computed from the config (modkit computes the same rates)",
        ),
    ),
    read_own=read_layers,
    write_own=write_layers,
)  # fmt: skip

TYPE = MINIMAX
