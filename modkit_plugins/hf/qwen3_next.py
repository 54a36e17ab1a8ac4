"""Hugging Face ``qwen3_next`` (Qwen3-Next-80B-A3B) → modkit: a hybrid of Gated DeltaNet layers and gated attention
layers, every FFN a sparse MoE with a sigmoid-gated shared expert, every norm zero-centred.

Semantics: ``transformers/models/qwen3_next/{configuration,modeling}_qwen3_next.py``:

* layer ``i`` is ``layer_types[i]``: ``linear_attention`` (``Qwen3NextGatedDeltaNet``, modkit's ``gated_deltanet``:
  ``linear_num_key_heads`` query/key heads of ``linear_key_head_dim``, ``linear_num_value_heads`` value heads of
  ``linear_value_head_dim``, a causal convolution of ``linear_conv_kernel_dim`` without bias, the gated output norm
  with ``rms_norm_eps``) or ``full_attention``; without ``layer_types``, every ``full_attention_interval``-th layer
  (default 4: layers 3, 7, ...) is full attention (``Qwen3NextConfig.__post_init__``). The convolution and the
  MLPs use ``hidden_act``, which modkit's Gated DeltaNet supports as silu only;
* full attention (``Qwen3NextAttention``) is gated: ``q_proj`` gives, per head, the query then an output gate of
  ``head_dim``; the merged head outputs are multiplied by ``sigmoid(gate)`` before ``o_proj`` (modkit's
  ``output_gate``, whose ``gate_proj`` rows are split out of ``q_proj`` head by head); ``q_norm``/``k_norm`` over
  ``head_dim`` (default 256) before a partial RoPE (``partial_rotary_factor``, default 0.25); ``attention_bias`` on
  all four projections (the gate's rows of ``q_proj`` included). The RoPE is the spec's position scheme on every
  layer: a Gated DeltaNet layer has no queries or keys for it and ignores it;
* every RMSNorm but the Gated DeltaNet's is ``Qwen3NextRMSNorm``, ``x / rms(x) · (1 + weight)`` in float32 (the
  weight stored as the offset from 1, as Gemma's: ``unit_offset``);
* the FFN of layer ``i`` is the mixture iff ``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0`` and ``i`` is
  not in ``mlp_only_layers``, else a SwiGLU of ``intermediate_size``: ``num_experts`` SwiGLU experts of
  ``moe_intermediate_size`` under a softmax top-``num_experts_per_tok`` router (renormalised with
  ``norm_topk_prob``, default true) beside a shared expert of ``shared_expert_intermediate_size`` times
  ``sigmoid(shared_expert_gate · x)`` (``Qwen3NextSparseMoeBlock``).

On disk (transformers 5 writes them back so): the fused ``linear_attn.in_proj_qkvz`` holds per key head its q and k
rows, then the v and z (output gate) rows of its value heads, ``linear_attn.in_proj_ba`` per key head its β then
its α rows; each expert is ``mlp.experts.{e}.{gate,up,down}_proj``. A published checkpoint's multi-token-prediction
module (``mtp.*``), which transformers does not load, is carried along.
"""

from __future__ import annotations

from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import HeadDim, Key, Own, Rope
from ._reader import HFConfig
from ._weights import PerHead, W
from .llama import L
from .qwen3_moe import QWEN3_MOE

MODEL_TYPE = "qwen3_next"

#: the layer types of ``layer_types``
LINEAR, FULL = "linear_attention", "full_attention"
#: the Gated DeltaNet layers' config keys with ``Qwen3NextConfig``'s defaults (read and written by the same table)
LINEAR_DEFAULTS = {
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
#: the config keys of the Gated DeltaNet layers and of the layer pattern (:func:`read_layers`, :func:`write_layers`)
LAYER_KEYS = ("layer_types", "full_attention_interval", *LINEAR_DEFAULTS)


def read_layers(r: HFConfig, f: dict) -> None:
    """The token mixer of every layer: ``gated_deltanet`` on ``linear_attention`` layers, an attention on the others
    (``mixers``), from :data:`LAYER_KEYS` with ``Qwen3NextConfig`` defaults; ``hidden_act`` must be silu when a
    linear layer exists (the activation of its convolution)."""
    n = f["n_layers"]
    size = {key: r.number(key, default, integer=True) for key, default in LINEAR_DEFAULTS.items()}
    nk, nv = size["linear_num_key_heads"], size["linear_num_value_heads"]
    if nv % nk:
        r.error(
            "linear_num_value_heads",
            f"linear_num_value_heads = {nv} is not a multiple of linear_num_key_heads = "
            f"{nk}: each key head serves linear_num_value_heads / linear_num_key_heads value heads",
        )
    mixer = {
        "type": "gated_deltanet",
        "n_heads": nk,
        "n_value_heads": nv,
        "key_head_dim": size["linear_key_head_dim"],
        "value_head_dim": size["linear_value_head_dim"],
        "d_conv": size["linear_conv_kernel_dim"],
        "norm_eps": f["eps"],
    }
    interval = r.number("full_attention_interval", 4, integer=True)
    types = r.get("layer_types")
    if types is None:  # Qwen3NextConfig.__post_init__
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n)]
    elif not isinstance(types, list) or len(types) != n:
        r.error("layer_types", f"must list one type per layer ({n}), got {json_value(types)}")
        types = [FULL] * n
    else:
        bad = sorted({str(t) for t in types if t not in (LINEAR, FULL)})
        if bad:
            r.error(
                "layer_types",
                f"unsupported layer types {bad}: a Qwen3NextDecoderLayer holds a mixer only for "
                f"{LINEAR!r} and {FULL!r}",
            )
    f["mixers"] = [mixer if t == LINEAR else None for t in types]
    if LINEAR in types and f["act"] != "silu":
        r.error(
            "hidden_act",
            f"is also the activation of the Gated DeltaNet convolution, which modkit's gated_deltanet "
            f"computes with silu only; got {json_value(r.get('hidden_act'))}",
        )


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """:data:`LAYER_KEYS` from the spec's mixers: ``layer_types`` of every layer and the Gated DeltaNet's sizes (the
    source config's, else the defaults, when no layer is linear). A recurrent mixer that is not a ``gated_deltanet``
    is written as a linear layer too; the check of the export, which converts the config back, names it."""
    cfg["layer_types"] = [LINEAR if m is not None else FULL for m in f["mixers"]]
    m = f["mixer"]
    if getattr(m, "type", None) == "gated_deltanet":
        cfg.update(
            linear_num_key_heads=m.n_heads,
            linear_num_value_heads=m.value_heads,
            linear_key_head_dim=m.key_head_dim,
            linear_value_head_dim=m.value_head_dim,
            linear_conv_kernel_dim=m.d_conv,
        )
    else:
        cfg.update({key: base.get(key, default) for key, default in LINEAR_DEFAULTS.items()})


#: the Gated DeltaNet layer as transformers 5 saves it: per key head, the fused q, k, v, z and β, α rows split
LINEAR_TENSORS = (
    W(
        tuple(f"layers.{{i}}.attention.{x}_proj.weight" for x in "qkvg"),
        L + "linear_attn.in_proj_qkvz.weight",
        PerHead(),
    ),
    W(
        ("layers.{i}.attention.b_proj.weight", "layers.{i}.attention.a_proj.weight"),
        L + "linear_attn.in_proj_ba.weight",
        PerHead(),
    ),
    *(
        W(f"layers.{{i}}.attention.{x}", L + f"linear_attn.{x}")
        for x in ("conv1d.weight", "dt_bias", "A_log", "norm.weight", "out_proj.weight")
    ),
)

QWEN3_NEXT = QWEN3_MOE.derive(
    MODEL_TYPE,
    architecture="Qwen3NextForCausalLM",
    notes=__doc__,
    drop=("sliding_window", "max_window_layers"),
    # transformers Qwen3NextConfig defaults
    defaults={
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
    },
    keys={
        "head_dim": HeadDim(256),
        "rope_theta": Rope(10000.0, partial=0.25, always_partial=True),
        "num_experts": Key("n_experts", 512, kind="count", aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 10),
        "moe_intermediate_size": Key("expert_d_ff", 512),
        "norm_topk_prob": Key("renormalize", True, kind="flag"),
        "shared_expert_intermediate_size": Key("shared_d_ff", 512),
        "layer_types": Own(
            LAYER_KEYS,
            "the token mixer of each layer: gated_deltanet on linear_attention layers, the "
            "gated attention on full_attention layers (see the notes)",
            fields=("mixers",),
        ),
    },
    fixed={"unit_offset": True, "attn_output_gate": True, "shared_gate": True},
    tensors=(
        # the gated attention: per head, the query rows then the output gate's rows of q_proj
        W(
            ("layers.{i}.attention.q_proj.{p}", "layers.{i}.attention.gate_proj.{p}"),
            L + "self_attn.q_proj.{p}",
            PerHead(),
        ),
        *LINEAR_TENSORS,
        *(
            W(f"layers.{{i}}.ffn.shared.{x}.weight", L + f"mlp.shared_expert.{x}_proj.weight")
            for x in ("gate", "up", "down")
        ),
        W("layers.{i}.ffn.shared_gate.weight", L + "mlp.shared_expert_gate.weight"),
    ),
    keep=((r"mtp\..*", "the multi-token-prediction module of published checkpoints (transformers does not load it)"),),
    read_own=read_layers,
    write_own=write_layers,
)

TYPE = QWEN3_NEXT
