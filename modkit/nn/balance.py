"""Expert loads and the training-time balancing rules that read them (the core side of a router's load report).

The contract, duck-typed so that the core names no component (:mod:`modkit.core.interfaces`, ``router``):

* A module **reports expert loads** when it holds a buffer ``expert_load [n_experts]`` int64: the number of routing
  assignments of real tokens (padding excluded) each expert received, *accumulated* over every forward since the
  last :func:`reset_loads`. A forward of ``T`` real tokens with ``top_k`` choices adds ``T * top_k`` in all. One
  forward's loads are read as: reset, forward, read (what ``modkit trace`` does).
* A module **has a balancing rule** when it also defines ``update_balance(load [n_experts])``: a training-time
  update of its own state from the loads of one optimizer step, with no gradient (DeepSeek-V3's auxiliary-loss-free
  balancing moves a selection-only bias, Wang et al. 2024, arXiv:2408.15664; DeepSeek-AI 2024, arXiv:2412.19437,
  section 2.1.2). The rule never sees the optimizer; the training loop calls it after each optimizer step with the
  loads summed over the data-parallel ranks (:func:`all_reduce_loads`).

The training loop (:class:`modkit.train.balance.ExpertBalance`) resets the loads before the first micro-batch of a
step, so the loads of an update are exactly the assignments of that step's micro-batches (gradient accumulation
included), and evaluation forwards between steps never reach an update.

Imbalance of one layer: ``max_e load_e / mean_e load_e`` (1 when every expert gets the same number of assignments;
``n_experts / top_k`` when every token picks the same ``top_k`` experts). DeepSeek-V3 reports ``MaxVio``, which is
this value minus 1.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn

__all__ = [
    "all_reduce_loads",
    "imbalance",
    "layer_of",
    "load_reporters",
    "mean_imbalance",
    "read_loads",
    "reset_loads",
    "update_balance",
]

#: the buffer name a load-reporting module holds
LOAD_BUFFER = "expert_load"


def load_reporters(model: nn.Module) -> dict[str, nn.Module]:
    """``{module path: module}`` of every module of ``model`` that holds an ``expert_load`` buffer, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m._buffers.get(LOAD_BUFFER), Tensor)}


@torch.no_grad()
def reset_loads(model: nn.Module) -> None:
    """Zero the ``expert_load`` buffer of every load-reporting module of ``model``."""
    for m in load_reporters(model).values():
        m._buffers[LOAD_BUFFER].zero_()


def read_loads(model: nn.Module) -> dict[str, Tensor]:
    """``{module path: expert_load copy [n_experts] int64}`` of every load-reporting module (on its device)."""
    return {name: m._buffers[LOAD_BUFFER].detach().clone() for name, m in load_reporters(model).items()}


@torch.no_grad()
def all_reduce_loads(loads: dict[str, Tensor], group: Any = None) -> dict[str, Tensor]:
    """Sum the loads over the ranks of ``group`` (``torch.distributed``; one collective for all layers).

    Args:
        loads: ``{path: [n_experts] int64}`` as :func:`read_loads` gives them (same paths and sizes on every rank).
        group: the process group (the data-parallel ranks; tensor-parallel ranks see the same tokens and must not
            be summed). ``None``: the default group. Without an initialised process group the loads are returned
            as they are.

    Returns:
        ``{path: [n_experts] int64}``, the global counts.
    """
    import torch.distributed as dist

    if not loads or not (dist.is_available() and dist.is_initialized()):
        return loads
    names = list(loads)
    flat = torch.cat([loads[n].reshape(-1).to(torch.int64) for n in names])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    out, start = {}, 0
    for n in names:
        size = loads[n].numel()
        out[n] = flat[start : start + size].view_as(loads[n])
        start += size
    return out


@torch.no_grad()
def update_balance(model: nn.Module, loads: dict[str, Tensor]) -> int:
    """Call ``update_balance(load)`` of every module of ``model`` named in ``loads`` that has a balancing rule.

    Returns:
        the number of modules updated.
    """
    modules = dict(model.named_modules())
    done = 0
    for name, load in loads.items():
        fn = getattr(modules.get(name), "update_balance", None)
        if fn is not None:
            fn(load)
            done += 1
    return done


def imbalance(load: Tensor) -> Optional[float]:
    """``max_e load_e / mean_e load_e`` of ``load [n_experts]``; ``None`` when no assignment was counted."""
    total = float(load.sum())
    if total <= 0 or load.numel() == 0:
        return None
    return float(load.max()) / (total / load.numel())


def layer_of(path: str) -> Optional[int]:
    """The layer index of a module path ``layers.{i}.…`` (``None`` outside the blocks)."""
    parts = path.split(".")
    if len(parts) >= 2 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1])
    return None


def mean_imbalance(values: dict[str, Optional[float]]) -> Optional[float]:
    """The mean of the defined per-layer imbalances (``None`` when there is none)."""
    defined = [v for v in values.values() if v is not None and math.isfinite(v)]
    return sum(defined) / len(defined) if defined else None
