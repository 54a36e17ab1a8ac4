"""``modkit train`` under torchrun (gloo on the CPU): the same per-step losses as one process, sharded resume.
With the same global batch and seed, FSDP2 over 2 processes and tensor parallelism x FSDP2 over 4 (tp 2 x dp 2)
give the single-process losses to float32 rounding (the reductions add in another order), a sharded run
resumed from its DCP checkpoint logs what the uninterrupted run logged, and an MoE's correction-bias update sees
the loads of the whole global batch (biases equal to one process's), and recurrent mixers (Gated DeltaNet beside
attention, Mamba-2) train under FSDP2 as they do in one process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modkit
from modkit.data import default_corpus, prepare
from modkit.train.plot import read_metrics
from modkit.train.state import point

from conftest import HANG_TIMEOUT, REPO

pytestmark = pytest.mark.slow

CONFIG = {
    "model": json.loads((REPO / "specs" / "tiny-llama.json").read_text()),
    "batch_size": 8,
    "seq_len": 32,
    "max_steps": 6,
    "decay_steps": 6,
    "warmup_steps": 2,
    "eval_interval": 3,
    "eval_batches": 2,
    "log_interval": 1,
    "sample_tokens": 0,
    "device": "cpu",
    "threads": 1,
    "seed": 3,
    # one process would run its linear layers through oneDNN, several through torch's default kernels: the same
    # products to float rounding, which a few AdamW steps amplify in near-zero gradients; compare like with like
    "onednn_linear": False,
}
TOL = 2e-5


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist")
    text = root / "head.txt"
    text.write_text(default_corpus().read_text()[:40_000])
    prepare([text], root / "data", tokenizer="char", show_progress=False)
    (root / "train.json").write_text(json.dumps({**CONFIG, "data": str(root / "data")}))
    return root


def _run(root: Path, out: str, nproc: int, *args: str) -> Path:
    cmd = (
        [sys.executable, "-m", "modkit", "train"]
        if nproc == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            "-m",
            "modkit",
            "train",
        ]
    )
    args = ("-c", str(root / "train.json"), "-o", str(root / out)) + args if "--resume" not in args else args
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*cmd, *args, "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=HANG_TIMEOUT, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return root / out


def _one_and_two(root: Path, name: str, cfg: dict) -> dict[int, Path]:
    """Train ``cfg`` in one process and under FSDP2 on two; ``{1: folder, 2: folder}``."""
    (root / f"{name}.json").write_text(json.dumps(cfg))
    runs = {}
    for n in (1, 2):
        cmd = (
            [sys.executable, "-m", "modkit", "train"]
            if n == 1
            else [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={n}",
                "-m",
                "modkit",
                "train",
            ]
        )
        out = root / f"{name}-{n}"
        done = subprocess.run(
            [*cmd, "-c", str(root / f"{name}.json"), "-o", str(out), "--no-progress"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=HANG_TIMEOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        runs[n] = out
    return runs


def _losses(run: Path) -> list[tuple[str, int, float]]:
    out = []
    for r in read_metrics(run / "metrics.jsonl"):
        if r["kind"] == "train":
            out += [("loss", r["step"], r["loss"]), ("grad_norm", r["step"], r["grad_norm"])]
        elif r["kind"] == "eval":
            out += [("train_loss", r["step"], r["train_loss"]), ("val_loss", r["step"], r["val_loss"])]
        else:
            out += [("final_val_loss", r["step"], r["val_loss"])]
    return out


def _close(a: list, b: list) -> None:
    assert [x[:2] for x in a] == [x[:2] for x in b]
    worst = max(abs(x[2] - y[2]) for x, y in zip(a, b))
    assert worst <= TOL, (worst, a, b)


def test_data_and_tensor_parallel_runs_match_one_process(setup):
    one = _losses(_run(setup, "one", 1))
    fsdp = _run(setup, "fsdp2", 2)
    _close(_losses(fsdp), one)
    mesh = _run(setup, "tp2dp2", 4, "--tp", "2")
    _close(_losses(mesh), one)
    # the last checkpoint was exported whole: an ordinary modkit checkpoint equal to the single-process weights
    single, sharded = modkit.load(setup / "one" / "last"), modkit.load(mesh / "last")
    for (name, x), (_, y) in zip(single.state_dict().items(), sharded.state_dict().items()):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4, msg=name)
    assert (mesh / "last" / "dcp").is_dir() and (mesh / "best" / "tokenizer.json").is_file()


def test_sharded_resume_logs_what_the_uninterrupted_run_logged(setup):
    whole = _run(setup, "whole", 2, "--tp", "2", "--checkpoint-interval", "3")
    cut = setup / "cut"
    shutil.copytree(whole, cut, symlinks=True)
    # as if killed after step 4: the step-6 checkpoint never became complete
    shutil.rmtree(cut / "checkpoints" / "step-0000006")
    point(cut / "last", cut / "checkpoints" / "step-0000003")
    _run(setup, "cut", 2, "--resume", str(cut))
    assert _losses(cut) == _losses(whole)  # same mesh, same reduction order: bitwise


def test_fsdp_bias_update_equals_one_process(setup):
    """A DeepSeek-style MoE (correction bias moved after each step): under FSDP2 on 2 processes the loads are summed
    over the data-parallel ranks before the update, so the biases and the logged imbalances equal one process's."""
    moe = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    moe["max_seq_len"] = 32
    moe["block"]["ffn"]["router"]["bias_update_speed"] = 0.05
    cfg = {
        **CONFIG,
        "model": moe,
        "data": str(setup / "data"),
        "max_steps": 4,
        "eval_interval": 4,
        "final_eval_tokens": 0,
    }
    runs = _one_and_two(setup, "moe", cfg)
    one, two = modkit.load(runs[1] / "last"), modkit.load(runs[2] / "last")
    for i in (1, 2, 3):
        a, b = one.layers[i].ffn.router.correction_bias, two.layers[i].ffn.router.correction_bias
        assert torch.count_nonzero(a) > 0 and torch.equal(a, b), i
    imbalance = [[r["load_imbalance"] for r in read_metrics(runs[n] / "metrics.jsonl")] for n in (1, 2)]
    assert imbalance[0] == imbalance[1]


@pytest.mark.parametrize("name", ["tiny-hybrid", "tiny-mamba2"])
def test_fsdp_trains_recurrent_mixers_as_one_process(setup, name):
    """Recurrent mixers (Gated DeltaNet beside attention, pure Mamba-2) under FSDP2 on 2 processes: the per-step
    losses and gradient norms equal one process's to float32 rounding, and the exported checkpoint equals its weights."""
    spec = json.loads((REPO / "specs" / f"{name}.json").read_text())
    spec["max_seq_len"] = 32
    for slot in (spec["block"], *spec.get("overrides", [])):
        if "chunk_size" in slot.get("mixer", {}):
            slot["mixer"]["chunk_size"] = 16  # two chunks per sequence: the chunked scan's carry is exercised
    cfg = {
        **CONFIG,
        "model": spec,
        "data": str(setup / "data"),
        "max_steps": 4,
        "eval_interval": 4,
        "final_eval_tokens": 0,
    }
    runs = _one_and_two(setup, name, cfg)
    _close(_losses(runs[2]), _losses(runs[1]))
    one, two = modkit.load(runs[1] / "last"), modkit.load(runs[2] / "last")
    for (k, x), (_, y) in zip(one.state_dict().items(), two.state_dict().items()):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4, msg=k)


def test_expert_parallel_run_matches_one_process(setup):
    """``modkit train --ep 2`` on 2 processes (the experts of the tiny DeepSeek-style MoE split in two, tokens sent
    to them by all-to-all, the rest FSDP2): the per-step losses, gradient norms and evaluations equal one process's,
    the correction biases too, and the exported checkpoint holds the single-process weights."""
    moe = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    moe.update(max_seq_len=32, n_layers=2)
    moe["block"]["ffn"]["router"]["bias_update_speed"] = 0.05
    cfg = {**CONFIG, "model": moe, "data": str(setup / "data"), "max_steps": 4, "eval_interval": 4}
    (setup / "ep.json").write_text(json.dumps({**cfg, "final_eval_tokens": 0}))
    one = _run(setup, "ep-one", 1, "-c", str(setup / "ep.json"))
    two = _run(setup, "ep-two", 2, "-c", str(setup / "ep.json"), "--ep", "2")
    _close(_losses(two), _losses(one))
    a, b = modkit.load(one / "last"), modkit.load(two / "last")
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        torch.testing.assert_close(y, x, atol=1e-5, rtol=1e-4, msg=k)
    assert torch.count_nonzero(b.layers[1].ffn.router.correction_bias) > 0
