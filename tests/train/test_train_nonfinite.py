"""Non-finite training steps: a NaN loss, gradient or weight stops the run naming the step (or, with
``on_nonfinite = "skip"``, skips the batch, counted), and such state is never saved as ``last`` or ``best``; nothing
older is pruned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from modkit import SpecError
from modkit.data import default_corpus, prepare
from modkit.train import TrainError, Trainer, load_train_config
from modkit.train.plot import read_metrics

from conftest import tiny_spec

MODEL = {**tiny_spec(max_seq_len=32), "position": {"type": "learned"}, "tie_embeddings": True}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("nonfinite")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def trainer(data: Path, run: Path, lines: list, **changes) -> Trainer:
    cfg = dict(
        model=MODEL,
        data=str(data),
        batch_size=2,
        seq_len=16,
        max_steps=6,
        warmup_steps=1,
        eval_interval=2,
        checkpoint_interval=2,
        keep_checkpoints=1,
        eval_batches=1,
        log_interval=1,
        sample_tokens=0,
        final_eval_tokens=0,
        device="cpu",
        seed=3,
    )
    cfg.update(changes)
    config, base = load_train_config(cfg)
    t = Trainer(config, run, base_dir=base, progress=False, echo=lines.append)
    t.setup()
    return t


def nan_forward_at(t: Trainer, steps: set, *, training: bool = True) -> None:
    """Make the embedding's output NaN in the forward passes of the given (1-based) steps."""

    def hook(module, inputs, output):
        if t.model.training == training and t.step + (1 if training else 0) in steps:
            return output * float("nan")
        return None

    t.model.embed.register_forward_hook(hook)


def checkpoints(run: Path) -> tuple[list[str], str]:
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    return names, Path(str((run / "last").readlink())).name


def test_a_nan_loss_stops_the_run_naming_the_step(data, tmp_path):
    lines: list = []
    t = trainer(data, tmp_path / "run", lines)
    nan_forward_at(t, {5})
    with pytest.raises(TrainError, match=r"step 5: the training loss is nan") as info:
        t.fit()
    text = str(info.value)
    assert "--on-nonfinite skip" in text and "step-0000004" in text
    assert checkpoints(tmp_path / "run") == (["best-0000004", "step-0000004"], "step-0000004")
    assert max(r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")) == 4


def test_a_nan_gradient_stops_the_run(data, tmp_path):
    lines: list = []
    t = trainer(data, tmp_path / "run", lines)
    weight = t.model.embed.weight
    weight.register_hook(lambda g: g * float("nan") if t.step + 1 == 3 else g)
    with pytest.raises(TrainError, match=r"step 3: the gradient norm is nan \(the loss \d\.\d+ is finite\)"):
        t.fit()
    assert checkpoints(tmp_path / "run") == (["best-0000002", "step-0000002"], "step-0000002")


def test_weights_made_nan_by_the_update_stop_the_run_naming_them(data, tmp_path):
    lines: list = []
    t = trainer(data, tmp_path / "run", lines)

    def poison(optimizer, args, kwargs):
        if t.step + 1 == 3:
            with torch.no_grad():
                t.model.layers[0].attention.q_proj.weight[0, 0] = float("inf")

    t.optimizer.register_step_post_hook(poison)
    with pytest.raises(TrainError, match="step 3: after the optimizer update") as info:
        t.fit()
    assert "layers.0.attention.q_proj.weight (1 of 1,024)" in str(info.value)
    assert checkpoints(tmp_path / "run") == (["best-0000002", "step-0000002"], "step-0000002")


def test_a_huge_finite_weight_trips_only_the_fast_flag_and_the_exact_test_clears_it(data, tmp_path):
    """The per-step flag reads each weight tensor's Euclidean norm: a finite tensor whose norm overflows float32 raises
    it, the exact test (largest magnitude) then finds nothing and the step goes on; a NaN is still named."""
    t = trainer(data, tmp_path / "run", [])
    finite = (torch.tensor(1.0), torch.tensor(1.0))  # the loss and the gradient norm
    weight = t.model.layers[0].attention.q_proj.weight
    with torch.no_grad():
        weight[0, :2] = 3e19  # finite; 2 * 9e38 overflows float32
    assert float(t._weights_flag(fast=True)) == 1.0 and float(t._weights_flag()) == 0.0
    assert t._nonfinite_problem(*finite) is None
    with torch.no_grad():
        weight[0, 0] = float("nan")
    with pytest.raises(TrainError, match=r"layers\.0\.attention\.q_proj\.weight \(1 of 1,024\)"):
        t._nonfinite_problem(*finite)


def test_a_nan_first_evaluation_writes_no_best(data, tmp_path):
    lines: list = []
    t = trainer(data, tmp_path / "run", lines)
    nan_forward_at(t, {0}, training=False)
    with pytest.raises(TrainError, match="step 0: the validation loss estimate is nan"):
        t.fit()
    assert not (tmp_path / "run" / "best").exists() and not list((tmp_path / "run" / "checkpoints").iterdir())


def test_skip_mode_skips_the_batch_and_counts_it(data, tmp_path):
    lines: list = []
    run = tmp_path / "run"
    t = trainer(data, run, lines, on_nonfinite="skip")
    nan_forward_at(t, {3})
    before = {}

    def remember(optimizer, args, kwargs):
        if t.step + 1 == 2:  # the weights after step 2 are those step 3 starts from
            before.update({n: p.detach().clone() for n, p in t.model.named_parameters()})

    t.optimizer.register_step_post_hook(remember)
    step3 = {}

    def at_step_4(module, inputs, output):
        if t.model.training and t.step + 1 == 4 and not step3:
            step3.update({n: p.detach().clone() for n, p in t.model.named_parameters()})

    t.model.embed.register_forward_hook(at_step_4)
    result = t.fit()
    assert result.steps == 6 and result.skipped_steps == 1
    for name, value in before.items():  # the skipped step left the weights as they were
        assert torch.equal(step3[name], value), name
    skipped = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train" and r.get("skipped")]
    assert [(r["step"], r["skipped_steps"]) for r in skipped] == [(3, 1)]
    assert any("step 3: the training loss is nan: batch skipped (1 in a row, 1 in all" in line for line in lines)
    state = json.loads((run / "last" / "trainer.json").read_text())
    assert (state["skipped_steps"], state["consecutive_skips"]) == (1, 0)


def test_skip_mode_stops_after_too_many_skips_in_a_row(data, tmp_path):
    lines: list = []
    t = trainer(data, tmp_path / "run", lines, on_nonfinite="skip", max_nonfinite_skips=2)
    nan_forward_at(t, {3, 4, 5, 6})
    with pytest.raises(TrainError, match=r"step 5: the training loss is nan: 3 non-finite steps in a row") as info:
        t.fit()
    assert "max_nonfinite_skips = 2" in str(info.value)
    assert checkpoints(tmp_path / "run") == (["best-0000002", "step-0000004"], "step-0000004")


def test_the_nonfinite_fields_are_validated():
    with pytest.raises(SpecError, match="on_nonfinite"):
        load_train_config({"on_nonfinite": "ignore"})
    with pytest.raises(SpecError, match="max_nonfinite_skips"):
        load_train_config({"max_nonfinite_skips": 0})
