"""Mamba-2: the state-space duality (SSD) layer, a recurrent token mixer with a per-head scalar decay.

``[batch, seq, d_model] -> [batch, seq, d_model]``. One projection ``in_proj`` gives, per token, the gate ``z``
(``d_inner``), the SSM input ``x`` (``d_inner = n_heads · head_dim``), ``B`` and ``C`` (``n_groups · d_state`` each;
the heads of a group share them, like key/value heads in GQA) and a step size per head ``Δ``; ``x``, ``B`` and ``C``
go through a short causal depthwise convolution (kernel ``d_conv``) and ``silu``. Per head ``h`` with state
``S ∈ R^{head_dim × d_state}``:

    a_t = Δ_t · A_h  (A_h = -exp(A_log_h) < 0, Δ_t = softplus(Δ_raw + dt_bias_h))
    S_t = exp(a_t) · S_{t-1} + Δ_t · x_t ⊗ B_t,      y_t = S_t · C_t + D_h · x_t

then ``y`` is gated by ``silu(z)`` through an RMSNorm per group (or, without the norm, multiplied by ``silu(z)``) and
projected back by ``out_proj``.

**Two forms, the same numbers.** Training and prefill use the chunked (SSD) form: the sequence is cut into chunks of
``chunk_size`` tokens; inside a chunk the output is a masked ``[L, L]`` product ``(C Bᵀ ⊙ exp(segsum(a)) ⊙ Δ) x`` (the
"attention-like" diagonal blocks), each chunk's contribution to the state is one product, and the states are passed
from chunk to chunk by their decays (a loop over chunks). Decoding one token uses the recurrence above. Both start
from the cached state, so a prefill in chunks, then one token at a time, equals the full forward.

**State.** Per sequence, whatever the context: the convolution window ``conv [conv_dim, d_conv - 1]`` (in the cache
dtype) and the SSM state ``ssm [n_heads, head_dim, d_state]`` (float32): ``modkit cost`` reports it as
``cache_state_bytes_per_sequence``, constant in the context length. Padding tokens (``inputs.token_mask`` False)
change nothing: their convolution inputs and step sizes are zeroed (no decay, no write), so left padding is exact.

**Document boundaries.** With ``inputs.documents`` (document-masked packing) the state entering each document of a
packed row is zero and the convolution takes no input from the previous document: the decay into a document's first
token is 0 (in the chunked form, the decays of every range holding a start are masked:
:func:`~modkit.nn.recurrent.chunk_boundaries`), as mamba_ssm does with its per-token ``seq_idx``. Each document then
gives the numbers it gives alone.

References: Dao & Gu 2024, Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State
Space Duality (arXiv:2405.21060), §6 (the SSD algorithm) and §7 (the Mamba-2 block: parallel projections, groups,
the gated norm); transformers ``Mamba2Mixer`` (its non-kernel PyTorch path, read, not copied) for the parameter
layout (``in_proj`` = ``[z, x, B, C, Δ]``, ``conv1d``, ``dt_bias``, ``A_log``, ``D``, ``norm``, ``out_proj``) and
Falcon-H1's variant (``FalconH1Mixer``: norm before the gate, an optional norm, per-part projection multipliers).
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    RECURRENT_CAPABILITIES,
    AttentionInputs,
    bounded_float,
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
    MAX_DT,
    MAX_DT_CLAMP,
    MAX_EPS,
    MAX_EXPAND,
    MAX_MULTIPLIER,
    MIN_DT,
    MIN_EPS,
    padding_mask,
    StepSize,
    Workload,
    zero_padding,
)

#: the parts of ``in_proj``'s output, in order (what ``projection_multipliers`` scales)
PARTS = ("z", "x", "B", "C", "dt")


#: what the description of an initial step size adds: its bound (modkit.core.limits) and why
_DT = (
    f"; within [{MIN_DT:g}, {MAX_DT:g}] (Mamba: floor 1e-4, range 0.001-0.1): Δ is stored as softplus⁻¹(Δ), which is "
    "-inf for a Δ that rounds to 0 in float32 and overflows for a huge one"
)


class Mamba2Config(ComponentConfig):
    """Config of ``mamba2``: the SSD layer of Mamba-2 (and Falcon-H1's Mamba-2 layers)."""

    type: Literal["mamba2"] = "mamba2"
    d_state: HeadDim = Field(128, description="N: the state size per head (rows of B and C); Mamba-2 uses 64-256")
    head_dim: HeadDim = Field(64, description="P: channels per head (the paper's headdim)")
    expand: float = Field(
        2.0,
        gt=0,
        le=MAX_EXPAND,
        description=f"d_inner = expand · d_model when d_inner is not given; at most {MAX_EXPAND:g} (Mamba, Mamba-2, "
        "Jamba and Falcon-H1 use 2), so d_inner stays a size torch can allocate",
    )
    d_inner: Optional[int] = Field(
        None,
        gt=0,
        description="width of x and z (= n_heads · head_dim); default expand · d_model "
        "(Falcon-H1's mamba_d_ssm sets it on its own)",
    )
    n_groups: HeadCount = Field(
        1, description="groups of heads sharing B and C (like key/value heads in GQA); divides n_heads"
    )
    d_conv: int = Field(4, ge=2, le=64, description="kernel of the causal depthwise convolution over x, B and C")
    conv_bias: bool = Field(True, description="bias on the convolution")
    in_proj_bias: bool = Field(False, description="bias on in_proj")
    out_proj_bias: bool = Field(False, description="bias on out_proj")
    gated_norm: bool = Field(
        True,
        description="RMSNorm of the output gated by silu(z) (Mamba-2); false: y · silu(z) "
        "alone (Falcon-H1's mamba_rms_norm = false)",
    )
    norm_before_gate: bool = Field(
        False,
        description="the gated norm normalises first, then gates (Falcon-H1); false: gate then normalise (Mamba-2)",
    )
    norm_eps: Epsilon = Field(
        1e-5,
        description=f"epsilon of the gated norm; within [{MIN_EPS:g}, {MAX_EPS:g}] (Mamba-2: 1e-5; a smaller eps is 0 "
        "in float32)",
    )
    chunk_size: int = Field(
        64,
        ge=1,
        le=4096,
        description="chunk length of the chunked (SSD) form used for training and prefill; changes the speed, not "
        "the numbers. Default 64: the fastest forward + backward at 4K tokens and within 5% of the fastest at 256 "
        "and 1K among 32-256 (benchmarks/bench_mixers.py, chunk-size table in benchmarks/results_mixers.md)",
    )
    dt_clamp_min: float = Field(
        0.0,
        ge=0,
        le=MAX_DT_CLAMP,
        description="Δ is clamped to at least this (transformers' time_step_limit[0]: 0); at most "
        f"{MAX_DT_CLAMP:g}, where exp(-A·Δ) is already 0 for every head",
    )
    dt_clamp_max: Optional[float] = Field(
        None,
        gt=0,
        le=MAX_DT_CLAMP,
        description="Δ is clamped to at most this; null for no bound (time_step_limit[1] = inf); at most "
        f"{MAX_DT_CLAMP:g}, where exp(-A·Δ) is already 0 for every head",
    )
    dt_init_min: StepSize = Field(
        0.001,
        description="initial Δ is log-uniform in [dt_init_min, dt_init_max]" + _DT,
    )
    dt_init_max: StepSize = Field(
        0.1,
        description="see dt_init_min" + _DT,
    )
    dt_init_floor: StepSize = Field(
        1e-4,
        description="initial Δ is at least this" + _DT,
    )
    projection_multipliers: Optional[list[bounded_float(-MAX_MULTIPLIER, MAX_MULTIPLIER)]] = Field(
        None,
        min_length=5,
        max_length=5,
        description="multipliers of in_proj's parts [z, x, B, C, Δ] (Falcon-H1's ssm_multipliers, μP); null for none. "
        f"Each within ±{MAX_MULTIPLIER:g}, far beyond published values (0.2-2), so the projections stay finite",
    )

    def resolved_d_inner(self, d_model: int) -> int:
        """``d_inner``, or ``int(expand · d_model)``."""
        return self.d_inner if self.d_inner is not None else int(self.expand * d_model)

    def n_heads(self, d_model: int) -> int:
        """``d_inner // head_dim``."""
        return self.resolved_d_inner(d_model) // self.head_dim

    def position_geometry(self, ctx):
        """No queries or keys: a rotary or bias position scheme does not act here."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """``head_dim`` divides ``d_inner``; ``n_groups`` divides the heads; the Δ init range is ordered."""
        errors = []
        d_inner = self.resolved_d_inner(ctx.d_model)
        field = "d_inner" if self.d_inner is not None else "expand"
        if d_inner < 1 or d_inner % self.head_dim:
            errors.append(
                (
                    field,
                    f"d_inner = {d_inner} is not a multiple of head_dim = {self.head_dim}; choose d_inner "
                    "(or expand · d_model) = n_heads · head_dim",
                )
            )
        elif (d_inner // self.head_dim) % self.n_groups:
            errors.append(
                (
                    "n_groups",
                    f"n_groups = {self.n_groups} does not divide n_heads = d_inner / head_dim = "
                    f"{d_inner // self.head_dim}",
                )
            )
        if self.dt_init_min > self.dt_init_max:
            errors.append(("dt_init_min", f"dt_init_min = {self.dt_init_min} exceeds dt_init_max = {self.dt_init_max}"))
        if self.dt_clamp_max is not None and self.dt_clamp_max < self.dt_clamp_min:
            errors.append(
                ("dt_clamp_max", f"dt_clamp_max = {self.dt_clamp_max} is below dt_clamp_min = {self.dt_clamp_min}")
            )
        return errors


# ----------------------------------------------------------------------------------------------- the two forms


def segsum(a: Tensor) -> Tensor:
    """``[..., L] -> [..., L, L]``: entry ``(t, s)`` is ``Σ_{s < r ≤ t} a_r`` for ``s ≤ t`` and ``-inf`` above the
    diagonal, so ``exp(segsum(a))`` is the decay from token ``s`` to token ``t`` (0 for ``s > t``). Sums of the
    segment itself (a masked cumulative sum), not differences of prefix sums, which would lose digits."""
    L = a.shape[-1]
    below = torch.ones(L, L, dtype=torch.bool, device=a.device).tril(-1)
    # [..., r, s] = a_r where r > s, summed down the rows r <= t: entry (t, s) = Σ_{s < r <= t} a_r
    y = a[..., :, None].expand(*a.shape, L).masked_fill(~below, 0.0).cumsum(-2)
    return y.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=a.device).tril(), float("-inf"))


def ssd_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The chunked (SSD) form of the scan, without the ``D`` skip.

    Args:
        x: ``[batch, T, H, P]`` inputs; dt: ``[batch, T, H]`` step sizes (0 on padding); A: ``[H]`` (negative);
        B, C: ``[batch, T, G, N]`` (``G`` groups of ``H / G`` heads); chunk: the chunk length ``L`` (``min(chunk,
        T)`` is used); state: ``[batch, H, P, N]`` state before the first token, or ``None`` (zeros); starts:
        ``[batch, T]`` bool, True where a document starts (the decay into it is 0: the state entering it is zero;
        a True at 0 drops ``state``), or ``None``. Float32 (or float64).

    Returns:
        ``(y [batch, T, H, P], final state [batch, H, P, N])``.

    FLOPs (as ``FlopCounterMode`` counts them; ``c`` chunks of ``L``, the sequence padded to ``c · L``):
    ``batch · c · (2 G L² N + 2 H L² P + 4 H L P N)``: the ``C·Bᵀ`` scores per group, the scores times ``x``, the
    chunk states and the read-out of the state entering each chunk.
    """
    b, T, H, P = x.shape
    G, N = B.shape[-2:]
    r = H // G
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    if pad:  # padded tokens have Δ = 0: no decay, no write
        x, dt = nn.functional.pad(x, (0, 0, 0, 0, 0, pad)), nn.functional.pad(dt, (0, 0, 0, pad))
        B, C = (nn.functional.pad(t, (0, 0, 0, 0, 0, pad)) for t in (B, C))
    x = x.view(b, nc, L, G, r, P).permute(0, 1, 3, 4, 2, 5)  # [b, c, G, r, L, P]
    dt = dt.view(b, nc, L, G, r).permute(0, 1, 3, 4, 2)  # [b, c, G, r, L]
    B = B.view(b, nc, L, G, N).transpose(2, 3)  # [b, c, G, L, N]
    C = C.view(b, nc, L, G, N).transpose(2, 3)
    a = dt * A.view(G, r, 1)  # log decay of each step
    cum = a.cumsum(-1)  # [b, c, G, r, L]: from the chunk start
    decay = torch.exp(segsum(a))  # [b, c, G, r, L, L]
    to_end = torch.exp(cum[..., -1:] - cum)  # [b, c, G, r, L]: decay from s to the chunk end
    chunk_decay, entering_decay = torch.exp(cum[..., -1]), torch.exp(cum)  # [b, c, G, r], [b, c, G, r, L]
    if starts is not None:  # no decay reaches across a document start (mamba_ssm's seq_idx)
        bounds = chunk_boundaries(starts, L, x.dtype)
        decay = decay * bounds.same[:, :, None, None]
        to_end, entering_decay = (
            to_end * bounds.to_end[:, :, None, None],
            entering_decay * bounds.from_start[:, :, None, None],
        )
        chunk_decay = chunk_decay * bounds.whole[:, :, None, None]
    scores = C @ B.transpose(-1, -2)  # [b, c, G, L, L]: C_t · B_s, shared by the group's heads
    y = (scores[:, :, :, None] * decay * dt[..., None, :]) @ x  # diagonal blocks, [b, c, G, r, L, P]
    states = (x * (to_end * dt)[..., None]).transpose(-1, -2) @ B[:, :, :, None]  # [b, c, G, r, P, N]
    h = state.view(b, G, r, P, N) if state is not None else x.new_zeros(b, G, r, P, N)
    entering = []
    # pass the state from chunk to chunk (element-wise); unbind, not indexing: the backward of one index would
    # allocate (and sum into) a zero gradient of the whole [b, c, G, r, P, N] tensor per chunk
    for d_i, s_i in zip(chunk_decay[..., None, None].unbind(1), states.unbind(1)):
        entering.append(h)
        h = d_i * h + s_i
    start = torch.stack(entering, 1)  # [b, c, G, r, P, N]
    y = y + (C[:, :, :, None] @ start.transpose(-1, -2)) * entering_decay[..., None]  # the entering state's output
    y = y.permute(0, 1, 4, 2, 3, 5).reshape(b, nc * L, H, P)[:, :T]
    return y, h.reshape(b, H, P, N)


def ssd_step(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Tensor, reset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """One token of the recurrence, without the ``D`` skip: ``S = exp(Δ A) S + Δ x ⊗ B``, ``y = S C``.

    Args:
        x: ``[batch, H, P]``; dt: ``[batch, H]``; A: ``[H]``; B, C: ``[batch, G, N]``; state: ``[batch, H, P, N]``;
        reset: ``[batch]`` bool, True where the token starts a document (the decay is 0: ``S = Δ x ⊗ B``), or
        ``None``. Float32 (or float64).

    Returns:
        ``(y [batch, H, P], new state)``. FLOPs: ``2 · batch · H · P · N`` (the read-out ``S C``).
    """
    b, H, P = x.shape
    G, N = B.shape[-2:]
    r = H // G
    s = state.view(b, G, r, P, N)
    dA = torch.exp(dt * A)
    if reset is not None:
        dA = dA * (~reset)[:, None].to(dA.dtype)
    dA = dA.view(b, G, r, 1, 1)
    u = (dt[..., None] * x).view(b, G, r, P, 1) * B.view(b, G, 1, 1, N)
    s = dA * s + u
    y = (s.reshape(b, G, r * P, N) @ C.view(b, G, N, 1)).view(b, H, P)
    return y, s.reshape(b, H, P, N)


# ----------------------------------------------------------------------------------------------- the module


class Mamba2(nn.Module):
    """The Mamba-2 mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Attributes ``n_heads``, ``head_dim``, ``d_state``, ``n_groups``, ``d_inner``, ``d_conv`` describe the geometry;
    parameters ``in_proj`` ``[2 d_inner + 2 G N + H, d_model]``, ``conv1d`` ``[conv_dim, 1, d_conv]`` (``conv_dim = d_inner
    + 2 G N``), ``dt_bias``, ``A_log``, ``D`` ``[H]``, ``norm.weight`` ``[d_inner]`` (with the gated norm), ``out_proj``
    ``[d_model, d_inner]``.
    """

    #: the per-head scalars and the depthwise filter are fixed-fan-in vectors (no width multiplier, no Muon step)
    param_roles = {
        "dt_bias": "bias",
        "A_log": "vector",
        "D": "vector",
        "conv1d.weight": "vector",
        "conv1d.bias": "bias",
    }

    def __init__(self, cfg: Mamba2Config, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.d_inner = cfg.resolved_d_inner(d)
        self.head_dim, self.d_state, self.n_groups, self.d_conv = cfg.head_dim, cfg.d_state, cfg.n_groups, cfg.d_conv
        self.n_heads = self.d_inner // self.head_dim
        self.chunk_size = cfg.chunk_size
        self.conv_dim = self.d_inner + 2 * self.n_groups * self.d_state
        self.dt_clamp = (cfg.dt_clamp_min, cfg.dt_clamp_max)
        self.dt_init = (cfg.dt_init_min, cfg.dt_init_max, cfg.dt_init_floor)
        self.in_proj = nn.Linear(d, self.d_inner + self.conv_dim + self.n_heads, bias=cfg.in_proj_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.d_conv, groups=self.conv_dim, bias=cfg.conv_bias)
        self.dt_bias = nn.Parameter(torch.empty(self.n_heads))
        self.A_log = nn.Parameter(torch.empty(self.n_heads))
        self.D = nn.Parameter(torch.empty(self.n_heads))
        self.norm = (
            GatedRMSNorm(
                self.d_inner,
                cfg.norm_eps,
                group_size=self.d_inner // self.n_groups,
                norm_before_gate=cfg.norm_before_gate,
            )
            if cfg.gated_norm
            else None
        )
        self.out_proj = nn.Linear(self.d_inner, d, bias=cfg.out_proj_bias)
        self.multipliers = list(cfg.projection_multipliers) if cfg.projection_multipliers is not None else None
        if self.multipliers is not None:
            self.register_buffer("projection_scale", torch.empty(self.in_proj.out_features), persistent=False)
        else:
            self.projection_scale = None

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the convolution window ``conv [conv_dim, d_conv - 1]`` (cache dtype) and the SSM state
        ``ssm [n_heads, head_dim, d_state]`` (float32). Nothing per token."""
        return CacheSpec(
            (
                CacheEntry("conv", (self.conv_dim, self.d_conv - 1), growth="sequence"),
                CacheEntry("ssm", (self.n_heads, self.head_dim, self.d_state), growth="sequence", dtype=torch.float32),
            )
        )

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """Mamba-2's init: ``A = 1..n_heads`` (``A_log = log A``), ``D = 1``, ``Δ`` log-uniform in ``[dt_init_min,
        dt_init_max]`` (at least ``dt_init_floor``) stored as ``dt_bias = softplus⁻¹(Δ)``, the convolution
        ``U(±1/sqrt(d_conv))`` (PyTorch's default for its fan-in) with a zero bias; the projections are ``nn.Linear``
        children initialised by the model's rule."""
        init.copy_(self.A_log, torch.log(torch.arange(1, self.n_heads + 1, dtype=torch.float32)))
        init.ones_(self.D)
        lo, hi, floor = self.dt_init
        u = torch.empty(self.n_heads)
        init.uniform_(u, 0.0, 1.0)
        dt = torch.exp(u * (math.log(hi) - math.log(lo)) + math.log(lo)).clamp(min=floor)
        init.copy_(self.dt_bias, dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹
        bound = 1.0 / math.sqrt(self.d_conv)
        init.uniform_(self.conv1d.weight, -bound, bound)
        if self.conv1d.bias is not None:
            init.zeros_(self.conv1d.bias)
        if self.projection_scale is not None:
            sizes = (
                self.d_inner,
                self.d_inner,
                self.n_groups * self.d_state,
                self.n_groups * self.d_state,
                self.n_heads,
            )
            init.copy_(
                self.projection_scale, torch.cat([torch.full((n,), float(m)) for n, m in zip(sizes, self.multipliers)])
            )

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """No projection splits into heads as a whole (``in_proj`` holds several parts)."""
        return {}

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given.

        One token (``seq == 1``) takes the recurrent step, more the chunked form; both start from the cached state.
        """
        b, s, _ = x.shape
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, torch.float32)
        zxbcdt = self.in_proj(x)
        if self.projection_scale is not None:
            zxbcdt = zxbcdt * self.projection_scale.to(zxbcdt.dtype)
        z, xbc, dt = zxbcdt.split([self.d_inner, self.conv_dim, self.n_heads], dim=-1)
        starts = document_starts(inputs.documents)  # the state and the convolution restart at each document
        xbc = zero_padding(xbc, mask)  # the convolution sees zeros for padding, as before a sequence's first token
        xbc = zero_padding(nn.functional.silu(causal_conv(xbc, self.conv1d, state, starts=starts)), mask)
        xs, B, C = xbc.float().split([self.d_inner, self.n_groups * self.d_state, self.n_groups * self.d_state], dim=-1)
        dt = nn.functional.softplus(dt.float() + self.dt_bias.float())
        lo, hi = self.dt_clamp
        if lo > 0 or hi is not None:
            dt = dt.clamp(min=lo, max=hi)
        dt = zero_padding(dt, mask)  # padding: no decay, no write
        A = -torch.exp(self.A_log.float())
        xs = xs.view(b, s, self.n_heads, self.head_dim)
        B = B.view(b, s, self.n_groups, self.d_state)
        C = C.view(b, s, self.n_groups, self.d_state)
        h0 = state["ssm"] if state is not None else None
        if s == 1:  # the recurrent step (decoding)
            h0 = h0 if h0 is not None else xs.new_zeros(b, self.n_heads, self.head_dim, self.d_state)
            y, h = ssd_step(xs[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], h0, None if starts is None else starts[:, 0])
            y = y[:, None]
        else:
            y, h = ssd_chunked(xs, dt, A, B, C, self.chunk_size, h0, starts)
        if state is not None:
            state.write("ssm", h)
        y = y + xs * self.D.float()[:, None]
        y = y.reshape(b, s, self.d_inner)
        y = self.norm(y, z) if self.norm is not None else (y * nn.functional.silu(z.float()))
        return self.out_proj(y.to(x.dtype))


# ----------------------------------------------------------------------------------------------- declarations


def _geometry(cfg: Mamba2Config, d_model: int) -> tuple[int, int, int, int, int, int]:
    """``(d_inner, H, P, N, G, conv_dim)``."""
    d_inner = cfg.resolved_d_inner(d_model)
    H, P, N, G = d_inner // cfg.head_dim, cfg.head_dim, cfg.d_state, cfg.n_groups
    return d_inner, H, P, N, G, d_inner + 2 * G * N


def _param_count(cfg: Mamba2Config, ctx: BuildContext) -> int:
    d = ctx.d_model
    d_inner, H, P, N, G, conv_dim = _geometry(cfg, d)
    proj = d_inner + conv_dim + H
    n = d * proj + proj * cfg.in_proj_bias
    n += conv_dim * cfg.d_conv + conv_dim * cfg.conv_bias
    n += 3 * H  # dt_bias, A_log, D
    n += d_inner * cfg.gated_norm
    return n + d_inner * d + d * cfg.out_proj_bias


def _flops(cfg: Mamba2Config, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts): the projections and the convolution on
    ``work.tokens`` rows, then the scan: one token (``work.new == 1``) reads the state out, ``2 · batch · H · P · N``;
    more tokens take the chunked form (``c`` chunks of ``L = min(chunk_size, new)``, the sequence padded to ``c · L``):
    ``batch · c · (2 G L² N + 2 H L² P + 4 H L P N)``. The cached context does not enter: the cost per token is
    constant in the context length."""
    d = ctx.d_model
    d_inner, H, P, N, G, conv_dim = _geometry(cfg, d)
    t, b, s = work.tokens, work.batch, work.new
    out = {
        "in_proj": 2 * t * d * (d_inner + conv_dim + H),
        "conv": 2 * t * conv_dim * cfg.d_conv,
        "out_proj": 2 * t * d_inner * d,
    }
    if s == 1:
        out["scan"] = 2 * b * H * P * N
    else:
        L = min(cfg.chunk_size, s)
        c = -(-s // L)
        out["scan"] = b * c * (2 * G * L * L * N + 2 * H * L * L * P + 4 * H * L * P * N)
    return out


_MATH = r"""Per head $h$ (of $H$ = d_inner / head_dim) with state $S_t \in \mathbb{R}^{P \times N}$ ($P$ = head_dim,
$N$ = d_state), input $x_t \in \mathbb{R}^P$ and the group's $B_t, C_t \in \mathbb{R}^N$ (after the causal
convolution of width d_conv and $\mathrm{silu}$):

$$\Delta_t = \mathrm{softplus}(\Delta^{raw}_t + b_h), \qquad S_t = e^{\Delta_t A_h}\, S_{t-1} + \Delta_t\, x_t B_t^\top,
\qquad y_t = S_t\, C_t + D_h\, x_t$$

with $A_h = -e^{A^{log}_h} < 0$ a scalar per head (so $0 < e^{\Delta_t A_h} < 1$). The output is
$W_{out}\, \mathrm{RMSNorm}_g(y \odot \mathrm{silu}(z))$ (gate first; norm first with norm_before_gate; $y \odot
\mathrm{silu}(z)$ without gated_norm). Unrolled, $y_t = \sum_{s \le t} C_t^\top B_s\, e^{\sum_{s < r \le t} \Delta_r
A_h}\, \Delta_s x_s$: a causal, decaying "attention" of $C$ on $B$, which the chunked form computes as $L \times L$
blocks inside chunks of $L$ = chunk_size tokens and passes from chunk to chunk as the state $S$. The cache keeps
$S$ ($H \cdot P \cdot N$ float32 numbers) and the last d_conv $- 1$ convolution inputs, per sequence."""


@hookimpl
def register_components(register) -> None:
    """Register ``mamba2`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="mamba2",
            config=Mamba2Config,
            factory=lambda cfg, ctx: Mamba2(cfg, ctx),
            description="Mamba-2 (SSD) recurrent token mixer: in_proj to z, x, B, C and a step size per head; causal "
            "depthwise conv1d; selective state-space scan with a scalar decay per head (chunked form for training and "
            "prefill, recurrent step for decoding, the same numbers); D skip; gated RMSNorm; out_proj. "
            "[batch, seq, d_model] -> [batch, seq, d_model]; the cache holds a fixed-size state per sequence "
            "(conv window + [n_heads, head_dim, d_state] float32).",
            reference="Dao & Gu 2024, Transformers are SSMs: Generalized Models and Efficient Algorithms Through "
            "Structured State Space Duality, arXiv:2405.21060",
            capabilities={**RECURRENT_CAPABILITIES, "overflow_prone": True},
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={"type": "mamba2", "d_state": 16, "head_dim": 8, "expand": 2, "n_groups": 2, "chunk_size": 4},
        )
    )
