"""``modkit compare`` refuses what it cannot use: a damaged ``results.json`` given to ``--merge`` (named by file, row
and field) and meaningless reading options (named by flag).

Before: merge read ``results.json`` with plain ``json.loads``: duplicate keys and ``size: "abc"`` were accepted, and
``[]``, ``rows: "x"``, a row without ``runs``, ``val_loss: "1.0"`` or a truncated or binary file gave raw Python
errors (``KeyError: 'runs'``, ``AttributeError``, ``JSONDecodeError``); ``--spike-margin nan`` (every run then read
0% unstable), ``-1`` and ``inf`` and ``--throughput-steps -1`` were accepted; ``--tokens-per-param inf`` gave an
internal ``OverflowError``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from modkit.cli import main
from modkit.experiments.compare import CompareError, merge_reports
from modkit.experiments.compare.report import _row_json
from modkit.experiments.compare.results import RunSummary, SpecRow
from modkit.experiments.compare.saved import read_results


def _row() -> dict:
    run = RunSummary(
        spec="a",
        lr=1e-3,
        seed=0,
        run_dir=Path("runs/a"),
        train_loss=2.5,
        val_loss=2.6,
        initial_val_loss=4.2,
        tokens_per_s=1000.0,
        diverged=False,
        curve=[(0, 4.2), (10, 2.6)],
    )
    row = SpecRow(
        spec="a",
        path="a.json",
        params=1000,
        active_params=1000,
        lr=1e-3,
        tokens_per_s=1000.0,
        train_loss_mean=2.5,
        train_loss_std=None,
        val_loss_mean=2.6,
        val_loss_std=None,
        diverged=0,
        runs=[run],
        sweep={1e-3: 2.6},
        size=(32, 2),
    )
    return json.loads(json.dumps(_row_json(row), default=str))


def _write(folder: Path, document=None, *, text: str | None = None, raw: bytes | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "results.json"
    if raw is not None:
        path.write_bytes(raw)
    else:
        path.write_text(text if text is not None else json.dumps(document))
    return path


def _refusal(tmp_path: Path, **kwargs) -> str:
    path = _write(tmp_path / "src", **kwargs)
    with pytest.raises(CompareError) as info:
        merge_reports([path.parent], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # refused before anything is written
    return str(info.value)


def test_a_results_json_as_compare_writes_it_reads_back():
    data = {"rows": [_row()], "grid": [], "seq_len": 32, "eval_len": 64, "n_buckets": 8}
    assert data["rows"][0]["runs"][0]["val_loss"] == 2.6 and data["rows"][0]["sweep"] == {"0.001": 2.6}


def test_a_valid_results_json_passes_the_check(tmp_path):
    data = {"rows": [_row()], "seq_len": 32, "command": "modkit compare a.json", "max": math.nan}
    assert read_results(_write(tmp_path, data)) == json.loads(json.dumps(data))


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda d: [], "a results.json is a JSON object with rows, got an array"),
        (lambda d: {**d, "rows": "x"}, 'rows: Input should be an array, not a string (got "x")'),
        (lambda d: {"rows": [{k: v for k, v in d["rows"][0].items() if k != "runs"}]}, "rows[0].runs: Field required"),
        (
            lambda d: {"rows": [{**d["rows"][0], "runs": [{**d["rows"][0]["runs"][0], "val_loss": "1.0"}]}]},
            'rows[0].runs[0].val_loss: Input should be a valid number, not a string (got "1.0")',
        ),
        (lambda d: {"rows": [{**d["rows"][0], "size": "abc"}]}, "rows[0].size: Input should be an array"),
        (lambda d: {"rows": [{**d["rows"][0], "runs": []}]}, "rows[0].runs: Array should have at least 1 item"),
        (lambda d: {"rows": [{**d["rows"][0], "sweep": {"fast": 2.0}}]}, "the key 'fast' is not a learning rate"),
    ],
    ids=["array", "rows-string", "no-runs", "string-loss", "string-size", "empty-runs", "bad-sweep-key"],
)
def test_a_results_json_of_the_wrong_structure_is_refused_naming_file_row_and_field(tmp_path, change, expected):
    message = _refusal(tmp_path, document=change({"rows": [_row()]}))
    assert message.startswith(str(tmp_path / "src" / "results.json") + ": ")
    assert expected in message


def test_duplicate_keys_in_a_results_json_are_refused(tmp_path):
    text = json.dumps({"rows": [_row()]})
    message = _refusal(tmp_path, text=text.replace('"params": 1000', '"params": 1000, "params": 5'))
    assert "rows[0].params: duplicate key 'params' in one object; give each key once" in message


def test_a_truncated_or_binary_results_json_is_refused_naming_the_file(tmp_path):
    text = json.dumps({"rows": [_row()]})
    message = _refusal(tmp_path, text=text[: len(text) // 2])
    assert message.startswith(f"{tmp_path / 'src' / 'results.json'}: not valid JSON: ")
    assert message.endswith("is it a results.json written by modkit compare?")
    message = _refusal(tmp_path, raw=b"\x89PNG\r\n\x1a\n\x00\x00\xff")
    assert "not UTF-8 text (byte 0x89 at offset 0); is it a binary file?" in message


def test_merge_on_the_command_line_names_the_file_and_field(tmp_path, capsys):
    path = _write(tmp_path / "src", {"rows": [{**_row(), "size": "abc"}]})
    assert main(["compare", str(path.parent), "--merge", "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"modkit: error: {path}: not a results.json modkit compare wrote (1 problem(s)):")
    assert "rows[0].size: Input should be an array, not a string" in err


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--spike-margin", "nan"], "--spike-margin = nan: give a number of nats in (0, 100] (default 0.1)"),
        (["--spike-margin", "-1"], "--spike-margin = -1.0: give a number of nats in (0, 100]"),
        (["--spike-margin", "inf"], "--spike-margin = inf: give a number of nats in (0, 100]"),
        (["--throughput-steps", "-1"], "--throughput-steps = -1: give 0 (no throughput timing) or a positive number"),
        (
            ["--widths", "32,64", "--tokens-per-param", "inf"],
            "--tokens-per-param: inf is not a token budget per parameter; give finite numbers in (0, 1e+06]",
        ),
        (["--widths", "32,64", "--tokens-per-param", "abc"], "--tokens-per-param 'abc': 'abc' is not a number"),
    ],
    ids=["margin-nan", "margin-negative", "margin-inf", "steps-negative", "ratio-inf", "ratio-text"],
)
def test_meaningless_reading_flags_are_refused_naming_the_flag(tmp_path, capsys, flags, expected):
    spec = tmp_path / "a.json"
    spec.write_text("{}")
    assert main(["compare", str(spec), *flags, "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modkit: error: ") and expected in err, err
    assert not (tmp_path / "out").exists()


def test_the_library_refuses_the_same_options_by_field_name():
    from modkit.experiments.compare.plan import check_options

    with pytest.raises(CompareError, match=r"^spike_margin = nan: give a number of nats"):
        check_options(spike_margin=math.nan)
    with pytest.raises(CompareError, match=r"^tokens_per_param: inf is not a token budget"):
        check_options(tokens_per_param=[20.0, math.inf])
    check_options(spike_margin=0.5, throughput_steps=3, tokens_per_param=[20.0])


def _with_run(**change) -> dict:
    row = _row()
    row["runs"][0].update(change)
    return {"rows": [row]}


def _with_row(**change) -> dict:
    return {"rows": [{**_row(), **change}]}


@pytest.mark.parametrize(
    "document, expected",
    [
        (_with_run(extra=1), "rows[0].runs[0].extra: "),
        (_with_row(extra=1), "rows[0].extra: "),
        ({}, "rows: Field required"),
    ],
    ids=["run-key", "row-key", "empty-object"],
)
def test_unknown_keys_in_a_row_or_run_and_an_empty_object_are_refused_naming_the_path(tmp_path, document, expected):
    message = _refusal(tmp_path, document=document)
    assert expected in message, message


@pytest.mark.parametrize(
    "document, expected",
    [
        (_with_run(val_loss=math.nan), "rows[0].runs[0]: val_loss = nan: not a finite number (only a run marked"),
        (_with_run(val_bpb=-math.inf), "rows[0].runs[0]: val_bpb = -inf: not a finite number"),
        (_with_run(tokens_per_s=math.inf), "rows[0].runs[0]: tokens_per_s = inf: not a finite number"),
        (_with_run(grad_curve=[[0, 1.0], [1, -math.inf]]), "rows[0].runs[0]: grad_curve.1.1 = -inf: not a finite"),
        (_with_row(train_loss_mean=-math.inf), "rows[0]: train_loss_mean = -inf: not a finite number (every run's"),
        (_with_row(long_val_loss_std=math.inf), "rows[0]: long_val_loss_std = inf: not a finite number"),
        (_with_row(tokens_per_s=math.nan), "rows[0]: tokens_per_s = nan: not a finite number"),
    ],
    ids=["run-val-loss", "run-bpb", "run-throughput", "grad-curve", "row-train-mean", "row-long-std", "row-throughput"],
)
def test_non_finite_numbers_are_refused_naming_the_path_and_value(tmp_path, document, expected):
    message = _refusal(tmp_path, document=document)
    assert expected in message, message


def test_non_finite_values_of_a_diverged_run_and_its_row_read_back(tmp_path):
    """What compare writes for a diverged run (NaN losses, the row's NaN means) and an unmeasured grad norm."""
    row = _row()
    row["runs"][0].update(diverged=True, val_loss=math.nan, curve=[[0, 4.2], [10, math.inf]], max_grad_norm=math.nan)
    row.update(diverged=1, val_loss_mean=math.nan, val_loss_std=math.nan)
    data = {"rows": [row]}
    assert read_results(_write(tmp_path, data))["rows"][0]["runs"][0]["curve"][1][1] == math.inf


def test_buckets_of_another_length_are_refused_naming_both_lengths(tmp_path):
    row = _row()
    row["runs"][0]["buckets"] = [3.0] * 8
    row["buckets"] = [3.0] * 3
    message = _refusal(tmp_path, document={"rows": [row], "n_buckets": 8})
    assert "rows[0]: runs.0.buckets has 8 value(s) but the row's buckets 3 value(s)" in message, message
    row["buckets"] = [3.0] * 8
    row["runs"][0]["buckets"] = [3.0] * 8
    message = _refusal(tmp_path, document={"rows": [row], "n_buckets": 4})
    assert "rows.0.buckets has 8 value(s) but n_buckets = 4" in message, message
    assert read_results(_write(tmp_path / "ok", {"rows": [row], "n_buckets": 8}))["rows"][0]["buckets"] == [3.0] * 8


@pytest.mark.parametrize("flag, value", [("--holdout-width", "0"), ("--holdout-width", "-1"), ("--holdout-depth", "0")])
def test_a_holdout_size_below_one_is_refused_naming_the_flag(tmp_path, capsys, flag, value):
    spec = tmp_path / "a.json"
    spec.write_text("{}")
    assert main(["compare", str(spec), "--widths", "32,64", flag, value, "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert f"modkit: error: {flag} {value}: give a positive integer" in err, err
    assert not (tmp_path / "out").exists()
