"""Hugging Face ``lfm2`` (Liquid AI LFM2) → modkit: gated short convolutions on most layers, GQA with per-head
QK-norm and RoPE on the others; SwiGLU, RMSNorm pre-norm blocks, tied embeddings.

Semantics: ``transformers/models/lfm2/{configuration,modeling}_lfm2.py``:

* layer ``i`` is ``layer_types[i]``: ``conv`` (``Lfm2ShortConv``, modkit's ``short_conv`` of kernel
  ``conv_L_cache``, biases on its three parts with ``conv_bias``) or ``full_attention``; without ``layer_types``,
  the layers in ``full_attn_idxs`` are attention layers, the others convolutions, and without either every layer is
  attention (``Lfm2Config.__post_init__``);
* attention (``Lfm2Attention``): GQA without biases, an RMSNorm per head on queries and keys (``q_layernorm``,
  ``k_layernorm``) before RoPE (``rope_parameters``, base 1e6); the output projection is named ``out_proj``;
* the FFN (``Lfm2MLP``) is a SwiGLU (``w1`` gate, ``w3`` up, ``w2`` down) whose width is ``intermediate_size``,
  or with ``block_auto_adjust_ff_dim`` ``int(2 · intermediate_size / 3)``, then (``block_ffn_dim_multiplier`` not
  null) ``int(multiplier · that)`` rounded up to a multiple of ``block_multiple_of``;
* every norm is an RMSNorm of ``norm_eps``; the last one is named ``embedding_norm`` though it follows the last
  block. The convolution and the attention ignore no position: RoPE is the spec's position scheme on every layer and
  a ``short_conv`` layer has no queries or keys for it.

Export writes ``intermediate_size`` and the three sizing keys of the source config when they give the spec's FFN
width again, else the width itself with ``block_auto_adjust_ff_dim`` false. The legacy keyword arguments
``tie_embedding`` and ``block_ff_dim`` are read as ``tie_word_embeddings`` and ``intermediate_size``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from modkit.plugin import json_value

from ._keys import HeadDim, Key, KVHeads, Own, Rope, sizes
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "lfm2"

#: the layer types of ``layer_types``
CONV, FULL = "conv", "full_attention"
#: the keys that size the FFN, with ``Lfm2Config``'s defaults
FFN_DEFAULTS = {
    "intermediate_size": 12288,
    "block_auto_adjust_ff_dim": True,
    "block_ffn_dim_multiplier": 1.0,
    "block_multiple_of": 256,
}
#: the keys of the layer pattern and of the convolution layers
LAYER_KEYS = ("layer_types", "full_attn_idxs", "conv_L_cache", "conv_bias")


def ffn_width(size: int, auto: bool, multiplier: Optional[float], multiple_of: int) -> int:
    """The SwiGLU width ``Lfm2MLP`` builds from ``intermediate_size`` and the three sizing keys."""
    if not auto:
        return size
    size = int(2 * size / 3)
    if multiplier is not None:
        size = int(multiplier * size)
        size = multiple_of * ((size + multiple_of - 1) // multiple_of)
    return size


def read_ffn(r: HFConfig, f: dict) -> None:
    """``d_ff`` from :data:`FFN_DEFAULTS` (``block_ff_dim`` is read as ``intermediate_size``)."""
    size = r.number("intermediate_size", FFN_DEFAULTS["intermediate_size"], integer=True, aliases=("block_ff_dim",))
    auto = r.flag("block_auto_adjust_ff_dim", True)
    multiple_of = r.number("block_multiple_of", 256, integer=True)
    multiplier = r.number("block_ffn_dim_multiplier", None) if "block_ffn_dim_multiplier" in r.cfg else 1.0
    f["d_ff"] = ffn_width(size, auto, multiplier, multiple_of)
    if f["d_ff"] < 1:
        r.error("intermediate_size", f"gives an FFN width of {f['d_ff']}; it must give at least 1")


def write_ffn(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """The sizing keys: the source config's when they give ``d_ff`` again, else ``d_ff`` without adjustment."""
    sizing = {k: base.get(k, v) for k, v in FFN_DEFAULTS.items()}
    try:
        same = ffn_width(*sizing.values()) == f["d_ff"]
    except (TypeError, ValueError):
        same = False
    if not same:
        sizing.update(intermediate_size=f["d_ff"], block_auto_adjust_ff_dim=False)
    cfg.update(sizing)


def read_layers(r: HFConfig, f: dict) -> None:
    """The mixer of every layer (``mixers``: ``short_conv`` on ``conv`` layers, attention on the others), with
    ``Lfm2Config`` defaults."""
    n = f["n_layers"]
    conv = {"type": "short_conv", "d_conv": r.number("conv_L_cache", 3, integer=True)}
    if r.flag("conv_bias", False):
        conv["bias"] = True
    if conv["d_conv"] < 2:
        r.error("conv_L_cache", f"conv_L_cache = {conv['d_conv']}: the convolution needs a kernel of at least 2")
        conv["d_conv"] = 3
    types, idxs = r.get("layer_types"), r.get("full_attn_idxs")
    if types is None:
        if idxs is not None and not (isinstance(idxs, list) and all(isinstance(i, int) for i in idxs)):
            r.error("full_attn_idxs", f"must list layer indices, got {json_value(idxs)}")
            idxs = None
        idxs = range(n) if idxs is None else idxs
        types = [FULL if i in idxs else CONV for i in range(n)]
    elif not isinstance(types, list) or len(types) != n:
        r.error("layer_types", f"must list one type per layer ({n}), got {json_value(types)}")
        types = [FULL] * n
    else:
        bad = sorted({str(t) for t in types if t not in (CONV, FULL)})
        if bad:
            r.error("layer_types", f"unsupported layer types {bad}: Lfm2DecoderLayer knows {CONV!r} and {FULL!r}")
    f["mixers"] = [conv if t == CONV else None for t in types]


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types`` and the convolution's keys (the source config's, else the defaults, when no layer is a
    convolution)."""
    types = [CONV if m is not None else FULL for m in f["mixers"]]
    cfg["layer_types"] = types
    m = f["mixer"]
    if getattr(m, "type", None) == "short_conv":
        cfg.update(conv_L_cache=m.d_conv, conv_bias=m.bias)
    else:
        cfg.update(conv_L_cache=base.get("conv_L_cache", 3), conv_bias=base.get("conv_bias", False))


def read_own(r: HFConfig, f: dict) -> None:
    """:func:`read_layers`, then the FFN width (:func:`read_ffn`)."""
    read_layers(r, f)
    read_ffn(r, f)


def write_own(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """:func:`write_layers` with ``full_attn_idxs`` (the same layers), then the FFN sizing keys."""
    write_layers(f, base, cfg)
    cfg["full_attn_idxs"] = [i for i, t in enumerate(cfg["layer_types"]) if t == FULL]
    write_ffn(f, base, cfg)


L = "model.layers.{i}."

#: the attention and FFN names of LFM2 (LFM2-MoE derives from them)
TENSORS = (
    W("embed.weight", "model.embed_tokens.weight"),
    W("final_norm.weight", "model.embedding_norm.weight"),
    W("layers.{i}.attn_norm.weight", L + "operator_norm.weight"),
    W("layers.{i}.ffn_norm.weight", L + "ffn_norm.weight"),
    *(W(f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkv"),
    W("layers.{i}.attention.o_proj.{p}", L + "self_attn.out_proj.{p}"),
    *(W(f"layers.{{i}}.attention.{x}_norm.weight", L + f"self_attn.{x}_layernorm.weight") for x in "qk"),
    *(W(f"layers.{{i}}.attention.{x}.{{p}}", L + f"conv.{x}.{{p}}") for x in ("in_proj", "conv", "out_proj")),
    *(
        W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"feed_forward.{w}.{{p}}")
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ),
    Head(),
)

LFM2 = HFType(
    model_type=MODEL_TYPE,
    architecture="Lfm2ForCausalLM",
    notes=__doc__,
    # transformers Lfm2Config, key by key
    keys={
        **sizes(
            vocab_size=65536,
            hidden_size=2560,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=128_000,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(),
        "norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag", aliases=("tie_embedding",)),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "rope_parameters": Rope(1_000_000.0),
        "intermediate_size": Own(
            tuple(FFN_DEFAULTS),
            "the SwiGLU width d_ff: intermediate_size, or with block_auto_adjust_ff_dim int(2/3 of it) times "
            "block_ffn_dim_multiplier rounded up to block_multiple_of (see the notes)",
            fields=("d_ff",),
        ),
        "layer_types": Own(
            LAYER_KEYS,
            "the token mixer of each layer: short_conv (kernel conv_L_cache, biases conv_bias) on conv layers, "
            "the attention on full_attention layers (see the notes)",
            fields=("mixers",),
        ),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": "gated", "act": "silu", "qk_norm": "head"},
    tensors=TENSORS,
    read_own=read_own,
    write_own=write_own,
)

TYPE = LFM2
