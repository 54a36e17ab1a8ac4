"""pydantic validation errors as ``(path, message)`` pairs in the terms of the JSON document that was validated.

Used for specs (:func:`modkit.spec.load_spec`, with registry-aware messages added there) and training configs
(:func:`modkit.train.config.load_train_config`). What it does with pydantic's raw errors:

* **JSON paths only.** pydantic's ``loc`` mixes document keys with the tags of union members (``LayerRange``,
  ``function-after[_not_empty(), LayerRange]``, ``list[constrained-int]``, ``str``, a component's ``type``). A
  ``loc`` item is kept when it is a key of the document at that point, or a field name of one of the models
  (a field absent from the document: a missing field, or a default a validator refused); any other item is a tag.
* **The union branch the input meant.** A union (``"layers"``: an array of indices or an object ``{start, stop,
  step}``) reports one error per branch. A branch *fits* the input when it got past the type check: its error
  lies deeper than the union (an item of the array, a field of the object), or is not a type error (``greater
  than 0``), or is a choice among strings for a string. Only fitting branches are reported; when none fits, one
  message names every accepted type once: ``Input should be an array or an object, not a string (got "all")``.
* **null where it is accepted.** A type error at a key whose field may be null (``final_norm``) says so:
  ``Input should be an object or null, not a string``.
* **Values as JSON.** ``(got null)``, ``(got true)``, ``(got "all")``; a type error names the kind of value it got
  (``not null``, ``not a boolean (got true)``), and a value is never shown twice. A value the document does not
  hold (a default) is not shown. Values are rendered by :func:`json_value`, which walks them without recursion and
  stops at its length limit, so a value nested thousands of levels deep (or a huge one) still gives a short message.

Paths
-----
Every path modkit prints (spec errors, training-config errors, Hugging Face config errors, the ``modkit``
command's error lines) is written by :func:`join_path` / :func:`format_path` and read back by :func:`parse_path`;
:func:`resolve_path` returns the node a printed path names in a document. A path is a sequence of steps:

* an object key that is a plain identifier (ASCII letters, digits and ``_``, not starting with a digit) is written
  after a dot, or bare at the start: ``block.attention.n_kv_heads``;
* any other key (``"["``, ``"a.b"``, ``""``, ``" "``, ``"0"``, non-ASCII, quotes, backslashes) is written as a
  JSON string in brackets: ``block["["]``, ``metadata["a.b"]``, ``["0"]``; characters that do not print
  (control characters, zero-width spaces) are escaped (``\\u200b``), so what is shown is what is typed;
* an array index is written in brackets: ``overrides[2].ffn.d_ff``.

So ``["0"]`` (the key ``"0"``) and ``[0]`` (the first item) never read alike, and every printed path resolves to
exactly one place in the document; the empty path is the document itself.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import typing
from typing import Any, Iterable, Optional, Sequence, Union

from pydantic import BaseModel

#: what a type error's branch expected, in JSON terms
EXPECTED = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean",
    "bool_parsing": "a boolean",
    "list_type": "an array",
    "tuple_type": "an array",
    "set_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "dataclass_type": "an object",
    "none_required": "null",
}
#: pydantic error types meaning "the input is not of this type at all"; literal_error is one unless the input has
#: the type of the choices (then it is the answer: a string that is not one of the allowed strings)
TYPE_ERRORS = set(EXPECTED) | {"literal_error", "is_instance_of", "union_tag_invalid"}
#: messages rewritten in JSON terms (pydantic's name Python types and classes)
_OBJECT_MESSAGE = "Input should be an object"
_ARRAY_MESSAGE = "Input should be an array"


#: pydantic's error types of a number past a bound: the ``ctx`` key of the bound and the words of the message
_BOUND_WORDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "greater than or equal to"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "less than or equal to"),
}


def _tiny(bound: Any) -> bool:
    """Whether ``bound`` is a float so close to 0 that pydantic writes it with a run of zeros (``1e-30``)."""
    return isinstance(bound, float) and 0 < abs(bound) < 1e-4


def _scalar_json(value: Any) -> str:
    """One non-container value as JSON text (``repr`` for what JSON cannot hold)."""
    try:
        return json.dumps(value, allow_nan=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return _short_repr(value)


def _short_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` of a non-container, cut at ``limit`` characters (a repr that fails is named by its type)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ (or one that recurses) must not break an error message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit]


def json_value(value: Any, limit: int = 60) -> str:
    """``value`` as JSON text (``null``, ``true``, ``"all"``, ``1e-05``, ``NaN``), shortened past ``limit`` characters.

    Containers are walked with an explicit stack and the walk stops once ``limit`` characters are written, so the
    time and memory taken are bounded by ``limit`` whatever the value: a list nested 100,000 levels deep gives
    ``[[[[[[[[[[...`` rather than a ``RecursionError``, a list of a million numbers is not rendered whole. A shortened
    text ends with ``...`` (and the total length when it is known).
    """
    if not isinstance(value, (dict, list, tuple)):
        text = _scalar_json(value)
        return text if len(text) <= limit else text[: max(limit - 20, 10)] + f"... ({len(text)} characters)"
    out: list[str] = []
    size = 0
    budget = max(limit - 3, 10)
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            piece = item.text
        elif isinstance(item, dict):
            stack.append(_Text("}"))
            entries = list(itertools.islice(item.items(), budget))
            for i in range(len(entries) - 1, -1, -1):
                k, v = entries[i]
                stack.append(v)
                stack.append(
                    _Text(("" if i == 0 else ", ") + _scalar_json(str(k) if not isinstance(k, str) else k) + ": ")
                )
            piece = "{"
        elif isinstance(item, (list, tuple)):
            stack.append(_Text("]"))
            entries = list(item[:budget])
            for i in range(len(entries) - 1, -1, -1):
                stack.append(entries[i])
                if i:
                    stack.append(_Text(", "))
            piece = "["
        else:
            piece = _scalar_json(item)
        out.append(piece)
        size += len(piece)
        if size > limit:
            return "".join(out)[:budget] + "..."
    return "".join(out)


class _Text:
    """A literal piece of :func:`json_value`'s output waiting on its stack."""

    __slots__ = ("text",)

    def __init__(self, text: str):
        self.text = text


# ------------------------------------------------------------------------------------------------ paths

#: an object key written after a dot (``block.attention``); any other key is quoted (``block["a.b"]``)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _quoted(key: str) -> str:
    """``key`` as a JSON string whose every character prints (others escaped as ``\\uXXXX``)."""
    text = json.dumps(key, ensure_ascii=False)
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in text)


def join_path(path: str, key: Any) -> str:
    """``path`` (as :func:`format_path` writes it) followed by one step: an object key (``str``) or an array
    index (``int``).

    ``join_path("block", "attention") == "block.attention"``, ``join_path("block", "[") == 'block["["]'``,
    ``join_path("overrides", 2) == "overrides[2]"``, ``join_path("", "0") == '["0"]'``. Keys of another type
    (none in a JSON document) are written as their ``str``.
    """
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    key = key if isinstance(key, str) else str(key)
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{_quoted(key)}]"


def extend_path(path: str, relative: str) -> str:
    """``path`` followed by ``relative``, a path printed relative to the node at ``path`` (a component's
    ``check`` names ``n_kv_heads`` or ``scaling.factor`` inside its config): ``extend_path("block.attention",
    "n_kv_heads") == "block.attention.n_kv_heads"``, ``extend_path("a", '["x"]') == 'a["x"]'``."""
    if not relative or not path:
        return path or relative
    return path + relative if relative.startswith("[") else f"{path}.{relative}"


def format_path(steps: Iterable[Any]) -> str:
    """The printed form of a sequence of steps (object keys as ``str``, array indices as ``int``); see the module
    docstring. ``format_path(["block", "ffn", "d_ff"]) == "block.ffn.d_ff"``; ``format_path([]) == ""``."""
    path = ""
    for step in steps:
        path = join_path(path, step)
    return path


class PathError(ValueError):
    """A printed path that is malformed, or that does not lead into the document it is resolved in.

    Attributes:
        path: the path; ``at``: the steps (as :func:`parse_path` reads them) that did lead into the document.
    """

    def __init__(self, path: str, message: str, at: tuple = ()):
        self.path = path
        self.at = at
        super().__init__(f"path {path!r}: {message}")


def parse_path(path: str) -> list[Union[str, int]]:
    """The steps of a path printed by modkit (object keys as ``str``, array indices as ``int``): the inverse of
    :func:`format_path`, so ``parse_path(format_path(steps)) == steps`` for any keys.

    Raises:
        PathError: text that :func:`format_path` never writes (an empty step ``a..b``, an unclosed bracket, a
            bracket holding neither an index nor a JSON string).
    """
    steps: list[Union[str, int]] = []
    decoder = json.JSONDecoder()
    i, n = 0, len(path)
    while i < n:
        c = path[i]
        if c == "[":
            if i + 1 < n and path[i + 1] == '"':
                try:
                    key, end = decoder.raw_decode(path, i + 1)
                except json.JSONDecodeError:
                    raise PathError(path, f"unterminated quoted key at character {i + 1}") from None
                if not isinstance(key, str):
                    raise PathError(path, f"a quoted key must be a JSON string (character {i + 1})")
                steps.append(key)
            else:
                m = re.compile(r"\d+").match(path, i + 1)
                if m is None:
                    raise PathError(path, f"'[' at character {i + 1} holds neither an index nor a quoted key")
                steps.append(int(m.group()))
                end = m.end()
            if end >= n or path[end] != "]":
                raise PathError(path, f"missing ']' at character {end + 1}")
            i = end + 1
            continue
        if c == ".":
            if not steps:
                raise PathError(path, "a path does not start with '.'")
            i += 1
        elif steps:
            raise PathError(path, f"expected '.' or '[' at character {i + 1}")
        m = _IDENTIFIER.match(path, i)
        if m is None:
            raise PathError(
                path, f'expected a key at character {i + 1} (keys that are not identifiers are quoted: ["..."])'
            )
        steps.append(m.group())
        i = m.end()
    return steps


def last_key(path: str) -> Optional[str]:
    """The object key of a printed path's last step (``d_ff`` for ``block.ffn.d_ff``); ``None`` when the last step
    is an array index, the path is empty or malformed."""
    try:
        steps = parse_path(path)
    except PathError:
        return None
    return steps[-1] if steps and isinstance(steps[-1], str) else None


_MISSING = object()


def resolve_path(document: Any, path: Union[str, Sequence[Any]], default: Any = _MISSING) -> Any:
    """The node of ``document`` (parsed JSON: dicts, lists, scalars) that the printed ``path`` names.

    ``resolve_path(doc, 'block["["]')`` is ``doc["block"]["["]``; the empty path is ``document`` itself. A path
    may also be given as its steps (:func:`parse_path`).

    Args:
        default: returned when only the last step is missing: a key absent from the object its path leads to (an
            error about a missing required field names it there). Without ``default`` that is an error too.

    Raises:
        PathError: a malformed path, or one that does not lead into ``document`` (a key absent from an object
            before the last step, an index out of range, a step into a scalar, an index into an object or a key
            into an array).
    """
    text = path if isinstance(path, str) else format_path(path)
    steps = parse_path(path) if isinstance(path, str) else list(path)
    node = document
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if isinstance(step, int) and isinstance(node, list):
            if not 0 <= step < len(node):
                raise PathError(text, f"index {step} is out of range for an array of {len(node)}", tuple(steps[:i]))
            node = node[step]
        elif isinstance(step, str) and isinstance(node, dict):
            if step not in node:
                if last and default is not _MISSING:
                    return default
                raise PathError(
                    text,
                    f"no key {_quoted(step)} in the object at {format_path(steps[:i]) or 'the root'}",
                    tuple(steps[:i]),
                )
            node = node[step]
        else:
            what = "an index" if isinstance(step, int) else f"the key {_quoted(step)}"
            raise PathError(
                text,
                f"{what} cannot follow {json_kind(node)} (at {format_path(steps[:i]) or 'the root'})",
                tuple(steps[:i]),
            )
    return node


def json_kind(value: Any) -> str:
    """How a JSON value reads to a user: ``null``, ``a boolean``, ``a string``, ``a float``, ``an integer``,
    ``an object``, ``an array``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    return f"a {type(value).__name__}"


def _literal_json(expected: str) -> str:
    """pydantic's ``'a', 'b' or 'c'`` with JSON string quotes: ``"a", "b" or "c"``."""
    return re.sub(r"'((?:[^'\\]|\\.)*)'", lambda m: json.dumps(m.group(1)), expected)


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def models_in(roots: Iterable[type]) -> dict[str, type[BaseModel]]:
    """Every pydantic model reachable from ``roots`` through field annotations, by class name."""
    found: dict[str, type[BaseModel]] = {}
    stack = list(roots)
    seen: set[int] = set()
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, type) and issubclass(t, BaseModel):
            found.setdefault(t.__name__, t)
            for f in t.model_fields.values():
                stack.append(f.annotation)
        else:
            stack.extend(a for a in typing.get_args(t) if not isinstance(a, (str, int, float, bool)) and a is not None)
    return found


class ErrorFormatter:
    """Turns pydantic's ``errors()`` of one document into ``(path, message)`` pairs (see the module docstring).

    Args:
        models: every pydantic model the document may hold (:func:`models_in` of the root); their field names tell
            document keys from union tags, and name the valid fields of an object with an unknown key.

    Subclasses add domain messages through :meth:`special` and :meth:`hint`.
    """

    def __init__(self, models: Iterable[type[BaseModel]]):
        self.models = {m.__name__: m for m in models}
        self.field_names: set[str] = set()
        takes_null: dict[str, bool] = {}
        for m in self.models.values():
            for name, f in m.model_fields.items():
                allows = type(None) in typing.get_args(f.annotation)
                for key in filter(None, (name, f.alias)):
                    self.field_names.add(key)
                    takes_null[key] = takes_null.get(key, True) and allows
        #: keys whose every field accepts null (``final_norm``, ``max_tokens``): their type errors say "or null"
        self.nullable = {key for key, allows in takes_null.items() if allows}

    # -------------------------------------------------------------------------------------------- hooks

    def special(self, err: dict, path: str, parent: Any, tags: list[str]) -> Optional[tuple[str, str]]:
        """A domain message for ``err`` (``(path, message)``), or ``None`` for the generic one."""
        return None

    def hint(self, err: dict, path: str) -> str:
        """Text appended to the generic message of ``err`` (e.g. ``; 131,072 is modkit's bound for d_model``)."""
        return ""

    def allowed_fields(self, parent: Any, tags: list[str]) -> list[str]:
        """The valid keys of the object ``parent`` in which an unknown key was found."""
        for tag in reversed(tags):  # the union member that took the object, e.g. LayerRange
            for name in re.findall(r"[A-Za-z_]\w*", tag):
                if name in self.models:
                    return self._fields_of(self.models[name])
        if isinstance(parent, dict):  # the one model whose fields hold every other key of the object
            keys = set(parent)
            fits = [
                m
                for m in self.models.values()
                if len(keys & set(self._fields_of(m))) == len(keys) - 1 and len(keys) > 1
            ]
            if len(fits) == 1:
                return self._fields_of(fits[0])
        return []

    @staticmethod
    def _fields_of(model: type[BaseModel]) -> list[str]:
        return [f.alias or n for n, f in model.model_fields.items() if n != "type"]

    # -------------------------------------------------------------------------------------------- paths

    def locate(self, loc: tuple, data: Any) -> tuple[str, Optional[str], list[str], Any, bool, Any]:
        """``(path, union_path, tags, parent, present, node)`` of a pydantic ``loc`` in ``data``.

        ``union_path`` is the path of the outermost smart union on the way (``None`` when there is none) and ``tags``
        the member tags dropped; ``parent`` is the object holding the last key; ``present`` says the document holds
        the value at ``path`` (``node``).
        """
        path = ""
        node, parent, present = data, None, True
        union_path: Optional[str] = None
        tags: list[str] = []
        for item in loc:
            if isinstance(item, int) and isinstance(node, list):
                ok = -len(node) <= item < len(node)
                path = join_path(path, item)
                parent = node
                node, present = (node[item], present) if ok else (None, False)
                continue
            if isinstance(node, dict) and item in node:
                path = join_path(path, item)
                parent, node = node, node[item]
                continue
            if isinstance(node, dict) and node.get("type") == item:
                continue  # the tag of a discriminated union: the member the document's "type" chose
            if isinstance(item, str) and item in self.field_names:
                path = join_path(path, item)  # a field the document does not hold
                parent, node, present = node, None, False
                continue
            if isinstance(item, int):
                path = join_path(path, item)
                parent, node, present = node, None, False
                continue
            if union_path is None:
                union_path = path
            tags.append(str(item))
        return path, union_path, tags, parent, present, node

    # -------------------------------------------------------------------------------------------- messages

    def message(self, err: dict, path: str, present: bool) -> str:
        """The generic message of one error, its value in JSON terms."""
        etype = err.get("type", "")
        msg = str(err.get("msg", "invalid"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        has_input = "input" in err and present and etype != "missing"
        value = err.get("input")
        if etype in ("dict_type", "model_type", "model_attributes_type", "dataclass_type"):
            msg = _OBJECT_MESSAGE
        elif etype in ("list_type", "tuple_type", "set_type"):
            msg = _ARRAY_MESSAGE
        elif etype == "literal_error":
            msg = "Input should be " + _literal_json(str((err.get("ctx") or {}).get("expected", "")))
        elif etype in _BOUND_WORDS and _tiny((err.get("ctx") or {}).get(_BOUND_WORDS[etype][0])):
            key, words = _BOUND_WORDS[etype]  # pydantic writes 1e-30 as 0.000...001: written as Python writes it
            msg = f"Input should be {words} {err['ctx'][key]!r}"
        elif etype in ("too_short", "too_long"):  # "List should have at least 1 item after validation, not 0"
            msg = re.sub(r"^(List|Tuple|Set) should", "Array should", msg).replace(" after validation", "")
            msg = re.sub(r"^Dictionary should", "Object should", msg)
        if etype in EXPECTED and etype != "none_required" and self._takes_null(path):
            msg += " or null"
        if etype in EXPECTED and has_input:
            msg += f", not {json_kind(value)}"
        if etype == "int_type" and isinstance(value, float) and math.isfinite(value) and value.is_integer():
            msg += f" (got {json_value(value)}); write an integer without a decimal point or exponent"
        elif (
            has_input
            and value is not None
            and not isinstance(value, (dict, list))
            and not self._shows(msg, value, etype)
        ):
            msg += f" (got {json_value(value)})"
        return msg + self.hint(err, path)

    def _takes_null(self, path: str) -> bool:
        """Whether the value at ``path`` (a document key, not an array item) may be null."""
        return last_key(path) in self.nullable

    @staticmethod
    def _shows(msg: str, value: Any, etype: str) -> bool:
        """Whether ``msg`` already shows ``value``: ``(got ...)``, or a validator's own text naming it
        (``n_kv_heads = 3 does not divide n_heads = 4``); pydantic's own messages never do."""
        if "(got " in msg:
            return True
        if etype not in ("value_error", "assertion_error"):
            return False
        shown = {json_value(value), repr(value)}  # a validator may quote a string the Python way
        return any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w.])", msg) for s in shown)

    def _fits(self, err: dict, path: str, union_path: str) -> bool:
        """Whether ``err`` shows its union branch took the input's JSON type (see the module docstring)."""
        etype = err.get("type", "")
        if path != union_path:
            return True
        if etype == "literal_error":
            expected = str((err.get("ctx") or {}).get("expected", ""))
            return isinstance(err.get("input"), str) == ("'" in expected)
        return etype not in TYPE_ERRORS

    def format(self, errs: list[dict], data: Any) -> list[tuple[str, str]]:
        """``(path, message)`` per problem, in the order pydantic found them (see the module docstring)."""
        located = []
        for err in errs:
            path, union_path, tags, parent, present, node = self.locate(tuple(err.get("loc", ())), data)
            located.append((err, path, union_path, tags, parent, present, node))
        # per union: the branches that fit the input
        fitting: dict[str, set[str]] = {}
        for err, path, union_path, tags, *_ in located:
            if union_path is not None:
                branches = fitting.setdefault(union_path, set())
                if self._fits(err, path, union_path):
                    branches.add(tags[0])
        out: list[tuple[str, Optional[str]]] = []
        merged: dict[str, tuple[list[str], Any, bool]] = {}
        for err, path, union_path, tags, parent, present, node in located:
            if union_path is not None and not fitting[union_path]:  # no branch took the input: one message
                expected = EXPECTED.get(err.get("type", ""))
                if err.get("type") == "literal_error":
                    expected = _literal_json(str((err.get("ctx") or {}).get("expected", "")))
                if union_path not in merged:
                    out.append((union_path, None))  # the merged message goes here (below), once
                words, value, held = merged.setdefault(union_path, ([], err.get("input"), present))
                if expected and expected not in words:
                    words.append(expected)
                continue
            if union_path is not None and tags[0] not in fitting[union_path]:
                continue  # a branch the input was never meant for
            special = self.special(err, path, parent, tags)
            out.append(special if special is not None else (path, self.message(err, path, present)))
        result = []
        for path, msg in out:
            if msg is None:
                words, value, held = merged[path]
                if words and self._takes_null(path) and "null" not in words:
                    words = words + ["null"]
                msg = "Input should be " + _join(words or ["something else"])
                if held:
                    msg += f", not {json_kind(value)}"
                    if value is not None and not isinstance(value, (dict, list)):
                        msg += f" (got {json_value(value)})"
            result.append((path, msg))
        # one line per message; several real messages at one path of a union read as alternatives
        by_path: dict[str, list[str]] = {}
        for path, msg in result:
            by_path.setdefault(path, [])
            if msg not in by_path[path]:
                by_path[path].append(msg)
        unions = set(fitting)
        final = []
        for path, msgs in by_path.items():
            if path in unions and len(msgs) > 1:
                final.append((path, " or ".join(msgs)))
            else:
                final.extend((path, m) for m in msgs)
        return final
