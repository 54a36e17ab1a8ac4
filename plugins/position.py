"""Position schemes: ``none``, ``sinusoidal``, ``learned``, ``rope`` and ``alibi``.

Where each acts is data (the ``acts_on`` capability): ``sinusoidal`` and ``learned`` add a vector to the
input embeddings (:meth:`~modkit.PositionScheme.embed`), ``rope`` rotates queries and keys
(:meth:`~modkit.PositionScheme.rotate`), ``alibi`` adds a bias to the attention scores
(:meth:`~modkit.PositionScheme.attention_bias`), ``none`` does nothing.

RoPE rotates pairs of query/key features by position-dependent angles. Pairs are either the two halves of
the rotary dims (``half_split``: GPT-NeoX, Hugging Face Llama) or adjacent features (``interleaved``: GPT-J,
Meta's reference Llama); transformers #25199 is what happens when the two are confused. Frequencies come from
the spec (theta, partial rotary fraction, scaling) and are recomputed by ``init_weights``, so a ``meta``
build is correct after materialisation (transformers #45902).

References: Su et al. 2021, RoFormer (arXiv:2104.09864); linear scaling, Chen et al. 2023
(arXiv:2306.15595); llama3 scaling, meta-llama/llama-models ``apply_scaling``; sinusoidal, Vaswani et al.
2017 (arXiv:1706.03762) §3.5; learned absolute positions, GPT-2 (Radford et al. 2019, ``wpe``); ALiBi, Press
et al. 2022, Train Short, Test Long (arXiv:2108.12409) and its reference ``get_slopes``.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from torch import Tensor, nn

from pydantic import BaseModel, ConfigDict
from modkit import BuildContext, Component, ComponentConfig, Init, PositionScheme, elementwise, hookimpl


class NoPositionConfig(ComponentConfig):
    """Config of ``none``: no position information (NoPE; causal masking alone breaks permutation symmetry)."""

    type: Literal["none"] = "none"


class NoPosition(PositionScheme):
    """Identity position scheme."""


class RopeScaling(BaseModel):
    """Frequency scaling for context extension."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["linear", "llama3"] = Field(..., description="'linear': divide every frequency by factor; 'llama3': Llama 3.1 band-wise scaling")
    factor: PositiveFloat = Field(..., description="context extension factor")
    low_freq_factor: Optional[PositiveFloat] = Field(None, description="llama3: wavelengths above original_max_seq_len / low_freq_factor are divided by factor")
    high_freq_factor: Optional[PositiveFloat] = Field(None, description="llama3: wavelengths below original_max_seq_len / high_freq_factor are kept")
    original_max_seq_len: Optional[PositiveInt] = Field(None, description="llama3: context length the model was pre-trained with")

    @model_validator(mode="after")
    def _llama3_fields(self) -> "RopeScaling":
        if self.type == "llama3":
            missing = [n for n in ("low_freq_factor", "high_freq_factor", "original_max_seq_len") if getattr(self, n) is None]
            if missing:
                raise ValueError(f"llama3 scaling needs {', '.join(missing)}")
            if self.high_freq_factor <= self.low_freq_factor:
                raise ValueError(f"high_freq_factor = {self.high_freq_factor} must exceed low_freq_factor = {self.low_freq_factor}")
        elif any(getattr(self, n) is not None for n in ("low_freq_factor", "high_freq_factor", "original_max_seq_len")):
            raise ValueError("low_freq_factor, high_freq_factor and original_max_seq_len apply only to llama3 scaling")
        return self


class RopeConfig(ComponentConfig):
    """Config of ``rope``."""

    type: Literal["rope"] = "rope"
    theta: PositiveFloat = Field(10000.0, description="base of the geometric frequency sequence (rope_theta)")
    layout: Literal["half_split", "interleaved"] = Field(
        "half_split", description="which features form a rotated pair: the two halves (NeoX/HF) or neighbours (GPT-J/Meta)"
    )
    partial_rotary: float = Field(1.0, gt=0, le=1, description="fraction of head_dim that is rotated (Phi: 0.4); the rest passes through")
    scaling: Optional[RopeScaling] = Field(None, description="frequency scaling; null for none")


def rope_inv_freq(rotary_dim: int, theta: float, scaling: Optional[RopeScaling]) -> Tensor:
    """Inverse frequencies ``[rotary_dim // 2]`` (float64 math, returned as float32).

    ``inv_freq[i] = theta ** (-2i / rotary_dim)``, then scaled: linear divides all by ``factor``; llama3 keeps
    high frequencies, divides low ones by ``factor`` and interpolates smoothly in between (llama-models).
    """
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    if scaling is not None and scaling.type == "linear":
        inv = inv / scaling.factor
    elif scaling is not None and scaling.type == "llama3":
        old = scaling.original_max_seq_len
        low_wl, high_wl = old / scaling.low_freq_factor, old / scaling.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (old / wl - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        mid = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = torch.where(wl > low_wl, inv / scaling.factor, torch.where(wl < high_wl, inv, mid))
    return inv.to(torch.float32)


class Rope(PositionScheme):
    """Rotary position embedding on q/k. ``rotate(q [b, h, s, hd], k [b, hkv, s, hd], positions [b, s])``.

    Each rotated pair ``(a, b)`` at angle ``θ = position · inv_freq[i]`` becomes ``(a cos θ - b sin θ, b cos θ +
    a sin θ)``. It is computed over the whole rotary width as ``x · cos + partner(x) · sin±`` where ``partner``
    swaps the two members of every pair (``half_split``: the two halves; ``interleaved``: neighbours) and
    ``sin±`` is the sine of the *signed* angle ``θ·sign``, sign -1 on the first member of each pair (the buffer
    ``freq [rotary_dim]`` holds ``±inv_freq`` in feature order; ``sin(-θ) = -sin θ`` exactly). That is four
    elementwise ops per tensor, the same values and order of rounding as transformers' ``rotate_half`` form.
    """

    def __init__(self, cfg: RopeConfig, head_dim: int):
        super().__init__()
        self.cfg = cfg
        self.head_dim = head_dim
        rot = int(head_dim * cfg.partial_rotary)
        self.rotary_dim = rot - rot % 2
        self.register_buffer("inv_freq", torch.empty(self.rotary_dim // 2, dtype=torch.float32), persistent=False)
        self.register_buffer("freq", torch.empty(self.rotary_dim, dtype=torch.float32), persistent=False)

    def init_weights(self, init: Init) -> None:
        """Recompute ``inv_freq`` and the signed per-feature ``freq`` from the config (buffers: meta builds need this)."""
        inv = rope_inv_freq(self.rotary_dim, self.cfg.theta, self.cfg.scaling)
        init.copy_(self.inv_freq, inv)
        if self.cfg.layout == "half_split":  # features (a_0..a_{n-1}, b_0..b_{n-1}): pair i is (i, n + i)
            signed = torch.cat([-inv, inv])
        else:  # (a_0, b_0, a_1, b_1, ...)
            signed = torch.stack([-inv, inv], dim=-1).flatten()
        init.copy_(self.freq, signed)

    def _partner(self, x: Tensor) -> Tensor:
        """``x [..., rotary_dim]`` with the two members of every rotated pair swapped."""
        if self.cfg.layout == "half_split":
            return x.roll(self.rotary_dim // 2, dims=-1)
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos θ, sin θ·sign`` of shape ``[batch or 1, 1, seq, rotary_dim]`` (float32) for ``positions [batch, seq]``.

        Positions broadcast over the batch (a plain ``arange(seq).expand(batch, seq)``, stride 0) give a batch of 1.
        """
        if positions.shape[0] > 1 and positions.stride(0) == 0:
            positions = positions[:1]
        b, s = positions.shape
        theta = positions.to(torch.float32).view(b, 1, s, 1) * self.freq
        return theta.cos(), theta.sin()

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        rot = x if self.rotary_dim == x.shape[-1] else x[..., : self.rotary_dim]
        xf = rot if rot.dtype == torch.float32 else rot.float()
        out = xf * cos + self._partner(xf) * sin
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        return out if rot is x else torch.cat([out, x[..., self.rotary_dim :]], dim=-1)

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the first ``rotary_dim`` features of each q/k head by ``position * inv_freq``."""
        cos, sin = self.angles(positions)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


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
    base: PositiveFloat = Field(10000.0, description="base of the geometric wavelength sequence (10000 in Vaswani et al.)")


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
        """``x [batch, seq, d_model] + PE[positions [batch, seq]]``, in the dtype of ``x``."""
        _check_positions(positions, self.max_seq_len, "sinusoidal")
        return x + self.pe[positions].to(x.dtype)


class LearnedConfig(ComponentConfig):
    """Config of ``learned``: a trained table of absolute position vectors (GPT-2's ``wpe``)."""

    type: Literal["learned"] = "learned"


class Learned(PositionScheme):
    """Learned absolute positions: ``embed(x [b, s, d], positions [b, s]) = x + weight[positions]``.

    ``weight [max_seq_len, d_model]`` is a parameter initialised N(0, init_std) (GPT-2, Radford et al. 2019).
    """

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
    scale: float = Field(
        1.0, gt=0, description="multiplier of the bias (Falcon scales it by 1/sqrt(head_dim) with the scores); 1 in Press et al."
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


def _head_dim(ctx: BuildContext) -> int:
    if ctx.head_dim is None:
        raise ValueError("rope needs the attention head_dim; the layer's attention module must expose head_dim")
    return ctx.head_dim


@hookimpl
def register_components(register) -> None:
    """Register ``none``, ``sinusoidal``, ``learned``, ``rope`` and ``alibi``."""
    register(
        Component(
            kind="position",
            type="none",
            config=NoPositionConfig,
            factory=lambda cfg, ctx: NoPosition(),
            description="No explicit position information (NoPE). Acts nowhere.",
            reference="Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization, arXiv:2305.19466",
            capabilities={"acts_on": "none", "compile_safe": True, "stateless": True},
            param_count=lambda cfg, ctx: 0,
            flops=elementwise("no position information: nothing computed"),
        )
    )
    register(
        Component(
            kind="position",
            type="rope",
            config=RopeConfig,
            factory=lambda cfg, ctx: Rope(cfg, _head_dim(ctx)),
            description="Rotary position embedding applied to queries and keys: each feature pair is rotated "
            "by position × frequency. Layouts half_split / interleaved, partial rotary, linear and llama3 scaling.",
            reference="Su et al. 2021, RoFormer, arXiv:2104.09864; llama3 scaling: meta-llama/llama-models",
            capabilities={"acts_on": "qk", "compile_safe": True, "stateless": True},
            param_count=lambda cfg, ctx: 0,
            flops=elementwise("RoPE rotates q/k feature pairs: element-wise multiplies and adds, no matrix product"),
            example={"type": "rope", "theta": 500000.0, "layout": "half_split", "scaling": {"type": "llama3", "factor": 8.0,
                     "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_seq_len": 8192}},
        )
    )
    register(
        Component(
            kind="position",
            type="sinusoidal",
            config=SinusoidalConfig,
            factory=lambda cfg, ctx: Sinusoidal(cfg, ctx.max_seq_len, ctx.d_model),
            description="Fixed sinusoidal absolute positions added to the token embeddings: "
            "x [batch, seq, d_model] + PE[positions], PE[p, 2i] = sin(p·base^(-2i/d)), PE[p, 2i+1] = cos(...). "
            "Odd d_model supported; the table [max_seq_len, d_model] is a float32 buffer recomputed at init.",
            reference="Vaswani et al. 2017, Attention Is All You Need, §3.5, arXiv:1706.03762",
            capabilities={"acts_on": "embedding", "compile_safe": True, "stateless": True},
            param_count=lambda cfg, ctx: 0,
            flops=elementwise("a table row added to each embedding: a lookup and an add"),
            example={"type": "sinusoidal", "base": 10000.0},
        )
    )
    register(
        Component(
            kind="position",
            type="learned",
            config=LearnedConfig,
            factory=lambda cfg, ctx: Learned(ctx.max_seq_len, ctx.d_model),
            description="Learned absolute positions (GPT-2 wpe) added to the token embeddings: "
            "x [batch, seq, d_model] + weight[positions], weight [max_seq_len, d_model] initialised N(0, init_std).",
            reference="Radford et al. 2019, Language Models are Unsupervised Multitask Learners (GPT-2); "
            "Gehring et al. 2017, arXiv:1705.03122",
            capabilities={"acts_on": "embedding", "compile_safe": True, "tp_plan": {}},
            param_count=lambda cfg, ctx: ctx.max_seq_len * ctx.d_model,
            flops=elementwise("a learned table row added to each embedding: a lookup and an add"),
        )
    )
    register(
        Component(
            kind="position",
            type="alibi",
            config=AlibiConfig,
            factory=lambda cfg, ctx: Alibi(ctx.n_heads, cfg.scale),
            description="ALiBi: no position embedding; each head adds -slope_h * |q_pos - k_pos| to its attention "
            "scores ([batch, n_heads, q_len, kv_len] float32). Slopes follow Press et al., including head counts "
            "that are not a power of two.",
            reference="Press, Smith & Lewis 2022, Train Short, Test Long: Attention with Linear Biases, arXiv:2108.12409",
            capabilities={"acts_on": "bias", "compile_safe": True, "stateless": True},
            param_count=lambda cfg, ctx: 0,
            flops=elementwise("a bias -slope * distance added to the scores: element-wise"),
        )
    )
