"""Grouped matrix multiply: one GEMM per contiguous group of rows, each group with its own weight matrix.

This is the kernel behind dropless mixture-of-experts dispatch: the ``tokens * top_k`` routing assignments are
sorted by expert, so expert ``g`` owns the contiguous rows ``[offs[g-1], offs[g])``, and one call multiplies every
expert's rows by that expert's weights. The group boundaries stay a tensor, so nothing is synchronised to the host
and nothing depends on data in Python: a caller compiles with ``torch.compile(fullgraph=True)`` and static shapes.

:func:`grouped_mm` is a ``torch.library`` custom op (``modkit::grouped_mm``) with a fake (meta) implementation and
an autograd formula. On CUDA it runs ``torch._grouped_mm`` (where the device and dtype allow); on the CPU, for
float64, or where the native kernel refuses, it runs one ``torch.mm`` per group into slices of the output. On the
CPU reading the group ends is no device synchronisation, and the loop is the faster one there (8 groups of 1024
rows, 512 -> 1408, one thread: 0.213 s against 0.232 s for ``torch._grouped_mm``); inside the op it is invisible
to the compiler either way. Wrapping is also what makes float32 compile: in torch 2.13 the compiler's meta function
of ``aten._grouped_mm`` accepts only bfloat16.

The math is an ordinary matrix product per group (the grouped GEMM of CUTLASS / MegaBlocks: Gale et al. 2022,
MegaBlocks: Efficient Sparse Training with Mixture-of-Experts, arXiv:2211.15841).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["grouped_mm"]

_NATIVE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _loop(a: Tensor, b: Tensor, offs: Tensor, out: Tensor, weight_grad: bool) -> Tensor:
    """One ``torch.mm`` per non-empty group into ``out`` (an empty group's ``out[g]`` must already be zero)."""
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            if weight_grad:  # out[g] = a[:, rows] @ b[rows]: a is xᵀ [in, rows], b is dy [rows, out]
                torch.mm(a[:, start:end], b[start:end], out=out[g])
            else:
                torch.mm(a[start:end], b[g], out=out[start:end])
        start = end
    return out


def _native(a: Tensor, b: Tensor, offs: Tensor) -> Tensor | None:
    if a.device.type == "cpu" or a.dtype not in _NATIVE_DTYPES or not hasattr(torch, "_grouped_mm"):
        return None
    try:
        return torch._grouped_mm(a, b, offs=offs)
    except RuntimeError:  # a device or layout the native kernel does not take (e.g. CUDA before sm90)
        return None


@torch.library.custom_op("modkit::grouped_mm", mutates_args=())
def _grouped_mm(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    y = _native(x, w, offs)
    if y is None:
        y = _loop(x, w, offs, x.new_empty(x.shape[0], w.shape[-1]), weight_grad=False)
    return y


@_grouped_mm.register_fake
def _(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    return x.new_empty(x.shape[0], w.shape[-1])


@torch.library.custom_op("modkit::grouped_mm_weight_grad", mutates_args=())
def _grouped_mm_weight_grad(x: Tensor, dy: Tensor, offs: Tensor) -> Tensor:
    """``out[g] = x[rows_g]ᵀ @ dy[rows_g]``: ``[groups, in, out]`` (the weight gradient of :func:`grouped_mm`)."""
    xt = x.t()
    g = _native(xt, dy, offs)
    if g is None:
        g = _loop(xt, dy, offs, x.new_zeros(offs.shape[0], x.shape[1], dy.shape[1]), weight_grad=True)
    return g


@_grouped_mm_weight_grad.register_fake
def _(x: Tensor, dy: Tensor, offs: Tensor) -> Tensor:
    return x.new_empty(offs.shape[0], x.shape[1], dy.shape[1])


def _setup(ctx, inputs, output) -> None:
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _backward(ctx, dy: Tensor):
    x, w, offs = ctx.saved_tensors
    dy = dy.contiguous()
    dx = _grouped_mm(dy, w.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    dw = _grouped_mm_weight_grad(x, dy, offs) if ctx.needs_input_grad[1] else None
    return dx, dw, None


_grouped_mm.register_autograd(_backward, setup_context=_setup)


def grouped_mm(x: Tensor, w: Tensor, offs: Tensor) -> Tensor:
    """Multiply each contiguous group of rows of ``x`` by its own matrix: ``y[rows_g] = x[rows_g] @ w[g]``.

    Args:
        x: ``[rows, in_features]``, rows sorted by group.
        w: ``[groups, in_features, out_features]`` (``x @ w[g]``: the transpose of ``nn.Linear``'s layout), same
            dtype and device as ``x``.
        offs: ``[groups]`` int32, the cumulative row ends: group ``g`` is rows ``[offs[g-1], offs[g])`` (``offs[-1]``
            must equal ``rows``: rows past it are not computed and hold unspecified values). A group may be empty.

    Returns:
        ``[rows, out_features]`` in ``x``'s dtype. Differentiable in ``x`` and ``w``; compiles with
            ``fullgraph=True`` (a custom op, no host synchronisation visible to the compiler).

    Raises:
        ValueError: shapes or dtypes that do not fit (names them).
    """
    if x.dim() != 2 or w.dim() != 3 or offs.dim() != 1 or w.shape[1] != x.shape[1] or offs.shape[0] != w.shape[0]:
        raise ValueError(
            f"grouped_mm needs x [rows, in], w [groups, in, out], offs [groups]; got x {list(x.shape)}, "
            f"w {list(w.shape)}, offs {list(offs.shape)}"
        )
    if x.dtype != w.dtype:
        raise ValueError(f"grouped_mm needs x and w in one dtype; got x {x.dtype}, w {w.dtype}")
    return _grouped_mm(x, w, offs.to(torch.int32))
