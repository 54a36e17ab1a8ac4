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


# ------------------------------------------------ products over a latent cache (multi-head latent attention decode)


def _cache_products_available() -> bool:
    """Whether :func:`latent_scores` / :func:`latent_sum` can use oneDNN: :func:`onednn_available` and the input
    gradient of oneDNN's linear (``aten.mkldnn_linear_backward_input``)."""
    try:
        return onednn_available() and hasattr(torch.ops.aten, "mkldnn_linear_backward_input")
    except (AttributeError, RuntimeError):  # an operator namespace that does not resolve
        return False


_ONEDNN = _cache_products_available()


def _register_flop_formulas() -> None:
    """Teach ``torch.utils.flop_counter`` (``FlopCounterMode``, which the contract kit's ``flops`` check and
    ``modkit cost`` measure with) the FLOPs of the two oneDNN products used here: it counts only operators with a
    registered formula, and counted these as 0. ``mkldnn._linear_pointwise(x [..., in], w [out, in])``: ``2 ·
    rows · out · in``; ``mkldnn_linear_backward_input(size, g [n, out], w [out, in])``: ``2 · n · out · in``.
    Nothing is registered where torch has its own formula or the operators are missing."""
    from math import prod

    from torch.utils.flop_counter import flop_registry, register_flop_formula

    ops = (torch.ops.mkldnn._linear_pointwise, torch.ops.aten.mkldnn_linear_backward_input)
    if any(op in flop_registry for op in ops):
        return

    @register_flop_formula(ops[0])
    def _linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * prod(x_shape[:-1]) * w_shape[0] * w_shape[1]

    @register_flop_formula(ops[1])
    def _input_grad_flops(size, g_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        return 2 * prod(g_shape[:-1]) * w_shape[0] * w_shape[1]


if _ONEDNN:
    _register_flop_formulas()


def _onednn_scores(q: Tensor, ckv: Tensor) -> Tensor:
    """``q [n, k] @ ckv [kv, k]ᵀ -> [n, kv]`` through oneDNN's matmul (float32, CPU, both contiguous)."""
    return torch.ops.mkldnn._linear_pointwise(q, ckv, None, "none", [], "")


def _onednn_sum(p: Tensor, ckv: Tensor) -> Tensor:
    """``p [n, kv] @ ckv [kv, k] -> [n, k]`` through oneDNN (float32, CPU, ``ckv`` contiguous): the input gradient of
    a linear map whose weight is ``ckv``, which oneDNN computes reading ``ckv`` where it lies (the forward product
    would need it transposed). ``p`` is the small operand converted to oneDNN's layout and back."""
    return torch.ops.aten.mkldnn_linear_backward_input(p.shape[:1] + ckv.shape[1:], p.to_mkldnn(), ckv).to_dense()


# custom ops, so that ``torch.compile`` calls them as they are (Inductor has no lowering of oneDNN's linear for a
# plain weight); eager calls the functions themselves, without the op's dispatch (about 15 µs a call)
_SCORES_OP = torch.library.custom_op("modkit::mla_latent_scores", _onednn_scores, mutates_args=())
_SUM_OP = torch.library.custom_op("modkit::mla_latent_sum", _onednn_sum, mutates_args=())
_SCORES_OP.register_fake(lambda q, ckv: q.new_empty(q.shape[0], ckv.shape[0]))
_SUM_OP.register_fake(lambda p, ckv: p.new_empty(p.shape[0], ckv.shape[1]))


def _onednn_fits(a: Tensor, ckv: Tensor) -> bool:
    """Whether :func:`_onednn_scores` / :func:`_onednn_sum` take ``a [b, n, ·]`` against ``ckv [b, kv, k]``, one
    sequence at a time: float32 on the CPU, the cache contiguous, no gradient to carry."""
    return (
        _ONEDNN
        and a.dtype == ckv.dtype == torch.float32
        and a.device.type == ckv.device.type == "cpu"
        and ckv.is_contiguous()
        and not (torch.is_grad_enabled() and (a.requires_grad or ckv.requires_grad))
    )


def _per_sequence(fn, a: Tensor, ckv: Tensor) -> Tensor:
    """``fn(a[i], ckv[i])`` for each sequence ``i``, stacked: ``[b, n, ·]`` (oneDNN's products take one sequence;
    for the scores, a loop over a batch of 2-8 decoding sequences ran faster than MKL's batched ``bmm`` here)."""
    if a.shape[0] == 1:
        return fn(a[0].contiguous(), ckv[0])[None]
    return torch.stack([fn(a[i].contiguous(), ckv[i]) for i in range(a.shape[0])])


def latent_sum(p: Tensor, ckv: Tensor, width: int) -> Tensor:
    """``p @ ckv[..., :width]``: ``p [b, n, kv]``, ``ckv [b, kv, k]`` -> ``[b, n, width]`` (the weighted sum of the
    cached latents, ``width = r_kv``).

    One sequence where :func:`_onednn_fits` runs through oneDNN, which reads the cache only where it lies: it
    computes all ``k`` columns of the cached rows and drops the rotated key's (``k / width`` times the FLOPs ``mla``
    declares, 1.125 at DeepSeek's sizes; about twice as fast as ``bmm`` here all the same). A product over the first
    ``width`` columns alone took 346 ms against 0.2 ms (oneDNN copied and reordered the strided weight at every
    call). A batch, and anything else, takes ``bmm`` over the ``width`` columns: the declared FLOPs exactly.
    """
    if p.shape[0] == 1 and _onednn_fits(p, ckv):
        fn = _SUM_OP if torch.compiler.is_compiling() else _onednn_sum
        return fn(p[0].contiguous(), ckv[0])[None, :, :width]
    return torch.bmm(p, ckv[..., :width])


def latent_scores(q: Tensor, ckv: Tensor, base: Optional[Tensor]) -> Tensor:
    """``base + q @ ckvᵀ``: ``q [b, n, k]``, ``ckv [b, kv, k]``, ``base`` broadcastable to ``[b, n, kv]`` or ``None``
    -> ``[b, n, kv]`` (the absorbed scores: ``n = h·s`` query rows against every cached latent and rotated key).

    Float32 on the CPU, outside autograd, runs through oneDNN's matmul one sequence at a time: its AVX-512 kernels
    read each ``[kv, k]`` cache as the weight of a linear map, where MKL's batched GEMM takes its AVX2 path on AMD
    CPUs and reaches about half the speed with 8 rows (``benchmarks/results_mla.md``). Anything else (another dtype
    or device, a gradient) goes through ``baddbmm``; the two differ by float rounding only.
    """
    if _onednn_fits(q, ckv):
        fn = _SCORES_OP if torch.compiler.is_compiling() else _onednn_scores
        out = _per_sequence(fn, q, ckv)
        return out if base is None else out + base
    kt = ckv.transpose(1, 2)
    return torch.bmm(q, kt) if base is None else torch.baddbmm(base, q, kt)
