"""``modkit list [KIND] [--pattern GLOB]`` and ``modkit show KIND TYPE [--schema]``: the registered components, and
one component's fields (from its config's JSON Schema), capabilities, provider and reference."""

from __future__ import annotations

import argparse
import json
import textwrap

from .common import _registry
from .errors import UserError
from .output import _err, _fit_table, _one_line, _out, _table


def add_subcommands(sub) -> None:
    """Add ``list`` and ``show``."""
    p = sub.add_parser("list", help="list registered components", description="List registered components.")
    p.add_argument("kind", nargs="?", help="only this kind (attention, norm, ffn, position, placement, ...)")
    p.add_argument("--pattern", "-p", help="fnmatch pattern on the type name, e.g. '*norm'")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "show", help="describe one component", description="Fields, capabilities and provider of one component."
    )
    p.add_argument("kind", help="component kind, e.g. norm")
    p.add_argument("type", nargs="?", help="component type, e.g. rmsnorm (left out: the types of KIND)")
    p.add_argument("--schema", action="store_true", help="print the config's JSON Schema instead")
    p.set_defaults(func=cmd_show)


def _check_kind(reg, kind: str) -> None:
    if kind not in reg.kinds():
        raise UserError(reg.unknown_kind_message(kind))


def cmd_list(args: argparse.Namespace) -> int:
    """``modkit list [KIND] [--pattern GLOB]`` (and ``modkit show KIND``: the types of one kind)."""
    reg = _registry()
    if args.kind is not None:
        _check_kind(reg, args.kind)
    comps = reg.components(args.kind, pattern=args.pattern)
    if not comps:
        where = f" of kind {args.kind!r}" if args.kind else ""
        pat = f" matching {args.pattern!r}" if args.pattern else ""
        _err(
            f"no components{where}{pat}; installed types: " + ", ".join(f"{c.kind}/{c.type}" for c in reg.components())
        )
        return 1
    rows = []
    for c in comps:
        plugin = c.provider.plugin if c.provider else ""
        rows.append((c.kind, c.type, plugin, _one_line(c.description)))
        for alias in c.aliases:  # an alias is a second name of the entry above, not a second component
            note = " (name changed meaning; see modkit show)" if alias in c.alias_notes else ""
            rows.append((c.kind, f"{alias} -> {c.type}", plugin, f"alias of {c.type}{note}"))
    for line in _fit_table(("KIND", "TYPE", "PLUGIN", "DESCRIPTION"), rows):
        _out(line)
    return 0


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return schema.get("$defs", {}).get(ref.split("/")[-1], {})
    return node


def _type_str(schema: dict, node: dict) -> str:
    """Short human rendering of a JSON Schema node: ``integer > 0``, ``'head'|'full'``, ``norm component | null``."""
    if "anyOf" in node or "oneOf" in node:
        return " | ".join(_type_str(schema, n) for n in node.get("anyOf", node.get("oneOf", [])))
    if "$ref" in node:
        target = _resolve(schema, node)
        return str(target.get("title") or node["$ref"].split("/")[-1])
    if "const" in node:
        return repr(node["const"])
    if "enum" in node:
        return "|".join(repr(v) if v is not None else "null" for v in node["enum"])
    t = node.get("type")
    if isinstance(t, list):
        return " | ".join(map(str, t))
    if t == "array":
        return f"list[{_type_str(schema, node.get('items', {})) or 'any'}]"
    if t == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"dict[str, {_type_str(schema, node['additionalProperties'])}]"
    out = str(t) if t else "any"
    for key, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
        if key in node:
            out += f" {op} {node[key]}"
    return out


def _field_rows(
    schema: dict, node: dict, prefix: str = "", slot_key: str = "x-modkit-slot"
) -> list[tuple[str, str, str, str]]:
    rows = []
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        if not prefix and name == "type":
            continue  # the discriminator is shown in the header
        kind = prop.get(slot_key)
        if kind:
            nullable = any(n.get("type") == "null" for n in prop.get("anyOf", []))
            type_s = f"{kind} component" + (" | null" if nullable else "")
        else:
            type_s = _type_str(schema, prop)
        if name in required:
            default = "required"
        elif "default" in prop:
            default = json.dumps(prop["default"])
        else:
            default = ""
        rows.append((prefix + name, type_s, default, prop.get("description", "")))
        if not kind:  # expand nested plain models (e.g. rope.scaling) as dotted sub-fields
            for variant in prop.get("anyOf", [prop]):
                target = _resolve(schema, variant)
                if target is not variant or "properties" in variant:
                    if target.get("properties"):
                        rows += _field_rows(schema, target, prefix + name + ".", slot_key)
    return rows


def cmd_show(args: argparse.Namespace) -> int:
    """``modkit show KIND TYPE``: fields from the config's JSON Schema, capabilities, provider, reference."""
    from modkit.core.config import SLOT_KEY

    reg = _registry()
    _check_kind(reg, args.kind)
    if args.type is None:  # `modkit show mixer`: the types to choose from
        code = cmd_list(argparse.Namespace(kind=args.kind, pattern=None))
        _err(f"modkit show {args.kind} TYPE describes one of them")
        return code
    entry = reg.get(args.kind, args.type)
    schema = entry.config.model_json_schema()
    if args.schema:
        _out(json.dumps(schema, indent=2))
        return 0
    # the component's example config: a fragment that validates as it stands (a bare {"type": ...} may not: gqa
    # needs n_kv_heads)
    _out(f"{entry.kind}/{entry.type}    example: {json.dumps(entry.example_config())}")
    if args.type != entry.type:
        _out(f"({args.type!r} is an alias of {entry.type!r}; specs that use it are stored with {entry.type!r})")
    if entry.aliases:
        _out("aliases: " + ", ".join(entry.aliases))
    _out(f"provider: {entry.provider}")
    _out("")
    for alias, note in entry.alias_notes.items():
        for para in textwrap.wrap(f"note on alias {alias!r}: " + " ".join(note.split()), width=100):
            _out(para)
        _out("")
    for para in textwrap.wrap(" ".join(entry.description.split()), width=100):
        _out(para)
    _out("")
    rows = _field_rows(schema, schema, slot_key=SLOT_KEY)
    _out("fields:")
    if rows:
        for line in _table(("FIELD", "TYPE", "DEFAULT", "DESCRIPTION"), rows, indent="  "):
            _out(line)
    else:
        _out("  (none besides type)")
    _out("")
    _out("capabilities:")
    if entry.capabilities:
        from modkit.core.registry import KNOWN_CAPABILITIES

        caps = [
            (k, json.dumps(v, default=str), KNOWN_CAPABILITIES.get(k, ""))
            for k, v in sorted(entry.capabilities.items())
        ]
        name_w = max(len(k) for k, _, _ in caps)
        short = [v for _, v, _ in caps if len(v) <= 16]
        value_w = max((len(v) for v in short), default=0)
        for k, v, meaning in caps:
            if len(v) <= value_w:
                _out(f"  {k.ljust(name_w)}  {v.ljust(value_w)}  {meaning}".rstrip())
            else:  # a long value (e.g. a tensor-parallel plan) gets its own line
                _out(f"  {k.ljust(name_w)}  {v}")
                if meaning:
                    _out(f"  {' ' * name_w}  {' ' * value_w}  {meaning}")
    else:
        _out("  (none declared)")
    _out("")
    _out(f"reference: {entry.reference or '(none given)'}")
    return 0
