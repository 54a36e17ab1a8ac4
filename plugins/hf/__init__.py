"""Hugging Face config converters (one module per model type), registered through ``register_hf_converters``."""

from __future__ import annotations

from modkit import hookimpl


@hookimpl
def register_hf_converters(register) -> None:
    """Register a converter for every supported Hugging Face ``model_type``."""
    from . import llama

    for model_type, fn in llama.CONVERTERS.items():
        register(model_type, fn)
