"""Hugging Face ``hunyuan_v1_moe`` (Tencent Hunyuan-A13B) → modkit: Llama's attention with a per-head QK-RMSNorm
applied *after* RoPE, NTK-alpha RoPE frequencies, and in every layer a mixture of SwiGLU experts beside an
ungated shared MLP of the same width.

Semantics: ``transformers/models/hunyuan_v1_moe/{configuration,modular}_hunyuan_v1_moe.py``:

* ``HunYuanMoEV1Attention``: q/k/v/o with ``attention_bias``; ``query_layernorm`` / ``key_layernorm`` RMSNorms over
  ``head_dim`` applied to the rotated queries and keys (``qk_norm_after_position``); ``head_dim`` defaults to
  ``hidden_size // num_attention_heads``;
* RoPE (``HunYuanDenseV1RotaryEmbedding``): ``rope_parameters`` of type ``dynamic`` with an ``alpha`` is the
  static NTK-alpha base ``rope_theta · alpha ** (head_dim / (head_dim - 2))`` (``ntk_alpha`` scaling; its
  ``factor`` is unused and exported as 1), other types as Llama's. transformers 5.25 computes that base from
  ``config.head_dim``, so such a config must give ``head_dim``;
* ``HunYuanMoEV1Moe``: ``shared_mlp(x) + experts(x)``. The router ``gate.wg`` (no bias; kept in float32 by
  transformers) takes a softmax over ``num_experts`` logits and renormalises the top ``moe_topk`` (``topk``
  router, ``renormalize``); every expert and the shared MLP are bias-free SwiGLUs of width
  ``intermediate_size``. ``num_experts`` and ``moe_topk`` may be lists, one value per layer: a list of one value
  throughout reads as that value, different values are refused (one mixture spec per layer: not written here);
* pre-norm blocks (``input_layernorm``, ``post_attention_layernorm``), untied head by default.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._keys import HeadDim, Ignore, Key, Rope
from ._weights import W
from .llama import LLAMA, L
from .qwen3_moe import QWEN_MOE_TENSORS

MODEL_TYPE = "hunyuan_v1_moe"


@dataclass(frozen=True)
class WrittenHeadDim(HeadDim):
    """``head_dim`` as :class:`HeadDim` reads it, always written on export: transformers' Hunyuan attention reads
    ``config.head_dim`` itself, which is null when the key is absent (and then fails)."""

    def write(self, f, base, name):
        out = super().write(f, base, name)
        return out or ({name: f["head_dim"]} if f["head_dim"] is not None else {})


@dataclass(frozen=True)
class PerLayerOrOne(Key):
    """An integer, or transformers' per-layer list of them (``HunYuanMoEV1Gate`` reads ``value[layer_idx]``): a list
    of one value throughout reads as that value; a list of different values is refused by name."""

    def read(self, r, f, name):
        value = r.get(name) if name in r.cfg else None
        if not isinstance(value, list):
            return super().read(r, f, name)
        one = value[0] if value and all(v == value[0] for v in value) else None
        if not (isinstance(one, int) and not isinstance(one, bool) and one >= 1):
            r.error(
                name,
                f"holds {value!r}: modkit reads one positive integer for every layer (a list of one value throughout "
                "too); layers with different mixtures are not converted",
            )
            one = self.default
        f[self.fields[0]] = one
        r.key_of.setdefault(self.fields[0], name)


def _shared_and_norm_order(r, f) -> None:
    """The shared MLP has the experts' width; every layer normalises q and k after RoPE."""
    f["shared_d_ff"] = f["d_ff"]
    f["attention_by_layer"] = [{"qk_norm_after_position": True}] * f["n_layers"]


HUNYUAN_V1_MOE = LLAMA.derive(
    MODEL_TYPE,
    architecture="HunYuanMoEV1ForCausalLM",
    notes=__doc__,
    drop=("mlp_bias",),
    # transformers HunYuanMoEV1Config defaults
    defaults={"vocab_size": 290943, "rms_norm_eps": 1e-5},
    keys={
        "head_dim": WrittenHeadDim(),
        "rope_theta": Rope(10000.0, ntk_alpha=True),
        "num_experts": PerLayerOrOne(
            "n_experts", 1, aliases=("num_local_experts",), note="one value for every layer (a list of one value too)"
        ),
        "moe_topk": PerLayerOrOne("top_k", 1, note="one value for every layer (a list of one value too)"),
        "output_router_logits": Ignore("switches the router-logit outputs on in training", carry=False),
        "eod_token_id": Ignore("a tokenizer id"),
    },
    fixed={"moe": True, "renormalize": True, "qk_norm": "head"},
    tensors=(
        *(
            W(f"layers.{{i}}.attention.{x}_norm.weight", L + f"self_attn.{y}_layernorm.weight")
            for x, y in (("q", "query"), ("k", "key"))
        ),
        *QWEN_MOE_TENSORS,
        W("layers.{i}.ffn.router.proj.weight", L + "mlp.gate.wg.weight"),
        *(
            W(f"layers.{{i}}.ffn.shared.{x}.weight", L + f"mlp.shared_mlp.{x}_proj.weight")
            for x in ("gate", "up", "down")
        ),
    ),
    read_own=_shared_and_norm_order,
)

TYPE = HUNYUAN_V1_MOE
