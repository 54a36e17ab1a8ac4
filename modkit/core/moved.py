"""Import paths of modkit 0.1 that moved when the core was grouped into packages, kept for one release.

``import modkit.cache`` (or ``from modkit.cost import CostModel``) still works and gives the very module now at
its new path (``modkit.nn.cache``), with one :class:`DeprecationWarning` per old path naming the new one. A plugin
written for 0.1 keeps loading, passing the contract kit and training unchanged; its author moves to
:mod:`modkit.plugin`, which holds everything a component needs. The aliases go in 0.3.

Only what was public moves this way: the old private modules (``modkit._lazy``) are not aliased.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Optional

#: old module path -> new module path (modkit 0.1 -> 0.2)
MOVED = {
    f"modkit.{old}": f"modkit.{new}"
    for old, new in {
        "registry": "core.registry",
        "hooks": "core.hooks",
        "config": "core.config",
        "interfaces": "core.interfaces",
        "roles": "core.roles",
        "errors": "core.errors",
        "validation": "core.validation",
        "limits": "core.limits",
        "jsonio": "core.jsonio",
        "arguments": "core.arguments",
        "build": "nn.build",
        "model": "nn.model",
        "cache": "nn.cache",
        "attention": "nn.attention",
        "recurrent": "nn.recurrent",
        "documents": "nn.documents",
        "grouped": "nn.grouped",
        "balance": "nn.balance",
        "parametrization": "core.parametrization",
        "memory": "nn.memory",
        "checkpoint": "io.checkpoint",
        "atomic": "io.atomic",
        "hf": "io.hf",
        "generate": "inference.generate",
        "sampling": "inference.sampling",
        "cost": "analysis.cost",
        "trace": "analysis.trace",
        "trace_report": "analysis.trace_report",
        "inspection": "analysis.inspection",
        "hardware": "analysis.hardware",
        "compare": "experiments.compare",
        "ladder": "experiments.ladder",
        "stats": "experiments.stats",
        "scaling": "experiments.scaling",
        "coordcheck": "experiments.coordcheck",
        "scaffold": "cli.scaffold",
    }.items()
}

_warned: set[str] = set()


class _Alias(importlib.abc.Loader):
    """Loads an old path as the module at its new path (the same object: state and classes are shared)."""

    def __init__(self, new: str):
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        if spec.name not in _warned:
            _warned.add(spec.name)
            warnings.warn(
                f"{spec.name} moved to {self.new} in modkit 0.2 (a component imports from modkit.plugin); "
                "the old path goes in 0.3",
                DeprecationWarning,
                stacklevel=_caller_level(),
            )
        return module

    def exec_module(self, module) -> None:  # already executed at its new path
        return None


def _caller_level() -> int:
    """The stack level of the first frame outside importlib and this module (the ``import`` statement)."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen importlib") or frame.f_code.co_filename == __file__
    ):
        frame, level = frame.f_back, level + 1
    return level


class MovedFinder(importlib.abc.MetaPathFinder):
    """A meta path finder that answers only the old paths of :data:`MOVED`."""

    def find_spec(self, fullname: str, path=None, target=None) -> Optional[importlib.machinery.ModuleSpec]:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    """Put :class:`MovedFinder` on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
