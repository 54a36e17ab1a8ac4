"""The documentation site: pages generated from the live registry and ``specs/``, and ``modkit docs``.

The site is an mkdocs-material project (``mkdocs.yml`` at the repository root, hand-written sources in ``docs/``).
Nothing generated is checked in: at build time ``docs/scripts/gen_pages.py`` (an mkdocs-gen-files script) calls
:func:`generate`, which returns ``{path: text}`` for

* ``components/``: an overview table of every registered component, one index page per kind and one page per
  component (kind, type, description, provider, capabilities, a field table from the config's JSON Schema, the
  tensor contract of its kind, its parameter count, its reference and an example spec fragment that is
  *validated* with :func:`modkit.load_component`: a broken example fails the build);
* ``gallery/``: one model card per spec in ``specs/`` (parameter breakdown, active parameters, weight and
  KV-cache bytes, a Mermaid diagram of the model and of its blocks traced from the built modules), built on
  ``meta``;
* ``reference/``: the spec format (from the JSON Schema), the command line (from the argparse parser) and one
  mkdocstrings page per module of the Python API.

Whatever is installed shows up, third-party plugins included: nothing here names a concrete component.

``modkit docs build [-o DIR]`` builds the site (strict by default) and ``modkit docs serve`` serves it with live
reload; both need the ``docs`` extra (``pip install 'modkit[docs]'``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import logging
import operator
import pkgutil
import re
import textwrap
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

try:  # the griffe extension below is only loaded by mkdocstrings, which brings griffe
    from griffe import Extension as _GriffeExtension
except ImportError:  # pragma: no cover - docs extra not installed
    _GriffeExtension = object  # type: ignore[misc,assignment]

#: Model-wide sizes a component is built at for the parameter figures on its page.
EXAMPLE_CONTEXT = {"d_model": 256, "n_heads": 4, "n_layers": 2, "vocab_size": 32000, "max_seq_len": 2048}
#: ``d_model`` values the parameter count is evaluated at to recover it as a polynomial in ``d_model``.
FIT_D_MODELS = (64, 128, 256, 512, 1024)
#: Context length of the "KV cache for a long context" figure of the gallery.
LONG_CONTEXT = 8192
#: Weight / KV-cache dtypes of the gallery: (label, bytes per element).
DTYPE_BYTES = (("fp32", 4), ("bf16", 2), ("int8 / fp8", 1))
#: Modules of the package that get no API page.
API_SKIP = ("modkit.__main__",)

log = logging.getLogger("mkdocs.plugins.modkit")


class DocsError(Exception):
    """The generated documentation cannot be built (e.g. a component's example config does not validate)."""


# ================================================================================================ text helpers


def _rst_to_md(text: str) -> str:
    """Sphinx-flavoured docstring text to Markdown: ``:class:`~a.b.C``` -> ```C```, ````x```` -> ```x```."""
    def role(m: re.Match) -> str:
        target = m.group(1)
        return f"`{target[1:].split('.')[-1]}`" if target.startswith("~") else f"`{target}`"

    text = re.sub(r":[a-z]+:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: one line, ``|`` escaped outside code spans (inside them the table
    extension already ignores it, and an escape would show)."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    out = []
    for p in parts:
        if not p.startswith("`"):  # braces would read as attribute lists (attr_list) at a cell's end
            p = p.replace("|", "\\|").replace("{", "&#123;").replace("}", "&#125;")
        out.append(p)
    return "".join(out)


def _link_references(text: str) -> str:
    """Turn ``arXiv:NNNN.NNNNN`` and bare ``owner/repo`` GitHub mentions in parentheses into links."""
    text = re.sub(r"arXiv:(\d{4}\.\d{4,5})", r"[arXiv:\1](https://arxiv.org/abs/\1)", text)
    return re.sub(
        r"\((?:github\.com/)?([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)\)",
        lambda m: f"([{m.group(1)}](https://github.com/{m.group(1)}))" if "." not in m.group(1).split("/")[0] else m.group(0),
        text,
    )


def _count(n: int) -> str:
    return f"{n:,}"


def _short(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:g}"


def _bytes(n: float) -> str:
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _first_sentence(text: str) -> str:
    text = " ".join((text or "").split())
    m = re.search(r"\.(\s|$)", text)
    return text[: m.start() + 1] if m else text


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``), default left."""
    headers = list(headers)
    marks = {"l": "---", "r": "--:", "c": ":-:"}
    sep = [marks.get(align[i] if i < len(align) else "l", "---") for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _mermaid_text(text: str) -> str:
    """A label safe inside ``["..."]`` of a Mermaid node."""
    return str(text).replace('"', "#quot;").replace("[", "#91;").replace("]", "#93;")


# ================================================================================================ paths


def component_path(kind: str, type_: str) -> str:
    """Docs-relative path of a component's page."""
    return f"components/{kind}/{type_}.md"


def kind_path(kind: str) -> str:
    """Docs-relative path of a kind's index page."""
    return f"components/{kind}/index.md"


def gallery_path(stem: str) -> str:
    """Docs-relative path of a spec's gallery page."""
    return f"gallery/{stem}.md"


def _rel(from_page: str, to_page: str) -> str:
    """Relative link from one docs page to another (both docs-relative paths)."""
    import posixpath

    return posixpath.relpath(to_page, posixpath.dirname(from_page) or ".")


# ================================================================================================ schema tables


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


def field_rows(schema: dict, node: Optional[dict] = None, prefix: str = "", *, link_kind: Callable[[str], str] = lambda k: f"`{k}`", skip_type: bool = True) -> list[FieldRow]:
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
        rows.append(FieldRow(prefix + name, type_s, default, ", ".join(cons), _cell(_rst_to_md(prop.get("description", "")))))
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


# ================================================================================================ contracts


def kind_contracts() -> dict[str, str]:
    """``{kind: contract}`` parsed from the bullet list of :mod:`modkit.interfaces`' docstring."""
    from . import interfaces

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


def contracts_preamble() -> str:
    """The sentence of :mod:`modkit.interfaces` that precedes the per-kind contracts."""
    from . import interfaces

    doc = inspect.getdoc(interfaces) or ""
    for para in doc.split("\n\n"):
        if "[batch, seq, d_model]" in para and not para.lstrip().startswith("*"):
            return _rst_to_md(" ".join(para.split())).rstrip(":") + "."
    return ""


#: ``acts_on`` capability value -> the :class:`~modkit.interfaces.PositionScheme` hook it overrides.
_ACTS_ON_HOOK = {"embedding": "embed", "qk": "rotate", "bias": "attention_bias"}


def acts_on_text(value: Any) -> str:
    """What a position scheme whose ``acts_on`` is ``value`` does, from :class:`PositionScheme`'s docstrings."""
    from .interfaces import PositionScheme

    hook = _ACTS_ON_HOOK.get(str(value))
    if hook is None:
        return "acts nowhere: the model gets no explicit position information" if value == "none" else f"acts on `{value}`"
    doc = _rst_to_md(" ".join((inspect.getdoc(getattr(PositionScheme, hook)) or "").split("\n\n")[0].split()))
    return f"overrides `PositionScheme.{hook}`: {doc}"


# ================================================================================================ where a kind goes


def slot_places(registry) -> dict[str, list[str]]:
    """``{kind: [spec paths where a component of that kind goes]}``: spec fields and other components' fields."""
    from .config import slot_kind
    from .spec import BlockSpec, LayerOverride, ModelSpec

    places: dict[str, list[str]] = {}

    def add(kind: str, where: str) -> None:
        places.setdefault(kind, [])
        if where not in places[kind]:
            places[kind].append(where)

    for prefix, cls in (("", ModelSpec), ("block.", BlockSpec), ("overrides[].", LayerOverride)):
        for name, f in cls.model_fields.items():
            k = slot_kind(f)
            if k is not None:
                add(k, f"`{prefix}{name}`")
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


# ================================================================================================ parameters


def _stub(kind: str):
    from torch import nn

    class Stub(nn.Module):
        """A parameter-free stand-in sublayer (identity) for building a placement on its own."""

        def forward(self, x, *args, **kwargs):  # noqa: D102
            return x

    s = Stub()
    s.modkit_kind = kind
    s.modkit_type = kind
    return s


def _context(registry, d_model: int, norm_config: Any = None, **changes: Any):
    from .interfaces import BuildContext

    sizes = dict(EXAMPLE_CONTEXT)
    n_heads = sizes.pop("n_heads")
    sizes["d_model"] = d_model
    return BuildContext(
        registry=registry,
        layer_index=0,
        n_heads=n_heads,
        head_dim=d_model // n_heads,
        attention=_stub("attention"),
        ffn=_stub("ffn"),
        norm=norm_config,
        **sizes,
        **changes,
    )


def _default_norm(registry):
    """A validated config of the first registered norm (placements need one to build their norms)."""
    from .spec import load_component

    for entry in registry.components("norm"):
        try:
            return load_component("norm", entry.example_config(), registry=registry)
        except Exception:  # noqa: BLE001 - try the next norm
            continue
    return None


def _params(module) -> int:
    seen, total = set(), 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def _tagged_params(module, kind: str, type_: str) -> int:
    seen, total = set(), 0
    for m in module.modules():
        if getattr(m, "modkit_kind", None) == kind and getattr(m, "modkit_type", None) == type_:
            for p in m.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total


@dataclass
class ParamInfo:
    """Parameter count of a component at the example sizes, and as a polynomial in ``d_model`` if it is one."""

    count: Optional[int] = None
    counts: Optional[dict[int, int]] = None
    coefficients: Optional[tuple[Fraction, Fraction, Fraction]] = None
    how: str = ""
    norms: Optional[int] = None
    declared: Optional[int] = None
    error: str = ""


def _build_alone(entry, config, registry, d_model: int, norm_config):
    """Build ``config`` on meta on its own, or nested in a host component when it needs one (a router)."""
    import torch

    from .config import slot_kind
    from .spec import load_component

    ctx = _context(registry, d_model, norm_config)
    try:
        with torch.device("meta"):
            return ctx.build(config), "alone", ctx
    except Exception as direct_exc:  # noqa: BLE001 - retry inside a host
        example = config.model_dump(mode="json")
        for host in registry.components():
            fields = [n for n, f in host.config.model_fields.items() if slot_kind(f) == entry.kind]
            if not fields or host.key == entry.key:
                continue
            data = host.example_config()
            data[fields[0]] = example
            try:
                hcfg = load_component(host.kind, data, registry=registry)
                with torch.device("meta"):
                    return ctx.build(hcfg), f"inside [`{host.type}`]({{to:{component_path(host.kind, host.type)}}})", None
            except Exception:  # noqa: BLE001 - try the next host
                continue
        raise direct_exc


def param_info(entry, config, registry) -> ParamInfo:
    """Count ``entry``'s parameters (built on meta) at :data:`FIT_D_MODELS`; fit ``a·d² + b·d + c`` exactly.

    Sampling steps (logits processors, stop conditions) are not part of a model: 0, ``how = "sampling"``."""
    from .sampling import KINDS as SAMPLING_KINDS

    if entry.kind in SAMPLING_KINDS:
        return ParamInfo(count=0, how="sampling")
    norm_config = _default_norm(registry)
    info = ParamInfo()
    counts: dict[int, int] = {}
    for d in FIT_D_MODELS:
        try:
            module, how, ctx = _build_alone(entry, config, registry, d, norm_config)
        except Exception as exc:  # noqa: BLE001 - reported on the page
            if d == EXAMPLE_CONTEXT["d_model"]:
                info.error = f"{type(exc).__name__}: {exc}"
            continue
        n = _tagged_params(module, entry.kind, entry.type)
        counts[d] = n
        if d == EXAMPLE_CONTEXT["d_model"]:
            info.count, info.how = n, how
            if entry.kind == "placement":
                info.norms = sum(1 for m in module.modules() if getattr(m, "modkit_kind", None) == "norm")
            if entry.param_count is not None and ctx is not None:
                try:
                    info.declared = int(entry.param_count(config, ctx))
                except Exception:  # noqa: BLE001 - the contract kit reports this properly
                    info.declared = None
    info.counts = counts
    if len(counts) >= 4:
        info.coefficients = fit_quadratic(counts)
    return info


def fit_quadratic(points: Mapping[int, int]) -> Optional[tuple[Fraction, Fraction, Fraction]]:
    """``(c0, c1, c2)`` with ``c0 + c1·d + c2·d² = points[d]`` for every point, or ``None`` if there is none."""
    ds = sorted(points)
    if len(ds) < 3:
        return None
    d0, d1, d2 = ds[:3]
    y0, y1, y2 = (Fraction(points[d]) for d in (d0, d1, d2))
    f01 = (y1 - y0) / (d1 - d0)
    f12 = (y2 - y1) / (d2 - d1)
    f012 = (f12 - f01) / (d2 - d0)
    c2 = f012
    c1 = f01 - f012 * (d0 + d1)
    c0 = y0 - f01 * d0 + f012 * d0 * d1
    if all(c0 + c1 * d + c2 * d * d == points[d] for d in ds):
        return (c0, c1, c2)
    return None


def _coef(c: Fraction) -> str:
    if c.denominator == 1:
        return _count(int(c))
    f = float(c)
    return f"{f:g}" if Fraction(f"{f:g}") == c else f"{c.numerator}/{c.denominator}"


def formula(coefficients: tuple[Fraction, Fraction, Fraction], var: str = "d") -> str:
    """``c2·d² + c1·d + c0`` with zero terms dropped."""
    c0, c1, c2 = coefficients
    terms = []
    for c, power in ((c2, f"{var}²"), (c1, var), (c0, "")):
        if c == 0:
            continue
        mag = _coef(abs(c))
        body = (power if mag == "1" else f"{mag}·{power}") if power else mag
        terms.append(("- " if c < 0 else "+ ") + body)
    if not terms:
        return "0"
    text = " ".join(terms)
    return text[2:] if text.startswith("+ ") else "-" + text[2:]


# ================================================================================================ block diagrams


def trace_block(block, *, types: bool = True) -> Optional[list[tuple[str, str, list[str]]]]:
    """The tensor data flow of a block module as ``[(node id, label, [input node ids])]``, or ``None``.

    Traced with :mod:`torch.fx`; every module tagged with a kind (norms, sublayers) is a leaf. Only the path from
    the block input ``x`` to the block output is kept; item accesses are folded into their source. With
    ``types`` a module's label carries its registered type under its attribute name.
    """
    import torch.fx as fx

    class Tracer(fx.Tracer):
        def is_leaf_module(self, m, qualname):  # noqa: D102
            return hasattr(m, "modkit_kind") or super().is_leaf_module(m, qualname)

    try:
        graph = Tracer().trace(block)
    except Exception:  # noqa: BLE001 - data-dependent control flow: no diagram
        return None
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if not placeholders:
        return None
    x = placeholders[0]
    out = next((n for n in nodes if n.op == "output"), None)
    if out is None:
        return None
    result = out.args[0]
    if isinstance(result, (tuple, list)):
        result = result[0]
    if not isinstance(result, fx.Node):
        return None
    alias: dict[Any, Any] = {}

    def src(n):
        while n in alias:
            n = alias[n]
        return n

    def inputs_of(n) -> list:
        found = []
        fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(a))
        return found

    forward: set = {x}
    for n in nodes:
        if n is not x and any(a in forward for a in inputs_of(n)):
            forward.add(n)
    backward: set = set()
    stack = [result]
    while stack:
        n = stack.pop()
        if n in backward:
            continue
        backward.add(n)
        stack.extend(inputs_of(n))
    keep = [n for n in nodes if n in forward and n in backward]
    modules = dict(block.named_modules())
    out_nodes: list[tuple[str, str, list[str]]] = []
    for n in keep:
        if n.op == "call_function" and n.target is operator.getitem:
            alias[n] = n.args[0]
            continue
        ins = list(dict.fromkeys(src(a).name for a in inputs_of(n) if src(a) in forward and src(a) in backward))
        if n is x:
            label = "x"
        elif n.op == "call_module":
            m = modules.get(n.target)
            label = str(n.target)
            kind, type_ = getattr(m, "modkit_kind", None), getattr(m, "modkit_type", None)
            if types and type_ and type_ != kind:
                label += f"<br/>{type_}"
        elif n.op == "call_function" and n.target in (operator.add, operator.iadd) or getattr(n.target, "__name__", "") == "add":
            label = "+"
        elif n.op == "call_function" and n.target in (operator.mul, operator.imul):
            label = "×"
        else:
            label = str(getattr(n.target, "__name__", n.target))
        out_nodes.append((n.name, label, ins))
    out_nodes.append(("__out__", "x", [src(result).name]))
    return out_nodes


def mermaid_block(flow: list[tuple[str, str, list[str]]], *, prefix: str = "", notes: Mapping[str, str] = {}) -> list[str]:
    """Mermaid flowchart lines (without the ``flowchart`` header) for a traced block."""
    lines = []
    ids = {name: f"{prefix}n{i}" for i, (name, _, _) in enumerate(flow)}
    for i, (name, label, ins) in enumerate(flow):
        nid = ids[name]
        if name == "__out__":
            shape = f'(["{_mermaid_text("x out")}"])'
        elif i == 0:
            shape = f'(["{_mermaid_text("x in")}"])'
        elif label in ("+", "×"):
            shape = f'(("{label}"))'
        else:
            shape = f'["{_mermaid_text(label)}"]'
        lines.append(f"  {nid}{shape}")
        if name in notes:
            lines.append(f'  {nid}_note>"{_mermaid_text(notes[name])}"] -.-> {nid}')
        for a in ins:
            lines.append(f"  {ids[a]} --> {nid}")
    return lines


def _placement_diagram(entry, config, registry) -> Optional[str]:
    norm_config = _default_norm(registry)
    try:
        module, _, _ = _build_alone(entry, config, registry, EXAMPLE_CONTEXT["d_model"], norm_config)
    except Exception:  # noqa: BLE001
        return None
    flow = trace_block(module, types=False)
    if flow is None:
        return None
    return "```mermaid\nflowchart TB\n" + "\n".join(mermaid_block(flow)) + "\n```"


# ================================================================================================ components


def _provider(entry) -> str:
    p = entry.provider
    if p is None:
        return "(unknown)"
    text = f"`{p.plugin}`"
    if p.distribution:
        text += f" from package `{p.distribution}`" + (f" {p.version}" if p.version else "")
    return text


def _caps_inline(entry) -> str:
    parts = []
    for k, v in sorted(entry.capabilities.items()):
        if v is True:
            parts.append(f"`{k}`")
        elif v is False or v in (None, {}, []):
            continue
        elif isinstance(v, (str, int, float)):
            parts.append(f"`{k}={v}`")
        else:
            parts.append(f"`{k}`")
    return " ".join(parts)


#: Front matter of wide index pages: material hides the table of contents, leaving the width to the tables.
_HIDE_TOC = "---\nhide:\n  - toc\n---\n"


def _resolve_links(text: str, page: str) -> str:
    """Replace ``{to:PATH}`` placeholders by links relative to ``page``."""
    return re.sub(r"\{to:([^}]+)\}", lambda m: _rel(page, m.group(1)), text)


@dataclass
class ComponentDoc:
    """Everything one component page shows (computed once, used by its page and the index tables)."""

    entry: Any
    example: dict
    validated: dict
    params: ParamInfo
    diagram: Optional[str]


def validate_examples(registry) -> dict[tuple[str, str], tuple[dict, Any]]:
    """``{(kind, type): (example, validated config)}`` for every component.

    Raises:
        DocsError: one or more examples do not validate (each named with its plugin and the errors).
    """
    from .errors import SpecError
    from .spec import load_component

    out, problems = {}, []
    for entry in registry.components():
        example = entry.example_config()
        try:
            cfg = load_component(entry.kind, example, registry=registry)
        except SpecError as exc:
            errs = "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors)
            problems.append(f"{entry.kind}/{entry.type} ({entry.provider}): example {json.dumps(example)} is invalid: {errs}")
            continue
        if getattr(cfg, "type", None) != entry.type:
            problems.append(f"{entry.kind}/{entry.type} ({entry.provider}): example validates as type {cfg.type!r}")
            continue
        out[entry.key] = (example, cfg)
    if problems:
        raise DocsError("component examples that do not validate:\n  " + "\n  ".join(problems))
    return out


def component_docs(registry) -> list[ComponentDoc]:
    """Validate every example and compute what the component pages show."""
    examples = validate_examples(registry)
    docs = []
    for entry in registry.components():
        example, cfg = examples[entry.key]
        params = param_info(entry, cfg, registry)
        diagram = _placement_diagram(entry, cfg, registry) if entry.kind == "placement" else None
        docs.append(ComponentDoc(entry, example, cfg.model_dump(mode="json"), params, diagram))
    return docs


def _params_short(info: ParamInfo) -> str:
    if info.count is None:
        return "–"
    if info.coefficients is not None:
        return f"`{formula(info.coefficients)}`"
    return _count(info.count)


def _params_section(doc: ComponentDoc) -> str:
    info, entry = doc.params, doc.entry
    ctx = EXAMPLE_CONTEXT
    if info.how == "sampling":
        return ("None: a sampling step works on the logits during generation ([`modkit.sampling`]"
                "({to:reference/api/modkit.sampling.md})), outside the model.")
    if info.count is None:
        return f"Could not be built on its own to count parameters ({_cell(info.error) or 'no host component'})."
    where = " (built " + info.how + ")" if info.how and info.how != "alone" else ""
    lines = [
        f"**{_count(info.count)}** parameters with the example config at d_model = {ctx['d_model']}{where} "
        f"(n_heads {ctx['n_heads']}, head_dim {ctx['d_model'] // ctx['n_heads']}, max_seq_len {_count(ctx['max_seq_len'])}).",
        "",
    ]
    if info.coefficients is not None:
        lines += [
            f"As a function of d = d_model, the example's other fields held fixed: **`P(d) = {formula(info.coefficients)}`** "
            f"(counted on meta at d ∈ {{{', '.join(map(str, sorted(info.counts)))}}}, exact at every one).",
            "",
        ]
    elif info.counts and len(info.counts) > 1:
        lines += [
            _table(("d_model", "parameters"), ((d, _count(n)) for d, n in sorted(info.counts.items())), "rr"),
            "",
        ]
    if info.norms is not None:
        lines += [
            f"It creates **{info.norms}** norm module{'s' if info.norms != 1 else ''} per block from the spec's `norm` "
            "(the count above is theirs, built here with the first registered norm); the attention and ffn it "
            "receives are counted under their own kinds.",
            "",
        ]
    if entry.param_count is not None and info.declared is not None:
        if info.declared == info.count:
            lines.append("The entry's analytic `param_count` agrees with the built module.")
        else:
            lines.append(f"!!! warning\n    The entry's analytic `param_count` gives {_count(info.declared)}, the built module has {_count(info.count)}.")
    elif entry.param_count is None:
        lines.append("The entry declares no analytic `param_count`; the figure comes from the built module.")
    return "\n".join(lines).rstrip()


def component_page(doc: ComponentDoc, registry, contracts: Mapping[str, str], places: Mapping[str, list[str]]) -> str:
    """Markdown of one component's page."""
    from .config import SLOT_KEY  # noqa: F401 - documents where slot markers come from
    from .registry import KNOWN_CAPABILITIES, config_tags
    from .sampling import KINDS as SAMPLING_KINDS

    entry = doc.entry
    page = component_path(entry.kind, entry.type)

    def link_kind(kind: str) -> str:
        return f"[`{kind}`]({_rel(page, kind_path(kind))})" if kind in registry.kinds() else f"`{kind}`"

    schema = entry.config.model_json_schema()
    tags = config_tags(entry.config)
    others = [t for t in tags if t != entry.type]
    cfg_cls = f"{entry.config.__module__}.{entry.config.__qualname__}"
    facts = [
        ("kind", link_kind(entry.kind)),
        ("type", f"`{entry.type}`" + (f" (the same config also serves {', '.join(f'`{t}`' for t in others)})" if others else "")),
        ("plugin", _provider(entry)),
        ("config class", f"`{cfg_cls}`"),
        *([("aliases", ", ".join(f"`{a}`" for a in entry.aliases) + f" (other names of `{entry.type}`, stored as `{entry.type}`)")]
          if entry.aliases else []),
        ("reference", _link_references(_cell(entry.reference)) if entry.reference else "(none given)"),
        ("goes in a spec at", ", ".join(places.get(entry.kind, [])) or "(no slot)")
        if entry.kind not in SAMPLING_KINDS else
        ("goes in", "the `sampling` list of `modkit.generate.generate` (`modkit generate --sampling`)"
         + (f", or its keyword `{entry.capabilities['argument']['name']}`" if isinstance(entry.capabilities.get("argument"), dict) else "")),
    ]
    parts = [
        f"# {entry.type}",
        "",
        f"*{entry.kind} component* · {_caps_inline(entry)}" if entry.capabilities else f"*{entry.kind} component*",
        "",
        _link_references(_rst_to_md(" ".join(entry.description.split()))),
        "",
        _table(("", ""), facts),
        "",
        "## Shapes",
        "",
    ]
    contract = contracts.get(entry.kind)
    if contract:
        parts.append(f"Contract of every `{entry.kind}` ([`modkit.interfaces`]({_rel(page, 'reference/api/modkit.interfaces.md')})): {contract}")
    else:
        parts.append(f"The core defines no calling convention for `{entry.kind}`; its description above gives the shapes.")
    acts = entry.capabilities.get("acts_on")
    if acts is not None:
        parts += ["", f"**Acts on `{acts}`**: {acts_on_text(acts)}"]
    if entry.grouped_factory is not None:
        parts += ["", "**Grouped form**: usable as mixture-of-experts experts (its `grouped_factory` builds `n` "
                  "copies with stacked weights, run by one grouped GEMM per projection)."]
    for alias, note in entry.alias_notes.items():
        parts += ["", f'!!! note "Alias `{alias}`"', "", textwrap.indent(_link_references(_cell(note)), "    ")]
    parts += ["", "## Fields", "", _field_table(field_rows(schema, link_kind=link_kind)), ""]
    parts += ["## Capabilities", ""]
    if entry.capabilities:
        rows = []
        for k, v in sorted(entry.capabilities.items()):
            value = json.dumps(v, default=str).replace("`", "'")
            rows.append((f"`{k}`", _cell(f"`{value}`"), _cell(KNOWN_CAPABILITIES.get(k, "(declared by the plugin)"))))
        parts.append(_table(("capability", "value", "meaning"), rows))
    else:
        parts.append("None declared.")
    parts += ["", "## Parameters", "", _params_section(doc), ""]
    if doc.diagram:
        parts += [
            "## Block diagram",
            "",
            "Traced from the block this placement builds (attention and ffn stand-ins; `+` is a residual add):",
            "",
            doc.diagram,
            "",
        ]
    spec_key = entry.kind
    parts += [
        "## Example",
        "",
        f"Validated with `modkit.load_component({entry.kind!r}, ...)` when the site was built:",
        "",
        "```json",
        json.dumps([doc.example] if entry.kind in SAMPLING_KINDS else {spec_key: doc.example}, indent=2),
        "```",
        "",
        '??? note "The same config with every default filled in"',
        "",
        textwrap.indent("```json\n" + json.dumps(doc.validated, indent=2) + "\n```", "    "),
        "",
        f"On the command line: `modkit show {entry.kind} {entry.type}`.",
        "",
    ]
    return _resolve_links("\n".join(parts), page)


def kind_index_page(kind: str, docs: list[ComponentDoc], registry, contracts: Mapping[str, str], places: Mapping[str, list[str]]) -> str:
    """Markdown of a kind's index page."""
    page = kind_path(kind)
    mine = [d for d in docs if d.entry.kind == kind]
    parts = [_HIDE_TOC, f"# {kind}", ""]
    if kind in contracts:
        parts += [f"**Contract** ([`modkit.interfaces`]({_rel(page, 'reference/api/modkit.interfaces.md')})): {contracts[kind]}", ""]
    if places.get(kind):
        parts += ["Goes in a spec at " + ", ".join(places[kind]) + ".", ""]
    rows = []
    for d in mine:
        e = d.entry
        extra = f"`{e.capabilities['acts_on']}`" if "acts_on" in e.capabilities else _params_short(d.params)
        rows.append(
            (
                f"[`{e.type}`]({_rel(page, component_path(kind, e.type))})",
                f"`{e.provider.plugin if e.provider else ''}`",
                _cell(_first_sentence(_rst_to_md(e.description))),
                extra,
                _caps_inline(e),
            )
        )
    col = "acts on" if any("acts_on" in d.entry.capabilities for d in mine) else "parameters (d = d_model)"
    parts += [_table(("type", "plugin", "what it computes", col, "capabilities"), rows), ""]
    aliases = registry.aliases(kind)
    if aliases:
        parts += ["**Aliases** (other names a spec may use; stored under the type): " + ", ".join(
            f"`{a}` → [`{t}`]({_rel(page, component_path(kind, t))})" for a, t in aliases.items()) + ".", ""]
    diagrams = [d for d in mine if d.diagram]
    if diagrams:
        parts += ["## Side by side", "", "Each block as traced from the module the placement builds; `+` is a residual add.", ""]
        parts.append('<div class="grid cards" markdown>')
        parts.append("")
        for d in diagrams:
            parts += [
                f"-   [**`{d.entry.type}`**]({_rel(page, component_path(kind, d.entry.type))}) — "
                f"{d.params.norms} norm{'s' if d.params.norms != 1 else ''} per block",
                "",
                textwrap.indent(d.diagram, "    "),
                "",
            ]
        parts += ["</div>", ""]
    return _resolve_links("\n".join(parts), page)


def overview_page(docs: list[ComponentDoc], registry, contracts: Mapping[str, str]) -> str:
    """Markdown of ``components/index.md``: the kinds and a filterable table of every component."""
    page = "components/index.md"
    parts = [
        _HIDE_TOC,
        "# Components",
        "",
        f"Every component registered when this site was built: {len(docs)} components of {len(registry.kinds())} kinds "
        f"from {len(registry.plugins())} plugins. Third-party plugins that were installed show up here like the built-ins. "
        "On the command line: `modkit list`, `modkit show KIND TYPE`, `modkit plugins`.",
        "",
        "## Kinds",
        "",
    ]
    rows = []
    for kind in registry.kinds():
        n = sum(1 for d in docs if d.entry.kind == kind)
        rows.append((f"[`{kind}`]({_rel(page, kind_path(kind))})", n, _cell(contracts.get(kind, "see each component's description"))))
    parts += [_table(("kind", "types", "contract"), rows, "lrl"), "", "## All components", ""]
    parts += [
        '<input class="mk-filter" type="search" placeholder="Filter the table: kind, type, plugin, capability, words…" '
        'aria-label="filter components" data-target="mk-components">',
        "",
        '<div id="mk-components" markdown>',
        "",
    ]
    rows = []
    for d in docs:
        e = d.entry
        prov = e.provider
        pkg = f"{prov.distribution} {prov.version or ''}".strip() if prov and prov.distribution else ""
        rows.append(
            (
                f"`{e.kind}`",
                f"[`{e.type}`]({_rel(page, component_path(e.kind, e.type))})",
                f"`{prov.plugin if prov else ''}`" + (f" ({pkg})" if pkg else ""),
                _caps_inline(e),
                _cell(_first_sentence(_rst_to_md(e.description))),
            )
        )
    parts += [_table(("kind", "type", "plugin", "capabilities", "description"), rows), "", "</div>", ""]
    skipped = registry.skipped_plugins()
    if skipped:
        parts += ["## Plugins that failed to load", "", "Their components are missing from this site:", ""]
        parts += [f"- `{name}`: {_cell(reason)}" for name, reason in sorted(skipped.items())]
        parts.append("")
    return "\n".join(parts)


def components_nav(docs: list[ComponentDoc], registry) -> str:
    """literate-nav ``components/SUMMARY.md``."""
    lines = ["* [Overview](index.md)"]
    for kind in registry.kinds():
        lines.append(f"* [{kind}]({kind}/index.md)")
        for d in docs:
            if d.entry.kind == kind:
                lines.append(f"    * [{d.entry.type}]({kind}/{d.entry.type}.md)")
    return "\n".join(lines) + "\n"


# ================================================================================================ gallery


@dataclass
class SpecCard:
    """What the gallery shows for one spec."""

    stem: str
    source: str
    spec: Any
    params: dict
    active: int
    kv_elements_per_token: int
    kv_elements_long: int
    windowed: bool
    components: list[dict]
    diagram: str
    layer_groups: list[tuple[str, str]]
    attention: dict


def _layer_ranges(indices: list[int]) -> str:
    """``0-3, 5, 7-9`` (or ``every 2nd from 1`` style when strided)."""
    if not indices:
        return ""
    if len(indices) > 2:
        step = indices[1] - indices[0]
        if step > 1 and all(b - a == step for a, b in zip(indices, indices[1:])):
            return f"{indices[0]}, {indices[1]}, …, {indices[-1]} (every {step})"
    out, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}–{prev}" if prev > start else str(start))
        if i is not None:
            start = prev = i
    return ", ".join(out)


def _kv_elements(model, context: int) -> tuple[int, int, bool]:
    """``(elements per token, elements for ``context`` tokens, any sliding window)``: windows cap the long figure."""
    per_token, long, windowed = 0, 0, False
    for i, layer in enumerate(model.layers):
        window = model.windows[i] if i < len(model.windows) else None
        for m in layer.modules():
            if getattr(m, "modkit_kind", None) != "attention":
                continue
            fn = getattr(m, "kv_cache_elements_per_token", None)
            e = int(fn()) if callable(fn) else 2 * int(m.n_kv_heads) * int(m.head_dim)
            per_token += e
            tokens = context if window is None else min(window, context)
            windowed = windowed or (window is not None and window < context)
            long += e * tokens
    return per_token, long, windowed


def _model_diagram(model, registry) -> tuple[str, list[tuple[str, str]]]:
    """Mermaid source of the model flow and of each distinct block; ``[(layers, block mermaid)]``."""
    spec = model.spec
    pos_cfg = spec.position
    pos_entry = registry.entry_for_config(pos_cfg)
    acts = pos_entry.capabilities.get("acts_on")
    head = "lm_head<br/>tied to the embedding" if spec.tie_embeddings else "lm_head"
    lines = ["flowchart TB", f'  ids(["input_ids #91;batch, seq#93;"]) --> emb["token embedding<br/>{_count(spec.vocab_size)} × {spec.d_model}"]']
    prev = "emb"
    if spec.embedding_scale is not None:
        scale = "√d_model" if spec.embedding_scale == "sqrt_d_model" else f"{spec.embedding_scale:g}"
        lines.append(f'  scale(("× {scale}"))')
        lines.append(f"  {prev} --> scale")
        prev = "scale"
    if acts == "embedding":
        lines.append(f'  pos(("+ {pos_cfg.type}"))')
        lines.append(f"  {prev} --> pos")
        prev = "pos"
    if spec.embedding_norm is not None:
        lines.append(f'  enorm["embedding_norm<br/>{spec.embedding_norm.type}"]')
        lines.append(f"  {prev} --> enorm")
        prev = "enorm"
    lines.append(f'  blocks[["{spec.n_layers} × block<br/>{_mermaid_text(spec.block.placement.type)} placement"]]')
    lines.append(f"  {prev} --> blocks")
    prev = "blocks"
    if acts in ("qk", "bias"):
        what = "rotates q, k" if acts == "qk" else "adds an attention bias"
        lines.append(f'  rope["{pos_cfg.type}: {what}"] -.-> blocks')
    if spec.final_norm is not None:
        lines.append(f'  fnorm["final_norm<br/>{spec.final_norm.type}"]')
        lines.append(f"  {prev} --> fnorm")
        prev = "fnorm"
    lines.append(f'  head["{head}"]')
    lines.append(f"  {prev} --> head")
    prev = "head"
    if spec.final_logit_softcap is not None:
        lines.append(f'  cap["softcap {spec.final_logit_softcap:g}·tanh(z / {spec.final_logit_softcap:g})"]')
        lines.append(f"  {prev} --> cap")
        prev = "cap"
    lines.append(f'  logits(["logits #91;batch, seq, {_count(spec.vocab_size)}#93;"])')
    lines.append(f"  {prev} --> logits")
    model_mermaid = "\n".join(lines)

    groups: dict[str, list[int]] = {}
    for i, block in enumerate(model.layers):
        flow = trace_block(block)
        notes = {}
        if flow is None:
            body = f'  b["{_mermaid_text(type(block).__name__)} (not traceable)"]'
        else:
            window = model.windows[i] if i < len(model.windows) else None
            layer_pos = model.positions[model.layer_position[i]] if hasattr(model, "layer_position") else None
            pos_type = getattr(layer_pos, "modkit_type", None)
            pos_entry_l = registry.get("position", pos_type) if pos_type in registry.types("position") else None
            l_acts = pos_entry_l.capabilities.get("acts_on") if pos_entry_l else None
            for name, label, _ in flow:
                if label.startswith("attention"):
                    bits = []
                    if l_acts in ("qk", "bias"):
                        bits.append(f"{pos_type}: " + ("rotates q, k" if l_acts == "qk" else "bias"))
                    if window is not None:
                        bits.append(f"sliding window {window}")
                    if bits:
                        notes[name] = "; ".join(bits)
            body = "\n".join(mermaid_block(flow, notes=notes))
        groups.setdefault(body, []).append(i)
    blocks = [(_layer_ranges(idx), "flowchart TB\n" + body) for body, idx in groups.items()]
    return model_mermaid, blocks


def spec_card(path: Path, registry, root: Optional[Path] = None) -> SpecCard:
    """Load, validate and build (on meta) one spec; compute its gallery figures."""
    from .build import active_params_per_token, breakdown, build, summarize
    from .spec import load_spec

    spec = load_spec(path, registry=registry)
    model = build(spec, device="meta", registry=registry)
    params = breakdown(model)
    active = active_params_per_token(model)
    per_token, long, windowed = _kv_elements(model, LONG_CONTEXT)
    summary = summarize(model, "bfloat16", registry=registry)
    diagram, groups = _model_diagram(model, registry)
    attention = {}
    for m in model.layers[0].modules():  # the attention contract exposes its geometry
        if getattr(m, "modkit_kind", None) == "attention":
            attention = {k: getattr(m, k, None) for k in ("n_heads", "n_kv_heads", "head_dim")}
            break
    try:
        source = str(path.resolve().relative_to(root.resolve())) if root else path.name
    except ValueError:
        source = str(path)
    return SpecCard(path.stem, source, spec, params, active, per_token, long, windowed, summary.components, diagram, groups, attention)


def _spec_shape(spec, attention: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Headline sizes of a spec; the attention geometry comes from the built first layer."""
    layer = spec.layer(0)
    att = layer.attention
    rows = [
        ("vocabulary", _count(spec.vocab_size)),
        ("d_model", _count(spec.d_model)),
        ("layers", str(spec.n_layers)),
        ("max_seq_len", _count(spec.max_seq_len)),
    ]
    for label, obj, names, known in (
        ("attention (layer 0)", att, ("sliding_window",), attention),
        ("ffn (layer 0)", layer.ffn, ("d_ff", "n_experts", "top_k", "activation", "act"), {}),
    ):
        bits = [f"`{obj.type}`"] + [f"{k} {v}" for k, v in known.items() if v is not None]
        for n in names:
            v = getattr(obj, n, None)
            if v is not None:
                bits.append(f"{n} {v}")
        rows.append((label, ", ".join(bits)))
    rows.append(("position", f"`{spec.position.type}`"))
    rows.append(("placement / norm", f"`{layer.placement.type}` / `{layer.norm.type}`"))
    rows.append(("tied embeddings", "yes" if spec.tie_embeddings else "no"))
    return rows


def gallery_page(card: SpecCard, registry) -> str:
    """Markdown of one spec's model card."""
    page = gallery_path(card.stem)
    spec = card.spec
    total = card.params["total"]
    share = lambda n: f"{100.0 * n / total:.1f}%" if total else "–"  # noqa: E731
    title = spec.name or card.stem
    parts = [f"# {title}", ""]
    if spec.description:
        parts += [_cell(spec.description), ""]
    meta = ", ".join(f"{k} `{v}`" for k, v in spec.metadata.items()) if spec.metadata else ""
    parts += [f"Spec: `{card.source}`" + (f" · metadata: {meta}" if meta else "") + " · built on `meta` (no memory) when this site was built.", ""]
    parts += [_table(("", ""), _spec_shape(spec, card.attention)), ""]

    parts += ["## Parameters", ""]
    rows = [(k, _count(v), share(v), _short(v)) for k, v in card.params.items() if k != "total"]
    rows.append(("**total**", f"**{_count(total)}**", "100%", f"**{_short(total)}**"))
    parts += [_table(("part", "parameters", "share", ""), rows, "lrrr"), ""]
    if card.active != total:
        parts += [f"**Active per token: {_count(card.active)} ({_short(card.active)}, {share(card.active)} of the total)**: "
                  "a sparse layer runs only the experts its router picks.", ""]
    else:
        parts += ["Dense: every parameter is active for every token.", ""]

    parts += ["## Memory", ""]
    rows = []
    for label, size in DTYPE_BYTES:
        rows.append(
            (
                label,
                _bytes(total * size),
                _count(card.kv_elements_per_token * size),
                _bytes(card.kv_elements_long * size),
                _bytes(card.kv_elements_per_token * size * spec.max_seq_len),
            )
        )
    long_label = f"KV cache, {LONG_CONTEXT // 1024}K context"
    parts += [
        _table(("dtype", "weights", "KV cache bytes / token", long_label, f"KV cache, max_seq_len {_count(spec.max_seq_len)}"), rows, "lrrrr"),
        "",
    ]
    notes = [f"The KV cache stores keys and values of n_kv_heads heads: {_count(card.kv_elements_per_token)} elements per token over all layers (batch 1)."]
    if card.windowed:
        notes.append(f"Sliding-window layers keep only their window, which the {LONG_CONTEXT // 1024}K figure counts; the per-token figure is the uncapped rate.")
    if LONG_CONTEXT > spec.max_seq_len:
        notes.append(f"{LONG_CONTEXT // 1024}K exceeds this model's max_seq_len ({_count(spec.max_seq_len)}); that figure is for comparison only.")
    parts += [" ".join(notes), ""]

    parts += [
        "## Architecture",
        "",
        "The model, then its block as traced from the built modules (`+` is a residual add; a note says how the "
        "position scheme enters attention).",
        "",
        '<div class="grid" markdown>',
        "",
        '<div class="mk-diagram" markdown>',
        "",
        "**Model**",
        "",
        "```mermaid",
        card.diagram,
        "```",
        "",
        "</div>",
        "",
    ]
    for layers, block in card.layer_groups:
        which = "every layer" if len(card.layer_groups) == 1 else f"layers {layers}"
        parts += ['<div class="mk-diagram" markdown>', "", f"**Block: {which}**", "", "```mermaid", block, "```", "", "</div>", ""]
    parts += ["</div>", ""]

    parts += ["## Components", ""]
    rows = []
    kinds = set(registry.kinds())
    for c in card.components:
        link = f"[`{c['type']}`]({_rel(page, component_path(c['kind'], c['type']))})" if c["kind"] in kinds else f"`{c['type']}`"
        prov = f"`{c.get('plugin') or ''}`" + (f" ({c['distribution']} {c.get('version') or ''})".rstrip() if c.get("distribution") else "")
        paths = c.get("paths", [])
        where = ", ".join(f"`{p}`" for p in paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        rows.append((c["kind"], link, prov, where))
    parts += [_table(("kind", "type", "plugin", "used at"), rows), ""]

    if spec.overrides:
        parts += ["## Per-layer overrides", ""]
        rows = []
        for o in spec.overrides:
            replaced = [f"{k}: `{getattr(o, k).type}`" for k in ("attention", "ffn", "norm", "placement", "position") if getattr(o, k) is not None]
            rows.append((_layer_ranges(o.indices(spec.n_layers)), ", ".join(replaced)))
        parts += [_table(("layers", "replaced"), rows), ""]

    parts += [
        '??? example "The spec"',
        "",
        textwrap.indent("```json\n" + spec.to_json(indent=2) + "\n```", "    "),
        "",
        f"Reproduce this card: `modkit build {card.source} --device meta`.",
        "",
    ]
    return "\n".join(parts)


def gallery_index(cards: list[SpecCard], registry) -> str:
    """Markdown of ``gallery/index.md``."""
    page = "gallery/index.md"
    parts = [
        _HIDE_TOC,
        "# Model gallery",
        "",
        f"One model card per spec in `specs/` ({len(cards)} specs), each built on `meta` while the site was built: "
        "parameter breakdown, active parameters, weight and KV-cache bytes and the block diagram.",
        "",
    ]
    rows = []
    for c in cards:
        s = c.spec
        layer = s.layer(0)
        total = c.params["total"]
        rows.append(
            (
                f"[{s.name or c.stem}]({_rel(page, gallery_path(c.stem))})",
                _short(total),
                _short(c.active) if c.active != total else "(dense)",
                s.n_layers,
                _count(s.d_model),
                f"`{layer.attention.type}`",
                f"`{layer.ffn.type}`",
                f"`{s.position.type}`",
                f"`{layer.placement.type}`",
                f"`{layer.norm.type}`",
                _count(c.kv_elements_per_token * 2),
            )
        )
    parts.append(
        _table(
            ("model", "params", "active", "layers", "d_model", "attention", "ffn", "position", "placement", "norm", "KV bytes/token (bf16)"),
            rows,
            "lrrrrllllll" + "r",
        )
    )
    return "\n".join(parts) + "\n"


# ================================================================================================ reference pages


def spec_reference_page(registry) -> str:
    """Markdown of ``reference/spec.md`` from the live JSON Schema of specs."""
    from .spec import SCHEMA_VERSION, json_schema

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
        f"The schema itself: [modkit.schema.json](modkit.schema.json) (point a spec's `\"$schema\"` key at a copy "
        "and an editor completes and checks it as you type).",
        "",
    ]
    parts += section("Top level", schema, _rst_to_md(" ".join((schema.get("description") or "").split())))
    parts += section("block", find_def("BlockSpec"), _rst_to_md(find_def("BlockSpec").get("description", "")))
    parts += section("overrides[]", find_def("LayerOverride"), _rst_to_md(find_def("LayerOverride").get("description", "")))
    parts += section("LayerRange", find_def("LayerRange"), _rst_to_md(find_def("LayerRange").get("description", "")))
    parts += [
        "## Rules checked across fields",
        "",
        "Besides types and ranges, components check their fields against the model (for example a head count that "
        "the KV-head count does not divide is refused at `block.attention.n_kv_heads`); an unknown `type` answers "
        "with the valid types, the closest match and the installed plugins. `modkit validate SPEC...` prints one "
        "line per problem.",
        "",
    ]
    return _resolve_links("\n".join(parts), page)


def _argparse_sections(parser: argparse.ArgumentParser, words: list[str], depth: int) -> list[str]:
    out: list[str] = []
    title = " ".join(words)
    out += [f"{'#' * min(depth, 4)} `{title}`", ""]
    desc = parser.description or ""
    if desc:
        out += [_cell(desc), ""]
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: ") :]
    out += ["```text", usage, "```", ""]
    rows, subs = [], None
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walker
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            subs = action
            continue
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        if action.option_strings:
            meta = ""
            if action.nargs != 0:
                meta = " " + (action.metavar or action.dest.upper())
            names = ", ".join(f"`{o}{meta}`" for o in action.option_strings)
        else:
            names = f"`{action.metavar or action.dest}`"
        default = ""
        if action.default not in (None, argparse.SUPPRESS, False) and action.nargs != 0:
            default = f"`{action.default}`"
        help_text = (action.help or "") if action.help != argparse.SUPPRESS else ""
        if action.required and action.option_strings:
            help_text = "(required) " + help_text
        rows.append((names, default, _cell(help_text % {"default": action.default, "prog": parser.prog} if "%(" in help_text else help_text)))
    if rows:
        out += [_table(("argument", "default", "meaning"), rows), ""]
    if parser.epilog:
        out += [_cell(parser.epilog), ""]
    if subs is not None:
        helps = {a.dest: a.help for a in subs._choices_actions}  # noqa: SLF001
        seen = set()
        for name, sub in subs.choices.items():
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            if not sub.description and helps.get(name):
                sub.description = helps[name]
            out += _argparse_sections(sub, words + [name], depth + 1)
    return out


def cli_reference_page() -> str:
    """Markdown of ``reference/cli.md``, walked from :func:`modkit.cli.build_parser` (extension commands too)."""
    from .cli import build_parser

    parser = build_parser()
    parts = [
        "# Command line",
        "",
        "Generated from the `modkit` argument parser when the site was built, subcommands contributed by other "
        "modules included. Errors in the input print one message to stderr and exit with status 1, usage errors "
        "with 2; `MODKIT_DEBUG=1` shows tracebacks.",
        "",
    ]
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    if sub is not None:
        helps = {a.dest: a.help for a in sub._choices_actions}  # noqa: SLF001
        parts += [_table(("command", "what it does"), ((f"[`modkit {n}`](#modkit-{n})", _cell(helps.get(n, ""))) for n in sub.choices)), ""]
    parts += _argparse_sections(parser, ["modkit"], 2)
    return "\n".join(parts)


def api_modules() -> list[str]:
    """Public modules of the ``modkit`` package (those with an API page), in import-path order."""
    import modkit

    names = ["modkit"]
    for info in pkgutil.walk_packages(modkit.__path__, "modkit."):
        last = info.name.rsplit(".", 1)[-1]
        if last.startswith("_") or info.name in API_SKIP:
            continue
        names.append(info.name)
    return sorted(names)


def api_pages() -> dict[str, str]:
    """``reference/api/<module>.md`` (an mkdocstrings directive each), an index and a literate-nav file."""
    import modkit

    pages: dict[str, str] = {}
    modules = api_modules()
    rows = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
            summary = _first_sentence(_rst_to_md((inspect.getdoc(mod) or "").split("\n\n")[0]))
        except Exception as exc:  # noqa: BLE001 - still gets a page; mkdocstrings reads the source
            summary = f"(could not be imported here: {type(exc).__name__})"
        rows.append((f"[`{name}`]({name}.md)", _cell(summary)))
        if name == "modkit":
            body = (
                "# modkit\n\n::: modkit\n    options:\n      members: false\n      show_root_heading: false\n\n"
                "## Exported names\n\n"
                + _table(
                    ("name", "defined in"),
                    (
                        (f"`modkit.{n}`", f"[`{getattr(getattr(modkit, n), '__module__', 'modkit')}`]({getattr(getattr(modkit, n), '__module__', 'modkit')}.md)")
                        for n in modkit.__all__
                        if getattr(getattr(modkit, n), "__module__", "").startswith("modkit")
                    ),
                )
                + "\n"
            )
        else:
            body = f"# {name}\n\n::: {name}\n"
        pages[f"reference/api/{name}.md"] = body
    pages["reference/api/index.md"] = (
        "# Python API\n\nGenerated by mkdocstrings from the docstrings of each module. The names most code needs are "
        "exported by the [`modkit`](modkit.md) package itself.\n\n" + _table(("module", "what it holds"), rows) + "\n"
    )
    nav = ["* [Overview](index.md)"] + [f"* [{n}]({n}.md)" for n in modules]
    pages["reference/api/SUMMARY.md"] = "\n".join(nav) + "\n"
    return pages


# ================================================================================================ generate


PLUGIN_GUIDE = "guides/writing-a-plugin.md"


def generate(registry=None, *, spec_dir: Optional[Path] = None, docs_dir: Optional[Path] = None, root: Optional[Path] = None) -> dict[str, str]:
    """Every generated page: ``{docs-relative path: text}``.

    Args:
        registry: defaults to the process-wide registry (every installed plugin).
        spec_dir: folder of the gallery's specs (``*.json``); none when ``None``.
        docs_dir: the hand-written sources; used to add a placeholder for a linked page that does not exist yet.
        root: repository root, to show spec paths relative to it.

    Raises:
        DocsError: a component's example config or a spec does not validate.
    """
    from .errors import SpecError
    from .registry import get_registry

    reg = registry or get_registry()
    contracts = kind_contracts()
    places = slot_places(reg)
    docs = component_docs(reg)
    pages: dict[str, str] = {}
    for d in docs:
        pages[component_path(d.entry.kind, d.entry.type)] = component_page(d, reg, contracts, places)
    for kind in reg.kinds():
        pages[kind_path(kind)] = kind_index_page(kind, docs, reg, contracts, places)
    pages["components/index.md"] = overview_page(docs, reg, contracts)
    pages["components/SUMMARY.md"] = components_nav(docs, reg)

    cards, problems = [], []
    for path in sorted(Path(spec_dir).glob("*.json")) if spec_dir else []:
        try:
            cards.append(spec_card(path, reg, root))
        except SpecError as exc:
            problems.append(f"{path.name}: " + "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors))
    if problems:
        raise DocsError("specs in the gallery that do not validate:\n  " + "\n  ".join(problems))
    for c in cards:
        pages[gallery_path(c.stem)] = gallery_page(c, reg)
    pages["gallery/index.md"] = gallery_index(cards, reg)
    pages["gallery/SUMMARY.md"] = "* [Overview](index.md)\n" + "".join(f"* [{c.spec.name or c.stem}]({c.stem}.md)\n" for c in cards)

    pages["reference/spec.md"] = spec_reference_page(reg)
    from .spec import json_schema

    pages["reference/modkit.schema.json"] = json.dumps(json_schema(reg), indent=2) + "\n"
    pages["reference/cli.md"] = cli_reference_page()
    pages.update(api_pages())
    if docs_dir is not None and not (Path(docs_dir) / PLUGIN_GUIDE).exists():
        pages[PLUGIN_GUIDE] = (
            "# Write a component plugin\n\nThis guide is being written. Until it lands: the README's section "
            "*Writing a plugin* shows a complete plugin, `modkit new plugin` scaffolds one, and "
            "[compose a model](compose.md) shows how its components are used in a spec.\n"
        )
    return pages


# ================================================================================================ mkdocs glue


def rewrite_outside_links(markdown: str, page_src: str, docs_dir: Path, repo_root: Path, repo_url: Optional[str]) -> str:
    """Rewrite Markdown links that leave ``docs_dir`` (``../../README.md``) so strict builds do not break on them.

    A link to a repository file outside the docs becomes a link into ``repo_url`` (``.../blob/HEAD/PATH``) when
    one is configured, else the link text followed by the repository path in code.
    """
    import posixpath

    base = (docs_dir / page_src).parent

    def fix(m: re.Match) -> str:
        text, target = m.group(1), m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return m.group(0)
        path, _, frag = target.partition("#")
        try:
            resolved = (base / path).resolve()
            resolved.relative_to(docs_dir.resolve())
            return m.group(0)  # inside the docs: mkdocs checks it
        except ValueError:
            pass
        try:
            rel = resolved.relative_to(repo_root.resolve()).as_posix()
        except ValueError:
            return m.group(0)
        if repo_url:
            return f"[{text}]({posixpath.join(repo_url.rstrip('/'), 'blob/HEAD', rel)}{'#' + frag if frag else ''})"
        return text if text.strip("`") == rel else f"{text} (`{rel}` in the repository)"

    return re.sub(r"(?<!!)\[([^\]]+)\]\(([^)\s]+)\)", fix, markdown)


def _roles_to_autorefs(text: str) -> str:
    """``:class:`~a.b.C``` -> an optional cross-reference (plain code when the target has no page)."""

    def repl(m: re.Match) -> str:
        target = m.group(2)
        tilde = target.startswith("~")
        ident = target.lstrip("~")
        shown = ident.split(".")[-1] if tilde else ident
        if m.group(1) in ("func", "meth"):
            shown += "()"
        return f'<autoref identifier="{ident}" optional><code>{shown}</code></autoref>'

    return re.sub(r":(class|func|meth|data|attr|mod|exc|obj):`([^`]+)`", repl, text)


class SphinxRoles(_GriffeExtension):  # type: ignore[misc,valid-type]
    """Griffe extension: render Sphinx roles in modkit's docstrings as mkdocstrings cross-references."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring roles (``:class:`x```) as autorefs before mkdocstrings renders it."""
        doc = getattr(obj, "docstring", None)
        if doc is not None and ":" in doc.value:
            doc.value = _roles_to_autorefs(doc.value)


# ================================================================================================ CLI


def find_config(start: Optional[Path] = None) -> Optional[Path]:
    """``mkdocs.yml`` of the modkit repository: searched from ``start`` (cwd) upwards, then next to the package."""
    here = Path(start or Path.cwd()).resolve()
    for d in [here, *here.parents]:
        cand = d / "mkdocs.yml"
        if cand.is_file() and (d / "docs").is_dir():
            return cand
    cand = Path(__file__).resolve().parents[1] / "mkdocs.yml"
    return cand if cand.is_file() else None


def _require_mkdocs():
    from .cli import UserError

    missing = []
    for mod in ("mkdocs", "material", "mkdocs_gen_files", "mkdocs_literate_nav", "mkdocstrings"):
        try:
            importlib.import_module(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise UserError(f"the docs need {', '.join(missing)}; install them with: pip install 'modkit[docs]'")


def _config_path(args) -> Path:
    from .cli import UserError

    if args.config_file:
        path = Path(args.config_file)
        if not path.is_file():
            raise FileNotFoundError(f"{args.config_file}: no such file")
        return path
    path = find_config()
    if path is None:
        raise UserError("no mkdocs.yml found here or above, nor next to the modkit package; pass --config-file")
    return path


def _quiet_banners() -> None:
    """Silence the advertising banners some mkdocs plugins print at start-up (they are not build messages)."""
    import os

    os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")
    os.environ.setdefault("DISABLE_MKDOCS_2_WARNING", "true")


def _log_to_stderr() -> None:
    import sys

    logger = logging.getLogger("mkdocs")
    if not any(getattr(h, "_modkit", False) for h in logger.handlers):
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(levelname)-7s -  %(message)s"))
        h._modkit = True  # type: ignore[attr-defined]
        logger.addHandler(h)
        logger.setLevel(logging.INFO)


def build_site(config_file: Path, site_dir: Optional[Path] = None, *, strict: bool = True) -> Path:
    """Build the site with mkdocs (in this process); returns the output folder.

    Raises:
        DocsError: mkdocs aborted (in strict mode: any warning).
    """
    from mkdocs.commands.build import build
    from mkdocs.config import load_config
    from mkdocs.exceptions import MkDocsException

    kwargs: dict[str, Any] = {"strict": strict}
    if site_dir is not None:
        kwargs["site_dir"] = str(Path(site_dir).resolve())
    try:
        cfg = load_config(config_file=str(config_file), **kwargs)
        cfg.plugins.on_startup(command="build", dirty=False)
        try:
            build(cfg)
        finally:
            cfg.plugins.on_shutdown()
    except MkDocsException as exc:
        raise DocsError(f"mkdocs: {exc}") from exc
    return Path(cfg["site_dir"])


def cmd_docs_build(args: argparse.Namespace) -> int:
    """``modkit docs build [-o DIR] [--no-strict]``."""
    import sys
    import time

    _require_mkdocs()
    config = _config_path(args)
    _quiet_banners()
    _log_to_stderr()
    start = time.perf_counter()
    try:
        out = build_site(config, Path(args.output) if args.output else None, strict=not args.no_strict)
    except DocsError as exc:
        print(f"modkit: error: {exc}", file=sys.stderr)
        return 1
    print(f"built the site in {out} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


def cmd_docs_serve(args: argparse.Namespace) -> int:
    """``modkit docs serve [-a ADDR]``: live-reloading server (rebuilds on edits to docs/, modkit/, plugins/, specs/)."""
    _require_mkdocs()
    from mkdocs.commands.serve import serve

    config = _config_path(args)
    _quiet_banners()
    _log_to_stderr()
    root = config.parent
    watch = [str(root / d) for d in ("modkit", "plugins", "specs") if (root / d).is_dir()]
    serve(config_file=str(config), dev_addr=args.dev_addr, livereload=True, watch=watch, strict=False)
    return 0


def add_subcommands(subparsers) -> None:
    """Add ``modkit docs build`` and ``modkit docs serve`` (called by :func:`modkit.cli.build_parser`)."""
    p = subparsers.add_parser(
        "docs",
        help="build or serve the documentation site",
        description="Build or serve the mkdocs site; component pages and the model gallery are generated from "
        "the installed components and specs/ (needs pip install 'modkit[docs]').",
    )
    sub = p.add_subparsers(dest="docs_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    b = sub.add_parser("build", help="build the static site", description="Build the static site (strict: any warning fails).")
    b.add_argument("-o", "--output", metavar="DIR", help="output folder (default: site/ next to mkdocs.yml)")
    b.add_argument("-f", "--config-file", metavar="FILE", help="mkdocs.yml to use (default: found from the current folder)")
    b.add_argument("--no-strict", action="store_true", help="do not fail on warnings")
    b.set_defaults(func=cmd_docs_build)
    s = sub.add_parser("serve", help="serve the site with live reload", description="Serve the site on a local address, rebuilding on edits.")
    s.add_argument("-a", "--dev-addr", metavar="IP:PORT", default="127.0.0.1:8000", help="address to serve on")
    s.add_argument("-f", "--config-file", metavar="FILE", help="mkdocs.yml to use (default: found from the current folder)")
    s.set_defaults(func=cmd_docs_serve)
