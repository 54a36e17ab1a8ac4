"""Errors of the ``modkit`` command: :class:`UserError` (a problem with the command's input) and :func:`_report`,
which turns any exception reaching :func:`modkit.cli.main` into a ``modkit: error: ...`` message (exit status 1).

Two kinds of error reach the reporter, and they read differently:

* **modkit's own** (:class:`~modkit.core.errors.ModkitError` and its subclasses, :class:`UserError`, a missing file,
  and a ``ValueError`` raised by a ``raise`` statement of modkit or a plugin): their message names the file, the line
  or row, or the field, and the value; it is printed as ``modkit: error: MESSAGE``.
* **foreign**: anything Python or a library raised that modkit did not turn into such a message
  (``Corrupt snappy compressed data.``, ``'utf-8' codec can't encode ...``, Python's integer digit limit,
  ``embedded null byte``). It names no file or field, so it is never printed as if it did: it is marked
  ``modkit: internal error``, with its exception type, what was being read when the code that raised it said so
  (:func:`modkit.core.errors.reading`), the command line, and a request to report it.
"""

from __future__ import annotations

import shlex
import traceback
from pathlib import Path
from typing import Optional, Sequence

from .output import _err, _spec_error_lines

PROG = "modkit"

#: the folders of modkit's own code: a ``ValueError`` raised by a ``raise`` statement in them is modkit's message
_OWN_CODE = tuple(str(Path(__file__).resolve().parents[2] / name) + "/" for name in ("modkit", "modkit_plugins"))


class UserError(Exception):
    """A problem with the command's input, reported as ``modkit: error: ...`` with exit status 1."""


def _safe(text: str) -> str:
    """``text`` printable on any stderr: characters UTF-8 cannot encode (a lone surrogate of an undecodable file
    name) written as escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _raised_by_modkit(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by a ``raise`` statement in modkit's own code (its message is modkit's), rather
    than by Python or a library, or by a builtin called from modkit's code (``int(text)``, ``text.encode()``)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return str(Path(last.filename).resolve()).startswith(_OWN_CODE) and (last.line or "").lstrip().startswith("raise")


def is_own(exc: BaseException) -> bool:
    """Whether ``exc`` is one of modkit's own errors, whose message names what it is about (see the module
    docstring); anything else is reported as an internal error."""
    from modkit.core.errors import ModkitError

    if isinstance(exc, (ModkitError, UserError, FileNotFoundError)):
        return True
    return isinstance(exc, ValueError) and not isinstance(exc, UnicodeError) and _raised_by_modkit(exc)


def close_paths(text: str, n: int = 3) -> list[str]:
    """Existing paths a missing path ``text`` probably meant (``specs/tiny-lama.json`` -> ``specs/tiny-llama.json``):
    the close spellings (:class:`difflib.SequenceMatcher` ratio at least 0.75 and within 0.05 of the best) among the entries of its folder, the
    nearest existing folder above it when that folder is missing too; at most ``n``, written as ``text`` was
    (relative stays relative)."""
    import difflib
    import os

    head, tail = os.path.split(text.rstrip("/"))
    if not tail:
        return []
    folder = head or "."
    if not os.path.isdir(folder):
        parents = close_paths(head, 1) if head else []
        if not parents or not os.path.isdir(parents[0]):
            return []
        folder = head = parents[0]
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    scored = sorted(((difflib.SequenceMatcher(None, tail, f).ratio(), f) for f in names), reverse=True)
    floor = max(0.75, scored[0][0] - 0.05) if scored else 1.0
    found = [f for r, f in scored if r >= floor][:n]
    return [os.path.join(head, f) if head else f for f in found]


def _report(exc: BaseException, argv: Optional[Sequence[str]] = None) -> int:
    """Print ``exc`` on stderr (a spec error: one line per problem; a foreign error: marked internal, with its type,
    what was being read, and ``argv``, the command's arguments); returns 1."""
    from modkit.core.errors import SpecError

    if isinstance(exc, SpecError):
        src = exc.source or ""
        what = src if src.startswith("training config") else f"{exc.subject} {src}".strip()
        _err(_safe(f"{PROG}: error: invalid {what}"))
        for line in _spec_error_lines(exc, None):
            _err(_safe("  " + line))
    elif isinstance(exc, UserError):
        _err(_safe(f"{PROG}: error: {exc}"))
    elif isinstance(exc, FileNotFoundError):
        name = exc.filename
        text = f"{name}: no such file" if name else str(exc)
        missing = name or (str(exc).rsplit(": no such file", 1)[0] if ": no such file" in str(exc) else None)
        close = close_paths(str(missing)) if missing else []
        hint = f"; did you mean {' or '.join(close)}?" if close and "did you mean" not in text else ""
        _err(_safe(f"{PROG}: error: {text}{hint}"))
    elif is_own(exc):
        _err(_safe(f"{PROG}: error: {exc}"))
    elif isinstance(exc, OSError) and not isinstance(exc, UnicodeError) and exc.filename:
        _err(_safe(f"{PROG}: error: {exc.filename}: {exc.strerror or exc}"))
    else:
        _internal(exc, argv)
    return 1


def _internal(exc: BaseException, argv: Optional[Sequence[str]]) -> None:
    """The lines of a foreign error: type and text, the notes saying what was being read, the command, the hint."""
    _err(_safe(f"{PROG}: internal error: {type(exc).__name__}: {exc}"))
    for note in getattr(exc, "__notes__", None) or ():
        _err(_safe(f"{PROG}:   {note}"))
    if argv:
        _err(_safe(f"{PROG}:   in: {shlex.join([PROG, *argv])}"))
    _err(
        f"{PROG}: this error comes from Python or a library, not from modkit's checks, so it may name no file or "
        "field: a bug in modkit or a plugin. Please report it with the command above; rerun with MODKIT_DEBUG=1 "
        "for the traceback"
    )
