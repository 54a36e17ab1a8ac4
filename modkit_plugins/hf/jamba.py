"""Hugging Face ``jamba`` (AI21 Jamba) → modkit: Mamba layers with an attention layer every few, dense SwiGLU FFNs
with a mixture every few layers; RMSNorm pre-norm blocks, no position scheme.

Semantics: ``transformers/models/jamba/{configuration,modeling}_jamba.py``:

* layer ``i`` is an attention layer iff ``i % attn_layer_period == attn_layer_offset`` (defaults 8 and 4), else a
  Mamba layer (``JambaConfig.layers_block_type``); attention (``JambaAttention``) is GQA without biases and without
  any position encoding (``head_dim`` when the config has one, else ``hidden_size // num_attention_heads``);
* the Mamba layer (``JambaMambaMixer``) is modkit's ``mamba``: ``in_proj`` to ``x`` and ``z`` of ``mamba_expand ·
  hidden_size``, a causal convolution of ``mamba_d_conv`` (bias ``mamba_conv_bias``), ``x_proj`` to a step of rank
  ``mamba_dt_rank`` (``"auto"``: ``ceil(hidden_size / 16)``) and ``mamba_d_state``-wide B and C, each through an
  RMSNorm (``dt_layernorm``, ``b_layernorm``, ``c_layernorm``; ``rms_norm_eps``), ``dt_proj``, the selective scan,
  ``out_proj``; ``mamba_proj_bias`` puts biases on ``in_proj`` and ``out_proj``. Its activation is ``hidden_act``,
  which modkit's mamba supports as silu only;
* the FFN of layer ``i`` is a mixture of ``num_experts`` SwiGLU experts of ``intermediate_size`` under a softmax
  top-``num_experts_per_tok`` router, not renormalised (``JambaTopKRouter``), iff ``num_experts > 1`` and ``i %
  expert_layer_period == expert_layer_offset`` (defaults 2 and 1), else a SwiGLU of ``intermediate_size``
  (``JambaConfig.layers_num_experts``);
* each block is ``x + mixer(input_layernorm(x))``, then ``x + ffn(pre_ff_layernorm(x))``; ``final_layernorm`` after
  the last. ``use_mamba_kernels``, ``use_mambapy`` and ``use_associative_scan`` choose implementations of the
  same scan.

Export writes the smallest period and offset that place the attention layers and the mixtures as the spec does (the
source config's when they do), and refuses a spec whose layers follow no such pattern.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from modkit.plugin import CheckpointError, json_value

from ._keys import HeadDim, Ignore, Key, KVHeads, Own, sizes
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, StackExperts, W

MODEL_TYPE = "jamba"

#: the config keys of the Mamba layers (:func:`read_layers`, :func:`write_layers`) and their transformers defaults
MAMBA_KEYS = {
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": "auto",
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
}
#: ``(period key, offset key, defaults)`` of the attention layers and of the mixture layers
ATTENTION_PATTERN = ("attn_layer_period", "attn_layer_offset", (8, 4))
EXPERT_PATTERN = ("expert_layer_period", "expert_layer_offset", (2, 1))


def _pattern(r: HFConfig, keys: tuple[str, str, tuple[int, int]], n_layers: int) -> list[bool]:
    """Per layer, ``i % period == offset`` (the offset below the period, as ``JambaConfig.validate_architecture``
    requires)."""
    period_key, offset_key, (period, offset) = keys
    period = r.number(period_key, period, integer=True)
    offset = r.number(offset_key, offset, integer=True, positive=False)
    if offset >= period:
        r.error(offset_key, f"{offset_key} = {offset} must be smaller than {period_key} = {period}")
    return [i % period == offset for i in range(n_layers)]


def read_layers(r: HFConfig, f: dict) -> None:
    """The mixer of every layer (``mixers``: ``mamba`` or an attention) and the mixture layers (``moe_layers``) from
    the two patterns and :data:`MAMBA_KEYS`, with ``JambaConfig`` defaults."""
    n, d = f["n_layers"], f["d_model"]
    k = MAMBA_KEYS
    rank = r.get("mamba_dt_rank", k["mamba_dt_rank"])
    if rank == "auto":
        rank = math.ceil(d / 16)
    else:
        rank = r.check_number("mamba_dt_rank", rank, math.ceil(d / 16), integer=True)
    mixer = {
        "type": "mamba",
        "d_state": r.number("mamba_d_state", k["mamba_d_state"], integer=True),
        "d_inner": r.number("mamba_expand", k["mamba_expand"], integer=True) * d,
        "dt_rank": rank,
        "d_conv": r.number("mamba_d_conv", k["mamba_d_conv"], integer=True),
        "conv_bias": r.flag("mamba_conv_bias", k["mamba_conv_bias"]),
        "bias": r.flag("mamba_proj_bias", k["mamba_proj_bias"]),
        "inner_norm": {"type": "rmsnorm", "eps": float(f["eps"])},
    }
    attention = _pattern(r, ATTENTION_PATTERN, n)
    f["mixers"] = [None if a else mixer for a in attention]
    flags = [(f["n_experts"] or 0) > 1 and e for e in _pattern(r, EXPERT_PATTERN, n)]
    f["moe"], f["moe_layers"] = any(flags), flags
    if not all(attention) and f["act"] != "silu":
        r.error(
            "hidden_act",
            "is also the activation of the Mamba layers (convolution and gate), which modkit's mamba "
            f"computes with silu only; got {json_value(r.get('hidden_act'))}",
        )


def period_of(flags: Sequence[bool], preferred: Sequence[tuple[Any, Any]]) -> Optional[tuple[int, int]]:
    """``(period, offset)`` with ``flags[i] == (i % period == offset)`` for every layer: the first of ``preferred``
    that fits, else the smallest period; ``None`` when no period fits."""
    n = len(flags)
    candidates = [p for p in preferred if isinstance(p[0], int) and isinstance(p[1], int) and 0 <= p[1] < p[0]]
    candidates += [(period, offset) for period in range(1, n + 2) for offset in range(period)]
    return next(((p, o) for p, o in candidates if all(flag == (i % p == o) for i, flag in enumerate(flags))), None)


def _write_pattern(
    flags: Sequence[bool], keys: tuple[str, str, tuple[int, int]], base: Mapping[str, Any], what: str, cfg: dict
) -> None:
    period_key, offset_key, default = keys
    found = period_of(flags, [(base.get(period_key), base.get(offset_key)), default])
    if found is None:
        layers = [i for i, flag in enumerate(flags) if flag]
        raise CheckpointError(
            f"the spec cannot be written as a Hugging Face jamba checkpoint: its {what} are on layers {layers}, and jamba "
            f"places them on the layers i with i % {period_key} == {offset_key}, which no period and offset give"
        )
    cfg[period_key], cfg[offset_key] = found


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """Both patterns and :data:`MAMBA_KEYS` (the source config's, else the defaults, when no layer is a Mamba
    layer); a model without mixtures is written with ``num_experts = 1``."""
    _write_pattern([m is None for m in f["mixers"]], ATTENTION_PATTERN, base, "attention layers", cfg)
    if f["moe"]:
        _write_pattern(f["moe_layers"], EXPERT_PATTERN, base, "mixture layers", cfg)
    else:
        cfg["num_experts"] = 1
        for key, default in zip(EXPERT_PATTERN[:2], EXPERT_PATTERN[2]):
            cfg[key] = base.get(key, default)
    m = f["mixer"]
    if getattr(m, "type", None) == "mamba":
        inner, d = m.resolved_d_inner(f["d_model"]), f["d_model"]
        cfg.update(
            mamba_d_state=m.d_state,
            mamba_d_conv=m.d_conv,
            mamba_expand=inner // d if inner % d == 0 else inner / d,
            mamba_dt_rank=m.resolved_dt_rank(d),
            mamba_conv_bias=m.conv_bias,
            mamba_proj_bias=m.bias,
        )
    else:
        cfg.update({key: base.get(key, default) for key, default in MAMBA_KEYS.items()})


L = "model.layers.{i}."

JAMBA = HFType(
    model_type=MODEL_TYPE,
    architecture="JambaForCausalLM",
    notes=__doc__,
    # transformers JambaConfig, key by key
    keys={
        **sizes(
            vocab_size=65536,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=262144,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(),
        "hidden_act": Key("act", "silu", kind="act"),
        "intermediate_size": Key("d_ff", 14336),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "num_experts": Key("n_experts", 16, kind="count", aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 2),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "attn_layer_period": Own(
            (*ATTENTION_PATTERN[:2], *EXPERT_PATTERN[:2], *MAMBA_KEYS),
            "the mixer of each layer (mamba, or attention where i % attn_layer_period == "
            "attn_layer_offset) and the mixture layers (see the notes)",
            fields=("mixers", "moe_layers"),
        ),
        "use_mamba_kernels": Ignore("deprecated in transformers 5: the fast kernels are used when available"),
        "use_mambapy": Ignore("a training-time fallback implementation of the same scan"),
        "use_associative_scan": Ignore("an implementation of the same scan under torch.compile"),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": "gated", "position": {"type": "none"}},
    read_own=read_layers,
    write_own=write_layers,
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.weight", "model.final_layernorm.weight"),
        W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "pre_ff_layernorm.weight"),
        *(W(f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkvo"),
        *(
            W(f"layers.{{i}}.attention.{x}.{{p}}", L + f"mamba.{x}.{{p}}")
            for x in ("in_proj", "conv1d", "x_proj", "dt_proj", "out_proj")
        ),
        *(W(f"layers.{{i}}.attention.{x}", L + f"mamba.{x}") for x in ("A_log", "D")),
        *(W(f"layers.{{i}}.attention.{x}_norm.weight", L + f"mamba.{x}_layernorm.weight") for x in ("dt", "b", "c")),
        *(W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"feed_forward.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
        W("layers.{i}.ffn.router.proj.weight", L + "feed_forward.router.weight"),
        *(
            W(f"layers.{{i}}.ffn.experts.{x}", L + f"feed_forward.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
        Head(),
    ),
)

TYPE = JAMBA
