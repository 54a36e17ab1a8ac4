"""Reading JSON input strictly: regular files of bounded size, UTF-8 text, no duplicate keys, bounded nesting.

Every file modkit reads as JSON goes through :func:`read_json_file` (specs, Hugging Face ``config.json``,
safetensors indexes) and every JSON string it receives through :func:`parse_json` (specs passed as text, the spec
and config stored in safetensors metadata). Problems come back as one :class:`JSONInputError` listing
``(path, message)`` pairs, ``path`` being the JSON path as :mod:`modkit.core.validation` prints it (``block.attention``,
``overrides[1]``, ``block["a.b"]``; empty for the whole document); callers turn it into a :class:`~modkit.core.errors.SpecError` or
:class:`~modkit.core.errors.CheckpointError` naming their file.

What is refused, and why:

* a path holding a NUL byte, a missing file, a folder, and any file that is not a regular file: a FIFO would
  block forever, ``/dev/zero`` would be read until memory runs out;
* files over :data:`~modkit.core.limits.MAX_JSON_BYTES` (16 MiB; a spec is a few KiB);
* text that is not UTF-8 (RFC 8259 section 8.1): binary data, UTF-16/32 (named as such); a UTF-8 byte-order
  mark is skipped;
* malformed JSON (line and column), integers longer than Python converts (4,300 digits), nesting deeper than
  :data:`~modkit.core.limits.MAX_JSON_DEPTH`;
* duplicate keys in an object (RFC 8259 section 4 leaves their meaning undefined; Python keeps the last one
  silently): each is named with its path.

``NaN`` and ``Infinity`` literals parse (they are common in exported configs); numeric fields refuse
non-finite values when validated, naming the field.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterable, Union

from modkit.core.errors import ModkitError
from modkit.core.limits import MAX_JSON_BYTES, MAX_JSON_DEPTH
from modkit.core.validation import join_path, json_value


class JSONInputError(ModkitError, ValueError):
    """A JSON file or string could not be read; ``errors`` lists ``(path, message)``, ``source`` names the file.

    ``document`` is the parsed document when the text parsed and its only problems are duplicate keys (the last
    value of each kept, as Python does), so that a caller can validate it too and report every problem at once;
    ``None`` otherwise.
    """

    def __init__(self, errors: Iterable[tuple[str, str]], source: str | None = None, *, document: Any = None):
        self.errors = [(str(p), str(m)) for p, m in errors]
        self.source = source
        self.document = document
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(f"{p + ': ' if p else ''}{m}" for p, m in self.errors))


class _Pairs(dict):
    """An object whose key list had duplicates (``dups``); built by :func:`_pairs`."""

    dups: list[str]


def _pairs(items: list[tuple[str, Any]]) -> dict:
    out = {}
    dups = []
    for k, v in items:
        if k in out:
            dups.append(k)
        out[k] = v
    if dups:
        flagged = _Pairs(out)
        flagged.dups = dups
        return flagged
    return out


class _LongInt(int):
    """Placeholder for an integer literal longer than Python converts (``sys.get_int_max_str_digits``)."""

    digits: int


def _parse_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # over the int_max_str_digits limit (4,300 digits by default)
        out = _LongInt(0)
        out.digits = len(text.lstrip("-"))
        return out


def _check_tree(doc: Any) -> tuple[list[tuple[str, str]], bool]:
    """Duplicate keys, excessive depth and overlong integers, walked without recursion; ``(errors, only
    duplicate keys)``. A value nested too deeply is named at its top-level key, with the start of the value."""
    errors: list[tuple[str, str]] = []
    dups_only = True
    stack = [(doc, "", 1, "", doc)]
    while stack:
        node, path, depth, top, top_value = stack.pop()
        if isinstance(node, _LongInt):
            dups_only = False
            errors.append(
                (path, f"an integer of {node.digits:,} digits; no value in a spec or config needs more than a few")
            )
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            dups_only = False
            errors.append(
                (
                    top,
                    f"nested deeper than {MAX_JSON_DEPTH} levels of objects and arrays, modkit's bound "
                    f"(modkit.core.limits.MAX_JSON_DEPTH; a spec nests about 6); got {json_value(top_value, 40)}",
                )
            )
            continue
        if isinstance(node, _Pairs):
            for k in dict.fromkeys(node.dups):
                errors.append((join_path(path, k), f"duplicate key {k!r} in one object; give each key once"))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            if isinstance(v, (dict, list, _LongInt)):
                sub = join_path(path, k)
                stack.append((v, sub, depth + 1, top or sub, top_value if top else v))
    errors.sort()
    return errors, dups_only


def check_document(doc: Any, *, source: str | None = None) -> None:
    """Apply the tree checks of :func:`parse_json` to a document given as Python objects (a dict passed to
    :func:`modkit.load_spec` or :func:`modkit.from_hf_config`): nesting at most :data:`~modkit.core.limits.MAX_JSON_DEPTH`
    levels deep. A value nested deeper (a list nested 10,000 levels, which no spec or config needs) is named at its
    path before anything else reads it, so that no validator or message recurses into it. Walked without recursion.

    Raises:
        JSONInputError: naming the path of each too-deep value.
    """
    errors, _ = _check_tree(doc)
    if errors:
        raise JSONInputError(errors, source)


def _syntax_error(text: str, exc: json.JSONDecodeError) -> str:
    """The message of a JSON syntax error; a trailing comma (``[1, 2,]``, ``{"a": 1,}``: valid in JavaScript and
    Python, not in JSON) is named at the comma, where the decoder would point at the next token."""
    pos = exc.pos
    if pos < len(text) and text[pos] in "}]":
        before = text[:pos].rstrip()
        if before.endswith(","):
            comma = len(before) - 1
            line = text.count("\n", 0, comma) + 1
            column = comma - (text.rfind("\n", 0, comma) + 1) + 1
            return f"not valid JSON: trailing comma after the last item at line {line}, column {column}: remove it"
    return f"not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"


def parse_json(text: Union[str, bytes], *, source: str | None = None) -> Any:
    """Parse JSON text strictly (see the module docstring).

    Raises:
        JSONInputError: with the path and message of every problem (duplicate keys, depth, syntax, encoding); a
            trailing comma is named at the comma.
    """
    if isinstance(text, (bytes, bytearray)):
        text = decode_text(bytes(text), source=source)
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_int=_parse_int)
    except json.JSONDecodeError as exc:
        what = "empty input, not JSON" if not text.strip() else _syntax_error(text, exc)
        raise JSONInputError([("", what)], source) from None
    except RecursionError:
        raise JSONInputError(
            [("", f"nested too deeply to parse (at most {MAX_JSON_DEPTH} levels are accepted)")], source
        ) from None
    errors, dups_only = _check_tree(doc)
    if errors:
        raise JSONInputError(errors, source, document=doc if dups_only else None)
    return doc


def decode_text(data: bytes, *, source: str | None = None) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped).

    Raises:
        JSONInputError: UTF-16/UTF-32 text (named as such), or bytes that are not UTF-8 at all.
    """
    boms = {b"\xff\xfe\x00\x00": "UTF-32", b"\x00\x00\xfe\xff": "UTF-32", b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}
    for bom, name in boms.items():
        if data.startswith(bom):
            raise JSONInputError([("", f"the text is encoded as {name}; save it as UTF-8")], source)
    if b"\x00" in data[:4] and data.strip(b"\x00"):  # JSON starts with ASCII: zero bytes there mean UTF-16/32
        raise JSONInputError(
            [("", "the text looks like UTF-16 or UTF-32 (zero bytes between characters); save it as UTF-8")], source
        )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise JSONInputError(
            [("", f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); is it a binary file?")], source
        ) from None


def check_regular_file(path: Union[str, Path], *, max_bytes: int | None = None) -> Path:
    """``path`` as a :class:`Path` after checking it names an existing regular file of at most ``max_bytes``.

    Raises:
        JSONInputError: a NUL byte in the path, no such file, a folder, a FIFO, a device or another special file,
            or a file over ``max_bytes``.
    """
    text = os.fspath(path)
    if "\x00" in str(text):
        raise JSONInputError([("", "the path contains a NUL byte")], repr(str(text)))
    p = Path(text)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise JSONInputError([("", "no such file")], str(p)) from None
    except OSError as exc:
        raise JSONInputError([("", f"cannot read: {exc.strerror or exc}")], str(p)) from None
    if stat.S_ISDIR(st.st_mode):
        raise JSONInputError([("", "is a folder, not a file")], str(p))
    if not stat.S_ISREG(st.st_mode):
        kind = (
            "a FIFO"
            if stat.S_ISFIFO(st.st_mode)
            else "a device"
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
            else "a socket"
            if stat.S_ISSOCK(st.st_mode)
            else "not a regular file"
        )
        raise JSONInputError([("", f"is {kind}, not a regular file; modkit reads only regular files")], str(p))
    if max_bytes is not None and st.st_size > max_bytes:
        raise JSONInputError(
            [("", f"is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for this kind of file")], str(p)
        )
    return p


def read_json_file(path: Union[str, Path], *, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read and parse the JSON file ``path`` strictly (regular file, size bound, UTF-8, no duplicate keys).

    Raises:
        JSONInputError: naming the file, with every problem found.
    """
    p = check_regular_file(path, max_bytes=max_bytes)
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise JSONInputError([("", f"cannot read: {exc.strerror or exc}")], str(p)) from None
    if len(data) > max_bytes:
        raise JSONInputError([("", f"is over the {max_bytes:,}-byte limit for this kind of file")], str(p))
    return parse_json(data, source=str(p))
