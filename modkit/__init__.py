"""modkit: compose decoder-only Transformer models from registered components described by JSON specs.

Public API::

    import modkit
    spec = modkit.load_spec("specs/tiny-llama.json")   # validated ModelSpec, or SpecError listing every problem
    model = modkit.build(spec, device="cpu", dtype="float32", seed=0)
    out = model(input_ids)                              # out.logits: [batch, seq, vocab_size]
    modkit.count_params(spec)                           # exact, built on meta
    modkit.from_hf_config(config_dict)                  # Hugging Face config.json -> ModelSpec
    model = modkit.from_hf("path/to/hf-model")          # config.json + safetensors -> Model with its weights
    modkit.to_hf(model, "out/")                         # Model -> Hugging Face folder transformers loads
    modkit.save(model, "ckpt/"); modkit.load("ckpt/")   # modkit's own format: spec.json + model.safetensors
    with modkit.inspect(model) as rec: model(input_ids) # rec["layers.0:update"], rec["layers.0.attention:weights"]
"""

from .build import active_params_per_token, breakdown, build, count_params, kv_cache_bytes_per_token, summarize
from .cache import KVCache, LayerKVCache
from .config import ComponentConfig, Slot
from .errors import CheckpointError, ModkitError, RegistryError, SpecError
from .checkpoint import load, save
from .hf import from_hf, from_hf_config, to_hf
from .hooks import hookimpl
from .inspection import Recording, inspect
from .interfaces import AttentionInputs, BuildContext, Init, PositionScheme, add_aux, run_ffn, split_aux
from .model import Model, ModelOutput
from .registry import Component, Registry, get_registry
from .spec import ModelSpec, SpecContext, json_schema, load_component, load_spec

__version__ = "0.1.0"

__all__ = [
    "AttentionInputs",
    "BuildContext",
    "CheckpointError",
    "Component",
    "ComponentConfig",
    "Init",
    "KVCache",
    "LayerKVCache",
    "Model",
    "ModelOutput",
    "ModelSpec",
    "ModkitError",
    "PositionScheme",
    "Recording",
    "Registry",
    "RegistryError",
    "Slot",
    "SpecContext",
    "SpecError",
    "active_params_per_token",
    "add_aux",
    "breakdown",
    "build",
    "count_params",
    "from_hf",
    "from_hf_config",
    "get_registry",
    "hookimpl",
    "inspect",
    "json_schema",
    "kv_cache_bytes_per_token",
    "load",
    "load_component",
    "load_spec",
    "run_ffn",
    "save",
    "split_aux",
    "summarize",
    "to_hf",
]
