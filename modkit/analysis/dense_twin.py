"""A sparse attention against the dense attention it selects from, at equal everything else.

A token mixer that attends to a selection of the keys (DeepSeek Sparse Attention, ``dsa``) declares the dense type
it selects from with the ``selects_from`` capability (``"mla"``); a type whose dense form is itself with other field
values (block-compressed attention, ``compressed_attention``: no compression, no window) names itself and gives those
values in the ``dense_twin`` capability (``{field: value}``). Its **dense twin** is the same spec with each such
mixer replaced by that type, keeping the fields the two configs share (the selection's own fields dropped), so the
two models differ only in the selection: :func:`dense_twin_spec` writes it, :func:`against_dense` gives what
``modkit cost`` shows, the token mixers' FLOPs per token (prefill and decode) and the KV-cache bytes per token of
both. The twin is built from the declarations like any spec (on ``meta``), so the figures are the components' own.
"""

from __future__ import annotations

from typing import Any, Optional

from modkit.core.errors import RegistryError
from modkit.core.registry import Registry

#: the spec keys that hold a token mixer (``attention``, or its alias ``mixer``)
MIXER_KEYS = ("attention", "mixer")


def _twin(cfg: Any, registry: Registry, replaced: dict[str, str]) -> Any:
    """``cfg`` (a mixer's JSON) as its dense twin when its type declares ``selects_from``, else unchanged."""
    if not isinstance(cfg, dict) or not isinstance(cfg.get("type"), str):
        return cfg
    try:
        entry = registry.get("attention", cfg["type"])
    except RegistryError:  # a recurrent mixer: not a sparse attention
        return cfg
    dense = entry.capabilities.get("selects_from")
    if not dense:
        return cfg
    fields = registry.get(entry.kind, dense).config.model_fields
    replaced[entry.type] = dense
    # a type that is its own dense form (compressed_attention) names the field values that make it dense
    return {**{k: v for k, v in cfg.items() if k in fields}, **entry.capabilities.get("dense_twin", {}), "type": dense}


def dense_twin_spec(spec: Any, registry: Registry) -> Optional[tuple[dict, dict[str, str]]]:
    """``(twin spec dict, {sparse type: dense type})`` of a :class:`~modkit.ModelSpec`, or ``None`` when no token
    mixer of the spec declares ``selects_from``."""
    data = spec.to_dict()
    replaced: dict[str, str] = {}
    for holder in (data.get("block") or {}, *(data.get("overrides") or [])):
        for key in MIXER_KEYS:
            if key in holder:
                holder[key] = _twin(holder[key], registry, replaced)
    if not replaced:
        return None
    data["name"] = f"{data.get('name') or 'spec'} (dense twin)"
    return data, replaced


def against_dense(costs: Any, context: int, dtype: Any) -> Optional[dict[str, Any]]:
    """The spec's token mixers against its dense twin's at ``context``, or ``None`` without a sparse mixer.

    Returns ``{"replaced": {sparse: dense}, "mixer_flops_per_token": {phase: {"sparse", "dense"}}, "flops_per_token":
    {phase: {"sparse", "dense"}}, "kv_cache_bytes_per_token": {"sparse", "dense"}, "kv_cache_bytes": {"sparse",
    "dense"}}`` (the last: one row's cache at ``context``) (FLOPs as floats; phases
    ``prefill`` and ``decode`` as :meth:`~modkit.analysis.cost.CostModel.workload` defines them).

    Raises:
        CostError: a component of either model declares no FLOPs.
    """
    from .cost import PHASES, CostModel

    twin = dense_twin_spec(costs.spec, costs.registry)
    if twin is None:
        return None
    data, replaced = twin
    dense = CostModel(data, registry=costs.registry)

    def mixers(model: CostModel, phase: str) -> float:
        work = model.workload(phase, context)
        return model._slot_flops([u for u in model._uses if u.slot == "mixer"], work) / work.tokens

    def whole(model: CostModel, phase: str) -> float:
        work = model.workload(phase, context)
        return model.total(work) / work.tokens

    return {
        "replaced": replaced,
        "mixer_flops_per_token": {ph: {"sparse": mixers(costs, ph), "dense": mixers(dense, ph)} for ph in PHASES},
        "flops_per_token": {ph: {"sparse": whole(costs, ph), "dense": whole(dense, ph)} for ph in PHASES},
        "kv_cache_bytes_per_token": {
            "sparse": costs.kv_cache_bytes_per_token(dtype),
            "dense": dense.kv_cache_bytes_per_token(dtype),
        },
        # the cache of one row at the context: what a window or a compression saves, which bytes per token omit
        "kv_cache_bytes": {
            "sparse": costs.kv_cache_bytes(context, 1, dtype),
            "dense": dense.kv_cache_bytes(context, 1, dtype),
        },
    }
