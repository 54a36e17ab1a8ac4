"""The plugin guide's table of contract checks, generated from the registered checks so it cannot drift.

Each row comes from one :class:`modkit.testing.checks.Check` of :data:`~modkit.testing.checks.CHECKS`, in the order
the kit reports them: its name, its ``summary`` (what must hold), what it applies to (the first sentence of its
``applies`` function's docstring; ``every component`` for a check without one; for an ``applies`` without a
docstring, the kinds of the installed components it accepts) and the fault it exists to catch (the first sentence of
the ``Catches:`` paragraph of its ``run`` function's docstring).

The guide holds the table between :data:`BEGIN` and :data:`END`; the site build replaces what is there with
:func:`check_table` (the ``modkit`` mkdocs plugin), and ``python -m modkit.docs.checks FILE`` rewrites it in a
file (``--check``: exit 1 when the file's table is not the generated one).
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path
from typing import Any, Optional

from .markdown import _cell, _rst_to_md

#: the markers the table sits between in a Markdown page
BEGIN = "<!-- modkit:contract-checks (generated from modkit.testing.checks.CHECKS; do not edit) -->"
END = "<!-- /modkit:contract-checks -->"


def _first_sentence(text: str) -> str:
    """The first sentence of ``text`` (up to a full stop followed by a space or the end), one line, Markdown."""
    text = " ".join(text.split())
    m = re.search(r"(?<!e\.g)(?<!i\.e)(?<!etc)\.(\s|$)", text)
    return _rst_to_md(text[: m.start() + 1] if m else text)


def _applies_to(check: Any, registry: Any) -> str:
    """What ``check`` applies to: its ``applies`` docstring's first sentence, ``every component`` without an
    ``applies`` of its own, else the kinds of the installed components it accepts."""
    if getattr(check.applies, "__name__", "") == "<lambda>":  # Check's default: applies to everything
        return "every component"
    doc = inspect.getdoc(check.applies)
    if doc:
        return _first_sentence(doc.split("\n\n")[0])
    kinds = []
    for entry in registry.components():
        try:
            accepted = check.applies(entry, None) is None
        except Exception:  # noqa: BLE001 - an applies that needs a config: not decidable here
            accepted = False
        if accepted and entry.kind not in kinds:
            kinds.append(entry.kind)
    return ", ".join(f"`{k}`" for k in kinds) if kinds else "(no installed component)"


def _catches(check: Any) -> str:
    """The first sentence of the ``Catches:`` paragraph of the check's docstring, without the word itself."""
    doc = inspect.getdoc(check.run) or ""
    for para in doc.split("\n\n"):
        if para.lstrip().startswith("Catches:"):
            return _first_sentence(para.lstrip()[len("Catches:") :])
    return ""


def check_rows(registry: Optional[Any] = None) -> list[tuple[str, str, str, str]]:
    """``(name, what must hold, applies to, a fault it catches)`` per registered check, Markdown, in kit order.

    Args:
        registry: whose components an ``applies`` without a docstring is evaluated on (default: the process-wide
            registry, every installed plugin).
    """
    from modkit.core.registry import get_registry
    from modkit.testing.checks import CHECKS

    reg = registry or get_registry()
    rows = []
    for c in CHECKS:
        summary = _rst_to_md(c.summary) + (
            " (opt-in: `--distributed`)" if c.distributed and "opt-in" not in c.summary else ""
        )
        rows.append((f"`{c.name}`", summary, _applies_to(c, reg), _catches(c)))
    return rows


def check_table(registry: Optional[Any] = None) -> str:
    """The Markdown table of :func:`check_rows`, with :data:`BEGIN` and :data:`END` around it."""
    lines = [BEGIN, "", "| check | what must hold | applies to | a fault it catches |", "|---|---|---|---|"]
    lines += ["| " + " | ".join(_cell(x) for x in row) + " |" for row in check_rows(registry)]
    return "\n".join([*lines, "", END])


def fill_check_table(markdown: str, registry: Optional[Any] = None) -> str:
    """``markdown`` with what lies between :data:`BEGIN` and :data:`END` (markers included) replaced by
    :func:`check_table`; unchanged when the page has no :data:`BEGIN`.

    Raises:
        ValueError: :data:`BEGIN` without a later :data:`END`.
    """
    start = markdown.find(BEGIN)
    if start < 0:
        return markdown
    end = markdown.find(END, start)
    if end < 0:
        raise ValueError(f"a page opens the generated check table ({BEGIN}) and never closes it ({END})")
    return markdown[:start] + check_table(registry) + markdown[end + len(END) :]


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m modkit.docs.checks FILE [--check]``: rewrite the table in FILE, or (``--check``) exit 1 when it
    differs from the generated one."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    paths = [Path(a) for a in args if a != "--check"]
    stale = []
    for path in paths:
        text = path.read_text()
        filled = fill_check_table(text)
        if filled != text:
            stale.append(str(path))
            if not check:
                path.write_text(filled)
    if check and stale:
        print(
            f"stale contract-check table in {', '.join(stale)}; run: python -m modkit.docs.checks FILE", file=sys.stderr
        )
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover - the command line
    raise SystemExit(main())
