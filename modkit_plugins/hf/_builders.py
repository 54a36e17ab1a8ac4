"""The builders of spec dicts a model type's table and its own code use: an attention (:class:`AttentionRequest`),
a gated FFN, the norms, a ``layers`` selector, per-layer overrides and the top-level spec (:class:`ModelRequest`).

Each writes a component's spec dict with its default-valued fields left out, so that converted specs stay short.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from ._reader import HFConfig


@dataclass(frozen=True)
class AttentionRequest:
    """What an attention spec is made from (:func:`attention`).

    Attributes:
        d_model: residual stream width.
        n_heads: query heads.
        n_kv_heads: key/value heads (``mha`` when equal to ``n_heads``, ``mqa`` when 1, else ``gqa``).
        head_dim: width of one head (``None``, or ``d_model / n_heads``: left out of the spec).
        bias: biases on the q, k, v and o projections, in that order.
        qk_norm: the norm spec of q and k (``None``: no QK-norm).
        qk_norm_scope: ``"head"`` (per head) or ``"full"`` (over all heads).
        sliding_window: the window of a sliding-window attention, in tokens.
        softmax_scale: multiplier of q·k (``None``: 1/sqrt(head_dim)).
        logit_softcap: tanh soft-cap of the attention logits.
    """

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: Optional[int] = None
    bias: Sequence[bool] = (False, False, False, False)
    qk_norm: Optional[dict] = None
    qk_norm_scope: str = "head"
    sliding_window: Optional[int] = None
    softmax_scale: Optional[float] = None
    logit_softcap: Optional[float] = None


def attention(req: AttentionRequest) -> dict:
    """An attention spec (``mha``/``mqa``/``gqa`` chosen from the head counts), default-valued fields left out."""
    if req.n_kv_heads == req.n_heads:
        spec: dict[str, Any] = {"type": "mha", "n_heads": req.n_heads}
    elif req.n_kv_heads == 1:
        spec = {"type": "mqa", "n_heads": req.n_heads}
    else:
        spec = {"type": "gqa", "n_heads": req.n_heads, "n_kv_heads": req.n_kv_heads}
    if req.head_dim is not None and (req.d_model % req.n_heads or req.d_model // req.n_heads != req.head_dim):
        spec["head_dim"] = req.head_dim
    for name, on in zip(("q_bias", "k_bias", "v_bias", "o_bias"), req.bias):
        if on:
            spec[name] = True
    if req.qk_norm is not None:
        spec["qk_norm"] = req.qk_norm
        if req.qk_norm_scope != "head":
            spec["qk_norm_scope"] = req.qk_norm_scope
    if req.sliding_window is not None:
        spec["sliding_window"] = req.sliding_window
    if req.softmax_scale is not None:
        spec["softmax_scale"] = req.softmax_scale
    if req.logit_softcap is not None:
        spec["logit_softcap"] = float(req.logit_softcap)
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


def per_layer(variants: Sequence[Any], n_layers: int, slots: Callable[[Any], dict]) -> tuple[Any, list[dict]]:
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


def _key(x: Any) -> str:
    return json.dumps(x, sort_keys=True)


def per_layer_slots(layers: Sequence[Mapping[str, Any]], n_layers: int) -> tuple[dict, list[dict]]:
    """Split per-layer slot dicts (``{"attention": ..., "position": ..., "ffn": ...}``) into the block default (the most
    common layer; ties go to layer 0's) and overrides that replace only the slots that differ from it, one per
    distinct layer, in order of first appearance (:func:`per_layer`)."""
    keyed = {_key(layer): layer for layer in layers}
    # an override cannot take the ffn away (its null means "keep the block's"): with layers without an FFN, the
    # block is one of them
    pool = [layer for layer in layers if layer.get("ffn", 0) is None] or layers
    default_key, _ = per_layer([_key(layer) for layer in pool], len(pool), lambda v: {})
    default = keyed[default_key]
    overrides = []
    for key, layer in keyed.items():
        if key == default_key:
            continue
        picked = [i for i, other in enumerate(layers) if _key(other) == key]
        slots = {name: value for name, value in layer.items() if _key(value) != _key(default[name])}
        overrides.append({"layers": layer_selector(picked, n_layers), **slots})
    return default, overrides


@dataclass(frozen=True)
class ModelRequest:
    """The top-level fields of a spec dict (:func:`model_spec`); see :data:`FIELDS` for their meaning.

    Attributes:
        vocab_size, d_model, n_layers, max_seq_len: the sizes.
        position: the block default position spec; block: the block spec; overrides: the per-layer overrides.
        final_norm: the norm after the last block (``None``: none).
        tie_embeddings, lm_head_bias, embedding_scale, logit_scale, final_logit_softcap: the head fields.
        init_std: standard deviation of the weight init (``None``: the spec's default).
        dropout: ``{"embedding", "attention", "residual"}`` probabilities (written only when one is non-zero).
    """

    vocab_size: int
    d_model: int
    n_layers: int
    max_seq_len: int
    position: dict
    block: dict
    overrides: Sequence[dict] = ()
    final_norm: Optional[dict] = None
    tie_embeddings: bool = False
    lm_head_bias: bool = False
    embedding_scale: Any = None
    logit_scale: Optional[float] = None
    final_logit_softcap: Optional[float] = None
    init_std: Optional[float] = None
    dropout: Optional[dict] = None


def model_spec(r: HFConfig, m: ModelRequest) -> dict:
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
        "vocab_size": m.vocab_size,
        "d_model": m.d_model,
        "n_layers": m.n_layers,
        "max_seq_len": m.max_seq_len,
        "position": m.position,
        "block": m.block,
    }
    if m.overrides:
        spec["overrides"] = list(m.overrides)
    if m.embedding_scale is not None:
        spec["embedding_scale"] = m.embedding_scale
    spec["final_norm"] = m.final_norm
    spec["tie_embeddings"] = bool(m.tie_embeddings)
    if m.lm_head_bias:
        spec["lm_head_bias"] = True
    if m.logit_scale is not None:
        spec["logit_scale"] = float(m.logit_scale)
    if m.final_logit_softcap is not None:
        spec["final_logit_softcap"] = float(m.final_logit_softcap)
    if m.init_std is not None:
        spec["init_std"] = float(m.init_std)
    if m.dropout and any(m.dropout.values()):
        spec["dropout"] = m.dropout
    return spec
