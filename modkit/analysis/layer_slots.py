"""Which layer slot each built module serves, for the cost model's mixer/FFN comparison (:mod:`modkit.analysis.cost`).

A module belongs to the ``mixer`` slot when a layer's token-mixing slot built it (``block.mixer`` / ``overrides[].mixer``,
nested modules included), to ``ffn`` when its ffn slot did; a placement's own sublayers (the mixer and ffn
:func:`~modkit.Slot` fields of its config: ``shortcut-moe``'s second attention and its two dense FFNs) serve the
layer as those slots do.
"""

from __future__ import annotations

from typing import Any

from torch import nn


def layer_slots(model: nn.Module, records: list[Any]) -> dict[int, str]:
    """``{id(module): "mixer" | "ffn"}`` for every module a layer's token-mixing slot (``block.mixer`` /
    ``overrides[].mixer``) or ffn slot built, nested ones included: the record of layer ``i`` whose config is the
    slot's config in ``spec.layer(i)``, and every module inside it. Empty for a model without a spec."""
    spec = getattr(model, "spec", None)
    out: dict[int, str] = {}
    if spec is None:
        return out
    by_layer: dict[Any, list[Any]] = {}
    for r in records:
        by_layer.setdefault(getattr(r.ctx, "layer_index", None), []).append(r)
    for i in range(spec.n_layers):
        ls = spec.layer(i)
        tops = []
        for slot, cfg in (("mixer", ls.attention), ("ffn", ls.ffn)):
            top = next((r.module for r in by_layer.get(i, []) if cfg is not None and r.config == cfg), None)
            tops += [(slot, top)] if top is not None else []
        # a placement's own sublayers: every module built from its slot configs that the layer's slots did not claim
        # (the second of two equal mixers, both copies of shortcut-moe's dense FFN)
        claimed = {id(top) for _, top in tops}
        for slot, cfg in _placement_slots(ls.placement):
            tops += [(slot, r.module) for r in by_layer.get(i, []) if r.config == cfg and id(r.module) not in claimed]
        for slot, top in tops:
            for m in top.modules():
                out[id(m)] = slot
    return out


def _placement_slots(placement: Any) -> list[tuple[str, Any]]:
    """``[("mixer" | "ffn", config)]``: the sublayers a placement holds of its own (its config's mixer and ffn
    :func:`~modkit.Slot` fields; ``shortcut-moe``'s second mixer and dense FFN), which serve the layer as its slots'
    do."""
    from modkit.core.config import is_mixer, slot_kind

    out = []
    for name, info in type(placement).model_fields.items():
        kind, cfg = slot_kind(info), getattr(placement, name)
        if kind is not None and cfg is not None and (kind == "ffn" or is_mixer(kind)):
            out.append(("ffn" if kind == "ffn" else "mixer", cfg))
    return out
