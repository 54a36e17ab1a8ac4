"""``modkit plan``'s activation estimate: the fake-tensor measurement equals a real CPU step part by part, and the
estimate stays within the stated bound (:data:`~modkit.parallel.planner.ACTIVATION_ERROR`) of what real steps
save, with and without activation checkpointing (bytes are deterministic). The full comparison over more specs
and sizes is ``benchmarks/bench_plan_activations.py``."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit.analysis.step_activations import StepParts, fake_model, measure_step, peak_bytes
from modkit.parallel.planner import ACTIVATION_ERROR, Layout, Planner

from tests.conftest import SPECS


def _ids(vocab: int, batch: int, seq: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def _measured(model, ids, precision: str, checkpointing: bool) -> int:
    """The real step's activation peak: the plain run's saved bytes; with checkpointing, what the checkpointed run
    saved outside the blocks and what ``torch.utils.checkpoint`` saved of each block (its inputs), each block's
    recomputation taking its plain saved bytes."""
    layers = range(len(model.layers))
    plain = measure_step(model, ids, precision=precision)
    if not checkpointing:
        return peak_bytes(plain, layers, first=True, last=True, checkpointing=False)
    run = measure_step(model, ids, precision=precision, checkpointing=True)
    kept = {i: run.saved.get(i, 0) for i in layers}
    outside = {k: v for k, v in run.saved.items() if not isinstance(k, int)}
    parts = StepParts({**outside, **{i: plain.saved[i] for i in layers}}, kept)
    return peak_bytes(parts, layers, first=True, last=True, checkpointing=True)


@pytest.mark.parametrize("name", ["tiny-llama", pytest.param("tiny-deepseek-moe", marks=pytest.mark.slow)])
def test_fake_tensors_save_what_a_real_step_saves_part_by_part(name):
    model = modkit.build(SPECS / f"{name}.json", seed=0).train()
    real = measure_step(model, _ids(model.spec.vocab_size, 2, 48), precision="bfloat16")
    with fake_model(SPECS / f"{name}.json") as (fake, mode), mode:
        got = measure_step(fake, torch.zeros(2, 48, dtype=torch.long), precision="bfloat16")
    assert got.saved == real.saved and got.kept == real.kept
    assert set(real.saved) == {"first", "last", *range(len(model.layers))}


@pytest.mark.parametrize("name", ["tiny-llama", pytest.param("tiny-hybrid", marks=pytest.mark.slow)])
def test_activation_estimate_is_within_the_stated_bound(name):
    """One process, bfloat16 autocast, 3 rows (the estimator runs 1 and 2) of 80 tokens (not a whole number of the
    hybrid's 64-token chunks)."""
    model = modkit.build(SPECS / f"{name}.json", seed=0).train()
    ids = _ids(model.spec.vocab_size, 3, 80)
    planner = Planner(SPECS / f"{name}.json", batch=3, seq_len=80, attention_matrix=True)
    for ckpt in (False, True):
        real = _measured(model, ids, "bfloat16", ckpt)
        est = planner.activations(Layout(dp=1, checkpointing=ckpt))
        assert abs(est - real) <= ACTIVATION_ERROR * real, (ckpt, est, real)
    plain, ckpt = (planner.activations(Layout(dp=1, checkpointing=c)) for c in (False, True))
    assert ckpt < plain / 2  # recomputation keeps the blocks' inputs, not their insides


def test_pipeline_stages_hold_their_own_parts_and_the_microbatches_in_flight():
    """Under 1F1B the first stage holds the embedding and ``pp`` microbatches, the last the head and one."""
    from modkit.analysis.step_activations import held_bytes

    planner = Planner(SPECS / "tiny-llama.json", batch=8, seq_len=64)
    layout = Layout(dp=1, pp=2, microbatches=4)
    parts = planner.activation_parts(layout)
    first, last = range(0, 2), range(2, 4)
    assert parts.saved["first"] > 0 and parts.saved["last"] > 0
    stage0 = held_bytes(parts, first, first=True, last=False, checkpointing=False)
    assert planner.activations(layout, 0) == 2 * stage0
    assert planner.activations(layout, 1) == held_bytes(parts, last, first=False, last=True, checkpointing=False)


def test_fused_attention_leaves_out_exactly_the_square_matrices():
    """By default the planner counts no ``[T, T]`` matrix (fused kernels): tiny-llama's CPU attention keeps none, so
    both figures agree; tiny-mla's (value width 32 against key width 40: the CPU's math kernel) keeps its float32
    probabilities, 4 heads x 4 bytes x T² per row in each of its 4 layers."""
    layout = Layout(dp=1)
    fused, kept = (Planner(SPECS / "tiny-llama.json", batch=2, seq_len=128, attention_matrix=m) for m in (0, 1))
    assert fused.activations(layout) == kept.activations(layout)
    fused, kept = (Planner(SPECS / "tiny-mla.json", batch=2, seq_len=128, attention_matrix=m) for m in (0, 1))
    assert kept.activations(layout) - fused.activations(layout) == 4 * 2 * (4 * 4) * 128 * 128
