"""Hugging Face ``lfm3`` (Liquid AI LFM3) → modkit: LFM2's gated short convolutions beside full and sliding-window
attention layers, each attention kind with its own RoPE, a sigmoid gate per attention head, and sandwich norms.

Semantics: ``transformers/models/lfm3/{configuration,modular}_lfm3.py`` (``Lfm3Config``, ``Lfm3ForCausalLM``), which
derives from LFM2 (``modkit_plugins/hf/lfm2.py``); what differs:

* ``layer_types``: ``conv``, ``full_attention`` or ``sliding_attention`` (window ``sliding_window``, 256); by default
  layer ``i`` is ``full_attention`` when ``i % 4 == 2``, ``sliding_attention`` when ``i % 4 == 0`` and ``i > 0``, else
  ``conv`` (``Lfm3Config.__post_init__``). Convolutions: ``Lfm3ShortConv`` = LFM2's, modkit's ``short_conv`` of kernel
  ``conv_L_cache`` (7), biases with ``conv_bias``;
* attention (``Lfm3Attention``, Qwen3's): ``head_dim`` (128) independent of the width, an RMSNorm per head on queries
  and keys before RoPE (``q_norm``, ``k_norm``), q/k/v/o biases with ``attention_bias``, and with
  ``use_attention_gate`` (default) ``g_proj`` ``[num_attention_heads, hidden_size]``: each head's output times
  ``sigmoid(g_proj(x))`` of that head before ``o_proj`` (``output_gate`` with ``output_gate_scope: head``, never a bias: ``gate_bias: false``);
* RoPE per layer type (``rope_parameters`` nested; ``Lfm3RotaryEmbedding``): sliding layers ``default`` (base 1e4,
  the whole head: this class's default RoPE ignores ``partial_rotary_factor``), full layers ``proportional`` (base
  1e6, ``partial_rotary_factor`` 0.5: the first ``int(head_dim · 0.5) / 2`` pairs turn at ``base^(-2i/head_dim)``,
  the rest pass through; ``partial_mode: proportional``); other rope types as transformers reads them;
* ``use_sandwich_norm`` (default): RMSNorms on the operator's and the FFN's outputs before the residual sums
  (``post_operator_norm``, ``post_ffn_norm``; ``sandwich`` placement), else pre-norm; the FFN is a SwiGLU of
  ``intermediate_size`` (7680) with no LFM2 width adjustment; RMSNorms of ``norm_eps``, the last named
  ``embedding_norm``; tied embeddings. The convolution layers carry the full layers' RoPE, which acts on nothing.

The issue text lists "KV heads per layer type, sinks and a narrower value head" beside LFM3: ``Lfm3Attention`` has
none of them (one ``num_key_value_heads``, no sink logits, values of ``head_dim``), so neither does this converter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ._keys import Entry, HeadDim, Key, KVHeads, _read, _types, rope_parameters, sizes
from ._rope import rope
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "lfm3"

CONV, FULL, SLIDING = "conv", "full_attention", "sliding_attention"
#: ``Lfm3Config.__post_init__``'s RoPE when a config gives none
ROPE = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5},
}


def default_types(n: int) -> list[str]:
    """``Lfm3Config.__post_init__``'s ``layer_types`` for ``n`` layers."""
    return [FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(n)]


@dataclass(frozen=True)
class RopePerType(Entry):
    """``rope_parameters`` nested per attention layer type (absent: :data:`ROPE`); written back nested."""

    SETS = ("position", "position_by_type")

    def read(self, r, f, name):
        by_type = {}
        for t in (FULL, SLIDING):
            kw = dict(layer_type=t, scaling_key=None, max_seq_len=f["max_seq_len"], default_parameters=ROPE)
            p = rope(r, default_theta=ROPE[t]["rope_theta"], **kw)
            if "partial_mode" not in p and "scaling" not in p:  # Lfm3RotaryEmbedding's default rotates the whole head
                p.pop("partial_rotary", None)
            by_type[t] = p
        f["position"], f["position_by_type"] = by_type[FULL], by_type

    def write(self, f, base, name):
        kinds = _kinds(f)
        out = {}
        for t in (FULL, SLIDING):
            p = next((p for p, k in zip(f["positions"], kinds) if k == t and p.type == "rope"), None)
            out[t] = dict(ROPE[t]) if p is None else rope_parameters(p)
        return {name: out}

    def describe(self, name):
        how = "`position` per layer type (overrides)"
        return [(f"`{name}`", "mapped", "full: proportional, theta 1e6, partial 0.5; sliding: theta 1e4", how)]


def _kinds(f: Mapping[str, Any]) -> list[str]:
    """Every layer's ``layer_types`` entry from the spec's fields: a convolution, else by the attention's window."""
    return [CONV if m is not None else SLIDING if w is not None else FULL for m, w in zip(f["mixers"], f["windows"])]


@dataclass(frozen=True)
class Layers(Entry):
    """``layer_types`` with ``sliding_window``, ``conv_L_cache``, ``conv_bias`` and ``use_attention_gate``: every
    layer's mixer (``mixers``), its window, and the per-head gate of the attention layers (``attention_by_layer``)."""

    # it sets attention_by_layer too (the gate's scope), left out here: the reference page would read it as the
    # QK-norm or temperature tuning it means in other types
    SETS = ("mixers", "layer_types", "sliding_window", "attn_output_gate")
    KEYS = ("sliding_window", "conv_L_cache", "conv_bias", "use_attention_gate")

    def config_keys(self, name):
        return (name, *self.KEYS)

    def read(self, r, f, name):
        n = f["n_layers"]
        conv = {"type": "short_conv", "d_conv": r.number("conv_L_cache", 7, integer=True)}
        if conv["d_conv"] < 2:
            r.error("conv_L_cache", f"conv_L_cache = {conv['d_conv']}: the convolution needs a kernel of at least 2")
            conv["d_conv"] = 7
        if r.flag("conv_bias", False):
            conv["bias"] = True
        types = r.get(name)
        types = default_types(n) if types is None else _types(r, types, n, (CONV, FULL, SLIDING)) or [FULL] * n
        window = _read(r, "sliding_window", "window", 256, ())  # a present null: no window
        if window is None and SLIDING in types:
            r.error("sliding_window", f"is null, but {name} has sliding_attention layers; give the window")
        gate = r.flag("use_attention_gate", True)
        f["mixers"] = [conv if t == CONV else None for t in types]
        f["layer_types"], f["sliding_window"], f["attn_output_gate"] = types, window, gate
        f["attention_by_layer"] = [
            {"output_gate_scope": "head", "gate_bias": False} if gate and t != CONV else None for t in types
        ]

    def write(self, f, base, name):
        m = f["mixer"]
        conv = getattr(m, "type", None) == "short_conv"
        return {
            name: _kinds(f),
            "sliding_window": next((w for w in f["windows"] if w is not None), base.get("sliding_window") or 256),
            "conv_L_cache": m.d_conv if conv else base.get("conv_L_cache", 7),
            "conv_bias": m.bias if conv else base.get("conv_bias", False),
            "use_attention_gate": bool(f["attn_output_gate"]),
        }

    def describe(self, name):
        return [
            (
                f"`{name}`, `sliding_window`, `conv_L_cache`, `conv_bias`",
                "mapped",
                "conv, full on i % 4 == 2, sliding on i % 4 == 0 (i > 0); window 256, kernel 7",
                "`short_conv` mixers and attention layers with their `sliding_window` (overrides)",
            ),
            ("`use_attention_gate`", "mapped", "`true`", "`output_gate` with `output_gate_scope: head`"),
        ]


@dataclass(frozen=True)
class SandwichNorm(Key):
    """``use_sandwich_norm`` → the block placement (``sandwich``, else ``pre``) and back. It lists no field it sets,
    so that the reference page names the fixed ``sandwich`` placement, not "parallel or sequential blocks"."""

    def sets(self):
        return ()


def sandwich(value: Any, f: Mapping[str, Any]) -> dict:
    """``use_sandwich_norm`` → the block placement (``sandwich``, else ``pre``)."""
    return {"type": "sandwich" if value else "pre"}


def is_sandwich(placement: Any, f: Mapping[str, Any]) -> Optional[bool]:
    """The block placement → ``use_sandwich_norm``."""
    return getattr(placement, "type", None) == "sandwich"


L = "model.layers.{i}."
A = "layers.{i}.attention."

LFM3 = HFType(
    model_type=MODEL_TYPE,
    architecture="Lfm3ForCausalLM",
    notes=__doc__,
    # transformers Lfm3Config, key by key
    keys={
        **sizes(
            vocab_size=128_000,
            hidden_size=2048,
            num_hidden_layers=24,
            num_attention_heads=16,
            max_position_embeddings=128_000,
        ),
        "num_key_value_heads": KVHeads(4),
        "head_dim": HeadDim(128),
        "intermediate_size": Key("d_ff", 7680),
        "norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag", note="q, k, v and o"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "use_sandwich_norm": SandwichNorm("placement", True, kind="flag", read_as=sandwich, write_as=is_sandwich),
        "layer_types": Layers(),
        "rope_parameters": RopePerType(),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "sandwich"}, "ffn": "gated", "act": "silu", "qk_norm": "head"},
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.weight", "model.embedding_norm.weight"),
        W("layers.{i}.attn_norm.weight", L + "operator_norm.weight"),
        W("layers.{i}.attn_post_norm.weight", L + "post_operator_norm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "ffn_norm.weight"),
        W("layers.{i}.ffn_post_norm.weight", L + "post_ffn_norm.weight"),
        *(W(A + f"{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkvo"),
        # g_proj in Lfm3Attention; checkpoints hold gate_proj (transformers' conversion_mapping renames it both ways)
        W(A + "gate_proj.weight", L + "self_attn.gate_proj.weight"),
        *(W(A + f"{x}_norm.weight", L + f"self_attn.{x}_norm.weight") for x in "qk"),
        *(W(A + f"{x}.{{p}}", L + f"conv.{x}.{{p}}") for x in ("in_proj", "conv", "out_proj")),
        *(
            W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"feed_forward.{w}.{{p}}")
            for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ),
        Head(),
    ),
)

TYPE = LFM3
