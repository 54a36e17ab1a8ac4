"""Hugging Face ``phi3`` → modkit: a Llama-style pre-norm SwiGLU decoder (derived from Mistral, as transformers'
own ``modular_phi3`` is).

Semantics: ``transformers/models/phi3/{configuration,modeling}_phi3.py``. Phi-3 stores q/k/v as one fused
``qkv_proj`` and gate/up as one ``gate_up_proj``: that is a checkpoint layout (split when loading weights), the
same parameters as separate projections. No biases; RMSNorm; ``partial_rotary_factor`` rotates part of each
head; ``sliding_window`` applies to every layer. LongRoPE (``rope_scaling`` type ``longrope``, formerly ``su``;
Phi-3 128k) takes its trained length from the top-level ``original_max_position_embeddings``.
"""

from __future__ import annotations

from ._keys import Ignore, Key, Rope
from ._weights import Concat, W
from .llama import L
from .mistral import MISTRAL

MODEL_TYPE = "phi3"

A, F = "layers.{i}.attention.", "layers.{i}.ffn."

PHI3 = MISTRAL.derive(
    MODEL_TYPE,
    architecture="Phi3ForCausalLM",
    notes=__doc__,
    # transformers Phi3Config defaults
    defaults={
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_key_value_heads": None,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "sliding_window": None,
    },
    keys={
        # Phi3Config holds original_max_position_embeddings (LongRoPE's trained length), which wins over the dict's
        "rope_theta": Rope(10000.0, original_at_top=True),
        # with the default RoPE, original_max_position_embeddings (every Phi3Config.to_dict() has it) has no effect
        "original_max_position_embeddings": Ignore("LongRoPE's trained length; no effect with the default RoPE"),
        "embd_pdrop": Key("dropout_embedding", 0.0, kind="prob"),
        "resid_pdrop": Key("dropout_residual", 0.0, kind="prob"),
    },
    tensors=(
        W((A + "q_proj.weight", A + "k_proj.weight", A + "v_proj.weight"), L + "self_attn.qkv_proj.weight", Concat()),
        W((F + "gate.weight", F + "up.weight"), L + "mlp.gate_up_proj.weight", Concat()),
    ),
)

TYPE = PHI3
