"""Hugging Face ``cohere`` (Command R, Aya) → modkit: parallel blocks with one shared bias-free LayerNorm,
interleaved RoPE, an optional per-head QK LayerNorm with a weight per head, and scaled logits.

Semantics: ``transformers/models/cohere/{configuration,modeling}_cohere.py`` (``CohereDecoderLayer``,
``CohereAttention``, ``CohereLayerNorm``):

* each block is ``x + attn(input_layernorm(x)) + mlp(input_layernorm(x))`` (``parallel`` with ``shared_norm``);
* ``CohereLayerNorm``: mean-centred LayerNorm in float32 with a weight and no bias (``layernorm``, ``bias: false``,
  ``layer_norm_eps``), also after the last block;
* ``use_qk_norm``: q and k normalised per head over ``head_dim`` before RoPE by ``CohereLayerNorm`` of shape
  ``[n_heads, head_dim]`` (``[n_kv_heads, head_dim]`` for k), a weight of each head's own (``qk_norm_scope:
  each_head``);
* RoPE (base 500000) rotates *interleaved* pairs (``rotate_half`` on features 2i, 2i + 1), the checkpoint's
  layout too; ``attention_bias`` puts a bias on all four projections; a SwiGLU MLP without biases;
* the logits are multiplied by ``logit_scale`` (default 0.0625); the head is tied by default.
"""

from __future__ import annotations

from ._keys import Key, Rope
from .llama import LLAMA

MODEL_TYPE = "cohere"

COHERE = LLAMA.derive(
    MODEL_TYPE,
    architecture="CohereForCausalLM",
    notes=__doc__,
    drop=("rms_norm_eps", "mlp_bias", "pretraining_tp"),
    # transformers CohereConfig defaults
    defaults={
        "vocab_size": 256000,
        "hidden_size": 8192,
        "intermediate_size": 22528,
        "num_hidden_layers": 40,
        "num_attention_heads": 64,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    keys={
        "layer_norm_eps": Key("eps", 1e-5, kind="number"),
        "logit_scale": Key("logit_scale", 0.0625, kind="number", note="times the logits"),
        "use_qk_norm": Key(
            "qk_norm",
            False,
            kind="flag",
            read_as=lambda v, f: "each_head" if v else None,
            write_as=lambda v, f: v is not None,
            note="per-head LayerNorm of q and k, a weight per head",
        ),
        "rope_theta": Rope(500000.0, layout="interleaved"),
    },
    fixed={"norm": "layernorm", "norm_bias": False, "placement": {"type": "parallel", "shared_norm": True}},
    drop_tensors=("layers.{i}.ffn_norm.weight",),
    checkpoint_layout="interleaved",
)

TYPE = COHERE
