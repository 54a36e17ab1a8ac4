"""Hugging Face ``mistral`` → modkit: Llama with GQA defaults and one sliding window on every layer.

Semantics: ``transformers/models/mistral/{configuration,modeling}_mistral.py``: no attention or MLP biases;
``sliding_window`` (default 4096, ``null`` for global attention) applies to every layer.
"""

from __future__ import annotations

from ._keys import SlidingWindow
from .llama import LLAMA

MODEL_TYPE = "mistral"

MISTRAL = LLAMA.derive(
    MODEL_TYPE,
    architecture="MistralForCausalLM",
    notes=__doc__,
    drop=("attention_bias", "mlp_bias", "pretraining_tp"),
    # transformers MistralConfig defaults
    defaults={"intermediate_size": 14336, "num_key_value_heads": 8, "max_position_embeddings": 4096 * 32},
    keys={"sliding_window": SlidingWindow(4096)},
)

TYPE = MISTRAL
