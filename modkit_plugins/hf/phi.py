"""Hugging Face ``phi`` (Phi-1, Phi-1.5, Phi-2) → modkit.

Semantics: ``transformers/models/phi/{configuration,modeling}_phi.py``: ``parallel`` blocks with one shared
LayerNorm (``x + attn(ln(x)) + mlp(ln(x))``); q/k/v and ``dense`` projections all biased; optional per-head
LayerNorm QK-norm (``qk_layernorm``, with bias, over ``hidden_size // num_attention_heads``); RoPE on the first
``partial_rotary_factor`` (default 0.5) of each head, half-split pairs; MLP ``fc1``/``fc2`` with biases and
``hidden_act`` (``gelu_new`` is the tanh GELU); final LayerNorm; LM head with a bias, untied by default.
"""

from __future__ import annotations

from ._keys import HeadDim, Key, KVHeads, Rope, sizes
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "phi"

L = "model.layers.{i}."

PHI = HFType(
    model_type=MODEL_TYPE,
    architecture="PhiForCausalLM",
    notes=__doc__,
    # transformers PhiConfig
    keys={
        **sizes(
            vocab_size=51200,
            hidden_size=2048,
            num_hidden_layers=24,
            num_attention_heads=32,
            max_position_embeddings=2048,
        ),
        "head_dim": HeadDim(
            derived="Phi's QK-norm and rotary sizes assume head_dim = hidden_size // num_attention_heads"
        ),
        "num_key_value_heads": KVHeads(),
        "intermediate_size": Key("d_ff", 8192),
        "hidden_act": Key("act", "gelu_new", kind="act", tanh="gelu_new"),
        "layer_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "qk_layernorm": Key(
            "qk_norm",
            False,
            kind="flag",
            read_as=lambda v, f: "head" if v else None,
            write_as=lambda v, f: v is not None,
            note="per-head LayerNorm of q and k",
        ),
        "rope_theta": Rope(10000.0, partial=0.5, always_partial=True),
        "embd_pdrop": Key("dropout_embedding", 0.0, kind="prob"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "resid_pdrop": Key("dropout_residual", 0.0, kind="prob"),
    },
    fixed={
        "norm": "layernorm",
        "placement": {"type": "parallel", "shared_norm": True},
        "ffn": "mlp",
        "mlp_bias": True,
        "qkv_bias": True,
        "o_bias": True,
        "lm_head_bias": True,
    },
    tensors=(
        W("embed.weight", "model.embed_tokens.weight"),
        W("final_norm.{p}", "model.final_layernorm.{p}"),
        W("layers.{i}.attn_norm.{p}", L + "input_layernorm.{p}"),
        *(W(f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkv"),
        W("layers.{i}.attention.o_proj.{p}", L + "self_attn.dense.{p}"),
        *(W(f"layers.{{i}}.attention.{x}_norm.{{p}}", L + f"self_attn.{x}_layernorm.{{p}}") for x in "qk"),
        W("layers.{i}.ffn.up.{p}", L + "mlp.fc1.{p}"),
        W("layers.{i}.ffn.down.{p}", L + "mlp.fc2.{p}"),
        W("lm_head.bias", "lm_head.bias"),
        W("lm_head_bias", "lm_head.bias"),
        Head(),
    ),
)

TYPE = PHI
