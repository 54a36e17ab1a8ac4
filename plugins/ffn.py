"""Dense position-wise FFNs: ``mlp`` (one activation), ``swiglu`` and ``geglu`` (gated).

``[batch, seq, d_model] -> [batch, seq, d_model]``.

* ``mlp``:    ``down(act(up(x)))`` with act in gelu, gelu_tanh, relu, silu (GPT-2 uses gelu_tanh).
* ``swiglu``: ``down(silu(gate(x)) * up(x))`` (Llama, Mistral, Qwen, OLMo).
* ``geglu``:  ``down(gelu_tanh(gate(x)) * up(x))`` (Gemma's ``gelu_pytorch_tanh``; ``activation`` selects exact gelu).

References: Vaswani et al. 2017 (arXiv:1706.03762); Shazeer 2020, GLU Variants Improve Transformer
(arXiv:2002.05202).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt
from torch import Tensor, nn

from modkit import BuildContext, Component, ComponentConfig, hookimpl

ACTIVATIONS = {
    "gelu": lambda x: nn.functional.gelu(x),
    "gelu_tanh": lambda x: nn.functional.gelu(x, approximate="tanh"),
    "relu": nn.functional.relu,
    "silu": nn.functional.silu,
}


class MLPConfig(ComponentConfig):
    """Config of ``mlp``: ``down(act(up(x)))``."""

    type: Literal["mlp"] = "mlp"
    d_ff: PositiveInt = Field(..., description="hidden width")
    activation: Literal["gelu", "gelu_tanh", "relu", "silu"] = Field("gelu", description="activation between the projections")
    bias: bool = Field(True, description="biases on both projections")


class GatedConfig(ComponentConfig):
    """Config of ``swiglu`` / ``geglu``: ``down(act(gate(x)) * up(x))``."""

    type: Literal["swiglu", "geglu"]
    d_ff: PositiveInt = Field(..., description="hidden width")
    bias: bool = Field(False, description="biases on the three projections")
    activation: Literal["gelu", "gelu_tanh", "relu", "silu", None] = Field(
        None, description="gate activation; default silu for swiglu, gelu_tanh for geglu"
    )

    @property
    def act(self) -> str:
        """The effective gate activation."""
        return self.activation or ("silu" if self.type == "swiglu" else "gelu_tanh")


class MLP(nn.Module):
    """Two-layer MLP. ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self._act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """``down(act(up(x)))``."""
        return self.down(self._act(self.up(x)))


class GatedMLP(nn.Module):
    """Gated MLP (SwiGLU/GeGLU). ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, d_ff: int, activation: str, bias: bool):
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=bias)
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.activation = activation
        self._act = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        """``down(act(gate(x)) * up(x))``."""
        return self.down(self._act(self.gate(x)) * self.up(x))


def _mlp_count(cfg: MLPConfig, ctx: BuildContext) -> int:
    d = ctx.dim or ctx.d_model
    return 2 * d * cfg.d_ff + (cfg.d_ff + d if cfg.bias else 0)


def _gated_count(cfg: GatedConfig, ctx: BuildContext) -> int:
    d = ctx.dim or ctx.d_model
    return 3 * d * cfg.d_ff + (2 * cfg.d_ff + d if cfg.bias else 0)


@hookimpl
def register_components(register) -> None:
    """Register ``mlp``, ``swiglu`` and ``geglu``."""
    plan_mlp = {"up": "colwise", "down": "rowwise"}
    plan_gated = {"gate": "colwise", "up": "colwise", "down": "rowwise"}
    register(
        Component(
            kind="ffn",
            type="mlp",
            config=MLPConfig,
            factory=lambda cfg, ctx: MLP(ctx.dim or ctx.d_model, cfg.d_ff, cfg.activation, cfg.bias),
            description="Two-layer position-wise MLP down(act(up(x))) with gelu, gelu_tanh, relu or silu. "
            "[batch, seq, d_model] -> [batch, seq, d_model].",
            reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
            capabilities={"compile_safe": True, "tp_plan": plan_mlp},
            param_count=_mlp_count,
            example={"type": "mlp", "d_ff": 128, "activation": "gelu_tanh"},
        )
    )
    for t, what in (("swiglu", "SiLU"), ("geglu", "GELU (tanh)")):
        register(
            Component(
                kind="ffn",
                type=t,
                config=GatedConfig,
                factory=lambda cfg, ctx: GatedMLP(ctx.dim or ctx.d_model, cfg.d_ff, cfg.act, cfg.bias),
                description=f"Gated MLP down({what}(gate(x)) * up(x)). [batch, seq, d_model] -> [batch, seq, d_model].",
                reference="Shazeer 2020, GLU Variants Improve Transformer, arXiv:2002.05202",
                capabilities={"compile_safe": True, "tp_plan": plan_gated},
                param_count=_gated_count,
                example={"type": t, "d_ff": 96},
            )
        )
