"""Training config (strict, one error per bad field), learning-rate schedules (exact values), flag parsing."""

from __future__ import annotations

import json
import math

import pytest

import modkit
from modkit.train import DEFAULT_MODEL, TrainConfig, load_train_config, lr_at
from modkit.train.config import parse_flag_value

from conftest import SPECS


def cfg(**changes) -> TrainConfig:
    return load_train_config(changes)[0]


def test_defaults_are_nanogpts_cpu_recipe():
    c = TrainConfig()
    assert (c.batch_size, c.seq_len, c.max_steps, c.lr, c.min_lr, c.warmup_steps) == (12, 64, 2000, 1e-3, 1e-4, 100)
    assert (c.beta1, c.beta2, c.weight_decay, c.grad_clip, c.eval_interval, c.eval_batches) == (
        0.9,
        0.99,
        0.1,
        1.0,
        250,
        20,
    )
    assert c.tokens_per_step == 768 and c.total_steps == 2000 and c.checkpoint_every == 250


def test_default_model_is_the_shipped_nanogpt_spec():
    shipped = json.loads((SPECS / "nanogpt-shakespeare-char.json").read_text())
    assert shipped == DEFAULT_MODEL
    # nanoGPT prints 0.80M: 809,856 with the 64 x 128 position table (its count leaves that table out)
    assert modkit.count_params(DEFAULT_MODEL) == 809_856
    assert modkit.count_params(SPECS / "modern-shakespeare-char.json") == 809_216


def test_token_budget_rounds_up_to_whole_steps():
    c = cfg(max_steps=None, max_tokens=10_000)
    assert c.total_steps == math.ceil(10_000 / 768) == 14


def test_shipped_training_configs_validate():
    for path in (SPECS / "train").glob("*.json"):
        c, base = load_train_config(path)
        assert base == path.resolve().parent
        assert (base / c.model).is_file()


@pytest.mark.parametrize(
    "changes, path, words",
    [
        ({"lr": True}, "lr", "valid number"),
        ({"batch_size": 12.0}, "batch_size", "valid integer"),
        ({"batch_size": True}, "batch_size", "valid integer"),
        ({"lr": "3e-4"}, "lr", "valid number"),
        ({"compile": 1}, "compile", "valid boolean"),
        ({"lr": float("nan")}, "lr", "finite"),
        ({"grad_clip": float("inf")}, "grad_clip", "finite"),
        ({"lr": -1.0}, "lr", "greater than 0"),
        ({"batch_size": 0}, "batch_size", "greater than or equal to 1"),
        ({"schedule": "cosin"}, "schedule", '"cosine"'),
        ({"precision": "fp16"}, "precision", '"float16"'),
        ({"learning_rate": 1e-3}, "learning_rate", "unknown field"),
        ({"max_tokens": 1000}, "", "exactly one of max_steps and max_tokens"),
        ({"min_lr": 0.1}, "", "min_lr = 0.1 exceeds lr = 0.001"),
    ],
)
def test_bad_fields_get_one_named_error_each(changes, path, words):
    with pytest.raises(modkit.SpecError) as exc:
        load_train_config(changes)
    assert len(exc.value.errors) == 1, exc.value.errors
    ((where, message),) = exc.value.errors
    assert where == path and words in message, (where, message)


def test_several_bad_fields_are_reported_together():
    with pytest.raises(modkit.SpecError) as exc:
        load_train_config({"lr": "x", "batch_size": -1, "warmup": 3})
    assert sorted(p for p, _ in exc.value.errors) == ["batch_size", "lr", "warmup"]


def test_unknown_field_suggests_the_close_name():
    with pytest.raises(modkit.SpecError) as exc:
        load_train_config({"max_step": 10})
    assert "max_steps" in exc.value.errors[0][1]


def test_files_duplicate_keys_and_bad_json(tmp_path):
    dup = tmp_path / "dup.json"
    dup.write_text('{"lr": 0.001, "lr": 0.002}')
    with pytest.raises(modkit.SpecError, match="duplicate key 'lr'"):
        load_train_config(dup)
    bad = tmp_path / "bad.json"
    bad.write_text('{"lr": 0.001,}')
    with pytest.raises(modkit.SpecError, match="not valid JSON"):
        load_train_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1, 2]")
    with pytest.raises(modkit.SpecError, match="JSON object"):
        load_train_config(arr)
    with pytest.raises(modkit.SpecError, match="cannot read"):
        load_train_config(tmp_path / "missing.json")


def test_overrides_apply_on_top_of_the_file(tmp_path):
    f = tmp_path / "t.json"
    f.write_text('{"lr": 0.002, "max_steps": 50}')
    c, _ = load_train_config(f, {"max_steps": 7, "device": "cpu"})
    assert (c.lr, c.max_steps, c.device) == (0.002, 7, "cpu")


def test_paths_from_flags_are_relative_to_the_working_directory(tmp_path, monkeypatch):
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "t.json").write_text('{"model": "../spec.json"}')
    (tmp_path / "spec.json").write_text("{}")
    (tmp_path / "other.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    c, base = load_train_config(folder / "t.json")
    assert c.model == "../spec.json" and base == folder.resolve()  # resolved against the file's folder later
    c, _ = load_train_config(folder / "t.json", {"model": "other.json"})
    assert c.model == str(tmp_path.resolve() / "other.json")


def test_flag_values_are_typed():
    assert parse_flag_value("lr", "3e-4") == 3e-4
    assert parse_flag_value("lr", "1") == 1.0 and isinstance(parse_flag_value("lr", "1"), float)
    assert parse_flag_value("max_steps", "500") == 500
    assert parse_flag_value("max_tokens", "null") is None
    assert parse_flag_value("compile", "true") is True
    assert parse_flag_value("device", "cuda:1") == "cuda:1"
    assert parse_flag_value("model", "specs/tiny-llama.json") == "specs/tiny-llama.json"
    assert parse_flag_value("sample_prompt", "ROMEO:") == "ROMEO:"
    # a value that parses but has the wrong type is passed on, and validation names it
    with pytest.raises(modkit.SpecError):
        load_train_config({}, {"max_steps": parse_flag_value("max_steps", "1.5")})


# ------------------------------------------------------------------------------------------------ schedules


def test_warmup_is_nanogpts_linear_ramp():
    c = cfg()
    assert lr_at(0, c) == pytest.approx(1e-3 * 1 / 101)
    assert lr_at(49, c) == pytest.approx(1e-3 * 50 / 101)
    assert lr_at(99, c) == pytest.approx(1e-3 * 100 / 101)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant", "wsd"])
def test_schedule_values(schedule):
    c = cfg(schedule=schedule, max_steps=1100, warmup_steps=100, lr=1.0, min_lr=0.1, wsd_decay_fraction=0.2)
    at = {t: lr_at(t, c) for t in (100, 350, 600, 850, 900, 1000, 1100, 5000)}
    if schedule == "cosine":  # r = (t - 100) / 1000
        expect = {t: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min((t - 100) / 1000, 1))) for t in at}
        assert at[600] == pytest.approx(0.55)
    elif schedule == "linear":
        expect = {t: 1.0 - 0.9 * min((t - 100) / 1000, 1) for t in at}
        assert at[350] == pytest.approx(0.775)
    elif schedule == "constant":
        expect = {t: 1.0 for t in at}
    else:  # stable until r = 0.8 (t = 900), then linear to 0.1 at t = 1100
        expect = {100: 1.0, 350: 1.0, 600: 1.0, 850: 1.0, 900: 1.0, 1000: 0.55, 1100: 0.1, 5000: 0.1}
    for t in at:
        assert at[t] == pytest.approx(expect[t], abs=1e-12), (t, at[t], expect[t])


def test_decay_steps_end_the_decay_early():
    c = cfg(max_steps=3000, decay_steps=2000)
    assert lr_at(2000, c) == pytest.approx(1e-4)
    assert lr_at(2999, c) == pytest.approx(1e-4)
    with pytest.raises(ValueError, match="step"):
        lr_at(-1, c)


def test_train_config_schema_is_exported():
    schema = modkit.train.config.json_schema()
    assert schema["additionalProperties"] is False
    assert "lr" in schema["properties"] and schema["properties"]["lr"]["description"] == "peak learning rate"


def test_experiment_specs_and_configs_validate():
    """The files the docs/experiments pages name in their commands load as they are."""
    experiments = SPECS.parent / "docs" / "experiments" / "specs"
    for path in experiments.glob("*.json"):
        data = json.loads(path.read_text())
        if "schema_version" in data and "block" in data:
            modkit.load_spec(path)
        else:
            load_train_config(path)
    rms = modkit.load_spec(experiments / "nanogpt-rmsnorm.json")
    assert modkit.count_params(rms) == 809_856 - 9 * 128  # nine norms lose their bias


def test_a_run_that_never_leaves_its_warmup_is_warned_about():
    """``max_steps <= warmup_steps`` (a shortened recipe with the default warmup) gets one warning naming both and the
    share of lr the run ends at; a run past its warmup gets none."""
    from modkit.train.config import schedule_warning

    short, _ = load_train_config({"max_steps": 50, "warmup_steps": 100})
    assert schedule_warning(short) == (
        "max_steps = 50 is not above warmup_steps = 100: the learning rate never leaves its warmup (it ends at 50% of "
        "lr); lower warmup_steps (e.g. --warmup-steps to a tenth of the steps) for a shortened run"
    )
    long, _ = load_train_config({"max_steps": 200, "warmup_steps": 100})
    none, _ = load_train_config({"max_steps": 50, "warmup_steps": 0})
    assert schedule_warning(long) is None and schedule_warning(none) is None
