"""Training under tensor parallelism (``torchrun --nproc_per_node 2``, gloo on CPU), run by ``tests/parallel/test_parallel.py``.

Two tiny models whose TP layout puts a replicated tensor next to a sharded activation:

* ``moe``: 2 layers, a top-2 mixture of 4 SwiGLU experts in each (stacked experts, the ``grouped`` style);
* ``qk_norm``: dense, GQA 4/2 with a per-head RMSNorm QK-norm (``qk_norm_scope = "head"``: one ``[head_dim]``
  weight shared by all heads, each rank holding half of them);
* ``learned_bias``: MHA with an ALiBi-like attention bias whose slopes are parameters (a third-party position
  scheme registered here): each rank uses its heads' slice of the bias.

For each, single process and tp = 2 with the same seed run forward, next-token cross entropy (+ aux loss) and
backward on the same batch. Measured per rank, against the single-process model: every parameter's gradient
(a DTensor gradient gathered with ``full_tensor()``), the gradient of the loss w.r.t. the input embeddings (the
embedding module's output), the global gradient norm and the gradients clipped by it
(``modkit.parallel.clip_grad_norm_`` against ``torch.nn.utils.clip_grad_norm_``), and after one AdamW step the
parameter values; and across the two ranks the largest difference between the copies of each replicated
parameter.
"""

from __future__ import annotations

import copy
import os
import sys

import types
from typing import Literal

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
from _common import TINY_LLAMA, Timer, loss_fn, max_diff, param_diff, finish, setup, write_results  # noqa: E402

import modkit  # noqa: E402
from modkit import Component, ComponentConfig, PositionScheme, hookimpl  # noqa: E402
from modkit import parallel as mp  # noqa: E402
from modkit_plugins.position import alibi_slopes  # noqa: E402


class LearnedAlibiConfig(ComponentConfig):
    """Config of ``learned_alibi``."""

    type: Literal["learned_alibi"] = "learned_alibi"


class LearnedAlibi(PositionScheme):
    """ALiBi with trainable slopes ``[n_heads]`` (a third-party bias with parameters): ``-slope_h · |i - j|``."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.slopes = torch.nn.Parameter(torch.empty(n_heads))

    def init_weights(self, init) -> None:
        init.copy_(self.slopes, torch.tensor(alibi_slopes(self.n_heads)))

    def attention_bias(self, q_positions, k_positions, n_heads):
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().float()
        return -self.slopes[None, :, None, None] * dist[:, None]


def registry() -> modkit.Registry:
    """The installed plugins plus ``position/learned_alibi``."""
    reg = modkit.Registry()
    for info in modkit.get_registry().plugins():
        reg.register_plugin(info.obj, info.name)

    def register_components(register):
        register(
            Component(
                kind="position",
                type="learned_alibi",
                config=LearnedAlibiConfig,
                factory=lambda cfg, ctx: LearnedAlibi(ctx.n_heads),
                description="ALiBi with trainable slopes",
                capabilities={"acts_on": "bias", "tp_plan": {}},
            )
        )

    reg.register_plugin(types.SimpleNamespace(register_components=hookimpl(register_components)), "learned-alibi")
    return reg


def specs() -> dict[str, dict]:
    """The two tiny specs (float32, init_std 0.1 so that gradients are well above the tolerance)."""
    moe = copy.deepcopy(TINY_LLAMA)
    moe["name"] = "dist-tiny-moe"
    moe["block"]["ffn"] = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 64},
        "router": {"type": "topk", "renormalize": True},
        "aux_loss_coef": 0.01,
        "z_loss_coef": 0.001,
    }
    qk = copy.deepcopy(TINY_LLAMA)
    qk["name"] = "dist-tiny-qk-norm"
    qk["block"]["attention"] = {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "qk_norm": {"type": "rmsnorm", "eps": 1e-6},
        "qk_norm_scope": "head",
    }
    bias = copy.deepcopy(TINY_LLAMA)
    bias["name"] = "dist-tiny-learned-bias"
    bias["position"] = {"type": "learned_alibi"}
    bias["block"]["attention"] = {"type": "mha", "n_heads": 4}
    return {"moe": moe, "qk_norm": qk, "learned_bias": bias}


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


def grad_layout_mismatches(model) -> list[str]:
    """Parameters whose ``.grad`` is not laid out like the parameter (e.g. a ``Partial`` gradient left unreduced)."""
    from torch.distributed.tensor import DTensor

    bad = []
    for n, p in model.named_parameters():
        if isinstance(p, DTensor) and (
            not isinstance(p.grad, DTensor) or tuple(p.grad.placements) != tuple(p.placements)
        ):
            bad.append(f"{n}: {getattr(p.grad, 'placements', type(p.grad).__name__)} vs {p.placements}")
    return bad


def compare(spec: dict, ids: torch.Tensor, mesh, reg) -> dict:
    ref = modkit.build(spec, seed=0, registry=reg)
    model = mp.build_parallel(spec, mesh, seed=0, device="cpu", registry=reg)
    ref_embed, model_embed = embedding_grad(ref), embedding_grad(model)
    out, ref_out = model(ids), ref(ids)
    r: dict = {"logits_max_abs_diff": max_diff(out.logits, ref_out.logits)}
    loss_fn(out.logits, ids, out.aux_loss).backward()
    loss_fn(ref_out.logits, ids, ref_out.aux_loss).backward()
    r["grad_max_abs_diff"], r["grad_worst"] = param_diff(model, ref, grads=True)
    r["embed_grad_max_abs_diff"] = max_diff(model_embed(), ref_embed())
    r["grad_layout_mismatches"] = grad_layout_mismatches(model)
    # the global gradient norm over plain and DTensor gradients, and clipping by it (max_norm below the norm)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    norm = mp.clip_grad_norm_(model.parameters(), 0.5)
    r["grad_norm"], r["grad_norm_abs_diff"] = float(ref_norm), float((norm - ref_norm).abs())
    r["clipped_grad_max_abs_diff"] = param_diff(model, ref, grads=True)[0]
    r["mean_loss_across_ranks"] = float(mp.mean_across_ranks(dist.get_rank()))  # (0 + 1) / 2
    # Adam's first step is g / (|g| + eps) per element: with the default eps (1e-8) an element whose gradient is
    # ~1e-7 (there is one in k_proj here) turns float rounding of 1e-8 into a step difference of 1e-4. eps = 1e-3
    # bounds the step's sensitivity to lr * |Δg| / eps, so the check measures the layout, not Adam's conditioning.
    torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3).step()
    torch.optim.AdamW(ref.parameters(), lr=1e-2, eps=1e-3).step()
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
    reg = registry()
    for name, spec in specs().items():
        res[name] = compare(spec, ids, mesh, reg)
        timer.lap(name)
    res["times_s"] = timer.times
    write_results(res, rank)
    finish()


if __name__ == "__main__":
    main()
