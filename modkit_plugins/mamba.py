"""Mamba (Mamba-1): the selective state-space scan with a diagonal decay per channel and state (Jamba's mixer).

``[batch, seq, d_model] -> [batch, seq, d_model]``. ``in_proj`` gives ``x`` and the gate ``z`` (``d_inner`` each);
``x`` goes through a short causal depthwise convolution and ``silu``; ``x_proj`` gives per token a low-rank step
``δ`` (``dt_rank``), ``B`` and ``C`` (``d_state`` each; Jamba normalises the three with RMSNorms first), and
``dt_proj`` lifts ``δ`` to a step per channel ``Δ = softplus(dt_proj(δ))``. Per channel ``c`` with state
``h ∈ R^{d_state}`` and ``A_c = -exp(A_log_c) ∈ R^{d_state}`` (negative, one decay per state):

    h_t = exp(Δ_t A_c) ⊙ h_{t-1} + Δ_t x_t B_t,      y_t = h_t · C_t + D_c x_t

then ``y ⊙ silu(z)`` goes through ``out_proj``.

**Two forms, the same numbers.** Training and prefill use a chunked associative scan: the pairs ``(exp(Δ_t A),
Δ_t x_t B_t)`` are combined inside chunks of ``chunk_size`` tokens by a parallel prefix scan (``log2(chunk_size)``
element-wise steps; ``(a₁, u₁)·(a₂, u₂) = (a₁a₂, a₂u₁ + u₂)``, every product of decays ≤ 1, so nothing overflows),
and the state entering each chunk is carried from chunk to chunk. Decoding one token runs the recurrence. Unlike
Mamba-2 the decay differs per state, so the diagonal blocks are not a matrix product; the scan is element-wise.

**State.** Per sequence, whatever the context: the convolution window ``conv [d_inner, d_conv - 1]`` and the SSM state
``ssm [d_inner, d_state]`` (float32). Padding tokens change nothing (their inputs and steps are zeroed).

**Document boundaries.** With ``inputs.documents`` (document-masked packing) the decay into each document's first
token is 0, so the state entering a document is zero, and the convolution takes no input from the previous document
(mamba_ssm's ``seq_idx``): each document of a packed row gives the numbers it gives alone.

References: Gu & Dao 2023, Mamba: Linear-Time Sequence Modeling with Selective State Spaces (arXiv:2312.00752),
Algorithm 2 and §3.5; Blelloch 1990, Prefix Sums and Their Applications (the associative scan); Lieber et al. 2024,
Jamba: A Hybrid Transformer-Mamba Language Model (arXiv:2403.19887) for the RMSNorms on Δ, B and C; transformers
``JambaMambaMixer`` (its PyTorch path, read, not copied) for the layout (``in_proj``, ``conv1d``, ``x_proj``,
``dt_proj``, ``A_log``, ``D``, ``out_proj``; ``dt_layernorm``, ``b_layernorm``, ``c_layernorm``).
"""

from __future__ import annotations

import math
from dataclasses import replace
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
    Component,
    ComponentConfig,
    HeadDim,
    hookimpl,
    document_starts,
    MAX_DT,
    MAX_EXPAND,
    MIN_DT,
    padding_mask,
    Slot,
    StepSize,
    Workload,
    zero_padding,
)


#: what the description of an initial step size adds: its bound (modkit.core.limits) and why
_DT = (
    f"; within [{MIN_DT:g}, {MAX_DT:g}] (Mamba: floor 1e-4, range 0.001-0.1): Δ is stored as softplus⁻¹(Δ), which is "
    "-inf for a Δ that rounds to 0 in float32 and overflows for a huge one"
)


class MambaConfig(ComponentConfig):
    """Config of ``mamba``: Mamba-1's selective scan (Jamba's ``mamba`` layers)."""

    type: Literal["mamba"] = "mamba"
    d_state: HeadDim = Field(16, description="N: the state size per channel (rows of B and C)")
    expand: float = Field(
        2.0,
        gt=0,
        le=MAX_EXPAND,
        description=f"d_inner = expand · d_model when d_inner is not given; at most {MAX_EXPAND:g} (Mamba, Mamba-2, "
        "Jamba and Falcon-H1 use 2), so d_inner stays a size torch can allocate",
    )
    d_inner: Optional[int] = Field(None, gt=0, description="width of x and z; default expand · d_model")
    dt_rank: Optional[int] = Field(None, gt=0, description="rank of the step projection; default ceil(d_model / 16)")
    d_conv: int = Field(4, ge=2, le=64, description="kernel of the causal depthwise convolution over x")
    conv_bias: bool = Field(True, description="bias on the convolution")
    bias: bool = Field(False, description="biases on in_proj and out_proj (Jamba's mamba_proj_bias)")
    inner_norm: Optional[ComponentConfig] = Slot(
        "norm",
        default=None,
        description="norm applied to δ (dt_rank wide), B and C (d_state wide) before they are "
        "used: Jamba's dt_layernorm, b_layernorm, c_layernorm; null for none (Mamba)",
    )
    chunk_size: int = Field(
        64,
        ge=1,
        le=4096,
        description="chunk length of the chunked scan used for training and "
        "prefill; changes the speed, not the numbers",
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

    def resolved_d_inner(self, d_model: int) -> int:
        """``d_inner``, or ``int(expand · d_model)``."""
        return self.d_inner if self.d_inner is not None else int(self.expand * d_model)

    def resolved_dt_rank(self, d_model: int) -> int:
        """``dt_rank``, or ``ceil(d_model / 16)``."""
        return self.dt_rank if self.dt_rank is not None else math.ceil(d_model / 16)

    def position_geometry(self, ctx):
        """No queries or keys: a rotary or bias position scheme does not act here."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """A positive ``d_inner``; the Δ init range is ordered."""
        errors = []
        if self.resolved_d_inner(ctx.d_model) < 1:
            errors.append(("expand", f"expand · d_model = {self.expand} · {ctx.d_model} leaves no channel"))
        if self.dt_init_min > self.dt_init_max:
            errors.append(("dt_init_min", f"dt_init_min = {self.dt_init_min} exceeds dt_init_max = {self.dt_init_max}"))
        return errors


# ----------------------------------------------------------------------------------------------- the two forms


def scan_chunked(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The chunked associative scan, without the ``D`` skip.

    Args:
        x, dt: ``[batch, T, D]`` (``dt`` 0 on padding); A: ``[D, N]`` (negative); B, C: ``[batch, T, N]``; chunk:
        ``L`` (``min(chunk, T)`` used); state: ``[batch, D, N]`` or ``None`` (zeros); starts: ``[batch, T]`` bool,
        True where a document starts (its decay is 0: the state entering it is zero; a True at 0 drops ``state``),
        or ``None``. Float32 (or float64).

    Returns:
        ``(y [batch, T, D], final state [batch, D, N])``. FLOPs (as ``FlopCounterMode`` counts them, ``c`` chunks of
        ``L``): ``2 · batch · c · L · D · N`` (the read-out ``h · C``; the scan itself is element-wise).
    """
    b, T, D = x.shape
    N = A.shape[-1]
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    if pad:
        x, dt, B, C = (nn.functional.pad(t, (0, 0, 0, pad)) for t in (x, dt, B, C))
    decay = torch.exp(dt[..., None] * A)  # exp(Δ A) per step
    if starts is not None:  # no decay into a document's first token: nothing crosses the boundary
        decay = decay * (~nn.functional.pad(starts, (0, pad)))[..., None, None].to(decay.dtype)
    decay = decay.view(b, nc, L, D, N)
    u = ((dt * x)[..., None] * B[:, :, None, :]).view(b, nc, L, D, N)  # Δ x B per step
    step = 1
    while step < L:  # inclusive prefix scan inside each chunk (Hillis-Steele): h_t from the chunk start
        u = torch.cat([u[:, :, :step], decay[:, :, step:] * u[:, :, :-step] + u[:, :, step:]], dim=2)
        decay = torch.cat([decay[:, :, :step], decay[:, :, step:] * decay[:, :, :-step]], dim=2)
        step *= 2
    h = state if state is not None else x.new_zeros(b, D, N)
    states = []
    for i in range(nc):  # add the state entering each chunk, decayed to every token, and carry it on
        full = u[:, i] + decay[:, i] * h[:, None]
        states.append(full)
        h = full[:, -1]
    hs = torch.stack(states, 1)  # [b, c, L, D, N]
    y = (hs @ C.view(b, nc, L, N, 1)).view(b, nc * L, D)[:, :T]
    return y, h


def scan_step(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Tensor, reset: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """One token: ``h = exp(Δ A) ⊙ h + Δ x B``, ``y = h · C``.

    Args:
        x, dt: ``[batch, D]``; A: ``[D, N]``; B, C: ``[batch, N]``; state: ``[batch, D, N]``; reset: ``[batch]``
        bool, True where the token starts a document (the decay is 0: ``h = Δ x B``), or ``None``. Float32 (or
        float64).

    Returns:
        ``(y [batch, D], new state)``. FLOPs: ``2 · batch · D · N``.
    """
    decay = torch.exp(dt[..., None] * A)
    if reset is not None:
        decay = decay * (~reset)[:, None, None].to(decay.dtype)
    h = decay * state + (dt * x)[..., None] * B[:, None, :]
    return (h @ C[:, :, None])[..., 0], h


# ----------------------------------------------------------------------------------------------- the module


class Mamba(nn.Module):
    """The Mamba-1 mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters: ``in_proj`` ``[2 d_inner, d_model]`` (x then z), ``conv1d`` ``[d_inner, 1, d_conv]``, ``x_proj``
    ``[dt_rank + 2 d_state, d_inner]``, ``dt_proj`` ``[d_inner, dt_rank]`` with its bias, ``A_log`` ``[d_inner,
    d_state]``, ``D`` ``[d_inner]``, ``out_proj`` ``[d_model, d_inner]``; with ``inner_norm``: ``dt_norm``, ``b_norm``,
    ``c_norm``.
    """

    #: the state matrix, skip and depthwise filter are fixed-fan-in vectors; x_proj, dt_proj and the projections are
    #: nn.Linear (hidden)
    param_roles = {"A_log": "vector", "D": "vector", "conv1d.weight": "vector", "conv1d.bias": "bias"}

    def __init__(self, cfg: MambaConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.d_inner, self.d_state, self.d_conv = cfg.resolved_d_inner(d), cfg.d_state, cfg.d_conv
        self.dt_rank = cfg.resolved_dt_rank(d)
        self.chunk_size = cfg.chunk_size
        self.dt_init = (cfg.dt_init_min, cfg.dt_init_max, cfg.dt_init_floor)
        self.in_proj = nn.Linear(d, 2 * self.d_inner, bias=cfg.bias)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, cfg.d_conv, groups=self.d_inner, bias=cfg.conv_bias)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * self.d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.empty(self.d_inner, self.d_state))
        self.D = nn.Parameter(torch.empty(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d, bias=cfg.bias)
        if cfg.inner_norm is not None:
            self.dt_norm = ctx.build(cfg.inner_norm, dim=self.dt_rank)
            self.b_norm = ctx.build(cfg.inner_norm, dim=self.d_state)
            self.c_norm = ctx.build(cfg.inner_norm, dim=self.d_state)
        else:
            self.dt_norm = self.b_norm = self.c_norm = None

    def cache_spec(self) -> CacheSpec:
        """Per sequence: the convolution window ``conv [d_inner, d_conv - 1]`` (cache dtype) and the SSM state ``ssm
        [d_inner, d_state]`` (float32). Nothing per token."""
        return CacheSpec(
            (
                CacheEntry("conv", (self.d_inner, self.d_conv - 1), growth="sequence"),
                CacheEntry("ssm", (self.d_inner, self.d_state), growth="sequence", dtype=torch.float32),
            )
        )

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """Mamba's init: ``A = 1..d_state`` for every channel (S4D-real, ``A_log = log A``), ``D = 1``, ``dt_proj``'s
        weight ``U(±dt_rank^-1/2)`` and bias ``softplus⁻¹(Δ)`` with ``Δ`` log-uniform in ``[dt_init_min,
        dt_init_max]``, the convolution ``U(±1/sqrt(d_conv))`` with a zero bias; the other projections are
        ``nn.Linear`` children initialised by the model's rule."""
        init.copy_(
            self.A_log, torch.log(torch.arange(1, self.d_state + 1, dtype=torch.float32)).expand(self.d_inner, -1)
        )
        init.ones_(self.D)
        init.uniform_(self.dt_proj.weight, -(self.dt_rank**-0.5), self.dt_rank**-0.5)
        lo, hi, floor = self.dt_init
        u = torch.empty(self.d_inner)
        init.uniform_(u, 0.0, 1.0)
        dt = torch.exp(u * (math.log(hi) - math.log(lo)) + math.log(lo)).clamp(min=floor)
        init.copy_(self.dt_proj.bias, dt + torch.log(-torch.expm1(-dt)))  # softplus⁻¹
        bound = 1.0 / math.sqrt(self.d_conv)
        init.uniform_(self.conv1d.weight, -bound, bound)
        if self.conv1d.bias is not None:
            init.zeros_(self.conv1d.bias)

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given."""
        b, s, _ = x.shape
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, torch.float32)
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs = zero_padding(xs, mask)
        starts = document_starts(inputs.documents)  # the state and the convolution restart at each document
        xs = zero_padding(nn.functional.silu(causal_conv(xs, self.conv1d, state, starts=starts)), mask)
        delta, B, C = self.x_proj(xs).split([self.dt_rank, self.d_state, self.d_state], dim=-1)
        if self.dt_norm is not None:
            delta, B, C = self.dt_norm(delta), self.b_norm(B), self.c_norm(C)
        dt = zero_padding(nn.functional.softplus(self.dt_proj(delta).float()), mask)  # padding: no decay, no write
        A = -torch.exp(self.A_log.float())
        xs32, B, C = xs.float(), B.float(), C.float()
        h0 = state["ssm"] if state is not None else None
        if s == 1:
            h0 = h0 if h0 is not None else xs32.new_zeros(b, self.d_inner, self.d_state)
            y, h = scan_step(xs32[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], h0, None if starts is None else starts[:, 0])
            y = y[:, None]
        else:
            y, h = scan_chunked(xs32, dt, A, B, C, self.chunk_size, h0, starts)
        if state is not None:
            state.write("ssm", h)
        y = (y + xs32 * self.D.float()) * nn.functional.silu(z.float())
        return self.out_proj(y.to(x.dtype))


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: MambaConfig, ctx: BuildContext) -> int:
    d = ctx.d_model
    di, n, r = cfg.resolved_d_inner(d), cfg.d_state, cfg.resolved_dt_rank(d)
    total = d * 2 * di + 2 * di * cfg.bias  # in_proj
    total += di * cfg.d_conv + di * cfg.conv_bias
    total += di * (r + 2 * n) + r * di + di  # x_proj, dt_proj (+ bias)
    total += di * n + di  # A_log, D
    total += di * d + d * cfg.bias  # out_proj
    if cfg.inner_norm is not None:
        norm = ctx.registry.entry_for_config(cfg.inner_norm)
        if norm.param_count is not None:
            total += norm.param_count(cfg.inner_norm, replace(ctx, dim=r))
            total += 2 * norm.param_count(cfg.inner_norm, replace(ctx, dim=n))
    return total


def _flops(cfg: MambaConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts): ``in_proj``, the convolution, ``x_proj``,
    ``dt_proj`` and ``out_proj`` on ``work.tokens`` rows, and the read-out ``h · C`` of the scan, ``2 · batch · T' · D ·
    N`` with ``T'`` the tokens padded to whole chunks (``1`` when decoding one token); the scan's decays and updates
    are element-wise. The inner norms (a norm component) declare their own. Constant per token in the context."""
    d = ctx.d_model
    di, n, r = cfg.resolved_d_inner(d), cfg.d_state, cfg.resolved_dt_rank(d)
    t, b, s = work.tokens, work.batch, work.new
    if s == 1:
        padded = 1
    else:
        L = min(cfg.chunk_size, s)
        padded = -(-s // L) * L
    return {
        "in_proj": 2 * t * d * 2 * di,
        "conv": 2 * t * di * cfg.d_conv,
        "x_proj": 2 * t * di * (r + 2 * n),
        "dt_proj": 2 * t * r * di,
        "scan": 2 * b * padded * di * n,
        "out_proj": 2 * t * di * d,
    }


_MATH = r"""Per channel $c$ (of $D$ = d_inner) with state $h_t \in \mathbb{R}^N$ ($N$ = d_state), input $x_t$ (after the
causal convolution of width d_conv and $\mathrm{silu}$), $\Delta_t = \mathrm{softplus}(W_{dt}\, \delta_t + b_{dt})$ where
$(\delta_t, B_t, C_t) = W_x x_t$ (each normalised first with inner_norm, Jamba):

$$h_t = e^{\Delta_t A_c} \odot h_{t-1} + \Delta_t\, x_t\, B_t, \qquad y_t = h_t^\top C_t + D_c\, x_t$$

with $A_c = -e^{A^{log}_c} \in \mathbb{R}^N$ (a decay per channel and state: the selective scan). The output is $W_{out}
(y \odot \mathrm{silu}(z))$. The chunked form combines the pairs $(e^{\Delta_t A}, \Delta_t x_t B_t)$ with the
associative operator $(a_1, u_1) \cdot (a_2, u_2) = (a_1 a_2,\ a_2 u_1 + u_2)$ inside chunks of chunk_size tokens and
carries the state between chunks. The cache keeps $h$ ($D \cdot N$ float32 numbers) and the last d_conv $- 1$
convolution inputs, per sequence."""


@hookimpl
def register_components(register) -> None:
    """Register ``mamba`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="mamba",
            config=MambaConfig,
            factory=lambda cfg, ctx: Mamba(cfg, ctx),
            description="Mamba-1 selective-scan recurrent token mixer (Jamba's mamba layers): in_proj to x and z, "
            "causal depthwise conv1d, x_proj to a low-rank step, B and C (optionally normalised, Jamba), dt_proj, "
            "a diagonal decay per channel and state (chunked associative scan for training and prefill, recurrent "
            "step for decoding, the same numbers), D skip, silu(z) gate, out_proj. [batch, seq, d_model] -> [batch, "
            "seq, d_model]; the cache holds a fixed-size state per sequence (conv window + [d_inner, d_state] float32).",
            reference="Gu & Dao 2023, Mamba: Linear-Time Sequence Modeling with Selective State Spaces, arXiv:2312.00752; "
            "Lieber et al. 2024, Jamba, arXiv:2403.19887",
            capabilities={**RECURRENT_CAPABILITIES, "overflow_prone": True},
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={
                "type": "mamba",
                "d_state": 8,
                "expand": 2,
                "dt_rank": 4,
                "chunk_size": 4,
                "inner_norm": {"type": "rmsnorm", "eps": 1e-6},
            },
        )
    )
