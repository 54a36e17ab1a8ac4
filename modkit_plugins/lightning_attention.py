"""Lightning attention: MiniMax-01's linear attention with a fixed exponential decay per head.

``[batch, seq, d_model] -> [batch, seq, d_model]``. Per token, ``qkv_proj`` and ``silu`` give ``n_heads`` heads of
queries, keys and values (``head_dim`` each; the features of head ``h`` are its ``q``, ``k``, ``v`` side by side, as
in MiniMax's ``qkv_proj``). Each head keeps a state ``S ∈ R^{head_dim × head_dim}`` decayed by ``λ_h = exp(-r_h)``
per token:

    S_t = λ_h S_{t-1} + k_t v_tᵀ        o_t = S_tᵀ q_t

(no softmax, no scaling of ``q``). The read-outs of all heads go through one RMSNorm over the ``n_heads · head_dim``
features, an output gate ``sigmoid(output_gate(x))`` and ``out_proj``. The rates are ALiBi's slopes, ``r_h = 2^{-8
(h + 1) / n_heads}``, scaled by MiniMax per layer: ``× (1 - l / (n_layers - 1 + 1e-5) + 1e-5)`` for layer ``l``
(``layer_decay``), so the first layer forgets fastest and the last one keeps ~everything.

**Two forms, the same numbers.** Training and prefill use the block-wise form of Lightning Attention-2: inside a
chunk of ``chunk_size`` tokens a masked ``[L, L]`` product ``(Q Kᵀ ⊙ D) V`` with ``D_ij = λ^{n_i - n_j}`` (``j ≤ i``),
plus the entering state read through ``λ^{n_i}``; the state then moves to the next chunk as ``λ^{n_L} S + (K ⊙
λ^{n_L - n})ᵀ V``. Here ``n_i`` counts the real tokens of the chunk up to ``i``, so the exponents are exact integers
times ``r`` (the closed forms of MiniMax's ``query_decay`` / ``key_decay`` / ``diagonal_decay``). Decoding one
token runs the recurrence above. Both start from the cached state.

**State.** Per sequence, whatever the context: ``recurrent [n_heads, head_dim, head_dim]`` (float32). Padding tokens
change nothing (their ``q``, ``k``, ``v`` zeroed and no decay: ``λ = 1`` there), so left padding is exact.

**Document boundaries.** With ``inputs.documents`` (document-masked packing) the state entering each document of a
packed row is zero: ``λ = 0`` into a document's first token in the step, and in the block-wise form every decay
over a range holding a start is masked (:func:`modkit.plugin.chunk_boundaries`): each document gives its numbers
alone.

References: Qin et al. 2024, Lightning Attention-2: A Free Lunch for Handling Unlimited Sequence Lengths in Large
Language Models (arXiv:2401.04658), the block-wise form; MiniMax et al. 2025, MiniMax-01: Scaling Foundation Models
with Lightning Attention (arXiv:2501.08313), the layer (silu, norm, output gate, the per-layer decay); transformers
``MiniMaxLightningAttention`` (modeling_minimax.py, read, not copied) for the layout and the slopes; Press et al.
2022 (ALiBi, arXiv:2108.12409) for the base slopes.
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
    chunk_boundaries,
    Component,
    ComponentConfig,
    document_starts,
    Epsilon,
    HeadCount,
    HeadDim,
    hookimpl,
    MAX_EPS,
    MIN_EPS,
    padding_mask,
    Workload,
    zero_padding,
)


class LightningAttentionConfig(ComponentConfig):
    """Config of ``lightning_attention`` (MiniMax-01's ``linear_attention`` layers)."""

    type: Literal["lightning_attention"] = "lightning_attention"
    n_heads: HeadCount = Field(..., description="heads, each with its own decay (MiniMax's num_attention_heads)")
    head_dim: Optional[HeadDim] = Field(
        None, description="width of a head (q, k, v and the state); default d_model / n_heads"
    )
    layer_decay: bool = Field(
        True,
        description="scale the rates by 1 - l / (n_layers - 1 + 1e-5) + 1e-5 for layer l, as MiniMax does (later "
        "layers forget slower); false: the ALiBi slopes as they are in every layer",
    )
    norm_eps: Epsilon = Field(
        1e-6, description=f"epsilon of the RMSNorm of the read-out; within [{MIN_EPS:g}, {MAX_EPS:g}] (MiniMax: 1e-6)"
    )
    chunk_size: int = Field(
        64,
        ge=1,
        le=1024,
        description="chunk length of the block-wise form used for training and prefill; changes the speed, not the "
        "numbers (MiniMax's block_size: 256)",
    )

    def width(self, d_model: int) -> int:
        """``head_dim``, or ``d_model // n_heads``."""
        return self.head_dim if self.head_dim is not None else d_model // self.n_heads

    def position_geometry(self, ctx):
        """No position scheme acts here (the decays carry the order)."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """Without ``head_dim``, ``n_heads`` divides ``d_model``."""
        if self.head_dim is None and ctx.d_model % self.n_heads:
            return [
                ("head_dim", f"d_model = {ctx.d_model} is not a multiple of n_heads = {self.n_heads}: set head_dim")
            ]
        return []


def decay_rates(n_heads: int, layer_index: int, n_layers: int, layer_decay: bool) -> Tensor:
    """``[n_heads]`` float64 rates ``r_h`` (per-token decay ``exp(-r_h)``): ``2^{-8 (h + 1) / n_heads}``, times ``1 -
    l / (n_layers - 1 + 1e-5) + 1e-5`` with ``layer_decay`` (transformers ``MiniMaxLightningAttention.get_slope_rate``)."""
    rates = (2.0 ** (-8.0 / n_heads)) ** torch.arange(1, n_heads + 1, dtype=torch.float64)
    if layer_decay:
        rates = rates * (1 - layer_index / (n_layers - 1 + 1e-5) + 1e-5)
    return rates


# ----------------------------------------------------------------------------------------------- the two forms


def lightning_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rates: Tensor,
    real: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The block-wise form of decayed linear attention (Lightning Attention-2).

    Args:
        q, k, v: ``[batch, H, T, d]`` (padding tokens zero); rates: ``[H]`` (``r_h ≥ 0``, decay ``exp(-r_h)`` per
        real token); real: ``[batch, T]`` 0/1 (0: a padding token, which does not decay the state); chunk: ``L``
        (``min(chunk, T)`` used); state: ``[batch, H, d, d]`` or ``None`` (zeros); starts: ``[batch, T]`` bool, True
        where a document starts (the state entering it is zero; a True at 0 drops ``state``), or ``None``.
        Float32 or float64, all in one dtype.

    Returns:
        ``(o [batch, H, T, d], final state [batch, H, d, d])``.

    FLOPs (``FlopCounterMode``; ``c`` chunks of ``L``, the sequence padded to ``c · L``): ``batch · H · c · (4 L² d +
    4 L d²)`` (``Q Kᵀ``, its product with ``V``, the read of the entering state, the state's update).
    """
    b, H, T, d = k.shape
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    if pad:  # the tail padding: zero inputs, no decay
        q, k, v = (nn.functional.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        real = nn.functional.pad(real, (0, pad))
    q, k, v = (t.reshape(b, H, nc, L, d) for t in (q, k, v))
    n = real.reshape(b, 1, nc, L).cumsum(-1)  # real tokens from the chunk start to i, included: exact integers
    r = rates[None, :, None, None]  # [1, H, 1, 1]
    lower = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    # decay from token j to token i of a chunk, exp(-r (n_i - n_j)) for j <= i, 0 above the diagonal
    steps = (n[..., :, None] - n[..., None, :]).clamp(min=0)
    gamma = torch.exp(-r[..., None] * steps) * lower  # [b, H, c, L, L]
    from_start, k_decay = torch.exp(-r * n), torch.exp(-r * (n[..., -1:] - n))  # [b, H, c, L]
    end = torch.exp(-r[..., 0] * n[..., -1])  # [b, H, c]
    if starts is not None:  # no decay product reaches across a document start (flash-linear-attention's cu_seqlens)
        bounds = chunk_boundaries(starts, L, q.dtype)
        gamma, end = gamma * bounds.same[:, None], end * bounds.whole[:, None]
        from_start, k_decay = from_start * bounds.from_start[:, None], k_decay * bounds.to_end[:, None]
    attn = (q @ k.transpose(-1, -2)) * gamma  # causal, decayed q·k inside the chunk
    intra = attn @ v
    q_in = q * from_start[..., None]  # what the entering state contributes, decayed to each token
    k_out = (k * k_decay[..., None]).transpose(-1, -2)  # each token's key decayed to the chunk end
    s = state if state is not None else q.new_zeros(b, H, d, d)
    out = []
    for q_i, intra_i, k_i, v_i, end_i in zip(*(t.unbind(2) for t in (q_in, intra, k_out, v, end[..., None, None]))):
        out.append(q_i @ s + intra_i)
        s = end_i * s + k_i @ v_i
    o = torch.stack(out, 2).reshape(b, H, nc * L, d)[:, :, :T]
    return o, s


def lightning_step(
    q: Tensor, k: Tensor, v: Tensor, decay: Tensor, state: Tensor, reset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """One token: ``S = λ S + k vᵀ``; ``o = Sᵀ q``.

    Args:
        q, k, v: ``[batch, H, d]``; decay: ``[batch, H]`` (``λ = exp(-r_h)``, 1 on a padding token); state:
        ``[batch, H, d, d]``; reset: ``[batch]`` bool, True where the token starts a document (``λ = 0``: the state
        before it is dropped), or ``None``.

    Returns:
        ``(o [batch, H, d], new state)``. FLOPs: ``2 · batch · H · d²`` (the read-out; the outer product is
        element-wise).
    """
    if reset is not None:
        decay = decay * (~reset)[:, None].to(decay.dtype)
    s = state * decay[..., None, None] + k[..., :, None] * v[..., None, :]
    o = (q[..., None, :] @ s)[..., 0, :]
    return o, s


# ----------------------------------------------------------------------------------------------- the module


class LightningAttention(nn.Module):
    """The lightning-attention mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters: ``qkv_proj`` ``[3 · n_heads · head_dim, d_model]`` (per head: its ``q``, ``k``, ``v`` rows side by
    side), ``output_gate`` ``[n_heads · head_dim, d_model]``, ``norm.weight`` ``[n_heads · head_dim]``, ``out_proj``
    ``[d_model, n_heads · head_dim]``: transformers' ``MiniMaxLightningAttention`` names and layouts. The rates are a
    non-persistent buffer ``rates [n_heads]`` (float32) that :meth:`init_weights` fills.
    """

    param_roles = {"norm.weight": "norm_gain"}

    def __init__(self, cfg: LightningAttentionConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.n_heads, self.head_dim, self.chunk_size = cfg.n_heads, cfg.width(d), cfg.chunk_size
        self.inner = self.n_heads * self.head_dim
        self.rate_args = (self.n_heads, ctx.layer_index or 0, ctx.n_layers, cfg.layer_decay)
        self.qkv_proj = nn.Linear(d, 3 * self.inner, bias=False)
        self.output_gate = nn.Linear(d, self.inner, bias=False)
        self.norm = nn.RMSNorm(self.inner, eps=cfg.norm_eps)
        self.out_proj = nn.Linear(self.inner, d, bias=False)
        self.register_buffer("rates", torch.empty(self.n_heads, dtype=torch.float32), persistent=False)

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the state ``recurrent [n_heads, head_dim, head_dim]`` (float32). Nothing per token."""
        shape = (self.n_heads, self.head_dim, self.head_dim)
        return CacheSpec((CacheEntry("recurrent", shape, growth="sequence", dtype=torch.float32),))

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """``norm.weight = 1`` and the rates of :func:`decay_rates`; the projections are ``nn.Linear`` children
        initialised by the model's rule."""
        init.ones_(self.norm.weight)
        init.copy_(self.rates, decay_rates(*self.rate_args))

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """``{projection: (heads, width per head)}``: ``qkv_proj`` holds ``3 · head_dim`` rows per head."""
        return {"qkv_proj": (self.n_heads, 3 * self.head_dim), "output_gate": (self.n_heads, self.head_dim)}

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given.

        One token (``seq == 1``) takes the recurrent step, more the block-wise form; both start from the cached state.
        """
        bsz, s, _ = x.shape
        dtype = torch.promote_types(x.dtype, torch.float32)  # the scan in float32 (float64 for a float64 model)
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, dtype)
        qkv = zero_padding(nn.functional.silu(self.qkv_proj(x)).to(dtype), mask)
        qkv = qkv.view(bsz, s, self.n_heads, 3 * self.head_dim).transpose(1, 2)  # [b, H, s, 3 d]
        q, k, v = qkv.split(self.head_dim, dim=-1)
        real = mask[..., 0] if mask is not None else x.new_ones(bsz, s, dtype=dtype)
        starts = document_starts(inputs.documents)
        rates = self.rates.to(dtype)
        s0 = state["recurrent"].to(dtype) if state is not None else None
        if s == 1:
            s0 = s0 if s0 is not None else q.new_zeros(bsz, self.n_heads, self.head_dim, self.head_dim)
            decay = torch.exp(-rates[None, :] * real)  # λ, 1 on padding
            reset = None if starts is None else starts[:, 0]
            o, s1 = lightning_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], decay, s0, reset)
            o = o[:, :, None]
        else:
            o, s1 = lightning_chunked(q, k, v, rates, real, self.chunk_size, s0, starts)
        if state is not None:
            state.write("recurrent", s1)
        o = self.norm(o.transpose(1, 2).reshape(bsz, s, self.inner)).to(x.dtype)
        return self.out_proj(torch.sigmoid(self.output_gate(x)) * o)


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: LightningAttentionConfig, ctx: BuildContext) -> int:
    d, inner = ctx.d_model, cfg.n_heads * cfg.width(ctx.d_model)
    return 3 * inner * d + inner * d + inner + inner * d


def _flops(cfg: LightningAttentionConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts): ``qkv_proj``, ``output_gate`` and
    ``out_proj`` on ``work.tokens`` rows; one token (``work.new == 1``) reads the state, ``2 · batch · H · d²``;
    more tokens take the block-wise form (``c`` chunks of ``L = min(chunk_size, new)``): ``batch · H · c · (4 L² d
    + 4 L d²)``. Constant per token in the cached context."""
    d_model, H, d = ctx.d_model, cfg.n_heads, cfg.width(ctx.d_model)
    t, b, s = work.tokens, work.batch, work.new
    out = {"qkv_proj": 2 * t * d_model * 3 * H * d, "output_gate": 2 * t * d_model * H * d}
    out["out_proj"] = 2 * t * H * d * d_model
    if s == 1:
        out["linear_attention"] = 2 * b * H * d * d
    else:
        L = min(cfg.chunk_size, s)
        c = -(-s // L)
        out["linear_attention"] = b * H * c * (4 * L * L * d + 4 * L * d * d)
    return out


_MATH = r"""Per head $h$ with state $S_t \in \mathbb{R}^{d \times d}$ ($d$ = head_dim), $[q_t; k_t; v_t] =
\mathrm{silu}(W_{qkv} x_t)$ and a fixed decay $\lambda_h = e^{-r_h}$, $r_h = 2^{-8h/H}\,(1 - \tfrac{l}{N - 1} )$
(layer $l$ of $N$, with layer_decay):

$$S_t = \lambda_h S_{t-1} + k_t v_t^\top, \qquad o_t = S_t^\top q_t = \sum_{s \le t} \lambda_h^{t-s} (q_t \cdot k_s)\, v_s$$

The output is $W_{out}\big(\sigma(W_g x_t) \odot \mathrm{RMSNorm}([o_t^1; \dots; o_t^H])\big)$. The block-wise form
computes a chunk of $L$ = chunk_size tokens as $(Q K^\top \odot D) V + (Q \odot \Lambda_q) S$ with $D_{ij} =
\lambda^{i-j}$ for $j \le i$, then $S \leftarrow \lambda^L S + (K \odot \Lambda_k)^\top V$. The cache keeps $S$: $H
d^2$ float32 numbers per sequence, whatever the context."""


@hookimpl
def register_components(register) -> None:
    """Register ``lightning_attention`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="lightning_attention",
            config=LightningAttentionConfig,
            factory=lambda cfg, ctx: LightningAttention(cfg, ctx),
            description="Lightning attention (MiniMax-01's linear attention): silu(qkv_proj), linear attention with a "
            "fixed exponential decay per head (block-wise form for training and prefill, recurrent step for decoding, "
            "the same numbers), RMSNorm, sigmoid output gate, out_proj. [batch, seq, d_model] -> [batch, seq, "
            "d_model]; the cache holds a [n_heads, head_dim, head_dim] float32 state per sequence.",
            reference="Qin et al. 2024, Lightning Attention-2, arXiv:2401.04658; MiniMax 2025, MiniMax-01, "
            "arXiv:2501.08313; transformers MiniMaxLightningAttention",
            capabilities=dict(RECURRENT_CAPABILITIES),
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={"type": "lightning_attention", "n_heads": 2, "head_dim": 8, "chunk_size": 4},
        )
    )
