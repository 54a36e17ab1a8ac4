"""Placements: how a block composes its norms, sublayers and residuals. ``[batch, seq, d_model]`` in and out.

* ``pre``:  ``x = x + attn(norm(x)); x = x + ffn(norm(x))`` (GPT-2, Llama).

References: pre-norm, Xiong et al. 2020, On Layer Normalization in the Transformer Architecture
(arXiv:2002.04745).
"""

from __future__ import annotations

from typing import Literal, Optional

from torch import Tensor, nn

from modkit import AttentionInputs, BuildContext, Component, ComponentConfig, add_aux, hookimpl, split_aux


class PreConfig(ComponentConfig):
    """Config of ``pre``: a norm before each sublayer, residual around it."""

    type: Literal["pre"] = "pre"


class PreNormBlock(nn.Module):
    """``x + attention(attn_norm(x))`` then ``x + ffn(ffn_norm(x))``."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.attn_norm = ctx.build(ctx.norm)
        self.attention = ctx.attention
        self.ffn_norm = ctx.build(ctx.norm)
        self.ffn = ctx.ffn

    def forward(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """Returns ``(x [batch, seq, d_model], aux_loss or None)``."""
        x = x + self.attention(self.attn_norm(x), inputs)
        h, aux = split_aux(self.ffn(self.ffn_norm(x)))
        return x + h, aux


@hookimpl
def register_components(register) -> None:
    """Register the placements."""
    register(
        Component(
            kind="placement",
            type="pre",
            config=PreConfig,
            factory=lambda cfg, ctx: PreNormBlock(ctx),
            description="Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)). Two norms per block.",
            reference="Xiong et al. 2020, On Layer Normalization in the Transformer Architecture, arXiv:2002.04745",
            capabilities={"compile_safe": True},
        )
    )
