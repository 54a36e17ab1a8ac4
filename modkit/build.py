"""Assembly: spec → ``nn.Module`` on the requested device and dtype, plus analytic summaries.

``build`` always constructs on ``meta`` first (instant even for 70B specs), then materialises with
``to_empty`` on the target device and runs one deterministic ``init_weights(seed)`` that also recomputes
every buffer. With ``device="meta"`` it stops after construction.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import torch
from torch import nn

from .errors import SpecError
from .interfaces import BuildContext
from .model import Model
from .registry import Registry, get_registry
from .spec import ModelSpec, iter_configs, load_spec, spec_model

BREAKDOWN_KEYS = ("embedding", "position", "attention", "ffn", "norm", "lm_head")
_KIND_TO_KEY = {k: k for k in BREAKDOWN_KEYS}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def _skip_torch_init():
    """Make ``torch.nn.init`` fills no-ops during construction: every tensor is set later by ``init_weights``,
    and on ``meta`` some fills (``normal_``) pull in torch's decomposition machinery, costing seconds."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_") and callable(getattr(nn.init, n))]
    saved = {n: getattr(nn.init, n) for n in names}
    for n in names:
        setattr(nn.init, n, lambda tensor, *a, **k: tensor)
    try:
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


def _parse_dtype(dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        out = getattr(torch, str(dtype).replace("torch.", ""), None)
        if not isinstance(out, torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    if not out.is_floating_point:
        raise ValueError(f"dtype must be a floating type (float32, bfloat16, float16; float64 for reference checks), got {out}")
    return out


def _position_key(cfg, heads: tuple, registry: Registry) -> tuple:
    """Layers share one position module per distinct config; q/k and bias schemes also depend on the heads."""
    acts_on = registry.entry_for_config(cfg, "position").capabilities.get("acts_on")
    return (cfg.model_dump_json(), heads if acts_on in ("qk", "bias") else None)


def _construct(spec: ModelSpec, registry: Registry) -> Model:
    base = BuildContext(
        spec.d_model,
        spec.n_layers,
        spec.vocab_size,
        spec.max_seq_len,
        registry,
        attention_dropout=spec.dropout.attention,
        residual_dropout=spec.dropout.residual,
    )
    layer_specs = [spec.layer(i) for i in range(spec.n_layers)]
    blocks, pos_keys, pos_modules, layer_position, windows = [], {}, [], [], []
    top_key = None
    for ls in layer_specs:
        ctx = base.__class__(**{**base.__dict__, "layer_index": ls.index})
        attention = ctx.build(ls.attention)
        ffn = ctx.build(ls.ffn)
        heads = (getattr(attention, "n_heads", None), getattr(attention, "head_dim", None))
        key = _position_key(ls.position, heads, registry)
        if key not in pos_keys:
            pos_keys[key] = len(pos_modules)
            pos_modules.append(ctx.build(ls.position, n_heads=heads[0], head_dim=heads[1]))
        layer_position.append(pos_keys[key])
        if ls.index == 0:
            heads0 = heads
            top_key = _position_key(spec.position, heads, registry)
        block = ctx.build(ls.placement, attention=attention, ffn=ffn, norm=ls.norm)
        blocks.append(block)
        windows.append(getattr(attention, "sliding_window", None))
    # the model-level scheme (it acts on embeddings) is the one layer 0 would use without overrides
    if top_key not in pos_keys:
        pos_keys[top_key] = len(pos_modules)
        pos_modules.append(base.build(spec.position, n_heads=heads0[0], head_dim=heads0[1]))
    order = [pos_keys[top_key]] + [i for i in range(len(pos_modules)) if i != pos_keys[top_key]]
    remap = {old: new for new, old in enumerate(order)}
    positions = nn.ModuleList([pos_modules[i] for i in order])
    layer_position = [remap[i] for i in layer_position]
    embed = nn.Embedding(spec.vocab_size, spec.d_model)
    embed.modkit_kind = "embedding"
    embedding_norm = base.build(spec.embedding_norm) if spec.embedding_norm is not None else None
    final_norm = base.build(spec.final_norm) if spec.final_norm is not None else None
    return Model(spec, embed, positions, layer_position, nn.ModuleList(blocks), embedding_norm, final_norm, windows)


def build(
    spec: Union[ModelSpec, dict, str, Path],
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    seed: int = 0,
    registry: Optional[Registry] = None,
) -> Model:
    """Assemble a model from a spec.

    Args:
        spec: a :class:`ModelSpec`, a dict, a JSON string or a path to a spec file (validated with
            :func:`~modkit.spec.load_spec`).
        device: target device (``"cpu"``, ``"cuda:0"``, ``"meta"``...); default CPU. On ``meta`` no memory
            is allocated and weights are left uninitialised.
        dtype: parameter dtype (``float32`` default, ``bfloat16``, ``float16``); buffers that need float32
            (e.g. RoPE inverse frequencies) stay float32.
        seed: seed of the deterministic weight init.
        registry: defaults to the process-wide registry.

    Returns:
        :class:`~modkit.model.Model` in training mode.

    Raises:
        SpecError: the spec is invalid.
        ValueError: unknown dtype.
    """
    reg = registry or get_registry()
    if not isinstance(spec, spec_model(reg)):
        spec = load_spec(spec, registry=reg)
    torch_dtype = _parse_dtype(dtype)
    target = torch.device(device) if device is not None else torch.device("cpu")
    with torch.device("meta"), _default_dtype(torch_dtype), _skip_torch_init():
        model = _construct(spec, reg)
    if target.type == "meta":
        return model
    model.to_empty(device=target)
    model.init_weights(seed)
    return model


def count_params(spec_or_model: Union[ModelSpec, dict, str, Path, nn.Module], *, registry: Optional[Registry] = None) -> int:
    """Exact number of parameters (shared tensors counted once), built on ``meta`` if given a spec."""
    return breakdown(spec_or_model, registry=registry)["total"]


def _model(spec_or_model, registry) -> Model:
    if isinstance(spec_or_model, nn.Module):
        return spec_or_model
    return build(spec_or_model, device="meta", registry=registry)


def breakdown(spec_or_model: Any, *, registry: Optional[Registry] = None) -> dict[str, int]:
    """Parameter counts by category: ``embedding, position, attention, ffn, norm, lm_head, total``.

    Each parameter is assigned to the outermost enclosing module tagged with a kind (``attention`` includes
    QK-norm weights, ``ffn`` includes MoE routers, ``norm`` every norm outside attention). Tied weights count
    once, under ``embedding``. Parameters owned directly by a placement (no sublayer) count under ``other``,
    present only when non-zero.
    """
    model = _model(spec_or_model, registry)
    counts = {k: 0 for k in BREAKDOWN_KEYS}
    counts["other"] = 0
    seen: set[int] = set()

    def walk(module: nn.Module, category: str) -> None:
        if category == "other":  # the outermost tagged module decides: a QK-norm stays attention
            category = _KIND_TO_KEY.get(getattr(module, "modkit_kind", None), category)
        for p in module.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                counts[category] += p.numel()
        for child in module.children():
            walk(child, category)

    if isinstance(model, Model):  # its only direct parameter is a tied head's bias
        for p in model.parameters(recurse=False):
            seen.add(id(p))
            counts["lm_head"] += p.numel()
        for child in model.children():
            walk(child, "other")
    else:
        walk(model, "other")
    if counts["other"] == 0:
        del counts["other"]
    counts["total"] = sum(counts.values())
    return counts


def kv_cache_bytes_per_token(spec_or_model: Any, dtype: Union[str, torch.dtype, None] = "bfloat16", *, registry: Optional[Registry] = None) -> int:
    """Bytes of KV cache one token occupies across all layers: Σ_layers 2 · n_kv_heads · head_dim · bytes(dtype).

    Attention modules may override the formula with a ``kv_cache_elements_per_token()`` method.
    """
    model = _model(spec_or_model, registry)
    size = torch.empty((), dtype=_parse_dtype(dtype)).element_size()
    total = 0
    for module in model.modules():
        if getattr(module, "modkit_kind", None) != "attention":
            continue
        fn = getattr(module, "kv_cache_elements_per_token", None)
        total += fn() if callable(fn) else 2 * module.n_kv_heads * module.head_dim
    return total * size


def active_params_per_token(spec_or_model: Any, *, registry: Optional[Registry] = None) -> int:
    """Parameters used per token: total minus what sparse modules skip (``inactive_params_per_token()``)."""
    model = _model(spec_or_model, registry)
    inactive = 0
    for module in model.modules():
        fn = getattr(module, "inactive_params_per_token", None)
        if callable(fn):
            inactive += int(fn())
    return breakdown(model)["total"] - inactive


@dataclass
class ModelSummary:
    """What ``modkit build`` reports about a spec (see :func:`summarize`)."""

    name: Optional[str]
    params: dict[str, int]
    active_params_per_token: int
    weight_bytes: int
    kv_cache_bytes_per_token: int
    dtype: str
    components: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        """The ``--json`` object of ``modkit build``."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "params": self.params,
            "active_params_per_token": self.active_params_per_token,
            "weight_bytes": self.weight_bytes,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "components": self.components,
        }


def summarize(model: Model, dtype: Union[str, torch.dtype, None] = None, registry: Optional[Registry] = None) -> ModelSummary:
    """Parameter breakdown, active parameters, weight and KV-cache bytes and components used of a built model."""
    reg = registry or get_registry()
    tdtype = _parse_dtype(dtype) if dtype is not None else model.embed.weight.dtype
    size = torch.empty((), dtype=tdtype).element_size()
    params = breakdown(model)
    comps: dict[tuple[str, str], dict] = {}
    for path, cfg in iter_configs(model.spec):
        entry = reg.entry_for_config(cfg)
        item = comps.setdefault(
            entry.key,
            {
                "kind": entry.kind,
                "type": entry.type,
                "plugin": entry.provider.plugin,
                "distribution": entry.provider.distribution,
                "version": entry.provider.version,
                "paths": [],
            },
        )
        item["paths"].append(path)
    return ModelSummary(
        name=model.spec.name,
        params=params,
        active_params_per_token=active_params_per_token(model),
        weight_bytes=params["total"] * size,
        kv_cache_bytes_per_token=kv_cache_bytes_per_token(model, tdtype),
        dtype=str(tdtype).replace("torch.", ""),
        components=list(comps.values()),
    )
