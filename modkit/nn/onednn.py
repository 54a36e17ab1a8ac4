"""``nn.Linear`` through oneDNN on the CPU: the same product, about twice torch's default float32 throughput where
torch's BLAS (MKL) does not run its fastest kernels (measured on an AMD EPYC with AVX-512: 230-260 GFLOP/s against
105-120 on one thread at the shapes of nanoGPT's CPU recipe; ``benchmarks/results_train_vs_loop.md``).

torch runs a float32 ``nn.Linear`` on the CPU through MKL's ``sgemm``; oneDNN's matmul (a library torch already
ships and links) computes the same ``y = x Wᵀ + b`` with its own just-in-time kernels. :func:`use_onednn_linears` switches a model's plain
``nn.Linear`` modules to :class:`OneDNNLinear`, whose forward and backward (``dx = dy W``, ``dW = dyᵀ x``,
``db = Σ dy``: the backward of a linear map) run through oneDNN. Results differ from MKL's by float rounding
only (the summation order of each dot product); parameters, state dicts and ``isinstance(m, nn.Linear)`` are
unchanged, and :func:`restore_linears` switches them back.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable


def onednn_available() -> bool:
    """Whether this torch build can run :class:`OneDNNLinear` (oneDNN built in and its linear operator present)."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        return hasattr(torch.ops.mkldnn, "_linear_pointwise")
    except (AttributeError, RuntimeError):  # an operator namespace that does not resolve
        return False


def _matmul_t(a: Tensor, b: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``a [m, k] @ b [n, k]ᵀ (+ bias [n]) -> [m, n]`` through oneDNN (strided ``a`` and ``b`` are read in place)."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _LinearFunction(torch.autograd.Function):
    """``y = x Wᵀ + b`` and its backward, each product through oneDNN; ``x [..., in] -> y [..., out]``."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Optional[Tensor]) -> Tensor:
        rows = x.reshape(-1, x.shape[-1])
        ctx.save_for_backward(rows, weight)
        ctx.in_shape = x.shape
        return _matmul_t(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
        rows, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        dx = _matmul_t(g, weight.t()).view(ctx.in_shape) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:  # oneDNN copies a transposed left operand: copy the narrower of dy and x
            wide = g.shape[1] > rows.shape[1]
            dw = _matmul_t(rows.t(), g.t()).t().contiguous() if wide else _matmul_t(g.t(), rows.t())
        db = g.sum(0) if ctx.needs_input_grad[2] else None
        return dx, dw, db


class OneDNNLinear(nn.Linear):
    """An ``nn.Linear`` whose float32 CPU forward and backward run through oneDNN (:mod:`modkit.nn.onednn`);
    ``[..., in_features] -> [..., out_features]``. Any other input (another dtype or device, under autocast, a
    tensor subclass) takes ``nn.Linear``'s own path."""

    def forward(self, x: Tensor) -> Tensor:
        """``x [..., in_features] -> x Wᵀ + b [..., out_features]`` (oneDNN on a float32 CPU input)."""
        w = self.weight
        if (
            x.device.type == "cpu"
            and x.dtype == w.dtype == torch.float32
            and w.device.type == "cpu"
            and type(x) is Tensor
            and type(w) in (Tensor, nn.Parameter)
            and x.numel()
            and not torch.is_autocast_enabled("cpu")
        ):
            return _LinearFunction.apply(x, w, self.bias)
        return super().forward(x)


def use_onednn_linears(model: nn.Module) -> int:
    """Switch every plain ``nn.Linear`` of ``model`` (exactly that class: subclasses keep their own forward) to
    :class:`OneDNNLinear`, in place; returns how many were switched (0 when :func:`onednn_available` is false)."""
    if not onednn_available():
        return 0
    n = 0
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
            n += 1
    return n


def restore_linears(model: nn.Module) -> int:
    """Undo :func:`use_onednn_linears`: every :class:`OneDNNLinear` of ``model`` is an ``nn.Linear`` again;
    returns how many."""
    n = 0
    for module in model.modules():
        if type(module) is OneDNNLinear:
            module.__class__ = nn.Linear
            n += 1
    return n
