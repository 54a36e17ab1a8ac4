"""Hugging Face config converters (one module per model type), registered through ``register_hf_converters``.

Each module exposes ``MODEL_TYPE``, ``convert(cfg: dict) -> dict`` (a modkit spec dict, with
``metadata.hf_model_type``) and ``WEIGHTS``, its checkpoint mapper (:class:`._weights.HFWeights`: the table of
Hugging Face tensor names ↔ modkit ``state_dict`` names, fused-tensor splits, the reverse config conversion). Shared
pieces live in ``_common`` (config reader that drops unknown fields with a warning, or refuses them when strict;
RoPE reader, spec builders), ``_weights`` (name tables, fused links, RoPE layout permutation, reverse-conversion
check) and ``llama`` (the builder of the Llama family: Llama, Mistral, Mixtral, Qwen2, Qwen3, OLMo 2, OLMoE, Phi-3);
``gemma2`` reuses Gemma 3's tensor names. Adding a model type means adding a module here; the core is untouched.
"""

from __future__ import annotations

import importlib

from modkit import hookimpl

#: converter modules of this package, one per Hugging Face ``model_type``
MODULES = (
    "bert",
    "falcon",
    "gemma2",
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
        register(module.MODEL_TYPE, module.convert, weights=getattr(module, "WEIGHTS", None))
