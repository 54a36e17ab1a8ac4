"""Hugging Face ``granitemoehybrid`` (IBM Granite 4.0-H) → modkit: Bamba's Mamba-2 layers and attention layers by
``layer_types``, Granite's multipliers, a mixture of SwiGLU experts beside a shared SwiGLU in every layer.

Semantics: ``transformers/models/granitemoehybrid/{configuration,modeling}_granitemoehybrid.py`` (modular over
Bamba and GraniteMoeShared):

* layer ``i`` is ``layer_types[i]``: ``linear_attention`` (``GraniteMoeHybridMambaLayer``, Bamba's Mamba-2 mixer:
  the ``mamba_*`` keys of :mod:`.bamba`) or ``full_attention``; absent, every layer is Mamba-2
  (``GraniteMoeHybridConfig.__post_init__``);
* attention (``GraniteMoeHybridAttention``) is GQA with ``attention_bias`` on all four projections, the scores times
  ``attention_multiplier`` in place of ``1 / sqrt(head_dim)``, and RoPE (``rope_parameters``) only with
  ``position_embedding_type = "rope"``; otherwise (the default, null) no position encoding at all;
* Granite's multipliers (:mod:`.granite`): ``embedding_multiplier``, ``residual_multiplier`` on both residual adds,
  the logits divided by ``logits_scaling``;
* the FFN (``GraniteMoeHybridDecoderLayer``): with ``num_local_experts > 0``, ``num_local_experts`` SwiGLU experts of
  ``intermediate_size`` under a softmax over the top ``num_experts_per_tok`` logits (the renormalised top-k) plus a
  shared SwiGLU of ``shared_intermediate_size``, inside one residual add; with ``num_local_experts = 0`` the shared
  SwiGLU alone (a dense FFN of ``shared_intermediate_size``; ``intermediate_size`` then sizes nothing).
  ``hidden_act`` is also the Mamba-2 activation: only silu converts.

On disk the experts are GraniteMoeShared's (``block_sparse_moe.input_linear`` / ``output_linear`` / ``router.layer``),
the shared SwiGLU ``shared_mlp.input_linear`` (gate rows, then up rows) and ``shared_mlp.output_linear``, the Mamba-2
layer Bamba's ``mamba.*``.
"""

from __future__ import annotations

from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import Key, Own
from ._reader import HFConfig
from ._weights import Concat, W
from .bamba import MAMBA_DEFAULTS, MAMBA_TENSORS, read_mamba, write_mamba
from .granitemoeshared import GRANITEMOESHARED
from .llama import L

MODEL_TYPE = "granitemoehybrid"

#: the layer types of ``layer_types``
LINEAR, FULL = "linear_attention", "full_attention"
#: the keys of the layer pattern, the Mamba-2 layers and the position scheme (:func:`read_own`, :func:`write_own`)
OWN_KEYS = ("layer_types", "position_embedding_type", *MAMBA_DEFAULTS)


def read_own(r: HFConfig, f: dict) -> None:
    """The mixer of every layer (``mixers``) from ``layer_types`` and the Mamba-2 keys; no position scheme unless
    ``position_embedding_type`` is ``"rope"``; a dense FFN of ``shared_intermediate_size`` when there are no
    experts."""
    n = f["n_layers"]
    mixer = read_mamba(r, f)
    types = r.get("layer_types")
    if types is None:
        types = [LINEAR] * n
    elif not isinstance(types, list) or len(types) != n:
        r.error("layer_types", f"must list one type per layer ({n}), got {json_value(types)}")
        types = [FULL] * n
    else:
        bad = sorted({str(t) for t in types if t not in (LINEAR, FULL)})
        if bad:
            r.error(
                "layer_types",
                f"unsupported layer types {bad}: a GraniteMoeHybridDecoderLayer holds {LINEAR!r} or {FULL!r}",
            )
    f["mixers"] = [mixer if t == LINEAR else None for t in types]
    kind = r.get("position_embedding_type")
    if kind not in (None, "rope"):
        r.error("position_embedding_type", f"must be null (no position encoding) or 'rope', got {json_value(kind)}")
    if kind != "rope" or FULL not in types:  # no RoPE, or no attention for it to act on
        f["position"] = {"type": "none"}
    if not f["n_experts"]:  # the shared SwiGLU alone: a dense FFN
        if not f["shared_d_ff"]:
            r.error(
                "shared_intermediate_size",
                "with num_local_experts = 0 the shared SwiGLU is the whole FFN, so it needs a width above 0",
            )
        f["moe"], f["d_ff"], f["shared_d_ff"] = False, f["shared_d_ff"] or 1, None


def write_own(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layer_types``, ``position_embedding_type``, the Mamba-2 keys; a dense FFN as the shared SwiGLU alone
    (``num_local_experts = 0``)."""
    cfg["layer_types"] = [LINEAR if m is not None else FULL for m in f["mixers"]]
    rope = getattr(f["position"], "type", None) == "rope"
    cfg["position_embedding_type"] = "rope" if rope else None
    if not rope:
        cfg.pop("rope_theta", None)
        cfg.pop("partial_rotary_factor", None)
        cfg["rope_parameters"] = base.get("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0})
    write_mamba(f["mixer"], f["d_model"], base, cfg)
    if not f["moe"]:
        cfg.update(
            num_local_experts=0,
            shared_intermediate_size=f["d_ff"],
            intermediate_size=base.get("intermediate_size", 11008),
            num_experts_per_tok=base.get("num_experts_per_tok", 2),
        )


D = "layers.{i}.ffn."

GRANITEMOEHYBRID = GRANITEMOESHARED.derive(
    MODEL_TYPE,
    architecture="GraniteMoeHybridForCausalLM",
    notes=__doc__,
    keys={
        "hidden_act": Key("act", "silu", kind="act", note="only silu: the Mamba-2 convolution's activation too"),
        "num_local_experts": Key("n_experts", 8, kind="count", aliases=("num_experts",)),
        "shared_intermediate_size": Key(
            "shared_d_ff",
            1024,
            kind="count",
            read_as=lambda v, f: v or None,
            write_as=lambda v, f: v or 0,
            note="the shared SwiGLU's width (0: none); the whole FFN without experts",
        ),
        "layer_types": Own(
            OWN_KEYS,
            "the mixer of each layer (mamba2 on linear_attention layers, attention on full_attention layers) and "
            "the position scheme (RoPE only with position_embedding_type 'rope'; see the notes)",
            fields=("mixers", "position"),
        ),
    },
    tensors=(
        *MAMBA_TENSORS,
        W((D + "gate.weight", D + "up.weight"), L + "shared_mlp.input_linear.weight", Concat(dim=0)),
        W(D + "down.weight", L + "shared_mlp.output_linear.weight"),
    ),
    drop_tensors=tuple(f"layers.{{i}}.ffn.{x}.{{p}}" for x in ("gate", "up", "down")),
    read_own=read_own,
    write_own=write_own,
)

TYPE = GRANITEMOEHYBRID
