"""Hugging Face ``mamba2`` → modkit: every layer an RMSNorm and a Mamba-2 mixer (no FFN, no position scheme).

Semantics: ``transformers/models/mamba2/{configuration,modeling}_mamba2.py``. Each block is ``x + mixer(RMSNorm(x))``
(``Mamba2Block``); the mixer (``Mamba2Mixer``) is modkit's ``mamba2``: ``in_proj`` to ``[z, x, B, C, Δ]`` with
``intermediate_size = int(expand · hidden_size)``, which transformers splits into ``num_heads`` heads of ``head_dim``
(so the two must multiply to it), ``n_groups`` groups of ``state_size``-wide B and C, a causal depthwise
convolution of ``conv_kernel`` over ``[x, B, C]`` (bias ``use_conv_bias``), ``Δ = softplus(Δ + dt_bias)`` clamped to
``time_step_limit``, the gated RMSNorm (gate first, per group, ``layer_norm_epsilon``) and ``out_proj``; ``use_bias``
puts biases on both projections. ``time_step_min`` / ``time_step_max`` / ``time_step_floor`` only initialise
``dt_bias``; ``chunk_size`` changes the speed of the chunked scan, not its numbers. ``residual_in_fp32`` keeps the
residual in float32 under half precision (modkit's residual is in the model's dtype: the same in float32). The
config has no context length: the spec's ``max_seq_len`` is fixed at 1,048,576 (the decode state does not grow).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from ._keys import Ignore, Key, Own
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "mamba2"

#: the config keys the mixer is read from (:func:`read_mixer`) and written back to (:func:`write_mixer`)
MIXER_KEYS = (
    "num_heads",
    "head_dim",
    "state_size",
    "expand",
    "n_groups",
    "conv_kernel",
    "use_bias",
    "use_conv_bias",
    "hidden_act",
    "time_step_min",
    "time_step_max",
    "time_step_floor",
    "time_step_limit",
    "chunk_size",
)

#: the context length written into the spec (Mamba-2 configs have none)
MAX_SEQ_LEN = 2**20


def read_time_step_limit(r: HFConfig, key: str = "time_step_limit") -> dict:
    """The ``mamba2`` clamp fields (``dt_clamp_min``, ``dt_clamp_max``; those at their defaults left out) of the pair
    ``[min, max]`` at ``key`` (default ``(0, inf)``: no clamp); an error on ``key`` for anything but a pair of
    numbers >= 0."""
    limit = r.get(key, (0.0, math.inf))
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        r.error(key, f"must be a pair [min, max], got {limit!r}")
        limit = (0.0, math.inf)
    lo, hi = (
        math.inf
        if v == math.inf and not isinstance(v, bool)
        else r.check_number(key, v, 0.0, positive=False, minimum=0.0)
        for v in limit
    )
    out = {}
    if lo:
        out["dt_clamp_min"] = lo
    if hi != math.inf:
        out["dt_clamp_max"] = hi
    return out


def write_time_step_limit(m) -> list[float]:
    """``time_step_limit`` of a ``mamba2`` mixer config: ``[dt_clamp_min, dt_clamp_max or inf]``."""
    return [m.dt_clamp_min, m.dt_clamp_max if m.dt_clamp_max is not None else math.inf]


def read_mixer(r: HFConfig, f: dict) -> None:
    """The ``mamba2`` mixer of every layer from :data:`MIXER_KEYS` (transformers' ``Mamba2Config`` defaults)."""
    d = f["d_model"]
    heads = r.number("num_heads", 128, integer=True)
    head_dim = r.number("head_dim", 64, integer=True)
    expand = r.number("expand", 2)
    groups = r.number("n_groups", 8, integer=True)
    inner = int(expand * d)
    if heads * head_dim != inner:
        r.error(
            "num_heads",
            f"num_heads · head_dim = {heads} · {head_dim} = {heads * head_dim} must equal "
            f"int(expand · hidden_size) = {inner}: transformers' Mamba2Mixer splits in_proj by both; change "
            "num_heads, head_dim or expand",
        )
    if heads % groups:
        r.error("n_groups", f"n_groups = {groups} does not divide num_heads = {heads}")
    if r.activation("hidden_act", "silu") != "silu":
        r.error(
            "hidden_act",
            "Mamba2Mixer's activation is silu in modkit's mamba2 (transformers reads the key, "
            "modkit does not support another)",
        )
    bias = r.flag("use_bias", False)
    mixer: dict[str, Any] = {
        "type": "mamba2",
        "d_state": r.number("state_size", 128, integer=True),
        "head_dim": head_dim,
        "d_inner": inner,
        "n_groups": groups,
        "d_conv": r.number("conv_kernel", 4, integer=True),
        "conv_bias": r.flag("use_conv_bias", True),
        "in_proj_bias": bias,
        "out_proj_bias": bias,
        "norm_eps": f["eps"],
        "chunk_size": r.number("chunk_size", 256, integer=True),
        "dt_init_min": r.number("time_step_min", 0.001),
        "dt_init_max": r.number("time_step_max", 0.1),
        "dt_init_floor": r.number("time_step_floor", 1e-4),
    }
    mixer.update(read_time_step_limit(r))
    f["mixer"] = mixer


def write_mixer(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """:data:`MIXER_KEYS` from the spec's ``mamba2`` mixer (``expand = d_inner / hidden_size``)."""
    m, d = f["mixer"], f["d_model"]
    inner = m.resolved_d_inner(d)
    expand = inner / d
    cfg.update(
        num_heads=inner // m.head_dim,
        head_dim=m.head_dim,
        state_size=m.d_state,
        expand=int(expand) if expand.is_integer() else expand,
        n_groups=m.n_groups,
        conv_kernel=m.d_conv,
        use_bias=m.in_proj_bias,
        use_conv_bias=m.conv_bias,
        hidden_act="silu",
        time_step_min=m.dt_init_min,
        time_step_max=m.dt_init_max,
        time_step_floor=m.dt_init_floor,
        chunk_size=m.chunk_size,
        time_step_limit=write_time_step_limit(m),
    )


B = "backbone.layers.{i}."

MAMBA2 = HFType(
    model_type=MODEL_TYPE,
    architecture="Mamba2ForCausalLM",
    notes=__doc__,
    # transformers Mamba2Config
    keys={
        "vocab_size": Key("vocab_size", 32768),
        "hidden_size": Key("d_model", 4096),
        "num_hidden_layers": Key("n_layers", 64),
        "layer_norm_epsilon": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.1, kind="number"),
        "num_heads": Own(MIXER_KEYS, "the mamba2 mixer of every layer (see the notes)", fields=("mixer",)),
        "residual_in_fp32": Ignore("the residual kept in float32 under half precision: the same network"),
        "rescale_prenorm_residual": Ignore("an initialisation option of out_proj"),
        "time_step_rank": Ignore("Mamba-1's Δ rank; Mamba2Mixer does not read it"),
    },
    fixed={
        "norm": "rmsnorm",
        "placement": {"type": "pre"},
        "ffn": None,
        "position": {"type": "none"},
        "max_seq_len": MAX_SEQ_LEN,
    },
    read_own=read_mixer,
    write_own=write_mixer,
    tensors=(
        W("embed.weight", "backbone.embeddings.weight"),
        W("final_norm.weight", "backbone.norm_f.weight"),
        W("layers.{i}.attn_norm.weight", B + "norm.weight"),
        *(W(f"layers.{{i}}.attention.{x}", B + f"mixer.{x}") for x in ("dt_bias", "A_log", "D", "norm.weight")),
        *(W(f"layers.{{i}}.attention.{x}.{{p}}", B + f"mixer.{x}.{{p}}") for x in ("in_proj", "conv1d", "out_proj")),
        Head(),
    ),
)

TYPE = MAMBA2
