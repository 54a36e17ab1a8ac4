"""Hugging Face ``nemotron_h`` (NVIDIA Nemotron-H, Nemotron 3) → modkit: blocks of one sublayer each: Mamba-2, or
attention without position encoding, or a ReLU² MLP, or a mixture of ReLU² experts.

Semantics: ``transformers/models/nemotron_h/{configuration,modeling}_nemotron_h.py``. Every layer
(``NemotronHBlock``) is ``x + mixer(norm(x))`` with one RMSNorm (``layer_norm_epsilon``), its "mixer" chosen by
``layers_block_type[i]`` (4.x configs: ``hybrid_override_pattern``, one character per layer: ``M`` Mamba-2, ``*``
attention, ``-`` MLP, ``E`` mixture; absent, the four layers ``[linear_attention, moe, full_attention, mlp]``);
the number of layers is the length of that list (``num_hidden_layers`` is ignored, as transformers does). In modkit:

* ``linear_attention``: a ``pre`` block whose mixer is ``mamba2`` and whose ffn is null (``NemotronHMamba2Mixer``:
  ``mamba_num_heads`` heads of ``mamba_head_dim``, ``n_groups`` groups of ``ssm_state_size``-wide B and C, a causal
  convolution of ``conv_kernel`` (bias ``use_conv_bias``), Δ clamped to ``time_step_limit``, the gated RMSNorm gate
  first per group, ``use_bias`` on both projections; ``mamba_hidden_act`` must be silu; ``expand`` is not read:
  the width is heads × head width; ``time_step_min`` / ``max`` / ``floor`` only initialise ``dt_bias``);
* ``full_attention``: a ``pre`` block of GQA alone (``NemotronHAttention``): ``head_dim``, no biases whatever
  ``attention_bias`` says, no position encoding (the Mamba-2 layers carry the order);
* ``mlp``: a ``pre`` block whose mixer is ``none`` (:mod:`modkit_plugins.no_mixer`) and whose ffn is the MLP
  ``down(act(up(x)))`` of ``intermediate_size`` with ``mlp_hidden_act`` (ReLU², modkit's ``relu2`` component) and
  ``mlp_bias``;
* ``moe``: a ``pre`` block whose mixer is ``none`` and whose ffn is DeepSeek-V3's routing (``NemotronHTopkRouter``:
  sigmoid scores, the ``e_score_correction_bias`` buffer choosing, ``n_group`` / ``topk_group``, renormalised with
  ``norm_topk_prob``, times ``routed_scaling_factor``) over ``n_routed_experts`` two-projection ReLU² experts of
  ``moe_intermediate_size`` (no biases), beside one shared ReLU² MLP of ``moe_shared_expert_intermediate_size``
  (``mlp_bias``; transformers builds exactly one whatever ``n_shared_experts`` says).

``moe_latent_size`` (Nemotron 3's latent mixture, ``NemotronHMoE``'s ``fc1_latent_proj`` / ``fc2_latent_proj``): the
routed experts read and write that many features, between a projection from ``hidden_size`` (before them) and one
back (after their weighted sum), both with ``mlp_bias``; the router and the shared expert read the full-width input.
In modkit: the ``moe``'s ``latent_dim`` and ``latent_bias`` (``latent_down`` / ``latent_up``). A published checkpoint's multi-token-prediction layers (``mtp.*``), which transformers does not
load, are carried along. On disk every name starts with ``backbone.`` and each expert is its own
``mixer.experts.{e}.{up,down}_proj``.
"""

from __future__ import annotations

from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import Ignore, Key, KVHeads, Own
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, StackExperts, W
from .mamba2 import read_time_step_limit, write_time_step_limit

MODEL_TYPE = "nemotron_h"

MAMBA, ATTENTION, MLP, MOE = "linear_attention", "full_attention", "mlp", "moe"
#: the characters of ``hybrid_override_pattern`` (``NemotronHConfig._pattern_to_list``)
PATTERN = {"M": MAMBA, "*": ATTENTION, "-": MLP, "E": MOE}
DEFAULT_TYPES = [MAMBA, MOE, ATTENTION, MLP]
#: the Mamba-2 keys, their 4.x names (``NemotronHConfig.__post_init__``) and defaults
MAMBA_KEYS = {
    "mamba_num_heads": ((), 128),
    "mamba_head_dim": ((), 64),
    "ssm_state_size": ((), 128),
    "n_groups": (("mamba_n_groups",), 8),
    "conv_kernel": (("mamba_d_conv",), 4),
    "chunk_size": (("mamba_chunk_size",), 128),
    "use_conv_bias": (("mamba_conv_bias",), True),
    "use_bias": ((), False),
    "time_step_min": (("mamba_dt_min",), 0.001),
    "time_step_max": (("mamba_dt_max",), 0.1),
    "time_step_floor": (("mamba_dt_init_floor",), 1e-4),
}
LAYER_KEYS = ("layers_block_type", "hybrid_override_pattern", "mamba_hidden_act", "time_step_limit", *MAMBA_KEYS)


def _types(r: HFConfig) -> list[str]:
    """The layer types of ``layers_block_type`` (alias ``layer_types``), else of ``hybrid_override_pattern``."""
    types = r.get("layers_block_type", aliases=("layer_types",))
    pattern = r.get("hybrid_override_pattern")
    if types is None and pattern is not None:
        if not isinstance(pattern, str) or set(pattern) - set(PATTERN) or not pattern:
            r.error("hybrid_override_pattern", f"must be a string of M, *, - and E, got {json_value(pattern)}")
            return DEFAULT_TYPES
        return [PATTERN[c] for c in pattern]
    if types is None:
        return DEFAULT_TYPES
    if not isinstance(types, list) or not types or set(map(str, types)) - set(PATTERN.values()):
        r.error(
            "layers_block_type",
            f"must list layer types among {sorted(PATTERN.values())}, got {json_value(types)}",
        )
        return DEFAULT_TYPES
    return types


def _mamba(r: HFConfig, f: dict) -> dict[str, Any]:
    """The ``mamba2`` mixer spec of :data:`MAMBA_KEYS` (gated norm epsilon ``f["eps"]``)."""
    v = {}
    for key, (aliases, default) in MAMBA_KEYS.items():
        if isinstance(default, bool):
            v[key] = r.flag(key, default, aliases=aliases)
        else:
            v[key] = r.number(key, default, integer=isinstance(default, int), aliases=aliases)
    heads, groups = v["mamba_num_heads"], v["n_groups"]
    if heads % groups:
        r.error("n_groups", f"n_groups = {groups} does not divide mamba_num_heads = {heads}")
    if r.activation("mamba_hidden_act", "silu") != "silu":
        r.error(
            "mamba_hidden_act",
            f"unsupported value {json_value(r.get('mamba_hidden_act'))}: modkit's mamba2 computes its convolution and "
            "gate with silu only",
        )
    if "mamba_dt_limit" in r.cfg and "time_step_limit" not in r.cfg:
        r.cfg["time_step_limit"] = r.get("mamba_dt_limit")
    r.get("mamba_dt_limit")
    return {
        "type": "mamba2",
        "d_state": v["ssm_state_size"],
        "head_dim": v["mamba_head_dim"],
        "d_inner": heads * v["mamba_head_dim"],
        "n_groups": groups,
        "d_conv": v["conv_kernel"],
        "conv_bias": v["use_conv_bias"],
        "in_proj_bias": v["use_bias"],
        "out_proj_bias": v["use_bias"],
        "norm_eps": f["eps"],
        "chunk_size": v["chunk_size"],
        "dt_init_min": v["time_step_min"],
        "dt_init_max": v["time_step_max"],
        "dt_init_floor": v["time_step_floor"],
        **read_time_step_limit(r),
    }


def read_layers(r: HFConfig, f: dict) -> None:
    """Every layer's sublayer: the mixer (``mixers``: ``mamba2``, ``None`` for attention, ``none`` for the FFN
    layers), which layers hold an FFN (``ffn_layers``) and which a mixture (``moe_layers``)."""
    types = _types(r)
    f["n_layers"] = len(types)
    mamba = _mamba(r, f)
    f["mixers"] = [mamba if t == MAMBA else None if t == ATTENTION else {"type": "none"} for t in types]
    f["ffn_layers"] = [t in (MLP, MOE) for t in types]
    f["moe_layers"] = [t == MOE for t in types]
    f["moe"] = MOE in types
    f["shared_bias"] = f["moe_latent_bias"] = f["mlp_bias"]


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layers_block_type`` from the blocks and the Mamba-2 keys (the source config's, else the defaults, when no
    layer is Mamba-2)."""
    types = []
    for m, ffn in zip(f["mixers"], f["ffns"]):
        kind = getattr(m, "type", None)
        types.append(
            (MOE if getattr(ffn, "type", None) == "moe" else MLP) if kind == "none" else MAMBA if m else ATTENTION
        )
    cfg["layers_block_type"] = types
    cfg["num_hidden_layers"] = len(types)
    m = next((x for x in f["mixers"] if getattr(x, "type", None) == "mamba2"), None)
    if m is None:
        cfg.update({key: base.get(key, default) for key, (_, default) in MAMBA_KEYS.items()})
        cfg["time_step_limit"] = base.get("time_step_limit", [0.0, float("inf")])
    else:
        cfg.update(
            mamba_num_heads=m.resolved_d_inner(f["d_model"]) // m.head_dim,
            mamba_head_dim=m.head_dim,
            ssm_state_size=m.d_state,
            n_groups=m.n_groups,
            conv_kernel=m.d_conv,
            chunk_size=m.chunk_size,
            use_conv_bias=m.conv_bias,
            use_bias=m.in_proj_bias,
            time_step_min=m.dt_init_min,
            time_step_max=m.dt_init_max,
            time_step_floor=m.dt_init_floor,
            time_step_limit=write_time_step_limit(m),
        )
    cfg["mamba_hidden_act"] = "silu"
    cfg["mlp_bias"] = bool(f["mlp_bias"] or f["shared_bias"] or f["moe_latent_bias"])


def _groups(v, f):
    return None if v == 1 else v  # one group is no limit


B = "backbone.layers.{i}."
F = "layers.{i}.ffn."

NEMOTRON_H = HFType(
    model_type=MODEL_TYPE,
    architecture="NemotronHForCausalLM",
    notes=__doc__,
    # transformers NemotronHConfig, key by key
    keys={
        "vocab_size": Key("vocab_size", 131072),
        "hidden_size": Key("d_model", 4096),
        "num_attention_heads": Key("n_heads", 32),
        "num_key_value_heads": KVHeads(8),
        "head_dim": Key("head_dim", 128),
        "max_position_embeddings": Key("max_seq_len", 4096),
        "intermediate_size": Key("d_ff", 21504, note="the MLP layers' width"),
        "mlp_hidden_act": Key("act", "relu2", kind="act", note="the MLPs' and experts' activation"),
        "mlp_bias": Key("mlp_bias", False, kind="flag", note="the MLPs' and the shared expert's biases"),
        "layer_norm_epsilon": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "n_routed_experts": Key("n_experts", 8, aliases=("num_local_experts",)),
        "num_experts_per_tok": Key("top_k", 2),
        "moe_intermediate_size": Key("expert_d_ff", 7688),
        "moe_shared_expert_intermediate_size": Key("shared_d_ff", 7688, note="the one shared expert's width"),
        "routed_scaling_factor": Key("routed_scaling_factor", 1.0, kind="number"),
        "n_group": Key("n_group", 1, read_as=_groups, write_as=lambda v, f: v or 1, note="1: no limit"),
        "topk_group": Key(
            "topk_group", 1, read_as=lambda v, f: None if f["n_group"] is None else v, write_as=lambda v, f: v or 1
        ),
        "norm_topk_prob": Key("renormalize", True, kind="flag"),
        "layers_block_type": Own(
            LAYER_KEYS,
            "the sublayer of each layer (Mamba-2, attention, the MLP or the mixture, each a block of its own) and "
            "the Mamba-2 layers' sizes (see the notes)",
            fields=("mixers", "ffn_layers", "moe_layers", "n_layers"),
        ),
        "moe_latent_size": Key(
            "moe_latent_dim",
            None,
            kind="window",
            note="the routed experts' latent width between two projections (null: the experts read hidden_size)",
        ),
        "num_hidden_layers": Ignore("deprecated: transformers counts the layers of layers_block_type"),
        "attention_bias": Ignore("NemotronHAttention builds its projections without biases whatever it says"),
        "sliding_window": Ignore("NemotronHAttention attends to every earlier position whatever it says"),
        "expand": Ignore("the Mamba-2 width is mamba_num_heads × mamba_head_dim"),
        "mamba_proj_bias": Ignore("NemotronHMamba2Mixer reads use_bias"),
        "n_shared_experts": Ignore("transformers builds one shared expert of moe_shared_expert_intermediate_size"),
        "moe_shared_expert_overlap": Ignore("a Megatron-LM scheduling switch"),
        "mamba_ssm_cache_dtype": Ignore("the dtype of the decode state"),
        "use_mamba_kernels": Ignore("deprecated in transformers 5: the fast kernels are used when available"),
        "residual_in_fp32": Ignore("the residual kept in float32 under half precision: the same network"),
        "rescale_prenorm_residual": Ignore("an initialisation option of out_proj"),
        "hidden_dropout": Ignore("NemotronHModel applies no dropout on the hidden states"),
        "num_logits_to_keep": Ignore("how many positions' logits generate computes"),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
        "num_nextn_predict_layers": Ignore("the multi-token-prediction layers are not part of the causal LM"),
        "mtp_layers_block_type": Ignore("the multi-token-prediction layers are not part of the causal LM"),
    },
    fixed={
        "norm": "rmsnorm",
        "placement": {"type": "pre"},
        "ffn": "mlp",
        "position": {"type": "none"},
        "router": "sigmoid_topk",
        "correction_bias": True,
    },
    read_own=read_layers,
    write_own=write_layers,
    tensors=(
        W("embed.weight", "backbone.embeddings.weight"),
        W("final_norm.weight", "backbone.norm_f.weight"),
        W("layers.{i}.attn_norm.weight", B + "norm.weight"),
        W("layers.{i}.ffn_norm.weight", B + "norm.weight"),
        *(W(f"layers.{{i}}.attention.{x}_proj.weight", B + f"mixer.{x}_proj.weight") for x in "qkvo"),
        *(W(f"layers.{{i}}.attention.{x}", B + f"mixer.{x}") for x in ("dt_bias", "A_log", "D", "norm.weight")),
        *(W(f"layers.{{i}}.attention.{x}.{{p}}", B + f"mixer.{x}.{{p}}") for x in ("in_proj", "conv1d", "out_proj")),
        *(W(F + f"{x}.{{p}}", B + f"mixer.{x}_proj.{{p}}") for x in ("up", "down")),
        W(F + "router.proj.weight", B + "mixer.gate.weight"),
        W(F + "latent_down.{p}", B + "mixer.fc1_latent_proj.{p}"),
        W(F + "latent_up.{p}", B + "mixer.fc2_latent_proj.{p}"),
        W(F + "router.correction_bias", B + "mixer.gate.e_score_correction_bias"),
        *(W(F + f"experts.{x}", B + f"mixer.experts.{{e}}.{x}_proj.weight", StackExperts()) for x in ("up", "down")),
        *(W(F + f"shared.{x}.{{p}}", B + f"mixer.shared_experts.{x}_proj.{{p}}") for x in ("up", "down")),
        Head(),
    ),
    keep=(
        (r"mtp\..*", "the multi-token-prediction layers of published checkpoints (transformers does not load them)"),
    ),
)

TYPE = NEMOTRON_H
