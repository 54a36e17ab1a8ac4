"""Hugging Face ``deepseek_v4`` (DeepSeek-V4) → modkit: block-compressed attention on a residual stream of several
copies, mixtures of clamped SwiGLU experts routed by token id on the first layers.

Semantics: ``transformers/models/deepseek_v4/{configuration,modeling}_deepseek_v4.py`` (``DeepseekV4Config``,
``DeepseekV4Attention``, ``DeepseekV4HCACompressor``, ``DeepseekV4CSACompressor``, ``DeepseekV4Indexer``,
``DeepseekV4HyperConnection``, ``DeepseekV4HyperHead``, ``DeepseekV4TopKRouter``, ``DeepseekV4HashRouter``,
``DeepseekV4SparseMoeBlock``):

* every layer's attention is ``compressed_attention`` (:mod:`modkit_plugins.compressed_attention`): ``num_attention_heads``
  query heads of ``head_dim`` through the low-rank ``q_lora_rank`` query, one shared key/value head, per-head sinks,
  RoPE on the last ``head_dim · partial_rotary_factor`` features of each head, a grouped output projection
  (``o_groups`` groups of ``o_lora_rank``), a ``sliding_window``. ``layer_types`` chooses per layer:
  ``sliding_attention`` (the window only, RoPE base ``rope_parameters.main``), ``heavily_compressed_attention``
  (plus one entry per ``compress_rates.heavily_compressed_attention`` tokens) or ``compressed_sparse_attention``
  (entries over overlapping blocks of ``compress_rates.compressed_sparse_attention`` tokens, the ``index_topk`` a
  lightning indexer of ``index_n_heads`` × ``index_head_dim`` scores highest); the compressed layers rotate with
  ``rope_parameters.compress`` (``compress_rope_theta``). Each label's RoPE is ``default`` or ``yarn`` (the
  layers' ``rope_scaling``); a flat ``rope_parameters`` (or legacy ``rope_scaling``) is the ``compress`` one, with
  ``attention_factor`` 1 unless given, as ``DeepseekV4Config.__post_init__`` reads it. Every norm is an RMSNorm of
  ``rms_norm_eps``;
* the residual stream is the ``mhc`` stream (:mod:`modkit_plugins.hyper_connections`): ``hc_mult`` copies mixed
  around each sublayer, ``hc_sinkhorn_iters`` Sinkhorn iterations, ``hc_eps``; the head reads every copy;
* every FFN is a mixture of ``n_routed_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` per
  token, each a SwiGLU with the gate clamped above and the up projection clamped to ±``swiglu_limit``
  (``swiglu_clamped``, alpha 1, up_offset 0), plus one shared expert of the same kind and width (whatever
  ``n_shared_experts`` says: ``DeepseekV4SparseMoeBlock`` builds one). ``mlp_layer_types`` chooses the router per
  layer: ``hash_moe``, experts looked up from the token id (``tid2eid``, the ``hash`` router), ``moe``, experts
  chosen by ``sqrt(softplus)`` scores plus ``e_score_correction_bias`` (``sqrtsoftplus_topk``); both weigh the
  chosen experts by their renormalised scores times ``routed_scaling_factor`` (``norm_topk_prob`` is not read);
* the multi-token-prediction layer (``num_nextn_predict_layers``) is not part of the causal LM.

On disk (transformers writes DeepSeek's original names): ``model.layers.{i}.attn.{wq_a, q_norm, wq_b, wkv, norm,
wo_a, wo_b, attn_sink}``, the compressor ``attn.compressor.{wkv, wgate, ape, norm}`` and indexer
``attn.indexer.{wq_b, weights_proj, compressor.*}``, the norms ``attn_norm`` / ``ffn_norm``, the experts
``ffn.experts.{e}.{w1, w3, w2}`` (gate, up, down), ``ffn.shared_experts.*``, the router ``ffn.gate.weight`` with
``ffn.gate.bias`` (the correction bias) or ``ffn.gate.tid2eid``, the stream ``hc_{attn,ffn}_{fn,base,scale}`` and
``model.hc_head.*``, the head ``head.weight``.
"""

from __future__ import annotations

from typing import Any, Mapping

from modkit.plugin import CheckpointError

from ._builders import ModelRequest, model_spec, per_layer_slots, rmsnorm
from ._keys import Ignore, Key, Own, Refuse, _text, sizes
from ._reader import HFConfig
from ._rope import _Scaling, _yarn
from ._transforms import StackExperts
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "deepseek_v4"

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
#: DeepseekV4Config's defaults of the keys the type's own code reads
OWN_DEFAULTS: dict[str, Any] = {
    "head_dim": 512,
    "q_lora_rank": 1024,
    "partial_rotary_factor": None,
    "qk_rope_head_dim": None,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_parameters": None,
    "sliding_window": 128,
    "compress_rates": None,
    "layer_types": None,
    "mlp_layer_types": None,
    "o_groups": 8,
    "o_lora_rank": 1024,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "index_topk": 512,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "n_routed_experts": 256,
    "num_experts_per_tok": 6,
    "moe_intermediate_size": 2048,
    "swiglu_limit": 10.0,
    "routed_scaling_factor": 1.5,
}
#: ``DeepseekV4Config.default_compress_rates``
COMPRESS_RATES = {CSA: 4, HCA: 128}
#: ``DeepseekV4Config.default_num_hash_layers``
HASH_LAYERS = 3


def _default_layer_types(n: int) -> list[str]:
    """``DeepseekV4Config.__post_init__``: two HCA layers, then CSA and HCA alternating (CSA on odd layers)."""
    return [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]


def _list_of(r: HFConfig, key: str, value: Any, n: int, allowed: tuple[str, ...]) -> list[str]:
    """``value`` as one of ``allowed`` per layer, else an error naming ``key`` (and ``allowed[0]`` everywhere)."""
    if not isinstance(value, list) or len(value) != n or set(value) - set(allowed):
        r.error(key, f"must list one of {list(allowed)} for each of the {n} layers, got {_text(value)}")
        return [allowed[0]] * n
    return list(value)


#: the labels of DeepSeek-V4's RoPE: ``main`` for sliding layers, ``compress`` for compressed ones
LABELS = ("main", "compress")


def _ropes(r: HFConfig, own: dict, legacy: dict, max_pos: Any) -> dict[str, tuple[float, Any]]:
    """Per rope label (:data:`LABELS`) ``(base, YaRN scaling dict or None)``, as ``DeepseekV4Config`` reads them:
    the legacy ``rope_scaling`` over ``rope_parameters``; nested per label, each ``default`` or ``yarn``
    (:func:`modkit_plugins.hf._rope._yarn`'s keys; ``truncate`` is not read: transformers reads it from the top
    level, where V4 has none, so it is always true), its base else ``rope_theta`` / ``compress_rope_theta``; flat,
    the ``compress`` label's scaling at ``compress_rope_theta`` with ``attention_factor`` 1 unless given (the
    ``__post_init__`` default). Problems are recorded in ``r`` naming the key."""
    out = {"main": (float(own["rope_theta"]), None), "compress": (float(own["compress_rope_theta"]), None)}
    key = "rope_scaling" if legacy["rope_scaling"] else "rope_parameters"
    rp = legacy["rope_scaling"] or own["rope_parameters"] or {}
    if not isinstance(rp, dict):
        r.error(key, f"must be a mapping, got {_text(rp)}")
        return out
    nested = {k: v for k, v in rp.items() if isinstance(v, dict)}
    if nested:
        todo = [(label, dict(nested[label]), f"{key}.{label}") for label in LABELS if label in nested]
    else:  # transformers puts its own base and rotated fraction over the flat dict's
        flat = {k: v for k, v in rp.items() if k not in ("rope_theta", "partial_rotary_factor")}
        if flat.get("rope_type", flat.get("type")) == "yarn":
            flat.setdefault("attention_factor", 1.0)
        todo = [("compress", flat, key)]
    for label, d, path in todo:
        kind = d.pop("rope_type", None) or d.pop("type", None) or "default"
        d.pop("type", None)
        d.pop("partial_rotary_factor", None)  # read_deepseek_v4 reads the rotated width
        theta = float(d.pop("rope_theta", out[label][0]))
        scaling = None
        if kind == "yarn":
            scaling = _yarn(_Scaling(r, d, path, max_pos, False), "yarn RoPE scaling", None)
            scaling.pop("truncate", None)
        elif kind != "default":
            r.error(f"{path}.rope_type", f"is {kind!r}; only the default RoPE and YaRN are converted")
            d.clear()
        for k, v in d.items():
            r.unknown_key(f"{path}.{k}", v)
        out[label] = (theta, scaling)
    return out


#: the integer keys of :data:`OWN_DEFAULTS`
INTEGERS = (
    "head_dim",
    "q_lora_rank",
    "sliding_window",
    "o_groups",
    "o_lora_rank",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
    "hc_sinkhorn_iters",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
#: the older keys ``DeepseekV4Config.__post_init__`` folds into the current ones (published checkpoints hold them)
LEGACY = ("compress_ratios", "compress_rate_csa", "compress_rate_hca", "num_hash_layers", "rope_scaling")
#: ``compress_ratios``' per-layer values (``_COMPRESS_RATIO_TO_LAYER_TYPE``)
RATIO_TYPES = {0: SLIDING, 4: CSA, 128: HCA}


def _rates(r: HFConfig, own: dict, legacy: dict) -> dict[str, int]:
    """``compress_rates`` over :data:`COMPRESS_RATES`, then the legacy ``compress_rate_csa`` / ``_hca``."""
    given = own["compress_rates"]
    if given is not None and not isinstance(given, dict):
        r.error("compress_rates", f"must map {CSA!r} and {HCA!r} to block sizes, got {_text(given)}")
        given = None
    rates = {**COMPRESS_RATES, **{k: v for k, v in (given or {}).items() if k in COMPRESS_RATES}}
    for kind, key in ((CSA, "compress_rate_csa"), (HCA, "compress_rate_hca")):
        if legacy[key] is not None:
            rates[kind] = legacy[key]
    return {k: r.check_number(f"compress_rates.{k}", v, COMPRESS_RATES[k], integer=True) for k, v in rates.items()}


def _layer_kinds(r: HFConfig, own: dict, legacy: dict, n: int) -> tuple[list[str], list[str]]:
    """Each layer's attention kind (``layer_types``, else the legacy per-layer ``compress_ratios`` 0 / 4 / 128, else
    the default pattern) and router kind (``mlp_layer_types``, else ``num_hash_layers`` hash layers first)."""
    types, ratios = own["layer_types"], legacy["compress_ratios"]
    if types is None and ratios is not None:
        if not isinstance(ratios, list) or len(ratios) < n or set(ratios[:n]) - set(RATIO_TYPES):
            r.error("compress_ratios", f"must list 0, 4 or 128 for each of the {n} layers, got {_text(ratios)}")
        else:
            types = [RATIO_TYPES[x] for x in ratios[:n]]
    kinds = _default_layer_types(n) if types is None else _list_of(r, "layer_types", types, n, (HCA, CSA, SLIDING))
    mlp = own["mlp_layer_types"]
    hashed = HASH_LAYERS if legacy["num_hash_layers"] is None else legacy["num_hash_layers"]
    hashed = r.check_number("num_hash_layers", hashed, HASH_LAYERS, integer=True, positive=False)
    default_mlp = ["hash_moe"] * min(n, hashed) + ["moe"] * max(0, n - hashed)
    return kinds, default_mlp if mlp is None else _list_of(r, "mlp_layer_types", mlp, n, ("moe", "hash_moe"))


def read_deepseek_v4(r: HFConfig, f: dict) -> None:
    """Read the keys of :data:`OWN_DEFAULTS` (and :data:`LEGACY`) into ``f["deepseek_v4"]``: per-layer attention
    and router kinds, compression rates, RoPE bases and rotated width, the stream and the experts; every problem is
    recorded in ``r`` naming the key."""
    n = f["n_layers"]
    own = {key: r.get(key, default) for key, default in OWN_DEFAULTS.items()}
    legacy = {key: r.get(key) for key in LEGACY}
    for key in INTEGERS:
        own[key] = r.check_number(key, own[key], OWN_DEFAULTS[key], integer=True)
    own["rates"] = _rates(r, own, legacy)
    own["types"], own["mlp"] = _layer_kinds(r, own, legacy, n)
    factor = own["partial_rotary_factor"]
    if factor is None:
        factor = own["qk_rope_head_dim"] / own["head_dim"] if own["qk_rope_head_dim"] else 64 / 512
    if isinstance(own["rope_parameters"], dict):  # the nested dicts carry the factor too
        factor = (own["rope_parameters"].get("main") or {}).get("partial_rotary_factor", factor)
    own["rope_dim"] = int(own["head_dim"] * factor)
    if not 0 < own["rope_dim"] <= own["head_dim"] or own["rope_dim"] % 2:
        r.error(
            "partial_rotary_factor",
            f"= {factor} rotates {own['rope_dim']} of {own['head_dim']} features; "
            "give a factor that rotates an even number of features, at least 2 and at most head_dim",
        )
        own["rope_dim"] = own["head_dim"]
    own["ropes"] = _ropes(r, own, legacy, f.get("max_seq_len"))
    f["deepseek_v4"] = own


def _attention(own: Mapping[str, Any], layer_type: str, eps: float) -> dict:
    """The ``compressed_attention`` spec of a layer of ``layer_type``."""
    theta, scaling = own["ropes"]["main" if layer_type == SLIDING else "compress"]
    spec: dict[str, Any] = {
        "type": "compressed_attention",
        "n_heads": own["n_heads"],
        "head_dim": own["head_dim"],
        "q_lora_rank": own["q_lora_rank"],
        "rope_dim": own["rope_dim"],
        "rope_theta": theta,
        "rope_scaling": scaling,
        "window": own["sliding_window"],
        "compress_ratio": None if layer_type == SLIDING else own["rates"][layer_type],
        "overlap": layer_type == CSA,
        "o_groups": own["o_groups"],
        "o_lora_rank": own["o_lora_rank"],
        "eps": eps,
    }
    if layer_type == CSA:
        spec.update({k: own[k] for k in ("index_n_heads", "index_head_dim", "index_topk")})
    return spec


def _ffn(own: Mapping[str, Any], mlp_type: str) -> dict:
    """The mixture of a layer whose ``mlp_layer_types`` entry is ``mlp_type`` (``hash_moe`` or ``moe``)."""
    expert = {
        "type": "swiglu_clamped",
        "d_ff": own["moe_intermediate_size"],
        "alpha": 1.0,
        "limit": float(own["swiglu_limit"]),
        "up_offset": 0.0,
    }
    scale = float(own["routed_scaling_factor"])
    if mlp_type == "hash_moe":
        router = {"type": "hash", "renormalize": True, "gate": True, "score": "sqrtsoftplus"}
    else:
        router = {"type": "sqrtsoftplus_topk", "renormalize": True, "correction_bias": True}
    return {
        "type": "moe",
        "n_experts": own["n_routed_experts"],
        "top_k": own["num_experts_per_tok"],
        "expert": expert,
        "router": {**router, "routed_scaling_factor": scale},
        "shared": dict(expert),
        "aux_loss_coef": 0.0,
        "z_loss_coef": 0.0,
    }


def deepseek_v4_spec(r: HFConfig, f: Mapping[str, Any]) -> dict:
    """The spec dict of fields ``f`` (sizes, norm, head) and ``f["deepseek_v4"]``: one layer per ``layer_types``
    and ``mlp_layer_types`` entry, the most common the block and the others overrides, on the ``mhc`` stream."""
    own = {**f["deepseek_v4"], "n_heads": f["n_heads"]}
    n, norm = f["n_layers"], rmsnorm(f["eps"], False)
    layers = [
        {"attention": _attention(own, t, float(f["eps"])), "ffn": _ffn(own, m)}
        for t, m in zip(own["types"], own["mlp"])
    ]
    default, overrides = per_layer_slots(layers, n)
    block = {**default, "norm": norm, "placement": {"type": "pre"}}
    spec = model_spec(
        r,
        ModelRequest(
            vocab_size=f["vocab_size"],
            d_model=f["d_model"],
            n_layers=n,
            max_seq_len=f["max_seq_len"],
            position={"type": "none"},
            block=block,
            overrides=overrides,
            final_norm=norm,
            tie_embeddings=f["tie_embeddings"],
            init_std=f["init_std"],
        ),
    )
    spec["stream"] = {
        "type": "mhc",
        "n_streams": own["hc_mult"],
        "sinkhorn_iters": own["hc_sinkhorn_iters"],
        "eps": float(own["hc_eps"]),
        "norm_eps": float(f["eps"]),
    }
    return spec


def _layer_type(att) -> str:
    if att.compress_ratio is None:
        return SLIDING
    return CSA if att.overlap else HCA


def _rope_dict(label: str, atts: list, theta: float, factor: float) -> dict:
    """The nested ``rope_parameters`` of rope label ``label`` whose layers' attentions are ``atts``: ``default``,
    or ``yarn`` with the keys ``_compute_yarn_parameters`` reads (``attention_factor`` only when set: nested,
    transformers derives it).

    Raises:
        CheckpointError: the layers of the label rotate differently (one base and scaling per label), or a YaRN
            scaling has ``truncate`` false (transformers' DeepSeek-V4 always truncates).
    """
    out = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": factor}
    if len({(a.rope_theta, a.rope_scaling.model_dump_json() if a.rope_scaling else None) for a in atts}) > 1:
        raise CheckpointError(
            f"the {label!r} RoPE layers differ in compressed_attention.rope_theta or rope_scaling, but DeepSeek-V4's "
            "config holds one per label; give every such layer the same"
        )
    sc = atts[0].rope_scaling if atts else None
    if sc is None:
        return out
    if not sc.truncate:
        raise CheckpointError(
            "compressed_attention.rope_scaling.truncate is false, but transformers' DeepSeek-V4 always truncates "
            "YaRN's correction range; set truncate true to export"
        )
    out.update(
        rope_type="yarn",
        factor=sc.factor,
        original_max_position_embeddings=sc.original_max_seq_len,
        beta_fast=sc.beta_fast,
        beta_slow=sc.beta_slow,
    )
    out.update({k: getattr(sc, k) for k in ("mscale", "mscale_all_dim", "attention_factor") if getattr(sc, k)})
    return out


def write_deepseek_v4(spec, base: Mapping[str, Any]) -> dict:
    """The config keys of :data:`OWN_DEFAULTS` (and the head count) for a validated ``spec``; a RoPE base no layer
    uses (the main one without sliding layers) is the source config ``base``'s, else the default; each rope
    label's YaRN scaling (:func:`_rope_dict`) is that of its first layer.

    Raises:
        CheckpointError: a YaRN scaling transformers cannot express (:func:`_rope_dict`).
    """
    layers = [spec.layer(i) for i in range(spec.n_layers)]
    atts, ffns = [x.attention for x in layers], [x.ffn for x in layers]
    types = [_layer_type(a) for a in atts]
    att = atts[0]
    csa = next((a for a in atts if _layer_type(a) == CSA), None)
    hca = next((a for a in atts if _layer_type(a) == HCA), None)
    main = next((a.rope_theta for a in atts if a.compress_ratio is None), None)
    main = (base.get("rope_theta") or OWN_DEFAULTS["rope_theta"]) if main is None else main
    compress = next((a.rope_theta for a in atts if a.compress_ratio is not None), None)
    compress = (
        (base.get("compress_rope_theta") or OWN_DEFAULTS["compress_rope_theta"]) if compress is None else compress
    )
    factor = att.rope_dim / att.head_dim
    moe, expert = ffns[0], ffns[0].expert
    out = {
        "num_attention_heads": att.n_heads,
        "head_dim": att.head_dim,
        "q_lora_rank": att.q_lora_rank,
        "partial_rotary_factor": factor,
        "rope_theta": main,
        "compress_rope_theta": compress,
        "rope_parameters": {
            "main": _rope_dict("main", [a for a in atts if a.compress_ratio is None], main, factor),
            "compress": _rope_dict("compress", [a for a in atts if a.compress_ratio is not None], compress, factor),
        },
        "sliding_window": att.window,
        "compress_rates": {
            CSA: csa.compress_ratio if csa else COMPRESS_RATES[CSA],
            HCA: hca.compress_ratio if hca else COMPRESS_RATES[HCA],
        },
        "layer_types": types,
        "mlp_layer_types": ["hash_moe" if x.router.type == "hash" else "moe" for x in ffns],
        "o_groups": att.o_groups,
        "o_lora_rank": att.o_lora_rank,
        "hc_mult": spec.stream.n_streams,
        "hc_sinkhorn_iters": spec.stream.sinkhorn_iters,
        "hc_eps": spec.stream.eps,
        "n_routed_experts": moe.n_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": expert.d_ff,
        "swiglu_limit": expert.limit,
        "routed_scaling_factor": moe.router.routed_scaling_factor,
    }
    for k in ("index_n_heads", "index_head_dim", "index_topk"):
        out[k] = getattr(csa, k) if csa else OWN_DEFAULTS[k]
    return out


class DeepseekV4Type(HFType):
    """:class:`HFType` whose conversions build DeepSeek-V4's layers, stream and routers (:func:`deepseek_v4_spec`,
    :func:`write_deepseek_v4`) from the table's sizes, norm and head fields."""

    def convert(self, cfg: dict) -> dict:
        """Hugging Face config → modkit spec dict (:func:`deepseek_v4_spec`).

        Raises:
            SpecError: every unsupported field named with its value.
        """
        r = HFConfig(cfg, self.model_type)
        return r.finish(deepseek_v4_spec(r, self.fields(r)))

    def to_config(self, spec, base: Mapping[str, Any]) -> dict:
        """The architecture keys of the config for ``spec``: the table's, then :func:`write_deepseek_v4`'s."""
        cfg = super().to_config(spec, base)
        cfg.update(write_deepseek_v4(spec, base))
        return cfg


L = "model.layers.{i}."
A, C, X, F = (
    "layers.{i}.attention.",
    "layers.{i}.attention.compressor.",
    "layers.{i}.attention.indexer.",
    "layers.{i}.ffn.",
)


def _compressor(ours: str, hf: str) -> tuple:
    """The rows of one compressor (the attention's or the indexer's)."""
    return (
        W(ours + "kv_proj.weight", hf + "wkv.weight"),
        W(ours + "gate_proj.weight", hf + "wgate.weight"),
        W(ours + "position_bias", hf + "ape"),
        W(ours + "kv_norm", hf + "norm.weight"),
    )


TENSORS = (
    W("embed.weight", "model.embed_tokens.weight"),
    W("final_norm.weight", "model.norm.weight"),
    *(W(f"stream.hc_{x}", f"model.hc_head.hc_{x}") for x in ("fn", "base", "scale")),
    W("layers.{i}.attn_norm.weight", L + "attn_norm.weight"),
    W("layers.{i}.ffn_norm.weight", L + "ffn_norm.weight"),
    *(W(f"layers.{{i}}.{s}_hc.{x}", L + f"hc_{s}_{x}") for s in ("attn", "ffn") for x in ("fn", "base", "scale")),
    W(A + "q_a_proj.weight", L + "attn.wq_a.weight"),
    W(A + "q_a_norm", L + "attn.q_norm.weight"),
    W(A + "q_b_proj.weight", L + "attn.wq_b.weight"),
    W(A + "kv_proj.weight", L + "attn.wkv.weight"),
    W(A + "kv_norm", L + "attn.norm.weight"),
    W(A + "o_a_proj.weight", L + "attn.wo_a.weight"),
    W(A + "o_b_proj.weight", L + "attn.wo_b.weight"),
    W(A + "sinks", L + "attn.attn_sink"),
    *_compressor(C, L + "attn.compressor."),
    *_compressor(X + "compressor.", L + "attn.indexer.compressor."),
    W(X + "q_b_proj.weight", L + "attn.indexer.wq_b.weight"),
    W(X + "weights_proj.weight", L + "attn.indexer.weights_proj.weight"),
    W(F + "router.proj.weight", L + "ffn.gate.weight"),
    W(F + "router.correction_bias", L + "ffn.gate.bias"),
    W(F + "router.table", L + "ffn.gate.tid2eid"),
    *(
        W(F + f"experts.{x}", L + f"ffn.experts.{{e}}.{w}.weight", StackExperts())
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ),
    *(
        W(F + f"shared.{x}.weight", L + f"ffn.shared_experts.{w}.weight")
        for x, w in (("gate", "w1"), ("up", "w3"), ("down", "w2"))
    ),
    Head("head.weight"),
)

_OWN_NOTE = (
    "DeepSeek-V4's own keys: per-layer attention kinds and compression, the indexer, RoPE bases, the stream, the "
    "experts and routers (read_deepseek_v4)"
)

DEEPSEEK_V4 = DeepseekV4Type(
    model_type=MODEL_TYPE,
    architecture="DeepseekV4ForCausalLM",
    notes=__doc__,
    keys={
        **sizes(
            vocab_size=129280,
            hidden_size=4096,
            num_hidden_layers=43,
            num_attention_heads=64,
            max_position_embeddings=1048576,
        ),
        "rms_norm_eps": Key("eps", 1e-6, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "head_dim": Own(
            (*OWN_DEFAULTS, *LEGACY),
            _OWN_NOTE,
            # the features those keys switch on, for the reference page (the own code writes the spec parts)
            fields=(
                "sliding_window",
                "sinks",
                "moe",
                "shared_d_ff",
                "correction_bias",
                "routed_scaling_factor",
                "expert_clamp",
            ),
        ),
        "num_key_value_heads": Refuse(1, "one key/value head serves every query head (DeepseekV4Attention)"),
        "hidden_act": Refuse("silu", "the experts are clamped SwiGLUs (DeepseekV4MLP, DeepseekV4Experts)"),
        "scoring_func": Refuse("sqrtsoftplus", "the routers score experts by sqrt(softplus(logits))"),
        "attention_bias": Refuse(False, "DeepseekV4Attention's projections carry no bias"),
        "mlp_bias": Refuse(False, "the experts carry no bias"),
        "n_shared_experts": Ignore("DeepseekV4SparseMoeBlock builds one shared expert whatever its value"),
        "norm_topk_prob": Ignore("the routers renormalise the chosen experts' weights whatever its value"),
        "num_nextn_predict_layers": Ignore("the multi-token-prediction layer is not part of the causal LM"),
        "attention_dropout": Ignore("DeepseekV4Attention applies no attention dropout in the modelled forward"),
        "router_aux_loss_coef": Ignore("weight of the load-balancing loss (training only)"),
        "router_jitter_noise": Ignore("router noise in training; inference is unchanged"),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    tensors=TENSORS,
    fixed={"position": {"type": "none"}},
    read_own=read_deepseek_v4,
    module=__name__,
)

TYPE = DEEPSEEK_V4
