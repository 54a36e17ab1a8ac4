"""Expert parallelism: plans from the components' ``ep_plan`` declarations, refusals that name the layer, and (slow)
EP 2 and EP 2 x FSDP 2 on gloo CPU processes against one process, with a checkpoint resumed at one process."""

from __future__ import annotations

import json
import sys
from typing import Literal

import pytest
import torch

import modkit
from modkit import Component
from modkit.parallel import ParallelError
from modkit.parallel.expert import expert_plan
from modkit.parallel.mesh import check_ep
from modkit.parallel.planner import Layout, Planner

from modkit_plugins.moe import MoE, MoEConfig
from tests.conftest import SPECS, registry_with
from tests.parallel.test_parallel import SCRIPTS, TOL, _show, _torchrun, needs_gloo


def _spec(**ffn) -> dict:
    s = json.loads((SPECS / "tiny-deepseek-moe.json").read_text())
    s["block"]["ffn"].update(ffn)
    return s


def test_experts_of_every_moe_layer_are_planned_from_the_capability():
    plan = expert_plan(modkit.build(_spec(), device="meta"), 2)
    assert plan.experts == {f"layers.{i}.ffn.experts": f"layers.{i}.ffn" for i in (1, 2, 3)}  # layer 0 is dense
    assert plan.describe()[0] == "layers.1.ffn.experts: experts / 2 (from ffn/moe)"
    assert expert_plan(modkit.build(_spec(), device="meta"), 1).experts == {}


def test_an_ep_that_does_not_divide_the_experts_is_refused_naming_the_layer():
    with pytest.raises(ParallelError) as exc:
        expert_plan(modkit.build(_spec(), device="meta"), 3)
    assert str(exc.value).startswith("layers.1.ffn: ffn/moe (plugin builtin-moe")
    assert "cannot be split over ep = 3 ranks" in str(exc.value)
    assert "n_experts = 8 is not divisible by ep = 3" in str(exc.value)


def test_capacity_dispatch_is_refused_under_ep():
    with pytest.raises(ParallelError, match=r"layers\.1\.ffn: .*capacity_factor = 1\.25: fixed-capacity dispatch"):
        expert_plan(modkit.build(_spec(capacity_factor=1.25), device="meta"), 2)


def test_a_dense_model_has_nothing_to_split():
    with pytest.raises(ParallelError, match="no layer of this model declares experts to split"):
        expert_plan(modkit.build(SPECS / "tiny-llama.json", device="meta"), 2)


class _NoEPConfig(MoEConfig):
    type: Literal["moe_no_ep"] = "moe_no_ep"


def test_a_mixture_without_an_ep_plan_is_refused_by_name():
    reg = registry_with(
        "third-party-moe",
        Component(
            kind="ffn",
            type="moe_no_ep",
            config=_NoEPConfig,
            factory=lambda cfg, ctx: MoE(cfg, ctx),
            description="an MoE that says nothing about expert parallelism",
            capabilities={"aux_loss": True},
        ),
    )
    spec = _spec()
    spec["block"]["ffn"]["type"] = "moe_no_ep"
    with pytest.raises(ParallelError) as exc:
        expert_plan(modkit.build(spec, device="meta", registry=reg), 2, registry=reg)
    assert str(exc.value).startswith("layers.1.ffn: ffn/moe_no_ep (plugin third-party-moe")
    assert "declares no ep_plan capability, so its experts cannot be split over ep = 2 ranks" in str(exc.value)


def test_mesh_degrees_are_checked_before_any_collective():
    check_ep(2, 4, 1)
    with pytest.raises(ParallelError, match="ep = 3 does not divide the data-parallel degree dp = 4"):
        check_ep(3, 4, 1)
    with pytest.raises(ParallelError, match="expert-tensor parallelism\\) is not implemented"):
        check_ep(2, 2, 2)


@pytest.mark.slow
@needs_gloo
@pytest.mark.parametrize("nproc", [2, 4])
def test_ep_training_equals_one_process_step_by_step(tmp_path, nproc):
    """EP 2 (2 ranks) and EP 2 x FSDP 2 (4 ranks): 20 steps of the tiny DeepSeek-style MoE (sequence-wise balance
    loss, correction bias moved each step) and 5 with the batch-wise balance loss and z-loss (global statistics):
    per-step loss and gradient norm equal the single process's on the whole batch, and so do the biases."""
    ranks = _torchrun("expert_parallel.py", nproc, tmp_path)
    for r, res in ranks.items():
        for variant in ("shipped", "batch"):
            got = res[variant]
            assert got["steps"] == (20 if variant == "shipped" else 5)
            assert got["loss_max_abs_diff"] < TOL and got["grad_norm_max_rel_diff"] < TOL, (r, variant, got)
            assert got["bias_equal"], (r, variant)
            assert got["local_experts"] == 8 // nproc  # 8 experts over ep = 2, then over FSDP 2 at 4 ranks
            assert abs(got["first_last_loss"][1] - got["first_last_loss"][0]) > 1e-3  # the steps moved the weights
    _show(f"expert parallel on {nproc} ranks (rank 0)", ranks[0])
    _planner_bytes_equal_the_run(ranks[0], nproc)
    if nproc == 2:
        _resume_at_one_process(tmp_path / "ckpt")


def _script():
    """The dist script as a module (its spec, batches and training loop)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import expert_parallel
    finally:
        sys.path.remove(str(SCRIPTS))
    return expert_parallel


def _planner_bytes_equal_the_run(rank0: dict, nproc: int) -> None:
    """``modkit plan``'s parameter, gradient and AdamW bytes of rank 0 equal what rank 0 of the real run holds:
    EP 2 (x FSDP 2 at 4 ranks) and FSDP2 alone over every rank (float32: 4 bytes an element)."""
    script = _script()
    planner = Planner(script.spec(), batch=script.BATCH, seq_len=script.SEQ)
    for layout, got in (
        (Layout(dp=nproc, ep=2), rank0["shipped"]["allocated"]),
        (Layout(dp=nproc), rank0["fsdp_allocated"]),
    ):
        plan = {k: 4 * v for k, v in planner.rank_elements(layout).items()}
        assert plan == {k: 4 * v for k, v in got.items()}, (layout, plan, got)


def _resume_at_one_process(ckpt) -> None:
    """The EP 2 run's DCP checkpoint (model and AdamW state) loads at one process: its weights equal the reference's
    after 20 steps and the next step's loss equals the reference's next loss."""
    script = _script()
    STEPS, batches, train = script.STEPS, script.batches, script.train
    from modkit import parallel as mp

    ref = json.loads((ckpt / "reference.json").read_text())
    model = modkit.build(ref["spec"], seed=1)  # another seed: every value must come from the checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mp.load_sharded(ckpt / "dcp", model, opt)
    state = torch.load(ckpt / "reference.pt")["model"]
    assert set(model.state_dict()) == set(state)
    assert max(float((v - state[k]).abs().max()) for k, v in model.state_dict().items()) < TOL
    losses, _ = train(model, batches()[STEPS:], slice(None), None, opt, 1)
    assert abs(losses[0] - ref["next_loss"]) < TOL, (losses[0], ref["next_loss"])
