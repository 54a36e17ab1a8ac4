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
  hold (a default) is not shown.
"""

from __future__ import annotations

import json
import math
import re
import typing
from typing import Any, Iterable, Optional

from pydantic import BaseModel

#: what a type error's branch expected, in JSON terms
EXPECTED = {
    "int_type": "an integer", "int_from_float": "an integer", "int_parsing": "an integer",
    "float_type": "a number", "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "a boolean", "bool_parsing": "a boolean",
    "list_type": "an array", "tuple_type": "an array", "set_type": "an array",
    "dict_type": "an object", "model_type": "an object", "model_attributes_type": "an object", "dataclass_type": "an object",
    "none_required": "null",
}
#: pydantic error types meaning "the input is not of this type at all"; literal_error is one unless the input has
#: the type of the choices (then it is the answer: a string that is not one of the allowed strings)
TYPE_ERRORS = set(EXPECTED) | {"literal_error", "is_instance_of", "union_tag_invalid"}
#: messages rewritten in JSON terms (pydantic's name Python types and classes)
_OBJECT_MESSAGE = "Input should be an object"
_ARRAY_MESSAGE = "Input should be an array"


def json_value(value: Any, limit: int = 60) -> str:
    """``value`` as JSON text (``null``, ``true``, ``"all"``, ``1e-05``, ``NaN``), shortened past ``limit`` characters."""
    try:
        text = json.dumps(value, allow_nan=True, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 20] + f"... ({len(text)} characters)"


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
            fits = [m for m in self.models.values() if len(keys & set(self._fields_of(m))) == len(keys) - 1 and len(keys) > 1]
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
        parts: list[str] = []
        node, parent, present = data, None, True
        union_path: Optional[str] = None
        tags: list[str] = []
        for item in loc:
            if isinstance(item, int) and isinstance(node, list):
                parts.append(f"[{item}]")
                parent = node
                ok = -len(node) <= item < len(node)
                node, present = (node[item], present) if ok else (None, False)
                continue
            if isinstance(node, dict) and item in node:
                parts.append(("." if parts else "") + str(item))
                parent, node = node, node[item]
                continue
            if isinstance(node, dict) and node.get("type") == item:
                continue  # the tag of a discriminated union: the member the document's "type" chose
            if isinstance(item, str) and item in self.field_names:
                parts.append(("." if parts else "") + item)  # a field the document does not hold
                parent, node, present = node, None, False
                continue
            if isinstance(item, int):
                parts.append(f"[{item}]")
                parent, node, present = node, None, False
                continue
            if union_path is None:
                union_path = "".join(parts)
            tags.append(str(item))
        return "".join(parts), union_path, tags, parent, present, node

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
        elif etype in ("too_short", "too_long"):  # "List should have at least 1 item after validation, not 0"
            msg = re.sub(r"^(List|Tuple|Set) should", "Array should", msg).replace(" after validation", "")
            msg = re.sub(r"^Dictionary should", "Object should", msg)
        if etype in EXPECTED and etype != "none_required" and self._takes_null(path):
            msg += " or null"
        if etype in EXPECTED and has_input:
            msg += f", not {json_kind(value)}"
        if etype == "int_type" and isinstance(value, float) and math.isfinite(value) and value.is_integer():
            msg += f" (got {json_value(value)}); write an integer without a decimal point or exponent"
        elif has_input and value is not None and not isinstance(value, (dict, list)) and not self._shows(msg, value, etype):
            msg += f" (got {json_value(value)})"
        return msg + self.hint(err, path)

    def _takes_null(self, path: str) -> bool:
        """Whether the value at ``path`` (a document key, not an array item) may be null."""
        return not path.endswith("]") and re.split(r"[.\]]", path)[-1] in self.nullable

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
