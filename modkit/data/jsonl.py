"""JSON Lines records read with memory bounded by constants, however long a record is.

Each line of the file is one JSON object; its document is the string in the text field. The file's (decompressed)
bytes are read ``read_bytes`` at a time, never a line at a time:

* a line of at most ``line_bytes`` bytes is parsed whole with Python's :func:`json.loads` (the common case: fast);
* a longer line is parsed as it streams in: the object's fields one after the other, every value checked as JSON
  and skipped without being kept, except the text field's string, which is decoded a bounded slice at a time (a
  slice never ends inside an escape, a UTF-16 surrogate pair or a UTF-8 character) and cut into pieces
  (:class:`~modkit.data.cutting.TextCutter`). Memory is then about ``read_bytes`` plus ``piece_chars`` characters.

Both ways accept the same JSON (numbers are checked but never converted, so an unused field may hold an integer of
any length) and give the same pieces. Both refuse, naming the file, the line and the value: a line that is not one
JSON object, the literals ``NaN``, ``Infinity`` and ``-Infinity`` (Python's :func:`json.loads` takes them, but they
are not JSON, RFC 8259 section 6, and other readers refuse the file), a text field given twice, a text
field that is not a string, a text with a lone UTF-16 surrogate (``"\\ud800"`` without its pair: no UTF-8 text holds
one), nesting deeper than :data:`MAX_DEPTH`, bytes that are not UTF-8.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring
from typing import Callable, Iterator, Optional

from modkit.core.errors import DataError
from .cutting import TextCutter, split_text

#: Deepest nesting of arrays and objects accepted in a record (Python's parser stops near 1,000 as well).
MAX_DEPTH = 1000

_WS = re.compile(rb"[ \t\r]*")
_DIGITS = re.compile(rb"[0-9]*")
_SURROGATE = re.compile("[\ud800-\udfff]")
_NL, _QUOTE, _BACKSLASH = 0x0A, 0x22, 0x5C
_KINDS = {ord('"'): "string", ord("{"): "object", ord("["): "list", ord("t"): "boolean", ord("f"): "boolean"}
_KINDS.update({ord("n"): "null", **{c: "number" for c in b"-0123456789NI"}})

#: A piece of a document: ``(text, line, starts, ends, offset)`` (offset: characters of the document before it).
Part = tuple


def _kind(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {dict: "object", list: "list", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


def _a(kind: str) -> str:
    """``kind`` with its article: ``a list``, ``an object``."""
    return ("an " if kind[:1] in "aeiou" else "a ") + kind


def _near(text: str, at: int) -> str:
    """The text around character ``at`` (at most 12 on each side), quoted: the value an error points at."""
    return repr(text[max(at - 12, 0) : at + 12])


def _json_reason(msg: str, text: str, at: int) -> str:
    """Python's JSON error text made a phrase (``Invalid control character at`` ends with "at"), with the
    character it points at when that is a control character."""
    msg = msg.removesuffix(" at")
    if "control character" in msg and at < len(text):
        msg += f" {text[at]!r} (write it as a \\u{ord(text[at]):04x} escape)"
    return msg


def _hint(path) -> str:
    """What a ``.json`` file is read as (a file of one JSON document is a common mistake)."""
    name = path.name.lower()
    if name.endswith((".json", ".json.gz", ".json.zst", ".json.zstd")):
        return (
            "; a .json file is read as JSON Lines (one object per line); for a file that holds one JSON array of "
            f"records, write them one per line first: `jq -c '.[]' {path.name} > {path.name.split('.')[0]}.jsonl`"
        )
    return ""


def _lone_surrogate(where: str, field: str, text: str, offset: int) -> None:
    m = _SURROGATE.search(text)
    if m is not None:
        ch = m.group()
        raise DataError(
            f"{where}: field {field!r} holds a lone surrogate {ch!r} (U+{ord(ch):04X}) at character {offset + m.start()}"
            " of its text: a JSON \\ud800-\\udfff escape without its pair is no character of UTF-8 text; fix the record"
        )


def _parts(where: str, field: str, text: str, line: int, limit: int) -> Iterator[Part]:
    """The pieces of a whole document's text (checked for lone surrogates)."""
    _lone_surrogate(where, field, text, 0)
    pieces = split_text(text, limit)
    offset = 0
    for i, piece in enumerate(pieces):
        yield piece, line, i == 0, i == len(pieces) - 1, offset
        offset += len(piece)


class _Bytes:
    """The decompressed bytes of a file, read ``read_bytes`` at a time: ``buf[pos:]`` is unread; ``base`` is the
    stream offset of ``buf[0]``, ``line_start`` that of the current line."""

    def __init__(self, read: Callable[[int], bytes], read_bytes: int):
        self.read, self.read_bytes = read, read_bytes
        self.buf, self.pos, self.base, self.line_start, self.eof = b"", 0, 0, 0, False

    def more(self) -> bool:
        """Read once more (keeping ``buf[pos:]``, which moves to the front); False at the end of the file."""
        if self.eof:
            return False
        data = self.read(self.read_bytes)
        if not data:
            self.eof = True
            return False
        self.base += self.pos
        self.buf, self.pos = self.buf[self.pos :] + data, 0
        return True

    def column(self, at: Optional[int] = None) -> int:
        """1-based byte of the current line at buffer index ``at`` (default ``pos``)."""
        return self.base + (self.pos if at is None else at) - self.line_start + 1


def records(
    src, read: Callable[[int], bytes], text_field: str, *, read_bytes: int, line_bytes: int, piece_chars: int
) -> Iterator[Part]:
    """The pieces of every record of a JSON Lines stream (see the module docstring).

    Raises:
        DataError: as listed in the module docstring, with ``path:line``.
    """
    r = _Bytes(read, read_bytes)
    line = 0
    while True:
        scan = r.pos
        nl = r.buf.find(b"\n", scan)
        while nl < 0 and len(r.buf) - r.pos <= line_bytes:
            scan, start = len(r.buf), r.pos
            if not r.more():
                break
            nl = r.buf.find(b"\n", scan - start)
        if r.pos >= len(r.buf) and r.eof:
            return
        line += 1
        r.line_start = r.base + r.pos
        end = nl if nl >= 0 else len(r.buf)
        if end - r.pos <= line_bytes:
            text, r.pos = r.buf[r.pos : end], end + 1
            yield from _whole(src, line, text, text_field, piece_chars)
        else:
            yield from _Streamed(r, src, line, text_field, piece_chars).parts()


def _whole(src, line: int, raw: bytes, field: str, limit: int) -> Iterator[Part]:
    """The pieces of one line parsed whole with :func:`json.loads`."""
    if not raw.strip():
        return
    where = f"{src.path}:{line}"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); convert the file to UTF-8"
        ) from None
    repeated = [False]

    def constant(name: str):
        raise DataError(_not_json_literal(where, name, field, src.path))

    def pairs(items: list) -> dict:
        made = dict(items)  # the outermost object is made last
        repeated[0] = len(made) < len(items) and sum(k == field for k, _ in items) > 1
        return made

    try:
        record = json.loads(text, object_pairs_hook=pairs, parse_int=lambda s: 0, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise DataError(
            f"{where}: not valid JSON ({_json_reason(exc.msg, text, exc.pos)} at column {exc.colno}, near "
            f"{_near(text, exc.pos)}); each line of a .jsonl file must be one JSON "
            f'object, e.g. {{"{field}": "..."}}{_hint(src.path)}'
        ) from None
    except RecursionError:
        raise DataError(f"{where}: not valid JSON here: nested more than {MAX_DEPTH:,} levels deep") from None
    if not isinstance(record, dict):
        raise DataError(
            f"{where}: {_a('JSON ' + _kind(record))}, not an object with a {field!r} field{_hint(src.path)}"
        )
    if repeated[0]:
        raise DataError(f"{where}: field {field!r} given twice in the record; keep one")
    if field not in record:
        raise _no_field(where, field, list(record))
    value = record[field]
    if not isinstance(value, str):
        raise DataError(f"{where}: field {field!r} is {_a(_kind(value))}, not a string of text")
    yield from _parts(where, field, value, line, limit)


def _not_json_literal(where: str, name: str, field: str, path) -> str:
    """The message refusing a ``NaN`` / ``Infinity`` / ``-Infinity`` literal (not JSON: RFC 8259 section 6)."""
    return (
        f"{where}: not valid JSON (the literal {name} is not JSON: RFC 8259 has no NaN or Infinity); write it as "
        f'null or a string such as "{name}", so that each line of a .jsonl file is one JSON object, e.g. '
        f'{{"{field}": "..."}}{_hint(path)}'
    )


def _no_field(where: str, field: str, names: list) -> DataError:
    fields = ", ".join(repr(k) for k in names[:8]) or "none"
    return DataError(
        f"{where}: no field {field!r} (fields: {fields}); name the field that holds the text with --text-field "
        "(text_field=...)"
    )


class _Streamed:
    """One line too long to hold, parsed as it streams in (the object's fields; the text field's string in pieces)."""

    def __init__(self, r: _Bytes, src, line: int, field: str, limit: int):
        self.r, self.src, self.line, self.field, self.limit = r, src, line, field, limit
        self.where = f"{src.path}:{line}"

    def invalid(self, what: str) -> DataError:
        """A JSON syntax error at the current byte of the line."""
        return DataError(
            f"{self.where}: not valid JSON ({what} at byte {self.r.column():,} of the line, near {self.near()}); each "
            "line of a .jsonl "
            f'file must be one JSON object, e.g. {{"{self.field}": "..."}}{_hint(self.src.path)}'
        )

    def near(self) -> str:
        """The bytes around the cursor, quoted (as text; bytes that are not UTF-8 replaced)."""
        r = self.r
        return repr(r.buf[max(r.pos - 12, 0) : r.pos + 12].decode("utf-8", "replace"))

    def ws(self) -> Optional[int]:
        """Skip spaces, tabs and CRs; the next byte (``None`` at the end of the file)."""
        r = self.r
        while True:
            r.pos = _WS.match(r.buf, r.pos).end()
            if r.pos < len(r.buf):
                return r.buf[r.pos]
            if not r.more():
                return None

    def next(self) -> int:
        """The next byte after whitespace, inside the record (the line must go on)."""
        c = self.ws()
        if c is None or c == _NL:
            raise self.invalid("the line ends inside the record")
        return c

    def parts(self) -> Iterator[Part]:
        """The pieces of the record's text, after checking the record to the end of its line."""
        c = self.ws()
        if c is None or c == _NL:  # a line of blanks
            self.r.pos += c is not None
            return
        if c != ord("{"):
            raise DataError(
                f"{self.where}: {_a('JSON ' + _KINDS.get(c, 'value'))}, not an object with a {self.field!r} field"
                f"{_hint(self.src.path)}"
            )
        self.r.pos += 1
        seen, names, c = False, [], self.next()
        while c != ord("}"):
            key = self.key()
            if key == self.field:
                if seen:
                    raise DataError(f"{self.where}: field {self.field!r} given twice in the record; keep one")
                seen, c = True, self.next()
                if c != _QUOTE:
                    raise DataError(
                        f"{self.where}: field {self.field!r} is {_a(_KINDS.get(c, 'value'))}, not a string of text"
                    )
                yield from self.text()
            else:
                names.append(key)
                self.value()
            c = self.next()
            if c == ord(","):
                self.r.pos += 1
                c = self.next()
                if c == ord("}"):
                    raise self.invalid("a comma before '}'")
            elif c != ord("}"):
                raise self.invalid("expected ',' or '}' after a value")
        self.r.pos += 1
        c = self.ws()
        if c is not None and c != _NL:
            raise self.invalid("text after the object")
        self.r.pos += c is not None
        if not seen:
            raise _no_field(self.where, self.field, names)

    def key(self) -> str:
        """A field name and its colon; names longer than the text field's are kept shortened (for messages)."""
        if self.r.buf[self.r.pos] != _QUOTE:
            raise self.invalid("expected a field name in double quotes")
        keep, name = max(len(self.field) + 1, 40), ""
        for chunk in self.string():
            name += chunk[: keep - len(name)]
        if self.next() != ord(":"):
            raise self.invalid("expected ':' after the field name")
        self.r.pos += 1
        return name if len(name) < keep else name + "..."

    def text(self) -> Iterator[Part]:
        """The pieces of the text field's string (the cursor at its opening quote)."""
        cutter, first = TextCutter(self.limit), True
        for chunk in self.string():
            _lone_surrogate(self.where, self.field, chunk, cutter.offset + len(cutter.buf))
            for piece, offset in cutter.feed(chunk):
                yield piece, self.line, first, False, offset
                first = False
        piece, offset = cutter.finish()
        yield piece, self.line, first, True, offset

    def string(self) -> Iterator[str]:
        """The decoded slices of the JSON string at the cursor (its opening quote), read to its closing quote."""
        r = self.r
        r.pos += 1
        start = scan = r.pos
        while True:
            q = r.buf.find(b'"', scan)
            if q >= 0:
                if _run(r.buf, start, q) % 2:  # an escaped quote
                    scan = q + 1
                    continue
                if q > start:
                    yield self.decode(start, q)
                r.pos = q + 1
                return
            end = _safe_end(r.buf, start, len(r.buf))
            if end > start:
                yield self.decode(start, end)
            r.pos, kept = end, len(r.buf) - end
            if not r.more():
                raise self.invalid("the file ends inside a string")
            start, scan = r.pos, r.pos + kept

    def decode(self, start: int, end: int) -> str:
        """The text of the raw string bytes ``buf[start:end]`` (whole escapes and characters)."""
        raw = self.r.buf[start:end]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            at = self.r.column(start + exc.start)
            raise DataError(
                f"{self.where}: not UTF-8 text ({exc.reason} at byte {at:,} of the line); convert the file to UTF-8"
            ) from None
        try:
            return scanstring(text + '"', 0, True)[0]
        except json.JSONDecodeError as exc:
            self.r.pos = start + len(text[: exc.pos].encode("utf-8"))
            at = text[exc.pos : exc.pos + 1]
            what = "the line ends inside a string" if at == "\n" else _json_reason(exc.msg, text, exc.pos)
            raise self.invalid(what) from None

    def value(self) -> None:
        """Check and skip one JSON value (strings, numbers, literals, nested arrays and objects)."""
        r, stack = self.r, []
        while True:
            c = self.next()
            if c in b"{[":
                if len(stack) == MAX_DEPTH:
                    raise DataError(f"{self.where}: not valid JSON here: nested more than {MAX_DEPTH:,} levels deep")
                stack.append(b"}" if c == ord("{") else b"]")
                r.pos += 1
                c = self.next()
                if c == stack[-1][0]:
                    r.pos += 1
                    stack.pop()
                elif stack[-1] == b"}":
                    self.key()
                    continue
                else:
                    continue
            elif c == _QUOTE:
                for _ in self.string():
                    pass
            else:
                self.scalar(c)
            while stack:  # after a value: a comma (then the next value) or the end of containers
                c = self.next()
                if c == ord(","):
                    r.pos += 1
                    if stack[-1] == b"}":
                        self.next()
                        self.key()
                    break
                if c != stack[-1][0]:
                    raise self.invalid(f"expected ',' or '{stack[-1].decode()}'")
                r.pos += 1
                stack.pop()
            if not stack:
                return

    def scalar(self, c: int) -> None:
        """Skip a number or a literal (``true``, ``false``, ``null``); refuse ``NaN`` / ``Infinity`` / ``-Infinity``."""
        r = self.r
        for word in (b"true", b"false", b"null", b"NaN", b"Infinity", b"-Infinity"):
            if c == word[0] and (c != ord("-") or self.peek(2) == b"-I"):
                if self.peek(len(word)) != word:
                    raise self.invalid(f"expected {word.decode()}")
                if word in (b"NaN", b"Infinity", b"-Infinity"):
                    raise DataError(_not_json_literal(self.where, word.decode(), self.field, self.src.path))
                r.pos += len(word)
                return
        if c != ord("-") and not 0x30 <= c <= 0x39:
            raise self.invalid("expected a value")
        r.pos += c == ord("-")
        first = self.peek(1)
        count = self.digits()
        if count == 0 or (first == b"0" and count > 1):
            raise self.invalid("a number without digits, or with a leading zero")
        if self.peek(1) == b".":
            r.pos += 1
            if self.digits() == 0:
                raise self.invalid("a number without digits after its '.'")
        if self.peek(1) in (b"e", b"E"):
            r.pos += 1
            sign = self.peek(1) in (b"+", b"-")  # (peek may read more, which moves pos)
            r.pos += sign
            if self.digits() == 0:
                raise self.invalid("a number without digits in its exponent")

    def peek(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end of the file), not consumed."""
        r = self.r
        while len(r.buf) - r.pos < n and r.more():
            pass
        return r.buf[r.pos : r.pos + n]

    def digits(self) -> int:
        """Skip a run of digits of any length (read as it comes); how many there were."""
        r, count = self.r, 0
        while True:
            end = _DIGITS.match(r.buf, r.pos).end()
            count, r.pos = count + end - r.pos, end
            if r.pos < len(r.buf) or not r.more():
                return count


def _run(buf: bytes, start: int, end: int) -> int:
    """How many backslashes stand right before ``end`` (not before ``start``)."""
    j = end
    while j > start and buf[j - 1] == _BACKSLASH:
        j -= 1
    return end - j


def _real_escape(buf: bytes, start: int, p: int) -> bool:
    """Whether the backslash at ``p`` starts an escape (``start`` is the start of an escape or of the string)."""
    return _run(buf, start, p) % 2 == 0


def _safe_end(buf: bytes, start: int, end: int) -> int:
    """The last index ``<= end`` where the raw string bytes ``buf[start:]`` can be cut: not inside an escape (nor
    between the two escapes of a surrogate pair) and not inside a UTF-8 character."""
    if _run(buf, start, end) % 2:  # a backslash whose escaped character is not read yet
        end -= 1
    p = buf.find(b"\\u", max(start, end - 11), end)
    while p >= 0:
        if _real_escape(buf, start, p):
            need = p + 6
            if need <= end and buf[p + 2 : p + 4].lower() in (b"d8", b"d9", b"da", b"db"):
                need = p + 12  # a high surrogate: keep its pair with it
            if need > end:
                return _utf8_end(buf, start, p)
            p = buf.find(b"\\u", p + 6, end)
        else:
            p = buf.find(b"\\u", p + 1, end)
    return _utf8_end(buf, start, end)


def _utf8_end(buf: bytes, start: int, end: int) -> int:
    """``end``, moved before a UTF-8 character that ``buf[:end]`` holds only the first bytes of."""
    for back in (1, 2, 3):
        if end - back < start:
            break
        b = buf[end - back]
        if b < 0x80:
            break
        if b >= 0xC0:
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return end - back if back < need else end
    return end
