"""Hugging Face ``bamba`` (IBM Bamba) → modkit: Mamba-2 layers with attention on the listed layers, a SwiGLU FFN in
every layer; RMSNorm pre-norm blocks.

Semantics: ``transformers/models/bamba/{configuration,modeling}_bamba.py``:

* layer ``i`` is an attention layer iff ``i`` is in ``attn_layer_indices`` (absent or null: none), else a Mamba-2
  layer (``BambaConfig.layers_block_type``); attention (``BambaAttention``, Llama's) is GQA with ``attention_bias``
  on all four projections, ``head_dim`` when the config has one (else ``hidden_size // num_attention_heads``), and
  RoPE over half of each head: ``BambaConfig.__post_init__`` passes ``partial_rotary_factor = 0.5`` whatever the
  config says (so the spec's RoPE always rotates half);
* the Mamba-2 layer (``BambaMixer``, transformers' ``Mamba2Mixer``) is modkit's ``mamba2``: ``in_proj`` to
  ``[z, x, B, C, Δ]`` with ``int(mamba_expand · hidden_size)`` in ``mamba_n_heads`` heads of ``mamba_d_head``
  (``"auto"``: the width over the heads), ``mamba_n_groups`` groups of ``mamba_d_state``-wide B and C, a causal
  convolution of ``mamba_d_conv`` (bias ``mamba_conv_bias``), Δ clamped to ``time_step_limit``, the gated RMSNorm
  (gate first, per group, ``rms_norm_eps``), ``out_proj``; ``mamba_proj_bias`` puts biases on both projections. Its
  activation is ``hidden_act``, which modkit's mamba2 computes as silu only; ``mamba_chunk_size`` changes the speed
  of the chunked scan, not its numbers;
* without attention layers the RoPE acts nowhere: the spec's position scheme is then ``none``;
* each block is ``x + mixer(input_layernorm(x))``, then ``x + mlp(pre_ff_layernorm(x))`` (SwiGLU of
  ``intermediate_size``, ``mlp_bias``); ``final_layernorm`` after the last. ``z_loss_coefficient`` weighs a training
  loss on the logits, not the network.

Export writes ``attn_layer_indices`` (the attention layers of the spec) and the Mamba-2 keys (the source config's,
else the defaults, when no layer is a Mamba-2 layer).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from modkit.plugin import json_value

from ._keys import HeadDim, Ignore, Key, KVHeads, Own, Rope, sizes
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, W
from .mamba2 import read_time_step_limit, write_time_step_limit

MODEL_TYPE = "bamba"

#: the Mamba-2 keys shared by Bamba and Granite 4 (:func:`read_mamba`, :func:`write_mamba`) with their defaults
MAMBA_DEFAULTS = {
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "time_step_limit": (0.0, float("inf")),
}


def read_mamba(r: HFConfig, f: dict) -> dict[str, Any]:
    """The ``mamba2`` mixer spec of :data:`MAMBA_DEFAULTS` for the width ``f["d_model"]`` (gated norm epsilon
    ``f["eps"]``); problems go to ``r.error`` naming the key: heads and head width that do not split the Mamba-2
    width, groups that do not divide the heads, an activation other than silu."""
    d = f["d_model"]
    expand = r.number("mamba_expand", 2, integer=True)
    heads = r.number("mamba_n_heads", 128, integer=True)
    width = expand * d
    d_head = r.get("mamba_d_head", "auto")
    d_head = width // heads if d_head == "auto" else r.number("mamba_d_head", None, integer=True)
    if heads * d_head != width:
        r.error(
            "mamba_n_heads",
            f"mamba_n_heads · mamba_d_head = {heads} · {d_head} = {heads * d_head} must equal mamba_expand · "
            f"hidden_size = {width}: change mamba_n_heads, mamba_d_head or mamba_expand",
        )
        d_head = max(1, width // max(heads, 1))
    groups = r.number("mamba_n_groups", 1, integer=True)
    if heads % groups:
        r.error("mamba_n_groups", f"mamba_n_groups = {groups} does not divide mamba_n_heads = {heads}")
    if f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the Mamba-2 layers (convolution and gate), which modkit's mamba2 computes "
            f"with silu only; got {json_value(r.get('hidden_act'))}",
        )
    bias = r.flag("mamba_proj_bias", False)
    return {
        "type": "mamba2",
        "d_state": r.number("mamba_d_state", 256, integer=True),
        "head_dim": d_head,
        "d_inner": width,
        "n_groups": groups,
        "d_conv": r.number("mamba_d_conv", 4, integer=True),
        "conv_bias": r.flag("mamba_conv_bias", True),
        "in_proj_bias": bias,
        "out_proj_bias": bias,
        "norm_eps": f["eps"],
        "chunk_size": r.number("mamba_chunk_size", 256, integer=True),
        **read_time_step_limit(r),
    }


def write_mamba(m: Optional[Any], d: int, base: Mapping[str, Any], cfg: dict) -> None:
    """:data:`MAMBA_DEFAULTS` from a ``mamba2`` mixer config ``m`` for width ``d`` (``None``: the source config's
    values, else the defaults)."""
    if getattr(m, "type", None) != "mamba2":
        cfg.update({key: base.get(key, default) for key, default in MAMBA_DEFAULTS.items()})
        return
    inner = m.resolved_d_inner(d)
    cfg.update(
        mamba_n_heads=inner // m.head_dim,
        mamba_d_head=m.head_dim,
        mamba_n_groups=m.n_groups,
        mamba_d_state=m.d_state,
        mamba_d_conv=m.d_conv,
        mamba_expand=inner // d if inner % d == 0 else inner / d,
        mamba_chunk_size=m.chunk_size,
        mamba_conv_bias=m.conv_bias,
        mamba_proj_bias=m.in_proj_bias,
        time_step_limit=write_time_step_limit(m),
    )


def read_layers(r: HFConfig, f: dict) -> None:
    """The mixer of every layer (``mixers``: ``mamba2``, or ``None`` for attention on ``attn_layer_indices``)."""
    n = f["n_layers"]
    mixer = read_mamba(r, f)
    idxs = r.get("attn_layer_indices")
    if idxs is not None and not (isinstance(idxs, list) and all(isinstance(i, int) for i in idxs)):
        r.error("attn_layer_indices", f"must list layer indices, got {json_value(idxs)}")
        idxs = None
    f["mixers"] = [None if idxs and i in idxs else mixer for i in range(n)]
    if all(m is not None for m in f["mixers"]):  # no attention: no queries or keys for the RoPE
        f["position"] = {"type": "none"}
    elif f.get("position", {}).get("type") == "rope":  # BambaConfig.__post_init__: half of each head, whatever the
        f["position"] = {**f["position"], "partial_rotary": 0.5}  # config says (so a spec rotating more is refused)


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``attn_layer_indices`` and the Mamba-2 keys."""
    cfg["attn_layer_indices"] = [i for i, m in enumerate(f["mixers"]) if m is None] or None
    write_mamba(f["mixer"], f["d_model"], base, cfg)


L = "model.layers.{i}."

#: the Mamba-2 layer's tensors as Bamba and Granite 4 name them (``mamba.*``)
MAMBA_TENSORS = (
    *(W(f"layers.{{i}}.attention.{x}", L + f"mamba.{x}") for x in ("dt_bias", "A_log", "D", "norm.weight")),
    *(W(f"layers.{{i}}.attention.{x}.{{p}}", L + f"mamba.{x}.{{p}}") for x in ("in_proj", "conv1d", "out_proj")),
)

BAMBA = HFType(
    model_type=MODEL_TYPE,
    architecture="BambaForCausalLM",
    notes=__doc__,
    # transformers BambaConfig, key by key
    keys={
        **sizes(
            vocab_size=128000,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=262144,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(),
        "hidden_act": Key("act", "silu", kind="act", note="only silu: the Mamba-2 convolution's activation too"),
        "intermediate_size": Key("d_ff", 14336),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag"),
        "mlp_bias": Key("mlp_bias", False, kind="flag"),
        "rope_parameters": Rope(10000.0, partial=0.5, always_partial=True),
        "attn_layer_indices": Own(
            ("attn_layer_indices", *MAMBA_DEFAULTS),
            "the mixer of each layer: attention on attn_layer_indices, mamba2 elsewhere (see the notes)",
            fields=("mixers",),
        ),
        "num_logits_to_keep": Ignore("how many positions' logits generate computes"),
        "z_loss_coefficient": Ignore("the weight of a training loss on the logits (z-loss), not the network"),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": "gated"},
    read_own=read_layers,
    write_own=write_layers,
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.weight", "model.final_layernorm.weight"),
        W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "pre_ff_layernorm.weight"),
        *(W(f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkvo"),
        *MAMBA_TENSORS,
        *(W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"feed_forward.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
        Head(),
    ),
)

TYPE = BAMBA
