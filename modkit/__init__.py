"""modkit: compose decoder-only Transformer models from registered components described by JSON specs.

Public API::

    import modkit
    spec = modkit.load_spec("specs/tiny-llama.json")   # validated ModelSpec, or SpecError listing every problem
    model = modkit.build(spec, device="cpu", dtype="float32", seed=0)
    out = model(input_ids)                              # out.logits: [batch, seq, vocab_size]
    modkit.count_params(spec)                           # exact, built on meta
    modkit.CostModel(spec).per_token("decode", 8192)    # FLOPs per token by part, from the components' declarations
    modkit.from_hf_config(config_dict)                  # Hugging Face config.json -> ModelSpec
    model = modkit.from_hf("path/to/hf-model")          # config.json + safetensors -> Model with its weights
    modkit.to_hf(model, "out/")                         # Model -> Hugging Face folder transformers loads
    modkit.save(model, "ckpt/"); modkit.load("ckpt/")   # modkit's own format: spec.json + model.safetensors
    modkit.resize_vocab(model, 32_100)                  # new token ids: old rows kept, new ones the mean, tie kept
    with modkit.inspect(model) as rec: model(input_ids) # rec["layers.0:update"], rec["layers.0.attention:weights"]

For component authors: :class:`Component`, :class:`ComponentConfig`, :func:`Slot`, :func:`hookimpl`, the contracts
in :mod:`modkit.core.interfaces`, and the attention helpers of :mod:`modkit.nn.attention` (the mask from positions,
token mask and window; the dead-row guard; the KV-cache update) that the built-in attention uses too.

The names load on first use (:mod:`modkit.core._lazy`): ``import modkit`` and light submodules such as :mod:`modkit.cli`
and :mod:`modkit.core.errors` do not import torch; ``modkit.build`` does, the first time it is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core import moved
from modkit.core._lazy import make_lazy

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use
    from modkit.nn.attention import (
        PreparedMask,
        attention_mask,
        is_plain_causal,
        masked_attention,
        masked_softmax,
        position_bias,
        prepare_mask,
        update_cache,
        update_cache_entries,
    )
    from modkit.nn.build import (
        active_params_per_token,
        breakdown,
        build,
        count_params,
        kv_cache_bytes_per_token,
        summarize,
    )
    from modkit.nn.cache import CacheEntry, CacheSpec, KVCache, LayerKVCache, MixerCache
    from modkit.core.config import ComponentConfig, Slot
    from modkit.analysis.cost import CostError, CostModel, Workload, elementwise, flops_per_token
    from modkit.core.errors import (
        CheckpointError,
        ModkitError,
        RegistryError,
        SamplingError,
        SpecError,
        SpecWarning,
        UnknownConfigKeyWarning,
    )
    from modkit.io.checkpoint import load, save
    from modkit.io.hf import from_hf, from_hf_config, to_hf
    from modkit.core.hooks import hookimpl
    from modkit.analysis.inspection import Recording, inspect
    from modkit.core.interfaces import (
        AttentionInputs,
        BuildContext,
        Init,
        PositionGeometry,
        PositionScheme,
        add_aux,
        run_ffn,
        split_aux,
    )
    from modkit.nn.model import Model, ModelOutput
    from modkit.core.registry import Component, Registry, get_registry
    from .spec import ModelSpec, SpecContext, json_schema, load_component, load_spec

#: exported name -> the module defining it (the same names as the imports above, checked by tests/cli/test_cli.py)
_EXPORTS = {
    **dict.fromkeys(
        (
            "PreparedMask",
            "attention_mask",
            "is_plain_causal",
            "masked_attention",
            "masked_softmax",
            "position_bias",
            "prepare_mask",
            "update_cache",
            "update_cache_entries",
        ),
        "modkit.nn.attention",
    ),
    **dict.fromkeys(
        ("active_params_per_token", "breakdown", "build", "count_params", "kv_cache_bytes_per_token", "summarize"),
        "modkit.nn.build",
    ),
    **dict.fromkeys(("CacheEntry", "CacheSpec", "KVCache", "LayerKVCache", "MixerCache"), "modkit.nn.cache"),
    **dict.fromkeys(("ComponentConfig", "Slot"), "modkit.core.config"),
    **dict.fromkeys(("CostError", "CostModel", "Workload", "elementwise", "flops_per_token"), "modkit.analysis.cost"),
    **dict.fromkeys(
        (
            "CheckpointError",
            "ModkitError",
            "RegistryError",
            "SamplingError",
            "SpecError",
            "SpecWarning",
            "UnknownConfigKeyWarning",
        ),
        "modkit.core.errors",
    ),
    **dict.fromkeys(("load", "save"), "modkit.io.checkpoint"),
    **dict.fromkeys(("from_hf", "from_hf_config", "to_hf"), "modkit.io.hf"),
    **dict.fromkeys(("hookimpl",), "modkit.core.hooks"),
    **dict.fromkeys(("Recording", "inspect"), "modkit.analysis.inspection"),
    **dict.fromkeys(
        (
            "AttentionInputs",
            "BuildContext",
            "Init",
            "PositionGeometry",
            "PositionScheme",
            "add_aux",
            "run_ffn",
            "split_aux",
        ),
        "modkit.core.interfaces",
    ),
    **dict.fromkeys(("Model", "ModelOutput"), "modkit.nn.model"),
    **dict.fromkeys(("Component", "Registry", "get_registry"), "modkit.core.registry"),
    **dict.fromkeys(("ModelSpec", "SpecContext", "json_schema", "load_component", "load_spec"), "modkit.spec"),
}


def resize_vocab(model: Model, vocab_size: int, *, init: str = "mean", seed: int = 0) -> Model:
    """Grow or shrink ``model``'s vocabulary in place, keeping the old rows and the tie (:meth:`Model.resize_vocab`)."""
    return model.resize_vocab(vocab_size, init=init, seed=seed)


__version__ = "0.1.0"

__all__ = [
    "AttentionInputs",
    "BuildContext",
    "CacheEntry",
    "CacheSpec",
    "CheckpointError",
    "Component",
    "ComponentConfig",
    "CostError",
    "CostModel",
    "Init",
    "KVCache",
    "LayerKVCache",
    "MixerCache",
    "Model",
    "ModelOutput",
    "ModelSpec",
    "ModkitError",
    "PositionGeometry",
    "PositionScheme",
    "PreparedMask",
    "Recording",
    "Registry",
    "RegistryError",
    "SamplingError",
    "Slot",
    "SpecContext",
    "SpecError",
    "SpecWarning",
    "Workload",
    "active_params_per_token",
    "add_aux",
    "attention_mask",
    "breakdown",
    "build",
    "count_params",
    "elementwise",
    "flops_per_token",
    "from_hf",
    "from_hf_config",
    "get_registry",
    "hookimpl",
    "inspect",
    "is_plain_causal",
    "json_schema",
    "kv_cache_bytes_per_token",
    "load",
    "load_component",
    "load_spec",
    "masked_attention",
    "masked_softmax",
    "position_bias",
    "prepare_mask",
    "resize_vocab",
    "run_ffn",
    "save",
    "split_aux",
    "summarize",
    "to_hf",
    "update_cache",
    "update_cache_entries",
    "UnknownConfigKeyWarning",
]

make_lazy(__name__, _EXPORTS)
moved.install()  # the import paths of 0.1 (modkit.cache, modkit.cost, ...) keep working, with a DeprecationWarning
