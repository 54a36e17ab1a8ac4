"""The lazy packages (``modkit``, ``modkit.data``, ``modkit.train``, ``modkit.testing``; :mod:`modkit.core._lazy`): the
same names, objects and ``__all__`` as eager imports, and no torch for light submodules."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
LAZY = ("modkit", "modkit.data", "modkit.train", "modkit.testing", "modkit.plugin")


def _type_checking_imports(package: str) -> dict[str, str]:
    """``{name: module}`` of the ``if TYPE_CHECKING:`` imports in the package's ``__init__.py`` (or the module's file)."""
    path = ROOT / Path(*package.split(".")) / "__init__.py"
    if not path.exists():
        path = (ROOT / Path(*package.split("."))).with_suffix(".py")
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                base = package.rsplit(".", imp.level - 1)[0] if imp.level > 1 else package
                for alias in imp.names:
                    out[alias.name] = f"{base}.{imp.module}" if imp.level else imp.module
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
        "import modkit, modkit.data, warnings\n"
        "from modkit.nn.build import summarize\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore', DeprecationWarning)\n"
        "    import modkit.build\n"  # the old path: the import system binds it on modkit
        "import modkit.data.prepare\n"
        "assert callable(modkit.build) and modkit.build.__module__ == 'modkit.nn.build', modkit.build\n"
        "assert modkit.data.prepare.__module__ == 'modkit.data.prepare' and callable(modkit.data.prepare)\n"
        "assert sys.modules['modkit.nn.build'].summarize is summarize\n"
        "from modkit import build\n"
        "assert build is modkit.build\n"
        "assert modkit.analysis.cost.__name__ == 'modkit.analysis.cost'\n"  # a submodule by attribute, as after an eager import
    )
    proc = subprocess.run(
        [sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT
    )
    assert proc.returncode == 0, proc.stderr


def test_light_modules_do_not_import_torch():
    code = (
        "import sys, modkit, modkit.core.errors, modkit.core.jsonio, modkit.core.limits, modkit.core.config, modkit.core.hooks, modkit.cli, "
        "modkit.train.config, modkit.analysis.hardware\n"
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


def test_the_import_paths_of_0_1_give_the_moved_modules_with_one_warning_each():
    """``modkit.cache``, ``modkit.cost``, ... (0.1) are the modules now under ``modkit.core`` / ``nn`` / ``io`` / ...:
    the same objects, one DeprecationWarning per old path naming the new one, for every path of the table."""
    from modkit.core.moved import MOVED

    code = (
        "import importlib, json, sys, warnings\n"
        "from modkit.core.moved import MOVED\n"
        "out = {}\n"
        "for old, new in MOVED.items():\n"
        "    with warnings.catch_warnings(record=True) as caught:\n"
        "        warnings.simplefilter('always')\n"
        "        first = importlib.import_module(old)\n"
        "        importlib.import_module(old)\n"
        "    texts = [str(w.message) for w in caught if w.category is DeprecationWarning]\n"
        "    out[old] = [first is importlib.import_module(new), texts]\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    import json

    seen = json.loads(proc.stdout)
    assert set(seen) == set(MOVED) and len(MOVED) == 36
    for old, (same, texts) in seen.items():
        assert same, old
        assert texts == [
            f"{old} moved to {MOVED[old]} in modkit 0.2 (a component imports from modkit.plugin); the old path goes in 0.3"
        ]


def test_modkit_and_its_built_in_plugins_import_no_old_path():
    """Every module of modkit and of the built-in plugins imports with the old paths turned into errors: nothing of
    the project's own leans on the deprecated aliases."""
    code = (
        "import importlib, pkgutil, warnings\n"
        "warnings.filterwarnings('error', message='modkit\\\\..* moved to', category=DeprecationWarning)\n"
        "import modkit, modkit_plugins\n"
        "for pkg in (modkit, modkit_plugins):\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        if info.name not in ('modkit.__main__', 'modkit.docs.plugin', 'modkit.evaluation.harness'):\n"
        "            importlib.import_module(info.name)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=HANG_TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.split() == ["ok"], proc.stderr


def test_the_built_in_plugins_import_modkit_only_through_modkit_plugin():
    """The built-ins register exactly as a third-party package does, and import from the one public module a
    plugin author is given (:mod:`modkit.plugin`), never from where a name happens to be defined."""
    found = {}
    for path in sorted((ROOT / "modkit_plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and node.module
                and node.module.split(".")[0] == "modkit"
            ):
                found.setdefault(node.module, []).append(path.relative_to(ROOT).as_posix())
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "modkit":
                        found.setdefault(alias.name, []).append(path.relative_to(ROOT).as_posix())
    assert set(found) == {"modkit.plugin"}, {m: f for m, f in found.items() if m != "modkit.plugin"}
