"""Gated DeltaNet: linear attention whose state is updated by the gated delta rule (Qwen3-Next's linear layers).

``[batch, seq, d_model] -> [batch, seq, d_model]``. Per token, projections give queries and keys (``n_heads`` heads of
``key_head_dim``), values and an output gate (``n_value_heads`` heads of ``value_head_dim``; each key head serves
``n_value_heads / n_heads`` consecutive value heads), and per value head a write strength ``β = sigmoid(b)`` (``2 · sigmoid(b)`` with ``allow_neg_eigval``) and a
decay ``α = exp(g)`` with ``g = -exp(A_log) · softplus(a + dt_bias)``. Queries, keys and values go through a short
causal depthwise convolution and ``silu``; queries and keys are L2-normalised (queries also scaled by
``key_head_dim^-1/2``). Per value head, with state ``S ∈ R^{key_head_dim × value_head_dim}``:

    S_t = α_t S_{t-1} + β_t k_t (v_t - α_t S_{t-1}ᵀ k_t)ᵀ      (decay, then replace what S predicts for k_t by v_t)
    o_t = S_tᵀ q_t

then ``o`` goes through an RMSNorm per head gated by ``silu`` of the output gate (norm first) and ``out_proj``.

**Two forms, the same numbers.** Training and prefill use the chunkwise form of the paper (the WY / UT transform):
inside a chunk of ``chunk_size`` tokens the ``L`` delta-rule updates collapse to a unit lower-triangular solve
``(I + tril(β K Kᵀ ⊙ Γ, -1))⁻¹`` (``Γ`` the decays between tokens of the chunk), giving the chunk's corrected values;
the output is the state's read-out plus a masked ``[L, L]`` attention inside the chunk; the state moves from chunk to
chunk. Decoding one token runs the recurrence above. Both start from the cached state.

**State.** Per sequence, whatever the context: the convolution window ``conv [2 · n_heads · key_head_dim +
n_value_heads · value_head_dim, d_conv - 1]`` and the state ``recurrent [n_value_heads, key_head_dim,
value_head_dim]`` (float32). Padding tokens change nothing (inputs zeroed before the convolution, ``β = 0`` and no
decay), so left padding is exact.

**Document boundaries.** With ``inputs.documents`` (document-masked packing) the state entering each document of a
packed row is zero (``α = 0`` at a document's first token; in the chunkwise form every decay product over a range
holding a start is masked: :func:`~modkit.nn.recurrent.chunk_boundaries`) and the convolution takes no input from
the previous document, as flash-linear-attention does with ``cu_seqlens``: each document gives its numbers alone.

References: Yang, Kautz & Hatamizadeh 2024, Gated Delta Networks: Improving Mamba2 with Delta Rule (arXiv:2412.06464),
§2-3 (the gated delta rule and its chunkwise form); Yang et al. 2024, Parallelizing Linear Transformers with the
Delta Rule over Sequence Length (arXiv:2406.06484) for the UT transform; Qwen3-Next as in transformers
``Qwen3NextGatedDeltaNet`` (its PyTorch fallbacks ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule``,
read, not copied) for the gates, the normalisation and the grouping of value heads.
"""

from __future__ import annotations

from typing import Literal, Optional

import torch
from pydantic import Field
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
    ComponentConfig,
    Epsilon,
    GatedRMSNorm,
    HeadCount,
    HeadDim,
    hookimpl,
    document_starts,
    MAX_EPS,
    MIN_EPS,
    padding_mask,
    Workload,
    zero_padding,
)


class DeltaRuleConfig(ComponentConfig):
    """The fields every delta-rule mixer shares (``gated_deltanet``, ``kimi_delta``): the short convolution over q, k
    and v, the range of beta and the gated output norm; no position scheme acts on them."""

    d_conv: int = Field(4, ge=2, le=64, description="kernel of the causal depthwise convolution over q, k and v")
    conv_bias: bool = Field(False, description="bias on the convolution (Qwen3-Next, Kimi Linear: none)")
    allow_neg_eigval: bool = Field(
        False,
        description="beta = 2 · sigmoid(b) in (0, 2) instead of sigmoid(b) in (0, 1): the state's transition I - beta "
        "k kᵀ may have a negative eigenvalue (OLMo Hybrid's linear_allow_neg_eigval, flash-linear-attention's "
        "allow_neg_eigval); default off",
    )
    norm_eps: Epsilon = Field(
        1e-6,
        description=f"epsilon of the gated output norm; within [{MIN_EPS:g}, {MAX_EPS:g}] (Qwen3-Next and Kimi "
        "Linear: 1e-6; a smaller eps is 0 in float32)",
    )

    def position_geometry(self, ctx):
        """No position scheme acts here (the convolution and the decays carry the order)."""
        return None


class GatedDeltaNetConfig(DeltaRuleConfig):
    """Config of ``gated_deltanet`` (Qwen3-Next's ``linear_attention`` layers)."""

    type: Literal["gated_deltanet"] = "gated_deltanet"
    n_heads: HeadCount = Field(..., description="query / key heads (Qwen3-Next's linear_num_key_heads)")
    n_value_heads: Optional[HeadCount] = Field(
        None,
        description="value heads, a multiple of n_heads (each key head serves n_value_heads / n_heads of them; "
        "Qwen3-Next's linear_num_value_heads); default n_heads",
    )
    key_head_dim: HeadDim = Field(128, description="width of a query / key head (linear_key_head_dim)")
    value_head_dim: HeadDim = Field(
        128, description="width of a value head, of the state's columns (linear_value_head_dim)"
    )
    chunk_size: int = Field(
        32,
        ge=1,
        le=1024,
        description="chunk length of the chunkwise form used for training and prefill; changes the speed, not the "
        "numbers. Default 32: the fastest forward + backward at 256, 1K and 4K tokens among 32-256 "
        "(benchmarks/bench_mixers.py, chunk-size table in benchmarks/results_mixers.md; transformers' fallback uses 64)",
    )

    @property
    def value_heads(self) -> int:
        """``n_value_heads``, or ``n_heads``."""
        return self.n_value_heads if self.n_value_heads is not None else self.n_heads

    def check(self, ctx) -> list[tuple[str, str]]:
        """``n_heads`` divides ``n_value_heads``."""
        if self.value_heads % self.n_heads:
            return [
                ("n_value_heads", f"n_value_heads = {self.value_heads} is not a multiple of n_heads = {self.n_heads}")
            ]
        return []


# ----------------------------------------------------------------------------------------------- the two forms


def l2_normalise(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x · rsqrt(Σ x² + eps)`` over the last axis (the FLA library's and transformers' ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def delta_rule_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The chunkwise form of the gated delta rule.

    Args:
        q, k: ``[batch, H, T, dk]`` (normalised; ``q`` scaled); v: ``[batch, H, T, dv]``; g: ``[batch, H, T]`` log
        decays (``≤ 0``; 0 on padding); beta: ``[batch, H, T]`` (0 on padding); chunk: ``L`` (``min(chunk, T)``
        used); state: ``[batch, H, dk, dv]`` or ``None`` (zeros); starts: ``[batch, T]`` bool, True where a
        document starts (``α = 0`` there: the state entering it is zero; a True at 0 drops ``state``), or ``None``.
        Float32 (or float64); ``H`` value heads (keys already repeated for grouped values).

    Returns:
        ``(o [batch, H, T, dv], final state)``.

    FLOPs (as ``FlopCounterMode`` counts them, with the triangular solves' formula of :func:`modkit.analysis.cost.flop_counter`;
    ``c`` chunks of ``L``, the sequence padded to ``c · L``): ``batch · H · c · (4 L² dk + L(L-1)(dk + dv) + 2 L² dv +
    6 L dk dv)``.
    """
    b, H, T, dk = k.shape
    dv = v.shape[-1]
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    if pad:  # padded tokens: no decay, no write, no read
        q, k, v = (nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (nn.functional.pad(t, (0, pad)) for t in (g, beta))
    q, k, v = (t.reshape(b, H, nc, L, t.shape[-1]) for t in (q, k, v))
    g, beta = g.reshape(b, H, nc, L), beta.reshape(b, H, nc, L)
    cum = g.cumsum(-1)  # [b, H, c, L]: log decay from the chunk start
    lower = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    # decay between tokens s <= t of a chunk: exp(cum_t - cum_s) (the exponent is <= 0 there; masked before exp)
    gamma = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    from_start, k_decay, end = cum.exp(), (cum[..., -1:] - cum).exp(), cum[..., -1].exp()  # [b, H, c, (L)]
    if starts is not None:  # no decay product reaches across a document start (flash-linear-attention's cu_seqlens)
        bounds = chunk_boundaries(starts, L, q.dtype)
        gamma, end = gamma * bounds.same[:, None], end * bounds.whole[:, None]
        from_start, k_decay = from_start * bounds.from_start[:, None], k_decay * bounds.to_end[:, None]
    kb = k * beta[..., None]
    # I + the strictly lower part of β_s (k_s · k_j) Γ_sj is solved: the solve reads only the lower triangle and
    # takes the diagonal as 1 (unitriangular), so the matrix is passed as it is (Γ is 0 above the diagonal)
    system = (kb @ k.transpose(-1, -2)) * gamma
    u = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, kb * from_start[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * gamma  # causal, decayed q·k inside the chunk
    q_in = q * from_start[..., None]  # what the entering state contributes, decayed to each token
    k_out = k * k_decay[..., None]  # each token's key decayed to the chunk end
    s = state if state is not None else q.new_zeros(b, H, dk, dv)
    out = []
    # the state from chunk to chunk; unbind, not indexing: the backward of one index would allocate (and sum into)
    # a zero gradient of the whole tensor per chunk
    chunks = zip(*(t.unbind(2) for t in (u, w, q_in, attn, k_out.transpose(-1, -2), end[..., None, None])))
    for u_i, w_i, q_i, attn_i, k_i, end_i in chunks:
        v_new = u_i - w_i @ s  # the chunk's values minus what the entering state predicts
        out.append(q_i @ s + attn_i @ v_new)
        s = end_i * s + k_i @ v_new
    o = torch.stack(out, 2).reshape(b, H, nc * L, dv)[:, :, :T]
    return o, s


def delta_rule_step(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor, reset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """One token of the gated delta rule: ``S = α S``; ``S += β k (v - Sᵀ k)ᵀ``; ``o = Sᵀ q``.

    Args:
        q, k: ``[batch, H, dk]``; v: ``[batch, H, dv]``; g: ``[batch, H]`` (one decay per head, Gated DeltaNet) or
        ``[batch, H, dk]`` (one per key channel, Kimi Delta Attention); beta: ``[batch, H]``; state:
        ``[batch, H, dk, dv]``; reset: ``[batch]`` bool, True where the token starts a document (``α = 0``: the state
        before it is dropped), or ``None``. Float32 (or float64).

    Returns:
        ``(o [batch, H, dv], new state)``. FLOPs: ``4 · batch · H · dk · dv`` (the read-outs ``Sᵀ k`` and ``Sᵀ q``).
    """
    alpha = g.exp()
    if reset is not None:
        alpha = alpha * (~reset).view(-1, *(1,) * (alpha.dim() - 1)).to(alpha.dtype)
    s = state * (alpha[..., None, None] if alpha.dim() == 2 else alpha[..., None])
    predicted = (k[..., None, :] @ s)[..., 0, :]  # Sᵀ k, [b, H, dv]
    s = s + k[..., :, None] * ((v - predicted) * beta[..., None])[..., None, :]
    o = (q[..., None, :] @ s)[..., 0, :]
    return o, s


# ----------------------------------------------------------------------------------------------- the module


class GatedDeltaNet(nn.Module):
    """The Gated DeltaNet mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters: ``q_proj``, ``k_proj`` ``[n_heads · key_head_dim, d_model]``, ``v_proj``, ``g_proj`` (the output
    gate) ``[n_value_heads · value_head_dim, d_model]``, ``b_proj`` (β) and ``a_proj`` (α) ``[n_value_heads,
    d_model]``, ``conv1d`` over ``[q; k; v]``, ``dt_bias`` and ``A_log`` ``[n_value_heads]``, ``norm.weight``
    ``[value_head_dim]`` (shared by the heads), ``out_proj`` ``[d_model, n_value_heads · value_head_dim]``.
    """

    #: the per-head decay parameters and the depthwise filter are fixed-fan-in vectors (no width multiplier, no Muon step)
    param_roles = {"dt_bias": "bias", "A_log": "vector", "conv1d.weight": "vector", "conv1d.bias": "bias"}

    def __init__(self, cfg: GatedDeltaNetConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.n_heads, self.n_value_heads = cfg.n_heads, cfg.value_heads
        self.key_head_dim, self.value_head_dim, self.d_conv = cfg.key_head_dim, cfg.value_head_dim, cfg.d_conv
        self.chunk_size, self.allow_neg_eigval = cfg.chunk_size, cfg.allow_neg_eigval
        self.key_dim = self.n_heads * self.key_head_dim
        self.value_dim = self.n_value_heads * self.value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.q_proj = nn.Linear(d, self.key_dim, bias=False)
        self.k_proj = nn.Linear(d, self.key_dim, bias=False)
        self.v_proj = nn.Linear(d, self.value_dim, bias=False)
        self.g_proj = nn.Linear(d, self.value_dim, bias=False)
        self.b_proj = nn.Linear(d, self.n_value_heads, bias=False)
        self.a_proj = nn.Linear(d, self.n_value_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, bias=cfg.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.n_value_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_value_heads))
        self.norm = GatedRMSNorm(self.value_head_dim, cfg.norm_eps, norm_before_gate=True)
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the convolution window ``conv [conv_dim, d_conv - 1]`` (cache dtype) and the state
        ``recurrent [n_value_heads, key_head_dim, value_head_dim]`` (float32). Nothing per token."""
        return CacheSpec(
            (
                CacheEntry("conv", (self.conv_dim, self.d_conv - 1), growth="sequence"),
                CacheEntry(
                    "recurrent",
                    (self.n_value_heads, self.key_head_dim, self.value_head_dim),
                    growth="sequence",
                    dtype=torch.float32,
                ),
            )
        )

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """Qwen3-Next's init: ``dt_bias = 1``, ``A`` uniform in ``[0.01, 16]`` (``A_log = log A``), the convolution
        ``U(±1/sqrt(d_conv))`` (zero bias); the projections are ``nn.Linear`` children initialised by the model's rule."""
        init.ones_(self.dt_bias)
        a = torch.empty(self.n_value_heads)
        init.uniform_(a, 0.01, 16.0)
        init.copy_(self.A_log, a.log())
        bound = self.d_conv**-0.5
        init.uniform_(self.conv1d.weight, -bound, bound)
        if self.conv1d.bias is not None:
            init.zeros_(self.conv1d.bias)

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """``{projection: (heads, width per head)}``."""
        return {
            "q_proj": (self.n_heads, self.key_head_dim),
            "k_proj": (self.n_heads, self.key_head_dim),
            "v_proj": (self.n_value_heads, self.value_head_dim),
            "g_proj": (self.n_value_heads, self.value_head_dim),
        }

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given.

        One token (``seq == 1``) takes the recurrent step, more the chunkwise form; both start from the cached state.
        """
        bsz, s, _ = x.shape
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, torch.float32)
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        qkv = zero_padding(qkv, mask)
        starts = document_starts(inputs.documents)  # the state and the convolution restart at each document
        qkv = nn.functional.silu(causal_conv(qkv, self.conv1d, state, starts=starts)).float()
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        rep = self.n_value_heads // self.n_heads
        q = l2_normalise(q.view(bsz, s, self.n_heads, self.key_head_dim)) * self.key_head_dim**-0.5
        k = l2_normalise(k.view(bsz, s, self.n_heads, self.key_head_dim))
        if rep > 1:  # grouped values: key head i serves value heads i·rep .. i·rep + rep - 1
            q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
        v = v.view(bsz, s, self.n_value_heads, self.value_head_dim)
        beta = torch.sigmoid(self.b_proj(x).float())
        if self.allow_neg_eigval:  # β in (0, 2): I - β k kᵀ may reflect (Grazzi et al. 2024, arXiv:2411.12537)
            beta = 2.0 * beta
        beta = zero_padding(beta, mask)  # padding writes nothing
        g = -self.A_log.float().exp() * nn.functional.softplus(self.a_proj(x).float() + self.dt_bias.float())
        g = zero_padding(g, mask)  # and does not decay the state
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [b, H, s, ...]
        beta, g = beta.transpose(1, 2), g.transpose(1, 2)
        s0 = state["recurrent"] if state is not None else None
        if s == 1:
            s0 = s0 if s0 is not None else q.new_zeros(bsz, self.n_value_heads, self.key_head_dim, self.value_head_dim)
            reset = None if starts is None else starts[:, 0]
            o, s1 = delta_rule_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], g[:, :, 0], beta[:, :, 0], s0, reset)
            o = o[:, :, None]
        else:
            o, s1 = delta_rule_chunked(q, k, v, g, beta, self.chunk_size, s0, starts)
        if state is not None:
            state.write("recurrent", s1)
        o = o.transpose(1, 2)  # [b, s, H, dv]
        gate = self.g_proj(x).view(bsz, s, self.n_value_heads, self.value_head_dim)
        o = self.norm(o, gate).reshape(bsz, s, self.value_dim)
        return self.out_proj(o.to(x.dtype))


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: GatedDeltaNetConfig, ctx: BuildContext) -> int:
    d = ctx.d_model
    kd, vd, hv = cfg.n_heads * cfg.key_head_dim, cfg.value_heads * cfg.value_head_dim, cfg.value_heads
    conv_dim = 2 * kd + vd
    n = d * (2 * kd + 2 * vd + 2 * hv)  # q, k, v, output gate, β, α projections
    n += conv_dim * cfg.d_conv + conv_dim * cfg.conv_bias
    n += 2 * hv + cfg.value_head_dim  # dt_bias, A_log, the norm's weight
    return n + vd * d


def _flops(cfg: GatedDeltaNetConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts; triangular solves with the formula of
    :func:`modkit.analysis.cost.flop_counter`): the six projections, the convolution and ``out_proj`` on ``work.tokens`` rows;
    one token (``work.new == 1``) reads the state twice, ``4 · batch · H · dk · dv``; more tokens take the chunkwise
    form (``c`` chunks of ``L = min(chunk_size, new)``): ``batch · H · c · (4 L² dk + L(L-1)(dk + dv) + 2 L² dv +
    6 L dk dv)`` (``H`` value heads). Constant per token in the cached context."""
    d = ctx.d_model
    H, dk, dv = cfg.value_heads, cfg.key_head_dim, cfg.value_head_dim
    kd, vd = cfg.n_heads * dk, H * dv
    t, b, s = work.tokens, work.batch, work.new
    out = {
        "qk_proj": 2 * t * d * 2 * kd,
        "v_proj": 2 * t * d * vd,
        "g_proj": 2 * t * d * vd,
        "ab_proj": 2 * t * d * 2 * H,
        "conv": 2 * t * (2 * kd + vd) * cfg.d_conv,
        "out_proj": 2 * t * vd * d,
    }
    if s == 1:
        out["delta_rule"] = 4 * b * H * dk * dv
    else:
        L = min(cfg.chunk_size, s)
        c = -(-s // L)
        out["delta_rule"] = b * H * c * (4 * L * L * dk + L * (L - 1) * (dk + dv) + 2 * L * L * dv + 6 * L * dk * dv)
    return out


_MATH = r"""Per value head with state $S_t \in \mathbb{R}^{d_k \times d_v}$ ($d_k$ = key_head_dim, $d_v$ =
value_head_dim), $q_t, k_t$ L2-normalised after the causal convolution ($q_t$ also scaled by $d_k^{-1/2}$), $\beta_t
= \sigma(b_t)$ and $\alpha_t = e^{g_t}$ with $g_t = -e^{A^{log}} \mathrm{softplus}(a_t + b_{dt}) < 0$:

$$S_t = \alpha_t \left(I - \beta_t k_t k_t^\top\right) S_{t-1} + \beta_t\, k_t v_t^\top, \qquad o_t = S_t^\top q_t$$

the delta rule (write $v_t$ where $S$ stored $S_{t-1}^\top k_t$, at rate $\beta_t$) with a decay $\alpha_t$ (the
gating of Mamba-2). The output is $W_{out}\, \big(\mathrm{RMSNorm}(o_t) \odot \mathrm{silu}(W_g x_t)\big)$ per head. The
chunkwise form gathers $L$ = chunk_size updates: inside a chunk, with $\Gamma_{ts} = \prod_{s < r \le t} \alpha_r$,
$U = (I + \mathrm{tril}(\mathrm{diag}(\beta) K K^\top \odot \Gamma, -1))^{-1} \mathrm{diag}(\beta) V$ are the corrected
values, so the chunk needs one triangular solve and a few $L \times L$ products. The cache keeps $S$ ($n_v \cdot d_k
\cdot d_v$ float32 numbers) and the last d_conv $- 1$ convolution inputs, per sequence."""


@hookimpl
def register_components(register) -> None:
    """Register ``gated_deltanet`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="gated_deltanet",
            config=GatedDeltaNetConfig,
            factory=lambda cfg, ctx: GatedDeltaNet(cfg, ctx),
            description="Gated DeltaNet recurrent token mixer (Qwen3-Next's linear attention): q, k, v with a causal "
            "depthwise conv1d and silu, L2-normalised q and k, the gated delta-rule state update (decay alpha, write "
            "strength beta; chunkwise form for training and prefill, recurrent step for decoding, the same numbers), "
            "output gate through a gated RMSNorm, out_proj. [batch, seq, d_model] -> [batch, seq, d_model]; the cache "
            "holds a fixed-size state per sequence (conv window + [n_value_heads, key_head_dim, value_head_dim] float32).",
            reference="Yang, Kautz & Hatamizadeh 2024, Gated Delta Networks: Improving Mamba2 with Delta Rule, "
            "arXiv:2412.06464; Qwen3-Next (transformers Qwen3NextGatedDeltaNet)",
            capabilities={**RECURRENT_CAPABILITIES, "overflow_prone": True},
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={
                "type": "gated_deltanet",
                "n_heads": 2,
                "n_value_heads": 4,
                "key_head_dim": 8,
                "value_head_dim": 8,
                "chunk_size": 4,
            },
        )
    )
