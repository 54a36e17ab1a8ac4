"""Hugging Face ``dots1`` (rednote-hilab dots.llm1) → modkit: GLM-4.5's mixture (DeepSeek-V3's sigmoid router with a
correction bias, shared experts, dense first layers) under Qwen3's attention: per-head QK-norm always, full RoPE,
sliding windows on the layers from ``max_window_layers`` on.

Semantics: ``transformers/models/dots1/{configuration,modeling}_dots1.py`` (``Dots1Attention``, ``Dots1TopkRouter``,
``Dots1MoE``, ``Dots1Config.__post_init__``):

* attention: ``q_norm``/``k_norm`` RMSNorms over ``head_dim`` before RoPE in every layer; ``attention_bias`` on all
  four projections; RoPE over the whole head;
* windows: ``layer_types`` when given, else layer ``i`` is ``sliding_attention`` when ``sliding_window`` is set and
  ``i >= max_window_layers`` (there is no ``use_sliding_window`` switch);
* the mixture is :mod:`.glm4_moe`'s, with ``first_k_dense_replace`` 0 and ``norm_topk_prob`` false by default.
  ``n_routed_experts``, ``num_experts_per_tok`` and ``n_shared_experts`` default to null in ``Dots1Config``, where
  transformers cannot build the mixture; a config must give them (dots.llm1: 128, 6 and 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._keys import Entry, Key, KVHeads, Rope, _read, _types, _types_of, sizes
from .glm4_moe import GLM4_MOE, moe_keys

MODEL_TYPE = "dots1"


@dataclass(frozen=True)
class MaxWindowLayers(Entry):
    """``layer_types``, else sliding layers from ``max_window_layers`` on when ``sliding_window`` is set
    (``Dots1Config.__post_init__``). Export writes ``layer_types`` and the window."""

    SETS: ClassVar[tuple[str, ...]] = ("layer_types", "sliding_window")

    default: int = 4096
    max_window_layers: int = 62

    def config_keys(self, name):
        return (name, "max_window_layers", "layer_types")

    def read(self, r, f, name):
        n = f["n_layers"]
        window = _read(r, name, "window", self.default, ())
        first = r.number("max_window_layers", self.max_window_layers, integer=True, positive=False)
        types = r.get("layer_types")
        if types is None:
            types = ["sliding_attention" if window is not None and i >= first else "full_attention" for i in range(n)]
        f["layer_types"] = _types(r, types, n)
        f["sliding_window"] = window
        if window is None and "sliding_attention" in (f["layer_types"] or ()):
            r.error("sliding_window", "is null, but layer_types has sliding_attention layers; give the window")

    def write(self, f, base, name):
        window = next((w for w in f["windows"] if w is not None), base.get(name, self.default))
        types = _types_of(f)
        first = next((i for i, t in enumerate(types) if t == "sliding_attention"), len(types))
        return {name: window, "layer_types": types, "max_window_layers": first}

    def describe(self, name):
        return [
            (
                "`sliding_window`, `max_window_layers`, `layer_types`",
                "mapped",
                f"window {self.default}, from layer {self.max_window_layers}",
                "`sliding_window` of the layer_types' sliding layers (else those from max_window_layers on)",
            )
        ]


DOTS1 = GLM4_MOE.derive(
    MODEL_TYPE,
    architecture="Dots1ForCausalLM",
    notes=__doc__,
    drop=("use_qk_norm", "num_nextn_predict_layers"),
    keys={
        # transformers Dots1Config, key by key
        **sizes(
            vocab_size=152064,
            hidden_size=4608,
            num_hidden_layers=62,
            num_attention_heads=32,
            max_position_embeddings=2048,
        ),
        "num_key_value_heads": KVHeads(32),
        "intermediate_size": Key("d_ff", 10944, note="the dense first layers"),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "rope_theta": Rope(10000.0),
        "attention_bias": Key(("qkv_bias", "o_bias"), False, kind="flag"),
        **moe_keys(
            n_routed_experts=None,
            num_experts_per_tok=None,
            moe_intermediate_size=1408,
            n_shared_experts=None,
            routed_scaling_factor=1.0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            first_k_dense_replace=0,
        ),
        "sliding_window": MaxWindowLayers(),
    },
    fixed={"qk_norm": "head"},
    keep=(),
)

TYPE = DOTS1
