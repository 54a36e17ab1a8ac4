"""Hugging Face ``qwen2`` → modkit: Mistral with q/k/v biases and sliding windows only on chosen layers.

Semantics: ``transformers/models/qwen2/{configuration,modeling}_qwen2.py``: q/k/v projections always carry a
bias, the output projection never; ``sliding_window`` is used only with ``use_sliding_window``, then on the
layers that ``layer_types`` marks ``sliding_attention`` or, in files without ``layer_types``, on every layer
from ``max_window_layers`` on. Those layers become per-layer overrides.
"""

from __future__ import annotations

from ._keys import QwenWindows, Refuse
from .mistral import MISTRAL

MODEL_TYPE = "qwen2"

QWEN2 = MISTRAL.derive(
    MODEL_TYPE,
    architecture="Qwen2ForCausalLM",
    notes=__doc__,
    # transformers Qwen2Config defaults
    defaults={
        "vocab_size": 151936,
        "intermediate_size": 22016,
        "num_key_value_heads": 32,
        "max_position_embeddings": 32768,
    },
    keys={
        "sliding_window": QwenWindows(4096, max_window_layers=28),
        "use_mrope": Refuse(False, "multimodal rotary sections (Qwen2-VL) are not supported"),
    },
    fixed={"qkv_bias": True},
)

TYPE = QWEN2
