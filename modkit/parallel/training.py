"""Training under parallelism: the global gradient norm and clipping over mixed shards, means over the ranks."""

from __future__ import annotations

import math
from typing import Union

import torch
from torch import Tensor

from .errors import ParallelError
from .mesh import _shard_count


def _copies(t: Tensor, world: int) -> int:
    """How many ranks hold the same values as this rank's piece of ``t`` (meshes from make_mesh span the world).

    Raises:
        ParallelError: ``t`` is a DTensor still ``Partial`` on some mesh dim.
    """
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return world
    for i, pl in enumerate(t.placements):
        if pl.is_partial():
            raise ParallelError(
                f"a gradient of shape {list(t.shape)} is still Partial on mesh dim {i}; reduce it first"
            )
    return max(1, world // _shard_count(t))


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, *, pp: int = 1) -> Tensor:
    """Clip the gradients of a parallelised model by their global norm, in place; returns the norm before clipping.

    ``torch.nn.utils.clip_grad_norm_`` for a model whose gradients are a mix of plain tensors (replicated on every
    rank, e.g. norm weights under TP alone) and DTensors on several meshes (TP shards, FSDP2 shards, both): it
    cannot mix them in one call. Here each rank adds ``|g_local|^p / copies`` over its gradients, where ``copies``
    is the number of ranks holding the same piece (the world size for a plain tensor, ``world / shards`` for a
    DTensor), one all-reduce sums that over the world, and ``total = sum^(1/p)`` is the norm of the full
    gradient of the single-process model. Every gradient is then scaled by ``min(1, max_norm / (total + 1e-6))``,
    as torch does. ``norm_type = inf`` takes the max instead (an all-reduce MAX). Without a process group this is
    the single-process norm. Under pipeline parallelism (``pp`` stages, each rank holding its stages' parameters
    only) a piece is held by the ``world / pp`` ranks of its stage at most, and the one all-reduce also sums the
    stages.

    Args:
        parameters: an iterable of parameters (``model.parameters()``); those without ``.grad`` are ignored.
        max_norm: largest allowed norm (> 0).
        norm_type: ``p`` of the p-norm (2.0 default; ``float("inf")`` for the max norm).
        pp: pipeline-parallel degree (1: every rank holds every parameter, sharded or not).

    Returns:
        The total norm, a float32 scalar tensor on the gradients' device (identical on every rank).

    Raises:
        ValueError: ``max_norm`` or ``norm_type`` not positive.
        ParallelError: a gradient is still a ``Partial`` DTensor (not reduced to its parameter's layout).
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    if not max_norm > 0 or not norm_type > 0:
        raise ValueError(f"clip_grad_norm_ needs max_norm > 0 and norm_type > 0, got {max_norm} and {norm_type}")
    grads = [p.grad for p in parameters if p.grad is not None]
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    holders = max(1, world // pp)  # the ranks that hold this rank's stages
    locals_ = [(g.to_local() if isinstance(g, DTensor) else g, _copies(g, holders)) for g in grads]
    device = locals_[0][0].device if locals_ else torch.device("cpu")
    inf = math.isinf(norm_type)
    acc = torch.zeros((), dtype=torch.float32, device=device)
    for g, copies in locals_:
        if g.numel() == 0:
            continue
        if inf:
            acc = torch.maximum(acc, g.detach().abs().max().float().to(device))
        else:
            acc += torch.linalg.vector_norm(g.detach().float(), norm_type).to(device) ** norm_type / copies
    if world > 1:
        dist.all_reduce(acc, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM)
    total = acc if inf else acc ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g, _ in locals_:
        g.mul_(coef.to(g.device, g.dtype))
    return total


def mean_across_ranks(value: Union[Tensor, float]) -> Tensor:
    """The mean of a scalar (a loss, a token count) over every rank of the world, for logging; a tensor of several
    values (flags checked together) is averaged element by element in the same one all-reduce.

    Tensor-parallel ranks of one data-parallel group hold the same value, so the world mean is the mean over the
    data-parallel groups. One all-reduce of a float32 copy; the input is not modified. Without a process group the
    value itself.

    Returns:
        A float32 tensor (on ``value``'s device; CPU for a Python number), detached: a scalar for a one-element
            input, else of the input's shape.
    """
    import torch.distributed as dist

    out = torch.as_tensor(value).detach().float().clone()
    out = out.reshape(()) if out.numel() == 1 else out
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
        out /= dist.get_world_size()
    return out
