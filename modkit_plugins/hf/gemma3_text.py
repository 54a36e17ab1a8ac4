"""Hugging Face ``gemma3_text`` → modkit: Gemma 2's blocks with a per-head QK-norm, no attention soft-cap, and
local layers with their own RoPE.

Semantics: ``transformers/models/gemma3/{configuration,modeling}_gemma3.py`` (``Gemma3TextConfig``,
``Gemma3ForCausalLM``):

* RMSNorm in the ``(1 + weight)`` form everywhere (``unit_offset``), including the per-head QK-norm;
* ``sandwich`` blocks: input, post-attention, pre-feedforward and post-feedforward norms;
* token embeddings scaled by ``sqrt(hidden_size)`` (``embedding_scale: "sqrt_d_model"``), head tied by default;
* GeGLU MLP with ``hidden_activation`` (``gelu_pytorch_tanh``);
* attention scores scaled by ``query_pre_attn_scalar ** -0.5`` (``softmax_scale``), ``attention_bias`` on all
  four projections; ``attn_logit_softcapping`` must be null; ``final_logit_softcapping`` → ``final_logit_softcap``;
* local/global layers: ``layer_types`` (transformers 5) or ``sliding_window_pattern`` (layer ``i`` is global iff
  ``(i + 1) % pattern == 0``). Local layers use ``sliding_window`` and RoPE base ``rope_local_base_freq``
  without scaling; global layers use ``rope_theta`` and ``rope_scaling``. The majority kind is the block default,
  the other becomes a per-layer override of attention and position.
"""

from __future__ import annotations

from ._keys import LayerTypes, Refuse, RopeByLayerType
from .gemma2 import GEMMA2

MODEL_TYPE = "gemma3_text"

GEMMA3_TEXT = GEMMA2.derive(
    MODEL_TYPE,
    architecture="Gemma3ForCausalLM",
    notes=__doc__,
    drop=("hidden_act", "sliding_window_size"),
    # transformers Gemma3TextConfig defaults
    defaults={"vocab_size": 262_208, "max_position_embeddings": 131_072, "final_logit_softcapping": None},
    keys={
        "rope_theta": RopeByLayerType(1_000_000.0, local_default=10_000.0, local_key="rope_local_base_freq"),
        "attn_logit_softcapping": Refuse(
            None, "tanh soft-capping of attention logits is not supported by modkit's attention"
        ),
        "layer_types": LayerTypes(4096, pattern=6, pattern_key="sliding_window_pattern"),
    },
    fixed={"qk_norm": "head"},
)

TYPE = GEMMA3_TEXT
