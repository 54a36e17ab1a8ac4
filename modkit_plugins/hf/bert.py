"""Hugging Face ``bert`` → modkit: a bidirectional encoder (``BertModel``).

Semantics: ``transformers/models/bert/{configuration,modeling}_bert.py``:

* embeddings: ``LayerNorm(word + token_type + position)`` with learned absolute positions
  (``max_position_embeddings`` rows) → ``position: learned`` plus ``embedding_norm: layernorm``;
* blocks: post-norm (``LayerNorm(x + attention(x))`` then ``LayerNorm(x + mlp(x))``), multi-head attention with
  biases on all four projections and **no causal mask** (``causal: false``; padding keys are masked), MLP
  ``intermediate``/``output`` with biases and ``hidden_act`` (``gelu`` is the exact erf GELU);
  ``layer_norm_eps`` everywhere; no final norm.

Token types: modkit has no segment input. Row 0 of ``token_type_embeddings`` is folded into the position table
(``positions.0.weight = position_embeddings + token_type_embeddings[0]``), which is exact for single-segment
input (every ``token_type_ids`` 0, what sentence encoders such as all-MiniLM-L6-v2 use). Sentence-pair input
with segment 1 is not expressible. The full token-type table and the original position table are kept in
``model.checkpoint_extras``, so an export restores both bitwise (a fine-tuned position table is unfolded by
subtracting row 0).

What modkit computes is the encoder's last hidden state: ``model(ids, attention_mask=mask).hidden``
``[batch, seq, hidden_size]`` equals ``BertModel(...).last_hidden_state``. The pooler (``pooler.dense``, used only
by ``pooler_output``) is kept in ``checkpoint_extras`` but not computed. ``logits`` are ``hidden @ word_embeddings^T``
(``tie_embeddings``, no parameters of their own), *not* BERT's masked-LM head, whose transform layer is not
part of the spec; checkpoints of ``BertForMaskedLM``/``BertForPreTraining`` (``bert.`` prefix, ``cls.*`` heads)
are therefore refused with the head tensors listed as unexpected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._keys import HeadDim, Ignore, Key, Refuse, sizes
from ._type import HFType
from ._weights import Transform, W

MODEL_TYPE = "bert"

POS, TT = "embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"
TYPE_VOCAB_SIZE = 2  # transformers BertConfig


@dataclass(frozen=True)
class FoldTokenTypes(Transform):
    """``positions.0.weight = position_embeddings + token_type_embeddings[0]``, and back (bitwise when unchanged)."""

    def to_ours(self, ts, ctx):
        pos, tt = ts
        return [pos + tt[0].to(pos.dtype)]

    def to_hf(self, ts, ctx, extras):
        learned = ts[0]
        tt = extras.get(TT)
        if tt is None:  # never loaded from Hugging Face: segment embeddings all zero, exactly as folded
            n_types = int(ctx.config.get("type_vocab_size") or TYPE_VOCAB_SIZE)
            tt = learned.new_zeros(n_types, learned.shape[-1])
        orig = extras.get(POS)
        if orig is not None and orig.dtype == learned.dtype and orig.shape == learned.shape and not learned.is_meta:
            if torch.equal(orig.to(learned.device) + tt[0].to(learned.device, learned.dtype), learned):
                return [orig, tt]  # unchanged since import: the stored table, bitwise
        return [learned - tt[0].to(learned.dtype), tt]

    def describe(self) -> str:
        return "position table + token-type row 0 (the table and the original positions kept for the export)"


E = "encoder.layer.{i}."

BERT = HFType(
    model_type=MODEL_TYPE,
    architecture="BertModel",
    notes=__doc__,
    # transformers BertConfig
    keys={
        **sizes(
            vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12, max_position_embeddings=512
        ),
        "head_dim": HeadDim(in_config=False),
        "intermediate_size": Key("d_ff", 3072),
        "hidden_act": Key("act", "gelu", kind="act", tanh="gelu_new"),
        "layer_norm_eps": Key("eps", 1e-12, kind="number"),
        "type_vocab_size": Key(
            "type_vocab_size", TYPE_VOCAB_SIZE, from_base=True, note="checked; row 0 is folded into the position table"
        ),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "position_embedding_type": Refuse(
            "absolute", "relative position embeddings (relative_key, relative_key_query) are not supported"
        ),
        "is_decoder": Refuse(
            False, "a causal BERT (BertLMHeadModel) is not supported; modkit's bert is the bidirectional encoder"
        ),
        "hidden_dropout_prob": Key(("dropout_residual", "dropout_embedding"), 0.1, kind="prob"),
        "attention_probs_dropout_prob": Key("dropout_attention", 0.1, kind="prob"),
        "gradient_checkpointing": Ignore("a training-time switch"),
        "tie_word_embeddings": Ignore("ties the masked-LM head's decoder, a head modkit's bert does not compute"),
    },
    fixed={
        "norm": "layernorm",
        "placement": {"type": "post"},
        "ffn": "mlp",
        "mlp_bias": True,
        "qkv_bias": True,
        "o_bias": True,
        "causal": False,
        "position": {"type": "learned"},
        "final_norm": False,
        "embedding_norm": True,
        "tie_embeddings": True,
    },
    tensors=(
        W("positions.0.weight", (POS, TT), FoldTokenTypes()),
        W("embed.weight", "embeddings.word_embeddings.weight"),
        W("embedding_norm.{p}", "embeddings.LayerNorm.{p}"),
        W("layers.{i}.attention.q_proj.{p}", E + "attention.self.query.{p}"),
        W("layers.{i}.attention.k_proj.{p}", E + "attention.self.key.{p}"),
        W("layers.{i}.attention.v_proj.{p}", E + "attention.self.value.{p}"),
        W("layers.{i}.attention.o_proj.{p}", E + "attention.output.dense.{p}"),
        W("layers.{i}.attn_norm.{p}", E + "attention.output.LayerNorm.{p}"),
        W("layers.{i}.ffn.up.{p}", E + "intermediate.dense.{p}"),
        W("layers.{i}.ffn.down.{p}", E + "output.dense.{p}"),
        W("layers.{i}.ffn_norm.{p}", E + "output.LayerNorm.{p}"),
    ),
    keep=(
        (r"pooler\..*", "BertModel's pooler (pooler_output); not computed by modkit"),
        (r"embeddings\.position_ids", "position-index buffer of older checkpoints (derivable)"),
        (r"embeddings\.token_type_ids", "token-type buffer (all zeros)"),
        (TT.replace(".", r"\."), "segment embeddings: row 0 is folded into the positions; kept for the export"),
        (POS.replace(".", r"\."), "original position table, to undo the fold bitwise on export"),
    ),
    aliases=(("", "bert."),),
)

TYPE = BERT
