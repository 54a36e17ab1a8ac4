"""Every path modkit prints leads back to one node of the document, whatever the keys are, and no value, however
deeply nested, breaks the building of an error message.

A key that is not a plain identifier used to be printed after a dot: the key ``"["`` of ``block`` read as
``block.[`` (list syntax; the fuzz test's own path parser crashed on it), ``"a.b"`` as two keys, ``"0"`` as an
index, ``""`` as nothing. Now such keys are quoted as JSON strings in brackets (``block["["]``), and
:func:`modkit.core.validation.resolve_path` resolves any printed path back to its node: the tests below use it on the
errors of specs, training configs, Hugging Face configs and the ``modkit`` command's output.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import modkit
from modkit import cli
from modkit.core.errors import SpecError, UnknownConfigKeyWarning
from modkit.core.validation import PathError, format_path, json_value, parse_path, resolve_path

from conftest import TINY, tiny_spec

REPO = Path(__file__).resolve().parents[2]
SPECS = {p.name: json.loads(p.read_text()) for p in sorted((REPO / "specs").glob("*.json"))}
LLAMA_CONFIG = json.loads((REPO / "tests" / "data" / "real-models" / "llama-3.2-1b" / "config.json").read_text())

#: (key, how it is printed under ``block``): every kind of key that is not a plain identifier
QUOTED = [
    ("[", 'block["["]'),
    ("]", 'block["]"]'),
    ("a.b", 'block["a.b"]'),
    ("", 'block[""]'),
    (" ", 'block[" "]'),
    ("0", 'block["0"]'),
    ("1x", 'block["1x"]'),
    ("é", 'block["é"]'),
    ("注意", 'block["注意"]'),
    ('say "hi"', 'block["say \\"hi\\""]'),
    ("back\\slash", 'block["back\\\\slash"]'),
    ("new\nline", 'block["new\\nline"]'),
    ("\u200b", 'block["\\u200b"]'),  # a zero-width space is shown escaped, so the printed path shows a key
    ("a-b", 'block["a-b"]'),
]


def spec_errors(doc) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.load_spec(doc)
    return info.value.errors


def with_key(doc: dict, where: tuple, key: str, value) -> dict:
    out = copy.deepcopy(doc)
    node = out
    for step in where:
        node = node[step]
    node[key] = value
    return out


# ------------------------------------------------------------------------------------------------ one test per case


@pytest.mark.parametrize("key, printed", QUOTED, ids=[repr(k) for k, _ in QUOTED])
def test_a_key_that_is_not_an_identifier_is_printed_quoted_and_resolves(key, printed):
    doc = with_key(TINY, ("block",), key, 7)
    errors = spec_errors(doc)
    assert [p for p, _ in errors] == [printed], errors
    assert f"unknown field {key!r}" in errors[0][1]
    assert parse_path(printed) == ["block", key]
    assert resolve_path(doc, printed) == 7


def test_identifier_keys_and_indices_print_as_before():
    """Plain keys keep the dotted form and indices the bracket form (``overrides[0].ffn.d_ff``)."""
    doc = tiny_spec(overrides=[{"layers": [0], "ffn": {"type": "swiglu", "d_ff": -1}}])
    ((path, _),) = spec_errors(doc)
    assert path == "overrides[0].ffn.d_ff"
    assert resolve_path(doc, path) == -1
    assert format_path(["overrides", 0, "ffn", "d_ff"]) == path


def test_a_key_named_like_an_index_is_not_an_index():
    """``["0"]`` (the key "0") and ``[0]`` (the first item) print differently and resolve differently."""
    doc = {**TINY, "0": 1}
    assert [p for p, _ in spec_errors(doc)] == ['["0"]']
    assert resolve_path({"0": "key"}, '["0"]') == "key"
    assert resolve_path(["item"], "[0]") == "item"
    with pytest.raises(PathError):
        resolve_path({"0": "key"}, "[0]")


@pytest.mark.parametrize("key, printed", [("a.b", 'overrides[0]["a.b"]'), ("[", 'overrides[0]["["]')])
def test_quoted_keys_inside_an_array_item(key, printed):
    doc = tiny_spec(overrides=[{"layers": [0], key: 1}])
    paths = [p for p, _ in spec_errors(doc)]
    assert paths == [printed], paths
    assert resolve_path(doc, printed) == 1


def test_a_quoted_key_inside_a_component_slot():
    doc = tiny_spec(block__ffn={"type": "swiglu", "d_ff": 64, "a.b": True})
    ((path, message),) = spec_errors(doc)
    assert path == 'block.ffn["a.b"]' and "unknown field 'a.b' for 'swiglu'" in message
    assert resolve_path(doc, path) is True


def test_duplicate_keys_are_named_quoted(tmp_path):
    """The strict JSON reader (duplicate keys) writes its paths the same way."""
    text = json.dumps(TINY)[:-1] + ', "metadata": {"a.b": 1, "a.b": 2}}'
    f = tmp_path / "dup.json"
    f.write_text(text)
    with pytest.raises(SpecError) as info:
        modkit.load_spec(f)
    assert info.value.errors[0][0] == 'metadata["a.b"]'
    assert resolve_path(json.loads(text), info.value.errors[0][0]) == 2


def test_training_config_errors_quote_keys():
    from modkit.train import load_train_config

    doc = {"max_steps": 10, "a.b": 1, "0": 2}
    with pytest.raises(SpecError) as info:
        load_train_config(doc)
    paths = sorted(p for p, _ in info.value.errors)
    assert paths == ['["0"]', '["a.b"]'], info.value.errors
    assert [resolve_path(doc, p) for p in paths] == [2, 1]


@pytest.mark.parametrize("where", ["top", "rope_scaling"])
@pytest.mark.parametrize("key", ["a.b", "[", "0", ""])
def test_hugging_face_config_errors_and_warnings_quote_keys(where, key):
    """Strict conversion names an unknown key by a path that resolves in the config; the non-strict warning lists
    the same path."""
    cfg = copy.deepcopy(LLAMA_CONFIG)
    (cfg if where == "top" else cfg["rope_scaling"])[key] = 123
    printed = format_path([key] if where == "top" else ["rope_scaling", key])
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(cfg, strict=True)
    assert [p for p, _ in info.value.errors] == [printed], info.value.errors
    assert resolve_path(cfg, printed) == 123
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        modkit.from_hf_config(cfg)
    (warning,) = [w.message for w in caught if isinstance(w.message, UnknownConfigKeyWarning)]
    assert list(warning.keys) == [printed] and f"{printed} = 123" in str(warning)


def test_sampling_list_errors_quote_keys():
    from modkit.core.errors import SamplingError
    from modkit.inference.generate import build_sampler

    steps = [{"type": "temperature", "value": 1.0}, {"type": "min_p", "p": 0.1, "a.b": 1}]
    with pytest.raises(SamplingError) as info:
        build_sampler(32, sampling=steps)
    assert [p for p, _ in info.value.errors] == ['[1]["a.b"]']
    assert resolve_path(steps, '[1]["a.b"]') == 1


def test_the_command_line_prints_the_quoted_path(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(with_key(TINY, ("block",), "a.b", 1)))
    assert cli.main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f'{bad}: block["a.b"]: unknown field ' in err, err
    assert cli.main(["build", str(bad), "--device", "meta", "--json"]) == 1
    err = capsys.readouterr().err
    assert f'{bad}: block["a.b"]: unknown field ' in err, err


# ------------------------------------------------------------------------------------------------ the path grammar


STEPS = st.lists(st.one_of(st.text(max_size=8), st.integers(0, 10**6)), max_size=6)


@given(STEPS)
def test_format_and_parse_are_inverse(steps):
    assert parse_path(format_path(steps)) == steps


@pytest.mark.parametrize("bad", ["a..b", ".a", "a[", "a[x]", 'a["x"', 'a["x"', "a]b", "[-1]", "a b", "[1]x"])
def test_a_path_modkit_never_prints_is_refused(bad):
    with pytest.raises(PathError):
        parse_path(bad)


def test_resolve_path_names_where_it_stops():
    doc = {"block": {"ffn": {"d_ff": 64}}, "overrides": [{"layers": [0]}]}
    assert resolve_path(doc, "") is doc
    assert resolve_path(doc, "overrides[0].layers[0]") == 0
    assert resolve_path(doc, "block.ffn.missing", default=None) is None  # a missing field under its object
    for path, fragment in [
        ("block.nope.d_ff", 'no key "nope"'),
        ("overrides[3]", "out of range"),
        ("block.ffn.d_ff.x", "cannot follow an integer"),
        ("block[0]", "cannot follow an object"),
    ]:
        with pytest.raises(PathError, match=fragment):
            resolve_path(doc, path, default=None)


# ------------------------------------------------------------------------------------------------ the property


def _objects(doc, at=()):
    """``(steps, object)`` of every JSON object in ``doc`` outside free-form ``metadata``."""
    if isinstance(doc, dict):
        yield at, doc
        for k, v in doc.items():
            if k != "metadata":
                yield from _objects(v, at + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _objects(v, at + (i,))


def _node_ids(value) -> set[int]:
    ids, stack = set(), [value]
    while stack:
        v = stack.pop()
        ids.add(id(v))
        stack.extend(v.values() if isinstance(v, dict) else v if isinstance(v, list) else ())
    return ids


@st.composite
def spec_with_a_new_key(draw):
    """A shipped spec with one key added (any text that the object does not hold) to any of its objects; the
    value is an object no field accepts."""
    name = draw(st.sampled_from(sorted(SPECS)))
    doc = copy.deepcopy(SPECS[name])
    objects = list(_objects(doc))
    at, obj = draw(st.sampled_from(objects))
    key = draw(st.text(max_size=10).filter(lambda k: k not in obj))
    value = {"\u0000offending": [1.5]}
    obj[key] = value
    return name, doc, at + (key,), value


@given(spec_with_a_new_key())
def test_for_random_keys_anywhere_in_a_spec_the_printed_path_resolves_to_the_offending_node(case):
    name, doc, steps, value = case
    errors = spec_errors(doc)
    offending = _node_ids(value)
    for path, message in errors:  # every printed path leads into the document (a missing field under its object)
        resolve_path(doc, path, default=None)
    hits = [p for p, _ in errors if id(resolve_path(doc, p, default=None)) in offending]
    assert hits, (name, steps, errors)
    assert any(parse_path(p)[: len(steps)] == list(steps) for p in hits), (steps, hits)


def _unknown_key(key: str) -> bool:
    """A key the llama converter does not know: not in the config, and not one that never changes a network (its
    IRRELEVANT keys, e.g. generation defaults such as ``typical_p``, are dropped silently even when strict).
    Hypothesis draws keys from the repository's own string constants too, so it does reach those."""
    from modkit_plugins.hf._reader import IRRELEVANT

    return key not in LLAMA_CONFIG and key != "rope_scaling" and key not in IRRELEVANT


@given(st.text(max_size=10).filter(_unknown_key), st.booleans())
def test_for_random_keys_in_a_hugging_face_config_the_printed_path_resolves(key, nested):
    cfg = copy.deepcopy(LLAMA_CONFIG)
    (cfg["rope_scaling"] if nested else cfg)[key] = 12345
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(cfg, strict=True)
    assert [resolve_path(cfg, p) for p, _ in info.value.errors] == [12345], info.value.errors


# ------------------------------------------------------------------------------------------------ deep values


def _deep(levels: int) -> list:
    out = inner = []
    for _ in range(levels):
        inner.append([])
        inner = inner[0]
    return out


def test_a_hugging_face_model_type_nested_deeply_is_one_clean_error():
    """Fuzz finding: a ``model_type`` that is a list nested thousands of levels deep ended in a RecursionError
    while the message was built. Now: one error at model_type naming the bound (64 levels) and the value."""
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config({"model_type": _deep(5000)})
    ((path, message),) = info.value.errors
    assert path == "model_type"
    assert "nested deeper than 64 levels" in message and "modkit.core.limits.MAX_JSON_DEPTH" in message
    assert message.endswith("got " + "[" * 37 + "...") and len(message) < 200, message


@pytest.mark.parametrize(
    "place",
    [("name",), ("metadata", "x"), ("block", "ffn", "d_ff"), ("block", "norm"), ("type",), ("block", "[")],
    ids=lambda p: ".".join(p),
)
def test_a_deeply_nested_value_anywhere_in_a_spec_dict_is_named(place):
    doc = copy.deepcopy(TINY)
    node = doc
    for step in place[:-1]:
        node = node.setdefault(step, {})
    node[place[-1]] = _deep(3000)
    errors = spec_errors(doc)
    assert len(errors) == 1 and "nested deeper than 64 levels" in errors[0][1], errors
    assert parse_path(errors[0][0]) == [place[0]]  # named at its top-level key, as for a file


def test_a_deeply_nested_value_in_a_training_config_or_hf_key_is_named():
    from modkit.train import load_train_config

    with pytest.raises(SpecError, match="nested deeper than 64 levels"):
        load_train_config({"lr": _deep(3000)})
    cfg = {**LLAMA_CONFIG, "rope_scaling": {"factor": _deep(3000)}}
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(cfg)
    assert info.value.errors[0][0] == "rope_scaling"


def test_message_builders_bound_what_they_render():
    """The renderers themselves (reached without the entry check) never recurse: json_value, the Hugging Face
    model_type check, the unknown-key warning, an argument check."""
    from modkit.core.arguments import check_int
    from modkit.core.errors import ArgumentError
    from modkit.io.hf import _model_type

    deep = _deep(100_000)
    assert json_value(deep) == "[" * 57 + "..."
    assert json_value(list(range(10**6))).endswith("...") and len(json_value(list(range(10**6)))) <= 60
    assert json_value({"a": deep}, 20) == '{"a": [[[[[[[[[[[...'
    with pytest.raises(SpecError, match=r"model_type: must be a string .* got an array \[\[\[\["):
        _model_type({"model_type": deep})
    assert "k = [[[[" in str(UnknownConfigKeyWarning("llama", {"k": deep}))
    with pytest.raises(ArgumentError, match=r"seed must be an integer, got list \[\[\[\["):
        check_int(deep, "seed", minimum=0)


# ------------------------------------------------------------------------------------------------ integer bounds


def test_generate_prompt_ids_past_int64_name_the_value_and_the_bound(tmp_path, capsys):
    """Fuzz finding: ``modkit generate ... --prompt 18446744073709551616`` printed torch's ``Overflow when unpacking
    long long``. Now the id and the bound are named, before the model loads and against its vocabulary."""
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    for prompt, fragment in [
        ("18446744073709551616", "--prompt holds the token id 18446744073709551616, outside [0, 16,777,216)"),
        ("1, -5", "--prompt holds the token id -5, outside [0, 16,777,216)"),
        ("1 64", "--prompt holds the token id 64, outside the model's vocabulary [0, 64) (vocab_size = 64)"),
    ]:
        assert cli.main(["generate", str(spec), "--prompt", prompt, "--max-new-tokens", "1"]) == 1
        err = capsys.readouterr().err
        assert fragment in err and "Overflow" not in err, err


def test_generate_in_python_names_the_vocabulary_bound():
    from modkit.core.errors import ArgumentError
    from modkit.inference.generate import generate

    model = modkit.build(TINY, seed=0).eval()
    for ids in ([[2**64]], [[1, 2**63]], [[-1]], [[64]]):
        with pytest.raises(
            ArgumentError, match=r"input_ids must lie in \[0, 64\) \(the vocabulary\); got the token id"
        ):
            generate(model, ids, max_new_tokens=1)


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--context", str(2**64)], "--context must be at most 134,217,728 (modkit.core.limits.MAX_SEQ_LEN"),
        (["--train-seq-len", str(2**64)], "--train-seq-len must be at most 134,217,728"),
        (["--batch", str(2**64)], "past the 2**63 bytes a tensor size can express"),
        (["--batch", str(10**12), "--context", str(2**27)], "past the 2**63 bytes a tensor size can express"),
    ],
)
def test_cost_flags_past_their_bounds_are_named(argv, fragment, capsys):
    assert cli.main(["cost", str(REPO / "specs" / "tiny-llama.json"), *argv]) == 1
    err = capsys.readouterr().err
    assert fragment in err and "internal error" not in err, err


def test_a_bpe_size_past_the_vocabulary_bound_is_named():
    from modkit.data import DataError
    from modkit.data.tokenizer import parse_spec

    with pytest.raises(DataError, match=r"18,446,744,073,709,551,616 is over 16,777,216, modkit's bound on vocab_size"):
        parse_spec("bpe:18446744073709551616")
    with pytest.raises(DataError, match="bpe needs a vocabulary size, an integer"):
        parse_spec("bpe:²")  # a digit to str.isdigit, not to int()
