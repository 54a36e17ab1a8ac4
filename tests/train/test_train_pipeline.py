"""``modkit train --pp 2`` under torchrun (gloo on the CPU): the per-step losses, gradient norms and loss estimates of
one process with the same batch (the pipeline's two microbatches give the batch's mean gradient), and a PP-2 DCP
checkpoint resumed on one process logs what the one-process run logged; what a pipelined run does not support is
refused by name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modkit.data import default_corpus, prepare
from modkit.train import TrainError
from modkit.train.config import TrainConfig
from modkit.train.pipelined import check_pipeline_config
from modkit.train.plot import read_metrics
from modkit.train.state import point

from conftest import HANG_TIMEOUT, REPO

CONFIG = {
    "model": json.loads((REPO / "specs" / "tiny-llama.json").read_text()),
    "batch_size": 4,
    "seq_len": 32,
    "max_steps": 4,
    "decay_steps": 4,
    "warmup_steps": 1,
    "eval_interval": 2,
    "eval_batches": 1,
    "log_interval": 1,
    "checkpoint_interval": 2,
    "keep_checkpoints": 3,
    "final_eval_tokens": 256,
    "sample_tokens": 0,
    "device": "cpu",
    "threads": 1,
    "seed": 5,
    # one process would run its linear layers through oneDNN, a pipeline through torch's default kernels: the same
    # products to float rounding, which AdamW steps amplify in near-zero gradients; compare like with like
    "onednn_linear": False,
}
TOL = 1e-5


def _run(root: Path, nproc: int, *args: str) -> None:
    cmd = [sys.executable, "-m", "modkit", "train"]
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
        cmd += ["-m", "modkit", "train"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [*cmd, *args, "--no-progress"], capture_output=True, text=True, cwd=REPO, timeout=HANG_TIMEOUT, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]


def _values(run: Path) -> list[tuple[str, int, float]]:
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


@pytest.mark.slow
def test_pp2_matches_one_process_and_resumes_on_one(tmp_path):
    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], tmp_path / "data", tokenizer="char", show_progress=False)
    (tmp_path / "train.json").write_text(json.dumps({**CONFIG, "data": str(tmp_path / "data")}))
    conf = ("-c", str(tmp_path / "train.json"))
    one, pp = tmp_path / "one", tmp_path / "pp2"
    _run(tmp_path, 1, *conf, "-o", str(one))
    _run(tmp_path, 2, *conf, "-o", str(pp), "--pp", "2", "--pp-microbatches", "2")
    reference = _values(one)
    assert len(reference) == 4 * 2 + 3 * 2 + 1  # 4 steps, evals at 0, 2, 4, the final loss
    _close(_values(pp), reference)
    assert (pp / "last" / "dcp").is_dir() and (pp / "best" / "model.safetensors").is_file()
    # the PP-2 checkpoint of step 2 resumed on one process: steps 3 and 4 as the one-process run logged them
    cut = tmp_path / "cut"
    shutil.copytree(pp, cut, symlinks=True)
    shutil.rmtree(cut / "checkpoints" / "step-0000004")
    point(cut / "last", cut / "checkpoints" / "step-0000002")
    _run(tmp_path, 1, "--resume", str(cut), "--pp", "1")
    _close(_values(cut), reference)


@pytest.mark.parametrize(
    "fields, named",
    [
        ({"cp": 2}, "cp = 2"),
        ({"grad_accum": 2}, "grad_accum = 2"),
        ({"precision": "bfloat16"}, "precision = 'bfloat16'"),
        ({"compile": True}, "compile = true"),
    ],
)
def test_pipeline_refuses_what_it_does_not_support(fields, named):
    config = TrainConfig(**{**CONFIG, "pp": 2, **fields})
    with pytest.raises(TrainError, match=f"pp = 2: not supported with {named}"):
        check_pipeline_config(config)


def test_pipeline_refuses_a_tied_head_before_anything_is_written():
    from modkit.spec.load import load_spec

    spec = load_spec(REPO / "specs" / "tiny-gpt2.json")
    assert spec.tie_embeddings
    with pytest.raises(TrainError, match="pp = 2: not supported with tie_embeddings = true"):
        check_pipeline_config(TrainConfig(**{**CONFIG, "pp": 2}), spec)
    check_pipeline_config(TrainConfig(**{**CONFIG, "pp": 1}), spec)  # one stage: nothing to cut


def test_pipeline_refuses_a_wide_residual_stream_and_a_mixer_reading_the_embeddings():
    # a stage hands the next one [batch, seq, d_model] alone: no stream copies, no embeddings beside it
    from modkit.spec.load import load_spec

    spec = load_spec(REPO / "specs" / "deepseek-v4.json")
    assert spec.stream is not None
    with pytest.raises(TrainError, match=r"pp = 2: not supported with stream 'mhc'"):
        check_pipeline_config(TrainConfig(**{**CONFIG, "pp": 2}), spec)
    side = json.loads(json.dumps(CONFIG["model"]))
    side["overrides"] = [
        {
            "layers": [1],
            "mixer": {
                "type": "side_input",
                "mixer": {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 4},
                "side_mixer": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
                "norm": {"type": "rmsnorm"},
            },
        }
    ]
    with pytest.raises(TrainError, match=r"layer 1\.mixer .*concat_embeddings = true"):
        check_pipeline_config(TrainConfig(**{**CONFIG, "pp": 2}), load_spec(side))
    side["overrides"][0]["mixer"]["concat_embeddings"] = False
    check_pipeline_config(TrainConfig(**{**CONFIG, "pp": 2}), load_spec(side))
