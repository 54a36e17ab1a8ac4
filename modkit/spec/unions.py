"""The live spec model: each component slot a discriminated union over the registry's components.

:func:`spec_model` copies :class:`~modkit.spec.models.ModelSpec` (and its block and override models, and every
registered config model with nested slots) with each slot typed as the union of the registered configs of the
slot's kind, discriminated on ``type``; an alias of a type is resolved before validation. The result is kept by the
registry (:meth:`~modkit.core.registry.Registry.derived`) until a plugin is registered or removed.
"""

from __future__ import annotations

import typing
import warnings
from dataclasses import dataclass
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, BeforeValidator, Field, create_model

from modkit.core.config import slot_kind, slot_kinds
from modkit.core.errors import SpecWarning
from modkit.core.registry import Registry, get_registry
from modkit.spec.models import BlockSpec, LayerOverride, ModelSpec

#: the key :func:`spec_model` keeps its result under in the registry (:meth:`~modkit.core.registry.Registry.derived`)
_DERIVED_KEY = "modkit.spec.unions"


def _ident(kind: str) -> str:
    return "_slot_" + "".join(ch if ch.isalnum() else "_" for ch in kind)


def _slot_fields(cls: type[BaseModel]) -> dict[str, str]:
    return {name: k for name, f in cls.model_fields.items() if (k := slot_kind(f)) is not None}


def _live_copy(cls: type[BaseModel], extra: dict[str, Any] | None = None) -> type[BaseModel]:
    slots = _slot_fields(cls)
    if not slots and not extra:
        return cls
    overrides: dict[str, Any] = dict(extra or {})
    for name, kind in slots.items():
        f = cls.model_fields[name]
        listed = typing.get_origin(f.annotation) is list  # list[ComponentConfig]: a list of slots
        optional = f.default is None or type(None) in typing.get_args(f.annotation)
        ann = f"list[{_ident(kind)}]" if listed else _ident(kind)
        ann = f"Optional[{ann}]" if optional else ann
        default = ... if f.is_required() else f.default
        extra_args = {"validation_alias": f.validation_alias} if f.validation_alias is not None else {}
        if listed and getattr(f, "metadata", None):  # length bounds of the list
            bounds = ("min_length", "max_length")
            extra_args.update({k: getattr(m, k) for m in f.metadata for k in bounds if hasattr(m, k)})
        described = Field(default, description=f.description, json_schema_extra=f.json_schema_extra, **extra_args)
        overrides[name] = (ann, described)
    return create_model(cls.__name__, __base__=cls, __module__=cls.__module__, __doc__=cls.__doc__, **overrides)


def _alias_resolver(kind: str, registry: Registry):
    """The function of a before-validator replacing an alias ``{"type": alias}`` by the type it stands for (a
    :class:`~modkit.core.errors.SpecWarning` carries the alias note, if the entry gives one)."""

    def resolve(v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("type"), str):
            for k in slot_kinds(kind):  # a mixer slot resolves the aliases of attentions and of mixers
                name = registry.resolve(k, v["type"])
                if name != v["type"]:
                    note = registry.get(k, name).alias_notes.get(v["type"])
                    if note:
                        warnings.warn(note, SpecWarning, stacklevel=2)
                    return {**v, "type": name}
        return v

    return resolve


def _missing_kind(kind: str, registry: Registry):
    def check(v: Any) -> Any:
        raise ValueError(
            f"no component of kind {kind!r} is installed; installed plugins: "
            f"{', '.join(p.name for p in registry.plugins()) or '(none)'}"
        )

    return Annotated[Any, BeforeValidator(check)]


@dataclass(frozen=True)
class _LiveSpec:
    """What :func:`spec_model` builds for one registry generation: the live model and the slot annotations
    (``{_ident(kind): union}``, plus the live block and override models) its copies were rebuilt with."""

    model: type[ModelSpec]
    slot_types: dict[str, Any]


def _slot_unions(reg: Registry, live: dict[type, type], kinds: set[str]) -> dict[str, Any]:
    """``{_ident(kind): annotation}``: the discriminated union over the live copies of ``kind``'s configs (a
    one-member union too, so an unknown type gets the same helpful error), wrapped in the alias resolver when the
    kind has aliases; for a kind with no component installed, a validator that names the installed plugins."""
    entries = reg.components()
    ns: dict[str, Any] = {"Optional": Optional}
    for kind in sorted(kinds | {"mixer"}):  # the block's token-mixing slot exists whatever is installed
        accepted = slot_kinds(kind)  # a mixer slot takes attentions and recurrent mixers alike
        classes = list(dict.fromkeys(live[e.config] for e in entries if e.kind in accepted))
        if not classes:
            ns[_ident(kind)] = _missing_kind(kind, reg)
            continue
        union = Annotated[Union[tuple(classes)], Field(discriminator="type")]
        aliased = any(reg.aliases(k) for k in accepted)
        ns[_ident(kind)] = Annotated[union, BeforeValidator(_alias_resolver(kind, reg))] if aliased else union
    return ns


def _build(reg: Registry) -> _LiveSpec:
    """Build the live model of ``reg``'s components (see :func:`spec_model`)."""
    entries = reg.components()
    kinds = set(reg.kinds())
    for cls in [e.config for e in entries] + [BlockSpec, LayerOverride, ModelSpec]:
        kinds.update(_slot_fields(cls).values())
    live: dict[type, type] = {}
    for e in entries:
        if e.config not in live:
            live[e.config] = _live_copy(e.config)
    ns = _slot_unions(reg, live, kinds)
    block = _live_copy(BlockSpec)
    override = _live_copy(LayerOverride)
    ns["_BlockSpec"], ns["_LayerOverride"] = block, override
    model = _live_copy(
        ModelSpec,
        extra={
            "block": ("_BlockSpec", Field(..., description=ModelSpec.model_fields["block"].description)),
            "overrides": (
                "list[_LayerOverride]",
                Field(default_factory=list, description=ModelSpec.model_fields["overrides"].description),
            ),
        },
    )
    originals = set(live) | {BlockSpec, LayerOverride, ModelSpec}
    for cls in dict.fromkeys([*live.values(), block, override, model]):
        if cls not in originals:  # a copy with forward references to the unions above
            cls.model_rebuild(_types_namespace=ns, force=True)
    return _LiveSpec(model, ns)


def _live(registry: Registry | None) -> _LiveSpec:
    reg = registry or get_registry()
    return reg.derived(_DERIVED_KEY, lambda: _build(reg))


def spec_model(registry: Registry | None = None) -> type[ModelSpec]:
    """The :class:`ModelSpec` subclass whose component slots are unions over ``registry``'s components.

    Rebuilt whenever the registry changes (it carries a generation counter; the registry keeps the result,
    :meth:`~modkit.core.registry.Registry.derived`).
    """
    return _live(registry).model


def slot_type(kind: str, registry: Registry | None = None) -> Optional[Any]:
    """The annotation a slot of ``kind`` validates with: the discriminated union on ``type`` over the registered
    configs of that kind (aliases resolved), as in :func:`spec_model`; ``None`` for a kind no slot or component
    has. Wrap it in a ``pydantic.TypeAdapter`` to validate or to write its JSON Schema."""
    return _live(registry).slot_types.get(_ident(kind))
