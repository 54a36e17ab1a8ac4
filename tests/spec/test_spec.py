"""Spec validation: errors name the field and value (head counts, one error per bad field,
closest type names), round trips, schema export."""

import json

import pytest

import modkit
from modkit import SpecError
from tests.conftest import tiny_spec


def _errors(spec: dict) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.load_spec(spec)
    assert isinstance(info.value, ValueError)
    return info.value.errors


@pytest.mark.parametrize(
    "n_heads,n_kv_heads,fragment",
    [
        (7, 2, "n_kv_heads = 2 does not divide n_heads = 7; use a divisor of n_heads: 1, 7"),
        (8, 0, "greater than 0"),
        (8, 16, "n_kv_heads = 16 exceeds n_heads = 8; use a divisor of n_heads: 1, 2, 4, 8"),
    ],
)
def test_c06_head_counts_rejected_at_validation(n_heads, n_kv_heads, fragment):
    spec = tiny_spec(d_model=224, block__attention={"type": "gqa", "n_heads": n_heads, "n_kv_heads": n_kv_heads})
    errors = _errors(spec)
    assert len(errors) == 1, errors
    path, msg = errors[0]
    assert path == "block.attention.n_kv_heads"
    assert fragment in msg


def test_c06_derived_head_dim_needs_divisible_d_model():
    spec = tiny_spec(d_model=36, block__attention={"type": "gqa", "n_heads": 8, "n_kv_heads": 2})
    ((path, msg),) = _errors(spec)
    assert path == "block.attention.n_heads"
    assert "d_model = 36" in msg and "n_heads = 8" in msg


@pytest.mark.parametrize("kv", [2, 1, 8])
def test_c06_valid_head_counts_pass(kv):
    spec = modkit.load_spec(tiny_spec(block__attention={"type": "gqa", "n_heads": 8, "n_kv_heads": kv}))
    model = modkit.build(spec, device="meta")
    attn = model.layers[0].attention
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (8, kv, 4)
    assert attn.k_proj.weight.shape == (kv * 4, 32)


def test_mha_mqa_constraints():
    ((path, msg),) = _errors(tiny_spec(block__attention={"type": "mqa", "n_heads": 4, "n_kv_heads": 2}))
    assert "mqa has n_kv_heads = 1" in msg
    ((path, msg),) = _errors(tiny_spec(block__attention={"type": "mha", "n_heads": 4, "n_kv_heads": 2}))
    assert "use gqa" in msg
    assert (
        modkit.build(tiny_spec(block__attention={"type": "mqa", "n_heads": 4}), device="meta")
        .layers[0]
        .attention.n_kv_heads
        == 1
    )


def test_c13_one_error_per_bad_field_in_override():
    spec = tiny_spec(
        n_layers=4,
        overrides=[
            {"layers": [0], "ffn": {"type": "swiglu", "d_ff": 32}},
            {"layers": [1], "ffn": {"type": "mlp", "d_ff": 32}},
            {"layers": [2], "ffn": {"type": "swiglu", "hidden": 5}},
        ],
    )
    errors = _errors(spec)
    # one error at the override's field, naming the chosen type; d_ff missing is a second, real error
    paths = sorted(p for p, _ in errors)
    assert paths == ["overrides[2].ffn.d_ff", "overrides[2].ffn.hidden"], errors
    msg = dict(errors)["overrides[2].ffn.hidden"]
    assert "'swiglu'" in msg and "valid fields" in msg and "d_ff" in msg


@pytest.mark.parametrize(
    "slot,bad,message",
    [
        (
            "ffn",
            {"type": "swigloo", "d_ff": 64},
            "unknown ffn type 'swigloo'; did you mean 'swiglu'? (modkit list ffn lists the 5 ffn types)",
        ),
        (
            "attention",
            {"type": "mamba3"},
            "unknown mixer type 'mamba3'; did you mean 'mamba' or 'mamba2'? (modkit list attention and modkit list "
            "mixer list the 16 types a mixer slot takes)",
        ),
        (
            "norm",
            {"type": "zzzz"},
            "unknown norm type 'zzzz'; no norm type is close to it (modkit list norm lists the 3 norm types)",
        ),
    ],
)
def test_c13_unknown_type_names_its_close_matches_and_where_the_list_is(slot, bad, message):
    """An unknown type names the close matches among its own kind's types and the command that lists them all,
    not every type and plugin installed."""
    ((path, msg),) = _errors(tiny_spec(**{f"block__{slot}": bad}))
    assert (path, msg) == (f"block.{slot}.type", message)


def test_every_error_is_reported_at_once():
    spec = tiny_spec(vocab_size=0, d_model=-1, block__norm={"type": "rmsnorm", "epsilon": 1e-5})
    paths = {p for p, _ in _errors(spec)}
    assert {"vocab_size", "d_model", "block.norm.epsilon"} <= paths


def test_unknown_top_level_key_and_missing_fields():
    spec = tiny_spec(n_layer=3)
    assert ("n_layer") in {p for p, _ in _errors(spec)}
    spec = tiny_spec()
    del spec["block"]["ffn"]
    assert ("block.ffn", "Field required") in _errors(spec)


def test_override_layer_out_of_range():
    spec = tiny_spec(overrides=[{"layers": [0, 5], "ffn": {"type": "mlp", "d_ff": 8}}])
    ((path, msg),) = _errors(spec)
    assert path == "overrides[0].layers[1]" and "n_layers = 2" in msg


def test_override_applies_to_selected_layers():
    spec = modkit.load_spec(
        tiny_spec(n_layers=6, overrides=[{"layers": {"start": 1, "step": 2}, "ffn": {"type": "mlp", "d_ff": 16}}])
    )
    kinds = [spec.layer(i).ffn.type for i in range(6)]
    assert kinds == ["swiglu", "mlp"] * 3


def test_malformed_json_reports_line_and_column(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n  "schema_version": 1,\n  "d_model": ,\n}')
    with pytest.raises(SpecError) as info:
        modkit.load_spec(p)
    assert "line 3" in str(info.value)


def test_round_trip_is_lossless():
    spec = modkit.load_spec(tiny_spec(overrides=[{"layers": [1], "attention": {"type": "mha", "n_heads": 4}}]))
    again = modkit.load_spec(json.loads(spec.to_json()))
    assert again == spec
    assert again.to_dict() == spec.to_dict()


def test_schema_export_and_dollar_schema_key():
    schema = modkit.json_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    text = json.dumps(schema)
    for t in modkit.get_registry().types("ffn"):
        assert f'"{t}"' in text
    spec = tiny_spec(**{"$schema": "./modkit.schema.json"})
    assert modkit.load_spec(spec).schema_uri == "./modkit.schema.json"


def test_spec_cannot_name_python_code():
    ((path, msg),) = _errors(tiny_spec(block__ffn={"type": "os.system", "d_ff": 8}))
    assert path == "block.ffn.type" and "unknown ffn type" in msg
    errors = _errors(tiny_spec(block__ffn={"_target_": "torch.nn.Linear", "type": "mlp", "d_ff": 8}))
    assert any("_target_" in p for p, _ in errors)


def test_layer_source_names_the_field_that_sets_a_layers_component():
    """Refusals name what a user edits: the last override that sets a slot of a layer, else the block default."""
    spec = modkit.load_spec(
        tiny_spec(
            n_layers=4,
            overrides=[
                {"layers": {"start": 0, "step": 2}, "ffn": {"type": "mlp", "d_ff": 32}},
                {"layers": [2], "ffn": {"type": "swiglu", "d_ff": 16}, "norm": {"type": "layernorm"}},
            ],
        )
    )
    assert [spec.layer_source(i, "ffn") for i in range(4)] == [
        "overrides[0].ffn",
        "block.ffn",
        "overrides[1].ffn",
        "block.ffn",
    ]
    assert [spec.layer_source(i, "norm") for i in (1, 2)] == ["block.norm", "overrides[1].norm"]
    assert spec.layer_source(3, "position") == "position"
    with pytest.raises(IndexError):
        spec.layer_source(4, "ffn")
