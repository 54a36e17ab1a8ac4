"""Markdown building blocks shared by every page generator: text escaping, tables, number formats, page paths
and relative links between generated pages, and :class:`DocsError`."""

from __future__ import annotations

import re
from typing import Any, Iterable


class DocsError(Exception):
    """The generated documentation cannot be built (e.g. a component's example config does not validate)."""


def _rst_to_md(text: str) -> str:
    """Sphinx-flavoured docstring text to Markdown: ``:class:`~a.b.C``` -> ```C```, ````x```` -> ```x```."""

    def role(m: re.Match) -> str:
        target = m.group(1)
        return f"`{target[1:].split('.')[-1]}`" if target.startswith("~") else f"`{target}`"

    text = re.sub(r":[a-z]+:`([^`]+)`", role, text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


#: Spans that text helpers leave untouched: Markdown links, code spans and arithmatex math (``$$...$$``, ``$...$``
#: with no space just inside the dollars, ``\(...\)``).
_PROTECTED = r"\[[^\]\n]*\]\([^)\s]*\)|`[^`]*`|\$\$.+?\$\$|\$[^$\s](?:[^$\n]*?[^$\s])?\$|\\\(.+?\\\)"


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: one line, ``|`` and braces escaped outside code spans and math (inside
    them the table extension already ignores ``|``, an escape would show, and math needs its braces)."""
    parts = re.split(f"({_PROTECTED})", " ".join(str(text).split()))
    out = []
    for i, p in enumerate(parts):
        if i % 2 == 0:  # braces would read as attribute lists (attr_list) at a cell's end
            p = p.replace("|", "\\|").replace("{", "&#123;").replace("}", "&#125;")
        out.append(p)
    return "".join(out)


#: Reference forms that are links without doubt: an arXiv identifier, a GitHub repository written with its host.
_REFERENCE = re.compile(
    r"(?P<arxiv>\barXiv:(?P<id>\d{4}\.\d{4,5}(?:v\d+)?))"
    r"|(?P<gh>\b(?:https?://)?github\.com/(?P<repo>[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9_.-]*[A-Za-z0-9_-]))"
)


def _link_references(text: str) -> str:
    """Link the references in ``text`` that cannot be anything else: ``arXiv:NNNN.NNNNN`` and
    ``github.com/owner/repo`` (with or without ``https://``).

    Nothing else is guessed: a parenthesised ``(a/b)`` is as likely a ratio or an exponent (``base^(-2i/d)``) as a
    repository, so it stays text. Existing links, code spans and math are left alone.
    """

    def link(m: re.Match) -> str:
        if m.group("arxiv"):
            return f"[arXiv:{m.group('id')}](https://arxiv.org/abs/{m.group('id')})"
        return f"[{m.group('repo')}](https://github.com/{m.group('repo')})"

    parts = re.split(f"({_PROTECTED})", text)
    return "".join(p if i % 2 else _REFERENCE.sub(link, p) for i, p in enumerate(parts))


def _count(n: int) -> str:
    return f"{n:,}"


def _short(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suffix}"
    return f"{n:g}"


def _bytes(n: float) -> str:
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _first_sentence(text: str) -> str:
    """The text up to the first full stop followed by a space or the end, outside inline code (```modkit compare
    SPEC... --train CONFIG``` is not a sentence end), whitespace collapsed."""
    text = " ".join((text or "").split())
    masked = re.sub(r"(`+)(.+?)\1", lambda m: "x" * len(m.group(0)), text)  # code spans, same length
    m = re.search(r"\.(\s|$)", masked)
    return text[: m.start() + 1] if m else text


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]], align: str = "") -> str:
    """A Markdown table; ``align`` is one letter per column (``l``, ``r``, ``c``), default left."""
    headers = list(headers)
    marks = {"l": "---", "r": "--:", "c": ":-:"}
    sep = [marks.get(align[i] if i < len(align) else "l", "---") for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _mermaid_text(text: str) -> str:
    """A label safe inside ``["..."]`` of a Mermaid node."""
    return str(text).replace('"', "#quot;").replace("[", "#91;").replace("]", "#93;")


def _layer_ranges(indices: list[int]) -> str:
    """``0-3, 5, 7-9`` (or ``every 2nd from 1`` style when strided)."""
    if not indices:
        return ""
    if len(indices) > 2:
        step = indices[1] - indices[0]
        if step > 1 and all(b - a == step for a, b in zip(indices, indices[1:])):
            return f"{indices[0]}, {indices[1]}, …, {indices[-1]} (every {step})"
    out, start, prev = [], indices[0], indices[0]
    for i in indices[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}–{prev}" if prev > start else str(start))
        if i is not None:
            start = prev = i
    return ", ".join(out)


def component_path(kind: str, type_: str) -> str:
    """Docs-relative path of a component's page."""
    return f"components/{kind}/{type_}.md"


def kind_path(kind: str) -> str:
    """Docs-relative path of a kind's index page."""
    return f"components/{kind}/index.md"


def gallery_path(stem: str) -> str:
    """Docs-relative path of a spec's gallery page."""
    return f"gallery/{stem}.md"


def _rel(from_page: str, to_page: str) -> str:
    """Relative link from one docs page to another (both docs-relative paths)."""
    import posixpath

    return posixpath.relpath(to_page, posixpath.dirname(from_page) or ".")


#: Front matter of wide index pages: material hides the table of contents, leaving the width to the tables.
_HIDE_TOC = "---\nhide:\n  - toc\n---\n"


def _resolve_links(text: str, page: str) -> str:
    """Replace ``{to:PATH}`` placeholders by links relative to ``page``."""
    return re.sub(r"\{to:([^}]+)\}", lambda m: _rel(page, m.group(1)), text)
