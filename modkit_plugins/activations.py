"""Activation components (kind ``activation``): element-wise maps ``[..., d] -> [..., d]`` that an ``mlp`` FFN
takes in its ``activation_unit`` slot, in place of a named ``activation``, when the map has a name of its own or
learned scalars.

* ``relu2``: ``relu(x)²`` (Primer; Arcee's AFM ``hidden_act: "relu2"``, transformers ``ReLUSquaredActivation``).
* ``xielu``: xIELU, a piecewise map with two learned scalars (Apertus' ``hidden_act: "xielu"``, transformers
  ``XIELUActivation``)::

      a_p = softplus(alpha_p),  a_n = beta + softplus(alpha_n)
      xielu(x) = a_p · x² + beta · x                          for x > 0
               = a_n · (expm1(min(x, eps)) - x) + beta · x    for x <= 0

  ``alpha_p`` and ``alpha_n`` are parameters of shape ``[1]`` (stored through softplus, as the reference does:
  ``alpha_p = log(expm1(alpha_p_init))``, ``alpha_n = log(expm1(alpha_n_init - beta))``); ``beta`` and ``eps`` are
  buffers (saved with the weights: a checkpoint's values are the ones used).

These components are registered by the ``ffn`` plugin (:mod:`modkit_plugins.ffn`), the only built-in host of an
activation slot. References: So et al. 2021, Primer: Searching for Efficient Transformers for Language Modeling,
arXiv:2109.08668 (squared ReLU); Huang & Schlag 2024, Deriving Activation Functions Using Integration,
arXiv:2411.13010 (xIELU), and its reference implementation transformers ``activations.XIELUActivation``
(``_xielu_python``), whose operations this module follows in the same order.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init, elementwise


class ReLU2Config(ComponentConfig):
    """Config of ``relu2``: ``relu(x)²``."""

    type: Literal["relu2"] = "relu2"


class XIELUConfig(ComponentConfig):
    """Config of ``xielu``: the initial values of its learned scalars and its fixed ``beta`` and ``eps``."""

    type: Literal["xielu"] = "xielu"
    alpha_p_init: float = Field(
        0.8, gt=0, le=1e4, allow_inf_nan=False, description="initial softplus(alpha_p), the slope of the x² branch"
    )
    alpha_n_init: float = Field(
        0.8,
        gt=0,
        le=1e4,
        allow_inf_nan=False,
        description="initial beta + softplus(alpha_n), the scale of the negative branch; must exceed beta",
    )
    beta: float = Field(0.5, ge=0, le=1e4, allow_inf_nan=False, description="the linear term beta · x of both branches")
    eps: float = Field(
        -1e-6, le=0, ge=-1.0, allow_inf_nan=False, description="the negative branch uses expm1(min(x, eps))"
    )

    @model_validator(mode="after")
    def _check(self) -> "XIELUConfig":
        if self.alpha_n_init <= self.beta:
            raise ValueError(
                f"alpha_n_init = {self.alpha_n_init:g} must exceed beta = {self.beta:g} (alpha_n is stored as "
                "softplus^-1(alpha_n_init - beta)); raise alpha_n_init or lower beta"
            )
        return self


class ReLU2(nn.Module):
    """``relu(x)²``, shape ``[..., d] -> [..., d]`` (So et al. 2021, arXiv:2109.08668)."""

    def forward(self, x: Tensor) -> Tensor:
        """``relu(x)²`` as transformers ``ReLUSquaredActivation`` computes it (``relu`` then ``square``)."""
        return torch.square(nn.functional.relu(x))


def _softplus_inverse(y: float) -> float:
    """``log(expm1(y))``: the raw value whose softplus is ``y`` (``y > 0``)."""
    return math.log(math.expm1(y))


class XIELU(nn.Module):
    """xIELU, shape ``[..., d] -> [..., d]`` (Huang & Schlag 2024, arXiv:2411.13010; transformers
    ``XIELUActivation._xielu_python``).

    Parameters ``alpha_p [1]``, ``alpha_n [1]`` (raw, read through softplus); buffers ``beta``, ``eps`` (0-d).
    """

    def __init__(self, cfg: XIELUConfig):
        super().__init__()
        self.cfg = cfg
        self.alpha_p = nn.Parameter(torch.full((1,), _softplus_inverse(cfg.alpha_p_init)))
        self.alpha_n = nn.Parameter(torch.full((1,), _softplus_inverse(cfg.alpha_n_init - cfg.beta)))
        self.register_buffer("beta", torch.tensor(float(cfg.beta)))
        self.register_buffer("eps", torch.tensor(float(cfg.eps)))

    #: both learned scalars are per-tensor scalars (no decay, vector learning rate)
    param_roles = {"alpha_p": "vector", "alpha_n": "vector"}

    def forward(self, x: Tensor) -> Tensor:
        """``a_p·x² + beta·x`` for ``x > 0``, ``a_n·(expm1(min(x, eps)) - x) + beta·x`` elsewhere."""
        alpha_p = nn.functional.softplus(self.alpha_p)
        alpha_n = self.beta + nn.functional.softplus(self.alpha_n)
        return torch.where(
            x > 0,
            alpha_p * x * x + self.beta * x,
            (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x,
        )

    def init_weights(self, init: Init) -> None:
        """The configured initial values (the reference's constructor)."""
        init.constant_(self.alpha_p, _softplus_inverse(self.cfg.alpha_p_init))
        init.constant_(self.alpha_n, _softplus_inverse(self.cfg.alpha_n_init - self.cfg.beta))
        init.constant_(self.beta, float(self.cfg.beta))
        init.constant_(self.eps, float(self.cfg.eps))


_MATH = {
    "relu2": r"""$$\mathrm{relu2}(x) = \max(x, 0)^2$$

Element-wise (So et al. 2021, Primer, arXiv:2109.08668).""",
    "xielu": r"""$$\mathrm{xIELU}(x) = \begin{cases} \alpha_p x^2 + \beta x & x > 0 \\
\alpha_n\,(\mathrm{expm1}(\min(x, \epsilon)) - x) + \beta x & x \le 0 \end{cases}, \qquad
\alpha_p = \mathrm{softplus}(a_p),\ \alpha_n = \beta + \mathrm{softplus}(a_n)$$

$a_p, a_n$ learned scalars; $\beta$ = beta (0.5) and $\epsilon$ = eps ($-10^{-6}$) fixed buffers (Huang & Schlag
2024, arXiv:2411.13010).""",
}


def components() -> list[Component]:
    """The ``activation`` entries: ``relu2`` and ``xielu``."""
    flops = elementwise("an activation is element-wise: no matrix product")
    return [
        Component(
            kind="activation",
            type="relu2",
            config=ReLU2Config,
            factory=lambda cfg, ctx: ReLU2(),
            description="Squared ReLU relu(x)^2, element-wise. [..., d] -> [..., d].",
            reference="So et al. 2021, Primer, arXiv:2109.08668 (transformers ReLUSquaredActivation)",
            capabilities={"compile_safe": True},
            param_count=lambda cfg, ctx: 0,
            flops=flops,
            example={"type": "relu2"},
            math=_MATH["relu2"],
        ),
        Component(
            kind="activation",
            type="xielu",
            config=XIELUConfig,
            factory=lambda cfg, ctx: XIELU(cfg),
            description="xIELU: alpha_p x^2 + beta x for x > 0, alpha_n (expm1(min(x, eps)) - x) + beta x otherwise, "
            "with two learned scalars read through softplus. [..., d] -> [..., d].",
            reference="Huang & Schlag 2024, Deriving Activation Functions Using Integration, arXiv:2411.13010 "
            "(transformers XIELUActivation)",
            capabilities={"compile_safe": True},
            param_count=_xielu_count,
            flops=flops,
            example={"type": "xielu"},
            math=_MATH["xielu"],
        ),
    ]


def _xielu_count(cfg: XIELUConfig, ctx: BuildContext) -> int:
    """``alpha_p`` and ``alpha_n``: 2."""
    return 2
