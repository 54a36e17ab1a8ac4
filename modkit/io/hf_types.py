"""Which Hugging Face ``model_type`` a spec can be written as: :func:`choose_hf_model_type`.

A spec trained from scratch (a shipped spec, or one written by hand) carries no ``metadata.hf_model_type``. The
registered weight mappers decide for it: a type *expresses* a spec when its reverse conversion gives a config that
converts back to the same network (:meth:`modkit_plugins.hf._weights.HFWeights.hf_config`, the check every export
runs). Exactly one such type is chosen; several are listed (the caller names one); none is refused, naming the
spec fields the closest types cannot hold and what the closest one gives there.
"""

from __future__ import annotations

from typing import Optional

from modkit.core.errors import CheckpointError
from modkit.core.registry import Registry
from modkit.spec import ModelSpec


def hf_types_for(spec: ModelSpec, registry: Registry) -> tuple[list[str], dict[str, Optional[list[tuple]]]]:
    """The registered model types with weights that express ``spec``, and why each other one does not.

    Returns:
        ``(fitting types, {model type: differing fields})``, sorted by model type: the fields are ``(spec field
            path, spec value, layers, the type's value)`` (``("block.ffn.type", "moe", " (layers 1, 3)",
            "swiglu")``), or ``None`` for a type that cannot describe the spec at all.
    """
    fits: list[str] = []
    misses: dict[str, Optional[list[tuple]]] = {}
    for model_type in registry.hf_model_types():
        mapper = registry.hf_converter(model_type).weights
        if mapper is None:
            continue
        try:
            mapper.hf_config(spec)
        except CheckpointError as exc:
            # a config the type refuses outright (not a field that would change) says nothing about components
            misses[model_type] = getattr(exc, "fields", None) or None
            continue
        except Exception:  # noqa: BLE001 - a mapper that cannot even describe this spec (a Mamba-2 one for attention)
            misses[model_type] = None
            continue
        fits.append(model_type)
    return fits, misses


def _unmapped(misses: dict[str, Optional[list[tuple]]]) -> tuple[list[str], list[str], str]:
    """The closest types (fewest differing fields, a type that cannot run on the spec counted last), the fields they
    cannot hold (``block.ffn.type = 'moe' (layers 1, 3)``) and what the first of them gives there."""
    ranked = sorted(misses, key=lambda t: (misses[t] is None, len(misses[t] or ()), t))
    if not ranked or misses[ranked[0]] is None:
        return [], [], ""
    first = misses[ranked[0]]
    best = [t for t in ranked if [f[:3] for f in misses[t] or ()] == [f[:3] for f in first]]
    gives = ", ".join(f"{path} {held!r}" for path, _, _, held in first)
    return best, [f"{path} = {value!r}{layers}" for path, value, layers, _ in first], f"{ranked[0]} gives {gives}"


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
    best, fields, gives = _unmapped(misses)
    closest = f"{', '.join(best)}; {gives}" if best else "none registered"
    raise CheckpointError(
        f"no registered Hugging Face model type expresses spec {name}; the fields that do not map: "
        f"{'; '.join(fields) or '(none named)'} (closest: {closest}). Export with modkit.save instead, or register a "
        "model type that holds them (docs/guides/hugging-face.md)"
    )
