"""Hugging Face ``gemma`` (Gemma 1) → modkit: Llama with Gemma's ``(1 + weight)`` RMSNorm, a GeGLU MLP (tanh
GELU) and token embeddings scaled by ``sqrt(hidden_size)``.

Semantics: ``transformers/models/gemma/{configuration,modeling}_gemma.py`` (``GemmaConfig``,
``GemmaForCausalLM``): ``GemmaRMSNorm`` computes ``x / rms(x) * (1 + weight)`` in float32 (``unit_offset``);
``GemmaTextScaledWordEmbedding`` multiplies by ``hidden_size ** 0.5`` (``embedding_scale: "sqrt_d_model"``; the
checkpoint stores the unscaled table); the MLP is ``down(act(gate(x)) * up(x))`` without biases, with
``hidden_act`` (``gelu_pytorch_tanh``; the legacy value ``"gelu"`` of the first releases also means the tanh GELU,
as ``GemmaConfig.__post_init__`` says); ``attention_bias`` sets all four projection biases; ``head_dim`` defaults
to 256 and the head is tied by default. ``num_key_value_heads`` 1 is Gemma-2B's multi-query attention.
"""

from __future__ import annotations

from ._keys import Key, Refuse
from .llama import LLAMA

MODEL_TYPE = "gemma"

#: the key every Gemma refuses: the encoder variant changes the mask (and Gemma 3's windows)
BIDIRECTIONAL = Refuse(
    False, "bidirectional (encoder) Gemma changes the mask and window; only the causal LM is supported"
)

GEMMA = LLAMA.derive(
    MODEL_TYPE,
    architecture="GemmaForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp"),
    # transformers GemmaConfig defaults
    defaults={
        "vocab_size": 256000,
        "hidden_size": 3072,
        "intermediate_size": 24576,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    keys={
        "hidden_act": Key("act", "gelu_pytorch_tanh", kind="act", values={"gelu": "gelu_tanh"}),
        "use_bidirectional_attention": BIDIRECTIONAL,
    },
    fixed={"unit_offset": True, "embedding_scale": "sqrt_d_model"},
)

TYPE = GEMMA
