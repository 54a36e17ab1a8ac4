"""Accounting: what one rank of a parallelised model holds, in elements and bytes."""

from __future__ import annotations

from torch import nn

from .mesh import _shard_count


def param_stats(model: nn.Module) -> dict[str, int]:
    """What this rank holds, in elements and bytes.

    Returns:
        ``{"global_params", "local_params", "local_bytes", "sharded_local_params", "replicated_params",
            "owned_params"}``: ``local_*`` count the tensors this rank stores (shards of DTensors, whole plain
            tensors); ``sharded_local_params`` the part of it that is a shard (split over > 1 rank),
            ``replicated_params`` the part stored whole; ``owned_params`` sums ``local / (world / shards)``: this
            rank's share once copies on other ranks are discounted (a norm weight FSDP-sharded over ``dp`` is still
            copied on each ``tp`` rank), so it adds up to ``global_params`` over all ranks.
    """
    from torch.distributed.tensor import DTensor

    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
    except Exception:  # pragma: no cover - distributed unavailable
        world = 1
    out = dict(global_params=0, local_params=0, local_bytes=0, sharded_local_params=0, replicated_params=0)
    owned = 0.0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        out["global_params"] += p.numel()
        if isinstance(p, DTensor):
            local = p.to_local()
            shards = _shard_count(p)
            repl = max(1, world // shards)  # every rank holds a piece of every parameter (meshes span the world)
            n = local.numel()
            out["local_bytes"] += n * local.element_size()
            if shards > 1:
                out["sharded_local_params"] += n
            else:
                out["replicated_params"] += n
        else:
            n, repl = p.numel(), world
            out["local_bytes"] += n * p.element_size()
            out["replicated_params"] += n
        out["local_params"] += n
        owned += n / repl
    out["owned_params"] = int(round(owned))
    return out
