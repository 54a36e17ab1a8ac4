"""Hugging Face ``falcon_h1`` → modkit: attention and Mamba-2 side by side in every layer, with μP multipliers.

Semantics: ``transformers/models/falcon_h1/{configuration,modeling}_falcon_h1.py``. Every layer
(``FalconH1DecoderLayer``) is a pre-norm block whose mixer is modkit's ``parallel`` of a ``gqa`` attention and a
``mamba2`` mixer reading the same normalised input, then an RMSNorm and a SwiGLU FFN:

    h = x + m_attn_out · Attn(m_attn_in · N(x)) + m_ssm_out · Mamba2(m_ssm_in · N(x))
    y = h + m_down · down(silu(m_gate · gate(N'(h))) · up(N'(h)))

Every multiplier is expressed exactly:

* ``embedding_multiplier``: the token embeddings times it (``embedding_scale``);
* ``lm_head_multiplier``: the logits times it (``logit_scale``);
* ``attention_in_multiplier`` / ``attention_out_multiplier``, ``ssm_in_multiplier`` / ``ssm_out_multiplier``: the
  ``parallel`` mixer's ``in_multipliers`` / ``out_multipliers`` (attention first, then Mamba-2);
* ``key_multiplier``: the keys times it before RoPE (``FalconH1Attention``); RoPE is linear, so this is the score
  ``q·k`` times it: ``softmax_scale = key_multiplier / sqrt(head_dim)``. The export writes back the shortest decimal
  that gives the spec's scale again (the source config's value when it does);
* ``ssm_multipliers``: the five parts ``[z, x, B, C, Δ]`` of ``in_proj``'s output (``compute_mup_vector``), the
  ``mamba2`` mixer's ``projection_multipliers``;
* ``mlp_multipliers``: ``[gate, down]``, the SwiGLU's ``gate_multiplier`` (before the activation) and
  ``output_multiplier`` (``FalconH1MLP``).

The Mamba-2 mixer (``FalconH1Mixer``) has its own width ``mamba_d_ssm`` (``int(mamba_expand · hidden_size)`` when
null) in ``mamba_n_heads`` heads of ``mamba_d_head`` (``"auto"``: ``mamba_d_ssm // mamba_n_heads``), the gated
RMSNorm only with ``mamba_rms_norm`` (normalising before the gate with ``mamba_norm_before_gate``, over
``mamba_n_groups`` groups, epsilon ``rms_norm_eps``; without it the output is ``y · silu(z)``), ``in_proj`` bias
``mamba_proj_bias``, ``out_proj`` bias ``projectors_bias``, convolution bias ``mamba_conv_bias``, Δ clamped to
``time_step_limit``. ``hidden_act`` is both the FFN's and the convolution's activation, so only silu converts.
The attention's ``head_dim`` is the config's ``head_dim`` when present (the published checkpoints set it), else
``hidden_size // num_attention_heads``; ``attention_bias`` puts biases on q, k, v and o. ``mamba_chunk_size``
changes the speed of the chunked scan, not its numbers.

Keys of 4.x-era configs that transformers 5 no longer reads: ``mlp_expansion_factor`` (the FFN width is
``intermediate_size``) is ignored; ``mamba_use_mlp`` other than true and ``attn_layer_indices`` other than null
describe layers without an FFN or without attention and are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from modkit.plugin import CheckpointError

from ._keys import Ignore, Key, Own, Refuse, Rope
from ._reader import HFConfig
from ._spec import AttentionRequest, attention
from ._type import HFType
from ._weights import Head, W
from .granite import _unless_one
from .mamba2 import read_time_step_limit, write_time_step_limit

MODEL_TYPE = "falcon_h1"

#: the keys of the attention half of the mixer (read by :func:`read_mixer`, written by :func:`write_mixer`)
ATTENTION_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "attention_bias", "key_multiplier")
#: the keys of the Mamba-2 half
MAMBA_KEYS = (
    "mamba_d_ssm",
    "mamba_n_heads",
    "mamba_d_head",
    "mamba_n_groups",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_chunk_size",
    "mamba_conv_bias",
    "mamba_proj_bias",
    "projectors_bias",
    "mamba_norm_before_gate",
    "mamba_rms_norm",
    "time_step_limit",
    "ssm_multipliers",
)
#: the multipliers of the two halves' inputs and outputs
SIDE_KEYS = ("attention_in_multiplier", "ssm_in_multiplier", "attention_out_multiplier", "ssm_out_multiplier")


def _multipliers(r: HFConfig, key: str, n: int, positive: bool = True) -> list[float]:
    """A list of ``n`` finite numbers at ``key`` (positive ones with ``positive``; absent or null: ``n`` ones)."""
    values = r.get(key, [1.0] * n)
    if not isinstance(values, (list, tuple)) or len(values) != n:
        r.error(key, f"must be a list of {n} numbers, got {values!r}")
        return [1.0] * n
    return [float(r.check_number(key, v, 1.0, positive=positive)) for v in values]


def _null(r: HFConfig, key: str) -> bool:
    """Whether ``key`` is present with a null value (which ``FalconH1Config`` replaces by a derived one); marks it read."""
    r.get(key)
    return key in r and r.cfg[key] is None


def read_mixer(r: HFConfig, f: dict) -> None:
    """The ``parallel`` mixer of every layer (:data:`ATTENTION_KEYS`, :data:`MAMBA_KEYS`, :data:`SIDE_KEYS`) and the
    FFN multipliers (``mlp_multipliers``), with ``FalconH1Config``'s defaults."""
    d = f["d_model"]
    _check_shared(r, f)
    att = _read_attention(r, d)
    mamba = _read_mamba(r, f)
    # side by side, and the FFN
    side = [float(r.number(k, 1.0, positive=False)) for k in SIDE_KEYS]
    mixer: dict[str, Any] = {"type": "parallel", "mixers": [att, mamba]}
    if any(m != 1 for m in side[:2]):
        mixer["in_multipliers"] = side[:2]
    if any(m != 1 for m in side[2:]):
        mixer["out_multipliers"] = side[2:]
    f["mixer"] = mixer
    f["ffn_multipliers"] = _multipliers(r, "mlp_multipliers", 2)


def _check_shared(r: HFConfig, f: dict) -> None:
    """Report (``r.error``) what the already-read fields hold that Falcon-H1 cannot express: a partial rotary factor,
    an activation other than silu (it is the FFN's and the Mamba-2 convolution's)."""
    if f["position"].get("partial_rotary", 1.0) != 1:
        r.error(
            "partial_rotary_factor",
            f"unsupported value {f['position']['partial_rotary']}: FalconH1RotaryEmbedding "
            "rotates the whole head (its default RoPE does not read the factor); only 1 converts",
        )
    if f["act"] != "silu":
        r.error(
            "hidden_act",
            f"unsupported value {f['act']!r}: Falcon-H1 uses hidden_act for the FFN and for the "
            "Mamba-2 convolution, whose activation is silu in modkit's mamba2; only silu converts",
        )


def _read_attention(r: HFConfig, d: int) -> dict[str, Any]:
    """The ``gqa`` attention half of the mixer (:data:`ATTENTION_KEYS`) for width ``d``; problems go to ``r.error``."""
    heads = r.number("num_attention_heads", 32, integer=True)
    kv = heads if _null(r, "num_key_value_heads") else r.number("num_key_value_heads", 8, integer=True)
    if heads % kv:
        r.error("num_key_value_heads", f"num_key_value_heads = {kv} does not divide num_attention_heads = {heads}")
        kv = heads
    head_dim = r.number("head_dim", None, integer=True)
    if head_dim is None:
        if d % heads:
            r.error(
                "num_attention_heads",
                f"hidden_size = {d} is not divisible by num_attention_heads = {heads} and head_dim is not given",
            )
        head_dim = d // heads
    bias = r.flag("attention_bias", False)
    key_multiplier = r.number("key_multiplier", 1.0)
    return attention(
        AttentionRequest(
            d,
            heads,
            kv,
            head_dim,
            bias=(bias,) * 4,
            softmax_scale=None if key_multiplier == 1 else key_multiplier * head_dim**-0.5,
        )
    )


def _read_mamba(r: HFConfig, f: dict) -> dict[str, Any]:
    """The ``mamba2`` half of the mixer (:data:`MAMBA_KEYS`) for the width ``f["d_model"]``, its gated norm's
    epsilon ``f["eps"]``; problems go to ``r.error``."""
    d = f["d_model"]
    expand = r.number("mamba_expand", 2)
    d_ssm = int(expand * d) if _null(r, "mamba_d_ssm") else r.number("mamba_d_ssm", 1024, integer=True)
    n_heads = r.number("mamba_n_heads", 128, integer=True)
    d_head = r.get("mamba_d_head", "auto")
    d_head = None if d_head == "auto" else r.number("mamba_d_head", None, integer=True)
    d_head = d_ssm // n_heads if d_head is None else d_head
    if n_heads * d_head != d_ssm:
        r.error(
            "mamba_d_head",
            f"mamba_n_heads · mamba_d_head = {n_heads} · {d_head} = {n_heads * d_head} must equal "
            f"the Mamba-2 width {d_ssm} (mamba_d_ssm, or mamba_expand · hidden_size when it is null)",
        )
    groups = r.number("mamba_n_groups", 1, integer=True)
    if n_heads % groups:
        r.error("mamba_n_groups", f"mamba_n_groups = {groups} does not divide mamba_n_heads = {n_heads}")
    mamba: dict[str, Any] = {
        "type": "mamba2",
        "d_state": r.number("mamba_d_state", 256, integer=True),
        "head_dim": d_head,
        "d_inner": d_ssm,
        "n_groups": groups,
        "d_conv": r.number("mamba_d_conv", 4, integer=True),
        "conv_bias": r.flag("mamba_conv_bias", True),
        "in_proj_bias": r.flag("mamba_proj_bias", False),
        "out_proj_bias": r.flag("projectors_bias", False),
        "gated_norm": r.flag("mamba_rms_norm", False),
        "norm_before_gate": r.flag("mamba_norm_before_gate", True),
        "norm_eps": f["eps"],
        "chunk_size": r.number("mamba_chunk_size", 256, integer=True),
        **read_time_step_limit(r),
    }
    ssm = _multipliers(r, "ssm_multipliers", 5, positive=False)
    if any(m != 1 for m in ssm):
        mamba["projection_multipliers"] = ssm
    return mamba


def key_multiplier(scale: Any, head_dim: int, base: Any = None) -> float:
    """``key_multiplier`` for a ``softmax_scale`` (``None``: 1): the source config's ``base`` when it gives the scale
    back, else the shortest decimal ``v`` with ``v · head_dim ** -0.5 == scale`` (the way it is read)."""
    if scale is None:
        return 1.0
    if isinstance(base, (int, float)) and base * head_dim**-0.5 == scale:
        return base
    exact = scale * head_dim**0.5
    for digits in range(1, 18):
        v = float(f"{exact:.{digits}g}")
        if v * head_dim**-0.5 == scale:
            return v
    below = above = exact
    for _ in range(8):  # the floats next to it (the two roundings can move the preimage by a few units)
        below, above = math.nextafter(below, 0.0), math.nextafter(above, math.inf)
        for v in (below, above):
            if v * head_dim**-0.5 == scale:
                return v
    return exact  # no float maps back exactly: the export's check names the field


def write_mixer(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """The keys :func:`read_mixer` reads, from the spec's ``parallel`` mixer and FFN.

    Raises:
        CheckpointError: the mixer is not a ``parallel`` of an attention and a ``mamba2`` mixer.
    """
    from modkit.plugin import get_registry

    m, d = f["mixer"], f["d_model"]
    mixers = getattr(m, "mixers", None) or ()
    kinds = [get_registry().entry_for_config(x).kind for x in mixers]
    if getattr(m, "type", None) != "parallel" or kinds != ["attention", "mixer"] or mixers[1].type != "mamba2":
        raise CheckpointError(
            f"a {MODEL_TYPE} checkpoint holds in every layer a parallel mixer of an attention and a "
            f"mamba2 mixer, in this order; the spec's mixer is {getattr(m, 'type', 'an attention')!r}"
            f"{' of ' + str([x.type for x in mixers]) if mixers else ''}"
        )
    att, mamba = mixers
    head_dim = att.resolved_head_dim(d)
    cfg.update(
        num_attention_heads=att.n_heads,
        num_key_value_heads=att.kv_heads,
        attention_bias=att.q_bias,
        key_multiplier=key_multiplier(att.softmax_scale, head_dim, base.get("key_multiplier")),
    )
    if "head_dim" in base or head_dim * att.n_heads != d:
        cfg["head_dim"] = head_dim
    inner = mamba.resolved_d_inner(d)
    cfg.update(
        mamba_d_ssm=inner,
        mamba_n_heads=inner // mamba.head_dim,
        mamba_d_head=mamba.head_dim,
        mamba_n_groups=mamba.n_groups,
        mamba_d_state=mamba.d_state,
        mamba_d_conv=mamba.d_conv,
        mamba_expand=base.get("mamba_expand") or 2,
        mamba_chunk_size=mamba.chunk_size,
        mamba_conv_bias=mamba.conv_bias,
        mamba_proj_bias=mamba.in_proj_bias,
        projectors_bias=mamba.out_proj_bias,
        mamba_rms_norm=mamba.gated_norm,
        mamba_norm_before_gate=mamba.norm_before_gate,
        time_step_limit=write_time_step_limit(mamba),
        ssm_multipliers=list(mamba.projection_multipliers or [1.0] * 5),
    )
    ins, outs = m.in_multipliers or [1.0, 1.0], m.out_multipliers or [1.0, 1.0]
    cfg.update(zip(SIDE_KEYS, [*ins, *outs]))
    ffn = f["ffns"][0]
    cfg["mlp_multipliers"] = [getattr(ffn, "gate_multiplier", 1.0), getattr(ffn, "output_multiplier", 1.0)]


L = "model.layers.{i}."

FALCON_H1 = HFType(
    model_type=MODEL_TYPE,
    architecture="FalconH1ForCausalLM",
    notes=__doc__,
    # transformers FalconH1Config
    keys={
        "vocab_size": Key("vocab_size", 128000),
        "hidden_size": Key("d_model", 4096),
        "intermediate_size": Key("d_ff", 14336),
        "num_hidden_layers": Key("n_layers", 32),
        "max_position_embeddings": Key("max_seq_len", 8192),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "hidden_act": Key("act", "silu", kind="act", note="only silu: the Mamba-2 convolution's activation too"),
        "mlp_bias": Key("mlp_bias", False, kind="flag"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "embedding_multiplier": Key(
            "embedding_scale",
            1.0,
            kind="number",
            read_as=_unless_one,
            write_as=lambda v, f: 1.0 if v is None else v,
            note="times the token embeddings",
        ),
        "lm_head_multiplier": Key(
            "logit_scale",
            1.0,
            kind="number",
            read_as=_unless_one,
            write_as=lambda v, f: 1.0 if v is None else v,
            note="times the logits",
        ),
        "rope_parameters": Rope(10000.0),
        "num_attention_heads": Own(
            ATTENTION_KEYS,
            "the attention of every layer's parallel mixer; key_multiplier "
            "becomes its softmax_scale = key_multiplier / sqrt(head_dim) (see the notes)",
            fields=("mixer", "n_kv_heads", "softmax_scale", "qkv_bias", "o_bias"),
        ),
        "mamba_d_ssm": Own(
            MAMBA_KEYS, "the mamba2 mixer of every layer's parallel mixer (see the notes)", fields=("mixer",)
        ),
        "attention_in_multiplier": Own(
            SIDE_KEYS,
            "the parallel mixer's in_multipliers and out_multipliers (attention, then Mamba-2)",
            fields=("mixer",),
        ),
        "mlp_multipliers": Own(
            ("mlp_multipliers",), "the SwiGLU's gate_multiplier and output_multiplier", fields=("ffn_multipliers",)
        ),
        "num_logits_to_keep": Ignore("how many positions' logits generate computes"),
        "mlp_expansion_factor": Ignore("a 4.x-era key transformers does not read; the FFN width is intermediate_size"),
        "mamba_use_mlp": Refuse(
            True, "transformers builds the FFN in every layer; a config without it describes another network"
        ),
        "attn_layer_indices": Refuse(
            None,
            "transformers runs attention beside Mamba-2 in every layer; a config "
            "listing attention layers describes another network",
        ),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": "gated"},
    read_own=read_mixer,
    write_own=write_mixer,
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.weight", "model.final_layernorm.weight"),
        W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "pre_ff_layernorm.weight"),
        *(
            W(f"layers.{{i}}.attention.mixers.0.{x}.{{p}}", L + f"self_attn.{x}.{{p}}")
            for x in ("q_proj", "k_proj", "v_proj", "o_proj")
        ),
        *(
            W(f"layers.{{i}}.attention.mixers.1.{x}", L + f"mamba.{x}")
            for x in ("dt_bias", "A_log", "D", "norm.weight")
        ),
        *(
            W(f"layers.{{i}}.attention.mixers.1.{x}.{{p}}", L + f"mamba.{x}.{{p}}")
            for x in ("in_proj", "conv1d", "out_proj")
        ),
        *(W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"feed_forward.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
        Head(),
    ),
)

TYPE = FALCON_H1
