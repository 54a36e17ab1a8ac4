"""pluggy hook specifications: the only way components and converters enter modkit.

A plugin is any importable object (usually a module) exposing functions decorated with
:data:`hookimpl`, advertised under the ``modkit`` entry-point group::

    [project.entry-points.modkit]
    my-norms = "my_package.norms"

The built-in components in ``plugins/`` (import name ``modkit_plugins``) are loaded exactly this way.
The hook pattern follows simonw/llm: each hook receives a ``register`` callback.
"""

from __future__ import annotations

from typing import Callable

import pluggy

PROJECT = "modkit"
ENTRY_POINT_GROUP = "modkit"
#: modkit's own distribution (the name on PyPI; ``modkit`` there is an unrelated project). The import name, the
#: command and the entry-point group stay ``modkit``.
DISTRIBUTION = "modkit-lm"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class ModkitHookSpecs:
    """The hooks a modkit plugin may implement."""

    @hookspec
    def register_components(self, register: Callable) -> None:
        """Register components by calling ``register(Component(...))`` once per component.

        Args:
            register: callback taking a :class:`modkit.core.registry.Component`.
        """

    @hookspec
    def register_hf_converters(self, register: Callable) -> None:
        """Register Hugging Face model types: ``register(declaration)`` or ``register(model_type, fn)``.

        ``register(declaration)`` takes an object with ``model_type`` (str), ``convert(config: dict) -> dict``,
        ``weights`` (a :class:`modkit.io.checkpoint.WeightMapper`, or ``None``) and optionally ``describe()`` (what the
        reference docs show): the built-in declarative model types (``modkit_plugins.hf.HFType``) are such
        objects, and a plugin usually derives its own from one of them.

        ``register(model_type, fn)``, with ``fn(config: dict) -> dict`` returning a modkit spec dict for a
        Hugging Face ``config.json`` whose ``model_type`` equals ``model_type``, registers a converter written as a
        plain function; ``register(model_type, fn, weights=mapper)`` adds a checkpoint-name mapper (used by the
        checkpoint tools). Both forms are supported. A converter must raise :class:`modkit.SpecError` for any value
        it cannot express (never drop it silently).
        """
