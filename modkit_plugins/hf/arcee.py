"""Hugging Face ``arcee`` (Arcee AFM-4.5B) → modkit: Llama with a two-projection ReLU-squared MLP.

Semantics: ``transformers/models/arcee/{configuration,modeling}_arcee.py`` (modular over Llama): ``ArceeMLP`` is
``down_proj(act(up_proj(x)))`` with no gate projection, ``hidden_act`` default ``relu2`` (``relu(x)²``: the
``relu2`` activation component in the ``mlp``'s ``activation_unit``), ``mlp_bias`` on both projections;
attention, norms and RoPE as Llama's (``head_dim`` defaults to ``hidden_size // num_attention_heads``).
"""

from __future__ import annotations

from .llama import LLAMA

MODEL_TYPE = "arcee"

ARCEE = LLAMA.derive(
    MODEL_TYPE,
    architecture="ArceeForCausalLM",
    notes=__doc__,
    drop=("pretraining_tp",),
    # transformers ArceeConfig defaults
    defaults={
        "hidden_size": 2560,
        "intermediate_size": 18432,
        "max_position_embeddings": 4096,
        "hidden_act": "relu2",
        "rms_norm_eps": 1e-5,
    },
    fixed={"ffn": "mlp"},
)

TYPE = ARCEE
