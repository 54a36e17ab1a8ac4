"""Expert parallelism composed with pipeline parallelism: EP 2 x PP 2 on four gloo CPU ranks trains the tiny
DeepSeek-style MoE as one process does (``tests/dist_scripts/expert_pipeline.py``), and its DCP checkpoints move
between that layout and one process both ways; the layouts EP still refuses say why."""

from __future__ import annotations

import sys

import pytest
import torch

import modkit
from modkit import parallel as mp
from modkit.parallel import ParallelError
from modkit.parallel.mesh import check_ep
from modkit.parallel.planner import Layout, Planner

from tests.parallel.test_parallel import SCRIPTS, TOL, _show, _torchrun, needs_gloo


def _script():
    """The dist script as a module (its spec, batches and reference step)."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        import expert_pipeline
    finally:
        sys.path.remove(str(SCRIPTS))
    return expert_pipeline


def test_ep_with_pipeline_stages_is_accepted_and_tp_or_cp_are_refused_with_the_reason():
    check_ep(2, 2, 1, pp=2)
    with pytest.raises(ParallelError) as exc:
        check_ep(2, 2, 2, pp=2)
    assert "ep = 2 with tp = 2: expert parallelism together with tensor parallelism" in str(exc.value)
    assert "tensor parallelism already slices every expert's hidden width" in str(exc.value)
    with pytest.raises(ParallelError, match="ep = 2 with cp = 2: .* per-sequence statistics would be split"):
        check_ep(2, 2, 1, cp=2)


def test_a_stage_of_dense_layers_has_an_empty_expert_plan_but_a_dense_model_is_refused():
    """Under pipeline stages a stage may hold only dense layers (layer 0 of tiny-deepseek-moe); the model as a
    whole must still have experts to split."""
    model = modkit.build(_script().spec(), device="meta")
    dense = mp.StageModule(model, range(0, 1), first=True, last=False)
    assert mp.expert_plan(dense, 2, allow_empty=True).experts == {}
    with pytest.raises(ParallelError, match="no layer of this model declares experts to split"):
        mp.expert_plan(dense, 2)


def test_split_backward_schedules_are_refused_with_fsdp_and_taken_without():
    """Zero-bubble and DualPipeV gave gradients 0.93 apart from one process with FSDP2-sharded stages (pp 2 x dp 2);
    with one data-parallel rank (pp alone, pp x tp) they train as one process, and every other schedule takes dp."""
    for schedule in mp.pipeline.SPLIT_BACKWARD:
        mp.pipeline.check_schedule(schedule, 1)
        with pytest.raises(ParallelError) as exc:
            mp.pipeline.check_schedule(schedule, 2)
        assert str(exc.value).startswith(f"pipeline schedule {schedule!r} splits each backward")
        assert "FSDP2-sharded over 2 data-parallel ranks" in str(exc.value) and "use gpipe, 1f1b" in str(exc.value)
    for schedule in set(mp.SCHEDULES) - set(mp.pipeline.SPLIT_BACKWARD):
        mp.pipeline.check_schedule(schedule, 4)


def _one_process_checkpoint(script, path) -> None:
    """The reference after ``SAVE_AT`` steps, saved as DCP without a process group (optimizer flattened)."""
    model = modkit.build(script.spec(), seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for ids in script.batches()[: script.SAVE_AT]:
        script.reference_step(model, opt, ids)
    mp.save_sharded(path, model, opt, flatten_optimizer=True)


def _resume_at_one_process(script, path) -> list[dict]:
    """The EP 2 x PP 2 checkpoint of step ``SAVE_AT`` loaded at one process (another seed's model), then trained on."""
    model = modkit.build(script.spec(), seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    mp.load_sharded(path, model, opt, flatten_optimizer=True)
    data = script.batches()[script.SAVE_AT : script.SAVE_AT + script.RESUMED]
    return [script.reference_step(model, opt, ids) for ids in data]


def _max_diffs(got: list[dict], ref: list[dict]) -> dict[str, float]:
    assert len(got) == len(ref) > 0
    return {f: max(abs(a[f] - b[f]) for a, b in zip(got, ref)) for f in ("loss", "grad_norm")}


@pytest.mark.slow
@needs_gloo
def test_ep2_by_pp2_trains_as_one_process_and_resumes_across_layouts(tmp_path):
    """20 steps (sequence-wise balance loss, correction bias moved each step) and 5 with the batch-wise balance loss
    and z-loss (global statistics over each global microbatch): per-step loss and gradient norm equal one process's
    to 1e-5 and the biases are equal; a checkpoint of step 3 resumes at one process and one of one process resumes
    at EP 2 x PP 2, each logging the uninterrupted run's next losses."""
    script = _script()
    _one_process_checkpoint(script, tmp_path / "one" / "dcp")
    ranks = _torchrun("expert_pipeline.py", 4, tmp_path)
    measured = {}
    for r, res in ranks.items():
        assert res["mesh"] == ["pp", "dp_mod_ep", "ep", "tp"]
        stage_layer = 1 if r < 2 else 2  # stage 0 (ranks 0, 1): layers 0-1; stage 1 (ranks 2, 3): layer 2
        for variant, steps in (("shipped", script.STEPS), ("batch", script.BATCH_STEPS)):
            got = res[variant]
            assert len(got["pp"]) == steps
            diffs = _max_diffs(got["pp"], got["ref"])
            assert diffs["loss"] <= TOL and diffs["grad_norm"] <= TOL, (r, variant, diffs)
            assert got["bias_max_abs_diff"] == 0.0, (r, variant)
            assert got["biases"] == [f"layers.{stage_layer}.ffn.router.correction_bias"]
            assert got["local_experts"] == {f"layers.{stage_layer}.ffn.experts.gate": 4}  # 8 experts over ep = 2
            measured[f"{variant} rank {r}"] = diffs
        after = res["shipped"]["ref"][script.SAVE_AT : script.SAVE_AT + script.RESUMED]
        measured[f"one process -> EP 2 x PP 2, rank {r}"] = resumed = _max_diffs(res["shipped"]["resumed"], after)
        assert resumed["loss"] <= TOL and resumed["grad_norm"] <= TOL, (r, resumed)
    ref = ranks[0]["shipped"]["ref"]
    assert abs(ref[-1]["loss"] - ref[0]["loss"]) > 1e-3  # the steps moved the weights
    back = _max_diffs(_resume_at_one_process(script, tmp_path / "ckpt" / "dcp"), after)
    measured["EP 2 x PP 2 -> one process"] = back
    assert back["loss"] <= TOL and back["grad_norm"] <= TOL, back
    _show("EP 2 x PP 2: max |diff| against one process", measured)
    _planner_bytes_equal_the_run(script, ranks)


def _planner_bytes_equal_the_run(script, ranks: dict) -> None:
    """``modkit plan``'s parameter, gradient and AdamW bytes of the first rank of each stage (ranks 0 and 2) equal
    what that rank of the EP 2 x PP 2 run holds (float32: 4 bytes an element)."""
    planner = Planner(script.spec(), batch=script.BATCH, seq_len=script.SEQ)
    layout = Layout(dp=2, ep=2, pp=2, microbatches=script.MICRO)
    for stage, rank in ((0, 0), (1, 2)):
        plan = {k: 4 * v for k, v in planner.rank_elements(layout, stage).items()}
        got = {k: 4 * v for k, v in ranks[rank]["shipped"]["allocated"].items()}
        assert plan == got, (stage, plan, got)
