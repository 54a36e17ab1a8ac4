"""Every malformed Hugging Face config, checkpoint or index gets a named error (SpecError naming the config's key,
or CheckpointError naming the file and tensor), never a raw exception; non-finite weights are counted.

Before: a config.json that is a list or null raised AttributeError, ``rope_scaling.factor: []`` a TypeError, a dict
``model_type`` "unhashable type", NaN ``rms_norm_eps`` was reported at ``block.norm.eps`` (a path of the converted
spec), checkpoint metadata that is not JSON a JSONDecodeError, an index with integer file names a TypeError,
integer and float8 tensors were loaded as weights, and a FIFO named ``model.safetensors`` blocked forever.
"""

from __future__ import annotations

import json
import math
import os
import signal
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import modkit
from modkit.core.errors import CheckpointError, NonFiniteWeightsWarning, SpecError

from conftest import tiny_spec

LLAMA = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def hf_errors(config) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(config)
    return info.value.errors


# ------------------------------------------------------------------------------------------------ HF configs


@pytest.mark.parametrize(
    "changes, key, fragment",
    [
        (dict(rms_norm_eps=math.nan), "rms_norm_eps", "finite"),
        (dict(rms_norm_eps=True), "rms_norm_eps", "bool"),
        (dict(rms_norm_eps="1e-5"), "rms_norm_eps", "string"),
        (dict(rope_theta=math.inf), "rope_theta", "finite"),
        (dict(num_hidden_layers=2.0), "num_hidden_layers", "integer"),
        (dict(num_hidden_layers=True), "num_hidden_layers", "bool"),
        (dict(hidden_size="32"), "hidden_size", "string"),
        (dict(vocab_size=2**63), "vocab_size", "bound"),
        (dict(intermediate_size=10**9), "intermediate_size", "bound"),
        (dict(rope_scaling={"rope_type": "linear", "factor": []}), "rope_scaling.factor", "array"),
        (dict(rope_scaling={"rope_type": "linear", "factor": math.nan}), "rope_scaling.factor", "finite"),
        (
            dict(rope_scaling={"rope_type": "llama3", "factor": {}, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
            "rope_scaling.factor",
            "object",
        ),
        (
            dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0}),
            "rope_scaling.high_freq_factor",
            "must exceed",
        ),
        (dict(rope_scaling={"rope_type": 3}), "rope_scaling.rope_type", "string"),
        (dict(rope_scaling=[]), "rope_scaling", "must be an object"),
        (dict(model_type={"a": 1}), "model_type", "must be a string"),
        (dict(model_type=["llama"]), "model_type", "must be a string"),
        (dict(tie_word_embeddings=1), "tie_word_embeddings", "true or false"),
    ],
)
def test_hf_config_errors_name_the_configs_key(changes, key, fragment):
    errors = hf_errors({**LLAMA, **changes})
    assert [k for k, _ in errors] == [key], errors
    assert fragment in errors[0][1]


def test_a_cross_field_problem_of_the_converted_spec_is_reported_at_the_config_key():
    errors = hf_errors({**LLAMA, "num_key_value_heads": 3})
    assert errors[0][0] == "num_key_value_heads", errors


@pytest.mark.parametrize(
    "content, fragment", [(b"[]", "an array"), (b"null", "null"), (b'"llama"', "a str"), (b"3", "a int")]
)
def test_a_config_that_is_not_an_object_is_a_spec_error(tmp_path, content, fragment):
    f = tmp_path / "config.json"
    f.write_bytes(content)
    errors = hf_errors(f)
    assert errors[0][0] == "" and "a Hugging Face config is a JSON object" in errors[0][1] and fragment in errors[0][1]


def test_unreadable_config_files_are_named(tmp_path):
    f = tmp_path / "config.json"
    f.write_bytes(json.dumps(LLAMA).encode("utf-16"))
    with pytest.raises(SpecError) as info:
        modkit.from_hf_config(f)
    assert "UTF-16" in str(info.value) and str(f) in str(info.value)
    f.write_text(json.dumps(LLAMA)[:-1] + ', "hidden_size": 64}')
    assert hf_errors(f) == [("hidden_size", "duplicate key 'hidden_size' in one object; give each key once")]


# ------------------------------------------------------------------------------------------------ checkpoints


@pytest.fixture
def ckpt(tmp_path):
    folder = tmp_path / "ckpt"
    modkit.save(modkit.build(tiny_spec(), seed=0), folder)
    return folder


def rewrite(folder, change=None, metadata=None, drop_spec=True):
    f = folder / "model.safetensors"
    with safe_open(str(f), "pt") as h:
        tensors = {k: h.get_tensor(k) for k in h.keys()}
        meta = dict(h.metadata())
    if change:
        change(tensors)
    meta.update(metadata or {})
    save_file(tensors, str(f), metadata=meta)
    if drop_spec:
        (folder / "spec.json").unlink()


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object, got an array"),
        ("3", "got an integer"),
        ("", "empty input"),
        ('{"a": 1, "a": 2}', "duplicate key"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_malformed_spec_metadata_is_a_checkpoint_error(ckpt, value, fragment):
    rewrite(ckpt, metadata={"modkit.spec": value})
    with pytest.raises(CheckpointError, match="modkit.spec") as info:
        modkit.load(ckpt)
    assert fragment in str(info.value)


def test_malformed_hf_config_metadata_is_a_checkpoint_error(ckpt):
    rewrite(ckpt, metadata={"modkit.hf_config": "[1]"})
    with pytest.raises(CheckpointError, match="modkit.hf_config.*must be a JSON object"):
        modkit.load(ckpt)


@pytest.mark.parametrize(
    "dtype, fragment",
    [
        (torch.int32, "int32 (not a floating-point type)"),
        (torch.int64, "int64"),
        (torch.bool, "bool"),
        (torch.uint8, "uint8"),
        (torch.float8_e4m3fn, "quantised 8-bit float"),
        (torch.float8_e5m2, "quantised 8-bit float"),
    ],
)
def test_tensors_of_a_dtype_the_model_cannot_take_are_named(ckpt, dtype, fragment):
    name = "layers.0.attention.q_proj.weight"
    rewrite(ckpt, change=lambda t: t.__setitem__(name, t[name].to(dtype)), drop_spec=False)
    with pytest.raises(CheckpointError) as info:
        modkit.load(ckpt)
    assert name in str(info.value) and fragment in str(info.value)


def test_hf_weights_of_the_wrong_dtype_are_named(tmp_path):
    spec = modkit.from_hf_config(LLAMA)
    folder = tmp_path / "hf"
    modkit.to_hf(modkit.build(spec, seed=0), folder)
    name = "model.layers.0.mlp.up_proj.weight"
    rewrite(folder, change=lambda t: t.__setitem__(name, t[name].to(torch.float8_e4m3fn)), drop_spec=False)
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder)
    assert name in str(info.value) and "F8_E4M3" in str(info.value)


@pytest.mark.parametrize(
    "weight_map, fragment",
    [
        ({"x": 1}, "must be a shard file name (a string), got an integer"),
        ({"x": ["model.safetensors"]}, "got an array"),
        ({"x": None}, "got null"),
        (["model.safetensors"], "'weight_map' must be an object"),
        ({"x": "../../etc/passwd"}, "is not a file name in the index's folder"),
        ({"x": "/etc/passwd"}, "is not a file name in the index's folder"),
        ({"x": "weights.npy"}, "is not a .safetensors file"),
        ({"x": "model-00001-of-00002.safetensors"}, "missing"),
    ],
)
def test_malformed_index_is_a_checkpoint_error(tmp_path, weight_map, fragment):
    spec = modkit.from_hf_config(LLAMA)
    folder = tmp_path / "hf"
    modkit.to_hf(modkit.build(spec, seed=0), folder)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    with pytest.raises(CheckpointError) as info:
        modkit.from_hf(folder)
    assert fragment in str(info.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_special_files_in_a_checkpoint_are_refused_without_blocking(ckpt):
    def fail(*_):
        raise TimeoutError("blocked on a special file")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(10)
    try:
        (ckpt / "spec.json").unlink()
        os.mkfifo(ckpt / "spec.json")
        with pytest.raises(SpecError, match="FIFO"):
            modkit.load(ckpt)
        (ckpt / "spec.json").unlink()
        os.replace(ckpt / "model.safetensors", ckpt / "saved")
        os.mkfifo(ckpt / "model.safetensors")
        with pytest.raises(CheckpointError, match="FIFO"):
            modkit.load(ckpt)
        with pytest.raises(CheckpointError, match="NUL"):
            modkit.load(str(ckpt) + "\x00")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------------ non-finite weights


def test_non_finite_weights_are_counted_by_tensor_and_can_be_refused(ckpt):
    q, k = "layers.0.attention.q_proj.weight", "layers.1.ffn.down.weight"

    def poison(t):
        t[q].view(-1)[:3] = math.nan
        t[k].view(-1)[:2] = math.inf
        t[k].view(-1)[5] = -math.inf

    rewrite(ckpt, change=poison, drop_spec=False)
    with pytest.warns(NonFiniteWeightsWarning) as record:
        model = modkit.load(ckpt)
    message = str(record[0].message)
    assert "6 NaN or infinite value(s) in 2 tensor(s)" in message
    assert f"{q} (3 of {model.state_dict()[q].numel():,})" in message and f"{k} (3 of" in message
    assert int((~torch.isfinite(model.state_dict()[q])).sum()) == 3  # loaded as stored
    with pytest.raises(CheckpointError, match="refusing to load them"):
        modkit.load(ckpt, nonfinite="error")


def test_finite_checkpoints_load_without_a_warning(ckpt):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWeightsWarning)
        modkit.load(ckpt)


def test_from_hf_counts_non_finite_weights_too(tmp_path):
    folder = tmp_path / "hf"
    modkit.to_hf(modkit.build(modkit.from_hf_config(LLAMA), seed=0), folder)
    name = "model.norm.weight"
    rewrite(folder, change=lambda t: t[name].fill_(math.nan), drop_spec=False)
    with pytest.warns(NonFiniteWeightsWarning, match="final_norm.weight"):
        modkit.from_hf(folder)
    with pytest.raises(CheckpointError, match="32 NaN or infinite"):
        modkit.from_hf(folder, nonfinite="error")
