"""Kimi Delta Attention (KDA): the gated delta rule with a per-channel forget gate (Kimi Linear's linear layers).

``[batch, seq, d_model] -> [batch, seq, d_model]``. Per token, projections give queries, keys and values
(``n_heads`` heads of ``head_dim``), per head a write strength ``β = sigmoid(b)`` (``2 · sigmoid(b)`` with
``allow_neg_eigval``) and, per channel of every key head, a log decay through a low-rank projection of rank
``gate_rank`` (default ``head_dim``), or with ``full_rank_gates`` one ``[n_heads · head_dim, d_model]`` projection
``W_f`` (and ``W_g`` for the output gate) in place of each pair (Ling's ``f_proj`` / ``g_proj``):

    g = -exp(A_log[h]) · softplus(W_fb W_fa x + dt_bias)        (g ∈ R^{n_heads × head_dim}, ≤ 0)

or, with ``forget_gate: "bounded"`` (Ling 3's ``kda_safe_gate``), a decay confined to ``(lower_bound, 0)`` whatever
the input, so no chunk's cumulative decay grows faster than ``|lower_bound|`` per token:

    g = lower_bound · sigmoid(exp(A_log[h]) · (W_f x + dt_bias))   (lower_bound = gate_lower_bound, default -5)

Queries, keys and values go through a short causal depthwise convolution and ``silu``; queries and keys are
L2-normalised (queries also scaled by ``head_dim^-1/2``). Per head, with state ``S ∈ R^{head_dim × head_dim}``
(rows: key channels) and ``D_t = diag(exp(g_t))``:

    S_t = D_t S_{t-1} + β_t k_t (v_t - (D_t S_{t-1})ᵀ k_t)ᵀ      (decay each key channel, then the delta rule)
    o_t = S_tᵀ q_t

then ``o`` goes through an RMSNorm per head gated by ``sigmoid`` of a low-rank output gate ``W_gb W_ga x`` (norm
first) and ``o_proj``. Gated DeltaNet is the case of one decay per head (every channel the same).

**Two forms, the same numbers.** Training and prefill use the chunkwise form (the WY / UT transform of the delta
rule): inside a chunk of ``L = chunk_size`` tokens the decay between tokens ``s ≤ t`` is a vector
``Γ_ts = exp(cum_t - cum_s)`` over the key channels (``cum`` the cumulative log decay from the chunk start), so the
chunk's ``[L, L]`` matrices are ``Σ_c a_tc b_sc Γ_tsc`` (formed with ``Γ`` masked before the ``exp``: every exponent
is ``≤ 0``, nothing overflows however strong the decay, at the cost of an ``[L, L, head_dim]`` tensor per chunk and
head); then one unit lower-triangular solve gives the chunk's corrected values and the state moves from chunk to
chunk. Decoding one token runs the recurrence above. Both start from the cached state.

**State.** Per sequence, whatever the context: the convolution window ``conv [3 · n_heads · head_dim, d_conv - 1]``
and the state ``recurrent [n_heads, head_dim, head_dim]`` (float32). Padding tokens change nothing (inputs zeroed
before the convolution, ``β = 0`` and no decay), so left padding is exact.

**Document boundaries.** With ``inputs.documents`` the state entering each document of a packed row is zero (every
decay product over a range holding a start is masked: :func:`~modkit.nn.recurrent.chunk_boundaries`) and the
convolution takes no input from the previous document, as flash-linear-attention does with ``cu_seqlens``.

References: Kimi Team 2025, Kimi Linear: An Expressive, Efficient Attention Architecture (arXiv:2510.26692), §3 (KDA
and its chunkwise form); Yang, Kautz & Hatamizadeh 2024, Gated Delta Networks (arXiv:2412.06464); Grazzi et al. 2024,
Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues (arXiv:2411.12537) for ``β ∈ (0, 2)``;
transformers ``KimiLinearDeltaAttention`` / ``KimiLinearForgetGate`` / ``KimiLinearRMSNormGated`` and
flash-linear-attention's ``KimiDeltaAttention`` (read, not copied) for the parameterisation and the init;
transformers ``BailingHybridDeltaAttention`` / ``BailingHybridForgetGate`` (Ling 3, ``kda_safe_gate``,
``kda_lower_bound``) for the bounded gate and the full-rank gate projections.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import (
    RECURRENT_CAPABILITIES,
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    causal_conv,
    chunk_boundaries,
    Component,
    GatedRMSNorm,
    HeadCount,
    HeadDim,
    hookimpl,
    document_starts,
    padding_mask,
    Workload,
    zero_padding,
)
from modkit_plugins.gated_deltanet import DeltaRuleConfig, delta_rule_step, l2_normalise


#: the bounded forget gate's default lowest log decay per token (transformers ``BailingHybridConfig.kda_lower_bound``)
DEFAULT_LOWER_BOUND = -5.0
#: the range of ``|gate_lower_bound|``: below 1e-6 no decay shows in float32; at 1000 a token forgets everything
MIN_LOWER_BOUND, MAX_LOWER_BOUND = 1e-6, 1000.0


class KimiDeltaConfig(DeltaRuleConfig):
    """Config of ``kimi_delta`` (Kimi Linear's ``linear_attention`` layers: Kimi Delta Attention); the convolution,
    beta and output-norm fields are Gated DeltaNet's (:class:`~modkit_plugins.gated_deltanet.DeltaRuleConfig`)."""

    type: Literal["kimi_delta"] = "kimi_delta"
    n_heads: HeadCount = Field(..., description="query / key / value heads (Kimi Linear's linear_num_heads)")
    head_dim: HeadDim = Field(128, description="width of every head, of the state's rows and columns (linear_head_dim)")
    gate_rank: Optional[int] = Field(
        None,
        ge=1,
        le=65536,
        description="rank of the low-rank forget-gate and output-gate projections; default head_dim (Kimi Linear)",
    )
    chunk_size: int = Field(
        16,
        ge=1,
        le=1024,
        description="chunk length of the chunkwise form used for training and prefill; changes the speed and the "
        "memory (an [L, L, head_dim] decay tensor per chunk and head), not the numbers. Default 16: the fastest "
        "forward + backward at 256 tokens among 4-64 on one CPU thread (8 is faster at 4K; not measured on a GPU)",
    )

    full_rank_gates: bool = Field(
        False,
        description="one full [n_heads · head_dim, d_model] projection for each of the forget gate (f_proj) and the "
        "output gate (g_proj) instead of the low-rank pairs (Ling 3's BailingHybridDeltaAttention); gate_rank must "
        "then be unset. Default off (Kimi Linear)",
    )
    forget_gate: Literal["softplus", "bounded"] = Field(
        "softplus",
        description="'softplus': g = -exp(A_log) · softplus(f + dt_bias), in (-inf, 0] (Kimi Linear); 'bounded': g = "
        "gate_lower_bound · sigmoid(exp(A_log) · (f + dt_bias)), in (gate_lower_bound, 0) (Ling 3's kda_safe_gate)",
    )
    gate_lower_bound: Optional[float] = Field(
        None,
        ge=-MAX_LOWER_BOUND,
        le=-MIN_LOWER_BOUND,
        description="the bounded forget gate's lowest log decay per token (Ling 3's kda_lower_bound); only with "
        f"forget_gate 'bounded', default -5. Within [-{MAX_LOWER_BOUND:g}, -{MIN_LOWER_BOUND:g}]: a weaker bound "
        "decays nothing in float32, a stronger one forgets everything within a token",
    )

    @model_validator(mode="after")
    def _check_gates(self) -> "KimiDeltaConfig":
        if self.full_rank_gates and self.gate_rank is not None:
            raise ValueError(
                f"gate_rank = {self.gate_rank} sets the rank of low-rank gates, but full_rank_gates is true (full "
                "projections have no rank); drop gate_rank or set full_rank_gates false"
            )
        if self.gate_lower_bound is not None and self.forget_gate != "bounded":
            raise ValueError(
                f"gate_lower_bound = {self.gate_lower_bound:g} bounds the 'bounded' forget gate, but forget_gate is "
                f"{self.forget_gate!r}; set forget_gate 'bounded' or drop gate_lower_bound"
            )
        return self

    @property
    def rank(self) -> int:
        """``gate_rank``, or ``head_dim`` (the low-rank gates' rank; unused with ``full_rank_gates``)."""
        return self.gate_rank if self.gate_rank is not None else self.head_dim

    def gate_weights(self, d_model: int) -> int:
        """Weights of one gate's projection(s): ``d_model · D`` full, ``d_model · r + r · D`` low-rank."""
        D = self.n_heads * self.head_dim
        return d_model * D if self.full_rank_gates else d_model * self.rank + self.rank * D

    @property
    def lower_bound(self) -> float:
        """The bounded gate's lowest log decay: ``gate_lower_bound``, or -5 (Ling 3's ``kda_lower_bound``)."""
        return self.gate_lower_bound if self.gate_lower_bound is not None else DEFAULT_LOWER_BOUND


# ----------------------------------------------------------------------------------------------- the two forms


def kda_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The chunkwise form of the gated delta rule with a per-channel (diagonal) decay.

    Args:
        q, k: ``[batch, H, T, dk]`` (normalised; ``q`` scaled); v: ``[batch, H, T, dv]``; g: ``[batch, H, T, dk]`` log
        decays per key channel (``≤ 0``; 0 on padding); beta: ``[batch, H, T]`` (0 on padding); chunk: ``L``
        (``min(chunk, T)`` used); state: ``[batch, H, dk, dv]`` or ``None`` (zeros); starts: ``[batch, T]`` bool,
        True where a document starts (the state entering it is zero; a True at 0 drops ``state``), or ``None``.
        Float32 (or float64).

    Returns:
        ``(o [batch, H, T, dv], final state)``.

    FLOPs (matrix products, as ``FlopCounterMode`` counts them, with the triangular solves' formula of
    :func:`modkit.analysis.cost.flop_counter`; ``c`` chunks of ``L``, the sequence padded to ``c · L``): ``batch · H ·
    c · (L(L-1)(dk + dv) + 2 L² dv + 6 L dk dv)``. The two ``[L, L]`` score matrices are element-wise sums over the
    ``[L, L, dk]`` decayed products (``6 L² dk`` more arithmetic per chunk and head, not matrix products).
    """
    b, H, T, dk = k.shape
    dv = v.shape[-1]
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    if pad:  # padded tokens: no decay, no write, no read
        q, k, v, g = (nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v, g))
        beta = nn.functional.pad(beta, (0, pad))
    q, k, v, g = (t.reshape(b, H, nc, L, t.shape[-1]) for t in (q, k, v, g))
    beta = beta.reshape(b, H, nc, L)
    cum = g.cumsum(-2)  # [b, H, c, L, dk]: log decay per channel from the chunk start
    lower = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()[..., None]
    # decay between tokens s <= t per channel: exp(cum_t - cum_s) (exponent <= 0 there; masked before exp)
    gamma = (cum[..., :, None, :] - cum[..., None, :, :]).masked_fill(~lower, float("-inf")).exp()
    from_start, k_decay, end = cum.exp(), (cum[..., -1:, :] - cum).exp(), cum[..., -1, :].exp()
    if starts is not None:  # no decay product reaches across a document start
        bounds = chunk_boundaries(starts, L, q.dtype)
        gamma = gamma * bounds.same[:, None, ..., None]
        end = end * bounds.whole[:, None, :, None]
        from_start = from_start * bounds.from_start[:, None, ..., None]
        k_decay = k_decay * bounds.to_end[:, None, ..., None]
    kb = k * beta[..., None]
    k_pairs = k[..., None, :, :] * gamma  # [b, H, c, L(t), L(s), dk]: k_s decayed to t
    # I + strictly lower β_t Σ_c k_tc k_sc Γ_tsc, solved unitriangular (the diagonal is read as 1)
    system = (kb[..., :, None, :] * k_pairs).sum(-1)
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * from_start, upper=False, unitriangular=True)
    attn = (q[..., :, None, :] * k_pairs).sum(-1)  # causal, decayed q·k inside the chunk
    q_in = q * from_start  # what the entering state contributes, decayed to each token
    k_out = k * k_decay  # each token's key decayed to the chunk end
    s = state if state is not None else q.new_zeros(b, H, dk, dv)
    out = []
    chunks = zip(*(t.unbind(2) for t in (u, w, q_in, attn, k_out.transpose(-1, -2), end[..., None])))
    for u_i, w_i, q_i, attn_i, k_i, end_i in chunks:
        v_new = u_i - w_i @ s  # the chunk's values minus what the entering state predicts
        out.append(q_i @ s + attn_i @ v_new)
        s = end_i * s + k_i @ v_new
    o = torch.stack(out, 2).reshape(b, H, nc * L, dv)[:, :, :T]
    return o, s


#: One token of Kimi Delta Attention: the gated delta rule with one decay per key channel (``g [batch, H, dk]``),
#: ``S = diag(exp(g)) S``; ``S += β k (v - Sᵀ k)ᵀ``; ``o = Sᵀ q`` (:func:`~modkit_plugins.gated_deltanet.delta_rule_step`).
kda_step = delta_rule_step


# ----------------------------------------------------------------------------------------------- the module


class SigmoidGatedRMSNorm(GatedRMSNorm):
    """``(w ⊙ RMSNorm(x)) ⊙ sigmoid(z)`` over the last axis, ``[..., dim], [..., dim] -> [..., dim]`` in ``x``'s dtype
    (float32 inside). Source: transformers ``KimiLinearRMSNormGated`` (norm first, sigmoid gate)."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps, norm_before_gate=True)

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        """``x, z [..., dim]`` → ``[..., dim]``."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.float()
        return (h * torch.sigmoid(z.float())).to(x.dtype)


class KimiDeltaAttention(nn.Module):
    """The KDA mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters (``D = n_heads · head_dim``, ``r = gate_rank``): ``q_proj``, ``k_proj``, ``v_proj`` ``[D, d_model]``,
    ``conv1d`` over ``[q; k; v]``, ``f_a_proj [r, d_model]`` and ``f_b_proj [D, r]`` (the forget gate; with
    ``full_rank_gates`` one ``f_proj [D, d_model]``), ``dt_bias [D]``, ``A_log [n_heads]``, ``b_proj [n_heads,
    d_model]`` (β), ``g_a_proj [r, d_model]`` and ``g_b_proj [D, r]`` (the output gate; with ``full_rank_gates``
    ``g_proj [D, d_model]``), ``o_norm.weight [head_dim]`` (shared by the heads), ``o_proj [d_model, D]``.
    """

    #: the decay parameters and the depthwise filter are fixed-fan-in vectors (no width multiplier, no Muon step)
    param_roles = {"dt_bias": "bias", "A_log": "vector", "conv1d.weight": "vector", "conv1d.bias": "bias"}

    def __init__(self, cfg: KimiDeltaConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.n_heads, self.head_dim, self.d_conv = cfg.n_heads, cfg.head_dim, cfg.d_conv
        self.chunk_size, self.allow_neg_eigval = cfg.chunk_size, cfg.allow_neg_eigval
        self.dim = self.n_heads * self.head_dim
        self.conv_dim = 3 * self.dim
        self.q_proj = nn.Linear(d, self.dim, bias=False)
        self.k_proj = nn.Linear(d, self.dim, bias=False)
        self.v_proj = nn.Linear(d, self.dim, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, bias=cfg.conv_bias)
        self.bounded = cfg.forget_gate == "bounded"
        self.lower_bound = cfg.lower_bound
        if cfg.full_rank_gates:  # Ling 3: one projection per gate
            self.f_proj = nn.Linear(d, self.dim, bias=False)
            self.g_proj = nn.Linear(d, self.dim, bias=False)
        else:
            self.f_a_proj = nn.Linear(d, cfg.rank, bias=False)
            self.f_b_proj = nn.Linear(cfg.rank, self.dim, bias=False)
            self.g_a_proj = nn.Linear(d, cfg.rank, bias=False)
            self.g_b_proj = nn.Linear(cfg.rank, self.dim, bias=False)
        self.dt_bias = nn.Parameter(torch.empty(self.dim))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.b_proj = nn.Linear(d, self.n_heads, bias=False)
        self.o_norm = SigmoidGatedRMSNorm(self.head_dim, cfg.norm_eps)
        self.o_proj = nn.Linear(self.dim, d, bias=False)

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the convolution window ``conv [3 · n_heads · head_dim, d_conv - 1]`` (cache dtype) and the
        state ``recurrent [n_heads, head_dim, head_dim]`` (float32). Nothing per token."""
        return CacheSpec(
            (
                CacheEntry("conv", (self.conv_dim, self.d_conv - 1), growth="sequence"),
                CacheEntry(
                    "recurrent", (self.n_heads, self.head_dim, self.head_dim), growth="sequence", dtype=torch.float32
                ),
            )
        )

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """flash-linear-attention's KDA init (as transformers' ``KimiLinearPreTrainedModel``): ``A`` uniform in ``[1,
        16]`` (``A_log = log A``), ``dt = exp(U(log 1e-3, log 1e-1))`` clamped at ``1e-4`` and ``dt_bias`` its inverse
        softplus; the convolution ``U(±1/sqrt(d_conv))`` (zero bias); ``nn.Linear`` children by the model's rule."""
        a = torch.empty(self.n_heads)
        init.uniform_(a, 1.0, 16.0)
        init.copy_(self.A_log, a.log())
        dt = torch.empty(self.dim)
        init.uniform_(dt, math.log(1e-3), math.log(1e-1))
        dt = dt.exp().clamp_min(1e-4)
        init.copy_(self.dt_bias, dt + torch.log(-torch.expm1(-dt)))
        bound = self.d_conv**-0.5
        init.uniform_(self.conv1d.weight, -bound, bound)
        if self.conv1d.bias is not None:
            init.zeros_(self.conv1d.bias)

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """``{projection: (heads, width per head)}``."""
        per = (self.n_heads, self.head_dim)
        gates = ("f_proj", "g_proj") if hasattr(self, "f_proj") else ("f_b_proj", "g_b_proj")
        return {"q_proj": per, "k_proj": per, "v_proj": per, **{name: per for name in gates}}

    def _forget_input(self, x: Tensor) -> Tensor:
        """The forget gate's projection ``[batch, seq, n_heads · head_dim]`` (low-rank pair or full)."""
        return self.f_proj(x) if hasattr(self, "f_proj") else self.f_b_proj(self.f_a_proj(x))

    def _output_gate(self, x: Tensor) -> Tensor:
        """The output gate's projection ``[batch, seq, n_heads · head_dim]`` (low-rank pair or full)."""
        return self.g_proj(x) if hasattr(self, "g_proj") else self.g_b_proj(self.g_a_proj(x))

    def _gates(self, x: Tensor, mask: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """``(g [batch, H, seq, head_dim], beta [batch, H, seq])`` in float32, zero on padding."""
        bsz, s, _ = x.shape
        beta = torch.sigmoid(self.b_proj(x).float())
        if self.allow_neg_eigval:
            beta = 2.0 * beta
        raw = (self._forget_input(x).float() + self.dt_bias.float()).view(bsz, s, self.n_heads, self.head_dim)
        rate = self.A_log.float().exp()[:, None]
        if self.bounded:  # in (lower_bound, 0) whatever the input (Ling 3's kda_safe_gate)
            g = self.lower_bound * torch.sigmoid(rate * raw)
        else:
            g = -rate * nn.functional.softplus(raw)
        return zero_padding(g, mask).transpose(1, 2), zero_padding(beta, mask).transpose(1, 2)

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given.

        One token (``seq == 1``) takes the recurrent step, more the chunkwise form; both start from the cached state.
        """
        bsz, s, _ = x.shape
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, torch.float32)
        qkv = zero_padding(torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1), mask)
        starts = document_starts(inputs.documents)  # the state and the convolution restart at each document
        qkv = nn.functional.silu(causal_conv(qkv, self.conv1d, state, starts=starts)).float()
        shape = (bsz, s, self.n_heads, self.head_dim)
        q, k, v = (t.view(shape) for t in qkv.split([self.dim] * 3, dim=-1))
        q = l2_normalise(q) * self.head_dim**-0.5
        q, k, v = (t.transpose(1, 2) for t in (q, l2_normalise(k), v))  # [b, H, s, dh]
        g, beta = self._gates(x, mask)
        s0 = state["recurrent"] if state is not None else None
        if s == 1:
            s0 = s0 if s0 is not None else q.new_zeros(bsz, self.n_heads, self.head_dim, self.head_dim)
            reset = None if starts is None else starts[:, 0]
            o, s1 = kda_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0], s0, reset)
            o = o[:, :, None]
        else:
            o, s1 = kda_chunked(q, k, v, g, beta, self.chunk_size, s0, starts)
        if state is not None:
            state.write("recurrent", s1)
        gate = self._output_gate(x).view(shape)
        o = self.o_norm(o.transpose(1, 2), gate).reshape(bsz, s, self.dim)
        return self.o_proj(o.to(x.dtype))


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: KimiDeltaConfig, ctx: BuildContext) -> int:
    d, D, H = ctx.d_model, cfg.n_heads * cfg.head_dim, cfg.n_heads
    n = d * 3 * D + 3 * D * cfg.d_conv + 3 * D * cfg.conv_bias  # q, k, v and the convolution
    n += 2 * cfg.gate_weights(d)  # the forget and output gates (low-rank pairs or full)
    n += D + H + d * H  # dt_bias, A_log, b_proj
    return n + cfg.head_dim + D * d  # the norm's weight, o_proj


def _flops(cfg: KimiDeltaConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts; triangular solves with the formula of
    :func:`modkit.analysis.cost.flop_counter`): the projections, the convolution and ``o_proj`` on ``work.tokens``
    rows; one token (``work.new == 1``) reads the state twice, ``4 · batch · H · dk · dv``; more tokens take the
    chunkwise form (:func:`kda_chunked`, ``c`` chunks of ``L = min(chunk_size, new)``): ``batch · H · c · (L(L-1)(dk +
    dv) + 2 L² dv + 6 L dk dv)``. Constant per token in the cached context."""
    d, H, dh = ctx.d_model, cfg.n_heads, cfg.head_dim
    D = H * dh
    t, b, s = work.tokens, work.batch, work.new
    out = {
        "qkv_proj": 2 * t * d * 3 * D,
        "gate_proj": 2 * 2 * t * cfg.gate_weights(d),
        "b_proj": 2 * t * d * H,
        "conv": 2 * t * 3 * D * cfg.d_conv,
        "o_proj": 2 * t * D * d,
    }
    if s == 1:
        out["delta_rule"] = 4 * b * H * dh * dh
    else:
        L = min(cfg.chunk_size, s)
        c = -(-s // L)
        out["delta_rule"] = b * H * c * (L * (L - 1) * 2 * dh + 2 * L * L * dh + 6 * L * dh * dh)
    return out


_MATH = r"""Per head with state $S_t \in \mathbb{R}^{d \times d}$ ($d$ = head_dim), $q_t, k_t$ L2-normalised after the
causal convolution ($q_t$ also scaled by $d^{-1/2}$), $\beta_t = \sigma(b_t)$ ($2\sigma(b_t)$ with allow_neg_eigval)
and a per-channel decay $\alpha_t = e^{g_t} \in (0, 1]^d$ with $g_t = -e^{A^{log}_h}\, \mathrm{softplus}(W_{fb} W_{fa}
x_t + b_{dt})$ (forget_gate "bounded": $g_t = \ell\, \sigma(e^{A^{log}_h} (W_f x_t + b_{dt}))$, $\ell$ =
gate_lower_bound, so $g_t \in (\ell, 0)$; full_rank_gates: $W_f$, $W_g$ in place of the low-rank pairs):

$$S_t = \left(I - \beta_t k_t k_t^\top\right) \mathrm{Diag}(\alpha_t)\, S_{t-1} + \beta_t\, k_t v_t^\top, \qquad o_t =
S_t^\top q_t$$

The output is $W_o\, \big(\mathrm{RMSNorm}(o_t) \odot \sigma(W_{gb} W_{ga} x_t)\big)$ per head. The chunkwise form
gathers $L$ = chunk_size updates: with $\Gamma_{ts} = \prod_{s < r \le t} \alpha_r$ (a vector), $U = (I +
\mathrm{tril}(\mathrm{diag}(\beta) [\sum_c k_{tc} k_{sc} \Gamma_{tsc}], -1))^{-1} \mathrm{diag}(\beta) V$. The cache
keeps $S$ ($n_h d^2$ float32 numbers) and the last d_conv $- 1$ convolution inputs, per sequence."""


@hookimpl
def register_components(register) -> None:
    """Register ``kimi_delta`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="kimi_delta",
            config=KimiDeltaConfig,
            factory=lambda cfg, ctx: KimiDeltaAttention(cfg, ctx),
            description="Kimi Delta Attention (Kimi Linear's linear attention): Gated DeltaNet with a per-channel "
            "forget gate from a low-rank (or full) projection, softplus or bounded (Ling 3's safe gate); q, k, v with a causal depthwise conv1d and silu, L2-normalised q "
            "and k, beta = sigmoid (2·sigmoid with allow_neg_eigval), chunkwise form for training and prefill and "
            "recurrent step for decoding (the same numbers), a sigmoid output gate through a gated RMSNorm, o_proj. "
            "[batch, seq, d_model] -> [batch, seq, d_model]; the cache holds a fixed-size state per sequence (conv "
            "window + [n_heads, head_dim, head_dim] float32).",
            reference="Kimi Team 2025, Kimi Linear: An Expressive, Efficient Attention Architecture, arXiv:2510.26692; "
            "transformers KimiLinearDeltaAttention; flash-linear-attention KimiDeltaAttention",
            capabilities={**RECURRENT_CAPABILITIES, "overflow_prone": True},
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={"type": "kimi_delta", "n_heads": 2, "head_dim": 8, "chunk_size": 4},
        )
    )
