"""The ``sparsemixer`` router of the ``moe`` FFN: Phi-3.5-MoE's SparseMixer top-2 routing.

``forward(x [tokens, d_model], token_mask=None) -> (weights [tokens, 2], indices [tokens, 2] int64, logits [tokens,
n_experts] float32)``, the router contract of :mod:`modkit.core.interfaces`. For float32 logits ``z = W_r x`` and
``ε`` = ``jitter_eps``, the experts are picked one after the other, each weighted by a softmax over only the experts
whose logit lies close to the best one::

    e1   = argmax_j z_j
    keep = {j : (z_e1 - z_j) / max(|z_j|, z_e1) <= 2ε}
    w1   = softmax(z restricted to keep)[e1]
    z'   = z with z_e1 = -inf
    e2   = argmax_j z'_j
    keep = {j : (z'_e2 - z_j) / max(|z_j|, z'_e2) <= 2ε}
    w2   = softmax(z' restricted to keep)[e2]

so an expert far behind the best one contributes nothing to the normaliser: with a clear winner ``w1`` is 1, with a
tie it is 1/2. Always two experts (transformers ``sparsemixer`` returns two whatever ``num_experts_per_tok``).

Training: SparseMixer (Liu et al. 2023) samples the experts with Gumbel noise in training and estimates the routing
gradient with Heun's third-order method (transformers ``PhimoeMultiplier``); this router keeps the deterministic
choice above in training too and lets the gradient flow through the two softmaxes (the weights), so its training is
that of a top-2 router, not SparseMixer's estimator.

References: Liu et al. 2023, Sparse Backpropagation for MoE Training (SparseMixer, arXiv:2310.00811); Microsoft 2024,
Phi-3 Technical Report (Phi-3.5-MoE, arXiv:2404.14219; GRIN MoE, arXiv:2409.12136); transformers
``phimoe.modeling_phimoe.sparsemixer`` (its evaluation branch) for the exact form.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Workload

from .routers import TopKRouter, _router_sizes


class SparseMixerRouterConfig(ComponentConfig):
    """Config of the ``sparsemixer`` router (``n_experts`` comes from the enclosing ``moe``, whose ``top_k`` must be 2)."""

    type: Literal["sparsemixer"] = "sparsemixer"
    jitter_eps: float = Field(
        0.01,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="ε of the keep threshold: an expert joins the softmax normaliser of a pick when its logit is "
        "within a relative 2ε of the picked one (Phi-3.5-MoE's router_jitter_noise: 0.01); 0: only ties join",
    )
    bias: bool = Field(False, description="bias on the router projection (Phi-3.5-MoE: none)")


def sparsemixer_route(logits: Tensor, jitter_eps: float) -> tuple[Tensor, Tensor]:
    """The two SparseMixer picks of float32 ``logits [..., n_experts]``: ``(weights [..., 2], indices [..., 2])``.

    The threshold of each pick reads the original logits: expert ``j`` is masked when ``(m - z_j) / max(|z_j|, m) >
    2ε``, ``m`` the pick's best logit (transformers ``sparsemixer``: ``factor = scores.abs().clamp(min=m)``).
    """
    out_w, out_i = [], []
    z = logits
    for _ in range(2):
        with torch.no_grad():
            best, index = z.max(dim=-1, keepdim=True)
            factor = logits.abs().clamp(min=best)
            drop = ((best - logits) / factor) > (2 * jitter_eps)
        gates = torch.softmax(z.masked_fill(drop, float("-inf")), dim=-1)
        out_w.append(gates.gather(-1, index))
        out_i.append(index)
        z = z.scatter(-1, index, float("-inf"))
    return torch.cat(out_w, dim=-1), torch.cat(out_i, dim=-1)


class SparseMixerRouter(TopKRouter):
    """Phi-3.5-MoE's SparseMixer top-2 router (see the module docstring for the formula and its training).

    ``forward(x [..., d_model], token_mask=None) -> (weights [..., 2] in x's dtype, indices [..., 2] int64, logits
    [..., n_experts] float32)``. Loads and the balance-loss probabilities (the softmax) are :class:`TopKRouter`'s.

    Raises:
        ValueError: ``top_k`` other than 2, or fewer than 2 experts.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, jitter_eps: float, bias: bool = False):
        if top_k != 2:
            raise ValueError(
                f"the sparsemixer router always picks 2 experts, but the moe asks for top_k = {top_k}; set top_k 2"
            )
        super().__init__(d_model, n_experts, top_k, False, bias)
        self.jitter_eps = float(jitter_eps)

    def forward(self, x: Tensor, token_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
        """Route ``x [..., d_model]`` (``token_mask [...]`` bool: True for real tokens)."""
        bias = self.proj.bias.float() if self.proj.bias is not None else None
        logits = nn.functional.linear(x.float(), self.proj.weight.float(), bias)
        weights, indices = sparsemixer_route(logits, self.jitter_eps)
        self._count(indices, token_mask)
        return weights.to(x.dtype), indices, logits


def _make(cfg: SparseMixerRouterConfig, ctx: BuildContext) -> SparseMixerRouter:
    n, k = _router_sizes(ctx)
    return SparseMixerRouter(ctx.dim or ctx.d_model, n, k, cfg.jitter_eps, cfg.bias)


def _count(cfg: SparseMixerRouterConfig, ctx: BuildContext) -> int:
    """``n_experts · d_model`` (+ ``n_experts`` with a bias)."""
    n, _ = _router_sizes(ctx)
    return n * (ctx.dim or ctx.d_model) + (n if cfg.bias else 0)


def _flops(cfg: SparseMixerRouterConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """The logits, ``2 · d_model · n_experts`` per token (the picks are not matrix products)."""
    n, _ = _router_sizes(ctx)
    return {"proj": 2 * work.tokens * (ctx.dim or ctx.d_model) * n}


_MATH = r"""For a token $x$, logits $z = W_r\, x$ (float32) and $\varepsilon$ = jitter_eps, two picks: $e_1 = \arg\max_j
z_j$, then $e_2 = \arg\max_{j \ne e_1} z_j$. Pick $i$ with best logit $m_i$ weighs

$$g_{e_i} = \frac{e^{z_{e_i}}}{\sum_{j \in K_i} e^{z_j}}, \qquad K_i = \Big\{ j \notin \{e_1, \ldots, e_{i-1}\} :
\frac{m_i - z_j}{\max(|z_j|, m_i)} \le 2\varepsilon \Big\}$$

so experts far behind the pick leave its normaliser (SparseMixer, Phi-3.5-MoE). Always two experts."""


def register_sparsemixer_router(register, capabilities: dict) -> None:
    """Register the ``sparsemixer`` router (called by :func:`modkit_plugins.routers.register_routers`)."""
    register(
        Component(
            kind="router",
            type="sparsemixer",
            config=SparseMixerRouterConfig,
            factory=_make,
            math=_MATH,
            description="SparseMixer top-2 router (Phi-3.5-MoE): two experts picked in turn, each weighted by a softmax "
            "over only the experts whose logit is within a relative 2 jitter_eps of it. Deterministic in training "
            "too (no Gumbel sampling or Heun estimator). Same outputs as topk; the moe's top_k must be 2.",
            reference="Liu et al. 2023, SparseMixer, arXiv:2310.00811; Microsoft 2024, Phi-3.5-MoE / GRIN MoE, "
            "arXiv:2409.12136 (transformers phimoe sparsemixer)",
            capabilities=capabilities,
            param_count=_count,
            flops=_flops,
            example={"type": "sparsemixer", "jitter_eps": 0.01},
        )
    )
