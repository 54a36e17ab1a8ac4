"""``modkit plan``: exact bytes per rank from the layout arithmetic, the enumeration, the CLI's output and errors.
(The equality with what real runs of every layout allocate is in ``test_planner_bytes.py`` and
``test_expert_parallel.py``, on gloo processes; the activation estimate in ``test_planner_activations.py``.)"""

from __future__ import annotations

import json
import math

import pytest

import modkit
from modkit import cli
from modkit.parallel.planner import Cluster, Layout, Planner, launch_command, stage_layers

from tests.conftest import SPECS


@pytest.fixture(scope="module")
def llama() -> Planner:
    return Planner(SPECS / "tiny-llama.json", batch=8, seq_len=64)


def _fsdp_rank0(model, n: int) -> int:
    """FSDP2's rank-0 shard: ``ceil(rows / n)`` rows of every parameter."""
    return sum(-(-p.shape[0] // n) * math.prod(p.shape[1:]) for p in model.parameters())


def test_fsdp_bytes_are_fsdp2s_chunks_of_every_parameter(llama):
    model = modkit.build(SPECS / "tiny-llama.json", device="meta")
    for dp in (1, 2, 4, 8):
        got = llama.rank_elements(Layout(dp=dp))
        assert got == {
            "params": _fsdp_rank0(model, dp),
            "grads": _fsdp_rank0(model, dp),
            "optimizer": 2 * _fsdp_rank0(model, dp),
        }


def test_zero1_shards_only_the_optimizer_state(llama):
    total = sum(p.numel() for p in modkit.build(SPECS / "tiny-llama.json", device="meta").parameters())
    got = llama.rank_elements(Layout(dp=4, zero=1))
    assert got["params"] == got["grads"] == total and got["optimizer"] < 2 * total // 4 + 200


def test_pipeline_stages_split_layers_and_hold_embedding_and_head_at_the_ends(llama):
    assert [list(r) for r in stage_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    whole = llama.rank_elements(Layout(dp=1))["params"]
    stages = [llama.rank_elements(Layout(dp=1, pp=2, microbatches=2), s)["params"] for s in range(2)]
    assert sum(stages) == whole


def test_tensor_parallel_halves_the_sharded_weights(llama):
    model = modkit.build(SPECS / "tiny-llama.json", device="meta")
    replicated = sum(p.numel() for n, p in model.named_parameters() if n.endswith("norm.weight") or "norm" in n)
    total = sum(p.numel() for p in model.parameters())
    assert llama.rank_elements(Layout(dp=1, tp=2))["params"] == (total - replicated) // 2 + replicated


def test_expert_split_needs_experts_and_divides_them():
    moe = Planner(SPECS / "tiny-deepseek-moe.json", batch=8, seq_len=64)
    assert moe.ep_ok(2) and moe.ep_ok(8) and not moe.ep_ok(3)
    fsdp, ep = moe.rank_elements(Layout(dp=2)), moe.rank_elements(Layout(dp=2, ep=2))
    assert fsdp == ep  # 2 ranks: FSDP halves the experts' rows, EP halves the experts: the same count
    lays = moe.layouts(Cluster(gpus=4, gpu_memory=80e9))
    assert {lay.ep for lay in lays} == {1, 2, 4}
    assert not Planner(SPECS / "tiny-llama.json", batch=8, seq_len=64).ep_ok(2)


def test_layouts_are_ranked_and_the_best_gets_a_launch_command(llama):
    rows = llama.plan(Cluster(gpus=4, gpu_memory=1e9))
    assert all(r.fits for r in rows[: sum(r.fits for r in rows)])
    times = [r.step_time for r in rows if r.fits]
    assert times == sorted(times)
    for r in rows:
        lay = r.layout
        assert lay.dp * lay.tp * lay.pp * lay.cp == 4 and 8 % lay.dp == 0
    cmd = launch_command(Layout(dp=2, tp=2), "specs/x.json", Cluster(gpus=4, gpu_memory=1e9))
    assert cmd == "torchrun --nnodes 1 --nproc-per-node 4 -m modkit train --model specs/x.json --tp 2"
    cmd = launch_command(Layout(dp=1, tp=2, pp=2, microbatches=4), "specs/x.json", Cluster(gpus=4, gpu_memory=1e9))
    assert cmd == (
        "torchrun --nnodes 1 --nproc-per-node 4 -m modkit train --model specs/x.json --pp 2 --tp 2 --pp-microbatches 4"
    )
    cmd = launch_command(Layout(dp=1, cp=2, pp=2, microbatches=2), "specs/x.json", Cluster(gpus=4, gpu_memory=1e9))
    assert cmd.endswith("--pp 2 --cp 2 --pp-microbatches 2   # needs pp with cp: not yet a modkit train flag")


def test_cli_plan_prints_the_fitting_layouts_and_json(capsys):
    code = cli.main(["plan", str(SPECS / "tiny-llama.json"), "--gpus", "2", "--gpu-memory", "1GB", "--top", "3"])
    out = capsys.readouterr().out
    assert code == 0
    assert "layouts of 2 GPUs x 953.67 MiB, batch 2 x 512 tokens, MFU 0.4;" in out
    assert "  activations: bfloat16 saved bytes, within 5% at tp = cp = 1" in out
    assert len([line for line in out.splitlines() if line.startswith("  dp")]) == 3
    assert "best: torchrun --nnodes 1 --nproc-per-node 2 -m modkit train" in out
    code = cli.main(["plan", str(SPECS / "tiny-llama.json"), "--gpus", "2", "--gpu-memory", "1GiB", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert data["precision"] == "bfloat16" and data["activation_error"] == 0.05
    names = {r["name"] for r in data["rows"]}
    assert {"dp2 m1", "dp2(zero1) m1", "dp1 x tp2 m1", "dp1 x pp2 m2"} <= names


def test_cli_plan_refuses_a_bad_size(capsys):
    code = cli.main(["plan", str(SPECS / "tiny-llama.json"), "--gpus", "2", "--gpu-memory", "eighty"])
    err = capsys.readouterr().err
    assert code == 1 and "--gpu-memory 'eighty' is not a size; write e.g. 80GB" in err


def test_context_parallelism_is_planned_only_where_every_component_declares_it():
    """A mixture of experts (its balance statistics are over whole sequences) and a recurrent mixer are refused by
    their declarations, so their plans hold no ``cp > 1`` layout; attention-only dense specs get them."""
    cluster = Cluster(gpus=4, gpu_memory=80e9)
    for name, ok in (("tiny-llama", True), ("tiny-deepseek-moe", False), ("tiny-hybrid", False)):
        planner = Planner(SPECS / f"{name}.json", batch=8, seq_len=64)
        assert planner.cp_ok() is ok
        assert any(lay.cp > 1 for lay in planner.layouts(cluster)) is ok, name
