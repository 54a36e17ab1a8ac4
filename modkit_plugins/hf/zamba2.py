"""Hugging Face ``zamba2`` (Zyphra Zamba2) → modkit: Mamba-2 layers, and on the ``hybrid`` layers one (or
``num_mem_blocks``, alternating) attention + MLP block shared across depths with per-use LoRA adapters, fed the
residual stream concatenated with the embeddings, its output projected per use and added to that layer's Mamba-2
input.

Semantics: ``transformers/models/zamba2/{configuration,modeling}_zamba2.py``. Layer ``i`` is ``layers_block_type[i]``
(absent: Zamba2-2.7B's 54-layer pattern; ``num_hidden_layers`` is not read, as ``Zamba2Model.get_layers`` does not):

* ``mamba`` / ``linear_attention`` (``Zamba2MambaDecoderLayer``): a ``pre`` block ``x + mamba2(norm(x))``, no FFN.
  The Mamba-2 mixer (``Zamba2MambaMixer``): ``mamba_expand · hidden_size`` wide in ``n_mamba_heads`` heads,
  ``mamba_ngroups`` groups of ``mamba_d_state``-wide B and C, a causal convolution of ``mamba_d_conv`` always with a
  bias (``use_conv_bias`` is not read), Δ clamped below at ``time_step_min`` (``time_step_limit``; transformers clamps
  in the chunked scan only, modkit in the decode step too), the gated RMSNorm (gate first, per group, epsilon 1e-5
  whatever ``rms_norm_eps`` says), ``add_bias_linear`` on both projections;
* ``hybrid`` (``Zamba2HybridLayer``): a ``pre`` block whose mixer is ``side_input``
  (:mod:`modkit_plugins.side_input`): ``x + mamba2(norm(x + linear(T([x, embeddings]))))`` where ``T``
  (``Zamba2AttentionDecoderLayer``, no residual) is RMSNorm over ``2 · hidden_size``, attention reading those
  ``2 · hidden_size`` features (``num_attention_heads`` heads of ``2 · hidden_size / num_attention_heads``, scores
  scaled by ``(head_dim / 2) ** -0.5``, no biases, RoPE over the whole head only with ``use_mem_rope``), RMSNorm,
  then the gated MLP ``down(act(gate(x)) · up(x))`` of ``intermediate_size`` (``hidden_act``, ``add_bias_linear``;
  on disk one ``gate_up_proj``), and ``linear`` is each layer's own ``hidden_size`` square projection.

The hybrid layers' blocks are shared (spec ``share`` with ``"part": "attention.side"``): the ``k``-th hybrid layer
runs block ``k mod num_mem_blocks``, whose owner is its first hybrid layer; every use has its own LoRA adapters of
rank ``adapter_rank``: one on the MLP's fused gate/up projection (one A, a B over the gate and up rows: adapter
``fuse``) and, with ``use_shared_attention_adapter``, one on each of q, k and v. On disk the blocks are stored once,
under their owner layer (``model.layers.{owner}.shared_transformer.*``), with every use's adapters there at the use's
hybrid index (``gate_up_proj_adapter_list.{k}``, ``linear_{q,k,v}_adapter_list.{k}``). A block used by one layer
only (fewer hybrid layers than twice ``num_mem_blocks``) is refused: a share group needs two layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import torch

from modkit.plugin import json_value, Link

from ._keys import Ignore, Key, Own, Rope
from ._reader import HFConfig
from ._spec import norm_spec
from ._type import HFType
from ._weights import Concat, Head, HFWeights, table_links, W

MODEL_TYPE = "zamba2"

MAMBA, HYBRID = "linear_attention", "hybrid"
#: transformers' legacy names of the layer types (``remap_legacy_layer_types``)
LEGACY = {"mamba": MAMBA, "mamba2": MAMBA, "m": MAMBA, "g": HYBRID}
#: Zamba2-2.7B's layer pattern, ``Zamba2Config.__post_init__`` without ``layers_block_type``
DEFAULT_TYPES = [MAMBA] + ([MAMBA] * 5 + [HYBRID]) * 7 + [MAMBA] * 4 + [HYBRID] + [MAMBA] * 3 + [HYBRID] + [MAMBA] * 2
#: the keys the type's own code reads, with transformers' defaults
OWN = {
    "mamba_d_state": 64,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_ngroups": 1,
    "n_mamba_heads": 8,
    "chunk_size": 256,
    "time_step_min": 0.001,
    "time_step_max": 0.1,
    "time_step_floor": 1e-4,
    "add_bias_linear": False,
    "intermediate_size": None,
    "num_key_value_heads": None,
    "num_mem_blocks": 1,
    "use_shared_attention_adapter": False,
    "adapter_rank": 128,
    "use_mem_rope": False,
}
SIDE = "attention.side"
#: the side block's adapted linear layers: the MLP's gate and up (one fused adapter), q, k and v with attention ones
FFN_TARGETS, ATTENTION_TARGETS = ["gate", "up"], ["q_proj", "k_proj", "v_proj"]


def _types(r: HFConfig) -> list[str]:
    types = r.get("layers_block_type", aliases=("layer_types",))
    if types is None:
        return list(DEFAULT_TYPES)
    if not isinstance(types, list) or not types:
        r.error("layers_block_type", f"must list layer types, got {json_value(types)}")
        return list(DEFAULT_TYPES)
    out = [LEGACY.get(t, t) for t in types]
    bad = sorted({str(t) for t in out} - {MAMBA, HYBRID})
    if bad:
        r.error("layers_block_type", f"unknown layer types {bad}; Zamba2 has {MAMBA!r} (or 'mamba') and {HYBRID!r}")
    return out


def _mamba(r: HFConfig, v: dict, f: dict) -> dict[str, Any]:
    """The ``mamba2`` mixer of ``Zamba2MambaMixer``."""
    d = f["d_model"]
    width = v["mamba_expand"] * d
    heads, groups = v["n_mamba_heads"], v["mamba_ngroups"]
    if width % heads:
        r.error("n_mamba_heads", f"n_mamba_heads = {heads} does not divide mamba_expand · hidden_size = {width}")
    if heads % groups:
        r.error("mamba_ngroups", f"mamba_ngroups = {groups} does not divide n_mamba_heads = {heads}")
    spec = {
        "type": "mamba2",
        "d_state": v["mamba_d_state"],
        "head_dim": max(1, width // heads),
        "d_inner": width,
        "n_groups": groups,
        "d_conv": v["mamba_d_conv"],
        "conv_bias": True,
        "in_proj_bias": v["add_bias_linear"],
        "out_proj_bias": v["add_bias_linear"],
        "norm_eps": 1e-5,
        "chunk_size": v["chunk_size"],
        "dt_init_min": v["time_step_min"],
        "dt_init_max": v["time_step_max"],
        "dt_init_floor": v["time_step_floor"],
    }
    if v["time_step_min"]:
        spec["dt_clamp_min"] = v["time_step_min"]
    return spec


def _side(r: HFConfig, v: dict, f: dict, mamba: dict) -> dict[str, Any]:
    """The ``side_input`` mixer of a hybrid layer (``Zamba2HybridLayer``)."""
    d, heads = f["d_model"], f["n_heads"]
    kv = v["num_key_value_heads"] or heads
    if (2 * d) % heads:
        r.error("num_attention_heads", f"num_attention_heads = {heads} does not divide 2 · hidden_size = {2 * d}")
    if heads % kv:
        r.error("num_key_value_heads", f"num_key_value_heads = {kv} does not divide num_attention_heads = {heads}")
    hd = max(1, 2 * d // heads)
    if v["use_shared_attention_adapter"] and kv != heads:
        r.error(
            "num_key_value_heads",
            f"{kv} key/value heads with use_shared_attention_adapter: the key and value adapters of transformers' "
            f"Zamba2Attention return 2 · hidden_size = {2 * d} features, which needs num_key_value_heads = "
            f"num_attention_heads = {heads}",
        )
    kind = "mha" if kv == heads else "mqa" if kv == 1 else "gqa"
    attention = {"type": kind, "n_heads": heads, "head_dim": hd, "softmax_scale": (hd / 2) ** -0.5}
    if kind == "gqa":
        attention["n_kv_heads"] = kv
    d_ff = v["intermediate_size"] or 4 * d
    ffn = {"type": "geglu", "d_ff": d_ff, "activation": f["act"], "bias": v["add_bias_linear"]}
    return {"type": "side_input", "mixer": mamba, "side_mixer": attention, "side_ffn": ffn, "norm": norm_spec(f)}


def _share(r: HFConfig, v: dict, types: list[str]) -> list[dict]:
    """One ``share`` group per block: the hybrid layers ``k ≡ b (mod num_mem_blocks)``."""
    hybrid = [i for i, t in enumerate(types) if t == HYBRID]
    n = v["num_mem_blocks"]
    adapter = {"rank": v["adapter_rank"], "fuse": [FFN_TARGETS]}
    adapter["targets"] = (ATTENTION_TARGETS if v["use_shared_attention_adapter"] else []) + FFN_TARGETS
    groups = [hybrid[b::n] for b in range(n)]
    lonely = [g for g in groups if len(g) == 1]
    if lonely:
        r.error(
            "num_mem_blocks",
            f"num_mem_blocks = {n} over {len(hybrid)} hybrid layers leaves layer(s) {[g[0] for g in lonely]} with a "
            "block of their own (with its adapters); modkit shares a block over two layers or more: give at least "
            f"{2 * n} hybrid layers, or fewer blocks",
        )
    return [{"layers": g, "part": SIDE, "adapter": adapter} for g in groups if len(g) > 1]


def read_layers(r: HFConfig, f: dict) -> None:
    """Every layer's mixer (``mixers``: ``mamba2`` or ``side_input``), the shared blocks (``share``) and the position
    scheme (none without ``use_mem_rope``)."""
    v = {}
    for key, default in OWN.items():
        if isinstance(default, bool):
            v[key] = r.flag(key, default)
        elif key in ("time_step_min", "time_step_max", "time_step_floor"):
            v[key] = r.number(key, default)
        else:
            v[key] = r.number(key, default, integer=True) if default is not None or r.get(key) is not None else None
    types = _types(r)
    f["n_layers"] = len(types)
    mamba = _mamba(r, v, f)
    side = _side(r, v, f, mamba)
    f["mixers"] = [side if t == HYBRID else mamba for t in types]
    f["share"] = _share(r, v, types) or None
    if not v["use_mem_rope"] or HYBRID not in types:
        f["position"] = {"type": "none"}


def write_layers(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """``layers_block_type`` and the keys of :data:`OWN` from the layers' mixers and the share groups."""
    mixers = f["mixers"]
    types = [HYBRID if getattr(m, "type", None) == "side_input" else MAMBA for m in mixers]
    cfg.update(layers_block_type=types, num_hidden_layers=len(types))
    side = next((m for m in mixers if getattr(m, "type", None) == "side_input"), None)
    mamba = side.mixer if side is not None else next((m for m in mixers if m is not None), None)
    d = f["d_model"]
    inner = mamba.resolved_d_inner(d)
    cfg.update(
        mamba_d_state=mamba.d_state,
        mamba_d_conv=mamba.d_conv,
        mamba_expand=inner // d if inner % d == 0 else inner / d,
        mamba_ngroups=mamba.n_groups,
        n_mamba_heads=inner // mamba.head_dim,
        chunk_size=mamba.chunk_size,
        time_step_min=mamba.dt_init_min,
        time_step_max=mamba.dt_init_max,
        time_step_floor=mamba.dt_init_floor,
        add_bias_linear=mamba.in_proj_bias,
    )
    share = f["share"] or []
    adapter = (share[0].get("adapter") or {}) if share else {}
    cfg.update(
        num_mem_blocks=max(1, len(share)),
        adapter_rank=adapter.get("rank", base.get("adapter_rank", OWN["adapter_rank"])),
        use_shared_attention_adapter="q_proj" in (adapter.get("targets") or []),
        use_mem_rope=getattr(f["position"], "type", "none") == "rope",
    )
    if side is not None:
        att = side.side_mixer
        cfg.update(
            num_attention_heads=att.n_heads,
            num_key_value_heads=att.kv_heads,
            intermediate_size=side.side_ffn.d_ff,
            hidden_act={"gelu_tanh": "gelu_pytorch_tanh"}.get(side.side_ffn.act, side.side_ffn.act),
            rms_norm_eps=side.norm.eps,
        )
    else:
        cfg.update({k: base.get(k, OWN[k]) for k in ("num_key_value_heads", "intermediate_size")})


L = "model.layers.{i}."
S = "layers.{i}.attention.side."
T = L + "shared_transformer."
MAMBA_PARTS = ("dt_bias", "A_log", "D", "norm.weight")
MAMBA_LINEARS = ("in_proj", "conv1d", "out_proj")

TENSORS = (
    W("embed.weight", "model.embed_tokens.weight"),
    W("final_norm.weight", "model.final_layernorm.weight"),
    # the hybrid layers: their own Mamba-2, its norm and the projection of the shared block's output
    W("layers.{i}.attention.input_norm.weight", L + "mamba_decoder.input_layernorm.weight"),
    *(W(f"layers.{{i}}.attention.mixer.{x}", L + f"mamba_decoder.mamba.{x}") for x in MAMBA_PARTS),
    *(W(f"layers.{{i}}.attention.mixer.{x}.{{p}}", L + f"mamba_decoder.mamba.{x}.{{p}}") for x in MAMBA_LINEARS),
    W("layers.{i}.attention.proj.weight", L + "linear.weight"),
    # the Mamba-2 layers (after the hybrid rows: their pattern would claim the hybrid layers' norm)
    W("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
    *(W(f"layers.{{i}}.attention.{x}", L + f"mamba.{x}") for x in MAMBA_PARTS),
    *(W(f"layers.{{i}}.attention.{x}.{{p}}", L + f"mamba.{x}.{{p}}") for x in MAMBA_LINEARS),
    # the shared block, under its owner layer only (the other uses hold the owner's tensors)
    W(S + "mixer_norm.weight", T + "input_layernorm.weight"),
    W(S + "ffn_norm.weight", T + "pre_ff_layernorm.weight"),
    *(W(S + f"mixer.{x}_proj.weight", T + f"self_attn.{x}_proj.weight") for x in "qkvo"),
    W((S + "ffn.gate.{p}", S + "ffn.up.{p}"), T + "feed_forward.gate_up_proj.{p}", Concat()),
    W(S + "ffn.down.{p}", T + "feed_forward.down_proj.{p}"),
    Head(),
)


def _fused_to_ours(ts):
    """``[A, B]`` of a gate/up adapter → ``[gate A, up A, gate B, up B]`` (one A; B split by rows)."""
    a, b = ts
    half = b.shape[0] // 2
    return [a, a, b[:half], b[half:]]


def _fused_to_hf(ts, extras):
    """``[gate A, up A, gate B, up B]`` → ``[A, B]``."""
    return [ts[0], torch.cat([ts[2], ts[3]], dim=0)]


def adapter_links(spec, shapes: Mapping[str, Any]) -> list[Link]:
    """The per-use adapters of every hybrid layer ↔ the adapter lists of its block's owner layer, at the layer's
    hybrid index."""
    hybrid = [i for i in range(spec.n_layers) if spec.layer(i).attention.type == "side_input"]
    owner = {layer: g.indices(spec.n_layers)[0] for g in spec.share for layer in g.indices(spec.n_layers)}
    out = []
    for k, layer in enumerate(hybrid):
        ours = f"layers.{layer}.attention.side."
        theirs = f"model.layers.{owner.get(layer, layer)}.shared_transformer."
        ffn = tuple(ours + f"ffn.{x}.lora_{ab}" for ab in "ab" for x in ("gate", "up"))
        if all(n in shapes for n in ffn):
            hf = tuple(theirs + f"feed_forward.gate_up_proj_adapter_list.{k}.{j}.weight" for j in (0, 1))
            out.append(Link(hf, ffn, _fused_to_ours, _fused_to_hf))
        for x in "qkv":
            names = (ours + f"mixer.{x}_proj.lora_a", ours + f"mixer.{x}_proj.lora_b")
            if all(n in shapes for n in names):
                out.append(
                    Link(tuple(theirs + f"self_attn.linear_{x}_adapter_list.{k}.{j}.weight" for j in (0, 1)), names)
                )
    return out


@dataclass(frozen=True)
class Zamba2Type(HFType):
    """:class:`HFType` whose weight links add the per-use adapters (:func:`adapter_links`), which a row of the
    weight table cannot name: their checkpoint index is the layer's rank among the hybrid layers."""

    @cached_property
    def weights(self) -> HFWeights:
        """The checkpoint mapper: the weight table's links and the adapters'."""
        base = HFType.weights.func(self)
        tensors = self.tensors

        def make_links(spec, shapes, config):
            return table_links(tensors, spec, shapes, config) + adapter_links(spec, shapes)

        return HFWeights(**{**base.__dict__, "make_links": make_links})


ZAMBA2 = Zamba2Type(
    model_type=MODEL_TYPE,
    architecture="Zamba2ForCausalLM",
    notes=__doc__,
    # transformers Zamba2Config, key by key
    keys={
        "vocab_size": Key("vocab_size", 32000),
        "hidden_size": Key("d_model", 2560),
        "num_attention_heads": Key("n_heads", 32),
        "max_position_embeddings": Key("max_seq_len", 4096),
        "hidden_act": Key("act", "gelu", kind="act", note="the shared MLP's gate activation"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "rope_parameters": Rope(10000.0),
        "layers_block_type": Own(
            ("layers_block_type", *OWN),
            "the layer types (Mamba-2 or hybrid), the Mamba-2 sizes, the shared blocks, their adapters and whether "
            "they rotate (see the notes)",
            fields=("mixers", "share", "n_layers"),
        ),
        "num_hidden_layers": Ignore("transformers builds one layer per entry of layers_block_type"),
        "use_conv_bias": Ignore("Zamba2MambaMixer gives its convolution a bias whatever it says"),
        "use_mamba_kernels": Ignore("deprecated in transformers 5: the fast kernels are used when available"),
        "use_mem_eff_path": Ignore("a fused-kernel switch: the same network"),
        "num_logits_to_keep": Ignore("how many positions' logits generate computes"),
        "use_long_context": Ignore("sets max_position_embeddings, which is read"),
        "attention_hidden_size": Ignore("derived: 2 · hidden_size", carry=False),
        "attention_head_dim": Ignore("derived: 2 · hidden_size / num_attention_heads", carry=False),
        "mamba_headdim": Ignore("derived: mamba_expand · hidden_size / n_mamba_heads", carry=False),
        "kv_channels": Ignore("derived: hidden_size / num_attention_heads", carry=False),
        "num_query_groups": Ignore("derived: num_attention_heads", carry=False),
        "hybrid_layer_ids": Ignore("derived from layers_block_type", carry=False),
    },
    fixed={"norm": "rmsnorm", "placement": {"type": "pre"}, "ffn": None},
    read_own=read_layers,
    write_own=write_layers,
    tensors=TENSORS,
)

TYPE = ZAMBA2
