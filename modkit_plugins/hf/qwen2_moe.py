"""Hugging Face ``qwen2_moe`` (Qwen1.5-MoE, Qwen2-57B-A14B) → modkit: Qwen2's attention with a sparse MoE of SwiGLU
experts beside a sigmoid-gated shared expert, dense FFNs on the layers the config keeps dense.

Semantics: ``transformers/models/qwen2_moe/{configuration,modeling}_qwen2_moe.py`` (``Qwen2MoeSparseMoeBlock``):

* the router (no bias) takes a softmax over ``num_experts`` and keeps the top ``num_experts_per_tok``, renormalised
  only with ``norm_topk_prob``; each expert a SwiGLU of ``moe_intermediate_size``;
* the shared expert, a SwiGLU of ``shared_expert_intermediate_size``, is added times ``sigmoid(shared_expert_gate ·
  x)`` (``shared``, ``shared_gate``);
* layer ``i`` holds the mixture iff ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is not in ``mlp_only_layers``,
  else a dense SwiGLU of ``intermediate_size``;
* attention: ``qkv_bias`` (default true) biases q, k and v, never the output projection; ``sliding_window`` only
  with ``use_sliding_window``, on the layers ``layer_types`` marks (default: every other layer, 0, 2, ..., below
  ``max_window_layers``).

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate``, the shared expert
``mlp.shared_expert.*`` and its gate ``mlp.shared_expert_gate``.
"""

from __future__ import annotations

from ._keys import Key, QwenWindows
from ._weights import W
from .llama import L
from .qwen2 import QWEN2
from .qwen3_moe import QWEN_MOE_KEYS, QWEN_MOE_TENSORS

MODEL_TYPE = "qwen2_moe"

QWEN2_MOE = QWEN2.derive(
    MODEL_TYPE,
    architecture="Qwen2MoeForCausalLM",
    notes=__doc__,
    drop=("use_mrope",),
    # transformers Qwen2MoeConfig defaults
    defaults={
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "max_position_embeddings": 32768,
    },
    keys={
        "qkv_bias": Key("qkv_bias", True, kind="flag", note="q, k and v (never the output projection)"),
        "sliding_window": QwenWindows(4096, max_window_layers=28, alternate=True),
        **QWEN_MOE_KEYS,
        "num_experts": Key("n_experts", 60, kind="count", aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 4),
        "moe_intermediate_size": Key("expert_d_ff", 1408),
        "shared_expert_intermediate_size": Key("shared_d_ff", 5632),
    },
    fixed={"moe": True, "shared_gate": True},
    tensors=(
        *QWEN_MOE_TENSORS,
        *(
            W(f"layers.{{i}}.ffn.shared.{x}.weight", L + f"mlp.shared_expert.{x}_proj.weight")
            for x in ("gate", "up", "down")
        ),
        W("layers.{i}.ffn.shared_gate.weight", L + "mlp.shared_expert_gate.weight"),
    ),
)

TYPE = QWEN2_MOE
