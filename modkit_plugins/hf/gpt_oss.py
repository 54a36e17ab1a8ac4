"""Hugging Face ``gpt_oss`` (gpt-oss-20b, gpt-oss-120b) → modkit: GQA with attention sinks and biases, alternating
sliding-window and full layers, YaRN RoPE, and a mixture of clamped-SwiGLU experts with biases in every layer.

Semantics: ``transformers/models/gpt_oss/{configuration,modeling}_gpt_oss.py``:

* attention: ``attention_bias`` (default true) on all four projections; a learned sink logit per query head
  (``self_attn.sinks``, ``sinks``) joins each softmax denominator; ``layer_types`` (default: even layers
  ``sliding_attention`` with ``sliding_window`` 128, odd layers ``full_attention``); ``head_dim`` 64;
* RoPE: ``rope_parameters``, by default (a config with neither them nor ``rope_scaling``) YaRN with factor 32 over
  4096 trained positions, ``beta_fast`` 32, ``beta_slow`` 1, not truncated, base 150000 (``GptOssConfig``);
* the router ``mlp.router`` (with a bias) keeps the top ``num_experts_per_tok`` logits and takes a softmax over them:
  modkit's ``topk`` router renormalised (the same weights), ``bias: true``;
* each expert ``down(g · sigmoid(swiglu_alpha · g) · (u + 1))``, ``g = min(gate(x), swiglu_limit)``,
  ``u = clamp(up(x), ±swiglu_limit)``, every projection biased (``swiglu_clamped``), of width ``intermediate_size``.
  ``hidden_act`` is not read by the experts;
* on disk the experts are stacked: ``gate_up_proj [n_experts, d_model, 2 d_ff]`` with the gate at even and the up
  projection at odd columns (its bias ``[n_experts, 2 d_ff]`` likewise), ``down_proj [n_experts, d_ff, d_model]``.

Published configs hold ``rope_scaling`` (4.x) in place of ``rope_parameters``; both are read. They also carry
``experts_per_token`` (must equal ``num_experts_per_tok``) and ``initial_context_length`` (ignored), which
``GptOssConfig`` does not read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import Entry, HeadDim, Ignore, Key, KVHeads, LayerTypes, Rope, Same, sizes
from ._weights import Concat, W
from .llama import LLAMA, L

MODEL_TYPE = "gpt_oss"

#: ``GptOssConfig.__post_init__``'s RoPE when a config gives none
YARN = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}


@dataclass(frozen=True)
class ClampedSwiGLU(Entry):
    """``swiglu_alpha`` and ``swiglu_limit`` → ``expert_clamp`` (the experts' ``swiglu_clamped`` ``alpha``, ``limit``)."""

    SETS = ("expert_clamp",)

    alpha: float = 1.702
    limit: float = 7.0

    def config_keys(self, name):
        return ("swiglu_alpha", "swiglu_limit")

    def read(self, r, f, name):
        alpha = r.number("swiglu_alpha", self.alpha)
        limit = r.number("swiglu_limit", self.limit)
        f["expert_clamp"] = {"alpha": float(alpha), "limit": float(limit)}

    def write(self, f, base, name):
        clamp = f["expert_clamp"] or {}
        return {"swiglu_alpha": clamp.get("alpha"), "swiglu_limit": clamp.get("limit")}

    def describe(self, name):
        return [
            (
                "`swiglu_alpha`, `swiglu_limit`",
                "mapped",
                f"`{self.alpha}`, `{self.limit}`",
                "`expert_clamp`: the experts' swiglu_clamped alpha and limit",
            )
        ]


E = "layers.{i}.ffn.experts."

GPT_OSS = LLAMA.derive(
    MODEL_TYPE,
    architecture="GptOssForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "intermediate_size"),
    keys={
        # transformers GptOssConfig, key by key
        **sizes(
            vocab_size=201088,
            hidden_size=2880,
            num_hidden_layers=36,
            num_attention_heads=64,
            max_position_embeddings=131072,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(64),
        "hidden_act": Ignore("not read: the experts' activation is the clamped SwiGLU of swiglu_alpha / swiglu_limit"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "rope_theta": Rope(150000.0, default_parameters=YARN),
        "attention_bias": Key(("qkv_bias", "o_bias"), True, kind="flag"),
        "layer_types": LayerTypes(128, pattern=2),
        "num_local_experts": Key("n_experts", 128, aliases=("num_experts",)),
        "num_experts_per_tok": Key("top_k", 4),
        "intermediate_size": Key("expert_d_ff", 2880, note="each expert's width"),
        "swiglu_alpha": ClampedSwiGLU(),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        # keys of the published configs that GptOssConfig does not read
        "experts_per_token": Same("top_k", "a duplicate of num_experts_per_tok in the published configs"),
        "initial_context_length": Ignore(
            "the trained length before YaRN (rope_scaling's original_max_position_embeddings)"
        ),
    },
    # the softmax over the top-k logits is the renormalised top-k of the softmax
    fixed={"moe": True, "renormalize": True, "router_bias": True, "expert_bias": True, "sinks": True},
    tensors=(
        W("layers.{i}.attention.sinks", L + "self_attn.sinks"),
        W("layers.{i}.ffn.router.proj.{p}", L + "mlp.router.{p}"),
        W((E + "gate", E + "up"), L + "mlp.experts.gate_up_proj", Concat(dim=-1, interleaved=True)),
        W((E + "gate_bias", E + "up_bias"), L + "mlp.experts.gate_up_proj_bias", Concat(dim=-1, interleaved=True)),
        W(E + "down", L + "mlp.experts.down_proj"),
        W(E + "down_bias", L + "mlp.experts.down_proj_bias"),
    ),
)

TYPE = GPT_OSS
