"""Base class of every component config, and the ``Slot`` marker for fields that hold another component.

A component's config is a pydantic model with ``extra="forbid"`` and a ``type: Literal[...]`` discriminator.
A field that holds *another* component (an MoE's experts are FFN specs, its router is a router spec) is
declared with :func:`Slot`; once plugins are loaded the core replaces it by the discriminated union of every
registered component of that kind, so third-party components nest exactly like built-ins. A field annotated
``list[ComponentConfig]`` holds a list of them (the mixers of a parallel hybrid layer).

**Token mixers.** The sublayer that mixes information across positions is a *token mixer*: an attention (kind
``attention``) or any other mixer (kind ``mixer``: a recurrent state-space or linear-attention layer such as
Mamba-2 or Gated DeltaNet, or several mixers side by side). A slot of kind ``mixer`` (the block's token-mixing slot)
accepts a component of either kind (:data:`MIXER_KINDS`), so attention and recurrent mixers are interchangeable in a
block and in per-layer overrides; a slot of kind ``attention`` still takes attentions only.
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

SLOT_KEY = "x-modkit-slot"

#: The registry kinds of token mixers: what a slot of kind ``"mixer"`` accepts (an attention is a token mixer; a
#: recurrent mixer is a token mixer that is not an attention). Every other slot kind accepts its own kind only.
MIXER_KINDS = ("attention", "mixer")


def slot_kinds(kind: str) -> tuple[str, ...]:
    """The registry kinds a slot of ``kind`` accepts: :data:`MIXER_KINDS` for ``"mixer"``, else ``(kind,)``."""
    return MIXER_KINDS if kind == "mixer" else (kind,)


def is_mixer(kind: Optional[str]) -> bool:
    """Whether components of registry ``kind`` are token mixers (called ``forward(x, inputs)`` in the mixing slot)."""
    return kind in MIXER_KINDS


#: the validation settings every spec model shares: unknown keys are errors, values are immutable, types are strict
#: (JSON ``true`` is not the integer 1, ``"128"`` is not 128, ``12.0`` is not an int, ``1`` is not a bool; an
#: int is accepted where a float is expected) and no float field takes NaN or +-Infinity.
STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, protected_namespaces=())


class StrictModel(BaseModel):
    """Base of every model a spec is validated with (component configs, the spec itself, nested option objects
    such as RoPE scaling): see :data:`STRICT`. Subclasses inherit it, third-party ones included."""

    model_config = STRICT


class ComponentConfig(StrictModel):
    """Base for component configs: strict (see :class:`StrictModel`), documented fields, a ``type`` tag.

    Subclasses declare ``type: Literal["name", ...]`` and one ``Field(description=...)`` per field. Sizes should
    use the bounded types of :mod:`modkit.core.limits` (``HeadCount``, ``FFNWidth``...).
    """

    type: str


def Slot(kind: str, *, default: Any = ..., description: str) -> Any:
    """Declare a config field holding a component of ``kind`` (validated against the live registry).

    Annotate the field as ``ComponentConfig`` (or ``ComponentConfig | None`` with ``default=None``, or
    ``list[ComponentConfig]`` for a list of them).

    Args:
        kind: registry kind of the nested component, e.g. ``"ffn"`` or ``"router"``; ``"mixer"`` accepts any token
            mixer (:data:`MIXER_KINDS`).
        default: default value; omit for a required field.
        description: human-readable description (shown in docs and JSON Schema).
    """
    return Field(default, description=description, json_schema_extra={SLOT_KEY: kind})


def slot_kind(field_info: Any) -> str | None:
    """Return the registry kind of a pydantic ``FieldInfo`` declared with :func:`Slot`, else ``None``."""
    extra = getattr(field_info, "json_schema_extra", None)
    if isinstance(extra, dict):
        return extra.get(SLOT_KEY)
    return None
