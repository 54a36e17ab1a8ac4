"""Hugging Face config converters (one module per model type), registered through ``register_hf_converters``.

Each module exposes ``MODEL_TYPE`` and ``convert(cfg: dict) -> dict`` (a modkit spec dict). Shared pieces live
in ``_common`` (config reader that refuses unknown fields, RoPE reader, spec builders) and in ``llama``
(the builder of the Llama family: Llama, Mistral, Mixtral, Qwen2, Qwen3, OLMo 2, OLMoE, Phi-3).
"""

from __future__ import annotations

import importlib

from modkit import hookimpl

#: converter modules of this package, one per Hugging Face ``model_type``
MODULES = (
    "falcon",
    "gemma3_text",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "olmoe",
    "phi",
    "phi3",
    "qwen2",
    "qwen3",
)


@hookimpl
def register_hf_converters(register) -> None:
    """Register a converter for every supported Hugging Face ``model_type``."""
    for name in MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        register(module.MODEL_TYPE, module.convert)
