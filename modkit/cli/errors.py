"""Errors of the ``modkit`` command: :class:`UserError` (a problem with the command's input) and :func:`_report`,
which turns any exception reaching :func:`modkit.cli.main` into one ``modkit: error: ...`` message (exit status 1)."""

from __future__ import annotations

from .output import _err, _spec_error_lines

PROG = "modkit"


class UserError(Exception):
    """A problem with the command's input, reported as ``modkit: error: ...`` with exit status 1."""


def _report(exc: BaseException) -> int:
    """Print ``exc`` as ``modkit: error: ...`` (a spec error: one line per problem) on stderr; returns 1."""
    from modkit.core.errors import ModkitError, SpecError

    if isinstance(exc, SpecError):
        src = exc.source or ""
        what = src if src.startswith("training config") else f"{exc.subject} {src}".strip()
        _err(f"{PROG}: error: invalid {what}")
        for line in _spec_error_lines(exc, None):
            _err("  " + line)
    elif isinstance(exc, UserError):
        _err(f"{PROG}: error: {exc}")
    elif isinstance(exc, FileNotFoundError):
        name = exc.filename
        _err(f"{PROG}: error: " + (f"{name}: no such file" if name else str(exc)))
    elif isinstance(exc, (ModkitError, ValueError)):
        _err(f"{PROG}: error: {exc}")
    elif isinstance(exc, OSError):
        _err(f"{PROG}: error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
    else:
        _err(f"{PROG}: internal error: {type(exc).__name__}: {exc}")
        _err(f"{PROG}: this is a bug in modkit or a plugin; rerun with MODKIT_DEBUG=1 for the traceback")
    return 1
