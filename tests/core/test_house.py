"""The house rules of the code base, checked on every module of ``modkit/`` and ``modkit_plugins/``.

* No module over 600 lines, no function over 80 lines (its ``def`` line to its last line) or over 8 parameters
  (``self`` / ``cls`` not counted; ``*args``, ``**kwargs`` and keyword-only parameters counted), unless the reason
  is written beside it: a comment line ``# size: <reason>`` right after the module docstring (a module), or right
  above the ``def`` or its decorators (a function). A reason is read by people; the check only asks that one exists.
* The tree is the architecture: :mod:`modkit.core` imports nothing from the packages above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8
#: the packages above modkit.core: core may import none of them
ABOVE_CORE = (
    "analysis",
    "cli",
    "data",
    "docs",
    "evaluation",
    "experiments",
    "inference",
    "io",
    "nn",
    "parallel",
    "plugin",
    "spec",
    "testing",
    "train",
)


def _sources() -> list[Path]:
    return sorted(p for d in ("modkit", "modkit_plugins") for p in (ROOT / d).rglob("*.py"))


def _reason_above(lines: list[str], line: int) -> bool:
    """True when the line above 1-based ``line`` (skipping other comment lines) is a ``# size:`` comment."""
    i = line - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        if lines[i].strip().startswith("# size:"):
            return True
        i -= 1
    return False


def _module_reason(tree: ast.Module, lines: list[str]) -> bool:
    start = tree.body[0].end_lineno if tree.body and isinstance(tree.body[0], ast.Expr) else 0
    return any(line.strip().startswith("# size:") for line in lines[start : start + 3])


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args]
    count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def _first_line(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return min([node.lineno] + [d.lineno for d in node.decorator_list])


def test_modules_and_functions_are_small_or_say_why():
    too_big = []
    for path in _sources():
        text = path.read_text()
        lines, tree, rel = text.splitlines(), ast.parse(text), path.relative_to(ROOT).as_posix()
        if len(lines) > MAX_MODULE_LINES and not _module_reason(tree, lines):
            too_big.append(f"{rel}: {len(lines)} lines")
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length, params = node.end_lineno - node.lineno + 1, _parameters(node)
            if (length > MAX_FUNCTION_LINES or params > MAX_PARAMETERS) and not _reason_above(lines, _first_line(node)):
                too_big.append(f"{rel}:{node.lineno} {node.name}: {length} lines, {params} parameters")
    assert not too_big, "split these, or write '# size: <reason>' beside them:\n" + "\n".join(too_big)


def test_core_imports_nothing_from_the_packages_above_it():
    """``modkit/core`` is the floor: the registry, the contracts, errors and bounds. An import from ``modkit.nn``,
    ``modkit.spec`` or any package above it (even inside a function; ``if TYPE_CHECKING:`` imports aside) would
    make the floor depend on a storey."""
    found = []
    for path in sorted((ROOT / "modkit" / "core").rglob("*.py")):
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:  # annotations only: no import at run time
                continue
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom) and node.level == 0
                else ([a.name for a in node.names] if isinstance(node, ast.Import) else [])
            )
            for name in names:
                parts = name.split(".")
                if parts[0] == "modkit" and len(parts) > 1 and parts[1] in ABOVE_CORE:
                    found.append(f"{path.relative_to(ROOT).as_posix()}:{node.lineno} imports {name}")
    assert not found, "\n".join(found)
