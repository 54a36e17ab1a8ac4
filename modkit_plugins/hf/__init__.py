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
"""

from __future__ import annotations

import importlib

from modkit.plugin import hookimpl

from ._keys import (FirstDense, HeadDim, Ignore, Key, KVHeads, LayerTypes, Own, QwenWindows, Refuse, Rope, RopeByLayerType,
                    Same, SlidingWindow, SparseStep, UseSlidingWindow, sizes)
from ._spec import FIELDS
from ._type import HFType
from ._weights import RENAME, Chain, Concat, FusedQKV, Head, PerHead, StackExperts, Transform, Transpose, W

#: converter modules of this package, one per Hugging Face ``model_type``
MODULES = (
    "bert",
    "cohere",
    "deepseek_v3",
    "falcon",
    "falcon_h1",
    "gemma",
    "gemma2",
    "gemma3_text",
    "glm4",
    "gpt2",
    "gpt_neox",
    "gpt_oss",
    "granite",
    "jamba",
    "llama",
    "llama4_text",
    "mamba2",
    "mistral",
    "mixtral",
    "olmo2",
    "olmo3",
    "olmoe",
    "phi",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "smollm3",
    "starcoder2",
)

__all__ = [
    "FIELDS", "FirstDense", "HFType", "HeadDim", "SparseStep", "UseSlidingWindow", "Ignore", "KVHeads", "Key", "LayerTypes", "Own", "QwenWindows", "Refuse", "Rope",
    "RopeByLayerType", "Same", "SlidingWindow", "sizes", "Chain", "Concat", "FusedQKV", "Head", "PerHead", "RENAME", "StackExperts",
    "Transform", "Transpose", "W", "MODULES", "register_hf_converters",
]


@hookimpl
def register_hf_converters(register) -> None:
    """Register every model type of :data:`MODULES` (``register(TYPE)``)."""
    for name in MODULES:
        register(importlib.import_module(f"{__name__}.{name}").TYPE)
