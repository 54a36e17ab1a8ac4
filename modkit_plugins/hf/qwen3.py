"""Hugging Face ``qwen3`` → modkit: Qwen2's layout with per-head QK-RMSNorm and a free ``head_dim``.

Semantics: ``transformers/models/qwen3/{configuration,modeling}_qwen3.py``: ``q_norm``/``k_norm`` are RMSNorms
over ``head_dim`` applied before RoPE; ``attention_bias`` sets all four projection biases; ``head_dim`` defaults
to 128 (not ``hidden_size // num_attention_heads``); sliding windows as in Qwen2.
"""

from __future__ import annotations

from ._keys import Key
from .qwen2 import QWEN2

MODEL_TYPE = "qwen3"

QWEN3 = QWEN2.derive(
    MODEL_TYPE,
    architecture="Qwen3ForCausalLM",
    notes=__doc__,
    drop=("use_mrope",),
    defaults={"head_dim": 128},  # transformers Qwen3Config
    keys={"attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag")},
    fixed={"qkv_bias": False, "qk_norm": "head"},
)

TYPE = QWEN3
