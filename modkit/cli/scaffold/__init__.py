"""The skeleton of a third-party plugin package (``modkit new plugin NAME --kind KIND``, in :mod:`modkit.cli.new`).

The skeleton is a complete, installable package whose one component already works and passes the contract
kit unchanged, so an author starts from green and edits the math::

    NAME/
      pyproject.toml            entry point  [project.entry-points.modkit]  NAME = "IMPORT"
      README.md
      IMPORT/__init__.py        @modkit.hookimpl register_components(register)
      IMPORT/KIND.py            config model, module, factory, param_count, the Component entry
      tests/testing/test_contracts.py   runs modkit.testing.check_component on the component

``NAME`` is the distribution name and the plugin (entry-point) name; the import name ``IMPORT`` is ``NAME``
with ``-`` replaced by ``_``. ``--type`` (default: ``IMPORT``) is the name specs use: ``{"type": TYPE}``.

Kinds and the starting component written for each:

* ``norm``: RMSNorm (statistics in float32, output in the input dtype).
* ``ffn``: a two-layer GELU MLP.
* ``attention``: causal grouped-query attention over ``scaled_dot_product_attention``, mask built from absolute
  positions (bottom-right aligned for cached decode), KV cache through ``update_cache(inputs, k, v, mixer=self)``.
* ``mixer``: a recurrent token mixer (a gated diagonal linear recurrence) whose fixed-size state lives only in the
  cache it declares (``cache_spec()`` with a ``growth="sequence"`` entry, read and written through
  ``inputs.cache_for(self)``), so it decodes from that state; padding changes no state; ``position_geometry`` is
  ``None``; constant FLOPs per token.
* ``position``: no position information (NoPE), every hook an identity, ``acts_on = "none"``.
* ``placement``: a pre-norm block.

:func:`scaffold_plugin` is the Python API; :mod:`modkit.cli.new` is the command.

The texts are :class:`string.Template` strings: the package files in :mod:`modkit.cli.scaffold.templates`, the
component module of each kind in :mod:`modkit.cli.scaffold.components`.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path
from string import Template
from typing import Optional

# the template texts, under the names they always had here
from .components import ATTENTION, COMPONENT_TEMPLATES, FFN, MIXER, NORM, PLACEMENT, POSITION, USAGE  # noqa: F401
from .templates import INIT, PYPROJECT, README, TEST

#: Kinds the scaffold can write a component for.
KINDS = ("norm", "ffn", "attention", "mixer", "position", "placement")

# A distribution name that is also a valid import name once '-' becomes '_': lowercase ASCII letters and digits
# in words joined by single '-' or '_', starting with a letter.
_DIST_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
# Component type names, as the registry accepts them (modkit.core.registry._NAME).
_TYPE_NAME = re.compile(r"^[a-z][a-z0-9_\-]*$")
# Import names a plugin must not take: the core, the built-ins and generic names that collide across packages.
_RESERVED = {
    "modkit",
    "modkit_plugins",
    "plugins",
    "plugin",
    "test",
    "tests",
    "src",
    "docs",
    "torch",
    "pydantic",
    "pluggy",
}


class ScaffoldError(Exception):
    """A bad name, kind or output directory (reported by the CLI as one line, exit status 1)."""


def import_name(name: str) -> str:
    """The import name of distribution ``name``: ``-`` replaced by ``_`` (``my-norms`` -> ``my_norms``)."""
    return name.replace("-", "_")


def validate_name(name: str) -> str:
    """Check ``NAME`` is usable as distribution, entry-point and (with ``-`` -> ``_``) import name.

    Raises:
        ScaffoldError: naming the problem and what would be accepted.
    """
    if not _DIST_NAME.match(name or ""):
        raise ScaffoldError(
            f"invalid plugin name {name!r}: use lowercase letters and digits, words joined by single '-' or '_', "
            "starting with a letter (e.g. 'my-norms'); it becomes the distribution name and, with '-' -> '_', "
            "the import name"
        )
    from modkit.core.hooks import DISTRIBUTION

    if name.replace("_", "-") == DISTRIBUTION:
        raise ScaffoldError(
            f"invalid plugin name {name!r}: it is modkit's own distribution name; name the plugin, "
            "e.g. 'modkit-my-norms'"
        )
    mod = import_name(name)
    if keyword.iskeyword(mod):
        raise ScaffoldError(f"invalid plugin name {name!r}: the import name {mod!r} is a Python keyword")
    if mod in _RESERVED or mod in getattr(sys, "stdlib_module_names", ()):
        raise ScaffoldError(
            f"invalid plugin name {name!r}: the import name {mod!r} would shadow "
            + ("a standard-library module" if mod in getattr(sys, "stdlib_module_names", ()) else "a reserved name")
            + "; namespace it, e.g. 'modkit-"
            + name
            + "'"
        )
    return name


def validate_type(type_: str) -> str:
    """Check a component type name (what specs write as ``{"type": ...}``).

    Raises:
        ScaffoldError: not matching ``[a-z][a-z0-9_-]*``.
    """
    if not _TYPE_NAME.match(type_ or ""):
        raise ScaffoldError(
            f"invalid component type {type_!r}: use lowercase letters, digits, '_' or '-', starting with a letter"
        )
    return type_


def _class_name(type_: str) -> str:
    parts = re.split(r"[-_]+", type_)
    name = "".join(p[:1].upper() + p[1:] for p in parts if p)
    return name if name[:1].isalpha() else "C" + name


def _ident(type_: str) -> str:
    return type_.replace("-", "_")


def plugin_files(name: str, kind: str, type_: Optional[str] = None) -> dict[str, str]:
    """The skeleton as ``{relative path: text}`` (nothing is written).

    Raises:
        ScaffoldError: bad name, kind or type.
    """
    validate_name(name)
    if kind not in KINDS:
        raise ScaffoldError(f"unknown kind {kind!r}; the scaffold writes one of: {', '.join(KINDS)}")
    mod = import_name(name)
    type_ = validate_type(type_ if type_ is not None else mod)
    values = {
        "name": name,
        "mod": mod,
        "kind": kind,
        "type": type_,
        "Class": _class_name(type_),
        "ident": _ident(type_),
    }
    values["usage"] = Template(USAGE[kind]).substitute(values)
    render = lambda text: Template(text).substitute(values)  # noqa: E731
    return {
        "pyproject.toml": render(PYPROJECT),
        "README.md": render(README),
        f"{mod}/__init__.py": render(INIT),
        f"{mod}/{kind}.py": render(COMPONENT_TEMPLATES[kind]),
        "tests/testing/test_contracts.py": render(TEST),
    }


def scaffold_plugin(name: str, kind: str, type_: Optional[str] = None, output: Optional[Path] = None) -> Path:
    """Write a plugin package skeleton to ``output / name`` (``output`` defaults to the current directory).

    Returns:
        The package directory.

    Raises:
        ScaffoldError: bad name, kind or type, or the target directory already exists (never overwritten).
    """
    files = plugin_files(name, kind, type_)
    target = Path(output if output is not None else ".") / name
    if target.exists():
        raise ScaffoldError(f"{target} already exists; refusing to overwrite it (choose another -o DIR or remove it)")
    parent = target.parent
    if parent.exists() and not parent.is_dir():
        raise ScaffoldError(f"{parent} is not a directory")
    for rel, text in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return target
