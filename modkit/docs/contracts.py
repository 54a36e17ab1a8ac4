"""What the core says about each kind: its tensor contract (from :mod:`modkit.core.interfaces`' docstring), what a
position scheme's ``acts_on`` means, and where in a spec a component of each kind goes."""

from __future__ import annotations

import inspect
import re
from typing import Any, Optional

from .markdown import _rel, _rst_to_md, component_path


def kind_contracts() -> dict[str, str]:
    """``{kind: contract}`` parsed from the bullet list of :mod:`modkit.core.interfaces`' docstring."""
    from modkit.core import interfaces

    doc = inspect.getdoc(interfaces) or ""
    out: dict[str, str] = {}
    current: Optional[str] = None
    for line in doc.splitlines():
        m = re.match(r"^\* ``([\w-]+)``:\s*(.*)$", line)
        if m:
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current and line.startswith("  ") and line.strip():
            out[current] += " " + line.strip()
        else:
            current = None
    return {k: _rst_to_md(v) for k, v in out.items()}


def kind_contract(kind: str, contracts: dict[str, str], places: dict[str, list[str]], page: str) -> str:
    """The contract of ``kind`` as a sentence for ``page``: the core's (from :func:`kind_contracts`), or, for a kind
    the core does not know (a third-party plugin's), what the core does guarantee about it."""
    api = f"[`modkit.core.interfaces`]({_rel(page, 'reference/api/modkit.core.interfaces.md')})"
    if kind in contracts:
        return f"{contracts[kind]} (from {api})"
    where = ", ".join(places.get(kind, []))
    held = (
        f"it is built by what holds a `{kind}` slot ({where}) and called as that component documents"
        if where
        else f"no spec field and no installed component has a `{kind}` slot, so nothing builds it yet"
    )
    return (
        f"The core defines no calling convention for `{kind}` (it is not one of the kinds of {api}): {held}; "
        "each component's description gives its shapes."
    )


def contracts_preamble() -> str:
    """The sentence of :mod:`modkit.core.interfaces` that precedes the per-kind contracts."""
    from modkit.core import interfaces

    doc = inspect.getdoc(interfaces) or ""
    for para in doc.split("\n\n"):
        if "[batch, seq, d_model]" in para and not para.lstrip().startswith("*"):
            return _rst_to_md(" ".join(para.split())).rstrip(":") + "."
    return ""


#: ``acts_on`` capability value -> the :class:`~modkit.core.interfaces.PositionScheme` hook it overrides.
_ACTS_ON_HOOK = {"embedding": "embed", "qk": "rotate", "bias": "attention_bias"}


def acts_on_text(value: Any) -> str:
    """What a position scheme whose ``acts_on`` is ``value`` does, from :class:`PositionScheme`'s docstrings."""
    from modkit.core.interfaces import PositionScheme

    hook = _ACTS_ON_HOOK.get(str(value))
    if hook is None:
        return (
            "acts nowhere: the model gets no explicit position information" if value == "none" else f"acts on `{value}`"
        )
    doc = _rst_to_md(" ".join((inspect.getdoc(getattr(PositionScheme, hook)) or "").split("\n\n")[0].split()))
    return f"overrides `PositionScheme.{hook}`: {doc}"


def slot_places(registry) -> dict[str, list[str]]:
    """``{kind: [spec paths where a component of that kind goes]}``: spec fields and other components' fields.

    A slot of kind ``mixer`` (the token-mixing slot) takes every token-mixer kind (attention and recurrent mixers,
    :func:`modkit.core.config.slot_kinds`), so it is listed under each; the block's and the overrides' token-mixing
    slot is shown under the name specs write, ``mixer`` (``attention`` is its older spelling).
    """
    from modkit.core.config import slot_kind, slot_kinds
    from ..spec import BlockSpec, LayerOverride, ModelSpec
    from ..spec.models import MIXER_KEYS

    places: dict[str, list[str]] = {}

    def add(kind: str, where: str) -> None:
        for accepted in slot_kinds(kind):
            places.setdefault(accepted, [])
            if where not in places[accepted]:
                places[accepted].append(where)

    for prefix, cls in (("", ModelSpec), ("block.", BlockSpec), ("overrides[].", LayerOverride)):
        for name, f in cls.model_fields.items():
            k = slot_kind(f)
            if k is not None:
                shown = MIXER_KEYS[0] if cls is not ModelSpec and name == MIXER_KEYS[1] else name
                add(k, f"`{prefix}{shown}`")
    hosts: dict[tuple[str, Any, str], list] = {}  # (kind, config class, field) -> entries sharing that config
    for entry in registry.components():
        for name, f in entry.config.model_fields.items():
            k = slot_kind(f)
            if k is not None:
                hosts.setdefault((k, entry.config, name), []).append(entry)
    for (k, _, name), entries in hosts.items():
        links = " / ".join(f"[`{e.type}`]({{to:{component_path(e.kind, e.type)}}})" for e in entries)
        add(k, f"`{name}` of {links}")
    return places
