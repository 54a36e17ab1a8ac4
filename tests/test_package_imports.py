"""The lazy packages (``modkit``, ``modkit.data``, ``modkit.train``, ``modkit.testing``; :mod:`modkit._lazy`): the
same names, objects and ``__all__`` as eager imports, and no torch for light submodules."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[1]
LAZY = ("modkit", "modkit.data", "modkit.train", "modkit.testing")


def _type_checking_imports(package: str) -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` imports in the package's ``__init__.py``."""
    path = ROOT / Path(*package.split(".")) / "__init__.py"
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                base = package.rsplit(".", imp.level - 1)[0] if imp.level > 1 else package
                for alias in imp.names:
                    out[alias.name] = f"{base}.{imp.module}"
    return out


@pytest.mark.parametrize("package", LAZY)
def test_exports_match_the_typed_imports_and_all(package):
    """``_EXPORTS`` (what loads at run time), the ``TYPE_CHECKING`` imports (what editors see) and ``__all__`` agree,
    and every name resolves to the object its module defines."""
    mod = importlib.import_module(package)
    exports = mod._lazy_exports
    assert exports == _type_checking_imports(package)
    assert set(exports) <= set(mod.__all__)
    for name in mod.__all__:
        value = getattr(mod, name)
        if name in exports:
            assert value is getattr(importlib.import_module(exports[name]), name)
    assert set(mod.__all__) <= set(dir(mod))


def test_function_named_like_its_submodule_keeps_the_name():
    """``modkit.build`` is the function and ``modkit.data.prepare`` too, whenever their submodules get imported."""
    code = (
        "import modkit, modkit.data\n"
        "from modkit.build import summarize\n"           # the submodule first: the import system binds it on modkit
        "import modkit.data.prepare\n"
        "assert callable(modkit.build) and modkit.build.__module__ == 'modkit.build', modkit.build\n"
        "assert modkit.data.prepare.__module__ == 'modkit.data.prepare' and callable(modkit.data.prepare)\n"
        "assert sys.modules['modkit.build'].summarize is summarize\n"
        "from modkit import build\n"
        "assert build is modkit.build\n"
        "assert modkit.cost.__name__ == 'modkit.cost'\n"  # a submodule by attribute, as after an eager import
    )
    proc = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr


def test_light_modules_do_not_import_torch():
    code = (
        "import sys, modkit, modkit.errors, modkit.jsonio, modkit.limits, modkit.config, modkit.hooks, modkit.cli, "
        "modkit.train.config, modkit.hardware\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
        "import modkit\n"
        "modkit.SpecError\n"
        "print('torch' in sys.modules)\n"
        "modkit.build\n"
        "print('torch' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "False", "True"]


def test_unknown_attribute_is_an_attribute_error():
    import modkit

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        modkit.no_such_name  # noqa: B018
    assert not hasattr(modkit, "no_such_name")
