"""``mixer/retention``: the plugin guide's worked example of a recurrent token mixer, its state in the cache.

Written as a third-party plugin would be, against modkit's mixer contract only: ``forward(x [batch, seq, d_model],
inputs) -> [batch, seq, d_model]``; the state it keeps between forwards is declared by ``cache_spec()`` (one
``growth="sequence"`` entry, constant in the context length), found with ``inputs.cache_for(self)`` and written back
with ``state.write``; nothing is kept on the module. The config's ``position_geometry`` returns ``None``: it has no
rotated queries and keys, so a rotary or bias position scheme does not act on it (validation refuses one that no
layer could take). The guide (``docs/guides/writing-a-plugin.md``, "A recurrent mixer: its state in the cache")
shows this file; ``tests/docs/test_recurrent_example.py`` registers it and runs the contract kit on it.

Retention (Sun et al. 2023, Retentive Network: A Successor to Transformer for Large Language Models,
arXiv:2307.08621, §2.1-2.2) with a fixed decay ``γ_h = 1 - 2^(-5-h)`` per head ``h`` and no xPos rotation. Per head,
with ``q_t, k_t ∈ R^{d_k}`` (``q`` scaled by ``d_k^-1/2``), ``v_t ∈ R^{d_v}`` and state ``S ∈ R^{d_k × d_v}``:

    S_t = γ_h · S_{t-1} + k_tᵀ v_t,        o_t = q_t S_t

then ``y = W_o (silu(W_g x) ⊙ RMSNorm_head(o))`` (the paper's GroupNorm per head, as an RMSNorm, and swish gate).
One forward of ``T`` tokens uses the parallel form, ``o = (q kᵀ ⊙ D) v + (γ^(t+1) ⊙ q) S_0`` with
``D[t, s] = γ^(t-s)`` for ``s <= t`` (else 0), and leaves ``S_T = γ^T S_0 + Σ_s γ^(T-1-s) k_sᵀ v_s`` in the cache;
one token (``T = 1``) is the recurrence itself. Padding tokens (``inputs.token_mask`` False) neither decay nor write
the state (their ``log γ`` and ``k`` are zeroed), so left padding is exact. Computed in float32.
"""

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    GatedRMSNorm,
    HeadCount,
    HeadDim,
    Workload,
    hookimpl,
    padding_mask,
)


class RetentionConfig(ComponentConfig):
    """Config of ``retention``: multi-scale retention with a fixed decay per head."""

    type: Literal["retention"] = "retention"
    n_heads: HeadCount = Field(4, description="heads; head h decays its state by 1 - 2^(-5-h) per token")
    key_dim: HeadDim = Field(8, description="d_k: query/key width per head (rows of the state)")
    value_dim: HeadDim = Field(8, description="d_v: value width per head (columns of the state)")
    norm_eps: float = Field(1e-5, gt=0, description="epsilon of the per-head RMSNorm of the retention output")

    def position_geometry(self, ctx) -> None:
        """No rotated queries and keys: a rotary or bias position scheme does not act here."""
        return None


def log_decay(n_heads: int) -> Tensor:
    """``log γ_h = log(1 - 2^(-5-h))`` for ``h = 0..n_heads-1``: ``[n_heads]`` float32 (RetNet §2.2)."""
    h = torch.arange(n_heads, dtype=torch.float64)
    return torch.log1p(-torch.pow(2.0, -5.0 - h)).float()


class Retention(nn.Module):
    """``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``; the cache holds the state
    ``[batch, n_heads, key_dim, value_dim]`` (float32) of every sequence."""

    def __init__(self, cfg: RetentionConfig, d_model: int):
        super().__init__()
        self.n_heads, self.key_dim, self.value_dim = cfg.n_heads, cfg.key_dim, cfg.value_dim
        inner_k, inner_v = cfg.n_heads * cfg.key_dim, cfg.n_heads * cfg.value_dim
        self.q_proj = nn.Linear(d_model, inner_k, bias=False)
        self.k_proj = nn.Linear(d_model, inner_k, bias=False)
        self.v_proj = nn.Linear(d_model, inner_v, bias=False)
        self.g_proj = nn.Linear(d_model, inner_v, bias=False)
        self.norm = GatedRMSNorm(inner_v, cfg.norm_eps, group_size=cfg.value_dim, norm_before_gate=True)
        self.o_proj = nn.Linear(inner_v, d_model, bias=False)

    def cache_spec(self) -> CacheSpec:
        """One fixed-size state per sequence: ``state [n_heads, key_dim, value_dim]`` in float32."""
        shape = (self.n_heads, self.key_dim, self.value_dim)
        return CacheSpec((CacheEntry("state", shape, growth="sequence", dtype=torch.float32),))

    def _heads(self, t: Tensor, width: int) -> Tensor:
        b, s, _ = t.shape
        return t.view(b, s, self.n_heads, width).transpose(1, 2).float()  # [b, H, s, width]

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """Retention over ``x``, continuing from and updating the cached state when ``inputs`` carries a cache."""
        b, s, _ = x.shape
        state = inputs.cache_for(self)  # None without a cache
        mask = padding_mask(inputs.token_mask, torch.float32)  # [b, s, 1] or None
        real = torch.ones(b, 1, s, device=x.device) if mask is None else mask.transpose(1, 2)  # [b, 1, s]
        q = self._heads(self.q_proj(x), self.key_dim) / math.sqrt(self.key_dim)
        k = self._heads(self.k_proj(x), self.key_dim) * real[..., None]  # padding writes nothing
        v = self._heads(self.v_proj(x), self.value_dim)
        a = log_decay(self.n_heads).to(x.device)[None, :, None] * real  # [b, H, s]; padding does not decay
        # zeros without a cache (or in a new one): the same products either way, so FLOPs depend on the workload only
        s0 = state["state"] if state is not None else q.new_zeros(b, self.n_heads, self.key_dim, self.value_dim)
        o, last = retention(q, k, v, a, s0)
        if state is not None:
            state.write("state", last)
        o = o.transpose(1, 2).reshape(b, s, self.n_heads * self.value_dim)
        return self.o_proj(self.norm(o, self.g_proj(x).float()).to(x.dtype))


def retention(q: Tensor, k: Tensor, v: Tensor, log_gamma: Tensor, s0: Tensor) -> tuple[Tensor, Tensor]:
    """The parallel form of ``T`` steps of ``S_t = γ_t S_{t-1} + k_tᵀ v_t``, ``o_t = q_t S_t``, from the state ``s0``.

    Args:
        q, k: ``[batch, H, T, d_k]``; v: ``[batch, H, T, d_v]``; log_gamma: ``[batch, H, T]``, ``log γ_t`` of each
        step (0 on padding: no decay); s0: ``[batch, H, d_k, d_v]``. One floating dtype throughout.

    Returns:
        ``(o [batch, H, T, d_v], S_T [batch, H, d_k, d_v])``: ``o = (q kᵀ ⊙ D) v + e^{c_t} q s0`` with ``c_t =
            Σ_{r <= t} log γ_r`` and ``D[t, s] = e^{c_t - c_s}`` for ``s <= t`` (0 above the diagonal), and
            ``S_T = e^{c_T} s0 + Σ_s e^{c_T - c_s} k_sᵀ v_s``. FLOPs: ``2·H·T²·(d_k + d_v) + 4·H·T·d_k·d_v`` per row.
    """
    T = q.shape[-2]
    cs = log_gamma.cumsum(-1)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    decay = torch.exp((cs[..., :, None] - cs[..., None, :]).masked_fill(~causal, float("-inf")))  # D [b, H, T, T]
    o = ((q @ k.transpose(-1, -2)) * decay) @ v + torch.exp(cs)[..., None] * (q @ s0)
    last = cs[..., -1:]  # [b, H, 1]
    state = (k * torch.exp(last - cs)[..., None]).transpose(-1, -2) @ v + torch.exp(last)[..., None] * s0
    return o, state


def build_retention(cfg: RetentionConfig, ctx: BuildContext) -> Retention:
    """Factory: ``(validated config, BuildContext) -> nn.Module``."""
    return Retention(cfg, ctx.d_model)


def param_count(cfg: RetentionConfig, ctx: BuildContext) -> int:
    """Exact: q and k ``d_model x n_heads·key_dim``, v, g and o ``d_model x n_heads·value_dim``, the norm's gain."""
    inner_k, inner_v = cfg.n_heads * cfg.key_dim, cfg.n_heads * cfg.value_dim
    return 2 * ctx.d_model * inner_k + 3 * ctx.d_model * inner_v + inner_v


def flops(cfg: RetentionConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call on ``work`` (as ``FlopCounterMode`` counts them): the projections on every
    token; the parallel form over the ``new`` tokens of a row (``q kᵀ`` and its product with ``v``: ``2·H·new²·d``
    each); the read-out of the state and its update, ``2·H·new·d_k·d_v`` each. The cached context does not enter:
    a decoded token costs the same at any context."""
    d, H, dk, dv = ctx.d_model, cfg.n_heads, cfg.key_dim, cfg.value_dim
    t, b, s = work.tokens, work.batch, work.new
    out = {
        "q_proj": 2 * t * d * H * dk,
        "k_proj": 2 * t * d * H * dk,
        "v_proj": 2 * t * d * H * dv,
        "g_proj": 2 * t * d * H * dv,
        "o_proj": 2 * t * H * dv * d,
        "scores": 2 * b * H * s * s * dk,
        "weighted_sum": 2 * b * H * s * s * dv,
        "state_read": 2 * b * H * s * dk * dv,
        "state_write": 2 * b * H * s * dk * dv,
    }
    return out


COMPONENT = Component(
    kind="mixer",
    type="retention",
    config=RetentionConfig,
    factory=build_retention,
    description="Retention (RetNet) with a fixed decay per head: parallel form within a forward, the recurrence "
    "across forwards through a cached [n_heads, key_dim, value_dim] float32 state per sequence; per-head RMSNorm "
    "and swish gate. [batch, seq, d_model] -> [batch, seq, d_model].",
    reference="Sun et al. 2023, Retentive Network: A Successor to Transformer for Large Language Models, "
    "arXiv:2307.08621",
    capabilities={"causal_safe": True, "kv_cache": True},
    param_count=param_count,
    flops=flops,
    example={"type": "retention", "n_heads": 4, "key_dim": 8, "value_dim": 8},
)


@hookimpl
def register_components(register) -> None:
    """Register ``mixer/retention``."""
    register(COMPONENT)
