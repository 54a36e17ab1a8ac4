"""mLSTM: xLSTM's matrix-memory LSTM cell as a token mixer, with exponential input gates and a max stabiliser.

``[batch, seq, d_model] -> [batch, seq, d_model]``. Per token, ``q``, ``k`` (``qk_dim`` features each), ``v`` and the
output-gate pre-activation ``ogate_preact`` (``v_dim`` each) are linear projections of the input, split into
``n_heads`` heads (``d_k = qk_dim / n_heads``, ``d_v = v_dim / n_heads``); ``igate_preact`` and ``fgate_preact``
give one input and one forget pre-activation per head (with biases), each soft-capped ``c · tanh(x / c)`` (``c`` =
``gate_soft_cap``). Each head keeps a matrix memory ``C ∈ R^{d_k × d_v}``, a normaliser ``n ∈ R^{d_k}`` and a
stabiliser ``m`` (the log of the scale both are kept at):

    m_t = max(log σ(f_t) + m_{t-1}, i_t)
    C_t = e^{log σ(f_t) + m_{t-1} - m_t} C_{t-1} + e^{i_t - m_t} k_t v_tᵀ        (n_t likewise with k_t)
    h_t = (q̂_tᵀ C_t) / (max(|q̂_t · n_t|, e^{-m_t}) + eps)                       q̂_t = q_t / sqrt(d_k)

starting from ``C = 0, n = 0, m = 0``. The read-outs ``h`` go through a LayerNorm per head (no affine of its own),
then one weight (and bias) over the ``v_dim`` features, times ``sigmoid(ogate_preact)``, and ``out_proj``.

**Two forms, the same numbers.** Unrolled, ``m_t = max(m_0 + w_t, max_{j ≤ t}(w_t - w_j + i_j))`` with ``w`` the
cumulative ``log σ(f)``, so ``m`` depends on the tokens only, not on how they are cut. Training and prefill use the
chunkwise-parallel form (Beck et al. 2025): inside a chunk of ``chunk_size`` tokens a masked ``[L, L]`` product of
``q̂ kᵀ`` with the log-space weights ``D_tj = w_t - w_j + i_j`` (stabilised by their row maximum), plus the entering
state read through ``e^{w_t + m_prev - m_t}``; the state moves from chunk to chunk as in the recurrence. Decoding
one token runs the recurrence above. Both start from the cached state.

**State.** Per sequence, whatever the context: ``C [n_heads, d_k, d_v]``, ``n [n_heads, d_k]``, ``m [n_heads]``,
float32. A padding token changes nothing (``log σ(f) = 0``, ``i = -inf`` there: ``m``, ``C``, ``n`` are kept), so
left padding is exact.

**Document boundaries.** With ``inputs.documents`` (document-masked packing) the state entering each document of a
packed row is the initial one, ``C = 0, n = 0, m = 0``, so each document gives its numbers alone: in the step the
state is replaced before the update; in the chunkwise form nothing before a start is read and the floor of ``m``
becomes ``w_t - w_{s-1}`` (the zero ``m`` decayed from the start ``s``).

References: Beck et al. 2024, xLSTM: Extended Long Short-Term Memory (arXiv:2405.04517), the mLSTM cell; Beck et al.
2025, xLSTM 7B: A Recurrent LLM for Fast and Efficient Inference (arXiv:2503.13427), the layer (soft-capped gates,
per-head norm, output gate) and the chunkwise form; transformers ``xLSTMLayer`` and its native kernels
``mlstm_chunkwise_native_autograd`` / ``mlstm_recurrent_step_native`` (modeling_xlstm.py, read, not copied) for the
layout, the stabiliser's initial value and the denominator.
"""

from __future__ import annotations

from typing import Literal, NamedTuple, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    RECURRENT_CAPABILITIES,
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    document_starts,
    Epsilon,
    HeadCount,
    hookimpl,
    MAX_D_MODEL,
    MAX_EPS,
    MAX_SOFTCAP,
    MIN_EPS,
    MIN_SOFTCAP,
    padding_mask,
    Workload,
)


class MLSTMConfig(ComponentConfig):
    """Config of ``mlstm`` (xLSTM 7B's mLSTM layer)."""

    type: Literal["mlstm"] = "mlstm"
    n_heads: HeadCount = Field(..., description="heads, each with its own memory and gates (xLSTM's num_heads)")
    qk_dim: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_D_MODEL,
        description="width of the queries and keys over all heads; default d_model / 2 (qk_dim_factor 0.5)",
    )
    v_dim: Optional[int] = Field(
        None,
        ge=1,
        le=MAX_D_MODEL,
        description="width of the values and the read-out over all heads; default d_model (v_dim_factor 1)",
    )
    bias: bool = Field(
        False, description="biases on q, k, v, ogate_preact, out_proj and the per-head norm (xLSTM's use_bias)"
    )
    gate_soft_cap: Optional[float] = Field(
        15.0,
        ge=MIN_SOFTCAP,
        le=MAX_SOFTCAP,
        description="the gates' pre-activations become c · tanh(x / c); null: no cap (xLSTM: 15). Within "
        f"[{MIN_SOFTCAP:g}, {MAX_SOFTCAP:g}]: a smaller cap overflows x / c, a larger one caps nothing",
    )
    eps: float = Field(1e-6, gt=0, le=1.0, description="added to the read-out's denominator (xLSTM's eps: 1e-6)")
    norm_eps: Epsilon = Field(
        1e-6, description=f"epsilon of the per-head LayerNorm; within [{MIN_EPS:g}, {MAX_EPS:g}] (xLSTM: norm_eps)"
    )
    chunk_size: int = Field(
        64,
        ge=1,
        le=1024,
        description="chunk length of the chunkwise form used for training and prefill; changes the speed, not the "
        "numbers (xLSTM's chunk_size: 64)",
    )

    def widths(self, d_model: int) -> tuple[int, int]:
        """``(qk_dim, v_dim)`` with the defaults ``d_model // 2`` and ``d_model``."""
        return (self.qk_dim or d_model // 2, self.v_dim or d_model)

    def position_geometry(self, ctx):
        """No position scheme acts here (the gates carry the order)."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """``n_heads`` divides both widths."""
        errors = []
        for name, width in zip(("qk_dim", "v_dim"), self.widths(ctx.d_model)):
            if width % self.n_heads:
                errors.append(
                    (name, f"{name} = {width} is not a multiple of n_heads = {self.n_heads}: set {name} or n_heads")
                )
        return errors


class Gates(NamedTuple):
    """Per token and head: ``i`` the input-gate pre-activation (``-inf`` on padding) and ``lf`` the log forget gate
    ``log σ(f)`` (0 on padding), both ``[batch, H, T]``."""

    i: Tensor
    lf: Tensor


class State(NamedTuple):
    """``C [batch, H, d_k, d_v]``, ``n [batch, H, d_k]``, ``m [batch, H]``: the memory, the normaliser and the
    stabiliser, all at the scale ``e^{-m}``."""

    C: Tensor
    n: Tensor
    m: Tensor

    @staticmethod
    def zeros(b: int, H: int, dk: int, dv: int, like: Tensor) -> "State":
        """The initial state of ``b`` sequences."""
        return State(like.new_zeros(b, H, dk, dv), like.new_zeros(b, H, dk), like.new_zeros(b, H))


def _read_out(num: Tensor, den: Tensor, m: Tensor, eps: float) -> Tensor:
    """``num / (max(|den|, e^{-m}) + eps)``: ``num [..., d_v]``, ``den`` and ``m`` ``[...]``."""
    return num / (torch.maximum(den.abs(), torch.exp(-m)) + eps)[..., None]


# ----------------------------------------------------------------------------------------------- the two forms


def mlstm_step(
    q: Tensor, k: Tensor, v: Tensor, gates: Gates, state: State, eps: float, reset: Optional[Tensor] = None
) -> tuple[Tensor, State]:
    """One token of the mLSTM recurrence (the module docstring's equations).

    Args:
        q, k: ``[batch, H, d_k]``; v: ``[batch, H, d_v]``; gates: :class:`Gates` of ``[batch, H]``; state:
        :class:`State`; eps: the denominator's; reset: ``[batch]`` bool, True where the token starts a document
        (the state before it is replaced by zeros), or ``None``.

    Returns:
        ``(h [batch, H, d_v], new state)``. FLOPs: ``2 · batch · H · d_k · d_v`` (the read-out; the rest is
        element-wise).
    """
    C, n, m = state
    if reset is not None:
        keep = (~reset)[:, None].to(m.dtype)
        C, n, m = C * keep[..., None, None], n * keep[..., None], m * keep
    m_new = torch.maximum(gates.lf + m, gates.i)
    f_act, i_act = torch.exp(gates.lf + m - m_new), torch.exp(gates.i - m_new)
    C = f_act[..., None, None] * C + i_act[..., None, None] * (k[..., :, None] * v[..., None, :])
    n = f_act[..., None] * n + i_act[..., None] * k
    qs = q * q.shape[-1] ** -0.5
    num = (qs[..., None, :] @ C)[..., 0, :]
    h = _read_out(num, (qs * n).sum(-1), m_new, eps)
    return h, State(C, n, m_new)


def _log_weights(gates: Gates, starts: Optional[Tensor], L: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per chunk: ``w [b, H, c, L]`` the log forget gates summed from the chunk start (or from the token's document
    start inside the chunk), ``fresh [b, 1, c, L]`` bool (a document starts inside the chunk at or before the token:
    the entering state is not read) and ``same [b, 1, c, L, L]`` bool (no start in ``(j, t]``)."""
    b, H, T = gates.lf.shape
    lf = gates.lf.view(b, H, T // L, L)
    cum = lf.cumsum(-1)
    if starts is None:
        return cum, torch.zeros_like(cum[:, :1], dtype=torch.bool), None
    s = starts.view(b, 1, T // L, L)
    pos = torch.arange(L, device=s.device).expand_as(s)
    latest = torch.where(s, pos, -1).cummax(-1).values  # the token's latest start inside its chunk, -1: none
    fresh = latest >= 0
    before = (cum - lf).gather(-1, latest.clamp(min=0).expand(b, H, -1, -1))  # w just before that start
    w = cum - torch.where(fresh, before, 0.0)
    seg = s.long().cumsum(-1)
    return w, fresh, seg[..., :, None] == seg[..., None, :]


def _padded(t: Tensor, pad: int, value: float, dim: int) -> Tensor:
    if not pad:
        return t
    shape = list(t.shape)
    shape[dim] = pad
    return torch.cat([t, t.new_full(shape, value)], dim)


# size: the function of the chunkwise form takes the query, key, value, gates, state and the masks, as the step does
def mlstm_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gates: Gates,
    chunk: int,
    eps: float,
    state: Optional[State] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, State]:
    """The chunkwise-parallel form of the mLSTM: the numbers of :func:`mlstm_step` run token by token.

    Args:
        q, k: ``[batch, H, T, d_k]``; v: ``[batch, H, T, d_v]``; gates: :class:`Gates` of ``[batch, H, T]`` (a
        padding token: ``lf = 0``, ``i = -inf``); chunk: ``L`` (``min(chunk, T)`` used); eps: the denominator's;
        state: the entering :class:`State` or ``None`` (zeros); starts: ``[batch, T]`` bool, True where a document
        starts (the state entering it is the zero state; a True at 0 drops ``state``), or ``None``.

    Returns:
        ``(h [batch, H, T, d_v], final state)``.

    FLOPs (``FlopCounterMode``; ``c`` chunks of ``L``, the sequence padded to ``c · L``): ``batch · H · c · (2 L²
    (d_k + d_v) + 4 L d_k d_v)`` (``q̂ kᵀ``, its product with ``V``, the read of the entering state, the state's
    update).
    """
    b, H, T, dk = k.shape
    dv = v.shape[-1]
    L = min(chunk, T)
    nc = -(-T // L)
    pad = nc * L - T
    q, k, v = (_padded(t, pad, 0.0, 2).reshape(b, H, nc, L, -1) for t in (q, k, v))
    gates = Gates(_padded(gates.i, pad, -torch.inf, 2), _padded(gates.lf, pad, 0.0, 2))
    starts = None if starts is None else _padded(starts, pad, False, 1)
    w, fresh, same = _log_weights(gates, starts, L)
    i = gates.i.view(b, H, nc, L)
    valid = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    valid = valid if same is None else valid & same
    D = torch.where(valid, w[..., :, None] - w[..., None, :] + i[..., None, :], -torch.inf)  # [b, H, c, L, L]
    d_max = D.amax(-1)  # the row maxima, -inf where a row has no token (padding)
    seen = torch.isfinite(d_max)
    d_max = torch.where(seen, d_max, 0.0)
    P = ((q * dk**-0.5) @ k.transpose(-1, -2)) * torch.exp(D - d_max[..., None])  # stabilised by the row maxima
    intra_num, intra_den = P @ v, P.sum(-1)
    last = torch.exp(D[..., -1, :] - d_max[..., -1:])  # [b, H, c, L]: each token's weight in the chunk's end state
    kv_end, n_end = (k * last[..., None]).transpose(-1, -2) @ v, (k * last[..., None]).sum(-2)
    s = state if state is not None else State.zeros(b, H, dk, dv, q)
    C, n, m = s
    d_max = torch.where(seen, d_max, -torch.inf)
    per_chunk = (q * dk**-0.5, w, ~fresh.expand(-1, H, -1, -1), d_max, seen, intra_num, intra_den, kv_end, n_end)
    out = []
    # unbound once: slicing inside the loop would make autograd fill a full-size gradient per chunk
    for qs, w_c, read, dm, seen_c, num_c, den_c, kv_c, n_c in zip(*(t.unbind(2) for t in per_chunk)):
        floor = w_c + torch.where(read, m[..., None], 0.0)  # m_0 (or the reset's 0) decayed to each token
        m_t = torch.maximum(floor, dm)
        inter = torch.exp(floor - m_t) * read  # the entering state's weight (0 after a start)
        intra = torch.where(seen_c, torch.exp(dm - m_t), 0.0)
        num = inter[..., None] * (qs @ C) + intra[..., None] * num_c
        den = inter * (qs * n[..., None, :]).sum(-1) + intra * den_c
        out.append(_read_out(num, den, m_t, eps))
        e_in, e_new = inter[..., -1], intra[..., -1]
        C = e_in[..., None, None] * C + e_new[..., None, None] * kv_c
        n = e_in[..., None] * n + e_new[..., None] * n_c
        m = m_t[..., -1]
    h = torch.stack(out, 2).reshape(b, H, nc * L, dv)[:, :, :T]
    return h, State(C, n, m)


# ----------------------------------------------------------------------------------------------- the module


class _Gate(nn.Linear):
    """A gate's pre-activation ``[..., d_model] -> [..., n_heads]`` with xLSTM 7B's init: weight 0, the bias of head
    ``h`` ``lo + (hi - lo) · h / (n_heads - 1)`` (``lo`` alone for one head)."""

    def __init__(self, d: int, n_heads: int, lo: float, hi: float):
        super().__init__(d, n_heads, bias=True)
        self.bias_init = [lo + (hi - lo) * h / max(n_heads - 1, 1) for h in range(n_heads)]

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """``weight = 0``, the bias as the class says."""
        init.zeros_(self.weight)
        init.copy_(self.bias, torch.tensor(self.bias_init, dtype=self.bias.dtype, device=self.bias.device))


class MLSTM(nn.Module):
    """The mLSTM mixer. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    Parameters (transformers ``xLSTMLayer``'s names and layouts, ``weight_mode="single"``): ``q``, ``k``
    ``[qk_dim, d_model]``, ``v``, ``ogate_preact`` ``[v_dim, d_model]``, ``igate_preact``, ``fgate_preact``
    ``[n_heads, d_model]`` with biases ``[n_heads]``, ``multihead_norm.weight`` ``[v_dim]`` (and ``.bias`` with
    ``bias``), ``out_proj`` ``[d_model, v_dim]``; ``bias`` adds biases to q, k, v, ogate_preact and out_proj.
    """

    param_roles = {"multihead_norm.weight": "norm_gain", "multihead_norm.bias": "bias"}

    def __init__(self, cfg: MLSTMConfig, ctx: BuildContext):
        super().__init__()
        d = ctx.d_model
        self.qk_dim, self.v_dim = cfg.widths(d)
        self.n_heads, self.chunk_size = cfg.n_heads, cfg.chunk_size
        self.dk, self.dv = self.qk_dim // cfg.n_heads, self.v_dim // cfg.n_heads
        self.cap, self.eps, self.norm_eps = cfg.gate_soft_cap, cfg.eps, cfg.norm_eps
        self.q = nn.Linear(d, self.qk_dim, bias=cfg.bias)
        self.k = nn.Linear(d, self.qk_dim, bias=cfg.bias)
        self.v = nn.Linear(d, self.v_dim, bias=cfg.bias)
        self.ogate_preact = nn.Linear(d, self.v_dim, bias=cfg.bias)
        self.igate_preact = _Gate(d, cfg.n_heads, -10.0, -10.0)
        self.fgate_preact = _Gate(d, cfg.n_heads, 3.0, 6.0)
        self.multihead_norm = nn.Module()
        self.multihead_norm.weight = nn.Parameter(torch.empty(self.v_dim))
        self.multihead_norm.bias = nn.Parameter(torch.empty(self.v_dim)) if cfg.bias else None
        self.out_proj = nn.Linear(self.v_dim, d, bias=cfg.bias)

    def cache_spec(self) -> CacheSpec:
        """Per sequence, float32: ``C [n_heads, d_k, d_v]``, ``n [n_heads, d_k]``, ``m [n_heads]``. Nothing per
        token."""
        H, dk, dv = self.n_heads, self.dk, self.dv
        return CacheSpec(
            tuple(
                CacheEntry(name, shape, growth="sequence", dtype=torch.float32)
                for name, shape in (("C", (H, dk, dv)), ("n", (H, dk)), ("m", (H,)))
            )
        )

    @torch.no_grad()
    def init_weights(self, init) -> None:
        """The norm's weight 1 (bias 0). The gates (:class:`_Gate`) take xLSTM 7B's init (transformers
        ``xLSTMPreTrainedModel._init_weights``): weights 0, input-gate biases -10, forget-gate biases evenly from 3 to
        6 over the heads; the other projections are ``nn.Linear`` children initialised by the model's rule."""
        init.ones_(self.multihead_norm.weight)
        if self.multihead_norm.bias is not None:
            init.zeros_(self.multihead_norm.bias)

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """``{projection: (heads, width per head)}``."""
        H = self.n_heads
        return {"q": (H, self.dk), "k": (H, self.dk), "v": (H, self.dv), "ogate_preact": (H, self.dv)}

    def _gates(self, x: Tensor, real: Optional[Tensor], dtype: torch.dtype) -> Gates:
        i, f = self.igate_preact(x).to(dtype), self.fgate_preact(x).to(dtype)
        if self.cap is not None:
            i, f = self.cap * torch.tanh(i / self.cap), self.cap * torch.tanh(f / self.cap)
        lf = nn.functional.logsigmoid(f)
        if real is not None:
            i, lf = torch.where(real[..., None], i, -torch.inf), lf * real[..., None]
        return Gates(i.transpose(1, 2), lf.transpose(1, 2))

    def _norm(self, h: Tensor) -> Tensor:
        """LayerNorm per head of ``h [b, s, H, d_v]`` in float32, then the weight (and bias) over all features."""
        y = nn.functional.layer_norm(h.float(), (self.dv,), eps=self.norm_eps).flatten(2)
        y = y * self.multihead_norm.weight.float()
        return y if self.multihead_norm.bias is None else y + self.multihead_norm.bias.float()

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; continues and updates the cached state if given.

        One token (``seq == 1``) takes the recurrent step, more the chunkwise form; both start from the cached state.
        """
        bsz, s, _ = x.shape
        dtype = torch.promote_types(x.dtype, torch.float32)  # the scan in float32 (float64 for a float64 model)
        cache = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, dtype)
        real = None if inputs.token_mask is None else inputs.token_mask.bool()
        heads = lambda t, w: t.to(dtype).view(bsz, s, self.n_heads, w).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q(x), self.dk), heads(self.k(x), self.dk), heads(self.v(x), self.dv)
        if mask is not None:  # no query, key or value of a padding token (its gates already keep the state)
            q, k, v = (t * mask[:, None] for t in (q, k, v))
        gates = self._gates(x, real, dtype)
        starts = document_starts(inputs.documents)
        s0 = None if cache is None else State(*(cache[n].to(dtype) for n in ("C", "n", "m")))
        if s == 1:
            s0 = s0 if s0 is not None else State.zeros(bsz, self.n_heads, self.dk, self.dv, q)
            g1 = Gates(gates.i[..., 0], gates.lf[..., 0])
            reset = None if starts is None else starts[:, 0]
            h, s1 = mlstm_step(q[:, :, 0], k[:, :, 0], v[:, :, 0], g1, s0, self.eps, reset)
            h = h[:, :, None]
        else:
            h, s1 = mlstm_chunked(q, k, v, gates, self.chunk_size, self.eps, s0, starts)
        if cache is not None:
            for name, t in zip(("C", "n", "m"), s1):
                cache.write(name, t)
        h = self._norm(h.transpose(1, 2)).to(x.dtype)
        return self.out_proj(torch.sigmoid(self.ogate_preact(x)) * h)


# ----------------------------------------------------------------------------------------------- declarations


def _param_count(cfg: MLSTMConfig, ctx: BuildContext) -> int:
    d, H = ctx.d_model, cfg.n_heads
    qk, v = cfg.widths(d)
    weights = 2 * qk * d + 2 * v * d + 2 * H * d + v + v * d
    biases = 2 * H + (2 * qk + 3 * v + d if cfg.bias else 0)
    return weights + biases


def _flops(cfg: MLSTMConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (what ``FlopCounterMode`` counts): the six projections and ``out_proj`` on
    ``work.tokens`` rows; one token (``work.new == 1``) reads the memory, ``2 · batch · H · d_k · d_v``; more tokens
    take the chunkwise form (``c`` chunks of ``L = min(chunk_size, new)``): ``batch · H · c · (2 L² (d_k + d_v) + 4 L
    d_k d_v)``. Constant per token in the cached context."""
    d, H = ctx.d_model, cfg.n_heads
    qk, vd = cfg.widths(d)
    dk, dv = qk // H, vd // H
    t, b, s = work.tokens, work.batch, work.new
    out = {"qk_proj": 2 * t * d * 2 * qk, "v_proj": 2 * t * d * vd, "ogate_preact": 2 * t * d * vd}
    out.update(gates=2 * t * d * 2 * H, out_proj=2 * t * vd * d)
    if s == 1:
        out["mlstm"] = 2 * b * H * dk * dv
    else:
        L = min(cfg.chunk_size, s)
        c = -(-s // L)
        out["mlstm"] = b * H * c * (2 * L * L * (dk + dv) + 4 * L * dk * dv)
    return out


_MATH = r"""Per head with memory $C_t \in \mathbb{R}^{d_k \times d_v}$, normaliser $n_t$ and stabiliser $m_t$
($C_0 = 0, n_0 = 0, m_0 = 0$), soft-capped gate pre-activations $\tilde\imath_t, \tilde f_t$ and $\ell_t = \log
\sigma(\tilde f_t)$:

$$m_t = \max(\ell_t + m_{t-1}, \tilde\imath_t), \quad C_t = e^{\ell_t + m_{t-1} - m_t} C_{t-1} +
e^{\tilde\imath_t - m_t} k_t v_t^\top, \quad n_t = e^{\ell_t + m_{t-1} - m_t} n_{t-1} + e^{\tilde\imath_t - m_t}
k_t$$

$$h_t = \frac{C_t^\top \hat q_t}{\max(|\hat q_t \cdot n_t|, e^{-m_t}) + \epsilon}, \quad \hat q_t = q_t /
\sqrt{d_k}$$

The output is $W_{out}\big(\sigma(W_o x_t) \odot \mathrm{LN}_{\text{per head}}([h_t^1; \dots; h_t^H])\big)$. The
chunkwise form computes a chunk with log weights $D_{tj} = w_t - w_j + \tilde\imath_j$ ($w$ the cumulative
$\ell$), the same numbers. The cache keeps $C, n, m$: $H (d_k d_v + d_k + 1)$ float32 numbers per sequence,
whatever the context."""


@hookimpl
def register_components(register) -> None:
    """Register ``mlstm`` (kind ``mixer``)."""
    register(
        Component(
            kind="mixer",
            type="mlstm",
            config=MLSTMConfig,
            factory=lambda cfg, ctx: MLSTM(cfg, ctx),
            description="mLSTM (xLSTM's matrix-memory LSTM): q, k, v and an output gate from linear projections, "
            "soft-capped exponential input and sigmoid forget gates per head, a matrix memory with a normaliser and a "
            "max stabiliser (chunkwise form for training and prefill, recurrent step for decoding, the same numbers), "
            "a per-head LayerNorm, sigmoid output gate, out_proj. [batch, seq, d_model] -> [batch, seq, d_model]; the "
            "cache holds [n_heads, d_k, d_v] + [n_heads, d_k] + [n_heads] float32 per sequence.",
            reference="Beck et al. 2024, xLSTM, arXiv:2405.04517; Beck et al. 2025, xLSTM 7B, arXiv:2503.13427; "
            "transformers xLSTMLayer",
            capabilities={**RECURRENT_CAPABILITIES, "overflow_prone": True},
            param_count=_param_count,
            flops=_flops,
            math=_MATH,
            example={"type": "mlstm", "n_heads": 2, "qk_dim": 8, "v_dim": 16, "chunk_size": 4},
        )
    )
