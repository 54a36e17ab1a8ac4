"""Pipeline and context parallelism: stage cuts and capability checks in process, and training on gloo CPU ranks
equal to one process (``tests/dist_scripts/pipeline.py``, ``context_parallel.py``): per-step loss and gradient norm
to 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import modkit
from modkit import parallel as mp

from tests.conftest import HANG_TIMEOUT, REPO, SPECS

SCRIPTS = Path(__file__).resolve().parents[1] / "dist_scripts"
TOL = 1e-5

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


def test_layers_are_cut_evenly_or_as_asked_and_bad_cuts_are_refused():
    assert mp.split_layers(4, 2) == [range(0, 2), range(2, 4)]
    assert mp.split_layers(5, 2) == [range(0, 3), range(3, 5)]
    assert mp.split_layers(4, 2, [1, 3]) == [range(0, 1), range(1, 4)]
    with pytest.raises(mp.ParallelError, match=r"cuts \[1, 2\] must give 2 stages .* n_layers = 4"):
        mp.split_layers(4, 2, [1, 2])
    with pytest.raises(mp.ParallelError, match="6 pipeline stages for 4 layers"):
        mp.split_layers(4, 6)


def test_stage_placement_of_each_schedule():
    assert mp.pipeline.stage_ids("1f1b", 2, 1) == [1]
    assert mp.pipeline.stage_ids("interleaved_1f1b", 2, 1, 3) == [1, 3, 5]
    assert mp.pipeline.stage_ids("dualpipev", 4, 1) == [1, 6]
    with pytest.raises(mp.ParallelError, match="unknown pipeline schedule 'zigzag'"):
        mp.pipeline.stage_ids("zigzag", 2, 0)


def test_stage_modules_keep_the_whole_models_parameter_names_and_compute_its_logits():
    """Two stages run one after the other on one process give the model's logits; every name is the model's."""
    model = modkit.build(SPECS / "tiny-llama.json", seed=0)
    first = mp.StageModule(model, range(0, 1), first=True, last=False)
    last = mp.StageModule(model, range(1, 4), first=False, last=True)
    names = {n for n, _ in first.named_parameters()} | {n for n, _ in last.named_parameters()}
    assert names == {n for n, _ in model.named_parameters()}
    ids = torch.randint(0, 1024, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(last(first(ids)), model(ids).logits)


def test_recurrent_mixers_declare_they_cannot_be_sequence_sharded():
    """The hybrid is refused naming each recurrent layer and the reason; attention specs have no problem."""
    hybrid = modkit.build(SPECS / "tiny-hybrid.json", device="meta")
    problems = mp.context_parallel_problems(hybrid)
    assert [(p, t) for p, t, _ in problems] == [(f"layers.{i}.attention", "mixer/gated_deltanet") for i in range(3)]
    assert all("runs through the sequence in order" in why for _, _, why in problems)
    assert mp.context_parallel_problems(modkit.build(SPECS / "tiny-mamba2.json", device="meta"))
    for name in ("tiny-llama", "tiny-mla", "tiny-gpt2", "tiny-gemma"):
        assert mp.context_parallel_problems(modkit.build(SPECS / f"{name}.json", device="meta")) == [], name


def test_a_mixture_of_experts_is_refused_under_context_parallelism_naming_each_layer():
    """Its balance loss and routers' loads are per-sequence and per-batch statistics a slice cannot take alone."""
    problems = mp.context_parallel_problems(modkit.build(SPECS / "tiny-deepseek-moe.json", device="meta"))
    assert [(p, t) for p, t, _ in problems] == [(f"layers.{i}.ffn", "ffn/moe") for i in (1, 2, 3)]
    assert all("which each cp rank would take over its slice only" in why for _, _, why in problems)


def test_mixer_layout_table_comes_from_the_declarations():
    rows = {(r["kind"], r["type"]): r for r in mp.mixer_layouts()}
    assert rows[("attention", "gqa")]["cp"] == "allgather_kv" and rows[("attention", "mla")]["cp"] == "allgather_kv"
    assert rows[("mixer", "mamba2")]["cp"] == "no" and rows[("mixer", "gated_deltanet")]["cp"] == "no"
    assert rows[("attention", "gqa")]["tp"] == "yes" and rows[("mixer", "mamba2")]["tp"] == "replicated"


def test_scaling_out_guide_holds_the_generated_mixer_table():
    text = (REPO / "docs" / "guides" / "scaling-out.md").read_text()
    table = mp.context.mixer_layout_table()
    assert table in text, "regenerate the table with modkit.parallel.context.mixer_layout_table()"


def _torchrun(script: str, nproc: int, out: Path, *args: str) -> dict[int, dict]:
    env = {**os.environ, "MODKIT_DIST_OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*cmd, str(SCRIPTS / script), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_TIMEOUT
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        pytest.fail(f"{script} on {nproc} ranks failed (rc {proc.returncode}):\n{tail}")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


def _equal_runs(ranks: dict[int, dict], key: str) -> list[str]:
    """Every case on every rank: the per-step loss and gradient norm equal the reference's to ``TOL``."""
    cases = set()
    for rank, out in ranks.items():
        for name, case in out.items():
            if not isinstance(case, dict):
                continue
            assert "error" not in case, f"{name} on rank {rank}: {case['error']}"
            assert len(case[key]) == len(case["ref"]) > 1
            for step, (got, ref) in enumerate(zip(case[key], case["ref"])):
                for field in ("loss", "grad_norm"):
                    assert abs(got[field] - ref[field]) <= TOL, (name, rank, step, field, got, ref)
            cases.add(name)
    return sorted(cases)


@pytest.mark.slow
@needs_gloo
def test_pipeline_schedules_train_as_one_process(tmp_path):
    ranks = _torchrun("pipeline.py", 2, tmp_path, "schedules")
    cases = _equal_runs(ranks, "pp")
    assert set(mp.SCHEDULES) | {"1f1b-cut-1-3", "moe-1f1b", "moe-interleaved_1f1b", "moe-zbv_zero_bubble"} == set(cases)


@pytest.mark.slow
@needs_gloo
def test_pipeline_by_tensor_parallel_on_four_ranks_trains_as_one_process(tmp_path):
    assert _equal_runs(_torchrun("pipeline.py", 4, tmp_path, "tp"), "pp") == ["tp2-1f1b"]


@pytest.mark.slow
@needs_gloo
def test_context_parallel_attention_trains_as_one_process_and_the_hybrid_is_refused(tmp_path):
    ranks = _torchrun("context_parallel.py", 2, tmp_path)
    assert _equal_runs(ranks, "cp") == ["tiny-llama", "tiny-mla", "window-documents"]
    refusal = ranks[0]["hybrid_refusal"]
    assert refusal.startswith("context parallelism (cp = 2) cannot shard the sequence of 3 component(s)")
    assert "layers.0.attention (mixer/gated_deltanet)" in refusal and "Train this model without --cp" in refusal


@pytest.mark.slow
@needs_gloo
def test_modkit_train_with_cp_logs_the_losses_of_one_process(tmp_path):
    """``torchrun ... modkit train --cp 2`` (tiny-mla, document masks): the per-step loss, gradient norm and the
    evaluations equal one process's to 2e-5 (losses add in another order)."""
    from modkit.data import default_corpus, prepare
    from modkit.train.plot import read_metrics

    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], tmp_path / "data", tokenizer="char", show_progress=False)
    spec = json.loads((SPECS / "tiny-mla.json").read_text())
    config = {
        **{"model": {**spec, "n_layers": 2}, "data": str(tmp_path / "data"), "batch_size": 2, "seq_len": 32},
        **{"max_steps": 4, "decay_steps": 4, "warmup_steps": 1, "eval_interval": 2, "eval_batches": 1},
        **{"log_interval": 1, "sample_tokens": 0, "device": "cpu", "threads": 1, "seed": 3, "document_mask": True},
    }
    (tmp_path / "train.json").write_text(json.dumps(config))
    runs = {}
    for n, extra in ((1, []), (2, ["--cp", "2"])):
        launch = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"] if n > 1 else []
        out = tmp_path / f"run{n}"
        cmd = [sys.executable, *launch, "-m", "modkit", "train", "-c", str(tmp_path / "train.json"), "-o", str(out)]
        done = subprocess.run(
            [*cmd, *extra, "--no-progress"],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=HANG_TIMEOUT,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        runs[n] = [
            (r["kind"], r["step"], r.get("loss", r.get("val_loss")), r.get("grad_norm"))
            for r in read_metrics(out / "metrics.jsonl")
        ]
    assert [r[:2] for r in runs[1]] == [r[:2] for r in runs[2]] and len(runs[1]) >= 6
    for a, b in zip(runs[1], runs[2]):
        for x, y in zip(a[2:], b[2:]):
            assert (x is None and y is None) or abs(x - y) <= 2e-5, (a, b)
