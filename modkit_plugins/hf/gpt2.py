"""Hugging Face ``gpt2`` → modkit.

Semantics: ``transformers/models/gpt2/{configuration,modeling}_gpt2.py``: learned absolute positions
(``wpe``, ``n_positions`` rows), pre-norm LayerNorm blocks, multi-head attention whose fused ``c_attn`` and
``c_proj`` carry biases (all four projections biased), MLP ``c_fc``/``c_proj`` with biases and
``activation_function`` (``gelu_new`` is the tanh GELU), inner width ``n_inner`` (default ``4 * n_embd``), final
LayerNorm, head tied to the token embedding. ``scale_attn_weights: false`` drops the ``1/sqrt(head_dim)``
factor (``softmax_scale: 1``); ``scale_attn_by_inverse_layer_idx`` and cross-attention are refused;
``reorder_and_upcast_attn`` only changes the float precision of the eager kernel and is ignored. The
``summary_*`` keys configure the multiple-choice head of ``GPT2DoubleHeadsModel``, not the language model.
Weights: ``Conv1D`` layers store ``[in, out]`` matrices (transposed here); ``c_attn`` fuses q, k, v along its
output dimension; files saved from ``GPT2Model`` omit the ``transformer.`` prefix.
"""

from __future__ import annotations

from ._keys import HeadDim, Ignore, Key, Refuse, Same
from ._type import HFType
from ._weights import Concat, Head, Transpose, W

MODEL_TYPE = "gpt2"

H = "transformer.h.{i}."
_HEAD = "multiple-choice head of GPT2DoubleHeadsModel, not the language model"

GPT2 = HFType(
    model_type=MODEL_TYPE,
    architecture="GPT2LMHeadModel",
    notes=__doc__,
    # transformers GPT2Config (its attribute_map lets the Llama-style names appear too)
    keys={
        "vocab_size": Key("vocab_size", 50257),
        "n_embd": Key("d_model", 768, aliases=("hidden_size",)),
        "n_layer": Key("n_layers", 12, aliases=("num_hidden_layers",)),
        "n_head": Key("n_heads", 12, aliases=("num_attention_heads",)),
        "n_positions": Key("max_seq_len", 1024, aliases=("max_position_embeddings",)),
        "head_dim": HeadDim(in_config=False),
        "n_ctx": Same("max_seq_len", "the position table has n_positions rows"),  # legacy, no longer read
        "n_inner": Key("d_ff", lambda f: 4 * f["d_model"], note="4 × n_embd when absent"),
        "activation_function": Key("act", "gelu_new", kind="act", tanh="gelu_new"),
        "layer_norm_epsilon": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "scale_attn_weights": Key(
            "softmax_scale",
            True,
            kind="flag",
            read_as=lambda v, f: None if v else 1.0,
            write_as=lambda v, f: v is None,
            note="false: scores not divided by sqrt(head_dim)",
        ),
        "scale_attn_by_inverse_layer_idx": Refuse(
            False, "scaling attention by 1 / (layer_idx + 1) per layer is not supported"
        ),
        "embd_pdrop": Key("dropout_embedding", 0.1, kind="prob"),
        "attn_pdrop": Key("dropout_attention", 0.1, kind="prob"),
        "resid_pdrop": Key("dropout_residual", 0.1, kind="prob"),
        **{
            k: Ignore(_HEAD)
            for k in ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels")
        },
        "reorder_and_upcast_attn": Ignore("only changes the float precision of the eager attention kernel"),
    },
    fixed={
        "norm": "layernorm",
        "ffn": "mlp",
        "mlp_bias": True,
        "qkv_bias": True,
        "o_bias": True,
        "position": {"type": "learned"},
    },
    tensors=(
        W("embed.weight", "transformer.wte.weight"),
        W("positions.0.weight", "transformer.wpe.weight"),
        W("final_norm.{p}", "transformer.ln_f.{p}"),
        W("layers.{i}.attn_norm.{p}", H + "ln_1.{p}"),
        W("layers.{i}.ffn_norm.{p}", H + "ln_2.{p}"),
        W(
            tuple(f"layers.{{i}}.attention.{x}_proj.{{p}}" for x in "qkv"),
            H + "attn.c_attn.{p}",
            Concat(transpose=True),
        ),
        W("layers.{i}.attention.o_proj.weight", H + "attn.c_proj.weight", Transpose()),
        W("layers.{i}.attention.o_proj.bias", H + "attn.c_proj.bias"),
        W("layers.{i}.ffn.up.weight", H + "mlp.c_fc.weight", Transpose()),
        W("layers.{i}.ffn.up.bias", H + "mlp.c_fc.bias"),
        W("layers.{i}.ffn.down.weight", H + "mlp.c_proj.weight", Transpose()),
        W("layers.{i}.ffn.down.bias", H + "mlp.c_proj.bias"),
        Head(),
    ),
    keep=(
        (
            r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",
            "causal-mask buffers stored by older GPT-2 checkpoints (derivable)",
        ),
    ),
    aliases=(("transformer.", ""),),
)

TYPE = GPT2
