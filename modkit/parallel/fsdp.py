"""FSDP2 (``torch.distributed.fsdp.fully_shard``): one unit per block, then the root, with mixed precision."""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from .errors import ParallelError


def _dtype(value) -> Optional[torch.dtype]:
    """``value`` (``None``, a ``torch.dtype`` or its name: ``"bfloat16"``, ``"torch.float16"``) as a floating dtype.

    Raises:
        ParallelError: not the name of a floating dtype.
    """
    if value is None or isinstance(value, torch.dtype):
        return value
    out = getattr(torch, str(value).replace("torch.", ""), None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise ParallelError(f"unknown floating dtype {value!r}; use float32, bfloat16 or float16")
    return out


def _apply_fsdp(
    model: nn.Module,
    dp_mesh,
    param_dtype: Union[str, torch.dtype, None],
    reduce_dtype: Union[str, torch.dtype, None],
    reshard_after_forward: bool,
    *,
    expert_mesh=None,
) -> None:
    """Step 2 of :func:`~modkit.parallel.parallelize`: ``fully_shard`` every block (modules tagged ``placement``),
    then the root, on the 1-D ``dp_mesh`` with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
    (``reduce_dtype`` defaults to ``param_dtype``). Under expert parallelism the experts (modules tagged
    ``modkit_ep_experts``) are their own units on ``expert_mesh`` (the ``dp_mod_ep`` dim, size 1 included;
    torchtitan's layout); their dispatch scales their gradients by ``1 / ep`` so the mean over it is the
    data-parallel mean.

    Raises:
        ParallelError: an unknown dtype name.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    pd, rd = _dtype(param_dtype), _dtype(reduce_dtype)
    mp = MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd if rd is not None else pd)
    if expert_mesh is not None:
        for experts in [m for m in model.modules() if getattr(m, "modkit_ep_experts", False)]:
            fully_shard(experts, mesh=expert_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    blocks = [m for m in model.modules() if getattr(m, "modkit_kind", None) == "placement"]
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
