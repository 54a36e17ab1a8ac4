"""The ``gallery/`` section: one model card per spec (parameters, active parameters, weight and KV-cache bytes,
architecture diagrams, components used), built on ``meta``, and the gallery index."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from modkit.core.config import is_mixer
from .diagrams import _model_diagram
from .markdown import (
    _bytes,
    _cell,
    component_path,
    _count,
    gallery_path,
    _HIDE_TOC,
    _layer_ranges,
    _rel,
    _short,
    _table,
)


#: Context length of the "KV cache for a long context" figure of the gallery.
LONG_CONTEXT = 8192


#: Weight / KV-cache dtypes of the gallery: (label, the torch dtype that prices cache entries, bytes per weight). Names,
#: not torch objects: the CLI's help and the docs build import this module without torch.
DTYPES = (("fp32", "float32", 4), ("bf16", "bfloat16", 2), ("int8 / fp8", "float8_e4m3fn", 1))


@dataclass
class SpecCard:
    """What the gallery shows for one spec."""

    stem: str
    source: str
    spec: Any
    params: dict
    active: int
    kv_bytes: dict
    kv_elements_per_token: int
    windowed: bool
    components: list[dict]
    diagram: str
    layer_groups: list[tuple[str, str]]
    attention: dict


def _kv_bytes(model, context: int) -> tuple[dict[str, tuple[int, int, int]], int, bool]:
    """``({dtype label: (bytes per token, bytes for context tokens, bytes at max_seq_len)}, elements per token, any
    sliding window)`` of batch 1, from what each layer's token mixers declare (:meth:`modkit.Model.cache_layout`,
    :class:`~modkit.CacheSpec`): windows cap the long figures, fixed-size state counts once, and an entry that
    declares its own dtype (a recurrent mixer's float32 state, a float32 indexer key) keeps it in every row."""
    specs = [spec for layer in model.cache_layout() for spec in layer.values()]
    elements = sum(e.numel for spec in specs for e in spec.token_entries)
    windowed = any(spec.window is not None and spec.window < context for spec in specs)
    out = {}
    for label, dtype, _ in DTYPES:
        per_token = sum(spec.bytes_per_token(dtype) for spec in specs)
        at = [sum(spec.nbytes(n, 1, dtype) for spec in specs) for n in (context, model.spec.max_seq_len)]
        out[label] = (per_token, *at)
    return out, elements, windowed


def spec_card(path: Path, registry, root: Optional[Path] = None) -> SpecCard:
    """Load, validate and build (on meta) one spec; compute its gallery figures."""
    from modkit.nn.build import active_params_per_token, breakdown, build, summarize
    from ..spec import load_spec

    spec = load_spec(path, registry=registry)
    model = build(spec, device="meta", registry=registry)
    params = breakdown(model)
    active = active_params_per_token(model)
    kv_bytes, per_token, windowed = _kv_bytes(model, LONG_CONTEXT)
    summary = summarize(model, "bfloat16", registry=registry)
    diagram, groups = _model_diagram(model, registry)
    attention = {}
    for m in model.layers[0].modules():  # a token mixer with heads exposes its geometry (the first that has it)
        if is_mixer(getattr(m, "modkit_kind", None)) and getattr(m, "n_heads", None) is not None:
            attention = {k: getattr(m, k, None) for k in ("n_heads", "n_kv_heads", "head_dim")}
            break
    try:
        source = str(path.resolve().relative_to(root.resolve())) if root else path.name
    except ValueError:
        source = str(path)
    return SpecCard(
        path.stem,
        source,
        spec,
        params,
        active,
        kv_bytes,
        per_token,
        windowed,
        summary.components,
        diagram,
        groups,
        attention,
    )


def _spec_shape(spec, attention: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Headline sizes of a spec; the token mixer's geometry (when it is an attention) comes from the built first
    layer. The token-mixing slot is called ``mixer``, as specs write it."""
    layer = spec.layer(0)
    att = layer.attention
    rows = [
        ("vocabulary", _count(spec.vocab_size)),
        ("d_model", _count(spec.d_model)),
        ("layers", str(spec.n_layers)),
        ("max_seq_len", _count(spec.max_seq_len)),
    ]
    for label, obj, names, known in (
        ("mixer (layer 0)", att, ("sliding_window", "attention_chunk_size"), attention),
        ("ffn (layer 0)", layer.ffn, ("d_ff", "n_experts", "top_k", "activation", "act"), {}),
    ):
        if obj is None:  # a block without this sublayer (Mamba-2's blocks have no ffn)
            rows.append((label, "none"))
            continue
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
    """Markdown of one spec's model card: its headline, parameters, memory, architecture diagrams, components,
    per-layer overrides and the spec itself."""
    page = gallery_path(card.stem)
    parts = _card_header(card)
    parts += _parameters_section(card)
    parts += _memory_section(card)
    parts += _architecture_section(card)
    parts += _components_section(card, registry, page)
    parts += _overrides_section(card.spec)
    parts += [
        '??? example "The spec"',
        "",
        textwrap.indent("```json\n" + card.spec.to_json(indent=2) + "\n```", "    "),
        "",
        f"Reproduce this card: `modkit build {card.source} --device meta`.",
        "",
    ]
    return "\n".join(parts)


def _share(n: int, total: int) -> str:
    """``n`` as a percentage of ``total`` with one decimal (``–`` when ``total`` is 0)."""
    return f"{100.0 * n / total:.1f}%" if total else "–"


def _card_header(card: SpecCard) -> list[str]:
    """The title (the spec's file name, what a command line takes; the spec's own name follows when it differs), the
    description, where the spec comes from and the headline sizes."""
    spec = card.spec
    parts = [f"# {card.stem}", ""]
    if spec.name and spec.name != card.stem:
        parts += [f"Spec name: `{spec.name}`.", ""]
    if spec.description:
        parts += [_cell(spec.description), ""]
    meta = ", ".join(f"{k} `{v}`" for k, v in spec.metadata.items()) if spec.metadata else ""
    parts += [
        f"Spec: `{card.source}`"
        + (f" · metadata: {meta}" if meta else "")
        + " · built on `meta` (no memory) when this site was built.",
        "",
    ]
    parts += [_table(("property", "value"), _spec_shape(spec, card.attention)), ""]
    return parts


def _parameters_section(card: SpecCard) -> list[str]:
    """The ``## Parameters`` section: the breakdown by part and the parameters active per token."""
    total = card.params["total"]
    parts = ["## Parameters", ""]
    rows = [(k, _count(v), _share(v, total), _short(v)) for k, v in card.params.items() if k != "total"]
    rows.append(("**total**", f"**{_count(total)}**", "100%", f"**{_short(total)}**"))
    parts += [_table(("part", "parameters", "share", "rounded"), rows, "lrrr"), ""]
    if card.active != total:
        parts += [
            f"**Active per token: {_count(card.active)} ({_short(card.active)}, {_share(card.active, total)} "
            "of the total)**: a sparse layer runs only the experts its router picks.",
            "",
        ]
    else:
        parts += ["Dense: every parameter is active for every token.", ""]
    return parts


def _memory_section(card: SpecCard) -> list[str]:
    """The ``## Memory`` section: weight and KV-cache bytes per dtype of :data:`DTYPES`, and what they count."""
    spec, total = card.spec, card.params["total"]
    rows = []
    for label, _, size in DTYPES:
        per_token, long, at_max = card.kv_bytes[label]
        rows.append((label, _bytes(total * size), _count(per_token), _bytes(long), _bytes(at_max)))
    long_label = f"KV cache, {LONG_CONTEXT // 1024}K context"
    header = (
        "dtype",
        "weights",
        "KV cache bytes / token",
        long_label,
        f"KV cache, max_seq_len {_count(spec.max_seq_len)}",
    )
    parts = ["## Memory", "", _table(header, rows, "lrrrr"), ""]
    notes = [
        f"The cache stores what each layer's token mixers declare (keys and values of n_kv_heads heads for the "
        f"built-in attention): {_count(card.kv_elements_per_token)} elements per token over all layers (batch 1). "
        "A recurrent mixer's fixed-size state counts once per sequence in the two long figures, and an entry that "
        "declares its own dtype (float32 recurrent state) keeps it in every row."
    ]
    if card.windowed:
        notes.append(
            f"Sliding-window layers keep only their window, which the {LONG_CONTEXT // 1024}K figure counts; "
            "the per-token figure is the uncapped rate."
        )
    if LONG_CONTEXT > spec.max_seq_len:
        notes.append(
            f"{LONG_CONTEXT // 1024}K exceeds this model's max_seq_len ({_count(spec.max_seq_len)}); that "
            "figure is for comparison only."
        )
    parts += [" ".join(notes), ""]
    return parts


def _architecture_section(card: SpecCard) -> list[str]:
    """The ``## Architecture`` section: the model diagram, then one block diagram per group of identical layers."""
    parts = [
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
        parts += [
            '<div class="mk-diagram" markdown>',
            "",
            f"**Block: {which}**",
            "",
            "```mermaid",
            block,
            "```",
            "",
            "</div>",
            "",
        ]
    parts += ["</div>", ""]
    return parts


def _components_section(card: SpecCard, registry, page: str) -> list[str]:
    """The ``## Components`` section: every component the model uses, its plugin and where the spec uses it."""
    rows = []
    kinds = set(registry.kinds())
    for c in card.components:
        link = (
            f"[`{c['type']}`]({_rel(page, component_path(c['kind'], c['type']))})"
            if c["kind"] in kinds
            else f"`{c['type']}`"
        )
        dist = f" ({c['distribution']} {c.get('version') or ''})".rstrip() if c.get("distribution") else ""
        prov = f"`{c.get('plugin') or ''}`" + dist
        paths = c.get("paths", [])
        where = ", ".join(f"`{p}`" for p in paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
        rows.append((c["kind"], link, prov, where))
    return ["## Components", "", _table(("kind", "type", "plugin", "used at"), rows), ""]


def _overrides_section(spec) -> list[str]:
    """The ``## Per-layer overrides`` section (empty without overrides): the layers and the slots each replaces."""
    if not spec.overrides:
        return []
    rows = []
    for o in spec.overrides:
        replaced = [
            f"{'mixer' if k == 'attention' else k}: `{getattr(o, k).type}`"  # the spec's name of the mixing slot
            for k in ("attention", "ffn", "norm", "placement", "position")
            if getattr(o, k) is not None
        ]
        rows.append((_layer_ranges(o.indices(spec.n_layers)), ", ".join(replaced)))
    return ["## Per-layer overrides", "", _table(("layers", "replaced"), rows), ""]


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
                f"[{c.stem}]({_rel(page, gallery_path(c.stem))})",
                _short(total),
                _short(c.active) if c.active != total else "(dense)",
                s.n_layers,
                _count(s.d_model),
                f"`{layer.attention.type}`",
                f"`{layer.ffn.type}`" if layer.ffn is not None else "none",
                f"`{s.position.type}`",
                f"`{layer.placement.type}`",
                f"`{layer.norm.type}`",
                _count(c.kv_bytes["bf16"][0]),
            )
        )
    parts.append(
        _table(
            (
                "model",
                "params",
                "active",
                "layers",
                "d_model",
                "mixer",
                "ffn",
                "position",
                "placement",
                "norm",
                "KV bytes/token (bf16)",
            ),
            rows,
            "lrrrrllllll" + "r",
        )
    )
    return "\n".join(parts) + "\n"
