"""Hugging Face ``phimoe`` (Phi-3.5-MoE) → modkit: LayerNorm blocks, GQA with biases, a mixture of SwiGLU experts in
every layer under the SparseMixer top-2 router, and Phi-3.5-MoE's LongRoPE.

Semantics: ``transformers/models/phimoe/{configuration,modeling}_phimoe.py`` (``PhimoeRotaryEmbedding``,
``sparsemixer``, ``PhimoeTopKRouter``, ``PhimoeSparseMoeBlock``, ``PhimoeDecoderLayer``):

* norms: ``nn.LayerNorm`` with weight and bias, eps ``rms_norm_eps``; ``attention_bias`` on all four projections,
  ``lm_head_bias`` on the head; ``sliding_window`` (default null) on every layer;
* the router is the ``sparsemixer`` router (:mod:`modkit_plugins.sparsemixer_router`) with ``jitter_eps`` =
  ``router_jitter_noise``; it always picks two experts, whatever ``num_experts_per_tok`` says (only 2 is read);
  ``input_jitter_noise`` multiplies the input in training only. Each expert a SwiGLU of ``intermediate_size``;
* LongRoPE as ``PhimoeRotaryEmbedding`` computes it: its frequencies always use ``short_factor`` (the frequencies are
  recomputed from the config without the sequence length on every call), and cos/sin are multiplied by
  ``short_mscale`` for sequences up to ``original_max_position_embeddings`` and by ``long_mscale`` past it. With equal
  mscales (Phi-3.5-MoE: 1.243 both) this is modkit's ``longrope`` with ``long_factor`` = ``short_factor`` and
  ``attention_factor`` = the mscale; different mscales are refused. Export writes the source's ``long_factor`` back
  when its ``short_factor`` is unchanged (transformers does not use it).

On disk (what transformers 5 writes back) Mixtral's names: ``block_sparse_moe.gate``,
``block_sparse_moe.experts.{e}.w1/w2/w3``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._group_rows import rope_parameters
from ._keys import Ignore, Key, KVHeads, Refuse, Rope, sizes
from ._reader import HFConfig
from ._weights import W
from .mixtral import MIXTRAL

MODEL_TYPE = "phimoe"

LONGROPE = ("longrope", "su")


@dataclass(frozen=True)
class PhimoeRope(Rope):
    """``rope_parameters`` / ``rope_scaling``: the default RoPE as :class:`Rope` reads it; Phi-3.5-MoE's LongRoPE
    (``short_mscale``, ``long_mscale``) as modkit's ``longrope`` with the short factors at every length and the
    mscale as its attention factor (see the module docstring)."""

    def read(self, r, f, name):
        legacy, params = r.get("rope_scaling"), r.get("rope_parameters")
        key = "rope_scaling" if isinstance(legacy, dict) and legacy else "rope_parameters"
        source = legacy if key == "rope_scaling" else params
        if not isinstance(source, dict) or (source.get("rope_type") or source.get("type")) not in LONGROPE:
            return super().read(r, f, name)
        short_m, long_m = source.get("short_mscale"), source.get("long_mscale")
        if short_m is None or short_m != long_m:
            r.error(
                f"{key}.long_mscale",
                f"= {long_m} differs from short_mscale = {short_m}: Phi-3.5-MoE's LongRoPE scales cos/sin by one or "
                "the other depending on the sequence's length, which modkit's longrope cannot express; give both the "
                "same value",
            )
            return super().read(HFConfig({**r.cfg, key: None}, r.model_type), f, name)
        cleaned = {k: v for k, v in source.items() if k not in ("short_mscale", "long_mscale")}
        cleaned.update(long_factor=source.get("short_factor"), attention_factor=short_m)
        sub = HFConfig({**r.cfg, key: cleaned}, r.model_type)
        super().read(sub, f, name)
        r.errors.extend(sub.errors)

    def write(self, f, base, name):
        out = super().write(f, base, name)
        sc = getattr(f["position"], "scaling", None)
        if getattr(sc, "type", None) != "longrope":
            return out
        params = rope_parameters(f["position"])
        m = params.pop("attention_factor", None)
        source = base.get("rope_parameters") or base.get("rope_scaling") or {}
        if source.get("short_factor") == params["short_factor"] and source.get("long_factor"):
            params["long_factor"] = source["long_factor"]
        params.update(short_mscale=m, long_mscale=m)
        out.pop("rope_scaling", None)
        out["rope_parameters"] = params
        return out

    def describe(self, name):
        (keys, status, default, how), *_ = super().describe(name)
        return [(keys, status, default, how + "; Phi-3.5-MoE's LongRoPE: short factors, equal short/long mscale")]


PHIMOE = MIXTRAL.derive(
    MODEL_TYPE,
    architecture="PhimoeForCausalLM",
    notes=__doc__,
    keys={
        # transformers PhimoeConfig, key by key
        **sizes(
            vocab_size=32064,
            hidden_size=4096,
            num_hidden_layers=32,
            num_attention_heads=32,
            max_position_embeddings=4096 * 32,
        ),
        "num_key_value_heads": KVHeads(8),
        "intermediate_size": Key("d_ff", 6400, note="each expert's width"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number", note="the LayerNorms' eps"),
        "rope_theta": PhimoeRope(1e6),
        "attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag"),
        "lm_head_bias": Key("lm_head_bias", False, kind="flag"),
        "num_local_experts": Key("n_experts", 16, aliases=("num_experts",)),
        "num_experts_per_tok": Refuse(2, "the SparseMixer router always picks two experts"),
        "router_jitter_noise": Key("router_jitter", 0.01, kind="nonneg", note="the sparsemixer router's jitter_eps"),
        "input_jitter_noise": Ignore("multiplicative input noise of the mixture, in training only", carry=False),
    },
    fixed={"norm": "layernorm", "norm_bias": True, "router": "sparsemixer", "top_k": 2, "renormalize": False},
    tensors=(
        *(
            W(f"layers.{{i}}.{n}.bias", f"model.layers.{{i}}.{hf}.bias")
            for n, hf in (
                ("attn_norm", "input_layernorm"),
                ("ffn_norm", "post_attention_layernorm"),
            )
        ),
        W("final_norm.bias", "model.norm.bias"),
        W("lm_head.bias", "lm_head.bias"),
        W("lm_head_bias", "lm_head.bias"),  # the head's bias when the head is tied
    ),
)

TYPE = PHIMOE
