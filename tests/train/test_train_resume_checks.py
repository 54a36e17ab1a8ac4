"""Resuming from damaged run files: every damage is refused before the first step with an error naming the file, the
field or tensor and the value, and the run folder is left as it was (``last`` unchanged, nothing pruned, nothing new
written); harmless leftovers (a stray folder, an interrupted first save) do not block a run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from modkit.core.errors import CheckpointError
from modkit.data import default_corpus, prepare
from modkit.train import TrainError, train
from modkit.train.plot import read_metrics

from conftest import REPO, tiny_spec

MODEL = {**tiny_spec(max_seq_len=32), "position": {"type": "learned"}, "tie_embeddings": True}


def quiet(line: str) -> None:
    """Drop status lines."""


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4 (``last`` -> step-0000004)."""
    root = tmp_path_factory.mktemp("resume")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    train(config(root / "prepared"), root / "run", echo=quiet)
    return root / "run"


def config(data: Path, **changes) -> dict:
    cfg = dict(
        model=MODEL,
        data=str(data),
        batch_size=2,
        seq_len=16,
        max_steps=4,
        warmup_steps=1,
        eval_interval=2,
        checkpoint_interval=2,
        eval_batches=1,
        log_interval=1,
        sample_tokens=0,
        final_eval_tokens=0,
        device="cpu",
        seed=3,
    )
    cfg.update(changes)
    return cfg


def copy_run(base: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(base, run, symlinks=True)
    return run


def folder_state(run: Path) -> tuple:
    """What a refused resume must leave unchanged: the checkpoint folders, the ``last`` target, the metrics."""
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    return names, Path(str((run / "last").readlink())).name, (run / "metrics.jsonl").read_bytes()


def edit_tensors(run: Path, change) -> Path:
    path = run / "checkpoints" / "step-0000004" / "trainer.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def edit_trainer_json(run: Path, change) -> Path:
    path = run / "checkpoints" / "step-0000004" / "trainer.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return path


def first_param(run: Path) -> tuple[str, list[int]]:
    """The name and shape of the parameter with optimizer index 0."""
    data = json.loads((run / "checkpoints" / "step-0000004" / "trainer.json").read_text())
    first_group = data["optimizer"]["param_groups"][0]["params"]
    assert first_group[0] == 0
    shape = list(load_file(str(run / "last" / "model.safetensors"))[data["param_names"][0]].shape)
    return data["param_names"][0], shape


def refused(run: Path, error, match: str) -> str:
    """Resume to step 6 and expect ``error``; the folder must be as it was."""
    before = folder_state(run)
    with pytest.raises(error, match=match) as info:
        train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    assert folder_state(run) == before
    return str(info.value)


def test_an_optimizer_moment_of_the_wrong_shape_is_refused_naming_it(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_tensors(run, lambda t: t.__setitem__("state.0.exp_avg", torch.zeros(3)))
    name, shape = first_param(run)
    text = refused(run, CheckpointError, "state.0.exp_avg")
    assert str(path) in text
    assert f"state.0.exp_avg has shape [3]; its parameter {name} (index 0) has shape {shape}" in text
    assert "step-0000002" in text  # the fix: the older checkpoint to resume from


def test_a_negative_second_moment_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)

    def negate(t):
        t["state.1.exp_avg_sq"] = t["state.1.exp_avg_sq"].clone()
        t["state.1.exp_avg_sq"].view(-1)[0] = -2.5

    path = edit_tensors(run, negate)
    text = refused(run, CheckpointError, "state.1.exp_avg_sq")
    assert str(path) in text
    assert "1 negative value(s) (the lowest -2.5)" in text and "never negative" in text


def test_a_nan_moment_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)

    def poison(t):
        t["state.2.exp_avg"] = t["state.2.exp_avg"].clone()
        t["state.2.exp_avg"].view(-1)[:3] = float("nan")

    edit_tensors(run, poison)
    text = refused(run, CheckpointError, "state.2.exp_avg")
    assert "3 NaN or infinite value(s)" in text


def test_a_missing_step_count_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    edit_tensors(run, lambda t: t.pop("state.1.step"))
    text = refused(run, CheckpointError, r"state\.1\.step is missing")
    assert "exp_avg, exp_avg_sq, step" in text


def test_a_step_count_beyond_the_run_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    edit_tensors(run, lambda t: t.__setitem__("state.0.step", torch.tensor(9.0)))
    refused(run, CheckpointError, r"state\.0\.step = 9 .*between 0 and the run's step 4")


def test_a_wrong_size_cpu_rng_state_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_tensors(run, lambda t: t.__setitem__("rng.cpu", t["rng.cpu"][:100].clone()))
    text = refused(run, CheckpointError, "rng.cpu")
    assert str(path) in text and f"100 bytes; torch's CPU generator state is {torch.get_rng_state().numel():,}" in text


def test_a_string_best_val_loss_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_trainer_json(run, lambda d: d.__setitem__("best_val_loss", "abc"))
    text = refused(run, CheckpointError, "best_val_loss")
    assert f'{path}: best_val_loss = "abc" is not a finite non-negative number or null' in text


def test_a_duplicate_key_in_the_trainer_state_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = run / "checkpoints" / "step-0000004" / "trainer.json"
    path.write_text(path.read_text().replace('"step": 4,', '"step": 4, "step": 2,', 1))
    refused(run, CheckpointError, "duplicate key 'step'")


def test_a_step_that_differs_from_the_folder_name_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    edit_trainer_json(run, lambda d: d.__setitem__("step", 3))
    refused(run, CheckpointError, "step = 3 but the folder is step-0000004")


def test_a_truncated_model_file_is_refused_naming_it(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = run / "checkpoints" / "step-0000004" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    text = refused(run, CheckpointError, "model.safetensors")
    assert str(path) in text and "damaged or truncated" in text


def test_nan_weights_in_the_last_checkpoint_are_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = run / "checkpoints" / "step-0000004" / "model.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] = float("inf")
    save_file(tensors, str(path), metadata={"format": "pt"})
    refused(run, CheckpointError, rf"1 NaN or infinite value\(s\) in 1 tensor\(s\): {name}")


def test_a_metrics_line_without_step_is_refused_naming_the_line(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = run / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines.insert(2, '{"kind": "train", "loss": 1.0}')
    path.write_text("\n".join(lines) + "\n")
    text = refused(run, CheckpointError, "line 3")
    assert f"{path} line 3: no integer 'step'" in text


def test_a_metrics_line_cut_by_a_kill_is_dropped(base, tmp_path):
    """A kill while a line is appended leaves it without its newline: that line alone is dropped, with a note."""
    run = copy_run(base, tmp_path)
    path = run / "metrics.jsonl"
    path.write_text(path.read_text() + '{"kind": "train", "st')
    lines = []
    result = train(None, run, resume=True, overrides={"max_steps": 6}, echo=lines.append)
    assert result.steps == 6
    assert any("metrics.jsonl line" in line and "incomplete" in line for line in lines), lines
    assert [r["step"] for r in read_metrics(path) if r["kind"] == "eval"] == [0, 2, 4, 6]


def test_strict_metrics_reading_refuses_duplicate_keys(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"kind": "train", "step": 1, "step": 2}\n')
    with pytest.raises(CheckpointError, match=r"line 1: .*duplicate key 'step'"):
        read_metrics(path)


def test_a_stray_step_folder_is_ignored_with_a_note(base, tmp_path, capsys):
    run = copy_run(base, tmp_path)
    (run / "checkpoints" / "step-abc").mkdir()
    result = train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    assert result.steps == 6
    err = capsys.readouterr().err
    assert f"modkit: note: ignored {run / 'checkpoints' / 'step-abc'}: not a checkpoint name" in err
    assert (run / "checkpoints" / "step-abc").is_dir()  # not ours to delete
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-0000004", "step-0000006", "step-abc"]


def test_a_last_link_leading_outside_the_run_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoints" / "step-0000004", elsewhere)
    (run / "last").unlink()
    (run / "last").symlink_to(elsewhere)
    with pytest.raises(CheckpointError, match="leads outside the run folder") as info:
        train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    assert str(elsewhere) in str(info.value)


def test_a_different_model_on_resume_is_refused_naming_both(base, tmp_path):
    run = copy_run(base, tmp_path)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**MODEL, "d_model": 64}))
    with pytest.raises(TrainError, match="d_model") as info:
        train(None, run, resume=True, overrides={"max_steps": 6, "model": str(other)}, echo=quiet)
    text = str(info.value)
    assert str(other) in text and str(run / "spec.json") in text and "d_model = 64" in text and "32" in text


def test_the_same_model_on_resume_is_accepted(base, tmp_path):
    """The command line that started the run, repeated with --resume: the spec resolves to the run's own."""
    run = copy_run(base, tmp_path)
    same = tmp_path / "same.json"
    same.write_text(json.dumps(MODEL))
    result = train(None, run, resume=True, overrides={"max_steps": 6, "model": str(same)}, echo=quiet)
    assert result.steps == 6


@pytest.mark.parametrize(
    "device, match",
    [
        ("meta", "device = 'meta' holds no data and cannot train"),
        ("cuda:7", "CUDA"),
        ("nonsense", "device = 'nonsense' is not a device"),
    ],
)
def test_devices_that_cannot_train_are_refused(base, tmp_path, device, match):
    data = base.parent / "prepared"
    with pytest.raises(TrainError, match=match):
        train(config(data, device=device), tmp_path / "r", echo=quiet)
    assert not (tmp_path / "r").exists()


def test_an_unavailable_mps_device_is_refused(base, tmp_path):
    if torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    with pytest.raises(TrainError, match="device = 'mps' but MPS is not available here"):
        train(config(base.parent / "prepared", device="mps"), tmp_path / "r", echo=quiet)


def test_a_run_without_a_complete_checkpoint_starts_again(base, tmp_path):
    """A kill early in the first save: ``-o`` says how to start it again, ``--resume`` does (from step 0, the
    interrupted save removed) and logs what an uninterrupted run logs."""
    run = copy_run(base, tmp_path)
    for p in (run / "checkpoints").iterdir():
        shutil.rmtree(p)
    for link in ("last", "best"):
        (run / link).unlink()
    (run / "checkpoints" / ".best-0000000.tmp-99999999").mkdir()  # what the kill left
    (run / "metrics.jsonl").write_text(read_metrics_text(base, upto=0))
    with pytest.raises(TrainError, match="no complete checkpoint") as info:
        train(config(base.parent / "prepared"), run, echo=quiet)
    assert f"--resume {run}" in str(info.value)
    lines = []
    result = train(None, run, resume=True, echo=lines.append)
    assert result.steps == 4 and any("starting it again from step 0" in line for line in lines), lines
    assert logged(run) == logged(base)
    assert not list((run / "checkpoints").glob(".*"))


def read_metrics_text(run: Path, upto: int) -> str:
    """The lines of ``run``'s metrics up to step ``upto``."""
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return "".join(line + "\n" for line in lines if json.loads(line)["step"] <= upto)


WALL_CLOCK = ("tokens_per_s", "model_flops_per_s", "mfu", "peak_mem_bytes")


def logged(run: Path) -> list[dict]:
    """Every metrics record without its wall-clock fields."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK} for r in read_metrics(run / "metrics.jsonl")]


_KILLED_IN_FIRST_SAVE = """
import os, signal, sys
from modkit.io import atomic
from modkit.cli import main

def hook(step, folder):
    if step == atomic.COMMIT_STEP and folder.name.startswith(".best-0000000."):
        os.kill(os.getpid(), signal.SIGKILL)

with atomic.on_step(hook):
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # end to end (processes): left out of make test-fast
def test_a_run_killed_in_its_first_save_starts_again(base, tmp_path):
    """A real kill at the commit of the first save (the step-0 best): ``-o`` refuses naming the way out, and
    ``--resume`` starts the run again, removing the interrupted save, and logs what an uninterrupted run logs."""
    path = tmp_path / "train.json"
    path.write_text(json.dumps(config(base.parent / "prepared")))
    run = tmp_path / "killed"
    command = [sys.executable, "-c", _KILLED_IN_FIRST_SAVE, "train", "--config", str(path), "-o", str(run)]
    proc = subprocess.run(command + ["--no-progress"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert list((run / "checkpoints").glob(".best-0000000.tmp-*")), "the kill left the interrupted save"
    with pytest.raises(TrainError, match=f"no complete checkpoint .* --resume {run}"):
        train(str(path), run, echo=quiet)
    result = train(None, run, resume=True, echo=quiet)
    assert result.steps == 4 and logged(run) == logged(base)
    assert not list((run / "checkpoints").glob(".*"))


@pytest.mark.slow  # end to end (processes): left out of make test-fast
def test_the_cli_reports_a_damaged_moment_and_exits_nonzero(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_tensors(run, lambda t: t["state.0.exp_avg"].fill_(float("nan")))
    before = folder_state(run)
    proc = subprocess.run(
        [sys.executable, "-m", "modkit", "train", "--resume", str(run), "--max-steps", "6", "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and "step 6" not in proc.stdout
    assert f"modkit: error: {path}: state.0.exp_avg holds" in proc.stderr
    assert folder_state(run) == before


def test_pruning_never_deletes_the_checkpoint_last_leads_to(base, tmp_path):
    """Resumed from an older checkpoint (the newer one damaged), a run that saves a step below the newer folder's
    keeps what it just wrote: pruning counts by step but never deletes ``last``'s target."""
    run = copy_run(base, tmp_path)
    edit_tensors(run, lambda t: t["state.0.exp_avg"].fill_(float("nan")))
    (run / "last").unlink()
    (run / "last").symlink_to(Path("checkpoints") / "step-0000002")
    result = train(None, run, resume=True, overrides={"max_steps": 3, "keep_checkpoints": 1}, echo=quiet)
    assert result.steps == 3
    assert Path(str((run / "last").readlink())).name == "step-0000003"
    assert (run / "last" / "trainer.json").is_file()


def test_eval_reads_the_run_files_strictly(base, tmp_path):
    """``modkit eval`` of a run's checkpoint takes defaults from the run's files: a duplicate key is refused."""
    from modkit.evaluation.run import run_defaults
    from modkit.evaluation.score import EvalError

    run = copy_run(base, tmp_path)
    assert run_defaults(run / "last")["seq_len"] == 16
    path = run / "data.json"
    path.write_text(path.read_text().replace('"folder":', '"folder": "/elsewhere", "folder":', 1))
    with pytest.raises(EvalError, match=r"data\.json: folder: duplicate key 'folder'"):
        run_defaults(run / "last")


def test_a_data_json_without_a_folder_path_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = run / "data.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "folder": 5}))
    with pytest.raises(TrainError, match=rf"{path}: folder = 5 is not a path"):
        train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    path.write_text('{"folder": "a", "folder": "b"}')
    with pytest.raises(TrainError, match="duplicate key 'folder'"):
        train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)


def test_a_moment_of_another_dtype_than_its_parameter_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    edit_tensors(run, lambda t: t.__setitem__("state.0.exp_avg", t["state.0.exp_avg"].half()))
    name, _ = first_param(run)
    text = refused(run, CheckpointError, "state.0.exp_avg")
    assert f"state.0.exp_avg is stored as float16; its parameter {name} (index 0) is float32" in text


def test_a_missing_cpu_rng_state_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_tensors(run, lambda t: t.pop("rng.cpu"))
    assert f"{path}: rng.cpu is missing" in refused(run, CheckpointError, "rng.cpu")


def test_a_negative_best_val_loss_is_refused(base, tmp_path):
    run = copy_run(base, tmp_path)
    path = edit_trainer_json(run, lambda d: d.__setitem__("best_val_loss", -1e300))
    text = refused(run, CheckpointError, "best_val_loss")
    assert f"{path}: best_val_loss = -1e+300 is not a finite non-negative number" in text


@pytest.mark.parametrize("kind", ["copy", "file", "partial"])
def test_entries_that_are_not_complete_checkpoints_are_noted_and_left(base, tmp_path, capsys, kind):
    run = copy_run(base, tmp_path)
    ck = run / "checkpoints"
    entry, why = {
        "copy": (ck / "step-abc", "not a checkpoint name (step-NNNNNNN)"),
        "file": (ck / "step-0000010", "a file, not a checkpoint folder"),
        "partial": (ck / "step-0000009", "an incomplete checkpoint (no model.safetensors, trainer.safetensors)"),
    }[kind]
    if kind == "copy":
        shutil.copytree(ck / "step-0000004", entry)
    elif kind == "file":
        entry.write_text("x")
    else:
        entry.mkdir()
        shutil.copy(ck / "step-0000004" / "trainer.json", entry)
    result = train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    assert result.steps == 6
    assert f"modkit: note: ignored {entry}: {why}; left in place" in capsys.readouterr().err
    assert entry.exists()


def test_a_dangling_last_link_falls_back_with_a_note(base, tmp_path, capsys):
    run = copy_run(base, tmp_path)
    (run / "last").unlink()
    (run / "last").symlink_to("checkpoints/step-0000099")
    result = train(None, run, resume=True, overrides={"max_steps": 6}, echo=quiet)
    assert result.steps == 6
    err = capsys.readouterr().err
    assert f"modkit: note: {run / 'last'} leads to" in err and "step-0000099, which does not exist" in err
    assert "resuming from the newest complete checkpoint, step-0000004" in err


def test_a_damaged_run_tokenizer_is_refused_naming_it(base, tmp_path):
    run = copy_run(base, tmp_path)
    (run / "tokenizer.json").write_bytes(bytes(range(200)))
    text = refused(run, CheckpointError, "tokenizer")
    assert f"{run / 'tokenizer.json'}: the run's tokenizer does not load" in text


def test_data_of_another_tokenizer_on_resume_is_refused_naming_both(base, tmp_path):
    run = copy_run(base, tmp_path)
    text = tmp_path / "other.txt"
    text.write_text("zyxwvut " * 400)
    prepare([text], tmp_path / "other", tokenizer="char", show_progress=False)
    before = folder_state(run)
    with pytest.raises(CheckpointError, match="another tokenizer") as info:
        train(None, run, resume=True, overrides={"max_steps": 6, "data": str(tmp_path / "other")}, echo=quiet)
    assert folder_state(run) == before
    assert str(tmp_path / "other") in str(info.value) and str(run / "tokenizer.json") in str(info.value)
