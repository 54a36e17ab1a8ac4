"""Cross-field (semantic) checks of a spec that passed the schema: what one field alone cannot tell.

Each component config's ``check(ctx)`` with the model-wide sizes (:class:`~modkit.spec.models.SpecContext`; a
position scheme once per attention geometry it serves), dropout probabilities against the components that apply
them, position schemes against the geometry of their layers (:mod:`modkit.spec.geometry`), override ranges
against ``n_layers``. Each problem is a ``(JSON path, message)`` pair.
"""

from __future__ import annotations

from typing import Any, Iterable

from modkit.core.config import ComponentConfig
from modkit.core.registry import Registry
from modkit.core.validation import extend_path
from modkit.spec.geometry import _geometry_errors, _head_geometry, _position_uses
from modkit.spec.sharing import sharing_errors
from modkit.spec.models import LayerOverride, ModelSpec, SpecContext, slot_path


def _within(cfg: Any) -> Iterable[ComponentConfig]:
    """``cfg`` and every component config nested in it (slots, lists of slots), depth first."""
    if isinstance(cfg, ComponentConfig):
        yield cfg
        for name in type(cfg).model_fields:
            value = getattr(cfg, name)
            for item in value if isinstance(value, (list, tuple)) else (value,):
                yield from _within(item)


def _dropout_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """A non-zero dropout needs every component that applies it to declare the capability (else it is ignored).

    ``dropout.attention`` is checked on the attentions (kind ``attention``) of the layers' token mixers, nested ones
    included (an attention beside a recurrent mixer); a recurrent mixer has no attention probabilities to drop, so it
    is not asked for the capability, but a spec with no attention at all is refused (the dropout would apply nowhere).
    """
    errors: list[tuple[str, str]] = []
    applied = (("attention", "attention", "attention_dropout"), ("residual", "placement", "residual_dropout"))
    for field_name, kind, capability in applied:
        p = getattr(spec.dropout, field_name)
        if p == 0:
            continue
        configs = [getattr(spec.block, kind)]
        configs += [getattr(o, kind) for o in spec.overrides if getattr(o, kind) is not None]
        checked = []
        for cfg in configs:
            if cfg is None:  # a component that failed the schema (see _valid_parts_errors)
                continue
            if kind == "attention":  # the attentions among the token mixers (recurrent mixers hold no probabilities)
                inner = [c for c in _within(cfg) if registry.entry_for_config(c).kind == "attention"]
                checked += inner
                continue
            checked.append(cfg)
        if kind == "attention" and not checked and any(c is not None for c in configs):
            errors.append(
                (
                    f"dropout.{field_name}",
                    f"dropout.{field_name} = {p} drops attention probabilities, but "
                    "no layer's token mixer holds an attention; set it to 0",
                )
            )
            continue
        for cfg in checked:
            entry = registry.entry_for_config(cfg, kind)
            if not entry.capabilities.get(capability):
                errors.append(
                    (
                        f"dropout.{field_name}",
                        f"{kind} type {entry.type!r} ({entry.provider}) does not declare the {capability!r} "
                        f"capability, so dropout.{field_name} = {p} would be ignored; set it to 0 or use a {kind} "
                        "that applies it",
                    )
                )
                break
    return errors


def _semantic_errors(spec: ModelSpec, registry: Registry, *, geometry: bool = True) -> list[tuple[str, str]]:
    """Cross-field errors of a spec: component configs' ``check(ctx)``, dropout capabilities, override ranges.

    Components that are ``None`` are skipped. ``geometry=False`` checks position schemes without the attention
    geometry of the layers they serve (``n_heads`` / ``head_dim`` unknown), for a spec whose attention configs did not
    all validate.
    """
    sizes = (spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len)
    ctx = SpecContext(*sizes, registry)
    errors: list[tuple[str, str]] = []

    def visit(cfg: Any, path: str, at: SpecContext = ctx) -> None:
        if not isinstance(cfg, ComponentConfig):
            return
        check = getattr(cfg, "check", None)
        if callable(check):
            for sub, msg in check(at) or ():
                errors.append((extend_path(path, sub), msg))
        for name in type(cfg).model_fields:
            value = getattr(cfg, name)
            if isinstance(value, (list, tuple)):  # a list of slots (the mixers of a parallel hybrid)
                for k, item in enumerate(value):
                    visit(item, f"{path}.{name}[{k}]", at)
            else:
                visit(value, f"{path}.{name}", at)

    errors.extend(_dropout_errors(spec, registry))
    errors.extend(_geometry_errors(spec, registry) if geometry else [])
    if geometry:
        for path, position, shape in _position_uses(spec, registry):
            visit(position, path, SpecContext(*sizes, registry, *shape))
    else:
        visit(spec.position, "position")
        for i, o in enumerate(spec.overrides):
            visit(o.position, f"overrides[{i}].position")
    for slot in ("attention", "ffn", "norm", "placement"):
        visit(getattr(spec.block, slot), f"block.{slot_path(spec.block, slot)}")
    for name in ("embedding_norm", "final_norm", "stream"):
        visit(getattr(spec, name), name)
    errors.extend(_stream_errors(spec, registry))
    errors.extend(_placement_layer_errors(spec, ctx))
    errors.extend(_nested_geometry_errors(spec, ctx))
    errors.extend(sharing_errors(spec, registry))
    for i, o in enumerate(spec.overrides):
        errors.extend(_layer_selection_errors(o, f"overrides[{i}]", spec.n_layers))
        for slot in ("attention", "ffn", "norm", "placement"):
            visit(getattr(o, slot), f"overrides[{i}].{slot_path(o, slot)}")
        if o.position is not None:
            acts = registry.entry_for_config(o.position, "position").capabilities.get("acts_on")
            if acts == "embedding":
                errors.append(
                    (
                        f"overrides[{i}].position",
                        f"position type {o.position.type!r} acts on the input embeddings, so it cannot differ per "
                        "layer; set it in the top-level 'position' instead",
                    )
                )
    return errors


def _stream_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """A wide residual stream (spec ``stream``) needs every layer's placement to declare the ``streams`` capability
    (it reads the block input from the stream and writes its output back through the stream's connections); and
    multi-token prediction reads a one-copy stream. One error per placement type that does not, naming its layers.
    A stream whose entry declares ``scope: "block"`` (read before and written after each block, Gemma 3n's AltUp)
    needs the ``block_streams`` capability instead (every built-in placement)."""
    if spec.stream is None:
        return []
    errors, refused = [], {}
    block_scope = registry.entry_for_config(spec.stream, "stream").capabilities.get("scope") == "block"
    need = "block_streams" if block_scope else "streams"
    for i in range(spec.n_layers):
        placement = spec.layer(i).placement
        if not registry.entry_for_config(placement, "placement").capabilities.get(need):
            refused.setdefault(placement.type, []).append(i)
    able = sorted(e.type for e in registry.components("placement") if e.capabilities.get(need))
    what = "each block" if block_scope else "each sublayer"
    for kind, layers in refused.items():
        errors.append(
            (
                "stream",
                f"stream {spec.stream.type!r} carries several copies of the residual stream, but placement {kind!r} "
                f"(layers {_ranges(layers)}) does not declare the {need!r} capability (reading and writing the copies "
                f"around {what}); use a placement that does: {', '.join(able) or 'none installed'}",
            )
        )
    if spec.mtp is not None:
        errors.append(
            ("mtp", "multi-token prediction reads a one-copy residual stream: not with a 'stream'; drop one of them")
        )
    return errors


def _placement_layer_errors(spec: ModelSpec, ctx: SpecContext) -> list[tuple[str, str]]:
    """What a placement says about the layer it composes: its config's optional ``check_layer(layer, ctx) ->
    [(field, message)]``, given the layer's effective components (:class:`~modkit.spec.models.LayerSpec`): a
    placement holding sublayers of its own may need the block's mixer to have a given geometry (``shortcut-moe``).
    One error per field and message, at the block's or the override's placement, naming its layers."""
    found: dict[tuple[str, str], list[int]] = {}
    for i in range(spec.n_layers):
        ls = spec.layer(i)
        check_layer = getattr(ls.placement, "check_layer", None)
        if not callable(check_layer):
            continue
        where = next(
            (
                f"overrides[{j}].placement"
                for j, o in reversed(list(enumerate(spec.overrides)))
                if o.placement is ls.placement
            ),
            "block.placement",
        )
        for sub, msg in check_layer(ls, ctx) or ():
            found.setdefault((extend_path(where, sub), msg), []).append(i)
    return [(path, f"layers {_ranges(layers)}: {msg}") for (path, msg), layers in found.items()]


def _nested_mixers(cfg: Any, path: str, registry: Registry) -> Iterable[tuple[str, Any]]:
    """``(JSON path, config)`` of every token mixer (kind ``attention`` or ``mixer``) held in the slots of ``cfg``,
    lists of slots included, depth first."""
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        items = enumerate(value) if isinstance(value, (list, tuple)) else [(None, value)]
        for k, item in items:
            if not isinstance(item, ComponentConfig):
                continue
            where = f"{path}.{name}" + ("" if k is None else f"[{k}]")
            if registry.entry_for_config(item).kind in ("attention", "mixer"):
                yield where, item
            yield from _nested_mixers(item, where, registry)


def _nested_geometry_errors(spec: ModelSpec, ctx: SpecContext) -> list[tuple[str, str]]:
    """A layer's mixer that holds token mixers of its own (``side_input``'s side and main mixers, a ``parallel``
    hybrid's) hands each the layer's one position scheme, built for the geometry the outer mixer declares (the first
    inner mixer that has one). Where that scheme turns queries and keys (``acts_on: qk``, RoPE), every inner mixer
    that declares a ``head_dim`` must declare the same: a narrower head failed in the first forward with a shape
    error, a wider one had only its leading features turned, at another width's frequencies. (A scheme on the scores
    takes each call's head count: ALiBi.) One error per inner mixer and message, naming its layers."""
    found: dict[tuple[str, str], list[int]] = {}
    for i in range(ctx.n_layers):
        ls = spec.layer(i)
        if ls.position is None or ls.attention is None:
            continue
        if ctx.registry.entry_for_config(ls.position, "position").capabilities.get("acts_on") != "qk":
            continue
        inner = list(_nested_mixers(ls.attention, "", ctx.registry))
        width = _head_geometry(ls.attention, ctx)[1] if inner else None  # what the scheme is built for
        if width is None:
            continue
        where = next(
            (
                f"overrides[{j}].{slot_path(o, 'attention')}"
                for j, o in reversed(list(enumerate(spec.overrides)))
                if o.attention is ls.attention
            ),
            f"block.{slot_path(spec.block, 'attention')}",
        )
        for sub, cfg in inner:
            head_dim = _head_geometry(cfg, ctx)[1]
            if head_dim is None or head_dim == width:
                continue
            msg = (
                f"{cfg.type!r} turns heads of head_dim = {head_dim} by the layer's position {ls.position.type!r}, "
                f"which is built for head_dim = {width} (the first mixer of the {ls.attention.type!r} that "
                "declares one): one scheme serves every mixer of the layer; give its attentions the same rotated "
                "head width, or use position 'none'"
            )
            found.setdefault((where + sub, msg), []).append(i)
    return [(path, f"layers {_ranges(layers)}: {msg}") for (path, msg), layers in found.items()]


def _ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``"0-2, 5"``."""
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _layer_selection_errors(override: LayerOverride, where: str, n_layers: int) -> list[tuple[str, str]]:
    """Layers an override selects that the model does not have (``where`` is the override's JSON path); none for
    a selection that failed the schema (``layers`` is ``None``)."""
    layers = override.layers
    if layers is None:
        return []
    if isinstance(layers, list):
        return [
            (f"{where}.layers[{j}]", f"layer {idx} out of range; n_layers = {n_layers}")
            for j, idx in enumerate(layers)
            if not 0 <= idx < n_layers
        ]
    if layers.start >= n_layers:
        return [(f"{where}.layers.start", f"start = {layers.start} selects no layer; n_layers = {n_layers}")]
    return []
