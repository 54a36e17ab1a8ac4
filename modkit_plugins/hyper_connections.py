"""``mhc``: manifold-constrained hyper-connections, a residual stream of ``n_streams`` copies (DeepSeek-V4).

Hyper-connections (Zhu et al. 2024, arXiv:2409.19606) replace the residual ``x + f(x)`` by ``n`` copies of the stream
mixed around each sublayer; the manifold-constrained form (Xie et al. 2026, mHC; DeepSeek-V4) computes the mixing
weights from the streams themselves and keeps the stream-to-stream matrix doubly stochastic. For one sublayer ``f``
and the streams ``S [b, s, n, d]`` (``F = S`` flattened to ``[b, s, n·d]`` and RMS-normalised without a gain)::

    pre, post, comb = split(F · fn^T)                 # fn: [(2 + n)·n, n·d]; widths n, n, n·n
    pre  = sigmoid(pre  · scale[0] + base_pre) + eps        # [b, s, n]: how the streams make the sublayer input
    post = 2 · sigmoid(post · scale[1] + base_post)          # [b, s, n]: how its output goes back to each stream
    comb = softmax(comb · scale[2] + base_comb, -1) + eps    # [b, s, n, n], then Sinkhorn: columns, then
                                                            # (rows, columns) sinkhorn_iters - 1 times
    x = Σ_j pre_j · S_j                                      # [b, s, d]: the sublayer input (before its norm)
    S' = post ⊗ f(x) + comb^T · S                            # [b, s, n, d]

The embeddings enter as ``n`` equal copies; the head reads ``Σ_j pre_j · S_j`` with its own ``pre`` (``hc_fn
[n, n·d]``, ``hc_base [n]``, ``hc_scale [1]``) before the final norm. The mixing weights are computed in float32 (float64 for a float64 stream).

Source: transformers' ``DeepseekV4HyperConnection`` and ``DeepseekV4HyperHead``
(``models/deepseek_v4/modeling_deepseek_v4.py``), whose parameter names (``fn``, ``base``, ``scale``; ``hc_fn``,
``hc_base``, ``hc_scale``) and initialisation (``fn`` normal, ``base`` 0, ``scale`` 1) these follow.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init, ResidualStream, hookimpl


class MHCConfig(ComponentConfig):
    """Config of ``mhc``: the number of streams and the constants of the mixing weights."""

    type: Literal["mhc"] = "mhc"
    n_streams: int = Field(4, ge=2, le=64, description="copies of the residual stream (DeepSeek-V4 hc_mult: 4)")
    sinkhorn_iters: int = Field(
        20, ge=1, le=1000, description="Sinkhorn-Knopp normalisations of the stream-mixing matrix (hc_sinkhorn_iters)"
    )
    eps: float = Field(1e-6, gt=0, le=0.1, description="added to the weights and the Sinkhorn sums (hc_eps)")
    norm_eps: float = Field(1e-6, gt=0, le=0.1, description="epsilon of the RMS normalisation of the flat streams")


def _rms(x: Tensor, eps: float) -> Tensor:
    """``x · rsqrt(mean(x²) + eps)`` over the last dimension, without a gain, in ``x``'s dtype (float32 or float64)."""
    return F.rms_norm(x, (x.shape[-1],), eps=eps)


def _wide(t: Tensor) -> torch.dtype:
    """The dtype the mixing weights are computed in: float32, or float64 for a float64 stream."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


class HyperConnection(nn.Module):
    """One sublayer's connection to ``n`` streams of ``d_model``: ``read(s [b, s, n, d]) -> (x [b, s, d], state)``
    and ``write(s, state, y [b, s, d]) -> s'`` (the formulas in the module docstring; transformers'
    ``DeepseekV4HyperConnection``). Parameters ``fn [(2 + n) n, n d]``, ``base [(2 + n) n]``, ``scale [3]``."""

    def __init__(self, d_model: int, cfg: MHCConfig):
        super().__init__()
        n = cfg.n_streams
        self.n, self.cfg = n, cfg
        self.fn = nn.Parameter(torch.empty((2 + n) * n, n * d_model))
        self.base = nn.Parameter(torch.empty((2 + n) * n))
        self.scale = nn.Parameter(torch.empty(3))

    def init_weights(self, init: Init) -> None:
        """``fn`` normal(0, init_std), ``base`` 0, ``scale`` 1 (as transformers initialises DeepSeek-V4)."""
        init.normal_(self.fn)
        init.zeros_(self.base)
        init.ones_(self.scale)

    def param_roles(self) -> dict[str, str]:
        """``fn`` is a matrix read by every token; ``base`` and ``scale`` are vectors."""
        return {"fn": "hidden", "base": "vector", "scale": "vector"}

    def read(self, s: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``(x [b, s, d] = Σ_j pre_j · s_j, (post [b, s, n], comb [b, s, n, n]))`` of ``s [b, s, n, d]``; the
        weights in float32 (float64 for a float64 stream), ``x`` in ``s``'s dtype."""
        n, eps, w = self.n, self.cfg.eps, _wide(s)
        mixes = F.linear(_rms(s.flatten(2).to(w), self.cfg.norm_eps), self.fn.to(w))
        pre, post, comb = mixes.split([n, n, n * n], dim=-1)
        base_pre, base_post, base_comb = self.base.to(w).split([n, n, n * n])
        scale = self.scale.to(w)
        pre = torch.sigmoid(pre * scale[0] + base_pre) + eps
        post = 2 * torch.sigmoid(post * scale[1] + base_post)
        comb = torch.softmax(comb.unflatten(-1, (n, n)) * scale[2] + base_comb.view(n, n), dim=-1) + eps
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
        for _ in range(self.cfg.sinkhorn_iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
            comb = comb / (comb.sum(-2, keepdim=True) + eps)
        x = (pre.unsqueeze(-1) * s).sum(dim=2).to(s.dtype)
        return x, (post, comb)

    def write(self, s: Tensor, state: tuple[Tensor, Tensor], y: Tensor) -> Tensor:
        """``post ⊗ y + comb^T · s``: ``[b, s, n, d]`` from the streams ``s``, ``read``'s state and the sublayer's
        output ``y [b, s, d]``."""
        post, comb = state
        return post.to(s.dtype).unsqueeze(-1) * y.unsqueeze(-2) + torch.matmul(comb.to(s.dtype).transpose(-1, -2), s)


class ManifoldHyperConnections(ResidualStream):
    """The ``mhc`` stream: ``enter`` ``[b, s, d] -> [b, s, n, d]`` (equal copies), ``exit`` ``[b, s, n, d] -> [b, s,
    d]`` (DeepSeek-V4's ``hc_head``: parameters ``hc_fn [n, n d]``, ``hc_base [n]``, ``hc_scale [1]``), and one
    :class:`HyperConnection` per sublayer (Zhu et al. 2024, arXiv:2409.19606; transformers ``DeepseekV4HyperHead``)."""

    def __init__(self, cfg: MHCConfig, ctx: BuildContext):
        super().__init__()
        n, d = cfg.n_streams, ctx.d_model
        self.n_streams, self.cfg, self.d_model = n, cfg, d
        self.hc_fn = nn.Parameter(torch.empty(n, n * d))
        self.hc_base = nn.Parameter(torch.empty(n))
        self.hc_scale = nn.Parameter(torch.empty(1))

    def init_weights(self, init: Init) -> None:
        """``hc_fn`` normal(0, init_std), ``hc_base`` 0, ``hc_scale`` 1."""
        init.normal_(self.hc_fn)
        init.zeros_(self.hc_base)
        init.ones_(self.hc_scale)

    def param_roles(self) -> dict[str, str]:
        """``hc_fn`` is a matrix; ``hc_base`` and ``hc_scale`` are vectors."""
        return {"hc_fn": "hidden", "hc_base": "vector", "hc_scale": "vector"}

    def enter(self, x: Tensor) -> Tensor:
        """``n_streams`` copies of ``x [b, s, d]``: ``[b, s, n, d]``."""
        return x.unsqueeze(2).expand(-1, -1, self.n_streams, -1).contiguous()

    def exit(self, s: Tensor) -> Tensor:
        """``Σ_j pre_j · s_j`` with ``pre = sigmoid(rms(flat s) · hc_fn^T · hc_scale + hc_base) + eps``: ``[b, s, d]``."""
        w = _wide(s)
        mixes = F.linear(_rms(s.flatten(2).to(w), self.cfg.norm_eps), self.hc_fn.to(w))
        pre = torch.sigmoid(mixes * self.hc_scale.to(w) + self.hc_base.to(w)) + self.cfg.eps
        return (pre.unsqueeze(-1) * s).sum(dim=2).to(s.dtype)

    def connection_flops(self, tokens: int) -> int:
        """Per token, the weights' projection ``2 · (2 + n) n · n d`` and ``comb^T · S``, ``2 · n² d``."""
        n, d = self.n_streams, self.d_model
        return tokens * (2 * (2 + n) * n * n * d + 2 * n * n * d)

    def connection(self) -> HyperConnection:
        """A new :class:`HyperConnection` (its ``fn``, ``base``, ``scale``) for one sublayer."""
        return HyperConnection(self.d_model, self.cfg)


def _flops(cfg: MHCConfig, ctx, workload) -> dict:
    """Matrix-product FLOPs of the stream module itself (the head's ``exit``): ``2 · n · n d`` per token. Each
    sublayer's connection (``2 · (2 + n) n · n d`` for its weights, ``2 · n² d`` for ``comb^T · S``) belongs to the
    block that holds it."""
    n, d = cfg.n_streams, ctx.d_model
    return {"exit": workload.tokens * 2 * n * n * d}


@hookimpl
def register_components(register) -> None:
    """Register the ``mhc`` residual stream."""
    register(
        Component(
            kind="stream",
            type="mhc",
            config=MHCConfig,
            factory=lambda cfg, ctx: ManifoldHyperConnections(cfg, ctx),
            description="Manifold-constrained hyper-connections (DeepSeek-V4): n_streams copies of the residual "
            "stream, mixed around every sublayer by weights computed from the streams (a doubly stochastic "
            "stream-to-stream matrix from Sinkhorn iterations); the head reads a learned mix of the copies. "
            "Sublayers keep [batch, seq, d_model].",
            reference="Zhu et al. 2024, Hyper-Connections, arXiv:2409.19606; DeepSeek-V4 (mHC); transformers "
            "DeepseekV4HyperConnection / DeepseekV4HyperHead",
            capabilities={"compile_safe": True},
            param_count=lambda cfg, ctx: cfg.n_streams * cfg.n_streams * ctx.d_model + cfg.n_streams + 1,
            flops=_flops,
            example={"type": "mhc", "n_streams": 4},
        )
    )
