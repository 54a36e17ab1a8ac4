"""Hugging Face ``granitemoeshared`` (IBM Granite 3.x MoE with a shared expert) → modkit: Granite's multipliers
(embeddings, attention scale, residual adds, logits) with a mixture of SwiGLU experts in every layer beside a shared
SwiGLU.

Semantics: ``transformers/models/granitemoeshared/{configuration,modeling}_granitemoeshared.py``
(``GraniteMoeSharedTopKRouter``, ``GraniteMoeSharedMoE``, ``GraniteMoeSharedMLP``, ``GraniteMoeSharedDecoderLayer``):

* the multipliers are Granite's (:mod:`.granite`): ``embedding_multiplier``, ``attention_multiplier`` in place of
  ``1 / sqrt(head_dim)``, ``residual_multiplier`` on both residual adds, logits divided by ``logits_scaling``;
  ``attention_bias`` on all four projections;
* the router (no bias) keeps the top ``num_experts_per_tok`` logits and takes a softmax over them, which is the
  renormalised top-k of the softmax (``topk``, ``renormalize``); each expert a SwiGLU of ``intermediate_size``;
* ``shared_intermediate_size`` (0: none) is the width of a shared SwiGLU whose output is added to the mixture's,
  inside the same residual add.

On disk the experts are stacked: ``block_sparse_moe.input_linear.weight [n_experts, 2 d_ff, d_model]`` (the gate
rows, then the up rows), ``block_sparse_moe.output_linear.weight [n_experts, d_model, d_ff]``, the router
``block_sparse_moe.router.layer``; the shared expert ``shared_mlp.input_linear`` (gate rows, then up rows) and
``shared_mlp.output_linear``.
"""

from __future__ import annotations

from ._keys import Ignore, Key
from ._weights import Chain, Concat, Transpose, W
from .granite import GRANITE
from .llama import L

MODEL_TYPE = "granitemoeshared"

E, S = "layers.{i}.ffn.experts.", "layers.{i}.ffn.shared."

GRANITEMOESHARED = GRANITE.derive(
    MODEL_TYPE,
    architecture="GraniteMoeSharedForCausalLM",
    notes=__doc__,
    drop=("mlp_bias",),
    keys={
        "intermediate_size": Key("d_ff", 11008, note="each expert's width"),
        "num_local_experts": Key("n_experts", 8, aliases=("num_experts",)),
        "num_experts_per_tok": Key("top_k", 2),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "shared_intermediate_size": Key(
            "shared_d_ff",
            0,
            kind="count",
            read_as=lambda v, f: v or None,
            write_as=lambda v, f: v or 0,
            note="the shared SwiGLU's width (0: none)",
        ),
    },
    fixed={"moe": True, "renormalize": True},  # a softmax over the top-k logits: the renormalised top-k
    tensors=(
        W("layers.{i}.ffn.router.proj.weight", L + "block_sparse_moe.router.layer.weight"),
        W((E + "gate", E + "up"), L + "block_sparse_moe.input_linear.weight", Chain((Transpose(), Concat(dim=-1)))),
        W(E + "down", L + "block_sparse_moe.output_linear.weight", Transpose()),
        W((S + "gate.weight", S + "up.weight"), L + "shared_mlp.input_linear.weight", Concat(dim=0)),
        W(S + "down.weight", L + "shared_mlp.output_linear.weight"),
    ),
)

TYPE = GRANITEMOESHARED
