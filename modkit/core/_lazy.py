"""Packages whose public names are imported on first use (PEP 562), so that importing a light submodule
(``modkit.cli``, ``modkit.core.errors``, ``modkit.train.config``) does not import torch through its package.

``import modkit`` costs a few milliseconds; ``modkit.build`` (or ``from modkit import build``) imports
:mod:`modkit.nn.build` and everything it needs the first time it is used, and is a plain attribute afterwards. The
names, their modules and ``__all__`` are those an eager ``from .build import build`` would give, including where a
public function shares its name with a submodule (``modkit.build`` the function, ``modkit/nn/build.py`` the module;
``modkit.data.prepare``): the import system binds a submodule on its package after loading it, and a lazy package
keeps the function under that name, as the eager import did. The submodule stays importable by its full name
(``from modkit.nn.build import summarize``, ``sys.modules["modkit.nn.build"]``).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Mapping


class LazyPackage(types.ModuleType):
    """Module type of a package whose exported names (``_lazy_exports``: name -> full module name) load on first use.

    Any other attribute that names a submodule (``modkit.analysis.cost``) imports it, as an attribute access after an eager
    package import would usually find it already imported.
    """

    _lazy_exports: Mapping[str, str]

    def __getattr__(self, name: str):
        exports = self.__dict__.get("_lazy_exports", {})
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            self.__dict__[name] = value  # a plain attribute from now on
            return value
        if not name.startswith("__"):
            full = f"{self.__name__}.{name}"
            try:
                return importlib.import_module(full)
            except ModuleNotFoundError as exc:
                if exc.name != full:  # the submodule exists but something it imports is missing: say so
                    raise
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("_lazy_exports", {})))

    def __setattr__(self, name: str, value) -> None:
        exports = self.__dict__.get("_lazy_exports", {})
        if name in exports and isinstance(value, types.ModuleType):
            # the import system binding submodule `name` (or an old path of it, modkit.core.moved) on its package:
            # the exported function of that name keeps it
            return
        super().__setattr__(name, value)


def make_lazy(package: str, exports: Mapping[str, str]) -> None:
    """Turn the already-imported package ``package`` into a :class:`LazyPackage` exporting ``exports``
    (``{name: full module name}``). Call it at the end of the package's ``__init__.py``."""
    module = sys.modules[package]
    module.__class__ = LazyPackage
    module.__dict__["_lazy_exports"] = dict(exports)
