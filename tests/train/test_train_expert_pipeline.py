"""A mixture of experts trained by ``modkit train`` through pipeline stages, with its experts split over expert-
parallel ranks (``torchrun --nproc-per-node 4 ... --ep 2 --pp 2``, gloo on the CPU): the per-step losses, gradient
norms, routers' load imbalance and loss estimates of one process with the same batch (the sequence-wise balance
loss summed in on the stages that compute it, the correction bias moved from every stage's loads), and its DCP
checkpoint resumed on one process logs what the one-process run logged."""

from __future__ import annotations

import json
import shutil

import pytest

from modkit.data import default_corpus, prepare
from modkit.train.state import point

from conftest import REPO
from tests.train.test_train_pipeline import CONFIG, TOL, _run, _values


def _moe_spec() -> dict:
    """``tiny-deepseek-moe`` made smaller: d_model 64, 3 layers (layer 0 dense; stages 0-1 and 2), experts of width
    32, a bias update fast enough to show."""
    s = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    s.update(n_layers=3, d_model=64)
    s["overrides"][0]["ffn"]["d_ff"] = 128
    ffn = s["block"]["ffn"]
    ffn["expert"]["d_ff"] = ffn["shared"]["d_ff"] = 32
    ffn["router"]["bias_update_speed"] = 0.01
    ffn["aux_loss_coef"] = 0.01  # large enough that a dropped or double-counted aux loss would show
    return s


def _imbalance(run) -> list[tuple[int, float]]:
    from modkit.train.plot import read_metrics

    return [(r["step"], r["load_imbalance"]) for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]


def _worst(a: list, b: list) -> float:
    assert [x[:2] for x in a] == [x[:2] for x in b] and a
    return max(abs(x[-1] - y[-1]) for x, y in zip(a, b))


@pytest.mark.slow
def test_moe_under_ep2_by_pp2_matches_one_process_and_resumes_on_one(tmp_path):
    text = tmp_path / "head.txt"
    text.write_text(default_corpus().read_text()[:20_000])
    prepare([text], tmp_path / "data", tokenizer="char", show_progress=False)
    config = {**CONFIG, "model": _moe_spec(), "data": str(tmp_path / "data")}
    (tmp_path / "train.json").write_text(json.dumps(config))
    conf = ("-c", str(tmp_path / "train.json"))
    one, par = tmp_path / "one", tmp_path / "ep2pp2"
    _run(tmp_path, 1, *conf, "-o", str(one))
    _run(tmp_path, 4, *conf, "-o", str(par), "--ep", "2", "--pp", "2", "--pp-microbatches", "2")
    reference = _values(one)
    assert len(reference) == 4 * 2 + 3 * 2 + 1  # 4 steps, evals at 0, 2, 4, the final loss
    measured = {"loss and estimates": _worst(_values(par), reference)}
    measured["load_imbalance"] = _worst(_imbalance(par), _imbalance(one))
    # the EP 2 x PP 2 checkpoint of step 2 resumed on one process: steps 3 and 4 as the one-process run logged them
    cut = tmp_path / "cut"
    shutil.copytree(par, cut, symlinks=True)
    shutil.rmtree(cut / "checkpoints" / "step-0000004")
    point(cut / "last", cut / "checkpoints" / "step-0000002")
    _run(tmp_path, 1, "--resume", str(cut), "--pp", "1", "--ep", "1")
    measured["resumed on one process"] = _worst(_values(cut), reference)
    print(f"\n== modkit train --ep 2 --pp 2 against one process: max |diff| {measured}")
    assert all(v <= TOL for v in measured.values()), measured
