"""The per-head geometry a position scheme acts on, and the spec checks that read it.

:func:`position_geometry` is what a layer's attention declares (``n_heads``, ``head_dim``, ``n_kv_heads``): read at
spec time, where each position config is checked against the geometry of the layers it serves, and at build time,
where the scheme is built from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from modkit.core.registry import Registry
from modkit.spec.models import ModelSpec, SpecContext

if TYPE_CHECKING:
    from modkit.core.interfaces import PositionGeometry


def position_geometry(attention: Any, ctx: Any, module: Any = None) -> Optional["PositionGeometry"]:
    """The :class:`~modkit.PositionGeometry` a layer's position scheme acts on, as its attention declares it.

    The attention config's ``position_geometry(ctx)`` method when it has one (the declaration: multi-head latent
    attention rotates only its ``qk_rope_head_dim`` part); otherwise its ``n_heads`` and ``resolved_head_dim(d_model)``
    (or ``head_dim``) fields, key heads from ``kv_heads`` / ``n_kv_heads``; otherwise, at build time, the built
    module's ``n_heads`` / ``head_dim`` / ``n_kv_heads`` attributes. ``None`` when nothing tells.

    Used at spec time (each position config is checked against the geometry it serves) and by ``build`` (the
    scheme is built from it), so a spec that validates builds the scheme it was checked with.

    Args:
        attention: the layer's attention config. ctx: a :class:`SpecContext` or :class:`~modkit.BuildContext`
            (both carry ``d_model``). module: the built attention module (build time), or ``None``.

    Raises:
        TypeError: a ``position_geometry`` that returns something else than a ``PositionGeometry``.
    """
    from modkit.core.interfaces import PositionGeometry

    declare = getattr(attention, "position_geometry", None)
    if callable(declare):
        geo = declare(ctx)
        if geo is not None and not isinstance(geo, PositionGeometry):
            raise TypeError(
                f"{type(attention).__name__}.position_geometry() returned {type(geo).__name__}, "
                "not a modkit.PositionGeometry"
            )
        return geo

    def ints(*values: Any) -> Optional[int]:
        return next((v for v in values if isinstance(v, int) and not isinstance(v, bool)), None)

    resolve = getattr(attention, "resolved_head_dim", None)
    try:
        head_dim = resolve(ctx.d_model) if callable(resolve) else getattr(attention, "head_dim", None)
    except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
        head_dim = None
    kv = getattr(attention, "kv_heads", None)
    n_heads = ints(getattr(attention, "n_heads", None), getattr(module, "n_heads", None))
    head_dim = ints(head_dim, getattr(module, "head_dim", None))
    n_kv = ints(kv, getattr(attention, "n_kv_heads", None), getattr(module, "n_kv_heads", None))
    if n_heads is None and head_dim is None:
        return None
    return PositionGeometry(n_heads, head_dim, n_kv)


def _head_geometry(attention: Any, ctx: Any) -> tuple[Optional[int], Optional[int]]:
    """``(n_heads, head_dim)`` of :func:`position_geometry` (``(None, None)`` when unknown)."""
    try:
        geo = position_geometry(attention, ctx)
    except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
        geo = None
    return (geo.n_heads, geo.head_dim) if geo is not None else (None, None)


def _geometry_errors(spec: ModelSpec, registry: Registry) -> list[tuple[str, str]]:
    """A position scheme acting on q/k or on the scores that no layer using it can take: every layer using that
    scheme has a token mixer declaring no per-head geometry for it (its ``position_geometry(ctx)`` returns ``None``: a
    recurrent mixer). A layer whose mixer declares none while other layers with the same scheme do (a hybrid: Gated
    DeltaNet layers beside attention layers) is fine: its mixer has no queries or keys and ignores the scheme. A mixer
    whose config has no ``position_geometry`` declaration at all is taken at its fields' word, with a
    :class:`~modkit.core.errors.SpecWarning` naming its layers and the fix (:func:`_warn_undeclared`)."""
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry)
    served: dict[str, bool] = {}  # position config (JSON) -> some layer declares the geometry it needs
    first: dict[str, tuple[str, int, Any, Any, str, str]] = {}
    undeclared: dict[tuple[str, str], tuple[Any, str, str, list[int]]] = {}
    for i in range(spec.n_layers):
        layer = spec.layer(i)
        if layer.position is None:
            continue
        acts = registry.entry_for_config(layer.position, "position").capabilities.get("acts_on")
        if acts not in ("qk", "bias"):
            continue
        need = "head_dim" if acts == "qk" else "n_heads"
        key = layer.position.model_dump_json()
        declare = getattr(layer.attention, "position_geometry", None)
        if not callable(declare):  # a mixer without the declaration: its fields tell, if they do; say so
            undeclared.setdefault((layer.attention.type, layer.position.type), (layer.attention, acts, need, []))
            undeclared[(layer.attention.type, layer.position.type)][3].append(i)
            served[key] = True
            continue
        try:
            geo = declare(ctx)
        except Exception:  # noqa: BLE001 - an inconsistent attention config reports its own error
            served[key] = True
            continue
        ok = geo is not None and getattr(geo, need) is not None
        served[key] = served.get(key, False) or ok
        if not ok and key not in first:
            first[key] = (_position_path(spec, i), i, layer, geo, need, acts)
    for (_, position), (mixer, acts, need, layers) in undeclared.items():
        _warn_undeclared(mixer, ctx, layers, position, acts, need)
    errors: dict[str, str] = {}
    for key, (path, i, layer, geo, need, acts) in first.items():
        if served.get(key):
            continue
        target = "queries and keys" if acts == "qk" else "the attention scores"
        errors.setdefault(
            path,
            (
                f"position type {layer.position.type!r} acts on {target}, but no layer using it has a mixer that "
                f"declares a {need} for it (layer {i}'s {layer.attention.type!r} declares no {need}: its "
                f"position_geometry() gives {geo!r}); use position type 'none', or give such layers an attention"
            ),
        )
    return list(errors.items())


def _warn_undeclared(mixer: Any, ctx: Any, layers: list[int], position: str, acts: str, need: str) -> None:
    """A :class:`~modkit.core.errors.SpecWarning` that the mixer of ``layers`` does not declare its position
    geometry while the layer's scheme acts on queries and keys (``acts = "qk"``) or on the scores (``"bias"``):
    validation then reads ``n_heads`` / ``head_dim`` from the config's fields (:func:`position_geometry`), which
    cannot tell a mixer that applies the scheme from one that has no queries or keys and ignores it."""
    import warnings

    from modkit.core.errors import SpecWarning

    try:
        geo = position_geometry(mixer, ctx)
    except Exception:  # noqa: BLE001 - an inconsistent config reports its own error
        geo = None
    found = getattr(geo, need, None) if geo is not None else None
    what = f"its fields give {need} = {found}" if found is not None else f"its fields give no {need}"
    target = "queries and keys" if acts == "qk" else "the attention scores"
    warnings.warn(
        f"layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))}: mixer {mixer.type!r} "
        f"({type(mixer).__name__}) declares no position_geometry(ctx), and "
        f"position {position!r} acts on {target}: {what}, so validation cannot tell whether the mixer applies "
        "the scheme or ignores it; declare position_geometry(ctx) on its config: a modkit.PositionGeometry when it "
        "applies the scheme, None when it has no queries or keys (this scheme is then refused for it)",
        SpecWarning,
        stacklevel=3,
    )


def _position_path(spec: ModelSpec, index: int) -> str:
    """The JSON path of the position scheme layer ``index`` uses: the last override giving it one, else the
    top-level ``position``."""
    path = "position"
    for j, o in enumerate(spec.overrides):
        if o.position is not None and index in o.indices(spec.n_layers):
            path = f"overrides[{j}].position"
    return path


def _position_uses(spec: ModelSpec, registry: Registry) -> list[tuple[str, Any, tuple[Optional[int], Optional[int]]]]:
    """``(path, position config, (n_heads, head_dim))`` for each position config and each attention geometry of the
    layers that use it (the top-level scheme once without geometry when every layer overrides it)."""
    uses: dict[tuple[str, tuple], Any] = {}
    ctx = SpecContext(spec.d_model, spec.n_layers, spec.vocab_size, spec.max_seq_len, registry)
    for i in range(spec.n_layers):
        layer = spec.layer(i)
        uses.setdefault((_position_path(spec, i), _head_geometry(layer.attention, ctx)), layer.position)
    if not any(p == "position" for p, _ in uses):
        uses[("position", (None, None))] = spec.position
    for j, o in enumerate(spec.overrides):
        if o.position is not None and not any(p == f"overrides[{j}].position" for p, _ in uses):
            uses[(f"overrides[{j}].position", (None, None))] = o.position
    return [(path, cfg, geometry) for (path, geometry), cfg in uses.items()]
