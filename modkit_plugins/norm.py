"""Norms: ``layernorm``, ``rmsnorm`` and ``l2norm``. ``[batch, seq, dim] -> [batch, seq, dim]``.

Statistics are computed in float32 whatever the input dtype and the result is cast back (pytorch #133085:
fp16 RMSNorm of 300.0 overflows without the upcast).

``layernorm`` and ``rmsnorm`` also take ``BuildContext.groups`` (capability ``groups``): the input is then
``[..., groups, dim]`` and each group has its own weight (and bias), ``[groups, dim]``, with the statistics still over
the last ``dim`` features: Cohere's per-head QK LayerNorm (transformers ``CohereLayerNorm`` with a tuple
``hidden_size``). ``l2norm`` has no parameters.

References: LayerNorm, Ba et al. 2016 (arXiv:1607.06450); RMSNorm, Zhang & Sennrich 2019
(arXiv:1910.07467); the ``1 + weight`` form follows Gemma (google-deepmind/gemma, ``RMSNorm``); ``l2norm`` is Llama 4's
weightless QK-norm (transformers ``Llama4TextL2Norm``).
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    BuildContext,
    Component,
    ComponentConfig,
    elementwise,
    Epsilon,
    hookimpl,
    Init,
    MAX_EPS,
    MIN_EPS,
)


#: what the description of an epsilon adds: its bound (modkit.core.limits) and why
_EPS = (
    f"; within [{MIN_EPS:g}, {MAX_EPS:g}]: published models use 1e-12-1e-5, and a smaller eps is 0 in float32 (a "
    "constant row then divides 0 by 0)"
)


class L2NormConfig(ComponentConfig):
    """Config of ``l2norm``: ``y = x / sqrt(mean(x²) + eps)``, no parameters (Llama 4's ``use_qk_norm``)."""

    type: Literal["l2norm"] = "l2norm"
    eps: Epsilon = Field(
        1e-6, description="added to the mean square before the square root (Llama 4: rms_norm_eps)" + _EPS
    )


class LayerNormConfig(ComponentConfig):
    """Config of ``layernorm``: ``y = (x - mean) / sqrt(var + eps) * weight + bias``."""

    type: Literal["layernorm"] = "layernorm"
    eps: Epsilon = Field(1e-5, description="added to the variance before the square root" + _EPS)
    bias: bool = Field(True, description="learnable bias (beta); false for bias-free LayerNorm")


class RMSNormConfig(ComponentConfig):
    """Config of ``rmsnorm``: ``y = x / sqrt(mean(x²) + eps) * weight`` (or ``* (1 + weight)``)."""

    type: Literal["rmsnorm"] = "rmsnorm"
    eps: Epsilon = Field(1e-6, description="added to the mean square before the square root" + _EPS)
    unit_offset: bool = Field(
        False, description="scale by (1 + weight) with weight initialised to 0 (Gemma); false: weight initialised to 1"
    )


def _float32(t: Tensor) -> Tensor:
    """``t`` in float32; a float32 tensor is returned as is, without a dispatch of ``.float()``."""
    return t if t.dtype == torch.float32 else t.float()


def _shape(dim: int, groups: Optional[int]) -> tuple[int, ...]:
    """Shape of a norm's parameters: ``[dim]``, or ``[groups, dim]`` with separate parameters per group."""
    return (dim,) if groups is None else (groups, dim)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, statistics in float32. Shape ``[..., dim] -> [..., dim]``.

    With ``groups`` the input is ``[..., groups, dim]`` and ``weight`` / ``bias`` are ``[groups, dim]`` (one set per
    group, e.g. per attention head: Cohere); the statistics are over the last ``dim`` features either way.
    """

    #: parameter roles (:mod:`modkit.core.roles`): the scale is a norm gain (per group too), beta a bias
    param_roles = {"weight": "norm_gain", "bias": "bias"}

    def __init__(self, dim: int, eps: float, bias: bool, groups: Optional[int] = None):
        super().__init__()
        self.dim, self.eps, self.groups = dim, eps, groups
        self.weight = nn.Parameter(torch.empty(_shape(dim, groups)))
        self.bias = nn.Parameter(torch.empty(_shape(dim, groups))) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """Normalise ``x [..., dim]`` (``[..., groups, dim]`` with groups); returns the input dtype."""
        bias = self.bias.float() if self.bias is not None else None
        if self.groups is None:
            y = nn.functional.layer_norm(x.float(), (self.dim,), self.weight.float(), bias, self.eps)
        else:  # layer_norm's affine parameters must have the normalised shape: apply the per-group ones after it
            y = nn.functional.layer_norm(x.float(), (self.dim,), None, None, self.eps) * self.weight.float()
            y = y if bias is None else y + bias
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def init_weights(self, init: Init) -> None:
        """weight = 1, bias = 0."""
        init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, statistics in float32. Shape ``[..., dim] -> [..., dim]``.

    With ``groups`` the input is ``[..., groups, dim]`` and ``weight`` is ``[groups, dim]`` (one per group).
    """

    #: parameter roles (:mod:`modkit.core.roles`): a norm gain, per group too (per-head QK-norm weights)
    param_roles = {"weight": "norm_gain"}

    def __init__(self, dim: int, eps: float, unit_offset: bool, groups: Optional[int] = None):
        super().__init__()
        self.dim, self.eps, self.unit_offset = dim, eps, unit_offset
        self.weight = nn.Parameter(torch.empty(_shape(dim, groups)))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise ``x [..., dim]``; returns the input dtype.

        ``x · rsqrt(mean(x²) + eps) · weight`` in float32, the same operations in the same order as transformers'
        ``LlamaRMSNorm`` (so float32 results are bitwise equal). Casts that have nothing to do are skipped and the
        eps is added in place: a decode step runs this 17 times on ``[1, 1, d]``, where each op is a few µs.
        """
        x32 = _float32(x)
        inv_rms = torch.rsqrt((x32 * x32).mean(-1, keepdim=True).add_(self.eps))  # [..., 1]
        w = _float32(self.weight)
        y = x32 * inv_rms * (1.0 + w if self.unit_offset else w)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def init_weights(self, init: Init) -> None:
        """weight = 0 with ``unit_offset`` (so the scale starts at 1), else 1."""
        init.constant_(self.weight, 0.0 if self.unit_offset else 1.0)


class L2Norm(nn.Module):
    """Weightless RMS normalisation ``x · rsqrt(mean(x²) + eps)`` over the last dimension, in float32.

    Shape ``[..., dim] -> [..., dim]``; every vector ends with a root mean square of 1 (an L2 norm of ``sqrt(dim)``).
    The operations of transformers' ``Llama4TextL2Norm`` in its order (float32 results are bitwise equal).
    """

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalise ``x [..., dim]``; returns the input dtype."""
        x32 = _float32(x)
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return y if y.dtype == x.dtype else y.to(x.dtype)


def _dim(ctx: BuildContext) -> int:
    return ctx.dim if ctx.dim is not None else ctx.d_model


def _count(cfg: ComponentConfig, ctx: BuildContext) -> int:
    groups = getattr(ctx, "groups", None) or 1
    return _dim(ctx) * groups * (2 if getattr(cfg, "bias", False) else 1)


#: Key formulas of the docs pages (pymdownx.arithmatex).
_MATH = {
    "layernorm": r"""Over the last dimension ($d$ features of $x$), in float32:

$$y = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot w + b, \qquad \mu = \frac{1}{d}\sum_{i=1}^{d} x_i, \qquad
\sigma^2 = \frac{1}{d}\sum_{i=1}^{d} (x_i - \mu)^2$$

$\epsilon$ = eps, $w$ = weight, $b$ = bias (only with bias: true); the variance is the biased one.""",
    "rmsnorm": r"""Over the last dimension ($d$ features of $x$), in float32:

$$y = \frac{x}{\sqrt{\frac{1}{d}\sum_{i=1}^{d} x_i^2 + \epsilon}} \odot w$$

$\epsilon$ = eps and $w$ = weight, or $1 + w$ with unit_offset (Gemma, whose weight starts at 0). No mean is
subtracted and there is no bias.""",
    "l2norm": r"""Over the last dimension ($d$ features of $x$), in float32, with no parameter:

$$y = \frac{x}{\sqrt{\frac{1}{d}\sum_{i=1}^{d} x_i^2 + \epsilon}}$$

$\epsilon$ = eps. Every vector leaves with a root mean square of 1 (an L2 norm of $\sqrt{d}$, up to $\epsilon$):
RMSNorm without its weight, Llama 4's QK-norm.""",
}


@hookimpl
def register_components(register) -> None:
    """Register ``layernorm``, ``rmsnorm`` and ``l2norm``."""
    # replicated under tensor parallelism (torchtitan without SP); per-group parameters on request (BuildContext.groups)
    caps = {"compile_safe": True, "tp_plan": {}, "groups": True}
    flops = elementwise("a norm is element-wise (statistics over the last dimension, a scale): no matrix product")
    register(
        Component(
            kind="norm",
            type="layernorm",
            config=LayerNormConfig,
            factory=lambda cfg, ctx: LayerNorm(_dim(ctx), cfg.eps, cfg.bias, ctx.groups),
            math=_MATH["layernorm"],
            description="Layer normalisation over the last dimension (mean and variance in float32), "
            "optional bias. [batch, seq, dim] -> [batch, seq, dim].",
            reference="Ba, Kiros & Hinton 2016, Layer Normalization, arXiv:1607.06450",
            capabilities=caps,
            param_count=_count,
            flops=flops,
        )
    )
    register(
        Component(
            kind="norm",
            type="rmsnorm",
            config=RMSNormConfig,
            factory=lambda cfg, ctx: RMSNorm(_dim(ctx), cfg.eps, cfg.unit_offset, ctx.groups),
            math=_MATH["rmsnorm"],
            description="Root-mean-square normalisation over the last dimension (statistics in float32), "
            "scaled by weight or by (1 + weight) as in Gemma. [batch, seq, dim] -> [batch, seq, dim].",
            reference="Zhang & Sennrich 2019, Root Mean Square Layer Normalization, arXiv:1910.07467; "
            "(1 + w) form: Gemma (github.com/google-deepmind/gemma)",
            capabilities=caps,
            param_count=_count,
            flops=flops,
        )
    )
    register(
        Component(
            kind="norm",
            type="l2norm",
            config=L2NormConfig,
            factory=lambda cfg, ctx: L2Norm(cfg.eps),
            math=_MATH["l2norm"],
            description="Weightless RMS normalisation x / sqrt(mean(x²) + eps) over the last dimension (float32): "
            'Llama 4\'s QK-norm (qk_norm: {"type": "l2norm"}). No parameters. [batch, seq, dim] -> [batch, seq, dim].',
            reference="Meta 2025, Llama 4 (transformers Llama4TextL2Norm); Zhang & Sennrich 2019, arXiv:1910.07467 "
            "(RMSNorm, of which this is the weightless form)",
            capabilities={"compile_safe": True, "tp_plan": {}, "groups": True, "stateless": True},
            param_count=lambda cfg, ctx: 0,
            flops=flops,
        )
    )
