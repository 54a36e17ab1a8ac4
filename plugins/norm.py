"""Norms: ``layernorm`` and ``rmsnorm``. ``[batch, seq, dim] -> [batch, seq, dim]``.

Statistics are computed in float32 whatever the input dtype and the result is cast back (pytorch #133085:
fp16 RMSNorm of 300.0 overflows without the upcast).

References: LayerNorm, Ba et al. 2016 (arXiv:1607.06450); RMSNorm, Zhang & Sennrich 2019
(arXiv:1910.07467); the ``1 + weight`` form follows Gemma (google-deepmind/gemma, ``RMSNorm``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit import BuildContext, Component, ComponentConfig, Init, elementwise, hookimpl


class LayerNormConfig(ComponentConfig):
    """Config of ``layernorm``: ``y = (x - mean) / sqrt(var + eps) * weight + bias``."""

    type: Literal["layernorm"] = "layernorm"
    eps: float = Field(1e-5, gt=0, description="added to the variance before the square root")
    bias: bool = Field(True, description="learnable bias (beta); false for bias-free LayerNorm")


class RMSNormConfig(ComponentConfig):
    """Config of ``rmsnorm``: ``y = x / sqrt(mean(x²) + eps) * weight`` (or ``* (1 + weight)``)."""

    type: Literal["rmsnorm"] = "rmsnorm"
    eps: float = Field(1e-6, gt=0, description="added to the mean square before the square root")
    unit_offset: bool = Field(
        False, description="scale by (1 + weight) with weight initialised to 0 (Gemma); false: weight initialised to 1"
    )


def _float32(t: Tensor) -> Tensor:
    """``t`` in float32; a float32 tensor is returned as is, without a dispatch of ``.float()``."""
    return t if t.dtype == torch.float32 else t.float()


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, statistics in float32. Shape ``[..., dim] -> [..., dim]``."""

    #: parameter roles (:mod:`modkit.roles`): the scale is a norm gain, beta a bias
    param_roles = {"weight": "norm_gain", "bias": "bias"}

    def __init__(self, dim: int, eps: float, bias: bool):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """Normalise ``x [..., dim]``; returns the input dtype."""
        bias = self.bias.float() if self.bias is not None else None
        y = nn.functional.layer_norm(x.float(), (self.dim,), self.weight.float(), bias, self.eps)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def init_weights(self, init: Init) -> None:
        """weight = 1, bias = 0."""
        init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, statistics in float32. Shape ``[..., dim] -> [..., dim]``."""

    #: parameter roles (:mod:`modkit.roles`)
    param_roles = {"weight": "norm_gain"}

    def __init__(self, dim: int, eps: float, unit_offset: bool):
        super().__init__()
        self.dim, self.eps, self.unit_offset = dim, eps, unit_offset
        self.weight = nn.Parameter(torch.empty(dim))

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


def _dim(ctx: BuildContext) -> int:
    return ctx.dim if ctx.dim is not None else ctx.d_model


def _count(cfg: ComponentConfig, ctx: BuildContext) -> int:
    return _dim(ctx) * (2 if getattr(cfg, "bias", False) else 1)


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
}

@hookimpl
def register_components(register) -> None:
    """Register ``layernorm`` and ``rmsnorm``."""
    caps = {"compile_safe": True, "tp_plan": {}}  # replicated under tensor parallelism (torchtitan without SP)
    flops = elementwise("a norm is element-wise (statistics over the last dimension, a scale): no matrix product")
    register(
        Component(
            kind="norm",
            type="layernorm",
            config=LayerNormConfig,
            factory=lambda cfg, ctx: LayerNorm(_dim(ctx), cfg.eps, cfg.bias),
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
            factory=lambda cfg, ctx: RMSNorm(_dim(ctx), cfg.eps, cfg.unit_offset),
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
