"""Output helpers of the ``modkit`` command: stdout / stderr lines, aligned tables, counts and byte sizes, and the
lines of a :class:`~modkit.core.errors.SpecError`. Plain functions with no modkit imports (every command
module uses them: ``from modkit.cli import _table, _count``)."""

from __future__ import annotations

import os
import shutil
import sys
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


def _one_line(text: str) -> str:
    """First sentence (or first line) of a description."""
    text = " ".join((text or "").split())
    for sep in (". ", "; "):
        if sep in text:
            text = text.split(sep, 1)[0] + ("." if sep == ". " else "")
            break
    return text


def _fit(line: str) -> str:
    """Truncate to the terminal width when stdout is a terminal (pipes get the full line)."""
    if not sys.stdout.isatty():
        return line
    width = shutil.get_terminal_size((120, 24)).columns
    return line if len(line) <= width else line[: max(width - 1, 10)] + "…"


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
