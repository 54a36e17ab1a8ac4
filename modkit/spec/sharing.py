"""Cross-field checks of sharing across layers (spec ``share`` and ``kv_sharing``; :mod:`modkit.nn.sharing` builds
them): layers that exist, a block's uses with the same components, a cache source before its readers, readers and
sources whose mixers declare the ``kv_share`` capability and whose keys and values have the same sizes. Each
problem is a ``(JSON path, message)`` pair naming the field and the value.
"""

from __future__ import annotations

from typing import Any

from modkit.core.registry import Registry
from modkit.spec.models import LayerRange, ModelSpec

_SLOTS = (
    ("attention", "mixer"),
    ("ffn", "ffn"),
    ("norm", "norm"),
    ("placement", "placement"),
    ("position", "position"),
)
#: the key/value sizes a reader and its source must agree on: (label, config attribute or method of d_model)
_KV_SIZES = (
    ("n_kv_heads", "kv_heads"),
    ("head_dim", "resolved_head_dim"),
    ("v_head_dim", "value_width"),
    ("sliding_window", "sliding_window"),
    ("attention_chunk_size", "attention_chunk_size"),
    ("causal", "causal"),
)


def _selection_errors(layers: Any, where: str, n_layers: int) -> list[tuple[str, str]]:
    """Layers a selection names that the model does not have."""
    if isinstance(layers, LayerRange):
        if layers.start >= n_layers:
            return [(f"{where}.start", f"start = {layers.start} selects no layer; n_layers = {n_layers}")]
        return []
    return [
        (f"{where}[{j}]", f"layer {idx} out of range; n_layers = {n_layers}")
        for j, idx in enumerate(layers)
        if not 0 <= idx < n_layers
    ]


def _share_errors(spec: ModelSpec) -> list[tuple[str, str]]:
    """``share``: at least two layers per group, each layer in one group, and every use with its owner's components."""
    errors, owner_of = [], {}
    for i, group in enumerate(spec.share):
        where = f"share[{i}].layers"
        bad = _selection_errors(group.layers, where, spec.n_layers)
        if bad:
            errors += bad
            continue
        layers = group.indices(spec.n_layers)
        if len(layers) < 2:
            errors.append((where, f"selects {layers}: a shared block needs at least two layers"))
            continue
        for layer in layers:
            if layer in owner_of:
                errors.append((where, f"layer {layer} is already in share[{owner_of[layer]}]; a layer runs one block"))
            owner_of[layer] = i
        errors += _fuse_errors(group.adapter, i)
        first = spec.layer(layers[0])
        for layer in layers[1:]:
            this = spec.layer(layer)
            for slot, label in _SLOTS:
                mine, theirs = getattr(this, slot), getattr(first, slot)
                if (mine is None) != (theirs is None) or (mine is not None and mine != theirs):
                    errors.append(
                        (
                            where,
                            f"layer {layer}'s {label} {_show(mine)} differs from layer {layers[0]}'s {_show(theirs)} "
                            "(the owner of the shared block); the layers of one block have the same components: "
                            "change the overrides or the layers listed",
                        )
                    )
                    break
    return errors


def _fuse_errors(adapter: Any, i: int) -> list[tuple[str, str]]:
    """``adapter.fuse``: every fused layer among the targets (when the targets are listed), in one group only."""
    if adapter is None or not adapter.fuse:
        return []
    errors, seen = [], set()
    for j, group in enumerate(adapter.fuse):
        where = f"share[{i}].adapter.fuse[{j}]"
        missing = [n for n in group if adapter.targets is not None and n not in adapter.targets]
        if missing:
            errors.append((where, f"{missing} are not among the targets {adapter.targets}; add them to 'targets'"))
        again = [n for n in group if n in seen]
        if again or len(set(group)) != len(group):
            errors.append((where, f"{again or group} named twice; a layer shares one A with one group"))
        seen.update(group)
    return errors


def _show(cfg: Any) -> str:
    return "null" if cfg is None else cfg.model_dump_json(exclude_defaults=True)


def _kv_sizes(cfg: Any, d_model: int) -> dict[str, Any]:
    """The key/value sizes of an attention config that it exposes (:data:`_KV_SIZES`)."""
    out = {}
    for label, attr in _KV_SIZES:
        value = getattr(cfg, attr, None)
        out[label] = value(d_model) if callable(value) else value
    return out


def _kv_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """``kv_sharing``: a source before its readers and not itself a reader, each reader in one group and not in a
    shared block, both mixers declaring ``kv_share``, the same key/value sizes and position scheme."""
    errors: list[tuple[str, str]] = []
    reader_of: dict[int, int] = {}
    groups = []
    for i, group in enumerate(spec.kv_sharing):
        bad = _selection_errors(group.layers, f"kv_sharing[{i}].layers", spec.n_layers)
        if not group.source < spec.n_layers:
            bad.append((f"kv_sharing[{i}].source", f"layer {group.source} out of range; n_layers = {spec.n_layers}"))
        errors += bad
        if not bad:
            groups.append((i, group, group.indices(spec.n_layers)))
            for layer in groups[-1][2]:
                if layer in reader_of:
                    errors.append(
                        (f"kv_sharing[{i}].layers", f"layer {layer} already reads in kv_sharing[{reader_of[layer]}]")
                    )
                reader_of[layer] = i
    shared = {layer for g in spec.share for layer in g.indices(spec.n_layers)}
    able = sorted({e.type for e in registry.components("attention") if e.capabilities.get("kv_share")})
    for i, group, layers in groups:
        src = group.source
        late = [layer for layer in layers if layer <= src]
        if late:
            errors.append(
                (
                    f"kv_sharing[{i}].source",
                    f"source = {src} is not before the reading layers {late}; a layer reads the keys and values of "
                    "an earlier layer (one that runs first)",
                )
            )
            continue
        if src in reader_of:
            who = spec.kv_sharing[reader_of[src]].source
            errors.append(
                (
                    f"kv_sharing[{i}].source",
                    f"layer {src} itself reads layer {who}'s keys and values (kv_sharing[{reader_of[src]}]); name "
                    f"source {who}",
                )
            )
            continue
        errors += _reader_errors(spec, registry, i, src, layers, shared, able)
    return errors


# size: one reader check per reason, each naming the field; the arguments are the group and what all groups share
def _reader_errors(
    spec: ModelSpec, registry: Registry, i: int, src: int, layers: list, shared: set, able: list
) -> list[tuple[str, str]]:
    """The errors of one ``kv_sharing`` group's readers against their source ``src``."""
    where = f"kv_sharing[{i}].layers"
    source = spec.layer(src)
    for layer, cfg in [(src, source.attention)] + [(r, spec.layer(r).attention) for r in layers]:
        entry = registry.entry_for_config(cfg)
        if not entry.capabilities.get("kv_share"):
            field = f"kv_sharing[{i}].source" if layer == src else where
            return [
                (
                    field,
                    f"layer {layer}'s mixer type {entry.type!r} ({entry.provider}) does not declare the 'kv_share' "
                    f"capability: it cannot share its keys and values with another layer; types that do: "
                    f"{', '.join(able) or 'none installed'}",
                )
            ]
    errors = []
    want = _kv_sizes(source.attention, spec.d_model)
    for layer in layers:
        if layer in shared:
            errors.append(
                (where, f"layer {layer} is in a shared block (spec 'share'); it cannot also read layer {src}'s cache")
            )
            continue
        this = spec.layer(layer)
        got = _kv_sizes(this.attention, spec.d_model)
        diff = [f"{k} {got[k]} vs {want[k]}" for k in want if got[k] != want[k]]
        if diff:
            errors.append(
                (
                    where,
                    f"layer {layer} reads layer {src}'s keys and values, but their sizes differ ({', '.join(diff)}); "
                    "give the reader the source's key/value heads, head widths, window and mask",
                )
            )
        elif this.position != source.position:
            errors.append(
                (
                    where,
                    f"layer {layer}'s position {_show(this.position)} differs from layer {src}'s {_show(source.position)}, "
                    "whose keys it reads (already rotated by its scheme); give both the same position scheme",
                )
            )
    return errors


def sharing_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """Every problem of the spec's ``share`` and ``kv_sharing`` (empty for a spec without sharing)."""
    if not (getattr(spec, "share", None) or getattr(spec, "kv_sharing", None)):
        return []
    return _share_errors(spec) + _kv_errors(spec, registry)
