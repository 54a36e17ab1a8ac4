"""Training runs end to end on tiny models: learning, run folders, ordinary checkpoints, exact resume after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modkit
from modkit.data import default_corpus, prepare
from modkit.train import TrainError, decay_groups, flops_per_token, train
from modkit.train.plot import read_metrics

from conftest import HANG_TIMEOUT, REPO, tiny_spec

TINY_MODEL = {**tiny_spec(max_seq_len=32), "position": {"type": "learned"}, "tie_embeddings": True}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The first 60,000 characters of tiny shakespeare, character tokenizer."""
    root = tmp_path_factory.mktemp("data")
    text = root / "shakespeare-head.txt"
    text.write_text(default_corpus().read_text()[:60_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def config(data_dir: Path, **changes) -> dict:
    base = {
        "model": TINY_MODEL,
        "data": str(data_dir),
        "batch_size": 4,
        "seq_len": 32,
        "max_steps": 30,
        "warmup_steps": 5,
        "lr": 3e-3,
        "eval_interval": 10,
        "eval_batches": 2,
        "log_interval": 1,
        "sample_tokens": 20,
        "device": "cpu",
        "seed": 3,
    }
    base.update(changes)
    return base


def losses(run: Path) -> list[tuple]:
    """Every logged number of a run except wall-clock ones, in order."""
    out = []
    for r in read_metrics(run / "metrics.jsonl"):
        if r["kind"] == "train":
            out.append(("train", r["step"], r["tokens"], r["loss"], r["lr"], r["grad_norm"]))
        elif r["kind"] == "eval":
            out.append(("eval", r["step"], r["tokens"], r["train_loss"], r["val_loss"]))
        else:
            out.append((r["kind"], r["step"], r["tokens"], r["val_loss"]))
    return out


def test_a_run_learns_and_writes_its_folder(data_dir, tmp_path):
    run = tmp_path / "run"
    result = train(config(data_dir), run, echo=lambda line: None)
    assert result.steps == 30 and result.tokens == 30 * 4 * 32
    records = read_metrics(run / "metrics.jsonl")
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 10, 20, 30]
    assert evals[0]["val_loss"] == pytest.approx(
        torch.log(torch.tensor(float(modkit.load_spec(run / "spec.json").vocab_size))).item(), abs=0.3
    )
    assert evals[-1]["train_loss"] < evals[0]["train_loss"] - 0.5, "30 steps at lr 3e-3 must lower the loss"
    assert result.val_loss == evals[-1]["val_loss"] and result.best_val_loss == min(r["val_loss"] for r in evals)
    trains = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in trains] == list(range(1, 31))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "model_flops_per_s", "peak_mem_bytes"):
        assert all(key in r for r in trains)
    for name in ("config.json", "spec.json", "tokenizer.json", "data.json", "loss.png", "sample.txt"):
        assert (run / name).is_file(), name
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the vocabulary came from the data: the char tokenizer of this text
    spec = modkit.load_spec(run / "spec.json")
    assert spec.vocab_size == json.loads((data_dir / "meta.json").read_text())["vocab_size"]
    # best and last are ordinary modkit checkpoints carrying the tokenizer
    assert (run / "last").resolve().name == "step-0000030"
    best = modkit.load(run / "best")
    assert best.spec.vocab_size == spec.vocab_size and (run / "best" / "tokenizer.json").is_file()
    last = modkit.load(run / "last")
    assert not torch.equal(last.embed.weight, modkit.build(spec, seed=3).embed.weight)
    # keep_checkpoints = 2: steps 20 and 30 remain
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-0000020", "step-0000030"]
    assert result.sample is not None and (run / "sample.txt").read_text().startswith(result.sample[:5])


def test_final_score_is_the_whole_validation_split(data_dir, tmp_path):
    """The run's figure of merit equals scoring every non-overlapping window of the validation split by hand."""
    run = tmp_path / "run"
    result = train(config(data_dir, max_steps=4, eval_interval=4, sample_tokens=0), run, echo=lambda line: None)
    final = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "final"]
    assert len(final) == 1 and final[0]["val_loss"] == result.final_val_loss
    from modkit.data import TokenData

    val = torch.from_numpy(TokenData.open(data_dir).val.astype("int64"))
    n = (len(val) - 1) // 32
    x, y = val[: n * 32].view(n, 32), val[1 : n * 32 + 1].view(n, 32)
    model = modkit.load(run / "last").eval()
    with torch.no_grad():
        loss = torch.nn.functional.cross_entropy(model(x).logits.reshape(-1, model.spec.vocab_size), y.reshape(-1))
    assert final[0]["val_tokens_scored"] == n * 32
    assert result.final_val_loss == pytest.approx(loss.item(), abs=1e-5)


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_generate_finds_the_runs_tokenizer(data_dir, tmp_path):
    run = tmp_path / "run"
    train(
        config(data_dir, model=None, max_steps=5, eval_interval=5, sample_tokens=0), run, echo=lambda line: None
    )  # nanoGPT's GPT
    out = subprocess.run(
        [sys.executable, "-m", "modkit", "generate", str(run / "best"), "--prompt", "ROMEO:", "--max-new-tokens", "10"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HANG_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    assert len(out.stdout) == 10 + 1  # ten characters of the char tokenizer, then a newline
    assert "tokenizer.json" in out.stderr
    # the Hugging Face export of a run's checkpoint keeps the tokenizer beside the weights
    conv = subprocess.run(
        [
            sys.executable,
            "-m",
            "modkit",
            "convert",
            "modkit",
            str(run / "best"),
            "--to",
            "hf",
            "-o",
            str(tmp_path / "hf"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HANG_TIMEOUT,
    )
    assert conv.returncode == 0, conv.stderr
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == (run / "best" / "tokenizer.json").read_bytes()


def test_a_checkpoint_folder_as_model_fine_tunes_from_its_weights(data_dir, tmp_path):
    """``model`` = a modkit checkpoint: the run starts from its weights, so its step-0 evaluation equals the source
    run's last one (same data, same evaluation windows), not the loss of a fresh init."""
    first = tmp_path / "first"
    train(config(data_dir, max_steps=6, eval_interval=6, sample_tokens=0), first, echo=lambda line: None)
    tuned = tmp_path / "tuned"
    train(
        config(data_dir, model=str(first / "last"), max_steps=2, eval_interval=2, sample_tokens=0),
        tuned,
        echo=lambda line: None,
    )
    before = [r for r in read_metrics(first / "metrics.jsonl") if r["kind"] == "eval"]
    after = [r for r in read_metrics(tuned / "metrics.jsonl") if r["kind"] == "eval"]
    assert after[0]["val_loss"] == pytest.approx(before[-1]["val_loss"], abs=1e-6)
    assert abs(after[0]["val_loss"] - before[0]["val_loss"]) > 0.05


def test_decay_rule_and_flops():
    model = modkit.build(TINY_MODEL, device="meta")
    decay, no_decay = decay_groups(model, 0.1)
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    n_decay = sum(p.numel() for p in decay["params"])
    d, v, layers, d_ff, t, kv = 32, 64, 2, 64, 32, 2 * 8
    attn = 2 * d * d + 2 * d * kv  # q and o [d, d]; k and v [d, n_kv_heads * head_dim]
    assert n_decay == v * d + t * d + layers * (attn + 3 * d * d_ff)  # embeddings, positions, attention, swiglu
    # 3 x the forward of one causal sequence of t tokens, per token: 2 FLOPs per multiply-add of the matmul weights
    # (the tied head counted as the head) on every token, and per layer 4 heads x 8 dims x (q.k and p.v) x 2 FLOPs
    # over the t (t + 1) / 2 pairs the causal mask lets through
    n = layers * (attn + 3 * d * d_ff) + v * d
    forward = 2 * n * t + layers * 2 * 2 * 4 * 8 * (t * (t + 1) // 2)
    assert forward % t == 0
    assert flops_per_token(modkit.load_spec(TINY_MODEL), t) == 3 * forward // t == 6 * n + 6 * layers * 4 * 8 * (t + 1)


#: ``modkit train ...`` in a process that SIGKILLs itself at the commit point of the model save inside the
#: checkpoint of step 12 (modkit.io.atomic's fault-injection hook): a kill at a chosen point, not at a timed instant
_KILLED_AT_STEP_12 = """
import os, signal, sys
from modkit.io import atomic
from modkit.cli import main

def hook(step, folder):
    if step == atomic.COMMIT_STEP and folder.name.startswith(".step-0000012."):
        os.kill(os.getpid(), signal.SIGKILL)

with atomic.on_step(hook):
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_resume_after_sigkill_gives_the_same_losses(data_dir, tmp_path):
    """A run killed while it writes a checkpoint and resumed logs exactly (bitwise) what an uninterrupted run logs."""
    changes = dict(max_steps=60, checkpoint_interval=4, eval_interval=25, sample_tokens=0, batch_size=8)
    model = {**TINY_MODEL, "dropout": {"embedding": 0.1, "attention": 0.1, "residual": 0.1}}  # RNG state matters
    cfg = config(data_dir, model=model, **changes)
    path = tmp_path / "train.json"
    path.write_text(json.dumps(cfg))
    whole = tmp_path / "whole"
    train(cfg, whole, echo=lambda line: None)

    killed = tmp_path / "killed"
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_AT_STEP_12, "train", "--config", str(path), "-o", str(killed), "--no-progress"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    published = sorted(p.name for p in (killed / "checkpoints").glob("step-*"))
    assert published == ["step-0000004", "step-0000008"], published  # step 12 died before its rename into place
    assert list((killed / "checkpoints").glob(".step-0000012.tmp-*")), "the interrupted save left its folder"
    result = train(None, killed, resume=True, echo=lambda line: None)
    assert result.steps == 60
    assert losses(killed) == losses(whole)
    a, b = modkit.load(killed / "last"), modkit.load(whole / "last")
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    assert not list((killed / "checkpoints").glob(".*tmp-*")), "interrupted saves leave no temporaries after a resume"


def test_resuming_a_finished_run_trains_and_evaluates_nothing(data_dir, tmp_path):
    """--resume on a run that ended: the metrics file is left as it was and the result repeats the logged losses."""
    run = tmp_path / "run"
    first = train(config(data_dir, max_steps=6, eval_interval=3, sample_tokens=0), run, echo=lambda line: None)
    metrics = (run / "metrics.jsonl").read_bytes()
    lines = []
    again = train(None, run, resume=True, echo=lines.append)
    assert (run / "metrics.jsonl").read_bytes() == metrics
    assert (again.steps, again.train_loss, again.val_loss, again.final_val_loss, again.best_val_loss) == (
        first.steps,
        first.train_loss,
        first.val_loss,
        first.final_val_loss,
        first.best_val_loss,
    )
    assert again.tokens_per_s == 0.0 and any("already finished its 6 steps" in line for line in lines)


def test_run_folder_and_resume_errors(data_dir, tmp_path):
    run = tmp_path / "run"
    train(config(data_dir, max_steps=3, eval_interval=3, sample_tokens=0), run, echo=lambda line: None)
    with pytest.raises(TrainError, match="already holds a run"):
        train(config(data_dir, max_steps=3), run, echo=lambda line: None)
    with pytest.raises(TrainError, match="not a run folder"):
        train(None, tmp_path / "nothing", resume=True)
    with pytest.raises(TrainError, match="seq_len = 64 exceeds the model's max_seq_len = 32"):
        train(config(data_dir, seq_len=64), tmp_path / "r2", echo=lambda line: None)
    with pytest.raises(TrainError, match="vocab_size = 10 is smaller than the tokenizer's"):
        train(
            config(data_dir, model={**TINY_MODEL, "vocab_size": 10}, vocab_size="spec"),
            tmp_path / "r3",
            echo=lambda line: None,
        )
    with pytest.raises(TrainError, match="no component of the model has a field 'aux_loss_coef'"):
        train(config(data_dir, aux_loss_coef=0.01), tmp_path / "r4", echo=lambda line: None)
    with pytest.raises(TrainError, match="tp = 2 needs 2 processes"):
        train(config(data_dir, tp=2), tmp_path / "r5", echo=lambda line: None)
    with pytest.raises(TrainError, match="does not exist"):
        train(config(data_dir, data=str(tmp_path / "missing")), tmp_path / "r6", echo=lambda line: None)


def test_moe_aux_loss_coefficients_override_the_spec(data_dir, tmp_path):
    moe = json.loads((REPO / "specs" / "tiny-moe.json").read_text())
    moe.update(max_seq_len=32)
    run = tmp_path / "moe"
    train(
        config(
            data_dir, model=moe, max_steps=2, eval_interval=2, sample_tokens=0, aux_loss_coef=0.05, z_loss_coef=0.002
        ),
        run,
        echo=lambda line: None,
    )
    spec = json.loads((run / "spec.json").read_text())
    assert spec["block"]["ffn"]["aux_loss_coef"] == 0.05 and spec["block"]["ffn"]["z_loss_coef"] == 0.002


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_cli_flags_override_the_config(data_dir, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(config(data_dir, max_steps=50)))
    run = tmp_path / "run"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "modkit",
            "train",
            "-c",
            str(path),
            "-o",
            str(run),
            "--max-steps",
            "2",
            "--lr",
            "3e-4",
            "--eval-interval",
            "2",
            "--sample-tokens",
            "0",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HANG_TIMEOUT,
    )
    assert out.returncode == 0, out.stderr
    saved = json.loads((run / "config.json").read_text())
    assert saved["max_steps"] == 2 and saved["lr"] == 3e-4
    assert "done: 2 steps" in out.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "modkit",
            "train",
            "-c",
            str(path),
            "-o",
            str(tmp_path / "x"),
            "--lr",
            "fast",
            "--batch-size",
            "0",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=HANG_TIMEOUT,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "lr:" in bad.stderr and "batch_size:" in bad.stderr


def test_the_run_mean_tokens_per_s_counts_the_training_steps_only(data_dir, tmp_path, monkeypatch, capsys):
    """``modkit train``'s summary gives tokens trained / seconds inside training steps: a fake clock ticks 1 s per
    step and 100 s per evaluation or checkpoint, so 6 steps of 128 tokens make 128 tokens/s over 6 s of steps
    whatever the 400 s of evaluations and checkpoints (steps 3 and 6)."""
    import types

    from modkit.cli import main
    from modkit.train import loop

    clock = types.SimpleNamespace(now=0.0)
    monkeypatch.setattr(loop, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))

    def ticking(method, seconds):
        def run(self, *args, **kwargs):
            out = method(self, *args, **kwargs)
            clock.now += seconds
            return out

        return run

    monkeypatch.setattr(loop.Trainer, "train_step", ticking(loop.Trainer.train_step, 1.0))
    monkeypatch.setattr(loop.Trainer, "_eval_and_record", ticking(loop.Trainer._eval_and_record, 100.0))
    monkeypatch.setattr(loop.Trainer, "save_checkpoint", ticking(loop.Trainer.save_checkpoint, 100.0))
    path = tmp_path / "train.json"
    path.write_text(json.dumps(config(data_dir, max_steps=6, eval_interval=3, sample_tokens=0)))
    assert main(["train", "-c", str(path), "-o", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    done = out.index("done: 6 steps, 768 tokens in 406.0 s")
    assert out[done + 1] == "whole-run mean: 128 tokens/s over 6.0 s of training steps (evals and checkpoints left out)"
