"""Gated short convolution: LFM2's convolution layers (``Lfm2ShortConv``).

``[batch, seq, d_model] -> [batch, seq, d_model]``. Per token, ``in_proj`` gives three ``d_model``-wide vectors
``B``, ``C`` and ``x`` (in that order along the features); the product ``B ⊙ x`` goes through a depthwise causal
convolution of kernel ``d_conv`` (LFM2's ``conv_L_cache``), its output is gated by ``C`` and projected back:

    y_t = out_proj( C_t ⊙ Σ_{j<K} w_j ⊙ (B ⊙ x)_{t-K+1+j} )      (plus the convolution's bias when ``bias``)

There is no recurrence beyond the convolution: the layer sees the last ``d_conv`` tokens only.

**State.** Per sequence, whatever the context: the convolution window ``conv [d_model, d_conv - 1]`` (the last
``d_conv - 1`` products ``B ⊙ x``), declared with ``cache_spec`` and continued by :func:`modkit.plugin.causal_conv`,
so decoding one token at a time, or a prefill in pieces, gives the full forward's numbers. Padding tokens
(``inputs.token_mask`` False) feed zeros to the convolution (their ``B ⊙ x`` is zeroed), so left padding is exact.

**Document boundaries.** With ``inputs.documents`` (document-masked packing) no tap of the convolution reaches
before the first token of its document (:func:`modkit.plugin.causal_conv` with the start flags), and the window kept
for the next call holds nothing of an earlier document: each document gives its numbers alone.

References: Liquid AI 2025, LFM2 (the gated short-convolution operator of its hybrid backbone);
transformers ``Lfm2ShortConv`` (modeling_lfm2.py, read, not copied) for the layout ``in_proj -> (B, C, x)``, the
biases (``conv_bias`` on ``in_proj``, the convolution and ``out_proj`` alike) and the default kernel of 3.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    RECURRENT_CAPABILITIES,
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    causal_conv,
    Component,
    ComponentConfig,
    document_starts,
    hookimpl,
    padding_mask,
    Workload,
    zero_padding,
)


class ShortConvConfig(ComponentConfig):
    """Config of ``short_conv`` (LFM2's ``conv`` layers)."""

    type: Literal["short_conv"] = "short_conv"
    d_conv: int = Field(
        3, ge=2, le=64, description="kernel of the causal depthwise convolution, in tokens (LFM2's conv_L_cache: 3)"
    )
    bias: bool = Field(False, description="biases on in_proj, the convolution and out_proj (LFM2's conv_bias: false)")

    def position_geometry(self, ctx):
        """No position scheme acts here (the convolution carries the order)."""
        return None


class ShortConv(nn.Module):
    """The gated short-convolution mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters: ``in_proj`` ``[3 · d_model, d_model]`` (rows: ``B``, ``C``, ``x``), ``conv`` (depthwise, weight
    ``[d_model, 1, d_conv]``), ``out_proj`` ``[d_model, d_model]``; each with a bias of its output width when
    ``bias``. The names and layouts are transformers' ``Lfm2ShortConv``'s, so its weights load as they are.
    """

    #: the depthwise filter is a fixed-fan-in vector (no width multiplier, no Muon step)
    param_roles = {"conv.weight": "vector", "conv.bias": "bias"}

    def __init__(self, cfg: ShortConvConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.d_model, self.d_conv = d, cfg.d_conv
        self.in_proj = nn.Linear(d, 3 * d, bias=cfg.bias)
        self.conv = nn.Conv1d(d, d, cfg.d_conv, groups=d, bias=cfg.bias)
        self.out_proj = nn.Linear(d, d, bias=cfg.bias)

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the convolution window ``conv [d_model, d_conv - 1]`` (cache dtype). Nothing per token."""
        return CacheSpec((CacheEntry("conv", (self.d_model, self.d_conv - 1), growth="sequence"),))

    def init_weights(self, init) -> None:
        """The convolution ``U(±1/sqrt(d_conv))`` (PyTorch's default for its fan-in) with a zero bias; the
        projections are ``nn.Linear`` children initialised by the model's rule."""
        bound = self.d_conv**-0.5
        init.uniform_(self.conv.weight, -bound, bound)
        if self.conv.bias is not None:
            init.zeros_(self.conv.bias)

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """No heads: every channel is its own."""
        return {}

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached window if given."""
        state = inputs.cache_for(self)
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        bx = zero_padding(b * h, padding_mask(inputs.token_mask, x.dtype))  # padding feeds the window zeros
        conv = causal_conv(bx, self.conv, state, starts=document_starts(inputs.documents))
        return self.out_proj(c * conv)


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: ShortConvConfig, ctx: BuildContext) -> int:
    d = ctx.d_model
    return 3 * d * d + d * cfg.d_conv + d * d + cfg.bias * (3 * d + d + d)


def _flops(cfg: ShortConvConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call on ``work.tokens`` rows (what ``FlopCounterMode`` counts; the gates are
    element-wise): ``in_proj`` ``2 · t · d · 3d``, the convolution ``2 · t · d · d_conv``, ``out_proj`` ``2 · t · d²``.
    Constant per token in the cached context."""
    d, t = ctx.d_model, work.tokens
    return {"in_proj": 2 * t * d * 3 * d, "conv": 2 * t * d * cfg.d_conv, "out_proj": 2 * t * d * d}


_MATH = r"""With $[B_t; C_t; x_t] = W_{in} h_t$ (three vectors of $d$ = d_model) and a depthwise filter $w \in
\mathbb{R}^{d \times K}$ ($K$ = d_conv):

$$y_t = W_{out} \Big( C_t \odot \sum_{j=0}^{K-1} w_{j} \odot (B \odot x)_{t-K+1+j} \Big)$$

(taps before the first token, or before the token's document, read 0). The cache keeps the last $K - 1$ products
$B \odot x$ per sequence: $d (K - 1)$ numbers, whatever the context."""


@hookimpl
def register_components(register) -> None:
    """Register ``short_conv`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="short_conv",
            config=ShortConvConfig,
            factory=lambda cfg, ctx: ShortConv(cfg, ctx),
            description="Gated short convolution (LFM2's conv layers): in_proj to B, C, x; a depthwise causal "
            "convolution of kernel d_conv over B * x, gated by C; out_proj. [batch, seq, d_model] -> [batch, seq, "
            "d_model]; the cache holds the last d_conv - 1 convolution inputs per sequence.",
            reference="Liquid AI 2025, LFM2; transformers Lfm2ShortConv (modeling_lfm2.py)",
            capabilities=dict(RECURRENT_CAPABILITIES),  # a sequence shard would start from an empty window
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={"type": "short_conv", "d_conv": 3},
        )
    )
