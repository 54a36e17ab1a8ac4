"""Hugging Face ``olmo_hybrid`` (OLMo Hybrid) → modkit: Gated DeltaNet layers with negative eigenvalues in pre-norm
blocks, and OLMo 3 attention layers in reordered-norm blocks.

Semantics: ``transformers/models/olmo_hybrid/{configuration,modeling}_olmo_hybrid.py``:

* layer ``i`` is ``layer_types[i]``: ``linear_attention`` or ``full_attention``; without ``layer_types`` every
  fourth layer (3, 7, ...) is attention, and the last one when no layer is (``OlmoHybridConfig.__post_init__``);
* a linear layer (``OlmoHybridLinearAttentionDecoderLayer``) is a pre-norm block, ``x + attn(input_layernorm(x))``
  then ``x + mlp(post_attention_layernorm(x))``, whose mixer (``OlmoHybridGatedDeltaNet``) is modkit's
  ``gated_deltanet``: ``linear_num_key_heads`` query/key heads (default ``num_attention_heads``) of
  ``linear_key_head_dim`` (default ``int(0.75 · hidden_size / linear_num_key_heads)``), ``linear_num_value_heads``
  value heads (default ``num_attention_heads``) of ``linear_value_head_dim`` (default twice the key width), separate
  ``q/k/v/a/b/g_proj``, a bias-free convolution of ``linear_conv_kernel_dim`` with ``hidden_act`` (silu only in
  modkit), the gated output norm ``o_norm`` with epsilon 1e-5 (fixed, not ``rms_norm_eps``), ``o_proj``; with
  ``linear_allow_neg_eigval`` (default true) β = 2 · sigmoid(b) (``allow_neg_eigval``);
* an attention layer (``OlmoHybridAttentionDecoderLayer``, OLMo 3's) is a reordered block, ``x +
  post_attention_layernorm(attn(x))`` then ``x + post_feedforward_layernorm(mlp(x))``: the per-layer placement
  (``placements``), with RMSNorms over the whole q and k projections before RoPE (``rope_parameters``; transformers
  fills a base in, so the NoPE path of ``OlmoHybridAttention`` is not reached from a config) and ``attention_bias``
  on all four projections;
* ``linear_a_log_min``/``max``, ``linear_dt_min``/``max``/``init_floor`` only initialise ``A_log`` and ``dt_bias``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from modkit.plugin import json_value

from ._keys import Ignore, Own, Rope
from ._reader import HFConfig
from ._transforms import Transform
from ._weights import W
from .llama import LLAMA, L
from .qwen3_5 import Groups

MODEL_TYPE = "olmo_hybrid"

LINEAR, FULL = "linear_attention", "full_attention"
#: the Gated DeltaNet's size keys (null or absent: derived as the notes say)
LINEAR_SIZES = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
LAYER_KEYS = ("layer_types", *LINEAR_SIZES, "linear_conv_kernel_dim", "linear_allow_neg_eigval")
#: the epsilon of ``OlmoHybridGatedDeltaNet.o_norm`` (fixed in transformers)
O_NORM_EPS = 1e-5
#: the placement of the attention layers (OLMo 3's decoder layer)
REORDERED = {"type": "reordered"}


def _sizes(r: HFConfig, f: dict) -> dict[str, int]:
    """The four :data:`LINEAR_SIZES` with ``OlmoHybridConfig.__post_init__``'s derivations for absent ones."""
    heads = f["n_heads"]
    nk = r.number("linear_num_key_heads", heads, integer=True)
    nv = r.number("linear_num_value_heads", heads, integer=True)
    dk = r.number("linear_key_head_dim", int(0.75 * f["d_model"] / nk), integer=True)
    dv = r.number("linear_value_head_dim", 2 * dk, integer=True)
    if nv % nk:
        r.error(
            "linear_num_value_heads",
            f"linear_num_value_heads = {nv} is not a multiple of linear_num_key_heads = {nk}: each key head serves "
            "linear_num_value_heads / linear_num_key_heads value heads",
        )
    return dict(zip(LINEAR_SIZES, (nk, nv, dk, dv)))


def _types(r: HFConfig, n: int) -> list[str]:
    """``layer_types``, or ``OlmoHybridConfig``'s default pattern; an unknown type is an error on ``r``."""
    types = r.get("layer_types")
    if types is None:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
        if FULL not in types:
            types[-1] = FULL
        return types
    if not isinstance(types, list) or len(types) != n:
        r.error("layer_types", f"must list one type per layer ({n}), got {json_value(types)}")
        return [FULL] * n
    bad = sorted({str(t) for t in types if t not in (LINEAR, FULL)})
    if bad:
        r.error("layer_types", f"unsupported layer types {bad}: OlmoHybridModel builds {LINEAR!r} and {FULL!r} layers")
    return types


def read_layers(r: HFConfig, f: dict) -> None:
    """Per layer, the mixer (``mixers``: ``gated_deltanet`` on linear layers) and the placement (``placements``:
    pre-norm on linear layers, reordered on attention layers), from :data:`LAYER_KEYS`."""
    size = _sizes(r, f)
    mixer = {
        "type": "gated_deltanet",
        "n_heads": size["linear_num_key_heads"],
        "n_value_heads": size["linear_num_value_heads"],
        "key_head_dim": size["linear_key_head_dim"],
        "value_head_dim": size["linear_value_head_dim"],
        "d_conv": r.number("linear_conv_kernel_dim", 4, integer=True),
        "allow_neg_eigval": r.flag("linear_allow_neg_eigval", True),
        "norm_eps": O_NORM_EPS,
    }
    types = _types(r, f["n_layers"])
    f["mixers"] = [mixer if t == LINEAR else None for t in types]
    f["placements"] = [dict(f["placement"]) if t == LINEAR else dict(REORDERED) for t in types]
    if LINEAR in types and f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the Gated DeltaNet convolution, which modkit's gated_deltanet computes with "
            f"silu only; got {json_value(r.get('hidden_act'))}",
        )


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types`` and the Gated DeltaNet's keys (the source config's, else the derived defaults, when no layer
    is linear). The placements follow from the layer types; the check of the export names a spec whose do not."""
    cfg["layer_types"] = [LINEAR if m is not None else FULL for m in f["mixers"]]
    m = f["mixer"]
    if getattr(m, "type", None) == "gated_deltanet":
        cfg.update(
            linear_num_key_heads=m.n_heads,
            linear_num_value_heads=m.value_heads,
            linear_key_head_dim=m.key_head_dim,
            linear_value_head_dim=m.value_head_dim,
            linear_conv_kernel_dim=m.d_conv,
            linear_allow_neg_eigval=m.allow_neg_eigval,
        )
    else:
        cfg.update({k: base[k] for k in LAYER_KEYS[1:] if base.get(k) is not None})


A = "layers.{i}.attention."
#: (modkit name under the mixer, checkpoint name under the layer) of the Gated DeltaNet's tensors
LINEAR_NAMES = (
    *((f"{p}_proj.weight", f"linear_attn.{p}_proj.weight") for p in ("q", "k", "v", "a", "b", "g")),
    *((x, f"linear_attn.{x}") for x in ("dt_bias", "A_log")),
    ("norm.weight", "linear_attn.o_norm.weight"),
    ("out_proj.weight", "linear_attn.o_proj.weight"),
)
LINEAR_GROUPS = Groups((1,) * len(LINEAR_NAMES))


@dataclass(frozen=True)
class SplitConv(Transform):
    """``gated_deltanet``'s one ``conv1d`` over the q, k and v channels ↔ the three tensors ``q_conv1d``,
    ``k_conv1d``, ``v_conv1d`` that transformers 5.25 writes for it: its conversion mapping reads them by
    concatenating along the channels and saves them by cutting the channels into three near-equal parts
    (``torch.chunk``), not at the q/k/v sizes; both are done here so that files are bitwise transformers'."""

    def to_ours(self, ts, ctx):
        return [torch.cat(list(ts), dim=0)]

    def to_hf(self, ts, ctx, extras):
        return list(torch.chunk(ts[0], 3, dim=0))

    def describe(self) -> str:
        return "one convolution ↔ three near-equal channel parts (q_conv1d, k_conv1d, v_conv1d)"


OLMO_HYBRID = LLAMA.derive(
    MODEL_TYPE,
    architecture="OlmoHybridForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    # transformers OlmoHybridConfig defaults
    defaults={
        "vocab_size": 100352,
        "hidden_size": 3840,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 30,
        "max_position_embeddings": 65536,
    },
    keys={
        "rope_theta": Rope(10000.0),
        "layer_types": Own(
            LAYER_KEYS,
            "per layer: gated_deltanet (allow_neg_eigval from linear_allow_neg_eigval) in a pre-norm block on "
            "linear_attention layers, OLMo 3's attention in a reordered block on full_attention layers (see the notes)",
            fields=("mixers", "placements"),
        ),
        **{
            k: Ignore("initialises A_log / dt_bias only")
            for k in ("linear_a_log_min", "linear_a_log_max", "linear_dt_min", "linear_dt_max", "linear_dt_init_floor")
        },
    },
    fixed={"qk_norm": "full"},
    tensors=(
        # on disk (transformers' conversion mapping for olmo_hybrid): input_layernorm is attention_layer_norm,
        # post_attention_layernorm is feedforward_layer_norm (a linear layer's FFN pre-norm, an attention layer's
        # post-norm), the convolution is three, over q, k and v
        W("layers.{i}.attn_norm.weight", L + "attention_layer_norm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "feedforward_layer_norm.weight"),
        W("layers.{i}.attn_post_norm.weight", L + "feedforward_layer_norm.weight"),
        W("layers.{i}.ffn_post_norm.weight", L + "post_feedforward_layernorm.weight"),
        W(A + "conv1d.weight", tuple(L + f"linear_attn.{x}_conv1d.weight" for x in "qkv"), SplitConv()),
        # grouped (all of a layer's together, resolved before the attention's one-to-one q/k/v rows)
        W(tuple(A + ours for ours, _ in LINEAR_NAMES), tuple(L + hf for _, hf in LINEAR_NAMES), LINEAR_GROUPS),
    ),
    read_own=read_layers,
    write_own=write_layers,
)

TYPE = OLMO_HYBRID
