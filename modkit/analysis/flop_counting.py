"""FLOPs measured: :func:`flop_counter`, torch's ``FlopCounterMode`` with formulas for the ops it does not count
(the CPU attention kernel, modkit's grouped matrix product, the triangular solve), which the contract kit compares
with the components' declarations (:mod:`modkit.testing.checks.flops`).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from modkit.nn import grouped as _grouped  # noqa: F401  (registers torch.ops.modkit.grouped_mm, counted below)
from .workload import FLOPS_PER_MAC


def _sdpa_cpu(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _sdpa_cpu_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def _solve_triangular_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """A triangular solve ``A X = B`` (``A [..., n, n]``, ``B [..., n, m]``, left side): forward or back substitution
    is ``n (n - 1) / 2`` multiply-adds per right-hand side column, ``n (n - 1) · m`` FLOPs (the divisions by the
    diagonal, absent with ``unitriangular``, are element-wise), times the batch."""
    n, m = a_shape[-1], b_shape[-1]
    batch = 1
    for size in (out_shape or b_shape)[:-2]:
        batch *= size
    return batch * m * n * (n - 1)


def _grouped_mm_flops(x_shape, w_shape, offs_shape, *args, out_shape=None, **kwargs) -> int:
    return FLOPS_PER_MAC * x_shape[0] * x_shape[1] * w_shape[-1]


def _grouped_mm_weight_grad_flops(x_shape, dy_shape, offs_shape, *args, out_shape=None, **kwargs) -> int:
    return FLOPS_PER_MAC * x_shape[0] * x_shape[1] * dy_shape[1]


def flop_counter(**kwargs: Any):
    """A ``torch.utils.flop_counter.FlopCounterMode`` that also counts modkit's ops and the CPU attention kernel.

    torch 2.13 has no formula for ``aten._scaled_dot_product_flash_attention_for_cpu`` (it would count 0 on the
    CPU), for modkit's ``modkit::grouped_mm`` custom op (mixture-of-experts experts) nor for
    ``aten.linalg_solve_triangular`` (the chunkwise delta rule); they are added through ``custom_mapping`` (torch's
    own SDPA formula: the full ``[q_len, kv_len]`` rectangle; ``2·rows·in·out`` for a grouped product; ``n (n - 1)``
    FLOPs per right-hand side column of an ``n × n`` triangular solve). ``display`` defaults to False; other
    arguments go to ``FlopCounterMode``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    ops = torch.ops
    mapping: dict[Any, Callable] = {
        ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_cpu,
        ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_cpu_backward,
        ops.modkit.grouped_mm: _grouped_mm_flops,
        ops.modkit.grouped_mm_weight_grad: _grouped_mm_weight_grad_flops,
        ops.aten.linalg_solve_triangular: _solve_triangular_flops,
    }
    mapping.update(kwargs.pop("custom_mapping", {}) or {})
    kwargs.setdefault("display", False)
    return FlopCounterMode(custom_mapping=mapping, **kwargs)
