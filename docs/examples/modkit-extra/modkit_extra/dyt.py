"""``norm/dyt``: Dynamic Tanh, a drop-in replacement for LayerNorm / RMSNorm. ``[..., dim] -> [..., dim]``.

    y = weight * tanh(alpha * x) + bias

``alpha`` is one learnable scalar (initialised to ``alpha_init``, 0.5 by default), ``weight`` and ``bias`` are
per-channel vectors initialised to 1 and 0. DyT computes no statistics over the features: the tanh squashes
extreme activations the way a norm does. The arithmetic runs in float32 and the result is cast back to the
input dtype (the contract kit checks that the dtype is preserved).

Reference: Zhu, Chen, He, LeCun & Liu 2025, Transformers without Normalization, arXiv:2503.10622
(``DynamicTanh`` in the paper's code: ``alpha = ones(1) * alpha_init_value``, ``weight = ones(dim)``,
``bias = zeros(dim)``).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init


class DyTConfig(ComponentConfig):
    """Config of ``dyt``: ``y = weight * tanh(alpha * x) + bias``."""

    type: Literal["dyt"] = "dyt"
    alpha_init: float = Field(
        0.5, gt=0, description="initial value of the learnable scalar alpha (the paper uses 0.5 for most models)"
    )


class DyT(nn.Module):
    """Dynamic Tanh over the last dimension. ``forward(x [..., dim]) -> [..., dim]`` in the dtype of ``x``.

    Parameters: ``alpha [1]``, ``weight [dim]``, ``bias [dim]``.
    """

    #: what each parameter is (modkit.core.roles): optimizers, weight decay and muP read these, never the names
    param_roles = {"alpha": "vector", "weight": "norm_gain", "bias": "bias"}

    def __init__(self, dim: int, alpha_init: float):
        super().__init__()
        self.dim, self.alpha_init = dim, alpha_init
        # Shapes only: modkit builds on the meta device first and fills every value in init_weights.
        self.alpha = nn.Parameter(torch.empty(1))
        self.weight = nn.Parameter(torch.empty(dim))
        self.bias = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        """``weight * tanh(alpha * x) + bias``, computed in float32, returned in ``x.dtype``."""
        y = torch.tanh(self.alpha.float() * x.float())
        return (y * self.weight.float() + self.bias.float()).to(x.dtype)

    def init_weights(self, init: Init) -> None:
        """alpha = alpha_init, weight = 1, bias = 0 (every direct parameter goes through ``init``)."""
        init.constant_(self.alpha, self.alpha_init)
        init.ones_(self.weight)
        init.zeros_(self.bias)

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha_init={self.alpha_init}"


def _dim(ctx: BuildContext) -> int:
    # A norm acts on d_model, except where the model asks for another width (per-head QK-norm: head_dim).
    return ctx.dim if ctx.dim is not None else ctx.d_model


def build_dyt(cfg: DyTConfig, ctx: BuildContext) -> DyT:
    """Factory: a :class:`DyT` over ``ctx.dim`` (or ``d_model``)."""
    return DyT(_dim(ctx), cfg.alpha_init)


def dyt_param_count(cfg: DyTConfig, ctx: BuildContext) -> int:
    """``2 * dim + 1``: weight, bias and the scalar alpha."""
    return 2 * _dim(ctx) + 1


DYT = Component(
    kind="norm",
    type="dyt",
    config=DyTConfig,
    factory=build_dyt,
    description="Dynamic Tanh in place of a norm: weight * tanh(alpha * x) + bias with a learnable scalar alpha "
    "and per-channel weight and bias; no statistics, float32 math, output in the input dtype. "
    "[batch, seq, dim] -> [batch, seq, dim].",
    reference="Zhu et al. 2025, Transformers without Normalization, arXiv:2503.10622",
    capabilities={"compile_safe": True},
    param_count=dyt_param_count,
    example={"type": "dyt", "alpha_init": 0.5},
)
