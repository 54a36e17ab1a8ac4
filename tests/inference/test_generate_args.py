"""``generate`` and ``modkit generate`` check every argument up front, naming the parameter.

Before: NaN temperature sampled random tokens, ``max_new_tokens=None`` failed with a comparison TypeError, a
2**64 seed with "Overflow when unpacking long long", float token ids were truncated (``[[1.7, 2.2]]`` became
``[[1, 2]]``), right-padded and all-padding masks went through, and a run past ``max_seq_len`` either failed
mid-stream after output had started (learned positions) or silently decoded past it (RoPE).
"""

from __future__ import annotations

import math

import pytest
import torch

import modkit
from modkit.core.errors import ArgumentError
from modkit.inference.generate import generate, stream_generate

from conftest import tiny_spec


@pytest.fixture(scope="module")
def rope_model():
    return modkit.build(tiny_spec(), seed=0).eval()  # vocab 64, max_seq_len 64


@pytest.fixture(scope="module")
def learned_model():
    return modkit.build(tiny_spec(position={"type": "learned"}), seed=0).eval()


@pytest.mark.parametrize(
    "kwargs, name, fragment",
    [
        (dict(temperature=math.nan), "temperature", "finite number >= 0"),
        (dict(temperature=math.inf), "temperature", "finite number >= 0"),
        (dict(temperature=-0.5), "temperature", "finite number >= 0"),
        (dict(temperature="0.7"), "temperature", "finite number >= 0"),
        (dict(temperature=True), "temperature", "finite number >= 0"),
        (dict(max_new_tokens=None), "max_new_tokens", "must be an integer"),
        (dict(max_new_tokens=-1), "max_new_tokens", "must be >= 0"),
        (dict(max_new_tokens=2.0), "max_new_tokens", "must be an integer"),
        (dict(max_new_tokens=True), "max_new_tokens", "must be an integer"),
        (dict(max_new_tokens=10**12), "max_new_tokens", "past the model's max_seq_len = 64"),
        (dict(seed=-1), "seed", "in [0, 18446744073709551615]"),
        (dict(seed=2**64), "seed", "in [0, 18446744073709551615]"),
        (dict(seed=1.5), "seed", "must be an integer"),
        (dict(seed="1"), "seed", "must be an integer"),
        (dict(top_k=0), "top_k", ">= 1"),
        (dict(top_k=2.5), "top_k", "must be an integer"),
        (dict(top_k=True), "top_k", "must be an integer"),
        (dict(top_p=0.0), "top_p", "in (0, 1]"),
        (dict(top_p=math.nan), "top_p", "in (0, 1]"),
        (dict(top_p=1.5), "top_p", "in (0, 1]"),
        (dict(eos_token_id=-1), "eos_token_id", "in [0, 63]"),
        (dict(eos_token_id=64), "eos_token_id", "in [0, 63]"),
        (dict(eos_token_id=[1.5]), "eos_token_id", "integer token id"),
        (dict(eos_token_id="2"), "eos_token_id", "integer token id"),
        (dict(prefill_chunk=0), "prefill_chunk", ">= 1"),
        (dict(prefill_chunk=1.5), "prefill_chunk", "must be an integer"),
    ],
)
def test_bad_arguments_are_refused_naming_the_parameter(rope_model, kwargs, name, fragment):
    kwargs = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ArgumentError) as info:
        stream_generate(rope_model, [[1, 2, 3]], **kwargs)  # raised by the call itself, before any token
    assert info.value.name == name and name in str(info.value) and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "input_ids, fragment",
    [
        ([[1.7, 2.2]], "must hold integer token ids, got float"),
        (torch.tensor([[1.0, 2.0]]), "got a float32 tensor"),
        (torch.tensor([[True, False]]), "got a bool tensor"),
        ([[True, 1]], "got bool"),
        (
            [[2**63]],
            f"must lie in [0, 64) (the vocabulary); got the token id {2**63}",
        ),  # (past int64: torch never sees it)
        ([[2**70]], f"must lie in [0, 64) (the vocabulary); got the token id {2**70}"),
        ([[-1, 2]], "must lie in [0, 64)"),
        ([[1, 64]], "must lie in [0, 64)"),
        ([], "non-empty"),
        ([[]], "non-empty"),
        ([[1, 2], [3]], "rectangular"),
        ([[[1, 2]]], "[batch, seq]"),
        (None, "sequence of integer token ids"),
        ("1 2 3", "sequence of integer token ids"),
    ],
)
def test_bad_token_ids_are_refused(rope_model, input_ids, fragment):
    with pytest.raises(ArgumentError) as info:
        generate(rope_model, input_ids, max_new_tokens=2)
    assert info.value.name == "input_ids" and fragment in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "mask, fragment",
    [
        ([[1, 1, 0]], "padding after a real token"),
        ([[0, 1, 0]], "padding after a real token"),
        ([[0, 0, 0]], "all padding"),
        ([[1, 1]], "must have the prompt's shape (1, 3)"),
        ([[2, 1, 1]], "only 0 (padding) and 1"),
        (torch.tensor([[0.5, 1.0, 1.0]]), "bool or integer"),
    ],
)
def test_bad_attention_masks_are_refused(rope_model, mask, fragment):
    if isinstance(mask, list):
        mask = torch.tensor(mask)
    with pytest.raises(ArgumentError) as info:
        generate(rope_model, [[1, 2, 3]], max_new_tokens=2, attention_mask=mask)
    assert info.value.name == "attention_mask" and fragment in str(info.value), str(info.value)


def test_a_left_padded_mask_is_accepted_as_documented(rope_model):
    out = generate(
        rope_model,
        [[0, 5, 6], [4, 5, 6]],
        max_new_tokens=3,
        temperature=0,
        attention_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
    )
    alone = generate(rope_model, [[5, 6]], max_new_tokens=3, temperature=0)
    assert out.shape == (2, 6) and out[0, 3:].tolist() == alone[0, 2:].tolist()


@pytest.mark.parametrize("which", ["rope_model", "learned_model"])
def test_runs_past_max_seq_len_are_refused_before_any_token(request, which):
    model = request.getfixturevalue(which)
    prompt = [[1] * 60]
    assert generate(model, prompt, max_new_tokens=4, temperature=0).shape == (1, 64)  # exactly max_seq_len: fine
    with pytest.raises(
        ArgumentError, match="reaches position 64, past the model's max_seq_len = 64; generate at most 4"
    ):
        stream_generate(model, prompt, max_new_tokens=5, temperature=0)


def run_cli(capsys, *argv):
    from modkit.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "flag, value, fragment",
    [
        ("--temperature", "nan", "--temperature must be a finite number >= 0"),
        ("--temperature", "-1", "--temperature must be a finite number >= 0"),
        ("--top-p", "1.5", "--top-p must be in (0, 1]"),
        ("--top-k", "0", "--top-k must be >= 1"),
        ("--seed", "-1", "--seed must be in [0, 18446744073709551615]"),
        ("--seed", str(2**64), "--seed must be in [0, 18446744073709551615]"),
        ("--max-new-tokens", "1000000000000", "past the model's max_seq_len = 512"),
        ("--prompt", "1 5000", "--prompt holds the token id 5000, outside the model's vocabulary [0, 1,024)"),
        ("--prompt", str(2**64), f"--prompt holds the token id {2**64}, outside [0, 16,777,216)"),
        ("--max-len", "0", "--max-len must be in [1, 134217728], got 0"),
    ],
)
def test_cli_generate_refuses_bad_flags_before_printing(capsys, flag, value, fragment):
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "specs" / "tiny-llama.json"
    argv = ["generate", spec, "--prompt", "1 2 3", "--max-new-tokens", "2"]
    if flag == "--prompt":
        argv[3] = value
    else:
        argv += [flag, value]
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == "" and fragment in err and "internal error" not in err, err


def test_cli_generate_refuses_a_broken_tokenizer(capsys, tmp_path):
    from pathlib import Path

    spec = Path(__file__).resolve().parents[2] / "specs" / "tiny-llama.json"
    bad = tmp_path / "tokenizer.json"
    bad.write_bytes(bytes(range(256)))
    code, out, err = run_cli(capsys, "generate", spec, "--prompt", "hi", "--tokenizer", bad)
    assert code == 1 and out == "" and "not a tokenizers tokenizer.json" in err and "internal error" not in err
