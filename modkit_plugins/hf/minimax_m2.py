"""Hugging Face ``minimax_m2`` (MiniMax-M2) → modkit: GQA with full-width QK-norm and partial RoPE, and in every layer
a mixture of SwiGLU experts under a sigmoid router with a selection-only correction bias.

Semantics: ``transformers/models/minimax_m2/{configuration,modeling}_minimax_m2.py`` (``MiniMaxM2Attention``,
``MiniMaxM2TopKRouter``, ``MiniMaxM2SparseMoeBlock``):

* attention: no biases; ``q_norm`` over ``num_attention_heads · head_dim`` and ``k_norm`` over ``num_key_value_heads ·
  head_dim`` (RMSNorms over all heads, ``qk_norm_scope: full``) before RoPE; ``head_dim`` 128 by default;
* RoPE rotates the first ``partial_rotary_factor`` of each head in half-split pairs; the published configs give the
  legacy ``rotary_dim`` instead (``MiniMaxM2Config.convert_rope_params_to_dict``: factor = ``rotary_dim / head_dim``
  unless the RoPE parameters give one);
* the router (no bias) scores the experts with a sigmoid; the top ``num_experts_per_tok`` of the scores plus
  ``e_score_correction_bias`` are chosen, weighted by the unbiased scores renormalised to sum 1 (``sigmoid_topk``,
  ``correction_bias``, ``renormalize``); each expert a SwiGLU of ``intermediate_size``; ``router_jitter_noise``
  applies in training only.

On disk (what transformers 5 writes back) Mixtral's names: ``block_sparse_moe.gate``,
``block_sparse_moe.experts.{e}.w1/w2/w3`` and ``block_sparse_moe.e_score_correction_bias``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, HeadDim, Key, KVHeads, Rope, sizes
from ._weights import W
from .llama import L
from .mixtral import MIXTRAL

MODEL_TYPE = "minimax_m2"


@dataclass(frozen=True)
class RotaryDim(Entry):
    """``rotary_dim`` (MiniMax-M2's published configs): the rotated width in features, read as the RoPE's
    ``partial_rotary`` = ``rotary_dim / head_dim`` when the RoPE parameters give no factor; written back when the
    source config had it."""

    SETS = ("position",)

    def read(self, r, f, name):
        dim = r.number(name, None, integer=True)
        params = r.get("rope_parameters") or {}
        given = "partial_rotary_factor" in r.cfg or (isinstance(params, dict) and "partial_rotary_factor" in params)
        if dim is None or given or f["position"] is None:
            return
        if dim > f["head_dim"] or dim % 2:
            r.error(name, f"= {dim} must be an even width of at most head_dim = {f['head_dim']}")
            return
        partial = dim / f["head_dim"]
        f["position"] = {k: v for k, v in f["position"].items() if k != "partial_rotary"}
        if partial != 1:
            f["position"]["partial_rotary"] = partial

    def write(self, f, base, name):
        if base.get(name) is None:
            return {}
        return {name: int(f["head_dim"] * f["position"].partial_rotary)}

    def describe(self, name):
        return [(f"`{name}`", "mapped", "–", "`position.partial_rotary` = rotary_dim / head_dim (legacy key)")]


E = "layers.{i}.ffn."

MINIMAX_M2 = MIXTRAL.derive(
    MODEL_TYPE,
    architecture="MiniMaxM2ForCausalLM",
    notes=__doc__,
    drop=("sliding_window",),
    keys={
        # transformers MiniMaxM2Config, key by key
        **sizes(
            vocab_size=200064,
            hidden_size=3072,
            num_hidden_layers=62,
            num_attention_heads=48,
            max_position_embeddings=196608,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(128),
        "intermediate_size": Key("d_ff", 1536, note="each expert's width"),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "rope_theta": Rope(5000000.0),
        "rotary_dim": RotaryDim(),
        "num_local_experts": Key("n_experts", 256, aliases=("num_experts",)),
        "num_experts_per_tok": Key("top_k", 8),
    },
    fixed={"qk_norm": "full", "router": "sigmoid_topk", "correction_bias": True},
    tensors=(W(E + "router.correction_bias", L + "block_sparse_moe.e_score_correction_bias"),),
)

TYPE = MINIMAX_M2
