"""Spec-field overrides of a comparison: one design's spec with some fields replaced, so that a variant (QK-norm on,
another norm, another head count) needs no spec file of its own.

``modkit compare base=spec.json qk=spec.json --set 'qk:block.attention.qk_norm={"type": "rmsnorm"}'`` trains
``spec.json`` as ``base`` and, with the field replaced, as ``qk``. A field is a dotted path into the spec as
``modkit validate`` writes it out (every default present): ``block.ffn.d_ff``, ``overrides.0.ffn``, ``final_norm``;
a number in the path indexes a list. The value is JSON (``64``, ``true``, ``null``, ``{"type": "rmsnorm"}``); a
value that is not JSON is taken as a string (``block.ffn.type=gelu_mlp``). The edited spec is validated as any spec
(:func:`modkit.spec.load_spec`), before any run trains, and an error names the design, the field and the fix. The
edited spec is written to ``REPORT/specs/<label>.json``; with sizes, each size is made from it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .results import CompareError


def parse_spec_field(text: str, flag: str = "--set") -> tuple[str, str, Any]:
    """``"qk:block.attention.qk_norm={...}"`` -> ``("qk", "block.attention.qk_norm", {...})``.

    Raises:
        CompareError: no ``LABEL:`` or no ``=``, an empty label or field (the message names ``flag`` and the form).
    """
    label, sep, rest = text.partition(":")
    path, eq, value = rest.partition("=")
    if not sep or not eq or not label or not path.strip():
        raise CompareError(
            f'{flag} {text!r}: write LABEL:FIELD.PATH=JSON, e.g. \'qk:block.attention.qk_norm={{"type": "rmsnorm"}}\''
        )
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value  # a bare word: a string
    return label, path.strip(), parsed


def set_field(data: dict, path: str, value: Any, where: str) -> None:
    """Set ``data[p0][p1]...`` along the dotted ``path`` to ``value`` (a numeric part indexes a list; a missing
    object on the way is created).

    Raises:
        CompareError: a part that goes through a value that is neither an object nor a list, or a list index out of
            range (``where`` begins the message).
    """
    parts = path.split(".")
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        here = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise CompareError(f"{where}: {here}: the list has {len(node)} entries; give an index below that")
            if last:
                node[int(part)] = value
            else:
                node = node[int(part)]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if node.get(part) is None:
                    node[part] = {}
                node = node[part]
        else:
            raise CompareError(
                f"{where}: {here}: {'.'.join(parts[:i])} is {json.dumps(node)}, not an object or a list; set it whole"
            )


def edited_spec(label: str, path: Path, fields: dict[str, Any]) -> dict:
    """The spec at ``path`` (every default written out) with ``fields`` (``{dotted path: value}``) set, validated.

    Raises:
        CompareError: a path that cannot be followed, or an edited spec that is not valid (the message names the
            design, the fields set and the validation's own field-by-field errors).
    """
    import modkit
    from modkit.core.errors import SpecError

    data = copy.deepcopy(modkit.load_spec(path).to_dict())
    for field, value in fields.items():
        set_field(data, field, value, f"--set {label}:{field}")
    try:
        modkit.load_spec(data)
    except SpecError as exc:
        set_text = ", ".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
        raise CompareError(
            f"design {label}: {path.name} with {set_text} is not a valid spec: {exc}; fix the value of --set "
            f"{label}:FIELD (fields as `modkit validate` writes the spec out)"
        ) from None
    return data


def check_spec_fields(spec_fields: dict[str, dict[str, Any]], labelled: list[tuple[str, Path]]) -> None:
    """Each label of ``spec_fields`` is a design and its edited spec is valid (:func:`edited_spec`).

    Raises:
        CompareError: an unknown label (naming the labels), or what :func:`edited_spec` raises.
    """
    paths = dict(labelled)
    for label, fields in spec_fields.items():
        if label not in paths:
            raise CompareError(
                f"--set {label}:...: {label!r} is not a spec label; labels: {', '.join(paths)} (give the spec as "
                f"{label}=FILE to name it)"
            )
        edited_spec(label, paths[label], fields)


def write_edited(label: str, path: Path, fields: dict[str, Any], out: Path) -> Path:
    """Write the edited spec of design ``label`` to ``out/specs/<label>.json``; its path."""
    data = edited_spec(label, path, fields)
    (out / "specs").mkdir(parents=True, exist_ok=True)
    target = out / "specs" / f"{label}.json"
    target.write_text(json.dumps(data, indent=1) + "\n")
    return target
