"""Training under tensor parallelism (``torchrun --nproc_per_node 2``, gloo on CPU), run by ``tests/test_parallel.py``.

Two tiny models whose TP layout puts a replicated tensor next to a sharded activation:

* ``moe``: 2 layers, a top-2 mixture of 4 SwiGLU experts in each (stacked experts, the ``grouped`` style);
* ``qk_norm``: dense, GQA 4/2 with a per-head RMSNorm QK-norm (``qk_norm_scope = "head"``: one ``[head_dim]``
  weight shared by all heads, each rank holding half of them).

For each, single process and tp = 2 with the same seed run forward, next-token cross entropy (+ aux loss) and
backward on the same batch. Measured per rank, against the single-process model: every parameter's gradient
(a DTensor gradient gathered with ``full_tensor()``), the gradient of the loss w.r.t. the input embeddings (the
embedding module's output), and after one AdamW step the parameter values; and across the two ranks the largest
difference between the copies of each replicated parameter.
"""

from __future__ import annotations

import copy
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _common import TINY_LLAMA, Timer, loss_fn, max_diff, param_diff, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit import parallel as mp  # noqa: E402


def specs() -> dict[str, dict]:
    """The two tiny specs (float32, init_std 0.1 so that gradients are well above the tolerance)."""
    moe = copy.deepcopy(TINY_LLAMA)
    moe["name"] = "dist-tiny-moe"
    moe["block"]["ffn"] = {
        "type": "moe", "n_experts": 4, "top_k": 2, "expert": {"type": "swiglu", "d_ff": 64},
        "router": {"type": "topk", "renormalize": True}, "aux_loss_coef": 0.01, "z_loss_coef": 0.001,
    }
    qk = copy.deepcopy(TINY_LLAMA)
    qk["name"] = "dist-tiny-qk-norm"
    qk["block"]["attention"] = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm", "eps": 1e-6}, "qk_norm_scope": "head"}
    return {"moe": moe, "qk_norm": qk}


def embedding_grad(model):
    """Run with a hook that keeps the gradient of the embedding output ``[batch, seq, d_model]``; returns a getter."""
    kept = {}

    def hook(module, args, out):
        out.retain_grad()
        kept["x"] = out

    model.embed.register_forward_hook(hook)
    return lambda: kept["x"].grad


def replica_spread(model) -> tuple[float, str]:
    """Largest difference between the two ranks' copies of a parameter that is not sharded over the TP group."""
    from torch.distributed.tensor import DTensor

    worst, name = 0.0, ""
    for n, p in model.named_parameters():
        if isinstance(p, DTensor) and any(pl.is_shard() for pl in p.placements):
            continue
        local = (p.to_local() if isinstance(p, DTensor) else p).detach().contiguous()
        copies = [torch.empty_like(local) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, local)
        d = max(float((c - copies[0]).abs().max()) for c in copies)
        if d > worst or not name:
            worst, name = d, n
    return worst, name


def compare(spec: dict, ids: torch.Tensor, mesh) -> dict:
    ref = modkit.build(spec, seed=0)
    model = mp.build_parallel(spec, mesh, seed=0, device="cpu")
    ref_embed, model_embed = embedding_grad(ref), embedding_grad(model)
    out, ref_out = model(ids), ref(ids)
    r: dict = {"logits_max_abs_diff": max_diff(out.logits, ref_out.logits)}
    loss_fn(out.logits, ids, out.aux_loss).backward()
    loss_fn(ref_out.logits, ids, ref_out.aux_loss).backward()
    r["grad_max_abs_diff"], r["grad_worst"] = param_diff(model, ref, grads=True)
    r["embed_grad_max_abs_diff"] = max_diff(model_embed(), ref_embed())
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    torch.optim.AdamW(ref.parameters(), lr=1e-2).step()
    r["step_param_max_abs_diff"], r["step_worst"] = param_diff(model, ref)
    r["replica_spread"], r["replica_spread_worst"] = replica_spread(model)
    return r


def main() -> None:
    rank, world = setup()
    assert world == 2, world
    timer = Timer()
    res: dict = {"world": world}
    ids = torch.randint(0, TINY_LLAMA["vocab_size"], (4, 16), generator=torch.Generator().manual_seed(1234))
    mesh = mp.make_mesh(tp=2, device_type="cpu")
    for name, spec in specs().items():
        res[name] = compare(spec, ids, mesh)
        timer.lap(name)
    res["times_s"] = timer.times
    write_results(res, rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
