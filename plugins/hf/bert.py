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

import torch

from modkit.checkpoint import Link

from ._common import HFConfig, attention, layernorm, model_spec, sizes
from ._weights import HFWeights, Renames, hf_activation

MODEL_TYPE = "bert"

# transformers BertConfig defaults
DEFAULTS = dict(
    vocab_size=30522,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    layer_norm_eps=1e-12,
    type_vocab_size=2,
)

#: keys irrelevant to the encoder's function: a training-time switch, and the tying of the masked-LM head's decoder
#: (a head modkit's bert does not compute; its own logits always use the embedding). Kept on export.
IGNORE = ("gradient_checkpointing", "tie_word_embeddings")


def convert(cfg: dict) -> dict:
    """Hugging Face ``bert`` config → modkit spec dict (the encoder of ``BertModel``).

    Raises:
        SpecError: every unsupported or unknown field, named with its value (relative position embeddings,
            ``is_decoder: true``, cross-attention, ...).
    """
    r = HFConfig(cfg, MODEL_TYPE, ignore=IGNORE)
    s = sizes(r, DEFAULTS)
    d, n_heads = s["d_model"], s["n_heads"]
    if d % n_heads:
        r.error("num_attention_heads", f"hidden_size = {d} is not divisible by num_attention_heads = {n_heads}")
    d_ff = r.number("intermediate_size", DEFAULTS["intermediate_size"], integer=True)
    act = r.activation("hidden_act", "gelu")
    eps = r.number("layer_norm_eps", DEFAULTS["layer_norm_eps"])
    r.number("type_vocab_size", DEFAULTS["type_vocab_size"], integer=True)  # row 0 is folded into the positions
    init_std = r.number("initializer_range", 0.02)
    r.expect("position_embedding_type", "absolute", "relative position embeddings (relative_key, relative_key_query) are not supported")
    r.expect("is_decoder", False, "a causal BERT (BertLMHeadModel) is not supported; modkit's bert is the bidirectional encoder")
    att = attention(d, n_heads, n_heads, bias=(True,) * 4)
    att["causal"] = False
    block = {
        "attention": att,
        "ffn": {"type": "mlp", "d_ff": d_ff, "activation": act, "bias": True},
        "norm": layernorm(eps),
        "placement": {"type": "post"},
    }
    spec = model_spec(
        r,
        vocab_size=s["vocab_size"],
        d_model=d,
        n_layers=s["n_layers"],
        max_seq_len=s["max_seq_len"],
        position={"type": "learned"},
        block=block,
        final_norm=None,
        tie_embeddings=True,
        init_std=init_std,
    )
    spec["embedding_norm"] = layernorm(eps)
    return r.finish(spec)


# ---------------------------------------------------------------------------------------------- weights

POS, TT = "embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight"


def _fold_link(config) -> Link:
    """``positions.0.weight = position_embeddings + token_type_embeddings[0]``, and back."""
    n_types = int(config.get("type_vocab_size") or DEFAULTS["type_vocab_size"])

    def to_ours(ts):
        pos, tt = ts
        return [pos + tt[0].to(pos.dtype)]

    def to_hf(ts, extras):
        learned = ts[0]
        tt = extras.get(TT)
        if tt is None:  # never loaded from Hugging Face: segment embeddings all zero, exactly as folded
            tt = learned.new_zeros(n_types, learned.shape[-1])
        orig = extras.get(POS)
        if orig is not None and orig.dtype == learned.dtype and orig.shape == learned.shape and not learned.is_meta:
            if torch.equal(orig.to(learned.device) + tt[0].to(learned.device, learned.dtype), learned):
                return [orig, tt]  # unchanged since import: the stored table, bitwise
        return [learned - tt[0].to(learned.dtype), tt]

    return Link((POS, TT), ("positions.0.weight",), to_ours, to_hf)


def links(spec, shapes, config):
    """``BertModel`` names: ``embeddings.*``, ``encoder.layer.{i}.attention.self.{query,key,value}``,
    ``attention.output.{dense,LayerNorm}``, ``intermediate.dense``, ``output.{dense,LayerNorm}``."""
    e = "encoder.layer.{i}."
    table = Renames([
        ("embed.weight", "embeddings.word_embeddings.weight"),
        ("embedding_norm.{p}", "embeddings.LayerNorm.{p}"),
        ("layers.{i}.attention.q_proj.{p}", e + "attention.self.query.{p}"),
        ("layers.{i}.attention.k_proj.{p}", e + "attention.self.key.{p}"),
        ("layers.{i}.attention.v_proj.{p}", e + "attention.self.value.{p}"),
        ("layers.{i}.attention.o_proj.{p}", e + "attention.output.dense.{p}"),
        ("layers.{i}.attn_norm.{p}", e + "attention.output.LayerNorm.{p}"),
        ("layers.{i}.ffn.up.{p}", e + "intermediate.dense.{p}"),
        ("layers.{i}.ffn.down.{p}", e + "output.dense.{p}"),
        ("layers.{i}.ffn_norm.{p}", e + "output.LayerNorm.{p}"),
    ])
    return [_fold_link(config)] + table.links(shapes, skip=["positions.0.weight"])


def to_config(spec, base):
    """Spec → ``BertConfig`` keys (``type_vocab_size`` from the source config, else 2)."""
    ls = spec.layer(0)
    att, ffn = ls.attention, ls.ffn
    return {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": att.n_heads,
        "intermediate_size": getattr(ffn, "d_ff", None),
        "hidden_act": hf_activation(getattr(ffn, "activation", "gelu"), "gelu_new", base.get("hidden_act")),
        "max_position_embeddings": spec.max_seq_len,
        "layer_norm_eps": getattr(ls.norm, "eps", None),
        "type_vocab_size": int(base.get("type_vocab_size") or DEFAULTS["type_vocab_size"]),
        "initializer_range": spec.init_std,
    }


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE,
    convert=convert,
    make_links=links,
    to_config=to_config,
    keep=(
        (r"pooler\..*", "BertModel's pooler (pooler_output); not computed by modkit"),
        (r"embeddings\.position_ids", "position-index buffer of older checkpoints (derivable)"),
        (r"embeddings\.token_type_ids", "token-type buffer (all zeros)"),
        (TT.replace(".", r"\."), "segment embeddings: row 0 is folded into the positions; kept for the export"),
        (POS.replace(".", r"\."), "original position table, to undo the fold bitwise on export"),
    ),
    aliases=(("", "bert."),),
    carry=IGNORE,
    architecture="BertModel",
)
