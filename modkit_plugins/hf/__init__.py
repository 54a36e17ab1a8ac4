"""Hugging Face model types, each a short declarative file, registered through ``register_hf_converters``.

A model type is an :class:`HFType`: a table of ``config.json`` keys (mapped to the fields of the network, ignored,
or refused; :mod:`._keys`), the fields the type fixes, a table of checkpoint tensor names ↔ modkit names with their
layout transforms (:mod:`._weights`), and only the code really its own. Both directions come from the same tables:
``modkit.from_hf`` / ``modkit convert hf`` (config → spec, safetensors → state dict) and ``modkit.to_hf`` (spec →
``config.json``, state dict → Hugging Face names). A type derives from a neighbour like transformers' "modular"
files: ``QWEN3 = QWEN2.derive("qwen3", ...)`` replaces a few rows.

One module per model type (``MODEL_TYPE`` and ``TYPE``); shared pieces: ``_reader`` (the recording config reader),
``_rope`` (RoPE in both config forms), ``_keys`` (config table rows), ``_spec`` (fields → spec and back),
``_weights`` (weight table rows, transforms, the checkpoint mapper), ``_type`` (:class:`HFType`). Adding a model
type means adding a module here (or in any plugin: ``register(MY_TYPE)``); the core is untouched.

The model types are found, not listed: every module of this package whose name has no leading underscore and that
defines ``TYPE`` is one (:func:`type_modules`; :data:`MODULES` is their names), so a new type module needs no other
edit.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from modkit.plugin import hookimpl

from ._keys import (
    FirstDense,
    HeadDim,
    Ignore,
    Key,
    KVHeads,
    LayerTypes,
    Own,
    QwenWindows,
    Refuse,
    Rope,
    RopeByLayerType,
    Same,
    SlidingWindow,
    SparseStep,
    UseSlidingWindow,
    sizes,
)
from ._spec import FIELDS
from ._type import HFType
from ._weights import RENAME, Chain, Concat, FusedQKV, Head, PerHead, StackExperts, Transform, Transpose, W

__all__ = [
    "FIELDS",
    "FirstDense",
    "HFType",
    "HeadDim",
    "SparseStep",
    "UseSlidingWindow",
    "Ignore",
    "KVHeads",
    "Key",
    "LayerTypes",
    "Own",
    "QwenWindows",
    "Refuse",
    "Rope",
    "RopeByLayerType",
    "Same",
    "SlidingWindow",
    "sizes",
    "Chain",
    "Concat",
    "FusedQKV",
    "Head",
    "PerHead",
    "RENAME",
    "StackExperts",
    "Transform",
    "Transpose",
    "W",
    "MODULES",
    "register_hf_converters",
    "type_modules",
]


@functools.cache
def type_modules() -> tuple[str, ...]:
    """The names of this package's model-type modules, sorted: every module without a leading underscore that
    defines ``TYPE`` (each one is imported to find out).

    Raises:
        ImportError: a module of the package fails to import (the error of the module itself).
    """
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_") and not m.ispkg)
    return tuple(name for name in names if hasattr(importlib.import_module(f"{__name__}.{name}"), "TYPE"))


def __getattr__(name: str):
    """``MODULES``: the model-type module names of :func:`type_modules`, computed on first use.

    Raises:
        AttributeError: any other missing name.
    """
    if name == "MODULES":
        return type_modules()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@hookimpl
def register_hf_converters(register) -> None:
    """Register the ``TYPE`` of every model-type module of this package (:func:`type_modules`)."""
    for name in type_modules():
        register(importlib.import_module(f"{__name__}.{name}").TYPE)
