"""Hugging Face ``olmo2`` → modkit: norms on the sublayer outputs (``reordered``) and full-width QK-norm.

Semantics: ``transformers/models/olmo2/{configuration,modeling}_olmo2.py``: each block computes
``x + post_attention_layernorm(attn(x))`` then ``x + post_feedforward_layernorm(mlp(x))`` (no input norm);
``q_norm``/``k_norm`` are RMSNorms over the whole q (``n_heads * head_dim``) and k (``n_kv_heads * head_dim``)
projections, before RoPE; ``attention_bias`` sets all four projection biases.
"""

from __future__ import annotations

from ._weights import W
from .llama import LLAMA, L

MODEL_TYPE = "olmo2"

OLMO2 = LLAMA.derive(
    MODEL_TYPE,
    architecture="Olmo2ForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    # transformers Olmo2Config defaults
    defaults={"vocab_size": 50304, "rms_norm_eps": 1e-5},
    fixed={"qk_norm": "full", "placement": {"type": "reordered"}},
    tensors=(
        W("layers.{i}.attn_post_norm.weight", L + "post_attention_layernorm.weight"),
        W("layers.{i}.ffn_post_norm.weight", L + "post_feedforward_layernorm.weight"),
    ),
    drop_tensors=("layers.{i}.attn_norm.weight", "layers.{i}.ffn_norm.weight"),
)

TYPE = OLMO2
