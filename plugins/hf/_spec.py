"""The decoder a model type's table describes: its fields, the spec assembled from them, and the way back.

A model type's config table (:mod:`._keys`) reads a Hugging Face config into **fields**, a flat description of the
network in modkit's terms (:data:`FIELDS`: sizes, the norm, the block placement, attention biases and windows,
the position scheme, the FFN or MoE, the head). :func:`assemble` turns fields into a spec dict (``mha``/``mqa``/
``gqa`` from the head counts, per-layer windows and position schemes as compact overrides); :func:`fields_of`
reads the same fields back from a validated spec, which is what the table writes into an exported config. Every
model type shares these two functions: what differs between types is only which config key holds which field
(the table) and the fields a type fixes (its ``fixed`` values).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional, Sequence

from ._reader import HFConfig

#: The fields of a decoder: ``name -> (value when neither the type nor its table sets it, meaning)``.
FIELDS: dict[str, tuple[Any, str]] = {
    "vocab_size": (None, "number of token ids"),
    "d_model": (None, "residual stream width"),
    "n_layers": (None, "number of blocks"),
    "max_seq_len": (None, "longest sequence"),
    "n_heads": (None, "query heads"),
    "n_kv_heads": (None, "key/value heads (None: n_heads; mha when equal to n_heads, mqa when 1, else gqa)"),
    "head_dim": (None, "width of one head"),
    "d_ff": (None, "hidden width of the FFN (of each expert in an MoE)"),
    "norm": ("rmsnorm", "every norm of the model: 'rmsnorm' or 'layernorm'"),
    "eps": (1e-6, "the norms' epsilon"),
    "unit_offset": (False, "RMSNorm scales by (1 + weight) (Gemma)"),
    "norm_bias": (True, "LayerNorm has a bias"),
    "placement": ({"type": "pre"}, "the block placement spec"),
    "final_norm": (True, "a norm after the last block"),
    "embedding_norm": (False, "a norm on the token embeddings (BERT)"),
    "qkv_bias": (False, "biases on the q, k and v projections"),
    "o_bias": (False, "bias on the output projection"),
    "qk_norm": (None, "norm of q and k before RoPE: None, 'head' (per head) or 'full' (over all heads)"),
    "softmax_scale": (None, "multiplier of q·k (None: 1/sqrt(head_dim))"),
    "attn_softcap": (None, "tanh soft-cap of the attention logits"),
    "causal": (True, "causal mask (false: bidirectional encoder)"),
    "layer_types": (None, "kind of every layer: 'full_attention' or 'sliding_attention' (None: all full)"),
    "sliding_window": (None, "the window of the sliding_attention layers"),
    "position": (None, "the position spec of every layer"),
    "position_by_type": (None, "position spec per layer type, when they differ (Gemma 3's local and global RoPE)"),
    "positions": (None, "position spec per layer, when layers differ otherwise (NoPE layers)"),
    "mixer": (None, "the token mixer of every layer when it is not an attention: a recurrent mixer's spec (Mamba-2), "
              "written by the type's own code; None: an attention from the head fields"),
    "ffn": ("gated", "'gated' (SwiGLU/GeGLU: gate, up, down), 'mlp' (up, down) or None (no FFN: Mamba-2's blocks)"),
    "act": ("silu", "the FFN activation (modkit's name)"),
    "mlp_bias": (False, "biases on the FFN projections"),
    "moe": (False, "every FFN is a mixture of gated experts with a top-k router"),
    "n_experts": (None, "experts per MoE layer"),
    "top_k": (None, "experts per token"),
    "renormalize": (False, "the top-k router probabilities are renormalised to sum to 1"),
    "aux_loss_coef": (0.0, "weight of the load-balancing loss"),
    "tie_embeddings": (False, "the head shares the token embedding"),
    "lm_head_bias": (False, "the head has a bias"),
    "embedding_scale": (None, "multiplier of the token embeddings ('sqrt_d_model': Gemma)"),
    "final_logit_softcap": (None, "tanh soft-cap of the logits"),
    "init_std": (0.02, "standard deviation of the weight init"),
    "dropout_embedding": (None, "dropout on the embeddings (None: the type has no such key)"),
    "dropout_attention": (None, "dropout on the attention probabilities"),
    "dropout_residual": (None, "dropout on each sublayer output"),
}

#: the spec's ``dropout`` fields and the field each comes from
DROPOUT_FIELDS = {"embedding": "dropout_embedding", "attention": "dropout_attention", "residual": "dropout_residual"}


def attention(
    d_model: int,
    n_heads: int,
    n_kv_heads: int,
    head_dim: Optional[int] = None,
    *,
    bias: Sequence[bool] = (False, False, False, False),
    qk_norm: Optional[dict] = None,
    qk_norm_scope: str = "head",
    sliding_window: Optional[int] = None,
    softmax_scale: Optional[float] = None,
    logit_softcap: Optional[float] = None,
) -> dict:
    """An attention spec (``mha``/``mqa``/``gqa`` chosen from the head counts), default-valued fields left out."""
    if n_kv_heads == n_heads:
        spec: dict[str, Any] = {"type": "mha", "n_heads": n_heads}
    elif n_kv_heads == 1:
        spec = {"type": "mqa", "n_heads": n_heads}
    else:
        spec = {"type": "gqa", "n_heads": n_heads, "n_kv_heads": n_kv_heads}
    if head_dim is not None and (d_model % n_heads or d_model // n_heads != head_dim):
        spec["head_dim"] = head_dim
    for name, on in zip(("q_bias", "k_bias", "v_bias", "o_bias"), bias):
        if on:
            spec[name] = True
    if qk_norm is not None:
        spec["qk_norm"] = qk_norm
        if qk_norm_scope != "head":
            spec["qk_norm_scope"] = qk_norm_scope
    if sliding_window is not None:
        spec["sliding_window"] = sliding_window
    if softmax_scale is not None:
        spec["softmax_scale"] = softmax_scale
    if logit_softcap is not None:
        spec["logit_softcap"] = float(logit_softcap)
    return spec


def gated_ffn(d_ff: int, activation: str, bias: bool = False) -> dict:
    """``swiglu`` for silu, ``geglu`` for the tanh GELU, else the gated MLP with an explicit activation."""
    if activation == "silu":
        spec: dict[str, Any] = {"type": "swiglu", "d_ff": d_ff}
    elif activation == "gelu_tanh":
        spec = {"type": "geglu", "d_ff": d_ff}
    elif activation == "gelu":
        spec = {"type": "geglu", "d_ff": d_ff, "activation": "gelu"}
    else:
        spec = {"type": "swiglu", "d_ff": d_ff, "activation": activation}
    if bias:
        spec["bias"] = True
    return spec


def rmsnorm(eps: float, unit_offset: bool = False) -> dict:
    """An ``rmsnorm`` spec."""
    return {"type": "rmsnorm", "eps": float(eps), **({"unit_offset": True} if unit_offset else {})}


def layernorm(eps: float, bias: bool = True) -> dict:
    """A ``layernorm`` spec."""
    return {"type": "layernorm", "eps": float(eps), **({} if bias else {"bias": False})}


def layer_selector(indices: Sequence[int], n_layers: int) -> Any:
    """The most readable ``layers`` value for sorted ``indices``: a range ``{start, stop, step}`` or a list."""
    idx = list(indices)
    if len(idx) >= 2:
        step = idx[1] - idx[0]
        if step > 0 and all(b - a == step for a, b in zip(idx, idx[1:])):
            sel: dict[str, int] = {}
            if idx[0]:
                sel["start"] = idx[0]
            if idx[-1] + step < n_layers:
                sel["stop"] = idx[-1] + 1
            if step != 1:
                sel["step"] = step
            return sel
    return idx


def per_layer(
    variants: Sequence[Any], n_layers: int, slots: Callable[[Any], dict]
) -> tuple[Any, list[dict]]:
    """Split per-layer variants into the block default (the most common; ties go to layer 0's) and overrides.

    Args:
        variants: one hashable description per layer.
        slots: maps a variant to the slots it sets, e.g. ``{"attention": {...}, "position": {...}}``.

    Returns:
        ``(default variant, overrides)`` with one override per other variant, in order of first appearance.
    """
    counts: dict[Any, int] = {}
    for v in variants:
        counts[v] = counts.get(v, 0) + 1
    default = max(counts, key=lambda v: (counts[v], v == variants[0]))
    overrides = []
    for v in counts:
        if v == default:
            continue
        layers = [i for i, x in enumerate(variants) if x == v]
        overrides.append({"layers": layer_selector(layers, n_layers), **slots(v)})
    return default, overrides


def model_spec(
    r: HFConfig,
    *,
    vocab_size: int,
    d_model: int,
    n_layers: int,
    max_seq_len: int,
    position: dict,
    block: dict,
    overrides: Sequence[dict] = (),
    final_norm: Optional[dict] = None,
    tie_embeddings: bool = False,
    lm_head_bias: bool = False,
    embedding_scale: Any = None,
    final_logit_softcap: Optional[float] = None,
    init_std: Optional[float] = None,
    dropout: Optional[dict] = None,
) -> dict:
    """Assemble the top-level spec dict (``name``/``description`` from the config's provenance); ``dropout`` is
    written only when one of its probabilities is non-zero."""
    source = r.cfg.get("_name_or_path") or r.cfg.get("name_or_path")
    archs = r.cfg.get("architectures") or []
    arch = f" ({archs[0]})" if isinstance(archs, list) and archs else ""
    spec: dict[str, Any] = {
        "schema_version": 1,
        "name": str(source) if source else r.model_type,
        "description": f"Converted from a Hugging Face {r.model_type} config{arch}.",
        "metadata": {"hf_model_type": r.model_type},
        "vocab_size": vocab_size,
        "d_model": d_model,
        "n_layers": n_layers,
        "max_seq_len": max_seq_len,
        "position": position,
        "block": block,
    }
    if overrides:
        spec["overrides"] = list(overrides)
    if embedding_scale is not None:
        spec["embedding_scale"] = embedding_scale
    spec["final_norm"] = final_norm
    spec["tie_embeddings"] = bool(tie_embeddings)
    if lm_head_bias:
        spec["lm_head_bias"] = True
    if final_logit_softcap is not None:
        spec["final_logit_softcap"] = float(final_logit_softcap)
    if init_std is not None:
        spec["init_std"] = float(init_std)
    if dropout and any(dropout.values()):
        spec["dropout"] = dropout
    return spec


# ---------------------------------------------------------------------------------------------- fields -> spec


def norm_spec(f: Mapping[str, Any]) -> dict:
    """The norm spec of every norm of the model (block, final, embedding, QK-norm)."""
    if f["norm"] == "layernorm":
        return layernorm(f["eps"], f["norm_bias"])
    return rmsnorm(f["eps"], f["unit_offset"])


def ffn_spec(f: Mapping[str, Any]) -> dict:
    """The FFN spec: a gated FFN, an MLP, or a ``moe`` of gated experts under a top-k router (no router bias,
    no z-loss: transformers computes none for these models)."""
    if f["moe"]:
        return {
            "type": "moe",
            "n_experts": f["n_experts"],
            "top_k": f["top_k"],
            "expert": gated_ffn(f["d_ff"], f["act"]),
            "router": {"type": "topk", "renormalize": bool(f["renormalize"])},
            "aux_loss_coef": float(f["aux_loss_coef"]),
            "z_loss_coef": 0.0,
        }
    if f["ffn"] is None:
        return None
    if f["ffn"] == "mlp":
        return {"type": "mlp", "d_ff": f["d_ff"], "activation": f["act"], "bias": bool(f["mlp_bias"])}
    return gated_ffn(f["d_ff"], f["act"], bool(f["mlp_bias"]))


def assemble(r: HFConfig, f: Mapping[str, Any]) -> dict:
    """The spec dict that fields ``f`` describe (see :data:`FIELDS`).

    Layers differ only by their sliding window (``layer_types``, ``sliding_window``) and, when ``positions`` or
    ``position_by_type`` is given, their position scheme: the most common variant is the block, every other one an
    override (:func:`per_layer`).
    """
    n_layers = f["n_layers"]
    norm = norm_spec(f)
    if f["mixer"] is not None:  # a recurrent mixer on every layer: no heads, windows or per-layer positions
        return model_spec(
            r, vocab_size=f["vocab_size"], d_model=f["d_model"], n_layers=n_layers, max_seq_len=f["max_seq_len"],
            position=f["position"] or {"type": "none"},
            block={"mixer": dict(f["mixer"]), "ffn": ffn_spec(f), "norm": norm, "placement": dict(f["placement"])},
            final_norm=norm if f["final_norm"] else None, tie_embeddings=f["tie_embeddings"],
            lm_head_bias=f["lm_head_bias"], init_std=f["init_std"],
        )
    qk = norm if f["qk_norm"] else None
    bias = (f["qkv_bias"],) * 3 + (f["o_bias"],)

    kv = f["n_heads"] if f["n_kv_heads"] is None else f["n_kv_heads"]

    def attn(window: Optional[int]) -> dict:
        spec = attention(f["d_model"], f["n_heads"], kv, f["head_dim"], bias=bias, qk_norm=qk,
                         qk_norm_scope=f["qk_norm"] or "head", sliding_window=window, softmax_scale=f["softmax_scale"],
                         logit_softcap=f["attn_softcap"])
        if not f["causal"]:
            spec["causal"] = False
        return spec

    types = f["layer_types"] or ["full_attention"] * n_layers
    windows = [f["sliding_window"] if t == "sliding_attention" else None for t in types]
    positions = f["positions"]
    if positions is None and f["position_by_type"] is not None:
        positions = [f["position_by_type"].get(t, f["position"]) for t in types]
    if positions is None:
        default, overrides = per_layer(windows, n_layers, lambda w: {"attention": attn(w)})
        attention_spec, position = attn(default), f["position"]
    else:
        keyed = {json.dumps(p, sort_keys=True): p for p in positions}
        variants = [(w, json.dumps(p, sort_keys=True)) for w, p in zip(windows, positions)]
        default, overrides = per_layer(variants, n_layers, lambda v: {"attention": attn(v[0]), "position": keyed[v[1]]})
        attention_spec, position = attn(default[0]), keyed[default[1]]
    block = {"attention": attention_spec, "ffn": ffn_spec(f), "norm": norm, "placement": dict(f["placement"])}
    dropout = {name: float(f[field]) for name, field in DROPOUT_FIELDS.items() if f[field] is not None}
    spec = model_spec(
        r,
        vocab_size=f["vocab_size"],
        d_model=f["d_model"],
        n_layers=n_layers,
        max_seq_len=f["max_seq_len"],
        position=position,
        block=block,
        overrides=overrides,
        embedding_scale=f["embedding_scale"],
        final_norm=norm if f["final_norm"] else None,
        tie_embeddings=f["tie_embeddings"],
        lm_head_bias=f["lm_head_bias"],
        final_logit_softcap=f["final_logit_softcap"],
        init_std=f["init_std"],
        dropout=dropout,
    )
    if f["embedding_norm"]:
        spec["embedding_norm"] = norm
    return spec


# ---------------------------------------------------------------------------------------------- spec -> fields


def fields_of(spec) -> dict[str, Any]:
    """The fields (:data:`FIELDS`) of a validated spec, as an export writes them: layer 0 stands for the block;
    ``windows`` and ``positions`` hold every layer. Component configs stay objects (``position``,
    ``positions``, ``placement``); a field a component does not have is ``None``. Whether the fields describe the
    spec completely is checked afterwards, by converting the written config back."""
    from modkit import get_registry

    ls = spec.layer(0)
    att, ffn, norm = ls.attention, ls.ffn, ls.norm
    recurrent = get_registry().entry_for_config(att).kind != "attention"  # the mixer slot holds a recurrent mixer
    dense = getattr(ffn, "expert", ffn)
    router = getattr(ffn, "router", None)
    d = spec.d_model
    windows = [getattr(spec.layer(i).attention, "sliding_window", None) for i in range(spec.n_layers)]
    types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
    positions = [spec.layer(i).position for i in range(spec.n_layers)]
    by_type: dict[str, Any] = {}
    for t, p in zip(types, positions):
        by_type.setdefault(t, p)
    return {
        "vocab_size": spec.vocab_size,
        "d_model": d,
        "n_layers": spec.n_layers,
        "max_seq_len": spec.max_seq_len,
        "mixer": att if recurrent else None,
        "n_heads": None if recurrent else att.n_heads,
        "n_kv_heads": None if recurrent else att.kv_heads,
        "head_dim": None if recurrent else att.resolved_head_dim(d),
        "d_ff": getattr(dense, "d_ff", None),
        "norm": norm.type,
        "eps": getattr(norm, "eps", None),
        "unit_offset": getattr(norm, "unit_offset", False),
        "norm_bias": getattr(norm, "bias", True),
        "placement": ls.placement,
        "final_norm": spec.final_norm is not None,
        "embedding_norm": getattr(spec, "embedding_norm", None) is not None,
        "qkv_bias": bool(getattr(att, "q_bias", False)),
        "o_bias": bool(getattr(att, "o_bias", False)),
        "qk_norm": getattr(att, "qk_norm_scope", "head") if getattr(att, "qk_norm", None) is not None else None,
        "softmax_scale": getattr(att, "softmax_scale", None),
        "attn_softcap": getattr(att, "logit_softcap", None),
        "causal": getattr(att, "causal", True),
        "windows": windows,
        "layer_types": types,
        "sliding_window": next((w for w in windows if w is not None), None),
        "position": ls.position,
        "position_by_type": by_type,
        "positions": positions,
        "ffn": None if ffn is None else "mlp" if getattr(dense, "type", None) == "mlp" else "gated",
        "act": getattr(dense, "act", None) or getattr(dense, "activation", None),
        "mlp_bias": bool(getattr(ffn, "bias", False)),
        "moe": getattr(ffn, "type", None) == "moe",
        "n_experts": getattr(ffn, "n_experts", None),
        "top_k": getattr(ffn, "top_k", None),
        "renormalize": bool(getattr(router, "renormalize", False)),
        "aux_loss_coef": getattr(ffn, "aux_loss_coef", None),
        "tie_embeddings": spec.tie_embeddings,
        "lm_head_bias": spec.lm_head_bias,
        "embedding_scale": spec.embedding_scale,
        "final_logit_softcap": spec.final_logit_softcap,
        "init_std": spec.init_std,
        **{field: float(getattr(spec.dropout, name)) for name, field in DROPOUT_FIELDS.items()},
    }
