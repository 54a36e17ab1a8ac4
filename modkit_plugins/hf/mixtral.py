"""Hugging Face ``mixtral`` → modkit: Mistral with a sparse MoE of SwiGLU experts in every layer.

Semantics: ``transformers/models/mixtral/{configuration,modeling}_mixtral.py``: the router (no bias) takes a
softmax over all ``num_local_experts`` and keeps the top ``num_experts_per_tok`` renormalised to sum to 1;
``router_aux_loss_coef`` weights the Switch load-balancing loss; ``sliding_window`` (default null) applies to
every layer. ``output_router_logits`` only switches the aux-loss computation on in transformers' forward (a
training setting; the coefficient is kept in the spec), ``router_jitter_noise`` multiplies the router input by
noise in training only. On disk (what transformers 5 writes back on save) each expert is three ``nn.Linear``:
``block_sparse_moe.experts.{e}.w1`` (gate), ``w3`` (up), ``w2`` (down).
"""

from __future__ import annotations

from ._keys import Ignore, Key
from ._weights import StackExperts, W
from .llama import L
from .mistral import MISTRAL

MODEL_TYPE = "mixtral"

MIXTRAL = MISTRAL.derive(
    MODEL_TYPE,
    architecture="MixtralForCausalLM",
    notes=__doc__,
    # transformers MixtralConfig defaults
    defaults={"rms_norm_eps": 1e-5, "rope_theta": 1e6, "sliding_window": None},
    keys={
        "num_local_experts": Key("n_experts", 8, aliases=("num_experts",)),
        "num_experts_per_tok": Key("top_k", 2),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "router_jitter_noise": Ignore("multiplicative router-input noise, in training only", carry=False),
    },
    fixed={"moe": True, "renormalize": True},  # MixtralTopKRouter divides the top-k probabilities by their sum
    tensors=(
        W("layers.{i}.ffn.router.proj.weight", L + "block_sparse_moe.gate.weight"),
        *(
            W(f"layers.{{i}}.ffn.experts.{ours}", L + f"block_sparse_moe.experts.{{e}}.{theirs}.weight", StackExperts())
            for ours, theirs in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
        ),
    ),
)

TYPE = MIXTRAL
