"""Hugging Face ``gemma2`` → modkit: Gemma with sandwich norms, soft-capped attention and logits, and
alternating local/global layers.

Semantics: ``transformers/models/gemma2/{configuration,modeling}_gemma2.py`` (``Gemma2Config``,
``Gemma2ForCausalLM``):

* RMSNorm in the ``(1 + weight)`` form everywhere (``unit_offset``); no QK-norm;
* ``sandwich`` blocks: input, post-attention, pre-feedforward and post-feedforward norms;
* token embeddings scaled by ``sqrt(hidden_size)`` (``embedding_scale: "sqrt_d_model"``), head tied by default;
* GeGLU MLP with ``hidden_activation`` (``gelu_pytorch_tanh``). Published configs also carry a legacy
  ``hidden_act`` that ``Gemma2MLP`` never reads, and some a ``sliding_window_size`` beside ``sliding_window``
  that ``Gemma2Config`` does not read either: both are ignored, as transformers does;
* attention scores scaled by ``query_pre_attn_scalar ** -0.5`` (``softmax_scale``), then soft-capped,
  ``attn_logit_softcapping · tanh(scores / attn_logit_softcapping)`` (``logit_softcap``; default 50), before the
  mask; ``attention_bias`` on all four projections;
* final logits soft-capped by ``final_logit_softcapping`` (default 30) → ``final_logit_softcap``; for both caps a
  present ``null`` switches the cap off;
* local/global layers: ``layer_types`` (transformers 5), else layer ``i`` slides iff ``i`` is even (4.x:
  ``not bool(layer_idx % 2)``) with ``sliding_window``; one RoPE (``rope_theta``, ``rope_scaling``) for all layers.
"""

from __future__ import annotations

from ._keys import Ignore, Key, LayerTypes
from ._weights import W
from .gemma import GEMMA
from .llama import L

MODEL_TYPE = "gemma2"


def scalar_of(scale, f) -> float:
    """``query_pre_attn_scalar`` for a softmax scale (``scalar ** -0.5``), an integer when it is one."""
    if scale is None:
        return f["head_dim"]
    value = float(scale) ** -2
    near = round(value)
    return near if abs(value - near) <= 1e-9 * max(1.0, abs(value)) else value


#: the four norms of a sandwich block, as Gemma 2 and 3 name them
SANDWICH = (
    W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
    W("layers.{i}.attn_post_norm.weight", L + "post_attention_layernorm.weight"),
    W("layers.{i}.ffn_norm.weight", L + "pre_feedforward_layernorm.weight"),
    W("layers.{i}.ffn_post_norm.weight", L + "post_feedforward_layernorm.weight"),
)

GEMMA2 = GEMMA.derive(
    MODEL_TYPE,
    architecture="Gemma2ForCausalLM",
    notes=__doc__,
    # transformers Gemma2Config defaults
    defaults={
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    keys={
        "hidden_act": Ignore("legacy key of published configs that Gemma2MLP never reads"),
        "hidden_activation": Key("act", "gelu_pytorch_tanh", kind="act"),
        "sliding_window_size": Ignore("legacy duplicate of sliding_window that Gemma2Config does not read"),
        "query_pre_attn_scalar": Key(
            "softmax_scale",
            256,
            kind="number",
            read_as=lambda v, f: float(v) ** -0.5,
            write_as=scalar_of,
            note="query_pre_attn_scalar ** -0.5",
        ),
        "attn_logit_softcapping": Key("attn_softcap", 50.0, kind="nullable"),
        "final_logit_softcapping": Key("final_logit_softcap", 30.0, kind="nullable"),
        "layer_types": LayerTypes(4096, pattern=2),
    },
    fixed={"placement": {"type": "sandwich"}},
    tensors=SANDWICH,
)

TYPE = GEMMA2
