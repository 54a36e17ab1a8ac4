"""Hugging Face ``starcoder2`` → modkit: Mistral's sliding-window GQA with biases everywhere, LayerNorm and a
plain GELU MLP.

Semantics: ``transformers/models/starcoder2/{configuration,modeling}_starcoder2.py`` (modular over Mistral):
``use_bias`` puts a bias on the four attention projections and on the MLP's ``c_fc``/``c_proj``; ``nn.LayerNorm``
(with bias, ``norm_epsilon``) in pre-norm blocks and after the last block; the MLP is ``c_proj(act(c_fc(x)))``
with ``hidden_act`` (``gelu_pytorch_tanh``); ``sliding_window`` (default null) applies to every layer; head tied by
default. ``residual_dropout`` drops each sublayer output, ``embedding_dropout`` the embeddings.
"""

from __future__ import annotations

from ._keys import Key
from ._weights import W
from .llama import L
from .mistral import MISTRAL

MODEL_TYPE = "starcoder2"

STARCODER2 = MISTRAL.derive(
    MODEL_TYPE,
    architecture="Starcoder2ForCausalLM",
    notes=__doc__,
    drop=("rms_norm_eps",),
    # transformers Starcoder2Config defaults
    defaults={
        "vocab_size": 49152,
        "hidden_size": 3072,
        "intermediate_size": 12288,
        "num_hidden_layers": 30,
        "num_attention_heads": 24,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "hidden_act": "gelu_pytorch_tanh",
        "initializer_range": 0.018042,
        "tie_word_embeddings": True,
        "sliding_window": None,
    },
    keys={
        "norm_epsilon": Key("eps", 1e-5, kind="number"),
        "use_bias": Key(("qkv_bias", "o_bias", "mlp_bias"), True, kind="flag", note="every projection"),
        "residual_dropout": Key("dropout_residual", 0.0, kind="prob"),
        "embedding_dropout": Key("dropout_embedding", 0.0, kind="prob"),
    },
    fixed={"norm": "layernorm", "ffn": "mlp"},
    tensors=(
        W("final_norm.{p}", "model.norm.{p}"),
        W("layers.{i}.attn_norm.{p}", L + "input_layernorm.{p}"),
        W("layers.{i}.ffn_norm.{p}", L + "post_attention_layernorm.{p}"),
        W("layers.{i}.ffn.up.{p}", L + "mlp.c_fc.{p}"),
        W("layers.{i}.ffn.down.{p}", L + "mlp.c_proj.{p}"),
    ),
    drop_tensors=("final_norm.weight", "layers.{i}.attn_norm.weight", "layers.{i}.ffn_norm.weight"),
)

TYPE = STARCODER2
