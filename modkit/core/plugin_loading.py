"""How a plugin gets into the registry: its hooks called in isolation (the first half of
:meth:`modkit.core.registry.Registry.register_plugin`), and plugins loaded from the ``modkit`` entry-point group one at
a time (the loop behind :meth:`modkit.core.registry.Registry.load_entry_points`).

A plugin's hooks run against a scratch plugin manager, so a malformed hook implementation or entry leaves nothing
behind.

A plugin that fails to import or to register produces one :class:`~modkit.core.registry.PluginWarning` naming it
and its distribution, is recorded as skipped, and the others still load; ``MODKIT_STRICT_PLUGINS=1`` (or
``strict=True``) raises :class:`~modkit.core.errors.RegistryError` instead. A clash between two plugins always
raises.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Callable, Iterable, Optional

import pluggy

from modkit.core.errors import RegistryError
from modkit.core.hooks import PROJECT, ModkitHookSpecs
from modkit.core.registry import Component, HFConverter, PluginWarning, Provider, Registry


def strict_from_environment() -> bool:
    """Whether the environment asks for strict loading: ``MODKIT_STRICT_PLUGINS`` is ``1``, ``true``, ``yes`` or
    ``on`` (any case, surrounding blanks ignored)."""
    return os.environ.get("MODKIT_STRICT_PLUGINS", "").strip().lower() in {"1", "true", "yes", "on"}


def normalize_distribution(name: str) -> str:
    """A distribution name in normal form: runs of ``-``, ``_`` and ``.`` become one ``-``, all lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def scratch_manager(obj: Any, name: str, provider: Provider) -> pluggy.PluginManager:
    """A throwaway plugin manager holding only ``obj``, so its hooks can be called without touching the registry.

    Raises:
        RegistryError: a malformed hook implementation, or no modkit hook at all.
    """
    scratch = pluggy.PluginManager(PROJECT)
    scratch.add_hookspecs(ModkitHookSpecs)
    try:
        scratch.register(obj, name=name)
    except Exception as exc:  # pluggy.PluginValidationError and friends
        raise RegistryError(f"plugin {provider}: invalid hook implementation: {exc}") from exc
    if not scratch.get_hookcallers(obj):
        raise RegistryError(
            f"plugin {provider} implements no modkit hook (expected register_components or register_hf_converters)"
        )
    return scratch


def collect_entries(scratch: pluggy.PluginManager, provider: Provider) -> tuple[list[Component], list[HFConverter]]:
    """Call the plugin's hooks on ``scratch`` and return the validated components (frozen, ``provider`` filled in)
    and HF converters it registers, in registration order.

    Raises:
        RegistryError: a malformed entry or a hook that raised (the message names ``provider``).
    """
    comps: list[Component] = []
    convs: list[HFConverter] = []

    def register_component(entry: Component) -> None:
        if not isinstance(entry, Component):
            raise RegistryError(f"register() takes a modkit.Component, got {type(entry).__name__}")
        entry.validate()
        frozen = dict(
            capabilities=MappingProxyType(dict(entry.capabilities)),
            aliases=tuple(entry.aliases),
            alias_notes=MappingProxyType(dict(entry.alias_notes)),
        )
        comps.append(replace(entry, provider=provider, **frozen))

    def register_converter(
        model_type: Any, convert: Optional[Callable[[dict], dict]] = None, weights: Any = None
    ) -> None:
        declaration = None
        if not isinstance(model_type, str) and convert is None and weights is None:
            # register(declaration): an object with model_type, convert and weights (its mapper)
            declaration = model_type
            model_type = getattr(declaration, "model_type", None)
            convert = getattr(declaration, "convert", None)
            weights = getattr(declaration, "weights", None)
        if not isinstance(model_type, str) or not model_type or not callable(convert):
            raise RegistryError(
                f"register(model_type, fn) or register(declaration): bad arguments {model_type!r}, {convert!r}"
            )
        convs.append(HFConverter(model_type, convert, weights, provider, declaration))

    try:
        scratch.hook.register_components(register=register_component)
        scratch.hook.register_hf_converters(register=register_converter)
    except RegistryError as exc:
        raise RegistryError(f"plugin {provider}: {exc}") from exc
    except Exception as exc:
        raise RegistryError(f"plugin {provider}: hook raised {type(exc).__name__}: {exc}") from exc
    return comps, convs


def load_plugins(
    registry: Registry, entry_points: Iterable[Any], skipped: dict[str, str], *, strict: bool | None = None
) -> None:
    """Register the plugin of every entry point with ``registry``, in order of entry-point name, each in isolation.

    The same (distribution, entry point) found twice, as editable installs can produce, loads once. A plugin name
    already taken by another distribution, an import that fails or a registration that fails (other than a clash)
    goes to :func:`_fail`.

    Args:
        registry: the registry the plugins register with (:meth:`~modkit.core.registry.Registry.register_plugin`).
        entry_points: ``importlib.metadata`` entry points of the ``modkit`` group.
        skipped: ``{plugin: reason}`` where each plugin skipped in non-strict mode is recorded.
        strict: raise instead of warning; ``None``: :func:`strict_from_environment`.

    Raises:
        RegistryError: in strict mode, a plugin that fails to load; always, a component or converter that two
            plugins provide ("provided twice").
    """
    if strict is None:
        strict = strict_from_environment()
    seen: set[tuple[str, str]] = set()
    for ep in sorted(entry_points, key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        dist_name = normalize_distribution(dist.metadata["Name"]) if dist is not None else ""
        version = dist.version if dist is not None else None
        ident = (dist_name, ep.name)
        if ident in seen:  # the same distribution found twice (editable installs): load once
            continue
        seen.add(ident)
        provider = Provider(ep.name, dist_name or None, version)
        loaded = next((p for p in registry.plugins() if p.name == ep.name), None)
        if loaded is not None:
            if loaded.provider.distribution != provider.distribution:
                message = (
                    f"its plugin name {ep.name!r} is already taken by {loaded.provider}; "
                    "rename one entry point (only the first was loaded)"
                )
                _fail(provider, message, strict, RegistryError(message), skipped)
            continue
        try:
            obj = ep.load()
        except Exception as exc:
            _fail(provider, f"failed to import {ep.value!r}: {type(exc).__name__}: {exc}", strict, exc, skipped)
            continue
        try:
            registry.register_plugin(obj, ep.name, distribution=dist_name or None, version=version)
        except RegistryError as exc:
            if "provided twice" in str(exc):
                raise
            _fail(provider, str(exc), strict, exc, skipped)


def _fail(provider: Provider, message: str, strict: bool, exc: BaseException, skipped: dict[str, str]) -> None:
    """Raise (``strict``) or warn about a plugin that did not load, and record it in ``skipped``.

    Raises:
        RegistryError: in strict mode, naming the plugin and the failure.
    """
    message = " ".join(message.split())  # one line, whatever the underlying error printed
    prefix = f"plugin {provider}: "
    if message.startswith(prefix):
        message = message[len(prefix) :]
    if strict:
        raise RegistryError(f"modkit plugin {provider} failed to load: {message} (MODKIT_STRICT_PLUGINS=1)") from exc
    skipped[provider.plugin] = message
    warnings.warn(
        f"modkit plugin {provider} was skipped: {message}; set MODKIT_STRICT_PLUGINS=1 to make this an error",
        PluginWarning,
        stacklevel=4,  # _fail, load_plugins, Registry.load_entry_points: the warning points at the latter's caller
    )
