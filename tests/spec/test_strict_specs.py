"""Specs are strict: JSON types are not coerced, floats are finite, sizes are bounded, layer selections are not
empty, keys are not repeated, and unreadable files get a SpecError naming the file.

Each case below used to validate (or end in a raw Python exception): ``true`` as ``n_layers = 1``, ``"128"`` as
128, ``1e12`` as an int, ``"yes"`` as true, NaN eps giving non-finite logits, ``n_layers: 100000`` building for
over a minute, a 2**63 vocabulary reaching torch as a TypeError, duplicate keys silently keeping the last one.
"""

from __future__ import annotations

import json
import math
import os
import signal
from typing import Literal, Optional

import pytest
from pydantic import Field

import modkit
from modkit.core import limits
from modkit.core.errors import MemoryLimitError, SpecError

from conftest import registry_with, tiny_spec


def errors_of(data, **kwargs) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.load_spec(data if isinstance(data, str) else json.dumps(data), **kwargs)
    return info.value.errors


def only_error(data) -> tuple[str, str]:
    errors = errors_of(data)
    assert len(errors) == 1, errors
    return errors[0]


# ------------------------------------------------------------------------------------------------ strict types

MOE_FFN = {
    "type": "moe",
    "n_experts": 4,
    "top_k": 2,
    "expert": {"type": "swiglu", "d_ff": 32},
    "router": {"type": "topk", "renormalize": True},
}


@pytest.mark.parametrize(
    "changes, path, fragment",
    [
        (dict(n_layers=True), "n_layers", "not a bool"),
        (dict(n_layers=False), "n_layers", "not a bool"),
        (dict(d_model="128"), "d_model", "not a string"),
        (dict(vocab_size=1e12), "vocab_size", "not a float"),
        (dict(vocab_size=64.0), "vocab_size", "without a decimal point"),
        (dict(max_seq_len="64"), "max_seq_len", "not a string"),
        (dict(tie_embeddings="yes"), "tie_embeddings", "not a string"),
        (dict(tie_embeddings=1), "tie_embeddings", "not an integer"),
        (dict(lm_head_bias=0), "lm_head_bias", "valid boolean"),
        (dict(schema_version=True), "schema_version", "not a bool"),
        (dict(init_std=True), "init_std", "not a bool"),
        (dict(init_std="0.02"), "init_std", "not a string"),
        (dict(name=5), "name", "not an integer"),
        (dict(final_norm={"type": "rmsnorm", "eps": True}), "final_norm.eps", "not a bool"),
        (
            dict(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": True}),
            "block.attention.n_kv_heads",
            "not a bool",
        ),
        (
            dict(block__attention={"type": "gqa", "n_heads": 4.0, "n_kv_heads": 2}),
            "block.attention.n_heads",
            "not a float",
        ),
        (
            dict(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "q_bias": "false"}),
            "block.attention.q_bias",
            "valid boolean",
        ),
        (dict(block__ffn={"type": "swiglu", "d_ff": "64"}), "block.ffn.d_ff", "not a string"),
        (dict(position={"type": "rope", "theta": "10000"}), "position.theta", "not a string"),
        (
            dict(position={"type": "rope", "scaling": {"type": "linear", "factor": True}}),
            "position.scaling.factor",
            "not a bool",
        ),
        (dict(block__ffn={**MOE_FFN, "top_k": 2.0}), "block.ffn.top_k", "not a float"),
        (dict(embedding_scale=True), "embedding_scale", "not a bool"),
    ],
)
def test_json_types_are_not_coerced(changes, path, fragment):
    got_path, message = only_error(tiny_spec(**changes))
    assert got_path == path
    assert fragment in message


def test_ints_are_accepted_where_floats_are_expected():
    spec = modkit.load_spec(
        tiny_spec(position={"type": "rope", "theta": 10000}, init_std=1, final_norm={"type": "rmsnorm", "eps": 1})
    )
    assert spec.position.theta == 10000.0 and isinstance(spec.position.theta, float) and spec.init_std == 1.0


#: every float field of the built-in components and of the spec, as (spec changes, path of the field)
FLOAT_FIELDS = [
    (lambda v: dict(final_norm={"type": "rmsnorm", "eps": v}), "final_norm.eps"),
    (lambda v: dict(final_norm={"type": "layernorm", "eps": v}), "final_norm.eps"),
    (lambda v: dict(position={"type": "rope", "theta": v}), "position.theta"),
    (lambda v: dict(position={"type": "rope", "partial_rotary": v}), "position.partial_rotary"),
    (lambda v: dict(position={"type": "rope", "scaling": {"type": "linear", "factor": v}}), "position.scaling.factor"),
    (
        lambda v: dict(
            position={
                "type": "rope",
                "scaling": {
                    "type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": v,
                    "high_freq_factor": 4.0,
                    "original_max_seq_len": 32,
                },
            }
        ),
        "position.scaling.low_freq_factor",
    ),
    (lambda v: dict(position={"type": "sinusoidal", "base": v}), "position.base"),
    (lambda v: dict(position={"type": "alibi", "scale": v}), "position.scale"),
    (
        lambda v: dict(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "softmax_scale": v}),
        "block.attention.softmax_scale",
    ),
    (lambda v: dict(block__ffn={**MOE_FFN, "aux_loss_coef": v}), "block.ffn.aux_loss_coef"),
    (lambda v: dict(block__ffn={**MOE_FFN, "z_loss_coef": v}), "block.ffn.z_loss_coef"),
    (lambda v: dict(block__ffn={**MOE_FFN, "capacity_factor": v}), "block.ffn.capacity_factor"),
    (lambda v: dict(init_std=v), "init_std"),
    (lambda v: dict(final_logit_softcap=v), "final_logit_softcap"),
    (lambda v: dict(embedding_scale=v), "embedding_scale"),
    (lambda v: dict(metadata={"lr": v}), "metadata.lr"),
]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("make, path", FLOAT_FIELDS, ids=[p for _, p in FLOAT_FIELDS])
def test_non_finite_floats_are_refused_in_every_float_field(make, path, value):
    finite = 10000.0 if path in ("position.theta", "position.base") else 0.5  # a base is at least 1
    assert modkit.load_spec(tiny_spec(**make(finite)))  # the field itself accepts a finite value
    got_path, message = only_error(tiny_spec(**make(value)))
    assert got_path == path
    assert "finite" in message


def test_a_third_party_config_is_strict_too():
    """Strictness lives in the shared base class: a plugin's own config refuses NaN, bools and strings alike."""

    class ScaledNormConfig(modkit.ComponentConfig):
        type: Literal["scalednorm"] = "scalednorm"
        eps: float = Field(1e-5, gt=0, description="epsilon")
        groups: int = Field(1, ge=1, description="groups")
        learnable: Optional[bool] = Field(None, description="flag")

    norm = next(c for c in modkit.get_registry().components("norm") if c.type == "rmsnorm")
    comp = modkit.Component(
        kind="norm", type="scalednorm", config=ScaledNormConfig, factory=norm.factory, description="test"
    )
    reg = registry_with("scaled-norm-plugin", comp)
    for field, value, fragment in [
        ("eps", math.nan, "finite"),
        ("eps", "1e-5", "not a string"),
        ("groups", True, "not a bool"),
        ("groups", 2.0, "not a float"),
        ("learnable", "yes", "not a string"),
    ]:
        spec = tiny_spec(final_norm={"type": "scalednorm", field: value})
        errors = errors_of(spec, registry=reg)
        assert errors == [(f"final_norm.{field}", errors[0][1])] and fragment in errors[0][1], errors


# ------------------------------------------------------------------------------------------------ duplicate keys


def test_duplicate_keys_are_errors_naming_key_and_path():
    text = json.dumps(tiny_spec())
    assert only_error(text[:-1] + ', "d_model": 64}') == (
        "d_model",
        "duplicate key 'd_model' in one object; give each key once",
    )
    nested = text.replace('"placement": {"type": "pre"}', '"placement": {"type": "pre", "type": "post"}')
    assert only_error(nested)[0] == "block.placement.type"
    overrides = json.dumps(tiny_spec(overrides=[{"layers": [0], "ffn": {"type": "mlp", "d_ff": 8}}]))
    dup = overrides.replace('"layers": [0]', '"layers": [0], "layers": [1]')
    assert only_error(dup)[0] == "overrides[0].layers"


# ------------------------------------------------------------------------------------------------ layer ranges


@pytest.mark.parametrize(
    "layers, fragment",
    [
        ([], "at least 1 item"),
        ({"start": 3, "stop": 1}, "selects no layer"),
        ({"start": 1, "stop": 1}, "selects no layer"),
        ({"step": 0}, "greater than 0"),
        ([True], "not a bool"),
        ([1.0], "not a float"),
        ({"start": -1}, "greater than or equal to 0"),
    ],
)
def test_empty_or_malformed_layer_selections_are_errors(layers, fragment):
    path, message = only_error(tiny_spec(overrides=[{"layers": layers, "ffn": {"type": "mlp", "d_ff": 8}}]))
    assert path.startswith("overrides[0].layers")
    assert fragment in message


# ------------------------------------------------------------------------------------------------ size bounds

BOUNDED = [
    (lambda v: dict(vocab_size=v), "vocab_size", limits.MAX_VOCAB_SIZE),
    (lambda v: dict(d_model=v), "d_model", limits.MAX_D_MODEL),
    (lambda v: dict(n_layers=v), "n_layers", limits.MAX_LAYERS),
    (lambda v: dict(max_seq_len=v), "max_seq_len", limits.MAX_SEQ_LEN),
    (lambda v: dict(block__attention={"type": "mha", "n_heads": v}), "block.attention.n_heads", limits.MAX_HEADS),
    (
        lambda v: dict(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": v}),
        "block.attention.head_dim",
        limits.MAX_HEAD_DIM,
    ),
    (
        lambda v: dict(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": v}),
        "block.attention.sliding_window",
        limits.MAX_SEQ_LEN,
    ),
    (lambda v: dict(block__ffn={"type": "swiglu", "d_ff": v}), "block.ffn.d_ff", limits.MAX_D_FF),
    (lambda v: dict(block__ffn={**MOE_FFN, "n_experts": v}), "block.ffn.n_experts", limits.MAX_EXPERTS),
]


@pytest.mark.parametrize("make, path, bound", BOUNDED, ids=[p for _, p, _ in BOUNDED])
def test_every_size_has_a_documented_bound(make, path, bound):
    for value in (bound + 1, 2**63, 10**30):
        got_path, message = only_error(tiny_spec(**make(value)))
        assert got_path == path and f"less than or equal to {bound}" in message, message


def test_the_bounds_lie_far_above_every_shipped_and_published_model():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for f in sorted((root / "specs").glob("*.json")):
        s = modkit.load_spec(f)
        assert s.n_layers * 4 <= limits.MAX_LAYERS and s.vocab_size * 16 <= limits.MAX_VOCAB_SIZE
        assert s.d_model * 4 <= limits.MAX_D_MODEL and s.max_seq_len * 4 <= limits.MAX_SEQ_LEN


def test_a_spec_at_the_layer_bound_builds_on_meta():
    model = modkit.build(tiny_spec(n_layers=limits.MAX_LAYERS), device="meta")
    assert len(model.layers) == limits.MAX_LAYERS


def test_a_huge_hf_config_is_refused_at_its_key_without_converting_layer_by_layer():
    config = {
        "model_type": "llama",
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 10**8,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
    }
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(config)
    assert [p for p, _ in info.value.errors] == ["num_hidden_layers"]
    assert "512" in info.value.errors[0][1]


@pytest.fixture
def little_memory(monkeypatch):
    """Pretend the CPU has 1 MiB free."""
    import modkit.nn.memory as mem

    monkeypatch.setattr(mem, "available_bytes", lambda device: 2**20)
    return 2**20


def test_build_refuses_what_cannot_fit_with_the_estimate_and_the_memory_available(little_memory):
    spec = tiny_spec(vocab_size=4096, d_model=64)
    with pytest.raises(MemoryLimitError) as info:
        modkit.build(spec, device="cpu")
    needed = sum(t.numel() * t.element_size() for t in modkit.build(spec, device="meta").state_dict().values())
    assert info.value.needed >= needed and info.value.available == little_memory
    assert "1.00 MiB is available" in str(info.value) and "check_memory=False" in str(info.value)
    assert modkit.build(spec, device="cpu", check_memory=False).embed.weight.shape == (4096, 64)  # the override
    assert modkit.build(spec, device="meta").embed.weight.is_meta  # meta needs nothing


def test_generate_refuses_a_kv_cache_that_cannot_fit(little_memory):
    from modkit.inference.generate import generate

    model = modkit.build(tiny_spec(max_seq_len=2**14), seed=0, check_memory=False).eval()
    with pytest.raises(MemoryLimitError, match="KV cache"):
        generate(model, [[1, 2, 3]], max_new_tokens=2**14 - 3)
    out = generate(model, [[1, 2, 3]], max_new_tokens=2, check_memory=False)
    assert out.shape == (1, 5)


def test_cli_build_refuses_and_can_be_overridden(little_memory, tmp_path, capsys):
    from modkit.cli import main

    f = tmp_path / "s.json"
    f.write_text(json.dumps(tiny_spec(vocab_size=4096, d_model=64)))
    assert main(["build", str(f), "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "would need about" in err and "--no-memory-check" in err and "internal error" not in err
    assert main(["build", str(f), "--device", "cpu", "--no-memory-check", "--json"]) == 0


# ------------------------------------------------------------------------------------------------ files


@pytest.fixture
def spec_file(tmp_path):
    def make(data: bytes):
        f = tmp_path / "spec.json"
        f.write_bytes(data)
        return f

    return make


def root_error(source) -> str:
    errors = errors_of(str(source))
    assert len(errors) == 1 and errors[0][0] == "", errors
    return errors[0][1]


def test_binary_and_utf16_files_are_named_spec_errors(spec_file):
    text = json.dumps(tiny_spec())
    assert "UTF-16" in root_error(spec_file(text.encode("utf-16")))
    assert "UTF-16" in root_error(spec_file(text.encode("utf-16-le")))  # no byte-order mark
    assert "UTF-32" in root_error(spec_file(text.encode("utf-32")))
    assert "not UTF-8" in root_error(spec_file(bytes(range(128, 256))))
    assert "empty" in root_error(spec_file(b""))
    assert modkit.load_spec(spec_file(b"\xef\xbb\xbf" + text.encode())).name == "test-tiny"  # a UTF-8 BOM is fine
    with pytest.raises(SpecError) as info:
        modkit.load_spec(spec_file(b"\x00\x01binary"))
    assert info.value.source and info.value.source.endswith("spec.json")


def test_huge_integers_and_deep_nesting_are_named(spec_file):
    text = json.dumps(tiny_spec())
    errors = errors_of(str(spec_file(text.replace('"d_model": 32', '"d_model": ' + "9" * 5000).encode())))
    assert errors == [("d_model", "an integer of 5,000 digits; no value in a spec or config needs more than a few")]
    assert "nested too deeply" in root_error(spec_file(b"[" * 100_000 + b"]" * 100_000))
    deep = text.replace('"metadata"', '"x"')[:-1] + ', "metadata": {"a": ' + "[" * 70 + "]" * 70 + "}}"
    assert errors_of(str(spec_file(deep.encode())))[0] == (
        "metadata",
        "nested deeper than 64 levels of objects and arrays, modkit's bound (modkit.core.limits.MAX_JSON_DEPTH; "
        'a spec nests about 6); got {"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[...',
    )


def _with_alarm(fn, seconds=10):
    def fail(*_):
        raise TimeoutError("blocked reading a special file")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_are_refused_without_reading_them(tmp_path):
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    assert "FIFO" in _with_alarm(lambda: root_error(fifo))
    if os.path.exists("/dev/zero"):
        assert "device" in _with_alarm(lambda: root_error("/dev/zero"))
    assert "folder" in root_error(tmp_path)
    assert "no such file" in root_error(tmp_path / "missing.json")
    assert "NUL" in root_error(str(tmp_path / "spec") + "\x00.json")


def test_oversized_files_are_refused(spec_file):
    big = json.dumps({**tiny_spec(), "description": "x" * (limits.MAX_JSON_BYTES + 1)})
    assert "16,777,216-byte limit" in root_error(spec_file(big.encode()))


def test_validate_goes_on_to_the_next_file(tmp_path, capsys):
    from modkit.cli import main

    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_bytes(json.dumps(tiny_spec()).encode("utf-16"))
    good.write_text(json.dumps(tiny_spec()))
    code = main(["validate", str(bad), str(good)])
    out, err = capsys.readouterr()
    assert code == 1 and f"ok {good}" in out
    assert f"{bad}: the text is encoded as UTF-16; save it as UTF-8" in err and "1 of 2 spec(s) invalid" in err
