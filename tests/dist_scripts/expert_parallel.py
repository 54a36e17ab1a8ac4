"""Expert parallelism against one process (``torchrun --nproc_per_node 2`` or ``4``, gloo on CPU).

2 ranks: EP 2 (experts split in two, the dense parts FSDP2 over both ranks); 4 ranks: EP 2 x FSDP 2 (the experts of
each ep group FSDP2-sharded again over the two groups). Each rank trains on its quarter/half of a fixed batch for
``STEPS`` AdamW steps with gradient clipping and DeepSeek-V3's bias update; the single-process model trains on
the whole batch beside it. Per step: the loss (the mean over ranks) and the gradient norm, for two variants of the
tiny DeepSeek-style spec: as shipped (sequence-wise balance loss, correction bias) and with the batch-wise balance
loss and the z-loss (global statistics). Then a DCP checkpoint of the EP run (model and optimizer) with the
reference's state and its next loss, for the test to resume at one process; and the bytes each rank holds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import finish, loss_fn, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402
from modkit.nn import balance as nb  # noqa: E402
from modkit.train.balance import ExpertBalance  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
STEPS = 20  # the shipped variant; the batch variant runs BATCH_STEPS
BATCH_STEPS = 5
BATCH, SEQ = 4, 16


def spec(variant: str = "shipped") -> dict:
    """``tiny-deepseek-moe`` made smaller: d_model 64, 2 layers (the first dense), vocabulary 256, experts of width
    32, a faster bias update; ``variant`` "batch": batch-wise balance loss (0.01) and z-loss (0.001)."""
    s = json.loads((REPO / "specs" / "tiny-deepseek-moe.json").read_text())
    s.update(max_seq_len=SEQ, vocab_size=256, n_layers=2, d_model=64)
    s["overrides"][0]["ffn"]["d_ff"] = 128
    ffn = s["block"]["ffn"]
    ffn["expert"]["d_ff"] = ffn["shared"]["d_ff"] = 32
    ffn["router"]["bias_update_speed"] = 0.01
    if variant == "batch":
        ffn.update(aux_loss_scope="batch", aux_loss_coef=0.01, z_loss_coef=0.001)
    return s


def batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (BATCH, SEQ), generator=g) for _ in range(STEPS + 1)]


def train(model, ids_steps, rows, group, optim, steps) -> tuple[list[float], list[float]]:
    """``steps`` steps on ``rows`` of each batch; per step (loss mean over ranks, gradient norm). ``group`` None:
    the single-process reference (torch's own clipping, no collective)."""
    bal = ExpertBalance(model, group) if group is not None else _LocalBalance(model)
    losses, norms = [], []
    for ids in ids_steps[:steps]:
        ids = ids[rows]
        bal.begin_step()
        optim.zero_grad(set_to_none=True)
        out = model(ids)
        loss = loss_fn(out.logits, ids, out.aux_loss)
        loss.backward()
        clip = mp.clip_grad_norm_ if group is not None else torch.nn.utils.clip_grad_norm_
        norms.append(float(clip(model.parameters(), 1.0)))
        optim.step()
        bal.end_step()
        losses.append(float(mp.mean_across_ranks(loss.detach()) if group is not None else loss))
    return losses, norms


class _LocalBalance:
    """The reference's bias update on its own loads (ExpertBalance would sum them over the default group)."""

    def __init__(self, model):
        self.model = model

    def begin_step(self) -> None:
        nb.reset_loads(self.model)

    def end_step(self) -> None:
        nb.update_balance(self.model, nb.read_loads(self.model))


def allocated(model, optim) -> dict[str, int]:
    """Elements this rank stores: parameters, gradients and AdamW state (its local shards)."""

    def n(t):
        return (t.to_local() if hasattr(t, "to_local") else t).numel()

    params = [p for p in model.parameters()]
    state = sum(n(v) for s in optim.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))
    return {
        "params": sum(n(p) for p in params),
        "grads": sum(n(p.grad) for p in params if p.grad is not None),
        "optimizer": state,
    }


def run_variant(variant: str, rank: int, world: int, ep: int) -> dict:
    data = batches()
    steps = STEPS if variant == "shipped" else BATCH_STEPS
    ref = modkit.build(spec(variant), seed=0)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    ref_losses, ref_norms = train(ref, data, slice(None), None, ref_opt, steps)
    mesh = mp.make_mesh(tp=1, ep=ep)
    model = mp.build_parallel(spec(variant), mesh, seed=0, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    dp, dp_rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    per = BATCH // dp
    losses, norms = train(model, data, slice(dp_rank * per, (dp_rank + 1) * per), mesh["dp"].get_group(), opt, steps)
    out = {
        "loss_max_abs_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
        "grad_norm_max_abs_diff": max(abs(a - b) for a, b in zip(norms, ref_norms)),
        "grad_norm_max_rel_diff": max(abs(a - b) / b for a, b in zip(norms, ref_norms)),
        "grad_norms": [min(ref_norms), max(ref_norms)],
        "steps": steps,
        "first_last_loss": [losses[0], losses[-1]],
        "local_experts": int(model.layers[1].ffn.experts.gate.to_local().shape[0]),
        "allocated": allocated(model, opt),
        "bias_equal": all(
            torch.equal(b, dict(ref.named_buffers())[n]) for n, b in model.named_buffers() if "correction_bias" in n
        ),
    }
    if variant == "shipped" and world == 2:
        ckpt = Path(os.environ["MODKIT_DIST_OUT"]) / "ckpt"
        mp.save_sharded(ckpt / "dcp", model, opt)
        if rank == 0:  # the reference's state after STEPS steps and its next loss, for the resume at one process
            torch.save({"model": ref.state_dict(), "optim": ref_opt.state_dict()}, ckpt / "reference.pt")
            more, _ = train(ref, data[STEPS:], slice(None), None, ref_opt, 1)
            (ckpt / "reference.json").write_text(json.dumps({"next_loss": more[0], "spec": spec(variant)}))
    return out


def main() -> None:
    rank, world = setup()
    res: dict = {"world": world}
    for variant in ("shipped", "batch"):
        res[variant] = run_variant(variant, rank, world, ep=2)
    # FSDP2 alone on the same spec: what each rank allocates (the planner's figures are checked against both)
    mesh = mp.make_mesh(tp=1)
    model = mp.build_parallel(spec(), mesh, seed=0, device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    per = BATCH // world
    train(model, batches(), slice(rank * per, (rank + 1) * per), mesh["dp"].get_group(), opt, 1)
    res["fsdp_allocated"] = allocated(model, opt)
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()
