"""The text of spec errors: every problem at once, JSON paths only, the union branch the input meant, values in JSON
terms, and a hint at a trailing comma.

Before: a spec with a schema error (``block.ffn.d_ff = -1``) and an independent cross-field error (``d_model`` not
divisible by ``n_heads``) reported only the first; ``"layers": "all"`` read ``Input should be a valid list (got
'all') or Input should be a valid dictionary or instance of LayerRange``; a missing ``n_kv_heads`` of ``gqa`` was
reported at ``block.attention``; ``null`` read ``(got None)``, ``true`` ``(got True) (got True)``; a trailing comma
was reported at the next line as ``Expecting property name enclosed in double quotes``.
"""

from __future__ import annotations

import json
import re

import pytest

import modkit
from conftest import tiny_spec
from modkit import SpecError

#: a JSON path: keys joined by dots, array indices in brackets
JSON_PATH = re.compile(r"^([a-z_$][a-z0-9_]*|\[\d+\])(\.[a-z_$][a-z0-9_]*|\[\d+\])*$")


def errors_of(source) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.load_spec(source)
    return info.value.errors


def override(layers) -> dict:
    return tiny_spec(overrides=[{"layers": layers, "ffn": {"type": "mlp", "d_ff": 8}}])


# ------------------------------------------------------------------------------------------------ every error at once


def test_a_schema_error_and_an_independent_cross_field_error_are_reported_together():
    spec = tiny_spec(d_model=34, block__ffn={"type": "swiglu", "d_ff": -1})  # 34 is not divisible by n_heads = 4
    errors = dict(errors_of(spec))
    assert set(errors) == {"block.ffn.d_ff", "block.attention.n_heads"}, errors
    assert "greater than 0" in errors["block.ffn.d_ff"]
    assert "d_model = 34 is not divisible by n_heads = 4" in errors["block.attention.n_heads"]


def test_cross_field_errors_of_overrides_and_sizes_come_with_schema_errors():
    spec = tiny_spec(
        final_norm={"type": "rmsnorm", "eps": "small"},
        overrides=[
            {"layers": [0, 7], "ffn": {"type": "mlp", "d_ff": 8}},  # layer 7 of 2
            {"layers": [1], "attention": {"type": "gqa", "n_heads": 3, "n_kv_heads": 1}},  # 32 % 3 != 0
        ],
    )
    paths = {p for p, _ in errors_of(spec)}
    assert paths == {"final_norm.eps", "overrides[0].layers[1]", "overrides[1].attention.n_heads"}, paths


def test_a_component_that_fails_the_schema_is_not_cross_checked():
    """Its own fields are unknown, so a cross-field check of it would guess: only the schema error is reported."""
    spec = tiny_spec(d_model=34, block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 3})
    assert [p for p, _ in errors_of(spec)] == ["block.attention.n_kv_heads"]


def test_no_cross_field_checks_when_a_model_wide_size_is_invalid():
    spec = tiny_spec(d_model="32", block__ffn={"type": "swiglu", "d_ff": -1})
    assert {p for p, _ in errors_of(spec)} == {"d_model", "block.ffn.d_ff"}


def test_duplicate_keys_come_with_the_schema_errors_of_the_same_file(tmp_path):
    text = json.dumps(tiny_spec(block__ffn={"type": "swiglu", "d_ff": -1}))
    path = tmp_path / "dup.json"
    path.write_text(text[:-1] + ', "n_layers": 2}')
    assert {p for p, _ in errors_of(path)} == {"n_layers", "block.ffn.d_ff"}


# ------------------------------------------------------------------------------------------------ JSON paths, branches


@pytest.mark.parametrize(
    "spec",
    [
        override("all"),
        override({"start": 2, "stop": 1}),
        override({"strat": 1}),
        override({"step": 0}),
        override([0, -1]),
        override({"start": -1}),
        override(5),
        tiny_spec(embedding_scale="sqrt"),
        tiny_spec(metadata={"source": [1]}),
        tiny_spec(block__attention={"type": "gqa", "n_heads": 4}),
        tiny_spec(position={"type": "rope", "scaling": 5}),
        tiny_spec(block__ffn={"type": "moe", "n_experts": 4, "expert": {"type": "swiglu", "d_ff": None}}),
    ],
)
def test_paths_are_json_paths_and_messages_name_no_python_class(spec):
    for path, message in errors_of(spec):
        assert JSON_PATH.match(path), path
        assert not re.search(
            r"LayerRange|Spec\b|Config\b|dictionary|instance of|function-after|constrained", message
        ), message


def test_a_missing_field_is_named_where_it_belongs():
    ((path, message),) = errors_of(tiny_spec(block__attention={"type": "gqa", "n_heads": 4}))
    assert path == "block.attention.n_kv_heads" and "gqa needs n_kv_heads" in message and "got" not in message


def test_an_unknown_key_of_a_layer_range_lists_the_valid_ones():
    ((path, message),) = errors_of(override({"strat": 1}))
    assert path == "overrides[0].layers.strat" and "valid fields: start, stop, step" in message
    assert "did you mean 'start'" in message


@pytest.mark.parametrize(
    "layers, path, fragment, absent",
    [
        ({"start": -1}, "overrides[0].layers.start", "greater than or equal to 0", "array"),  # the object branch
        ({"start": 2, "stop": 1}, "overrides[0].layers", "selects no layer", "array"),
        ([0, -1], "overrides[0].layers[1]", "greater than or equal to 0", "object"),  # the array branch
        ([], "overrides[0].layers", "at least 1 item", "object"),
    ],
)
def test_the_union_branch_of_the_inputs_json_type_is_the_one_reported(layers, path, fragment, absent):
    ((got_path, message),) = errors_of(override(layers))
    assert (got_path, fragment in message, absent in message) == (path, True, False), message


def test_a_value_of_no_branchs_type_names_every_accepted_type_once():
    ((path, message),) = errors_of(override("all"))
    assert path == "overrides[0].layers"
    assert message == 'Input should be an array or an object, not a string (got "all")'
    ((path, message),) = errors_of(tiny_spec(metadata={"source": [1]}))
    assert path == "metadata.source"
    assert message == "Input should be a string, an integer, a number or a boolean, not an array"


def test_a_string_for_a_string_or_number_field_is_checked_against_the_string_choice():
    ((path, message),) = errors_of(tiny_spec(embedding_scale="sqrt"))
    assert (path, message) == ("embedding_scale", 'Input should be "sqrt_d_model" (got "sqrt")')
    ((path, message),) = errors_of(tiny_spec(embedding_scale=-1))
    assert (path, message) == ("embedding_scale", "Input should be greater than 0 (got -1)")


# ------------------------------------------------------------------------------------------------ values as JSON


@pytest.mark.parametrize(
    "changes, path, message",
    [
        (dict(tie_embeddings=None), "tie_embeddings", "Input should be a valid boolean, not null"),
        (dict(n_layers=True), "n_layers", "Input should be a valid integer, not a boolean (got true)"),
        (dict(schema_version=True), "schema_version", "schema_version must be the integer 1, not a boolean (got true)"),
        (dict(d_model="128"), "d_model", 'Input should be a valid integer, not a string (got "128")'),
        (
            dict(final_norm={"type": "rmsnorm", "eps": None}),
            "final_norm.eps",
            "Input should be a valid number, not null",
        ),
        (
            dict(position={"type": "rope", "scaling": 5}),
            "position.scaling",
            "Input should be an object or null, not an integer (got 5)",
        ),
        (dict(final_norm="rmsnorm"), "final_norm", 'Input should be an object or null, not a string (got "rmsnorm")'),
        (dict(position="rope"), "position", 'Input should be an object, not a string (got "rope")'),
        (dict(n_layers="2"), "n_layers", 'Input should be a valid integer, not a string (got "2")'),
    ],
)
def test_values_are_written_as_json_once(changes, path, message):
    """Values in JSON terms, once; a key that may be null (``final_norm``, rope's ``scaling``) says so, others do not."""
    assert errors_of(tiny_spec(**changes)) == [(path, message)]


# ------------------------------------------------------------------------------------------------ syntax


@pytest.mark.parametrize(
    "text, where",
    [
        ('{\n  "schema_version": 1,\n  "vocab_size": 10,\n}\n', "line 3, column 19"),
        ('{"a": [1, 2,\n  ]\n}\n', "line 1, column 12"),
        ('{"a": {"b": 1 ,  }}', "line 1, column 15"),
    ],
)
def test_a_trailing_comma_is_named_at_the_comma(tmp_path, text, where):
    path = tmp_path / "comma.json"
    path.write_text(text)
    ((p, message),) = errors_of(path)
    assert p == "" and message == f"not valid JSON: trailing comma after the last item at {where}: remove it"


def test_other_syntax_errors_keep_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "d_model": ,\n}')
    ((p, message),) = errors_of(path)
    assert message == "not valid JSON: Expecting value at line 2, column 14"


# ------------------------------------------------------------------------------------------------ training configs


def test_training_config_errors_use_json_paths_and_values():
    from modkit.train.config import load_train_config

    with pytest.raises(SpecError) as info:
        load_train_config({"model": 5, "lr": None, "compile": True, "batch_size": True})
    errors = dict(info.value.errors)
    assert set(errors) == {"model", "lr", "batch_size"}, errors
    assert errors["model"] == "Input should be a string, an object or null, not an integer (got 5)"
    assert errors["lr"] == "Input should be a valid number, not null"
    assert errors["batch_size"] == "Input should be a valid integer, not a boolean (got true)"


# ------------------------------------------------------------------------------------------------ renamed and misplaced fields


def test_a_renamed_field_is_one_error_with_the_name_it_stands_for():
    # before: `block.ffn.d_ff: Field required` beside the unknown-field message
    assert errors_of(tiny_spec(block__ffn={"type": "swiglu", "dff": 64})) == [
        (
            "block.ffn.dff",
            "unknown field 'dff' for 'swiglu'; valid fields: d_ff, bias, activation, gate_multiplier, output_multiplier, activation_sparsity; did you mean 'd_ff'?",
        )
    ]
    errs = errors_of(tiny_spec(overrides=[{"layers": {"start": 1}, "ffn": {"type": "mlp", "dff": 8}}]))
    assert [p for p, _ in errs] == ["overrides[0].ffn.dff"] and "did you mean 'd_ff'?" in errs[0][1]
    # a missing required field with no look-alike beside it is still reported
    errs = errors_of(tiny_spec(block__ffn={"type": "swiglu", "bias": False, "zzz": 1}))
    assert ("block.ffn.d_ff", "Field required") in errs and any(p == "block.ffn.zzz" for p, _ in errs)


def test_a_field_one_level_off_names_the_component_it_belongs_to():
    spec = tiny_spec()
    spec["block"]["qk_norm"] = {"type": "rmsnorm"}
    path, msg = errors_of(spec)[0]
    assert path == "block.qk_norm"
    assert msg.startswith("unknown field 'qk_norm'")
    assert msg.endswith("it is a field of block.attention ('gqa'): move it there (block.attention.qk_norm)")
    spec = tiny_spec()
    spec["block"]["attention"]["d_ff"] = 64  # beside its component: the ffn's field put in the attention
    ((path, msg),) = errors_of(spec)
    assert path == "block.attention.d_ff" and msg.endswith(
        "it is a field of block.ffn ('swiglu'): move it there (block.ffn.d_ff)"
    )
    spec = tiny_spec()
    spec["block"]["nonsense"] = 1
    assert "move it" not in errors_of(spec)[0][1]
