"""Hugging Face ``glm4`` → modkit: sandwich-norm blocks (RMSNorm), GQA with q/k/v biases, interleaved partial RoPE
and a fused gate/up SwiGLU.

Semantics: ``transformers/models/glm4/{configuration,modeling}_glm4.py`` (``Glm4DecoderLayer``): each block is
``x + post_self_attn_layernorm(attn(input_layernorm(x)))`` then ``x + post_mlp_layernorm(mlp(post_attention_layernorm(x)))``
(modkit's ``sandwich``); ``attention_bias`` (default true) biases q, k and v, never the output projection
(``GlmAttention``); RoPE rotates the first ``partial_rotary_factor`` (default 0.5) of each head in *interleaved*
pairs (``glm.rotate_half``: features 2i and 2i + 1), which is also the checkpoint's layout; the MLP is Phi-3's,
``gate_up_proj`` holding gate then up. ``head_dim`` defaults to 128.
"""

from __future__ import annotations

from ._keys import Key, Rope
from ._weights import Concat, W
from .llama import LLAMA, L

MODEL_TYPE = "glm4"

F = "layers.{i}.ffn."

GLM4 = LLAMA.derive(
    MODEL_TYPE,
    architecture="Glm4ForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    # transformers Glm4Config defaults
    defaults={
        "vocab_size": 151552,
        "intermediate_size": 13696,
        "num_hidden_layers": 40,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 0.00000015625,
    },
    keys={
        "attention_bias": Key("qkv_bias", True, kind="flag", note="q, k and v (never the output projection)"),
        "rope_theta": Rope(10000.0, partial=0.5, always_partial=True, layout="interleaved"),
    },
    fixed={"placement": {"type": "sandwich"}},
    tensors=(
        W("layers.{i}.attn_post_norm.weight", L + "post_self_attn_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.weight"),
        W("layers.{i}.ffn_post_norm.weight", L + "post_mlp_layernorm.weight"),
        W((F + "gate.weight", F + "up.weight"), L + "mlp.gate_up_proj.weight", Concat()),
    ),
    checkpoint_layout="interleaved",
)

TYPE = GLM4
