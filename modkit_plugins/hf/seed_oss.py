"""Hugging Face ``seed_oss`` (ByteDance Seed-OSS) → modkit: Llama with separate bias flags for the q/k/v and the
output projections, a free ``head_dim`` and residual dropout.

Semantics: ``transformers/models/seed_oss/{configuration,modeling}_seed_oss.py``: ``attention_bias`` (default
true) sets the q, k and v projection biases, ``attention_out_bias`` (default false) the output projection's,
``mlp_bias`` the SwiGLU MLP's three; ``head_dim`` defaults to 128 (null: ``hidden_size // num_attention_heads``);
``residual_dropout`` drops the output of each sublayer (after ``o_proj`` and after ``down_proj``),
``attention_dropout`` the attention probabilities; one RoPE for every layer (base 10000).
"""

from __future__ import annotations

from ._keys import HeadDim, Key, KVHeads
from .llama import LLAMA

MODEL_TYPE = "seed_oss"

SEED_OSS = LLAMA.derive(
    MODEL_TYPE,
    architecture="SeedOssForCausalLM",
    notes=__doc__,
    # transformers SeedOssConfig defaults
    defaults={
        "vocab_size": 155136,
        "intermediate_size": 27648,
        "num_hidden_layers": 64,
        "num_attention_heads": 80,
        "max_position_embeddings": 524288,
    },
    keys={
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(128),
        "attention_bias": Key("qkv_bias", True, kind="flag", note="the q, k and v projections"),
        "attention_out_bias": Key("o_bias", False, kind="flag", note="the output projection"),
        "attention_dropout": Key("dropout_attention", 0.1, kind="prob"),
        "residual_dropout": Key("dropout_residual", 0.1, kind="prob"),
    },
)

TYPE = SEED_OSS
