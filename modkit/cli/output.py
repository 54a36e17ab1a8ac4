"""Output helpers of the ``modkit`` command: stdout / stderr lines, aligned tables, counts and byte sizes, and the
lines of a :class:`~modkit.core.errors.SpecError`. Plain functions with no modkit imports (every command
module uses them: ``from modkit.cli import _table, _count``)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import Any, Iterable, Optional, Sequence


def _out(line: str = "") -> None:
    """One line on stdout."""
    print(line, file=sys.stdout)


def _err(line: str) -> None:
    """One line on stderr."""
    print(line, file=sys.stderr)


def _debug() -> bool:
    """Whether ``MODKIT_DEBUG`` asks for tracebacks (1, true, yes, on)."""
    return os.environ.get("MODKIT_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, right: Sequence[int] = (), indent: str = ""
) -> list[str]:
    """Plain aligned text table; columns listed in ``right`` are right-aligned, the last one is never padded."""
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def fmt(cells: Sequence[str]) -> str:
        parts = []
        for i, c in enumerate(cells):
            if i == len(cells) - 1 and i not in right:
                parts.append(c)
            elif i in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c.ljust(widths[i]))
        return (indent + "  ".join(parts)).rstrip()

    return [fmt(list(headers))] + [fmt(r) for r in rows]


#: a full stop that ends a sentence: followed by a space, not the end of an abbreviation (e.g., i.e., et al.)
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bal)(?<!\bvs)(?<!\bcf)\.(?=\s)")


def _one_line(text: str) -> str:
    """The first sentence of a description, on one line: up to the first full stop that a space follows (a
    semicolon or a parenthesis does not end it)."""
    text = " ".join((text or "").split())
    end = _SENTENCE_END.search(text)
    return text[: end.end()] if end else text


def _fit_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """:func:`_table`'s lines, the last column wrapped at spaces to the terminal's width when stdout is a terminal,
    its continuation lines indented under it (a pipe gets one whole line per row)."""
    rows = [[("" if c is None else str(c)) for c in r] for r in rows]
    lines = _table(headers, rows)
    if not sys.stdout.isatty() or not rows:
        return lines
    indent = sum(max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(headers[:-1]))
    room = max(shutil.get_terminal_size((120, 24)).columns - indent, 20)
    out = lines[:1]
    for line in lines[1:]:
        pieces = textwrap.wrap(line[indent:], room, break_long_words=False, break_on_hyphens=False) or [""]
        out += [(line[:indent] + pieces[0]).rstrip()] + [" " * indent + p for p in pieces[1:]]
    return out


def _count(n: int) -> str:
    """``1,234,567``."""
    return f"{n:,}"


def _short_count(n: int) -> str:
    """``1.23M``, ``46.70B`` (decimal prefixes), or the number itself below 1,000."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _bytes(n: float) -> str:
    """``1.00 GiB``, ``512.00 KiB`` (binary prefixes), or ``123 B``."""
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _spec_error_lines(exc: Any, source: Optional[str]) -> list[str]:
    """``SOURCE: path: message`` per error of a :class:`~modkit.core.errors.SpecError` (path omitted when empty)."""
    src = source or getattr(exc, "source", None)
    lines = []
    for path, message in exc.errors:
        head = ": ".join(p for p in (src, path) if p)
        lines.append(f"{head}: {message}" if head else message)
    return lines
