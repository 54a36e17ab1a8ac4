"""The CPU training run's speed settings: linear layers through oneDNN (same losses as torch's default kernels up to
float rounding), freed host memory kept for the next step, and the loss plot drawn once unless ``live_plot``."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
from torch import nn

from modkit.data import default_corpus, prepare
from modkit.nn.onednn import OneDNNLinear, onednn_available
from modkit.train import train
from modkit.train.allocator import keep_freed_memory
from modkit.train.config import load_train_config
from modkit.train.loop import Trainer
from modkit.train.plot import read_metrics

from conftest import tiny_spec


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """The first 20,000 characters of tiny shakespeare, character tokenizer."""
    root = tmp_path_factory.mktemp("data")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], root / "prepared", tokenizer="char", show_progress=False)
    return root / "prepared"


def config(data_dir: Path, **changes) -> dict:
    base = {
        "model": {**tiny_spec(max_seq_len=16), "position": {"type": "learned"}, "tie_embeddings": True},
        "data": str(data_dir),
        "batch_size": 2,
        "seq_len": 16,
        "max_steps": 8,
        "warmup_steps": 2,
        "lr": 3e-3,
        "eval_interval": 4,
        "eval_batches": 1,
        "log_interval": 1,
        "sample_tokens": 0,
        "final_eval_tokens": 0,
        "device": "cpu",
        "seed": 5,
    }
    return {**base, **changes}


def _linear_types(data_dir: Path, tmp_path: Path, **changes) -> set[type]:
    cfg, base = load_train_config(config(data_dir, **changes))
    t = Trainer(cfg, tmp_path / "run", base_dir=base, progress=False, echo=lambda s: None)
    t.setup()
    return {type(m) for m in t.model.modules() if isinstance(m, nn.Linear)}


@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear operator")
def test_linears_go_through_onednn_on_cpu_float32_unless_switched_off(data_dir, tmp_path):
    assert _linear_types(data_dir, tmp_path / "a") == {OneDNNLinear}
    assert _linear_types(data_dir, tmp_path / "b", onednn_linear=False) == {nn.Linear}
    assert _linear_types(data_dir, tmp_path / "c", precision="bfloat16") == {nn.Linear}


@pytest.mark.slow
@pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear operator")
def test_onednn_run_logs_the_same_losses_as_torchs_default_kernels(data_dir, tmp_path):
    runs = {}
    for flag in (True, False):
        run = tmp_path / f"run-{flag}"
        train(config(data_dir, onednn_linear=flag), run, echo=lambda s: None)
        runs[flag] = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] in ("train", "eval")]
    assert [(r["kind"], r["step"]) for r in runs[True]] == [(r["kind"], r["step"]) for r in runs[False]]
    assert len(runs[True]) == 8 + 3  # 8 train lines, evaluations at steps 0, 4, 8
    for fast, default in zip(runs[True], runs[False]):
        for key in ("loss", "grad_norm", "train_loss", "val_loss"):
            if key in fast:
                assert fast[key] == pytest.approx(default[key], rel=1e-4), (fast["step"], key)


@pytest.mark.parametrize("live, final, draws", [(False, 0, 1), (True, 64, 4)])
def test_loss_plot_is_drawn_once_at_the_end_unless_live(data_dir, tmp_path, monkeypatch, live, final, draws):
    import modkit.train.plot as plot

    drawn = []
    real = plot.plot_run
    monkeypatch.setattr(plot, "plot_run", lambda *a, **k: drawn.append(1) or real(*a, **k))
    run = tmp_path / "run"
    train(config(data_dir, live_plot=live, final_eval_tokens=final), run, echo=lambda s: None)
    assert len(drawn) == draws  # live: the evaluations at steps 0, 4 and 8, and the final one
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_memory_sets_glibc_thresholds_once(monkeypatch):
    """Both thresholds go through mallopt, once per process (a stand-in mallopt records the calls; an earlier
    training run in this worker has set the flag, so it is reset first)."""
    import ctypes

    import modkit.train.allocator as allocator

    calls = []

    class Libc:
        def __init__(self):
            self.mallopt = lambda param, value: calls.append((param, value)) or 1

    monkeypatch.setattr(allocator, "_done", False)
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent: no second pair of calls
    assert calls == [
        (allocator.M_MMAP_THRESHOLD, allocator.MMAP_THRESHOLD),
        (allocator.M_TRIM_THRESHOLD, allocator.TRIM_THRESHOLD),
    ]
