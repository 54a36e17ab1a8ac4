"""The training loop's side of routers that report expert loads: reset, all-reduce, balancing update, imbalance.

:class:`ExpertBalance` is the whole hook (see :mod:`modkit.nn.balance` for the contract it reads):

* :meth:`ExpertBalance.begin_step` before the first micro-batch of an optimizer step zeroes every router's load, so
  the loads of the step are the assignments of its ``grad_accum`` micro-batches and nothing else (evaluation
  forwards between steps never count);
* :meth:`ExpertBalance.end_step` after the optimizer step sums the loads over the data-parallel ranks (one
  ``all_reduce``; tensor-parallel ranks see the same tokens and are not summed), applies each router's balancing
  rule (DeepSeek-V3's bias update; no gradient, the optimizer is never involved) and returns the step's imbalance;
* :meth:`ExpertBalance.measure` runs a function (the loop's evaluation on fixed windows) with fresh loads and
  returns the imbalance over its forwards, without any update.

The update speed is a field of the router's config (``bias_update_speed``: the balancing rule belongs to the model
and travels with its spec and checkpoints); the training config's ``bias_update_speed`` overrides it in every
router for one run (0 turns the update off). The bias is a buffer in the model's state dict, so checkpoints carry
it and a resumed run continues bitwise.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

from modkit.nn import balance as bal


class ExpertBalance:
    """Loads and balancing rules of a model's routers during training (a no-op for a model without routers).

    Args:
        model: the model being trained (any wrapping that keeps module paths: FSDP2, tensor parallel), or this
            rank's pipeline stages under the whole model's names.
        group: the data-parallel process group the loads are summed over (``None``: the default group when
            ``torch.distributed`` is initialised, else nothing to sum).
        stage_group: under pipeline parallelism the ``pp`` process group: each rank holds its stages' routers
            only, and the imbalance summary gathers every stage's layers over this group (``None``: one stage).
    """

    def __init__(self, model: nn.Module, group: Any = None, stage_group: Any = None):
        self.model, self.group, self.stage_group = model, group, stage_group
        self.active = bool(bal.load_reporters(model))
        if stage_group is not None:  # a stage without routers still joins its pipeline's gathers
            import torch.distributed as dist

            flags: list = [None] * dist.get_world_size(stage_group)
            dist.all_gather_object(flags, self.active, group=stage_group)
            self.active = any(flags)

    def begin_step(self) -> None:
        """Zero the loads before the step's first micro-batch."""
        if self.active:
            bal.reset_loads(self.model)

    def end_step(self) -> Optional[dict[str, Any]]:
        """After the optimizer step: global loads, each router's balancing update, the step's imbalance.

        Returns:
            ``None`` without routers, else ``{"load_imbalance": mean over layers of max load / mean load,
                "load_imbalance_layers": {router path: value}}`` of this step's loads (before the update).
        """
        if not self.active:
            return None
        loads = bal.all_reduce_loads(bal.read_loads(self.model), self.group)
        bal.update_balance(self.model, loads)
        return self._summary(loads)

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, Optional[dict[str, Any]]]:
        """``(fn(), imbalance summary of the forwards fn ran)`` with fresh loads and no update (evaluation)."""
        if not self.active:
            return fn(), None
        bal.reset_loads(self.model)
        out = fn()
        loads = bal.all_reduce_loads(bal.read_loads(self.model), self.group)
        bal.reset_loads(self.model)
        return out, self._summary(loads)

    def _summary(self, loads: dict) -> dict[str, Any]:
        layers = {name: bal.imbalance(load) for name, load in loads.items()}
        if self.stage_group is not None:  # every stage's layers, in layer order (collective over the pipeline)
            import torch.distributed as dist

            parts: list = [None] * dist.get_world_size(self.stage_group)
            dist.all_gather_object(parts, layers, group=self.stage_group)
            merged = {name: value for part in parts for name, value in part.items()}
            layers = dict(sorted(merged.items(), key=lambda kv: (bal.layer_of(kv[0]) or 0, kv[0])))
        return {"load_imbalance": bal.mean_imbalance(layers), "load_imbalance_layers": layers}
