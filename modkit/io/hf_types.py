"""Which Hugging Face ``model_type`` a spec can be written as: :func:`choose_hf_model_type`.

A spec trained from scratch (a shipped spec, or one written by hand) carries no ``metadata.hf_model_type``. The
registered weight mappers decide for it: a type *expresses* a spec when its reverse conversion gives a config that
converts back to the same network (:meth:`modkit_plugins.hf._weights.HFWeights.hf_config`, the check every export
runs). Exactly one such type is chosen; several are listed (the caller names one); none is refused, naming the
components the closest types cannot hold.
"""

from __future__ import annotations

import re
from typing import Any, Optional

from modkit.core.errors import CheckpointError
from modkit.core.registry import Registry
from modkit.spec import ModelSpec

_LAYER = re.compile(r"layers\[(\d+)\]\.(\w+)")
#: a line of :meth:`HFWeights.hf_config`'s refusal naming a field of the network that would change
_DIFFERENCE = re.compile(r"\s*([\w\[\].]+): spec has ")


def hf_types_for(spec: ModelSpec, registry: Registry) -> tuple[list[str], dict[str, list[str]]]:
    """The registered model types with weights that express ``spec``, and why each other one does not.

    Returns:
        ``(fitting types, {model type: differing fields})``, sorted by model type: the fields are paths such
            as ``layers[1].ffn``, or ``["<whole spec>"]`` for a type that cannot describe the spec at all.
    """
    fits: list[str] = []
    misses: dict[str, list[str]] = {}
    for model_type in registry.hf_model_types():
        mapper = registry.hf_converter(model_type).weights
        if mapper is None:
            continue
        try:
            mapper.hf_config(spec)
        except CheckpointError as exc:
            found = [_DIFFERENCE.match(line) for line in str(exc).splitlines()[1:]]
            # a config the type refuses outright (not a field that would change) says nothing about components
            misses[model_type] = [m.group(1) for m in found if m] if found and all(found) else ["<whole spec>"]
            continue
        except Exception:  # noqa: BLE001 - a mapper that cannot even describe this spec (a Mamba-2 one for attention)
            misses[model_type] = ["<whole spec>"]
            continue
        fits.append(model_type)
    return fits, misses


def _component(spec: ModelSpec, path: str) -> str:
    """``path`` with the spec's component at it: ``layers[1].ffn`` -> ``ffn moe`` (``path`` when not a layer slot)."""
    m = _LAYER.fullmatch(path)
    if m is None:
        value: Any = getattr(spec, path, None)
        kind = getattr(value, "type", None)
        return f"{path} {kind}" if kind else path
    slot = getattr(spec.layer(int(m.group(1))), m.group(2), None)
    return f"{m.group(2)} {getattr(slot, 'type', slot)}"


def _unmapped(spec: ModelSpec, misses: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """The closest types (fewest differing fields, a type that cannot run on the spec counted last) and the
    components they cannot hold, each with the layers it sits in (``ffn moe (layers 1, 3)``)."""
    ranked = sorted(misses, key=lambda t: (misses[t] == ["<whole spec>"], len(misses[t]), t))
    if not ranked or misses[ranked[0]] == ["<whole spec>"]:
        return [], []
    best = [t for t in ranked if misses[t] == misses[ranked[0]]]
    where: dict[str, list[str]] = {}
    for path in misses[ranked[0]]:
        m = _LAYER.fullmatch(path)
        where.setdefault(_component(spec, path), []).extend([m.group(1)] if m else [])
    n = spec.n_layers
    comps = [
        c
        if not ls
        else f"{c} (every layer)"
        if len(ls) == n
        else f"{c} (layer{'s' if len(ls) > 1 else ''} {', '.join(ls)})"
        for c, ls in where.items()
    ]
    return best, comps


def choose_hf_model_type(
    spec: ModelSpec, registry: Registry, model_type: Optional[str] = None
) -> tuple[str, Optional[str]]:
    """The Hugging Face model type to write ``spec`` as, and a note when it was inferred.

    Order: ``model_type`` when given, then ``spec.metadata["hf_model_type"]`` (a converted spec), then the one
    registered type that expresses the spec (:func:`hf_types_for`).

    Returns:
        ``(model type, note)``: the note says which type was inferred and why (``None`` when it was named).

    Raises:
        CheckpointError: nothing named and several types express the spec (each listed; name one with
            ``--model-type``), or none does (the closest types and the components they cannot hold).
    """
    if model_type:
        return str(model_type), None
    named = (spec.metadata or {}).get("hf_model_type")
    if named:
        return str(named), None
    fits, misses = hf_types_for(spec, registry)
    name = spec.name or "unnamed"
    if len(fits) == 1:
        return fits[0], (
            f"model type {fits[0]!r} inferred: the only registered Hugging Face type that expresses spec {name}"
        )
    if fits:
        raise CheckpointError(
            f"spec {name} has no metadata.hf_model_type and {len(fits)} Hugging Face model types express it: "
            f"{', '.join(fits)}; name one with --model-type (Python: to_hf(..., model_type=...))"
        )
    best, comps = _unmapped(spec, misses)
    raise CheckpointError(
        f"no registered Hugging Face model type expresses spec {name}; the components that do not map: "
        f"{'; '.join(comps) or '(none named)'} (closest: {', '.join(best) or 'none registered'}). Export with "
        "modkit.save instead, or register a model type that holds them (docs/guides/hugging-face.md)"
    )
