"""Hugging Face ``llama`` → modkit: pre-norm RMSNorm blocks, GQA with RoPE, SwiGLU MLP.

Semantics: ``transformers/models/llama/{configuration,modeling}_llama.py``: ``attention_bias`` sets all four
projection biases, ``mlp_bias`` the three MLP biases; ``head_dim`` defaults to ``hidden_size //
num_attention_heads``; ``num_key_value_heads`` to ``num_attention_heads``; one RoPE (``rope_parameters``, or
``rope_theta`` + ``rope_scaling``) for every layer. ``pretraining_tp`` only emulates Meta's tensor-parallel matmul
slicing (numerically the same model).

The base of most of the family: Mistral, Mixtral, Qwen2/Qwen3, OLMo 2/3, OLMoE, Phi-3, Gemma, StarCoder2,
SmolLM3 and GLM-4 derive from this table.
"""

from __future__ import annotations

from ._keys import HeadDim, Ignore, Key, KVHeads, Rope, sizes
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "llama"

L = "model.layers.{i}."

#: checkpoint names of the Llama family (``model.`` prefix; what ``LlamaForCausalLM.save_pretrained`` writes)
TENSORS = (
    W("embed.weight", "model.embed_tokens.weight"),
    W("final_norm.weight", "model.norm.weight"),
    W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
    W("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.weight"),
    *(W(f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}") for x in "qkvo"),
    *(W(f"layers.{{i}}.attention.{x}_norm.weight", L + f"self_attn.{x}_norm.weight") for x in "qk"),
    *(W(f"layers.{{i}}.ffn.{x}.{{p}}", L + f"mlp.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
    Head(),
)

LLAMA = HFType(
    model_type=MODEL_TYPE,
    architecture="LlamaForCausalLM",
    notes=__doc__,
    # transformers LlamaConfig, key by key
    keys={
        **sizes(
            vocab_size=32000,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=2048,
        ),
        "num_key_value_heads": KVHeads(),
        "head_dim": HeadDim(),
        "hidden_act": Key("act", "silu", kind="act"),
        "intermediate_size": Key("d_ff", 11008),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "rope_theta": Rope(10000.0),
        "attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag"),
        "mlp_bias": Key("mlp_bias", False, kind="flag"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "pretraining_tp": Ignore("Meta's tensor-parallel matmul slicing emulation: numerically the same model"),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": "gated"},
    tensors=TENSORS,
    # rotary tables that transformers < 4.3x stored in Llama checkpoints: recomputed, carried for a lossless export
    keep=(
        (r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", "RoPE table buffer of old checkpoints (recomputed)"),
    ),
)

TYPE = LLAMA
