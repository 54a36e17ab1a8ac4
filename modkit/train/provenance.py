"""Which plugin provides each component of a spec, with the plugin's distribution (package) and version.

A result trained with a third-party component depends on that component's code, so training records, for every
component type a spec uses, who provided it: in the run folder's ``components.json`` and in the ``metadata`` of the
spec it writes (the run's ``spec.json`` and every checkpoint's). :func:`component_provenance` gives the records;
:func:`stamp_provenance` puts them in a spec's metadata as ``"plugin:<kind>/<type>": "<plugin> (<distribution>
<version>)"`` strings (spec metadata holds scalars only).

The plugin name and distribution come from the registry (:class:`modkit.core.registry.Provider`, filled from the
``modkit`` entry point's distribution by :func:`modkit.core.plugin_loading.load_plugins`). A plugin registered
directly, without a distribution (:meth:`modkit.core.registry.Registry.register_plugin` in a script or a test), is
looked up by its top-level module in ``importlib.metadata.packages_distributions()``; one found nowhere records
``None``. The built-in components (``modkit_plugins``) report modkit's own version (``modkit.__version__``).
"""

from __future__ import annotations

import functools
import importlib.metadata as md
from typing import Any, Optional

#: the prefix of the spec-metadata keys :func:`stamp_provenance` writes
METADATA_PREFIX = "plugin:"
#: the modules of the components modkit ships
_BUILTIN_MODULES = ("modkit_plugins", "modkit")


@functools.lru_cache(maxsize=1)
def _distributions() -> dict[str, list[str]]:
    """``{top-level module: [distribution, ...]}`` of the installed distributions (read once per process)."""
    return md.packages_distributions()


def _module_of(obj: Any) -> str:
    """The dotted module a plugin object is (a module) or was defined in (an instance or namespace)."""
    name = getattr(obj, "__name__", None)
    if isinstance(name, str) and type(obj).__name__ == "module":
        return name
    module = getattr(obj, "__module__", None) or type(obj).__module__
    hook = getattr(obj, "register_components", None)  # a namespace of hook functions: where the hook was written
    return getattr(hook, "__module__", None) or module


def _version(distribution: str) -> Optional[str]:
    try:
        return md.version(distribution)
    except md.PackageNotFoundError:
        return None


def provider_record(entry: Any, registry: Any) -> dict[str, Optional[str]]:
    """``{"provider": plugin name, "distribution": package or None, "version": version or None}`` of one registry
    entry (:class:`modkit.core.registry.Component`).

    Built-in entries (a plugin module under ``modkit_plugins``) report ``modkit.__version__`` and modkit's
    distribution; others their provider's distribution and version, else those of the distribution their plugin's
    top-level module belongs to (``None`` when it belongs to none).
    """
    from modkit import __version__

    provider = entry.provider
    plugin = provider.plugin if provider is not None else None
    info = next((p for p in registry.plugins() if p.name == plugin), None)
    module = _module_of(info.obj) if info is not None else ""
    top = module.split(".")[0]
    dist = provider.distribution if provider is not None else None
    version = provider.version if provider is not None else None
    if dist is None and top:
        found = _distributions().get(top) or []
        dist = found[0] if found else None
        version = _version(dist) if dist else None
    if top in _BUILTIN_MODULES:
        version = __version__
    return {"provider": plugin, "distribution": dist, "version": version}


def component_provenance(spec: Any, registry: Any = None) -> dict[str, dict[str, Optional[str]]]:
    """``{"kind/type": provider_record}`` of every component type ``spec`` uses (nested slots and per-layer
    overrides included), sorted by key.

    Args:
        spec: a validated :class:`modkit.spec.ModelSpec`. registry: the registry its components come from (default:
            the global one).

    Raises:
        RegistryError: a component of the spec that no registered entry provides.
    """
    from modkit.core.registry import get_registry
    from modkit.spec.models import iter_configs

    reg = registry or get_registry()
    out: dict[str, dict[str, Optional[str]]] = {}
    for _, cfg in iter_configs(spec):
        entry = reg.entry_for_config(cfg)
        key = f"{entry.kind}/{entry.type}"
        if key not in out:
            out[key] = provider_record(entry, reg)
    return dict(sorted(out.items()))


def describe(record: dict[str, Optional[str]]) -> str:
    """``"builtin-norm (modkit-lm 0.1.0)"``: a record as one string (``"good"`` alone without a distribution)."""
    dist = " ".join(v for v in (record.get("distribution"), record.get("version")) if v)
    return f"{record.get('provider')}" + (f" ({dist})" if dist else "")


def stamp_provenance(spec: Any, registry: Any = None) -> Any:
    """A copy of ``spec`` whose ``metadata`` also holds ``"plugin:<kind>/<type>": describe(record)`` for every
    component type it uses (older ``plugin:`` keys replaced; other metadata kept).

    Raises:
        RegistryError: a component of the spec that no registered entry provides.
    """
    records = component_provenance(spec, registry)
    kept = {k: v for k, v in spec.metadata.items() if not k.startswith(METADATA_PREFIX)}
    stamped = {f"{METADATA_PREFIX}{key}": describe(rec) for key, rec in records.items()}
    return spec.model_copy(update={"metadata": {**kept, **stamped}})
