"""Four-rank 2-D mesh check (``torchrun --nproc_per_node 4``, gloo on CPU): FSDP2 (dp = 2) x TP (tp = 2).

Each data-parallel group sees half the batch; the two tensor-parallel ranks of a group see the same rows. Against
the single-process model: initial weights, logits, gradients after the reduce, one AdamW step, per-rank
parameter bytes; the same for the models of ``tp_grads.py`` (logits, gradients, the clipped global gradient
norm, one step); then a consolidated export compared with the reference on rank 0.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import TINY_LLAMA, Timer, loss_fn, max_diff, param_diff, finish, setup, write_results  # noqa: E402
import tp_grads  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402


def main() -> None:
    rank, world = setup()
    assert world == 4, world
    timer = Timer()
    res: dict = {"world": world}
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(1234))

    ref = modkit.build(TINY_LLAMA, seed=0)
    mesh = mp.make_mesh(tp=2, device_type="cpu")  # ("dp", "tp") = (2, 2)
    model = mp.build_parallel(TINY_LLAMA, mesh, seed=0, device="cpu")
    res["mesh"] = {
        "dp": mesh["dp"].size(),
        "tp": mesh["tp"].size(),
        "dp_rank": mesh["dp"].get_local_rank(),
        "tp_rank": mesh["tp"].get_local_rank(),
    }
    res["init_max_abs_diff"] = param_diff(model, ref)[0]
    res["stats"] = mp.param_stats(model)
    res["placements"] = {n: str(p.placements) for n, p in model.named_parameters() if n.startswith("layers.0.")}
    timer.lap("build")

    dp = mesh["dp"].get_local_rank()
    rows = slice(2 * dp, 2 * dp + 2)
    out, ref_out = model(ids[rows]), ref(ids)
    res["logits_max_abs_diff"] = max_diff(out.logits, ref_out.logits[rows])
    loss_fn(out.logits, ids[rows]).backward()
    loss_fn(ref_out.logits, ids).backward()
    res["grad_max_abs_diff"], res["grad_worst"] = param_diff(model, ref, grads=True)
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    torch.optim.AdamW(ref.parameters(), lr=1e-2).step()
    res["step_param_max_abs_diff"], res["step_worst"] = param_diff(model, ref)
    timer.lap("step")

    # a replicated tensor next to a sharded activation (MoE experts' input, per-head QK-norm) under FSDP x TP
    reg = tp_grads.registry()
    for name, spec in tp_grads.specs().items():
        ref, model = (
            modkit.build(spec, seed=0, registry=reg),
            mp.build_parallel(spec, mesh, seed=0, device="cpu", registry=reg),
        )
        out = model(ids[rows])
        loss_fn(out.logits, ids[rows], out.aux_loss).backward()
        # the reference sees each data-parallel group's rows as its own batch: the load-balancing loss is not a
        # mean over tokens (a product of two means), so it is computed per group and averaged as FSDP averages
        halves = [ref(ids[2 * g : 2 * g + 2]) for g in range(2)]
        (sum(loss_fn(h.logits, ids[2 * g : 2 * g + 2], h.aux_loss) for g, h in enumerate(halves)) / 2).backward()
        r = {"logits_max_abs_diff": max_diff(out.logits, halves[dp].logits)}
        r["grad_max_abs_diff"], r["grad_worst"] = param_diff(model, ref, grads=True)
        ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)  # 2-D DTensor gradients (_StridedShard)
        r["grad_norm_rel_diff"] = float((mp.clip_grad_norm_(model.parameters(), 0.5) - ref_norm).abs() / ref_norm)
        torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3).step()  # eps: see tp_grads.compare
        torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-3).step()
        r["step_param_max_abs_diff"], r["step_worst"] = param_diff(model, ref)
        res[name] = r
        timer.lap(name)

    path = Path(os.environ["MODKIT_DIST_OUT"]) / "model2d.safetensors"
    mp.export_consolidated(path, model)
    if rank == 0:
        from safetensors.torch import load_file

        sd = load_file(str(path))
        res["consolidated_vs_reference_diff"] = max(float((ref.state_dict()[k] - v).abs().max()) for k, v in sd.items())
    timer.lap("export")
    res["times_s"] = timer.times
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()
