"""``reference/hugging-face.md``: the Hugging Face model types the installed converters support, what each converts
to (its spec fields and components, from converting the model type's transformers defaults), whether it also maps
checkpoint weights, which gallery specs came from it, and the converter's own notes.

A model type registered as a declaration (``register(declaration)``) whose ``describe()`` returns its tables is shown
with them: every config key (mapped, ignored or refused, with transformers' default and what it becomes or why),
the fields it fixes, and every checkpoint tensor with its layout; the model type it derives from is linked. A
``supports`` list in the description (the features its tables convert) is shown in a summary table and in the
type's section."""

from __future__ import annotations

import inspect
import json
import sys
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .markdown import _cell, component_path, _count, _first_sentence, gallery_path, _rel, _rst_to_md, _table

HF_PAGE = "reference/hugging-face.md"

#: Spec fields shown for each model type's default conversion.
_SIZES = ("vocab_size", "d_model", "n_layers", "max_seq_len", "tie_embeddings")


def default_conversion(model_type: str, registry) -> tuple[Optional[Any], str]:
    """``(spec, "")`` for the config ``{"model_type": model_type}`` (every other key at transformers' default), or
    ``(None, reason)`` when the converter needs more than the defaults."""
    from modkit.core.errors import ModkitError
    from modkit.io.hf import convert_hf_config

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return convert_hf_config({"model_type": model_type}, registry=registry)[1], ""
    except ModkitError as exc:
        return None, str(exc).splitlines()[0]


def _components(spec, registry) -> list[tuple[str, str, list[str]]]:
    """``[(kind, type, spec paths)]`` of every component config in ``spec``, in spec order."""
    from ..spec import iter_configs

    out: dict[tuple[str, str], list[str]] = {}
    for path, cfg in iter_configs(spec):
        entry = registry.entry_for_config(cfg)
        out.setdefault(entry.key, []).append(path)
    return [(k, t, paths) for (k, t), paths in out.items()]


def describe(conv) -> Optional[dict]:
    """The declaration's ``describe()`` (config rows, fixed fields, weight rows, parent, notes), or ``None``."""
    fn = getattr(getattr(conv, "declaration", None), "describe", None)
    return fn() if callable(fn) else None


def _module_notes(fn: Any) -> str:
    """The docstring of the module defining ``fn`` (a converter), in Markdown; ``""`` when it has none."""
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    return _rst_to_md(inspect.getdoc(module) or "") if module is not None else ""


@dataclass
class _Types:
    """What every section of :data:`HF_PAGE` reads: the registry, each model type's default conversion and tables,
    and the gallery cards converted from each model type."""

    registry: Any
    types: list[str]
    conversions: dict[str, tuple[Optional[Any], str]]  # model type -> default_conversion
    described: dict[str, Optional[dict]]  # model type -> describe
    gallery: dict[str, list[Any]]  # model type -> the gallery cards whose metadata.hf_model_type names it

    @classmethod
    def of(cls, registry, cards: Sequence[Any]) -> "_Types":
        """Convert every model type's defaults and read its tables."""
        types = registry.hf_model_types()
        gallery: dict[str, list[Any]] = {}
        for c in cards:
            t = (c.spec.metadata or {}).get("hf_model_type")
            if t:
                gallery.setdefault(t, []).append(c)
        conversions = {t: default_conversion(t, registry) for t in types}
        described = {t: describe(registry.hf_converter(t)) for t in types}
        return cls(registry, types, conversions, described, gallery)

    def comp(self, kind: str, type_: str) -> str:
        """A component's name, linked to its page when its kind is registered."""
        if kind in set(self.registry.kinds()):
            return f"[`{type_}`]({_rel(HF_PAGE, component_path(kind, type_))})"
        return f"`{type_}`"

    def gallery_links(self, t: str) -> str:
        """Links to the gallery cards converted from model type ``t`` (``–`` when none)."""
        return ", ".join(f"[{c.stem}]({_rel(HF_PAGE, gallery_path(c.stem))})" for c in self.gallery.get(t, [])) or "–"

    def parent_link(self, t: str) -> str:
        """The model type ``t`` derives from, linked to its section when it has one (``–`` when none)."""
        parent = (self.described[t] or {}).get("parent")
        return "–" if not parent else f"[`{parent}`](#{parent})" if parent in self.described else f"`{parent}`"


def hf_models_page(registry, cards: Sequence[Any] = ()) -> str:
    """Markdown of :data:`HF_PAGE` for every model type with a registered converter.

    Args:
        registry: the registry whose converters are listed.
        cards: the gallery's model cards; a spec whose ``metadata.hf_model_type`` names a model type is linked.
    """
    info = _Types.of(registry, cards)
    parts = [
        "# Hugging Face model types",
        "",
        f"The installed converters read the `config.json` of {len(info.types)} Hugging Face model types "
        "(`modkit convert hf CONFIG`, `modkit.from_hf_config`; `modkit convert hf --help` lists the options). "
        "Each row is what the converter makes of the model type's transformers defaults (a `config.json` holding only "
        "`model_type`). A real config changes the sizes and may change a component: fewer key/value heads than heads "
        "give `gqa` or `mqa` in place of `mha`, a sliding window or per-layer types add overrides; each type's notes "
        "say what its converter reads.",
        "",
    ]
    parts += _summary_section(info)
    for t in info.types:
        parts += _type_section(info, t)
    return "\n".join(parts)


def _summary_section(info: _Types) -> list[str]:
    """The table of every model type's default conversion, and the table of what each declared type supports."""
    registry, described = info.registry, info.described
    rows = []
    for t in info.types:
        spec, _ = info.conversions[t]
        if spec is None:
            rows.append((f"[`{t}`](#{t})", "–", "–", "–", "–", "–", "–", info.gallery_links(t)))
            continue
        layer = spec.layer(0)
        weights = "yes" if registry.hf_converter(t).weights is not None else "no"
        rows.append(
            (
                f"[`{t}`](#{t})",
                info.comp(
                    registry.entry_for_config(layer.attention).kind, layer.attention.type
                ),  # an attention or a mixer
                info.comp("ffn", layer.ffn.type) if layer.ffn is not None else "none",
                info.comp("norm", layer.norm.type),
                info.comp("placement", layer.placement.type),
                info.comp("position", spec.position.type),
                weights,
                info.gallery_links(t),
            )
        )
    # the model type each derives from is in its section ("derives from"): as a column it overflowed the page
    header = ("model type", "token mixer", "ffn", "norm", "placement", "position", "weights", "gallery")
    what = (
        "also maps checkpoint tensors (safetensors) both ways, so `modkit convert hf FOLDER` brings the weights "
        "along and `modkit convert modkit --to hf` writes a folder transformers loads."
    )
    if all(row[6] == "yes" for row in rows if row[6] != "–"):  # a column of one value only widens the table
        header = header[:6] + header[7:]
        rows = [row[:6] + row[7:] for row in rows]
        parts = [_table(header, rows), "", "Every converter listed " + what, ""]
    else:
        parts = [_table(header, rows), "", "*weights*: the converter " + what, ""]
    supports = [
        (f"[`{t}`](#{t})", _cell(", ".join(described[t]["supports"])))
        for t in info.types
        if described[t] and described[t].get("supports")
    ]
    if supports:
        parts += [
            "What each declared model type converts, read from its tables (the config keys it maps, the fields "
            "it fixes, the layouts of its checkpoint tensors):",
            "",
            _table(("model type", "supports"), supports),
            "",
        ]
    return parts


def _type_section(info: _Types, t: str) -> list[str]:
    """The ``## <model type>`` section: its first note, its facts, the components of its default conversion, its
    tables (a declared type) and the converter's notes."""
    conv = info.registry.hf_converter(t)
    spec, _ = info.conversions[t]
    tables = info.described[t]
    parts = [f"## {t}", ""]
    notes = _rst_to_md(inspect.cleandoc(tables.get("notes") or "")) if tables else _module_notes(conv.convert)
    if notes:
        parts += [_first_sentence(notes.split("\n\n")[0]), ""]
    parts += [_table(("property", "value"), _type_facts(info, t)), ""]
    if spec is not None:
        rows = [
            (
                f"`{k}`",
                info.comp(k, ty),
                ", ".join(f"`{p}`" for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else ""),
            )
            for k, ty, paths in _components(spec, info.registry)
        ]
        parts += ["Components of the converted spec:", "", _table(("kind", "type", "spec fields"), rows), ""]
    if tables:
        parts += _tables_section(t, tables)
    if notes:
        parts += [f'??? note "What the `{t}` converter reads and how"', "", textwrap.indent(notes, "    "), ""]
    return parts


def _type_facts(info: _Types, t: str) -> list[tuple[str, str]]:
    """The ``(property, value)`` rows of a model type's section: converter, what it supports, its parent, whether
    it maps weights, its gallery cards and the sizes its transformers defaults give (or why they do not convert)."""
    from .usage import source_location

    conv = info.registry.hf_converter(t)
    spec, reason = info.conversions[t]
    tables = info.described[t]
    provider = f"`{conv.provider.plugin}`" if conv.provider else "(unknown)"
    where = sys.modules.get(tables.get("module") or "") if tables else None
    facts = [
        ("converter", provider + ", " + source_location(where if where is not None else conv.convert)),
        ("checkpoint weights", "converted both ways" if conv.weights is not None else "config only"),
        ("gallery", info.gallery_links(t)),
    ]
    if tables and tables.get("supports"):
        facts.insert(1, ("supports", _cell(", ".join(tables["supports"]))))
    if tables and tables.get("parent"):
        facts.insert(
            1, ("derives from", info.parent_link(t) + ": its tables with a few rows changed (shown complete below)")
        )
    if spec is None:
        facts.append(("transformers defaults", _cell(f"do not convert on their own: {reason}")))
    else:
        sizes = ((k, getattr(spec, k)) for k in _SIZES)
        facts.append(
            (
                "defaults give",
                _cell(
                    ", ".join(
                        f"{k} {_count(v) if isinstance(v, int) and not isinstance(v, bool) else v}" for k, v in sizes
                    )
                ),
            )
        )
    return facts


def _tables_section(t: str, tables: dict) -> list[str]:
    """The config table, the fixed fields and the weight table of a declared model type, as Markdown."""
    out = []
    rows = [
        (_cell(key), status, _cell(default), _cell(becomes))
        for key, status, default, becomes in tables.get("config", ())
    ]
    if rows:
        out += [
            f"Config keys of `{t}` (any other key is irrelevant to every model type, or unknown: dropped with a warning, "
            "refused with `--strict`):",
            "",
            _table(("key", "status", "transformers default", "becomes / why"), rows),
            "",
        ]
    fixed = tables.get("fixed") or {}
    if fixed:
        shown = ", ".join(f"`{k}` = `{json.dumps(v)}`" for k, v in sorted(fixed.items()))
        out += [_cell(f"Fixed by the type: {shown}."), ""]

    def names(text: str) -> str:  # a fused row names several tensors: one code span each, so the cell can wrap
        return _cell(", ".join(f"`{n}`" for n in text.split(", ")))

    weights = [(names(ours), names(hf), _cell(how)) for ours, hf, how in tables.get("weights", ())]
    if weights:
        out += [
            f'??? info "Checkpoint tensors of `{t}` ({len(weights)} rows)"',
            "",
            textwrap.indent(_table(("modkit", "Hugging Face", "layout"), weights), "    "),
            "",
        ]
    return out
