"""Field tables from a config's JSON Schema (component pages) and the spec-format page ``reference/spec.md``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

from .markdown import _cell, _rel, _resolve_links, _rst_to_md, _table, component_path, kind_path


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return schema.get("$defs", {}).get(ref.split("/")[-1], {})
    return node


_CONSTRAINTS = (
    ("exclusiveMinimum", "> {}"),
    ("minimum", "≥ {}"),
    ("exclusiveMaximum", "< {}"),
    ("maximum", "≤ {}"),
    ("minLength", "length ≥ {}"),
    ("maxLength", "length ≤ {}"),
    ("minItems", "≥ {} items"),
    ("maxItems", "≤ {} items"),
    ("pattern", "matches `{}`"),
    ("multipleOf", "multiple of {}"),
)


def _type_and_constraints(schema: dict, node: dict, link_kind: Callable[[str], str]) -> tuple[str, list[str]]:
    """``(type text, constraints)`` of a JSON Schema node."""
    kind = node.get("x-modkit-slot")
    variants = node.get("anyOf") or node.get("oneOf")
    if kind:
        nullable = bool(variants) and any(v.get("type") == "null" for v in variants)
        return f"{link_kind(kind)} component" + (" \\| null" if nullable else ""), []
    if variants:
        types, cons = [], []
        for v in variants:
            t, c = _type_and_constraints(schema, v, link_kind)
            types.append(t)
            cons += [x for x in c if x not in cons]
        return " \\| ".join(dict.fromkeys(types)), cons
    if "$ref" in node:
        target = _resolve(schema, node)
        return f"object ({target.get('title') or node['$ref'].split('/')[-1]})", []
    if "const" in node:
        return f"`{json.dumps(node['const'])}`", []
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"]), []
    t = node.get("type")
    if isinstance(t, list):
        text = " \\| ".join(map(str, t))
    elif t == "array":
        inner, _ = _type_and_constraints(schema, node.get("items", {}), link_kind)
        text = f"list[{inner or 'any'}]"
    elif t == "object" and isinstance(node.get("additionalProperties"), dict):
        inner, _ = _type_and_constraints(schema, node["additionalProperties"], link_kind)
        text = f"dict[string, {inner}]"
    else:
        text = str(t) if t else "any"
    cons = [fmt.format(node[key]) for key, fmt in _CONSTRAINTS if key in node]
    return text, cons


@dataclass
class FieldRow:
    """One row of a field table."""

    name: str
    type: str
    default: str
    constraints: str
    description: str


def field_rows(
    schema: dict,
    node: Optional[dict] = None,
    prefix: str = "",
    *,
    link_kind: Callable[[str], str] = lambda k: f"`{k}`",
    skip_type: bool = True,
) -> list[FieldRow]:
    """Rows ``(name, type, default, constraints, description)`` of an object schema; nested plain objects (e.g.
    ``rope.scaling``) expand into dotted sub-fields."""
    node = schema if node is None else node
    rows: list[FieldRow] = []
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        if skip_type and not prefix and name == "type":
            continue
        type_s, cons = _type_and_constraints(schema, prop, link_kind)
        if name in required:
            default = "*required*"
        elif "default" in prop:
            default = f"`{json.dumps(prop['default'])}`"
        else:
            default = ""
        rows.append(
            FieldRow(prefix + name, type_s, default, ", ".join(cons), _cell(_rst_to_md(prop.get("description", ""))))
        )
        if prop.get("x-modkit-slot"):
            continue
        for variant in prop.get("anyOf") or prop.get("oneOf") or [prop]:
            target = _resolve(schema, variant)
            if target is not variant and target.get("properties"):
                rows += field_rows(schema, target, prefix + name + ".", link_kind=link_kind, skip_type=False)
    return rows


def _field_table(rows: list[FieldRow]) -> str:
    if not rows:
        return "No fields besides `type`."
    return _table(
        ("field", "type", "default", "constraints", "description"),
        ((f"`{r.name}`", r.type, r.default, r.constraints, r.description) for r in rows),
    )


def spec_reference_page(registry) -> str:
    """Markdown of ``reference/spec.md`` from the live JSON Schema of specs."""
    from ..spec import SCHEMA_VERSION, json_schema

    page = "reference/spec.md"
    schema = json_schema(registry)
    kinds = set(registry.kinds())

    def link_kind(kind: str) -> str:
        return f"[`{kind}`]({_rel(page, kind_path(kind))})" if kind in kinds else f"`{kind}`"

    def slot_choices(node: dict) -> str:
        kind = node.get("x-modkit-slot")
        if not kind:
            return ""
        types = registry.types(kind)
        return ", ".join(f"[`{t}`]({_rel(page, component_path(kind, t))})" for t in types)

    def section(title: str, obj: dict, intro: str) -> list[str]:
        rows = field_rows(schema, obj, link_kind=link_kind, skip_type=False)
        out = [f"## {title}", "", intro, "", _field_table(rows), ""]
        slots = [(n, p) for n, p in obj.get("properties", {}).items() if p.get("x-modkit-slot")]
        if slots:
            out += ["Component fields accept any registered type of their kind:", ""]
            out += [f"- `{n}`: {slot_choices(p)}" for n, p in slots]
            out.append("")
        return out

    defs = schema.get("$defs", {})

    def find_def(name: str) -> dict:
        for k, v in defs.items():
            if k.lstrip("_") == name:
                return v
        return {}

    parts = [
        "# Spec format",
        "",
        f"A spec is one strict JSON object (`schema_version` {SCHEMA_VERSION}) validated by pydantic: unknown keys are errors, "
        "every error names its JSON path and the values involved, and component fields are discriminated unions on "
        "`type` over every installed component. This page is generated from the same JSON Schema that "
        "`modkit schema` prints, with the components installed when the site was built.",
        "",
        'The schema itself: [modkit.schema.json](modkit.schema.json) (point a spec\'s `"$schema"` key at a copy '
        "and an editor completes and checks it as you type).",
        "",
    ]
    parts += section("Top level", schema, _rst_to_md(" ".join((schema.get("description") or "").split())))
    parts += section("block", find_def("BlockSpec"), _rst_to_md(find_def("BlockSpec").get("description", "")))
    parts += section(
        "overrides[]", find_def("LayerOverride"), _rst_to_md(find_def("LayerOverride").get("description", ""))
    )
    parts += section("LayerRange", find_def("LayerRange"), _rst_to_md(find_def("LayerRange").get("description", "")))
    parts += [
        "## Rules checked across fields",
        "",
        "Besides types and ranges, components check their fields against the model (for example a head count that "
        "the KV-head count does not divide is refused at `block.attention.n_kv_heads`); an unknown `type` answers "
        "with the close matches among the types of its kind and the `modkit list KIND` command that lists them all. "
        "`modkit validate SPEC...` prints one "
        "line per problem.",
        "",
    ]
    return _resolve_links("\n".join(parts), page)
