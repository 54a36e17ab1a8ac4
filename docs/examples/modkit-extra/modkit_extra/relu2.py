"""``ffn/relu2``: the squared-ReLU MLP of Primer. ``[batch, seq, d_model] -> [batch, seq, d_model]``.

    y = down(relu(up(x)) ** 2)

``up: d_model -> d_ff`` and ``down: d_ff -> d_model`` are linear layers (optional biases). Squaring the ReLU is
one of the two changes the Primer architecture search found most useful; it needs no gate, so it costs two
matrices where SwiGLU costs three.

Reference: So, Mańke, Liu, Dai, Shazeer & Le 2021, Primer: Searching for Efficient Transformers for Language
Modeling, arXiv:2109.08668.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig


class ReLU2Config(ComponentConfig):
    """Config of ``relu2``: ``down(relu(up(x)) ** 2)``."""

    type: Literal["relu2"] = "relu2"
    d_ff: PositiveInt = Field(..., description="hidden width (Primer keeps the usual 4 * d_model)")
    bias: bool = Field(False, description="biases on both projections")


class ReLU2MLP(nn.Module):
    """Squared-ReLU MLP. ``forward(x [batch, seq, d_model]) -> [batch, seq, d_model]``.

    Parameters: ``up.weight [d_ff, d_model]``, ``down.weight [d_model, d_ff]`` (+ biases ``[d_ff]``, ``[d_model]``).
    The ``nn.Linear`` children need no ``init_weights``: modkit gives them N(0, init_std) weights, zero biases.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``down(relu(up(x)) ** 2)``."""
        return self.down(nn.functional.relu(self.up(x)).square())


def _d_model(ctx: BuildContext) -> int:
    return ctx.dim if ctx.dim is not None else ctx.d_model


def build_relu2(cfg: ReLU2Config, ctx: BuildContext) -> ReLU2MLP:
    """Factory: a :class:`ReLU2MLP` of width ``d_ff``."""
    return ReLU2MLP(_d_model(ctx), cfg.d_ff, cfg.bias)


def relu2_param_count(cfg: ReLU2Config, ctx: BuildContext) -> int:
    """``2 * d_model * d_ff`` (+ ``d_ff + d_model`` with biases)."""
    d = _d_model(ctx)
    return 2 * d * cfg.d_ff + (cfg.d_ff + d if cfg.bias else 0)


RELU2 = Component(
    kind="ffn",
    type="relu2",
    config=ReLU2Config,
    factory=build_relu2,
    description="Squared-ReLU MLP down(relu(up(x))^2), two projections and no gate. "
    "[batch, seq, d_model] -> [batch, seq, d_model].",
    reference="So et al. 2021, Primer: Searching for Efficient Transformers for Language Modeling, arXiv:2109.08668",
    capabilities={"compile_safe": True, "tp_plan": {"up": "colwise", "down": "rowwise"}},
    param_count=relu2_param_count,
    example={"type": "relu2", "d_ff": 128},
)
