"""Everything a plugin author imports: one module for components, converters and their helpers.

A component package imports from here (and runs :mod:`modkit.testing` on itself); it never needs to know where
in modkit a name is defined, so the core can move things without breaking plugins. The built-in plugins in
``modkit_plugins/`` import from here too, exactly as a third-party package does::

    from modkit.plugin import BuildContext, Component, ComponentConfig, Init, hookimpl

What is here, by use:

* **registering**: :data:`hookimpl` (pluggy's marker for ``register_components`` and the other hooks of
  :mod:`modkit.core.hooks`), :class:`Component` (one registry entry: kind, type, config class, factory,
  capabilities), :class:`ComponentConfig` and :class:`StrictModel` (pydantic bases, ``extra="forbid"``),
  :func:`Slot` (a field holding another component);
* **the contracts** a component's forward pass meets (:mod:`modkit.core.interfaces`): :class:`BuildContext`,
  :class:`AttentionInputs`, :class:`PositionGeometry`, :class:`PositionScheme`, :class:`Init`, :func:`run_ffn`,
  :func:`split_aux`, :func:`add_aux`, :func:`dropout`, and the parameter :data:`ROLES`;
* **declared decode state** (:mod:`modkit.nn.cache`): :class:`CacheSpec`, :class:`CacheEntry`;
* **the residual stream** (:mod:`modkit.nn.stream`): :class:`ResidualStream` (a ``stream`` component's base) and
  :func:`stream_of` (the stream a placement that declares ``streams`` is built with);
* **attention helpers** (:mod:`modkit.nn.attention`): :func:`attention_mask`, :func:`prepare_mask`
  (:class:`PreparedMask`), :func:`masked_attention`, :func:`masked_softmax`, :func:`position_bias`,
  :func:`is_plain_causal`, :func:`update_cache`, :func:`update_cache_entries`, :func:`shared_kv`,
  :func:`position_geometry`; :class:`KVReader` (an attention a layer of spec ``kv_sharing`` may use to read
  another layer's keys and values);
* **recurrent helpers** (:mod:`modkit.nn.recurrent`): :func:`causal_conv`, :func:`padding_mask`,
  :func:`zero_padding`, :class:`GatedRMSNorm`, and for document boundaries :func:`document_starts`,
  :func:`chunk_boundaries` (:class:`ChunkBoundaries`);
* **costs** (:mod:`modkit.analysis.cost`): :class:`Workload`, :func:`elementwise`, :func:`declared_flops`; the
  grouped GEMM of mixtures of experts, :func:`grouped_mm`; the products of a decode step over a latent cache,
  :func:`latent_scores` and :func:`latent_sum` (oneDNN on float32 CPU sequences, one at a time; ``bmm`` otherwise); the
  tensor-parallel helper :func:`shared_by_heads`;
* **bounded config fields** (:mod:`modkit.core.limits`): :data:`HeadCount`, :data:`HeadDim`, :data:`FFNWidth`,
  :data:`ExpertCount`, :data:`SeqLen` and the ``MAX_*`` bounds behind them; bounded floats :data:`Multiplier`,
  :data:`RopeFactor`, :data:`Epsilon`, :data:`LossCoef`, :data:`StepSize` and :func:`bounded_float` (a float without
  an upper bound lets a spec validate and then make a model that is not finite);
* **error messages** that name a field and a value (:mod:`modkit.core.validation`): :func:`json_value`,
  :func:`join_path`, :func:`last_key`; the errors :class:`SpecError`, :class:`CheckpointError`,
  :class:`UnknownConfigKeyWarning`;
* **sampling processors and optimizers**: :class:`LogitsProcessor`, :class:`StopCondition`,
  :class:`GenerationState`; :class:`OptimizerSetup`, :class:`OptimizerChain`;
* **experiment trackers** (:mod:`modkit.train.trackers`): :class:`Tracker`, :class:`TrackerSetup`,
  :class:`TrackerError`, :func:`missing_package`, :func:`scalars`, :func:`flat_params`;
* **model-type converters** (Hugging Face): :class:`Link`, :func:`strict_conversion`, :func:`load_spec`,
  :func:`get_registry`.

Names load on first use (:mod:`modkit.core._lazy`), so importing this module costs nothing until a name is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core._lazy import make_lazy

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from modkit.analysis.cost import Workload, declared_flops, elementwise
    from modkit.core.config import ComponentConfig, Slot, StrictModel
    from modkit.core.errors import CheckpointError, SpecError, UnknownConfigKeyWarning
    from modkit.core.hooks import hookimpl
    from modkit.core.interfaces import (
        AttentionInputs,
        BuildContext,
        Init,
        PositionGeometry,
        PositionScheme,
        add_aux,
        dropout,
        run_ffn,
        split_aux,
    )
    from modkit.core.limits import (
        MAX_D_FF,
        MAX_D_MODEL,
        MIN_DT,
        MAX_DT,
        MIN_EPS,
        MAX_EPS,
        MAX_DT_CLAMP,
        MAX_EXPAND,
        MAX_EXPERTS,
        MAX_HEAD_DIM,
        MAX_HEADS,
        MAX_LAYERS,
        MAX_LOSS_COEF,
        MAX_MSCALE,
        MAX_MULTIPLIER,
        MAX_ROPE_FACTOR,
        MAX_SEQ_LEN,
        MAX_SOFTCAP,
        MAX_THETA,
        MAX_VOCAB_SIZE,
        MIN_SOFTCAP,
        MIN_SOFTMAX_SCALE,
        MIN_THETA,
        Epsilon,
        ExpertCount,
        FFNWidth,
        HeadCount,
        HeadDim,
        LossCoef,
        Multiplier,
        RopeFactor,
        SoftmaxScale,
        SeqLen,
        StepSize,
        bounded_float,
    )
    from modkit.core.registry import Component, get_registry
    from modkit.core.roles import ROLES
    from modkit.core.validation import join_path, json_value, last_key
    from modkit.inference.sampling import GenerationState, LogitsProcessor, StopCondition
    from modkit.io.checkpoint import Link
    from modkit.io.hf import strict_conversion
    from modkit.nn.attention import (
        PreparedMask,
        attention_mask,
        is_plain_causal,
        masked_attention,
        masked_softmax,
        position_bias,
        prepare_mask,
        shared_kv,
        update_cache,
        update_cache_entries,
    )
    from modkit.nn.cache import CacheEntry, CacheSpec
    from modkit.nn.grouped import grouped_mm
    from modkit.nn.onednn import latent_scores, latent_sum
    from modkit.nn.sharing import KVReader
    from modkit.nn.stream import ResidualStream, layer_input, placement_stream_flops, stream_of
    from modkit.nn.recurrent import (
        ChunkBoundaries,
        GatedRMSNorm,
        RECURRENT_CAPABILITIES,
        causal_conv,
        chunk_boundaries,
        document_starts,
        padding_mask,
        zero_padding,
    )
    from modkit.parallel import shared_by_heads
    from modkit.spec import load_spec, position_geometry
    from modkit.train.optim import OptimizerChain, OptimizerSetup
    from modkit.train.trackers import Tracker, TrackerError, TrackerSetup, flat_params, missing_package, scalars

#: exported name -> the module defining it (the same names as the imports above; tests/core/test_package_imports.py
#: checks that they agree)
_EXPORTS = {
    **dict.fromkeys(("Workload", "declared_flops", "elementwise"), "modkit.analysis.cost"),
    **dict.fromkeys(("ComponentConfig", "Slot", "StrictModel"), "modkit.core.config"),
    **dict.fromkeys(("CheckpointError", "SpecError", "UnknownConfigKeyWarning"), "modkit.core.errors"),
    "hookimpl": "modkit.core.hooks",
    **dict.fromkeys(
        (
            "AttentionInputs",
            "BuildContext",
            "Init",
            "PositionGeometry",
            "PositionScheme",
            "add_aux",
            "dropout",
            "run_ffn",
            "split_aux",
        ),
        "modkit.core.interfaces",
    ),
    **dict.fromkeys(
        (
            "MAX_D_FF",
            "MAX_D_MODEL",
            "MIN_DT",
            "MAX_DT",
            "MIN_EPS",
            "MAX_EPS",
            "MAX_DT_CLAMP",
            "MAX_EXPAND",
            "MAX_EXPERTS",
            "MAX_HEAD_DIM",
            "MAX_HEADS",
            "MAX_LAYERS",
            "MAX_LOSS_COEF",
            "MAX_MSCALE",
            "MAX_MULTIPLIER",
            "MAX_ROPE_FACTOR",
            "MAX_SEQ_LEN",
            "MAX_SOFTCAP",
            "MAX_THETA",
            "MAX_VOCAB_SIZE",
            "MIN_SOFTCAP",
            "MIN_SOFTMAX_SCALE",
            "MIN_THETA",
            "Epsilon",
            "ExpertCount",
            "FFNWidth",
            "HeadCount",
            "HeadDim",
            "LossCoef",
            "Multiplier",
            "RopeFactor",
            "SoftmaxScale",
            "SeqLen",
            "StepSize",
            "bounded_float",
        ),
        "modkit.core.limits",
    ),
    **dict.fromkeys(("Component", "get_registry"), "modkit.core.registry"),
    "ROLES": "modkit.core.roles",
    **dict.fromkeys(("join_path", "json_value", "last_key"), "modkit.core.validation"),
    **dict.fromkeys(("GenerationState", "LogitsProcessor", "StopCondition"), "modkit.inference.sampling"),
    "Link": "modkit.io.checkpoint",
    "strict_conversion": "modkit.io.hf",
    **dict.fromkeys(
        (
            "PreparedMask",
            "attention_mask",
            "is_plain_causal",
            "masked_attention",
            "masked_softmax",
            "position_bias",
            "prepare_mask",
            "shared_kv",
            "update_cache",
            "update_cache_entries",
        ),
        "modkit.nn.attention",
    ),
    **dict.fromkeys(("CacheEntry", "CacheSpec"), "modkit.nn.cache"),
    "grouped_mm": "modkit.nn.grouped",
    **dict.fromkeys(("latent_scores", "latent_sum"), "modkit.nn.onednn"),
    "KVReader": "modkit.nn.sharing",
    **dict.fromkeys(("ResidualStream", "layer_input", "placement_stream_flops", "stream_of"), "modkit.nn.stream"),
    **dict.fromkeys(
        (
            "ChunkBoundaries",
            "GatedRMSNorm",
            "RECURRENT_CAPABILITIES",
            "causal_conv",
            "chunk_boundaries",
            "document_starts",
            "padding_mask",
            "zero_padding",
        ),
        "modkit.nn.recurrent",
    ),
    "shared_by_heads": "modkit.parallel",
    **dict.fromkeys(("load_spec", "position_geometry"), "modkit.spec"),
    **dict.fromkeys(("OptimizerChain", "OptimizerSetup"), "modkit.train.optim"),
    **dict.fromkeys(
        ("Tracker", "TrackerError", "TrackerSetup", "flat_params", "missing_package", "scalars"),
        "modkit.train.trackers",
    ),
}

__all__ = sorted(_EXPORTS)

make_lazy(__name__, _EXPORTS)
