"""``modkit eval`` refuses flags and data it would silently misread.

Before: ``--seq-len 0`` and ``--batch-size 0`` fell back to the defaults (``0 or default``), ``--tasks ''`` scored
perplexity instead, and a prepared folder tokenized with another char tokenizer (every id inside the model's
vocabulary) was scored without a word, its ids meaning other characters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import modkit
from modkit import cli
from modkit.data import prepare
from modkit.evaluation import EvalError, evaluate_checkpoint

from conftest import tiny_spec

SPEC = {**tiny_spec(max_seq_len=16, vocab_size=64), "position": {"type": "rope"}}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path, Path]:
    """``(checkpoint, its own data, data of another char tokenizer)``: the checkpoint is an untrained tiny model
    saved with the tokenizer of ``own``; ``other`` holds other characters, so its char ids differ."""
    root = tmp_path_factory.mktemp("eval-flags")
    (root / "own.txt").write_text("abcdefgh " * 400)
    (root / "other.txt").write_text("zyxwvuts " * 400)
    prepare([root / "own.txt"], root / "own", tokenizer="char", show_progress=False)
    prepare([root / "other.txt"], root / "other", tokenizer="char", show_progress=False)
    checkpoint = root / "checkpoint"
    modkit.save(modkit.build(SPEC), checkpoint)
    shutil.copy(root / "own" / "tokenizer.json", checkpoint / "tokenizer.json")
    return checkpoint, root / "own", root / "other"


def test_the_checkpoints_own_data_is_scored(setup):
    checkpoint, own, _ = setup
    result = evaluate_checkpoint(checkpoint, own, seq_len=8, batch_size=2)
    assert result.score.seq_len == 8 and result.settings["batch_size"] == 2 and result.score.tokens > 0


def test_data_of_another_char_tokenizer_is_refused_with_the_reason(setup):
    checkpoint, _, other = setup
    with pytest.raises(EvalError) as info:
        evaluate_checkpoint(checkpoint, other, seq_len=8)
    message = str(info.value)
    assert message == (
        f"{other} was tokenized with another tokenizer (char) than the checkpoint {checkpoint}: 's' is id 1 in the "
        "data, not a token in the checkpoint, so its ids mean other tokens to the model and the scores would measure "
        "nothing; evaluate on data prepared with the checkpoint's tokenizer, or give the text files (--data FILE...), "
        "which are encoded with it"
    )


@pytest.mark.parametrize("name", ["seq_len", "batch_size", "stride", "max_tokens"])
def test_a_zero_window_option_is_refused_not_replaced_by_the_default(setup, name):
    checkpoint, own, _ = setup
    with pytest.raises(EvalError) as info:
        evaluate_checkpoint(checkpoint, own, **{name: 0})
    assert str(info.value).startswith(f"{name} = 0 (--{name.replace('_', '-')}): give a positive number of ")


@pytest.mark.parametrize(
    "flags, expected",
    [
        (
            ["--seq-len", "0"],
            "modkit: error: --seq-len 0: give a positive number, or leave --seq-len out for the default",
        ),
        (["--batch-size", "0"], "modkit: error: --batch-size 0: give a positive number, or leave --batch-size out"),
        (["--tasks", ""], "modkit: error: --tasks '' names no task; give lm-eval task names separated by commas"),
        (["--tasks", " , "], "modkit: error: --tasks ' , ' names no task"),
        (["--tasks", "x", "--num-fewshot", "-1"], "modkit: error: --num-fewshot -1: give 0 or more examples"),
        (["--tasks", "x", "--limit", "nan"], "modkit: error: --limit nan: give a positive number of documents"),
    ],
    ids=["seq-len", "batch-size", "tasks-empty", "tasks-blank", "fewshot", "limit"],
)
def test_meaningless_eval_flags_are_refused_naming_the_flag(setup, capsys, flags, expected):
    checkpoint, own, _ = setup
    assert cli.main(["eval", str(checkpoint), "--data", str(own), *flags]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(expected) and captured.out == ""


def test_the_help_says_include_path_runs_the_task_files_code(capsys):
    assert cli.main(["eval", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "lm-eval runs the Python code they name (a '!function' entry" in text


def test_a_blank_text_field_a_missing_include_path_and_the_meta_device_are_refused(setup, tmp_path, capsys):
    checkpoint, own, _ = setup
    missing = tmp_path / "no-such-tasks"
    cases = [
        (["--text-field", ""], "modkit: error: --text-field '' names no field; give the field holding the text"),
        (
            ["--tasks", "x", "--include-path", str(missing)],
            f"modkit: error: --include-path {missing} does not exist; give the folder holding the lm-eval task",
        ),
        (
            ["--device", "meta"],
            "modkit: error: --device 'meta' holds no data and cannot evaluate (it is for building models without "
            "memory); use cpu, cuda, cuda:N or mps",
        ),
    ]
    for flags, expected in cases:
        assert cli.main(["eval", str(checkpoint), "--data", str(own), *flags]) == 1
        captured = capsys.readouterr()
        assert captured.err.startswith(expected) and captured.out == "", captured.err


def test_too_few_tokens_name_the_data_file(setup, tmp_path, capsys):
    checkpoint, _, _ = setup
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert cli.main(["eval", str(checkpoint), "--data", str(empty), "--seq-len", "8", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"modkit: error: {empty} (whole text): ") and "fewer than the seq_len + 1 = 9" in err, err
