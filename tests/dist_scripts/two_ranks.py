"""Two-rank checks (``torchrun --nproc_per_node 2``, gloo on CPU), run by ``tests/parallel/test_parallel.py``.

Against the single-process model built from the same spec and seed, each rank measures:

* tp: tensor parallel (mesh 1 x 2): initial weights, forward logits, gradients, one AdamW step; per-rank bytes.
* fsdp: FSDP2 (mesh 2 x 1), each rank on half the batch: logits, gradients after the reduce-scatter, one AdamW
  step; per-rank bytes.
* moe_tp: the tiny-moe spec under TP (stacked experts sharded on d_ff, the 'grouped' style): logits, aux loss, per-rank sizes.
* alibi_tp: an ALiBi + MHA spec under TP (the bias sliced to local heads): logits.
* mixed: FSDP2 with param_dtype bfloat16, reduce_dtype float32: logits against the float32 reference.
* ckpt: DCP save of the FSDP model, load into a differently seeded one and into a TP-sharded one (DCP
  reshards); model + AdamW state round trip; consolidated safetensors export,
  compared with the reference on rank 0; a TP model started from that file.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _common import TINY_LLAMA, Timer, loss_fn, max_diff, param_diff, finish, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def step_compare(model, ref, batch_model, batch_ref, rows: slice, timer, tag) -> dict:
    """Forward, backward and one AdamW step on both; the differences at each stage.

    ``batch_model`` is this rank's batch, ``batch_ref`` the global one, ``rows`` where this rank's rows sit in it.
    """
    out = model(batch_model)
    ref_out = ref(batch_ref)
    r: dict = {}
    r["logits_max_abs_diff"] = max_diff(out.logits, ref_out.logits[rows])
    loss_fn(out.logits, batch_model, out.aux_loss).backward()
    loss_fn(ref_out.logits, batch_ref, ref_out.aux_loss).backward()
    r["grad_max_abs_diff"], r["grad_worst"] = param_diff(model, ref, grads=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt.step()
    ref_opt.step()
    r["step_param_max_abs_diff"], r["step_worst"] = param_diff(model, ref)
    timer.lap(tag)
    return r


def main() -> None:
    rank, world = setup()
    assert world == 2, world
    timer = Timer()
    res: dict = {"world": world}
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (4, 16), generator=g)

    # ---------------------------------------------------------------- tensor parallel
    ref = modkit.build(TINY_LLAMA, seed=0)
    tp_mesh = mp.make_mesh(tp=2, device_type="cpu")
    model = mp.build_parallel(TINY_LLAMA, tp_mesh, seed=0, device="cpu")
    res["tp_init_max_abs_diff"] = param_diff(model, ref)[0]
    attn = model.layers[0].attention
    res["tp_local_heads"] = [attn.n_heads, attn.n_kv_heads]
    res["tp_stats"] = mp.param_stats(model)
    timer.lap("tp_build")
    res["tp"] = step_compare(model, ref, ids, ids, slice(None), timer, "tp_step")

    # ---------------------------------------------------------------- FSDP2
    ref = modkit.build(TINY_LLAMA, seed=0)
    dp_mesh = mp.make_mesh(tp=1, device_type="cpu")
    fsdp = mp.build_parallel(TINY_LLAMA, dp_mesh, seed=0, device="cpu")
    res["fsdp_init_max_abs_diff"] = param_diff(fsdp, ref)[0]
    res["fsdp_stats"] = mp.param_stats(fsdp)
    timer.lap("fsdp_build")
    local = ids[rank * 2 : (rank + 1) * 2]
    res["fsdp"] = step_compare(fsdp, ref, local, ids, slice(rank * 2, rank * 2 + 2), timer, "fsdp_step")

    # ---------------------------------------------------------------- MoE and ALiBi under TP
    moe_spec = modkit.load_spec(REPO / "specs" / "tiny-moe.json").model_dump(mode="json")
    moe_spec.update(n_layers=2, init_std=0.1)
    ref_moe = modkit.build(moe_spec, seed=0)
    moe = mp.build_parallel(moe_spec, tp_mesh, seed=0, device="cpu")
    o, ro = moe(ids), ref_moe(ids)
    res["moe_tp"] = {
        "logits_max_abs_diff": max_diff(o.logits, ro.logits),
        "aux_abs_diff": float((o.aux_loss - ro.aux_loss).abs()),
        "stats": mp.param_stats(moe),
    }
    timer.lap("moe_tp")

    alibi_spec = copy.deepcopy(TINY_LLAMA)
    alibi_spec["position"] = {"type": "alibi"}
    alibi_spec["block"]["attention"] = {"type": "mha", "n_heads": 4}
    ref_alibi = modkit.build(alibi_spec, seed=0)
    alibi = mp.build_parallel(alibi_spec, tp_mesh, seed=0, device="cpu")
    res["alibi_tp"] = {"logits_max_abs_diff": max_diff(alibi(ids).logits, ref_alibi(ids).logits)}
    timer.lap("alibi_tp")

    # ---------------------------------------------------------------- mixed precision
    ref = modkit.build(TINY_LLAMA, seed=0)
    mixed = mp.build_parallel(TINY_LLAMA, dp_mesh, seed=0, device="cpu", param_dtype="bfloat16", reduce_dtype="float32")
    out = mixed(local)
    lo = ref(ids).logits[rank * 2 : (rank + 1) * 2]
    loss_fn(out.logits, local).backward()
    res["mixed"] = {
        "logits_dtype": str(out.logits.dtype),
        "logits_max_abs_diff": max_diff(out.logits, lo),
        "grad_dtype": str(next(mixed.parameters()).grad.dtype),
    }
    timer.lap("mixed")

    # ---------------------------------------------------------------- checkpoints
    ckpt_dir = Path(os.environ["MODKIT_DIST_OUT"]) / "ckpt"
    mp.save_sharded(ckpt_dir / "dcp", fsdp)
    other = mp.build_parallel(TINY_LLAMA, dp_mesh, seed=7, device="cpu")
    before = param_diff(other, fsdp)[0]
    mp.load_sharded(ckpt_dir / "dcp", other)
    res["ckpt"] = {"dcp_before_load_diff": before, "dcp_after_load_diff": param_diff(other, fsdp)[0]}
    resharded = mp.build_parallel(TINY_LLAMA, tp_mesh, seed=5, device="cpu")  # saved FSDP-sharded, loaded TP-sharded
    mp.load_sharded(ckpt_dir / "dcp", resharded)
    res["ckpt"]["dcp_fsdp_to_tp_diff"] = param_diff(resharded, fsdp)[0]
    # model + optimiser state through DCP: AdamW moments come back on a fresh model/optimiser pair
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-2)
    loss_fn(fsdp(local).logits, local).backward()
    opt.step()
    mp.save_sharded(ckpt_dir / "dcp_opt", fsdp, opt)
    fresh = mp.build_parallel(TINY_LLAMA, dp_mesh, seed=9, device="cpu")
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    mp.load_sharded(ckpt_dir / "dcp_opt", fresh, fresh_opt)
    moments = [
        max_diff(fresh_opt.state[q][key], opt.state[p][key])
        for p, q in zip(fsdp.parameters(), fresh.parameters())
        for key in ("exp_avg", "exp_avg_sq")
    ]
    res["ckpt"]["dcp_optimizer_moment_diff"] = max(moments)
    res["ckpt"]["dcp_optimizer_param_diff"] = param_diff(fresh, fsdp)[0]
    info = mp.export_consolidated(ckpt_dir / "model.safetensors", fsdp)
    full_sd = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in fsdp.state_dict().items()}
    if rank == 0:
        from safetensors.torch import load_file

        single = modkit.build(TINY_LLAMA, seed=3)
        single.load_state_dict(load_file(str(ckpt_dir / "model.safetensors")))
        res["ckpt"]["consolidated"] = info
        res["ckpt"]["consolidated_vs_sharded_diff"] = max(
            float((single.state_dict()[k] - v).abs().max()) for k, v in full_sd.items()
        )
    tp_from_file = mp.build_parallel(TINY_LLAMA, tp_mesh, seed=11, device="cpu")
    mp.load_consolidated(ckpt_dir / "model.safetensors", tp_from_file)
    res["ckpt"]["tp_from_consolidated_diff"] = param_diff(tp_from_file, fsdp)[0]
    timer.lap("ckpt")

    res["times_s"] = timer.times
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()
