"""The ``components/`` section: one page per component, one index per kind, the overview table and its nav."""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from .comparison import comparison_section, component_figures, Figures
from .contracts import acts_on_text, kind_contract
from .diagrams import _placement_diagram
from .markdown import (
    _cell,
    component_path,
    _count,
    DocsError,
    _first_sentence,
    _HIDE_TOC,
    kind_path,
    _link_references,
    _rel,
    _resolve_links,
    _rst_to_md,
    _table,
)
from .params import _default_norm, EXAMPLE_CONTEXT, formula, param_info, ParamInfo
from .schema import field_rows, _field_table
from .usage import python_usage, schema_block, source_location, usage_section


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


def _cap_value(value: Any) -> str:
    """A capability value for a table cell: a mapping as one ``key: value`` code span per line (a tensor-parallel
    plan would otherwise be one unbreakable line wider than the page), anything else as compact JSON."""
    if isinstance(value, Mapping) and value:
        return "<br>".join(_cell(f"`{k}: {json.dumps(v, default=str)}`".replace('"', "")) for k, v in value.items())
    if isinstance(value, (list, tuple)) and value:
        return "<br>".join(_cell(f"`{json.dumps(v, default=str)}`") for v in value)
    return _cell("`" + json.dumps(value, default=str).replace("`", "'") + "`")


@dataclass
class ComponentDoc:
    """Everything one component page shows (computed once, used by its page and the index tables)."""

    entry: Any
    example: dict
    validated: dict
    params: ParamInfo
    diagram: Optional[str]
    figures: Optional[Figures] = None


def validate_examples(registry) -> dict[tuple[str, str], tuple[dict, Any]]:
    """``{(kind, type): (example, validated config)}`` for every component.

    Raises:
        DocsError: one or more examples do not validate (each named with its plugin and the errors).
    """
    from modkit.core.errors import SpecError
    from ..spec import load_component

    out, problems = {}, []
    for entry in registry.components():
        example = entry.example_config()
        try:
            cfg = load_component(entry.kind, example, registry=registry)
        except SpecError as exc:
            errs = "; ".join(f"{p}: {m}" if p else m for p, m in exc.errors)
            problems.append(
                f"{entry.kind}/{entry.type} ({entry.provider}): example {json.dumps(example)} is invalid: {errs}"
            )
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
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS
    from ..train.optim import KIND as OPTIMIZER_KIND
    from ..train.trackers import KIND as TRACKER_KIND

    examples = validate_examples(registry)
    norm = _default_norm(registry)
    docs = []
    for entry in registry.components():
        example, cfg = examples[entry.key]
        params = param_info(entry, cfg, registry)
        diagram = _placement_diagram(entry, cfg, registry) if entry.kind == "placement" else None
        outside = entry.kind in (*SAMPLING_KINDS, OPTIMIZER_KIND, TRACKER_KIND)  # not part of a model
        figures = None if outside else component_figures(entry, cfg, registry, norm)
        docs.append(ComponentDoc(entry, example, cfg.model_dump(mode="json"), params, diagram, figures))
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
        return (
            "None: a sampling step works on the logits during generation ([`modkit.inference.sampling`]"
            "({to:reference/api/modkit.inference.sampling.md})), outside the model."
        )
    if info.how == "optimizer":
        return (
            "None: an optimizer updates a model's parameters during training, grouped by the roles their "
            "components declare (`modkit.core.roles`); a training config names it in its `optimizer` field."
        )
    if info.how == "tracker":
        return (
            "None: a tracker logs a training run ([`modkit.train.trackers`]({to:reference/api/modkit.train.trackers.md})); "
            "a training config lists it in its `trackers` field (`modkit train --tracker TYPE[:VALUE]`)."
        )
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
            lines.append(
                f"!!! warning\n    The entry's analytic `param_count` gives {_count(info.declared)}, the built module has {_count(info.count)}."
            )
    elif entry.param_count is None:
        lines.append("The entry declares no analytic `param_count`; the figure comes from the built module.")
    return "\n".join(lines).rstrip()


def component_page(
    doc: ComponentDoc,
    registry,
    contracts: Mapping[str, str],
    places: Mapping[str, list[str]],
    *,
    uses: Optional[list] = None,
    base: Any = None,
    root: Any = None,
    repo_url: Optional[str] = None,
) -> str:
    """Markdown of one component's page.

    Args:
        doc: the component's computed facts.
        registry: the registry it comes from.
        contracts: :func:`~modkit.docs.contracts.kind_contracts`.
        places: :func:`~modkit.docs.contracts.slot_places`.
        uses: ``[(gallery card, spec paths)]`` of the models that use it (:func:`~modkit.docs.usage.gallery_usage`).
        base: the gallery card whose spec the Python snippet starts from; no snippet when ``None``.
        root: the repository root (source paths are shown relative to it).
        repo_url: links source paths into this repository when given.
    """
    from modkit.core.config import SLOT_KEY  # noqa: F401 - documents where slot markers come from
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    entry = doc.entry
    page = component_path(entry.kind, entry.type)

    def link_kind(kind: str) -> str:
        return f"[`{kind}`]({_rel(page, kind_path(kind))})" if kind in registry.kinds() else f"`{kind}`"

    facts = _facts(entry, link_kind, places, root, repo_url)
    parts = [
        f"# {entry.type}",
        "",
        f"*{entry.kind} component* · {_caps_inline(entry)}" if entry.capabilities else f"*{entry.kind} component*",
        "",
        _link_references(_rst_to_md(" ".join(entry.description.split()))),
        "",
        _table(("property", "value"), facts),
        "",
    ]
    parts += _shapes_section(entry, contracts, places, page)
    if entry.math.strip():
        parts += ["", "## Math", "", entry.math.strip()]
    schema = entry.config.model_json_schema()
    parts += ["", "## Fields", "", _field_table(field_rows(schema, link_kind=link_kind)), "", schema_block(entry), ""]
    parts += _capabilities_section(entry)
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
    parts += _example_section(doc, registry, base)
    if entry.kind not in SAMPLING_KINDS:
        parts += ["## Used in the gallery", "", usage_section(entry, uses or [], page), ""]
    return _resolve_links("\n".join(parts), page)


def _facts(entry, link_kind, places: Mapping[str, list[str]], root: Any, repo_url: Optional[str]) -> list[tuple]:
    """The ``(property, value)`` rows of a component page's first table: kind, type, plugin, config class, source,
    aliases, reference and where it goes (a spec slot, or the sampling list)."""
    from modkit.core.registry import config_tags
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    others = [t for t in config_tags(entry.config) if t != entry.type]
    cfg_cls = f"{entry.config.__module__}.{entry.config.__qualname__}"
    also = f" (the same config also serves {', '.join(f'`{t}`' for t in others)})" if others else ""
    aliases = ", ".join(f"`{a}`" for a in entry.aliases) + f" (other names of `{entry.type}`, stored as `{entry.type}`)"
    argument = entry.capabilities.get("argument")
    goes_in = (
        ("goes in a spec at", ", ".join(places.get(entry.kind, [])) or "(no slot)")
        if entry.kind not in SAMPLING_KINDS
        else (
            "goes in",
            "the `sampling` list of `modkit.inference.generate.generate` (`modkit generate --sampling`)"
            + (f", or its keyword `{argument['name']}`" if isinstance(argument, dict) else ""),
        )
    )
    return [
        ("kind", link_kind(entry.kind)),
        ("type", f"`{entry.type}`" + also),
        ("plugin", _provider(entry)),
        ("config class", f"`{cfg_cls}` (fields and [JSON Schema](#fields) below)"),
        ("source", source_location(entry.config, root, repo_url)),
        *([("aliases", aliases)] if entry.aliases else []),
        ("reference", _link_references(_cell(entry.reference)) if entry.reference else "(none given)"),
        goes_in,
    ]


def _shapes_section(entry, contracts: Mapping[str, str], places: Mapping[str, list[str]], page: str) -> list[str]:
    """The ``## Shapes`` section: the kind's contract, what the component acts on, its grouped form, alias notes."""
    parts = ["## Shapes", ""]
    parts.append(f"Contract of every `{entry.kind}`: " + kind_contract(entry.kind, contracts, places, page))
    acts = entry.capabilities.get("acts_on")
    if acts is not None:
        parts += ["", f"**Acts on `{acts}`**: {acts_on_text(acts)}"]
    if entry.grouped_factory is not None:
        parts += [
            "",
            "**Grouped form**: usable as mixture-of-experts experts (its `grouped_factory` builds `n` "
            "copies with stacked weights, run by one grouped GEMM per projection).",
        ]
    for alias, note in entry.alias_notes.items():
        parts += ["", f'!!! note "Alias `{alias}`"', "", textwrap.indent(_link_references(_cell(note)), "    ")]
    return parts


def _capabilities_section(entry) -> list[str]:
    """The ``## Capabilities`` section: one row per declared capability with its meaning."""
    from modkit.core.registry import KNOWN_CAPABILITIES

    parts = ["## Capabilities", ""]
    if entry.capabilities:
        rows = []
        for k, v in sorted(entry.capabilities.items()):
            rows.append((f"`{k}`", _cap_value(v), _cell(KNOWN_CAPABILITIES.get(k, "(declared by the plugin)"))))
        parts.append(_table(("capability", "value", "meaning"), rows))
    else:
        parts.append("None declared.")
    return parts


def _example_section(doc: ComponentDoc, registry, base: Any) -> list[str]:
    """The ``## Example`` section: the example config as JSON (and, with a ``base`` gallery card, a Python tab that
    uses it in that spec), the config with every default filled in, and the ``modkit show`` command."""
    from modkit.inference.sampling import KINDS as SAMPLING_KINDS

    entry = doc.entry
    fragment = json.dumps([doc.example] if entry.kind in SAMPLING_KINDS else {entry.kind: doc.example}, indent=2)
    snippet = python_usage(entry, doc.example, registry, base)
    validated = f"Validated with `modkit.load_component({entry.kind!r}, ...)` when the site was built"
    parts = ["## Example", ""]
    if snippet is None:
        parts += [validated + ":", "", "```json", fragment, "```", ""]
    else:
        parts += [
            validated + f"; the Python tab uses it in `{base.source}` (run from the repository root; the tests run "
            "every such snippet):",
            "",
            '=== "JSON"',
            "",
            textwrap.indent("```json\n" + fragment + "\n```", "    "),
            "",
            '=== "Python"',
            "",
            textwrap.indent("```python\n" + snippet + "\n```", "    "),
            "",
        ]
    parts += [
        '??? note "The same config with every default filled in"',
        "",
        textwrap.indent("```json\n" + json.dumps(doc.validated, indent=2) + "\n```", "    "),
        "",
        f"On the command line: `modkit show {entry.kind} {entry.type}`.",
        "",
    ]
    return parts


def kind_index_page(
    kind: str, docs: list[ComponentDoc], registry, contracts: Mapping[str, str], places: Mapping[str, list[str]]
) -> str:
    """Markdown of a kind's index page."""
    page = kind_path(kind)
    mine = [d for d in docs if d.entry.kind == kind]
    parts = [_HIDE_TOC, f"# {kind}", "", "## Contract", "", kind_contract(kind, contracts, places, page), ""]
    if places.get(kind):
        parts += ["Goes in a spec at " + ", ".join(places[kind]) + ".", ""]
    parts += ["## Components", ""]
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
        parts += [
            "**Aliases** (other names a spec may use; stored under the type): "
            + ", ".join(f"`{a}` → [`{t}`]({_rel(page, component_path(kind, t))})" for a, t in aliases.items())
            + ".",
            "",
        ]
    comparison = comparison_section(kind, docs, page)
    if comparison:
        parts += [comparison, ""]
    diagrams = [d for d in mine if d.diagram]
    if diagrams:
        parts += [
            "## Side by side",
            "",
            "Each block as traced from the module the placement builds; `+` is a residual add.",
            "",
        ]
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
        rows.append(
            (
                f"[`{kind}`]({_rel(page, kind_path(kind))})",
                n,
                _cell(contracts.get(kind, "see each component's description")),
            )
        )
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
    lines = ["* [Components overview](index.md)"]
    for kind in registry.kinds():
        lines.append(f"* [{kind}]({kind}/index.md)")
        for d in docs:
            if d.entry.kind == kind:
                lines.append(f"    * [{d.entry.type}]({kind}/{d.entry.type}.md)")
    return "\n".join(lines) + "\n"
