"""Model specs: strict JSON documents validated by pydantic models built from the live registry.

A spec describes a decoder-only Transformer: model-wide sizes, a position scheme, one ``block`` (token mixer,
ffn, norm, placement) used by every layer, optional per-layer ``overrides`` and the model head. The token mixer is
written ``mixer`` or ``attention`` (the same slot: any attention or recurrent mixer,
:data:`~modkit.core.config.MIXER_KINDS`), so a hybrid is a block plus overrides (Gated DeltaNet everywhere,
attention every fourth layer); a block's ``ffn`` may be ``null`` (Mamba-2's blocks are a mixer alone). Each component
slot is a discriminated union on ``type`` over every registered component of that kind, built *after*
plugins load, so a third-party component validates exactly like a built-in. Specs never name Python import
paths: component names resolve only through the registry.

Errors are collected into one :class:`~modkit.core.errors.SpecError` listing every ``(path, message)``.

The package's modules, by what they do: :mod:`~modkit.spec.models` (the pydantic models of a spec),
:mod:`~modkit.spec.unions` (the live model, its slots unions over the registry), :mod:`~modkit.spec.checks` and
:mod:`~modkit.spec.geometry` (cross-field checks), :mod:`~modkit.spec.errors` (error messages) and
:mod:`~modkit.spec.load` (reading specs and component configs). Every name is importable from ``modkit.spec``.
"""

from __future__ import annotations

from modkit.spec.geometry import position_geometry
from modkit.spec.load import json_schema, load_component, load_spec
from modkit.spec.models import (
    MIXER_KEYS,
    SCHEMA_VERSION,
    BlockSpec,
    DropoutSpec,
    LayerIndex,
    LayerOverride,
    LayerRange,
    LayerSpec,
    ModelSpec,
    SpecContext,
    iter_configs,
    slot_path,
)
from modkit.spec.unions import slot_type, spec_model

__all__ = [
    "MIXER_KEYS",
    "SCHEMA_VERSION",
    "BlockSpec",
    "DropoutSpec",
    "LayerIndex",
    "LayerOverride",
    "LayerRange",
    "LayerSpec",
    "ModelSpec",
    "SpecContext",
    "iter_configs",
    "json_schema",
    "load_component",
    "load_spec",
    "position_geometry",
    "slot_path",
    "slot_type",
    "spec_model",
]
