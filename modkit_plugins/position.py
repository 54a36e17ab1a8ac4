"""Position schemes: ``none``, ``sinusoidal``, ``learned``, ``rope`` and ``alibi``.

Where each acts is data (the ``acts_on`` capability): ``sinusoidal`` and ``learned`` add a vector to the
input embeddings (:meth:`~modkit.PositionScheme.embed`), ``rope`` rotates queries and keys
(:meth:`~modkit.PositionScheme.rotate`), ``alibi`` adds a bias to the attention scores
(:meth:`~modkit.PositionScheme.attention_bias`), ``none`` does nothing.

RoPE and its frequency scalings live in :mod:`.rope` (its names are importable from here too); this module's
:func:`register_components` registers it with the others.

References: sinusoidal, Vaswani et al. 2017 (arXiv:1706.03762) §3.5; learned absolute positions, GPT-2 (Radford
et al. 2019, ``wpe``); ALiBi, Press et al. 2022, Train Short, Test Long (arXiv:2108.12409) and its reference
``get_slopes``.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    Component,
    ComponentConfig,
    elementwise,
    hookimpl,
    Init,
    MAX_MULTIPLIER,
    MAX_THETA,
    MIN_THETA,
    Multiplier,
    PositionScheme,
)

# RoPE and its scalings, importable from here too
from .rope import (  # noqa: F401
    _head_dim,
    _Scaling,
    DynamicScaling,
    LinearScaling,
    Llama3Scaling,
    LongRopeScaling,
    NtkAlphaScaling,
    Rope,
    rope_component,
    rope_inv_freq,
    RopeConfig,
    RopeScaling,
    rotary_width,
    yarn_attention_factor,
    yarn_inv_freq,
    YarnScaling,
)


class NoPositionConfig(ComponentConfig):
    """Config of ``none``: no position information (NoPE; causal masking alone breaks permutation symmetry)."""

    type: Literal["none"] = "none"


class NoPosition(PositionScheme):
    """Identity position scheme."""


# ----------------------------------------------------------------------------------------- absolute positions


def _check_positions(positions: Tensor, limit: int, name: str) -> None:
    """Raise a readable error for positions outside ``[0, limit)`` (skipped on meta and under torch.compile)."""
    if positions.is_meta or not positions.numel() or torch.compiler.is_compiling():
        return
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= limit:
        raise ValueError(
            f"{name} positions must lie in [0, max_seq_len = {limit}); got min {lo}, max {hi}; "
            "raise max_seq_len in the spec"
        )


class SinusoidalConfig(ComponentConfig):
    """Config of ``sinusoidal``: fixed sin/cos table added to the token embeddings."""

    type: Literal["sinusoidal"] = "sinusoidal"
    base: float = Field(
        10000.0,
        ge=MIN_THETA,
        le=MAX_THETA,
        description=f"base of the geometric wavelength sequence (10000 in Vaswani et al.); within [{MIN_THETA:g}, "
        f"{MAX_THETA:g}]: below 1 the frequencies base^(-i/d) grow until they overflow float32",
    )


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The sinusoidal table ``PE [n_positions, d_model]`` (float64 math, returned as float32).

    ``PE[p, 2i] = sin(p · base^(-2i/d))`` and ``PE[p, 2i+1] = cos(p · base^(-2i/d))`` (Vaswani et al. 2017,
    §3.5). An odd ``d_model`` is supported: the last column is a sine whose cosine partner is dropped
    (BERT-pytorch #78 is the crash this avoids).
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    inv = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [ceil(d/2)]
    ang = pos * inv  # [n, ceil(d/2)]
    pe = torch.empty(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = ang.sin()
    pe[:, 1::2] = ang[:, : d_model // 2].cos()
    return pe.to(torch.float32)


def sinusoidal_rows(positions: Tensor, d_model: int, base: float = 10000.0) -> Tensor:
    """``PE[positions]`` of :func:`sinusoidal_table` without the table: ``[*positions.shape, d_model]`` float32,
    computed in float64 on the device of ``positions`` (the same math, row for row)."""
    pos = positions.to(torch.float64)[..., None]
    inv = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device) / d_model)
    ang = pos * inv  # [..., ceil(d/2)]
    pe = torch.stack([ang[..., : d_model // 2].sin(), ang[..., : d_model // 2].cos()], -1).flatten(-2)
    if d_model % 2:  # the last sine has no cosine partner
        pe = torch.cat([pe, ang[..., -1:].sin()], -1)
    return pe.to(torch.float32)


class Sinusoidal(PositionScheme):
    """Fixed sinusoidal absolute positions: ``embed(x [b, s, d], positions [b, s]) = x + PE[positions]``.

    The table is a non-persistent float32 buffer ``pe [max_seq_len, d_model]`` recomputed by
    :meth:`init_weights` (so a ``meta`` build is correct after materialisation). Math: Vaswani et al. 2017.
    """

    def __init__(self, cfg: SinusoidalConfig, max_seq_len: int, d_model: int):
        super().__init__()
        self.cfg = cfg
        self.max_seq_len, self.d_model = max_seq_len, d_model
        self.register_buffer("pe", torch.empty(max_seq_len, d_model, dtype=torch.float32), persistent=False)

    def init_weights(self, init: Init) -> None:
        """Recompute the ``pe`` table from the config."""
        init.copy_(self.pe, sinusoidal_table(self.max_seq_len, self.d_model, self.cfg.base))

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [batch, seq, d_model] + PE[positions [batch, seq]]``, in the dtype of ``x``.

        Positions past the table (``>= max_seq_len``: generation asked to run further, see the
        ``unbounded_positions`` capability) get the rows :func:`sinusoidal_table` gives them, computed on the fly
        with the same float64 math, so a row is the same whether it comes from the table or not.
        """
        if (
            not positions.is_meta
            and positions.numel()
            and not torch.compiler.is_compiling()
            and int(positions.min()) < 0
        ):
            raise ValueError(f"sinusoidal positions must be >= 0; got min {int(positions.min())}")
        n = self.pe.shape[0]
        rows = self.pe[positions.clamp(max=n - 1)]
        past = torch.compiler.is_compiling() or (
            not positions.is_meta and positions.numel() and int(positions.max()) >= n
        )
        if past:  # a traced graph cannot know its positions: it always takes the rows past the table from the formula
            rows = torch.where(
                (positions < n)[..., None], rows, sinusoidal_rows(positions, self.d_model, self.cfg.base)
            )
        return x + rows.to(x.dtype)


class LearnedConfig(ComponentConfig):
    """Config of ``learned``: a trained table of absolute position vectors (GPT-2's ``wpe``)."""

    type: Literal["learned"] = "learned"


class Learned(PositionScheme):
    """Learned absolute positions: ``embed(x [b, s, d], positions [b, s]) = x + weight[positions]``.

    ``weight [max_seq_len, d_model]`` is a parameter initialised N(0, init_std) (GPT-2, Radford et al. 2019).
    """

    #: parameter roles (:mod:`modkit.core.roles`): a learned position table
    param_roles = {"weight": "position"}

    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        self.max_seq_len, self.d_model = max_seq_len, d_model
        self.weight = nn.Parameter(torch.empty(max_seq_len, d_model))

    def init_weights(self, init: Init) -> None:
        """``weight`` ~ N(0, init_std)."""
        init.normal_(self.weight)

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [batch, seq, d_model] + weight[positions [batch, seq]]``."""
        _check_positions(positions, self.max_seq_len, "learned")
        return x + self.weight[positions].to(x.dtype)


# ----------------------------------------------------------------------------------------------------- ALiBi


class AlibiConfig(ComponentConfig):
    """Config of ``alibi``: a per-head linear distance penalty added to the attention scores."""

    type: Literal["alibi"] = "alibi"
    scale: Multiplier = Field(
        1.0,
        description="multiplier of the bias (Falcon scales it by 1/sqrt(head_dim) with the scores); 1 in Press et al.; "
        f"at most {MAX_MULTIPLIER:g}, far above published values, so the bias stays finite",
    )


def alibi_slopes(n_heads: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022, reference ``get_slopes``).

    For ``n`` a power of two: the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^-8``. Otherwise: the slopes of
    the largest power of two ``m < n``, followed by every other slope of ``2m`` heads (the first ``n - m`` of
    them), e.g. 6 heads → ``[2^-2, 2^-4, 2^-6, 2^-8, 2^-1, 2^-3]`` (transformers #28380).
    """
    if n_heads < 1:
        raise ValueError(f"alibi needs n_heads >= 1, got {n_heads}")

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if n_heads & (n_heads - 1) == 0:
        return power_of_two(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class Alibi(PositionScheme):
    """Attention with Linear Biases.

    ``attention_bias(q_positions [b, sq], k_positions [b, sk], n_heads) -> [b, n_heads, sq, sk]`` float32 with
    ``bias[h, i, j] = -slope_h · |q_pos_i - k_pos_j|``; for the causal keys ``j <= i`` this is Press et al.'s
    ``-slope_h · (i - j)`` (later keys are masked by the attention module); the absolute value makes a
    bidirectional layer penalise distance both ways instead of rewarding future keys.

    ``slopes [n_heads]`` is a non-persistent float32 buffer recomputed by :meth:`init_weights` for the head count
    the scheme was built for; another head count is computed on the fly.
    """

    def __init__(self, n_heads: Optional[int], scale: float = 1.0):
        super().__init__()
        self.n_heads = n_heads
        self.scale = scale
        self.register_buffer("slopes", torch.empty(n_heads or 0, dtype=torch.float32), persistent=False)

    def init_weights(self, init: Init) -> None:
        """Recompute ``slopes`` for ``n_heads``."""
        init.copy_(self.slopes, torch.tensor(alibi_slopes(self.n_heads) if self.n_heads else [], dtype=torch.float64))

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Tensor:
        """``[batch, n_heads, q_len, kv_len]`` float32 bias ``-slope_h · |q_pos_i - k_pos_j|``."""
        if n_heads == self.slopes.shape[0]:
            slopes = self.slopes.float()
        else:
            slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32, device=q_positions.device)
        dist = (q_positions[:, :, None] - k_positions[:, None, :]).abs().to(torch.float32)  # [b, sq, sk]
        return -(slopes * self.scale)[None, :, None, None] * dist[:, None]


#: Key formulas of the docs pages (pymdownx.arithmatex).
_MATH = {
    "sinusoidal": r"""For position $p$ and feature pair $i$ of $d$ = d_model, with $b$ = base:

$$PE_{p,2i} = \sin\!\left(\frac{p}{b^{2i/d}}\right), \qquad PE_{p,2i+1} = \cos\!\left(\frac{p}{b^{2i/d}}\right),
\qquad x_p' = x_p + PE_p$$

With an odd $d$ the last feature is a sine whose cosine partner is dropped.""",
    "learned": r"""$$x_p' = x_p + W_p, \qquad W \in \mathbb{R}^{L \times d}$$

$L$ = max_seq_len, $d$ = d_model; $W$ is trained with the model, initialised $\mathcal{N}(0, \sigma^2)$ with
$\sigma$ = init_std.""",
    "alibi": r"""Head $h$ of $n$ = n_heads adds a bias linear in the distance between query position $i$ and key position $j$
to its attention scores:

$$s_{hij} \leftarrow s_{hij} - \lambda\, m_h\, |i - j|, \qquad m_h = 2^{-8h/n} \quad (h = 1, \dots, n)$$

$\lambda$ = scale. When $n$ is not a power of two, the slopes are those of the largest power of two $n' < n$
followed by every other slope of $2n'$ heads (Press et al.'s reference code).""",
}


def _none_component() -> Component:
    """The ``none`` registry entry."""
    return Component(
        kind="position",
        type="none",
        config=NoPositionConfig,
        factory=lambda cfg, ctx: NoPosition(),
        description="No explicit position information (NoPE). Acts nowhere.",
        reference="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization, "
        "arXiv:2305.19466",
        capabilities={"acts_on": "none", "compile_safe": True, "stateless": True, "unbounded_positions": True},
        param_count=lambda cfg, ctx: 0,
        flops=elementwise("no position information: nothing computed"),
    )


def _sinusoidal_component() -> Component:
    """The ``sinusoidal`` registry entry."""
    return Component(
        kind="position",
        type="sinusoidal",
        config=SinusoidalConfig,
        factory=lambda cfg, ctx: Sinusoidal(cfg, ctx.max_seq_len, ctx.d_model),
        description="Fixed sinusoidal absolute positions added to the token embeddings: "
        "x [batch, seq, d_model] + PE[positions], PE[p, 2i] = sin(p·base^(-2i/d)), PE[p, 2i+1] = cos(...). "
        "Odd d_model supported; the table [max_seq_len, d_model] is a float32 buffer recomputed at init.",
        reference="Vaswani et al. 2017, Attention Is All You Need, §3.5, arXiv:1706.03762",
        capabilities={"acts_on": "embedding", "compile_safe": True, "stateless": True, "unbounded_positions": True},
        param_count=lambda cfg, ctx: 0,
        flops=elementwise("a table row added to each embedding: a lookup and an add"),
        example={"type": "sinusoidal", "base": 10000.0},
        math=_MATH["sinusoidal"],
    )


def _learned_component() -> Component:
    """The ``learned`` registry entry."""
    return Component(
        kind="position",
        type="learned",
        config=LearnedConfig,
        factory=lambda cfg, ctx: Learned(ctx.max_seq_len, ctx.d_model),
        math=_MATH["learned"],
        description="Learned absolute positions (GPT-2 wpe) added to the token embeddings: "
        "x [batch, seq, d_model] + weight[positions], weight [max_seq_len, d_model] initialised N(0, init_std).",
        reference="Radford et al. 2019, Language Models are Unsupervised Multitask Learners (GPT-2); "
        "Gehring et al. 2017, arXiv:1705.03122",
        capabilities={"acts_on": "embedding", "compile_safe": True, "tp_plan": {}},
        param_count=lambda cfg, ctx: ctx.max_seq_len * ctx.d_model,
        flops=elementwise("a learned table row added to each embedding: a lookup and an add"),
    )


def _alibi_component() -> Component:
    """The ``alibi`` registry entry."""
    return Component(
        kind="position",
        type="alibi",
        config=AlibiConfig,
        factory=lambda cfg, ctx: Alibi(ctx.n_heads, cfg.scale),
        math=_MATH["alibi"],
        description="ALiBi: no position embedding; each head adds -slope_h * |q_pos - k_pos| to its attention "
        "scores ([batch, n_heads, q_len, kv_len] float32). Slopes follow Press et al., including head counts "
        "that are not a power of two.",
        reference="Press, Smith & Lewis 2022, Train Short, Test Long: Attention with Linear Biases, arXiv:2108.12409",
        capabilities={"acts_on": "bias", "compile_safe": True, "stateless": True, "unbounded_positions": True},
        param_count=lambda cfg, ctx: 0,
        flops=elementwise("a bias -slope * distance added to the scores: element-wise"),
    )


@hookimpl
def register_components(register) -> None:
    """Register ``none``, ``sinusoidal``, ``learned``, ``rope`` (from :mod:`.rope`) and ``alibi``."""
    for component in (_none_component, rope_component, _sinusoidal_component, _learned_component, _alibi_component):
        register(component())
