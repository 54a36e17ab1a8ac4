"""Hugging Face ``apertus`` (Swiss AI Apertus) → modkit: Llama's attention with a per-head QK-RMSNorm and a
two-projection xIELU MLP.

Semantics: ``transformers/models/apertus/{configuration,modular}_apertus.py`` (modular over Llama and Nemotron):

* ``ApertusAttention``: ``q_norm`` / ``k_norm`` are RMSNorms over ``head_dim`` (``rms_norm_eps``), applied before
  RoPE; ``attention_bias`` on all four projections; ``head_dim`` is ``hidden_size // num_attention_heads`` (the
  configuration has no ``head_dim`` key);
* ``ApertusMLP``: ``down_proj(act(up_proj(x)))``, no gate and no biases; ``hidden_act`` default ``xielu``: the
  ``xielu`` activation component (two learned scalars ``mlp.act_fn.alpha_p`` / ``alpha_n`` per layer, and its
  saved ``beta`` / ``eps`` buffers), any other name the named activation;
* pre-norm blocks whose norms are named ``attention_layernorm`` and ``feedforward_layernorm``;
* RoPE: ``rope_parameters``, by default (a config with neither them nor ``rope_scaling``) Llama 3 scaling by 8 over
  8192 trained positions (low / high frequency factors 1 / 4), base 12,000,000 (``ApertusConfig``).
"""

from __future__ import annotations

from ._keys import Rope
from ._weights import W
from .llama import LLAMA, L

MODEL_TYPE = "apertus"

#: ``ApertusConfig.__post_init__``'s RoPE when a config gives none
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "original_max_position_embeddings": 8192,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}

APERTUS = LLAMA.derive(
    MODEL_TYPE,
    architecture="ApertusForCausalLM",
    notes=__doc__,
    drop=("pretraining_tp", "mlp_bias", "head_dim"),
    # transformers ApertusConfig defaults
    defaults={
        "vocab_size": 131072,
        "intermediate_size": 14336,
        "max_position_embeddings": 65536,
        "hidden_act": "xielu",
        "rms_norm_eps": 1e-5,
    },
    keys={"rope_theta": Rope(12_000_000.0, default_parameters=LLAMA3)},
    fixed={"ffn": "mlp", "qk_norm": "head"},
    tensors=(
        W("layers.{i}.attn_norm.weight", L + "attention_layernorm.weight"),
        W("layers.{i}.ffn_norm.weight", L + "feedforward_layernorm.weight"),
        *(W(f"layers.{{i}}.ffn.act.{x}", L + f"mlp.act_fn.{x}") for x in ("alpha_p", "alpha_n", "beta", "eps")),
    ),
)

TYPE = APERTUS
