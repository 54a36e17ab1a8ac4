"""Error messages of a spec that failed the schema: pydantic's errors as ``(JSON path, message)`` pairs.

:class:`~modkit.core.validation.ErrorFormatter` with the registry's knowledge added: an unknown component ``type``
names the close matches among its kind's types and ``modkit list KIND``; an unknown field lists the component's fields
and where a misplaced one belongs; a size over its bound names the bound (:mod:`modkit.core.limits`).
"""

from __future__ import annotations

from typing import Any, Optional

from modkit.core.config import slot_kinds
from modkit.core.limits import BOUNDS, FLOAT_BOUNDS
from modkit.core.registry import Registry, close_matches
from modkit.core.validation import ErrorFormatter, join_path, json_value, last_key, models_in
from modkit.spec.models import ModelSpec
from modkit.spec.unions import spec_model


def _kind_for_tags(expected: str, registry: Registry) -> str | None:
    """The slot kind whose union has exactly these tags (``"mixer"`` for the token-mixing slot: attentions and
    recurrent mixers; a slot of kind ``attention`` lists attentions only)."""
    tags = {t.strip().strip("'\"") for t in expected.split(",")}
    for kind in ["mixer", *registry.kinds()]:
        if {t for k in slot_kinds(kind) for t in registry.types(k)} == tags:
            return kind if kind != "mixer" or registry.types("mixer") else "attention"
    return None


class _SpecErrorFormatter(ErrorFormatter):
    """:class:`~modkit.core.validation.ErrorFormatter` with the registry's messages: unknown component types (the
    close matches and ``modkit list KIND``), a missing ``type``, the valid fields of a component, and the
    documented bound of a size (:mod:`modkit.core.limits`). A renamed field (``dff`` for the required ``d_ff``) is one
    error, not that plus ``d_ff: Field required``; a field one level off (``block.qk_norm``) names the component
    it belongs to."""

    def __init__(self, registry: Registry):
        roots = [spec_model(registry), ModelSpec, *(e.config for e in registry.components())]
        super().__init__(models_in(roots).values())
        self.registry = registry
        self._data: Any = None
        self._renamed: dict[tuple, str] = {}  # loc of an unknown field -> the missing required field it stands for

    def special(self, err: dict, path: str, parent: Any, tags: list[str]) -> Optional[tuple[str, str]]:
        etype = err.get("type")
        reg = self.registry
        if etype == "union_tag_invalid":
            ctx = err.get("ctx", {})
            kind = _kind_for_tags(str(ctx.get("expected_tags", "")), reg) or "component"
            return (join_path(path, "type"), reg.unknown_type_message(kind, ctx.get("tag")))
        if etype == "union_tag_not_found":
            return (path, "missing 'type'; every component needs a \"type\" naming a registered component")
        if etype == "extra_forbidden":
            field = str(err.get("loc", ("",))[-1])
            tag = parent.get("type") if isinstance(parent, dict) else None
            if not isinstance(parent, dict) or "type" not in parent:
                where = "this object"
            else:
                where = repr(tag) if isinstance(tag, str) else json_value(tag)
            allowed = self.allowed_fields(parent, tags)
            msg = f"unknown field {field!r} for {where}"
            renamed = self._renamed.get(tuple(err.get("loc", ())))
            if allowed:
                hint = [renamed] if renamed else close_matches(field, allowed)
                msg += f"; valid fields: {', '.join(allowed)}" + (f"; did you mean {hint[0]!r}?" if hint else "")
            moved = self._misplaced(err, path, field, parent)
            if moved:
                msg += "; " + moved
            return (path, msg)
        return None

    # a renamed field ("dff" for "d_ff") is one problem: the "Field required" of the name it stands for is dropped
    def format(self, errs: list[dict], data: Any) -> list[tuple[str, str]]:
        self._data, self._renamed = data, {}
        missing: dict[tuple, list[str]] = {}
        for e in errs:
            if e.get("type") == "missing" and e.get("loc"):
                missing.setdefault(tuple(e["loc"][:-1]), []).append(str(e["loc"][-1]))
        dropped = set()
        for e in errs:
            loc = tuple(e.get("loc", ()))
            if e.get("type") == "extra_forbidden" and loc:
                hint = close_matches(str(loc[-1]), missing.get(loc[:-1], []))
                if hint:
                    self._renamed[loc] = hint[0]
                    dropped.add(loc[:-1] + (hint[0],))
        errs = [e for e in errs if not (e.get("type") == "missing" and tuple(e.get("loc", ())) in dropped)]
        return super().format(errs, data)

    def _misplaced(self, err: dict, path: str, field: str, parent: Any) -> str:
        """``it is a field of block.attention ('gqa'): move it there (block.attention.qk_norm)`` when the unknown
        ``field`` is a field of a component one level below its object, or beside it; else ``""``."""
        loc = tuple(err.get("loc", ()))
        nodes = [self._data]  # the objects and arrays along loc that the document holds (union tags skipped)
        for item in loc[:-1]:
            node = nodes[-1]
            if isinstance(node, dict) and item in node:
                nodes.append(node[item])
            elif isinstance(item, int) and isinstance(node, list) and -len(node) <= item < len(node):
                nodes.append(node[item])
        base = path[: -len(field)].rstrip(".") if path.endswith(field) else ""
        up = base.rsplit(".", 1)[0] if "." in base else ""
        places = []
        for prefix, holder, skip in ((base, parent, None), (up, nodes[-2] if len(nodes) > 1 else None, parent)):
            if not isinstance(holder, dict):
                continue
            for key, value in holder.items():
                if value is skip or not isinstance(value, dict) or not isinstance(value.get("type"), str):
                    continue
                if field in self.allowed_fields(value, []):
                    where = f"{prefix}.{key}" if prefix else str(key)
                    places.append(f"{where} ({value['type']!r})")
        if not places:
            return ""
        target = places[0].split(" ", 1)[0]
        return f"it is a field of {' and '.join(places)}: move it there ({target}.{field})"

    def allowed_fields(self, parent: Any, tags: list[str]) -> list[str]:
        if isinstance(parent, dict) and isinstance(parent.get("type"), str):
            for c in self.registry.components():
                if c.type == parent["type"]:
                    return [n for n in c.config.model_fields if n != "type"]
            return []
        return super().allowed_fields(parent, tags)

    def hint(self, err: dict, path: str) -> str:
        field = last_key(path)
        if err.get("type") == "less_than_equal" and field in BOUNDS:
            bound = BOUNDS[field]
            return f"; {bound:,} is modkit's bound for {field} (modkit.core.limits), far above any published model"
        bound = next(iter((err.get("ctx") or {}).values()), None)
        if err.get("type") in _FLOAT_BOUND_ERRORS and field in FLOAT_BOUNDS and bound != 0:  # "> 0" explains itself
            return f"; modkit bounds {field} so that the model stays finite (modkit.core.limits): {FLOAT_BOUNDS[field]}"
        return ""


#: pydantic's error types of a number outside a bound
_FLOAT_BOUND_ERRORS = ("less_than_equal", "less_than", "greater_than_equal", "greater_than")


def _format_errors(errs: list[dict], data: Any, registry: Registry) -> list[tuple[str, str]]:
    """``(path, message)`` per problem pydantic found in ``data`` (JSON paths, JSON values, the union branch the
    input meant; see :mod:`modkit.core.validation`)."""
    return _SpecErrorFormatter(registry).format(errs, data)
