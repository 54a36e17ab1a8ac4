"""Property-based fuzzing of the front door: every mutated spec or Hugging Face config is a valid spec or a
SpecError naming a path, never a raw exception.

The mutations start from the shipped specs (``specs/*.json``) and the published configs
(``tests/data/real-models``): a value replaced by an arbitrary JSON value (bools, huge and negative integers,
NaN and infinities, strings, nested containers), a key deleted or added, a key given twice, or the file's bytes
damaged (truncated, binary, UTF-16, deeply nested). Properties:

* a spec is either valid (and then builds on ``meta`` and round-trips through ``to_json``) or rejected with a
  :class:`~modkit.core.errors.SpecError` whose every path leads into the document (the empty path only for a
  problem of the whole document);
* a Hugging Face config is either converted to a valid spec or rejected with a SpecError naming the config's
  own keys (never a path of the converted spec).

The default run tries the same few hundred examples every time (hypothesis derandomized, no example database);
``MODKIT_HYPOTHESIS=explore pytest tests/spec/test_fuzz_properties.py`` (or ``--hypothesis-profile explore``) draws
thousands of fresh ones to find new cases (the profiles are registered in ``conftest.py``); a failure found that
way becomes an explicit test, as the quoted-key cases of ``test_error_paths.py`` did.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import modkit
from modkit.core.errors import SpecError
from modkit.core.validation import PathError, parse_path, resolve_path

REPO = Path(__file__).resolve().parents[2]
SPECS = {p.name: json.loads(p.read_text()) for p in sorted((REPO / "specs").glob("*.json"))}
CONFIGS = {
    p.parent.name: json.loads(p.read_text())
    for p in sorted((Path(__file__).resolve().parents[1] / "data" / "real-models").glob("*/config.json"))
}

#: JSON values, the nasty ones weighted in
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, 10**12, 100_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e-300, 1e300, 1.5, 12.0]),
    st.text(max_size=12),
    st.sampled_from(["128", "yes", "true", "sqrt_d_model", "rope", "gqa", ""]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _nodes(doc, path=()):
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _nodes(v, path + (i,))


def _parent(doc, path):
    node = doc
    for p in path[:-1]:
        node = node[p]
    return node


@st.composite
def mutated(draw, docs: dict):
    """``(name, original doc, mutated doc or None, file bytes, whole_file)``: one mutation of one document."""
    name = draw(st.sampled_from(sorted(docs)))
    doc = json.loads(json.dumps(docs[name]))
    nodes = list(_nodes(doc))
    kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "duplicate", "bytes"]))
    if kind == "bytes":
        text = json.dumps(doc, indent=1)
        how = draw(st.sampled_from(["truncate", "utf16", "binary", "deep", "digits", "bom"]))
        if how == "truncate":
            data = text[: draw(st.integers(0, len(text) - 1))].encode()
        elif how == "utf16":
            data = text.encode(draw(st.sampled_from(["utf-16", "utf-16-le", "utf-32"])))
        elif how == "binary":
            data = draw(st.binary(min_size=1, max_size=64))
        elif how == "deep":
            depth = draw(st.sampled_from([65, 2000, 100_000]))
            data = ('{"a": ' + "[" * depth + "]" * depth + "}").encode()
        elif how == "digits":
            data = text.replace("{", '{"x": ' + "7" * draw(st.integers(4301, 6000)) + ",", 1).encode()
        else:
            data = b"\xef\xbb\xbf" + text.encode()  # a UTF-8 byte-order mark: still fine
            return name, docs[name], doc, data, False
        return name, docs[name], None, data, True
    path, _ = draw(st.sampled_from(nodes[1:]))
    parent = _parent(doc, path)
    if kind == "replace":
        parent[path[-1]] = draw(VALUES)
    elif kind == "delete":
        del parent[path[-1]]
    elif kind == "add":
        holders = [n for _, n in nodes if isinstance(n, dict)]
        holder = draw(st.sampled_from(holders))
        key = draw(
            st.sampled_from(["n_layer", "typo", "eps", "type", "bias"]) | st.text(max_size=6)
        )  # "[", "a.b", ""...
        holder[key] = draw(VALUES)
    else:  # the same key twice in one object (text level: a dict cannot hold it)
        holders = [n for _, n in nodes if isinstance(n, dict) and n]
        holder = draw(st.sampled_from(holders))
        key = draw(st.sampled_from(sorted(holder)))
        holder["\u0000dup"] = draw(VALUES)
        text = json.dumps(doc).replace('"\\u0000dup"', json.dumps(key))
        return name, docs[name], None, text.encode(), False
    return name, docs[name], doc, json.dumps(doc).encode(), False


def _resolves(path: str, doc) -> bool:
    """Whether an error path leads into ``doc`` (its last key may be a missing field), read by modkit's own
    :func:`~modkit.core.validation.resolve_path`."""
    if doc is None:
        return True  # the document could not be parsed by the stdlib either; the path is checked by shape only
    try:
        resolve_path(doc, path, default=None)
    except PathError:
        return False
    return True


def _write(tmp_path_factory, data: bytes) -> Path:
    f = tmp_path_factory.mktemp("fuzz") / "doc.json"
    f.write_bytes(data)
    return f


@given(mutated(SPECS))
def test_every_mutated_spec_is_valid_or_a_spec_error_naming_a_path(tmp_path_factory, case):
    name, original, doc, data, whole_file = case
    try:
        spec = modkit.load_spec(_write(tmp_path_factory, data))
    except SpecError as exc:
        assert exc.errors, exc
        for path, message in exc.errors:
            assert message
            if not path:
                assert whole_file or not isinstance(doc, dict) or "duplicate" in message, (path, message)
            else:
                assert _resolves(path, doc), (path, message, name)
        return
    assert not whole_file, "a damaged file was accepted"
    model = modkit.build(spec, device="meta")
    assert model.embed.weight.shape == (spec.vocab_size, spec.d_model)
    assert modkit.load_spec(spec.to_json()).to_dict() == spec.to_dict()


@given(mutated(CONFIGS))
def test_every_mutated_hf_config_converts_or_names_the_configs_key(tmp_path_factory, case):
    name, original, doc, data, whole_file = case
    try:
        spec = modkit.from_hf_config(_write(tmp_path_factory, data))
    except SpecError as exc:
        assert exc.errors, exc
        keys = set(original) | (set(doc) if isinstance(doc, dict) else set())
        for path, message in exc.errors:
            assert message
            top = parse_path(path)[0] if path else ""
            if not path:
                assert whole_file or not isinstance(doc, dict) or "duplicate" in message or "model_type" in message, (
                    path,
                    message,
                )
            elif not whole_file:  # (a damaged file is another document; its paths are its own)
                assert top in keys, f"{name}: the error names {path!r}, not a key of the config: {message}"
        return
    assert not whole_file, "a damaged file was accepted"
    assert modkit.build(spec, device="meta").embed.weight.shape == (spec.vocab_size, spec.d_model)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_unmutated_specs_pass_the_same_checks(name, tmp_path_factory):
    """The starting points themselves are valid (so the mutations above are what is being tested)."""
    spec = modkit.load_spec(_write(tmp_path_factory, json.dumps(SPECS[name]).encode()))
    assert spec.to_dict()["vocab_size"] == SPECS[name]["vocab_size"]
