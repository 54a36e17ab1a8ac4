"""Rotary position embedding (``rope``) and its frequency scalings, registered by :mod:`.position`.

RoPE rotates pairs of query/key features by position-dependent angles. Pairs are either the two halves of
the rotary dims (``half_split``: GPT-NeoX, Hugging Face Llama) or adjacent features (``interleaved``: GPT-J,
Meta's reference Llama); transformers #25199 is what happens when the two are confused. Frequencies come from
the spec (theta, partial rotary fraction, scaling) and are recomputed by ``init_weights``, so a ``meta``
build is correct after materialisation (transformers #45902).

References: Su et al. 2021, RoFormer (arXiv:2104.09864); linear scaling, Chen et al. 2023
(arXiv:2306.15595); llama3 scaling, meta-llama/llama-models ``apply_scaling``; dynamic NTK scaling, bloc97 and
emozilla (r/LocalLLaMA, 2023) as in transformers ``_compute_dynamic_ntk_parameters``; YaRN, Peng et al. 2023
(arXiv:2309.00071); LongRoPE, Ding et al. 2024 (arXiv:2402.13753) as in Phi-3; proportional partial rotation,
transformers ``_compute_proportional_rope_parameters`` (Gemma 4, LFM3).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

import torch
from pydantic import Field, model_validator
from torch import Tensor

from modkit.plugin import (
    BuildContext,
    Component,
    ComponentConfig,
    elementwise,
    Init,
    MAX_MSCALE,
    MAX_MULTIPLIER,
    MAX_ROPE_FACTOR,
    MAX_THETA,
    MIN_THETA,
    Multiplier,
    PositionScheme,
    RopeFactor,
    SeqLen,
    StrictModel,
)


#: what the description of a scaling factor adds: its bound (modkit.core.limits) and why
_BOUND = f" (at most {MAX_ROPE_FACTOR:g}, far above the published 4-40, so frequencies and factors stay finite)"


class _Scaling(StrictModel):
    """Base of the RoPE scaling options: strict like every spec object (see :class:`modkit.core.config.StrictModel`)."""


class LinearScaling(_Scaling):
    """Linear position interpolation (Chen et al. 2023): every frequency divided by ``factor``."""

    type: Literal["linear"] = Field(..., description="'linear': divide every frequency by factor")
    factor: RopeFactor = Field(..., description="context extension factor" + _BOUND)


class Llama3Scaling(_Scaling):
    """Llama 3.1's band-wise scaling (meta-llama/llama-models ``apply_scaling``)."""

    type: Literal["llama3"] = Field(
        ..., description="'llama3': keep high frequencies, divide low ones by factor, blend between"
    )
    factor: RopeFactor = Field(..., description="divisor of the low frequencies" + _BOUND)
    low_freq_factor: RopeFactor = Field(
        ..., description="wavelengths above original_max_seq_len / low_freq_factor are divided by factor" + _BOUND
    )
    high_freq_factor: RopeFactor = Field(
        ..., description="wavelengths below original_max_seq_len / high_freq_factor are kept" + _BOUND
    )
    original_max_seq_len: SeqLen = Field(..., description="context length the model was pre-trained with")

    @model_validator(mode="after")
    def _bands(self) -> "Llama3Scaling":
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor = {self.high_freq_factor} must exceed low_freq_factor = {self.low_freq_factor}"
            )
        return self


class DynamicScaling(_Scaling):
    """Dynamic NTK-aware scaling (bloc97/emozilla; transformers ``dynamic``): the base grows with the input length.

    For a forward whose longest position is ``L - 1``, with ``L > original_max_seq_len``, the base becomes
    ``theta · (factor · L / original_max_seq_len - (factor - 1)) ** (d / (d - 2))`` (``d`` the rotary width); inputs
    within the trained length use ``theta`` unchanged.
    """

    type: Literal["dynamic"] = Field(
        ..., description="'dynamic': NTK-aware base that grows once the input passes original_max_seq_len"
    )
    factor: RopeFactor = Field(..., description="scaling factor of the base growth" + _BOUND)
    original_max_seq_len: SeqLen = Field(
        ..., description="trained context length (transformers: max_position_embeddings)"
    )


class NtkAlphaScaling(_Scaling):
    """NTK-aware scaling with a fixed ``alpha`` (Tencent Hunyuan; transformers ``compute_ntk_alpha_rope_parameters``):
    the base becomes ``theta · alpha ** (d / (d - 2))`` (``d`` the rotary width) at every length, so the
    frequencies are static (unlike ``dynamic``)."""

    type: Literal["ntk_alpha"] = Field(..., description="'ntk_alpha': a static NTK-aware base theta · alpha^(d/(d-2))")
    alpha: RopeFactor = Field(..., description="stretch of the base (Hunyuan-A13B: 1000)" + _BOUND)


class YarnScaling(_Scaling):
    """YaRN (Peng et al. 2023, arXiv:2309.00071): NTK-by-parts interpolation plus an attention temperature.

    Frequencies whose wavelength fits ``beta_fast`` times in ``original_max_seq_len`` are kept, those fitting fewer
    than ``beta_slow`` times are divided by ``factor``, with a linear ramp between. cos and sin are multiplied by
    the attention factor (so q·k by its square): ``attention_factor`` when given, else ``0.1·mscale·ln(factor) + 1``
    over ``0.1·mscale_all_dim·ln(factor) + 1`` when both mscales are given (DeepSeek), else ``0.1·ln(factor) + 1``.
    """

    type: Literal["yarn"] = Field(..., description="'yarn': NTK-by-parts interpolation with an attention factor")
    factor: RopeFactor = Field(..., description="context extension factor s" + _BOUND)
    original_max_seq_len: SeqLen = Field(..., description="context length the model was pre-trained with")
    beta_fast: RopeFactor = Field(32.0, description="rotations above which a frequency is kept (extrapolated)" + _BOUND)
    beta_slow: RopeFactor = Field(
        1.0, description="rotations below which a frequency is divided by factor (interpolated)" + _BOUND
    )
    mscale: Optional[float] = Field(
        None,
        ge=0,
        le=MAX_MSCALE,
        description="with mscale_all_dim: numerator coefficient of the attention factor; within [0, "
        f"{MAX_MSCALE:g}] (DeepSeek: 0.707-1; a negative one can make the factor 0 or its divisor 0)",
    )
    mscale_all_dim: Optional[float] = Field(
        None,
        ge=0,
        le=MAX_MSCALE,
        description="with mscale: denominator coefficient of the attention factor; within [0, "
        f"{MAX_MSCALE:g}] (DeepSeek: 0.707-1; a negative one can make the divisor 0)",
    )
    attention_factor: Optional[Multiplier] = Field(
        None,
        description="multiplier of cos/sin; overrides the default 0.1·ln(factor) + 1. At most "
        f"{MAX_MULTIPLIER:g} (published factors are 1-2; q·k grows with its square)",
    )
    truncate: bool = Field(
        True, description="round the correction range outwards to whole dimensions (transformers' default)"
    )


class LongRopeScaling(_Scaling):
    """LongRoPE (Ding et al. 2024, arXiv:2402.13753; Phi-3 128k): per-frequency rescale factors, short or long.

    A forward whose longest position is below ``original_max_seq_len`` divides frequency ``i`` by
    ``short_factor[i]``, a longer one by ``long_factor[i]``. cos and sin are multiplied by ``attention_factor``,
    default ``sqrt(1 + ln(factor) / ln(original_max_seq_len))`` (1 when ``factor <= 1``), where ``factor``
    defaults to ``max_seq_len / original_max_seq_len``.
    """

    type: Literal["longrope"] = Field(
        ..., description="'longrope': per-frequency factors, short below original_max_seq_len, long above"
    )
    short_factor: list[RopeFactor] = Field(
        ...,
        min_length=1,
        description="divisor of each frequency for inputs within original_max_seq_len (rotary width / 2 values)"
        + _BOUND,
    )
    long_factor: list[RopeFactor] = Field(
        ...,
        min_length=1,
        description="divisor of each frequency for longer inputs (rotary width / 2 values)" + _BOUND,
    )
    original_max_seq_len: SeqLen = Field(..., description="context length the model was pre-trained with")
    factor: Optional[RopeFactor] = Field(
        None, description="context extension factor; default max_seq_len / original_max_seq_len" + _BOUND
    )
    attention_factor: Optional[Multiplier] = Field(
        None,
        description="multiplier of cos/sin; default sqrt(1 + ln(factor) / ln(original_max_seq_len)). At most "
        f"{MAX_MULTIPLIER:g} (published factors are 1-2; q·k grows with its square)",
    )

    def resolved_attention_factor(self, max_seq_len: int) -> float:
        """The multiplier of cos and sin for a model of ``max_seq_len`` positions."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        factor = self.factor if self.factor is not None else max_seq_len / self.original_max_seq_len
        return 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(self.original_max_seq_len))


#: every frequency scaling of ``rope`` (a discriminated union on ``type``)
RopeScaling = Annotated[
    Union[LinearScaling, Llama3Scaling, DynamicScaling, NtkAlphaScaling, YarnScaling, LongRopeScaling],
    Field(discriminator="type"),
]


def yarn_attention_factor(scaling: YarnScaling) -> float:
    """The YaRN multiplier of cos and sin (transformers ``_compute_yarn_parameters``; Peng et al. 2023 eq. 22)."""
    if scaling.attention_factor is not None:
        return float(scaling.attention_factor)

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return mscale(scaling.factor, scaling.mscale) / mscale(scaling.factor, scaling.mscale_all_dim)
    return mscale(scaling.factor)


class RopeConfig(ComponentConfig):
    """Config of ``rope``."""

    type: Literal["rope"] = "rope"
    theta: float = Field(
        10000.0,
        ge=MIN_THETA,
        le=MAX_THETA,
        description=f"base of the geometric frequency sequence (rope_theta); within [{MIN_THETA:g}, {MAX_THETA:g}]: "
        "published models use 1e4-1e7, and below 1 the frequencies theta^(-i/d) grow until they overflow float32",
    )
    layout: Literal["half_split", "interleaved"] = Field(
        "half_split",
        description="which features form a rotated pair: the two halves (NeoX/HF) or neighbours (GPT-J/Meta)",
    )
    partial_rotary: float = Field(
        1.0,
        gt=0,
        le=1,
        description="fraction of head_dim that is rotated (Phi: 0.4); int(head_dim × partial_rotary) "
        "features are rotated, which must be even; the rest passes through",
    )
    partial_mode: Literal["leading", "proportional"] = Field(
        "leading",
        description="how partial_rotary picks the rotated pairs. 'leading': the first int(head_dim × partial_rotary) "
        "features form the pairs, with frequencies theta^(-2i/rotary_width) (Phi, GPT-NeoX); 'proportional' "
        "(transformers' 'proportional' rope_type, Gemma 4, LFM3): the pairs span the whole head (half_split pairs i "
        "and head_dim/2 + i), the first int(head_dim × partial_rotary) / 2 of them turn at theta^(-2i/head_dim) and "
        "the others at frequency 0 (they pass through). Scalings: none or linear with 'proportional'",
    )
    scaling: Optional[RopeScaling] = Field(
        None, description="frequency scaling (linear, llama3, dynamic, ntk_alpha, yarn, longrope); null for none"
    )

    @model_validator(mode="after")
    def _proportional_scaling(self) -> "RopeConfig":
        if self.partial_mode == "proportional" and self.scaling is not None and self.scaling.type != "linear":
            raise ValueError(
                f"partial_mode 'proportional' takes no scaling or a linear one (transformers' proportional RoPE "
                f"divides its frequencies by factor), got scaling {self.scaling.type!r}; use partial_mode 'leading' "
                "or drop the scaling"
            )
        return self

    def check(self, ctx) -> list[tuple[str, str]]:
        """With the layer's ``head_dim`` known: the rotary width must be even and positive; LongRoPE factors must
        hold one value per rotated pair; dynamic NTK needs a width above 2 (its exponent is d / (d - 2))."""
        hd = getattr(ctx, "head_dim", None)
        if hd is None:
            return []
        if self.partial_mode == "proportional":
            return _proportional_errors(hd, self.partial_rotary)
        rot = int(hd * self.partial_rotary)
        if rot < 2 or rot % 2:
            if self.partial_rotary != 1:
                where, how = "partial_rotary", f"int(head_dim × partial_rotary) = int({hd} × {self.partial_rotary})"
                fix = "choose partial_rotary so that head_dim × partial_rotary is even"
            else:
                where, how, fix = "", f"head_dim = {hd}", "use an even head_dim"
            return [
                (
                    where,
                    f"rope rotates features in pairs, but {how} gives a rotary width of {rot}, which is "
                    f"{'odd' if rot % 2 else 'empty'}; {fix} (transformers would rotate a different width)",
                )
            ]
        sc = self.scaling
        errors = []
        if isinstance(sc, LongRopeScaling):
            for name in ("short_factor", "long_factor"):
                n = len(getattr(sc, name))
                if n != rot // 2:
                    errors.append(
                        (
                            f"scaling.{name}",
                            f"has {n} values; LongRoPE needs one per rotated pair, "
                            f"rotary width {rot} / 2 = {rot // 2} (head_dim = {hd}, "
                            f"partial_rotary = {self.partial_rotary})",
                        )
                    )
        if isinstance(sc, (DynamicScaling, NtkAlphaScaling)) and rot <= 2:
            errors.append(
                (
                    "scaling",
                    f"{sc.type} NTK scaling needs a rotary width above 2 (its exponent is d / (d - 2)), got {rot}",
                )
            )
        return errors


def _proportional_errors(head_dim: int, partial_rotary: float) -> list[tuple[str, str]]:
    """The ``check`` errors of ``partial_mode: proportional``: an even head (pairs span its two halves) and at least
    one turning pair, ``int(head_dim × partial_rotary) // 2 >= 1``."""
    if head_dim % 2:
        return [("partial_mode", f"'proportional' pairs the two halves of the head, but head_dim = {head_dim} is odd")]
    if int(head_dim * partial_rotary) // 2 < 1:
        return [
            (
                "partial_rotary",
                f"'proportional' turns int(head_dim × partial_rotary) // 2 = int({head_dim} × {partial_rotary}) // 2 "
                "= 0 pairs; raise partial_rotary so that at least one pair turns",
            )
        ]
    return []


def rotary_width(head_dim: int, partial_rotary: float) -> int:
    """``int(head_dim × partial_rotary)``, the number of rotated features (transformers' rule).

    Raises:
        ValueError: the width is odd or zero (RoPE turns pairs of features; the spec check names the fix).
    """
    rot = int(head_dim * partial_rotary)
    if rot < 2 or rot % 2:
        raise ValueError(
            f"rope rotary width int(head_dim × partial_rotary) = int({head_dim} × {partial_rotary}) = {rot} must be "
            "even and positive (features are rotated in pairs)"
        )
    return rot


def rope_inv_freq(rotary_dim: int, theta: float, scaling=None) -> Tensor:
    """Inverse frequencies ``[rotary_dim // 2]`` (float64 math, returned as float32) of the static scalings.

    ``inv_freq[i] = theta ** (-2i / rotary_dim)``, then scaled: linear divides all by ``factor``; llama3 keeps
    high frequencies, divides low ones by ``factor`` and interpolates smoothly in between (llama-models); yarn
    blends interpolated and extrapolated frequencies over a linear ramp between the dimensions that make
    ``beta_fast`` and ``beta_slow`` rotations in ``original_max_seq_len`` (Peng et al. 2023, transformers
    ``_compute_yarn_parameters``); ntk_alpha raises the base to ``theta · alpha ** (rotary_dim / (rotary_dim - 2))``
    (transformers ``compute_ntk_alpha_rope_parameters``). ``dynamic`` and ``longrope`` frequencies depend on the input length: this
    returns their short-input frequencies (``dynamic``: unscaled; ``longrope``: divided by ``short_factor``).
    """
    kind = getattr(scaling, "type", None)
    if kind == "ntk_alpha":
        theta = theta * scaling.alpha ** (rotary_dim / (rotary_dim - 2))
    exponent = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    inv = 1.0 / (theta**exponent)
    if kind == "linear":
        inv = inv / scaling.factor
    elif kind == "llama3":
        old = scaling.original_max_seq_len
        low_wl, high_wl = old / scaling.low_freq_factor, old / scaling.high_freq_factor
        wl = 2 * math.pi / inv
        smooth = (old / wl - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
        mid = (1 - smooth) * inv / scaling.factor + smooth * inv
        inv = torch.where(wl > low_wl, inv / scaling.factor, torch.where(wl < high_wl, inv, mid))
    elif kind == "yarn":
        inv = yarn_inv_freq(inv, rotary_dim, theta, scaling)
    elif kind == "longrope":
        inv = inv / torch.tensor(scaling.short_factor, dtype=torch.float64)
    return inv.to(torch.float32)


def yarn_inv_freq(inv: Tensor, d: int, theta: float, sc: YarnScaling) -> Tensor:
    """YaRN's inverse frequencies from the unscaled ones ``inv [d // 2]`` of a rotary width ``d`` and base
    ``theta``: ``[d // 2]`` float64, each ``inv / factor`` (interpolated) or ``inv`` (kept) blended over a linear
    ramp between the dimensions that turn ``beta_fast`` and ``beta_slow`` times in ``original_max_seq_len``.
    Source: Peng et al. 2023 (arXiv:2309.00071) §3.2, transformers ``_compute_yarn_parameters``."""

    def dim_of(rotations: float) -> float:  # the dimension whose wavelength fits `rotations` times in the context
        return d * math.log(sc.original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(sc.beta_fast), dim_of(sc.beta_slow)
    if sc.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the frequency), 0: interpolate (divide by factor)
    return inv / sc.factor * (1 - keep) + inv * keep


class Rope(PositionScheme):
    """Rotary position embedding on q/k. ``rotate(q [b, h, s, hd], k [b, hkv, s, hd], positions [b, s])``.

    Each rotated pair ``(a, b)`` at angle ``θ = position · inv_freq[i]`` becomes ``(a cos θ - b sin θ, b cos θ +
    a sin θ)``. It is computed over the whole rotary width as ``x · cos + partner(x) · sin±`` where ``partner``
    swaps the two members of every pair (``half_split``: the two halves; ``interleaved``: neighbours) and
    ``sin±`` is the sine of the *signed* angle ``θ·sign``, sign -1 on the first member of each pair (the buffer
    ``freq [rotary_dim]`` holds ``±inv_freq`` in feature order; ``sin(-θ) = -sin θ`` exactly). That is four
    elementwise ops per tensor, the same values and order of rounding as transformers' ``rotate_half`` form.

    ``partial_mode: proportional`` (transformers ``_compute_proportional_rope_parameters``) rotates the whole head
    with the trailing frequencies zero: those pairs get ``cos 0 = 1``, ``sin 0 = 0`` and pass through unchanged.

    Scalings: ``linear``, ``llama3`` and ``yarn`` fix the frequencies at init; ``yarn`` and ``longrope`` also
    multiply cos and sin by an attention factor (``attention_scale``). ``dynamic`` and ``longrope`` choose the
    frequencies per call from ``L = max(positions) + 1``, the length the call reaches (no host sync, so it
    compiles): up to ``original_max_seq_len`` the short-input frequencies, beyond it the grown base (dynamic) or
    ``long_factor`` (longrope). As in transformers, keys cached by earlier calls keep the rotation they were stored
    with, so a cached decode that crosses ``original_max_seq_len`` differs from one full forward over the same
    tokens. Unlike transformers' dynamic rotary module, which keeps the largest length seen until an input shorter
    than ``original_max_seq_len`` resets it, this is a function of each call's positions alone (the two agree
    whenever lengths only grow, as in one generation).
    """

    def __init__(self, cfg: RopeConfig, head_dim: int, max_seq_len: Optional[int] = None):
        super().__init__()
        self.cfg = cfg
        self.head_dim = head_dim
        proportional = cfg.partial_mode == "proportional"  # every pair of the head, the trailing ones unturned
        self.rotary_dim = head_dim if proportional else rotary_width(head_dim, cfg.partial_rotary)
        sc = cfg.scaling
        self.dynamic = getattr(sc, "type", None) in ("dynamic", "longrope")
        if isinstance(sc, YarnScaling):
            self.attention_scale = yarn_attention_factor(sc)
        elif isinstance(sc, LongRopeScaling):
            length = max_seq_len if max_seq_len is not None else sc.original_max_seq_len
            self.attention_scale = sc.resolved_attention_factor(length)
        else:
            self.attention_scale = 1.0
        self.register_buffer("inv_freq", torch.empty(self.rotary_dim // 2, dtype=torch.float32), persistent=False)
        self.register_buffer("freq", torch.empty(self.rotary_dim, dtype=torch.float32), persistent=False)
        if isinstance(sc, LongRopeScaling):  # the signed frequencies for inputs longer than original_max_seq_len
            self.register_buffer("long_freq", torch.empty(self.rotary_dim, dtype=torch.float32), persistent=False)

    def _signed(self, inv: Tensor) -> Tensor:
        """``±inv_freq`` in feature order (``[..., rotary_dim // 2] -> [..., rotary_dim]``)."""
        if self.cfg.layout == "half_split":  # features (a_0..a_{n-1}, b_0..b_{n-1}): pair i is (i, n + i)
            return torch.cat([-inv, inv], dim=-1)
        return torch.stack([-inv, inv], dim=-1).flatten(-2)  # (a_0, b_0, a_1, b_1, ...)

    def init_weights(self, init: Init) -> None:
        """Recompute ``inv_freq`` and the signed per-feature ``freq`` (and LongRoPE's ``long_freq``) from the config
        (buffers: meta builds need this)."""
        inv = rope_inv_freq(self.rotary_dim, self.cfg.theta, self.cfg.scaling)
        if self.cfg.partial_mode == "proportional":  # transformers _compute_proportional_rope_parameters
            inv[int(self.head_dim * self.cfg.partial_rotary) // 2 :] = 0.0
        init.copy_(self.inv_freq, inv)
        init.copy_(self.freq, self._signed(inv))
        sc = self.cfg.scaling
        if isinstance(sc, LongRopeScaling):
            base = rope_inv_freq(self.rotary_dim, self.cfg.theta, None).double()
            init.copy_(self.long_freq, self._signed(base / torch.tensor(sc.long_factor, dtype=torch.float64)))

    def _partner(self, x: Tensor) -> Tensor:
        """``x [..., rotary_dim]`` with the two members of every rotated pair swapped."""
        if self.cfg.layout == "half_split":
            return x.roll(self.rotary_dim // 2, dims=-1)
        return x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)

    def frequencies(self, positions: Tensor) -> Tensor:
        """The signed per-feature frequencies ``[rotary_dim]`` (float32) for a call at ``positions [batch, seq]``.

        Static scalings return the ``freq`` buffer. ``dynamic`` and ``longrope`` pick by ``L = max(positions) + 1``:
        the buffer while ``L <= original_max_seq_len``; beyond it the dynamic NTK base
        ``theta · (factor · L / original - (factor - 1)) ** (d / (d - 2))`` (computed in float32 like transformers'
        ``_compute_dynamic_ntk_parameters``) or LongRoPE's ``long_freq``.
        """
        if not self.dynamic:
            return self.freq
        sc = self.cfg.scaling
        length = positions.amax() + 1
        beyond = length > sc.original_max_seq_len
        if sc.type == "longrope":
            return torch.where(beyond, self.long_freq, self.freq)
        d = self.rotary_dim
        grown = torch.clamp(length, min=sc.original_max_seq_len).to(torch.float32)
        base = self.cfg.theta * (sc.factor * grown / sc.original_max_seq_len - (sc.factor - 1)) ** (d / (d - 2))
        exponent = torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d
        return torch.where(beyond, self._signed(1.0 / base**exponent), self.freq)

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos θ, sin θ·sign`` of shape ``[batch or 1, 1, seq, rotary_dim]`` (float32) for ``positions [batch, seq]``,
        both multiplied by ``attention_scale`` (YaRN, LongRoPE; 1 otherwise).

        Positions broadcast over the batch (a plain ``arange(seq).expand(batch, seq)``, stride 0) give a batch of 1.
        """
        freq = self.frequencies(positions)
        if positions.shape[0] > 1 and positions.stride(0) == 0:
            positions = positions[:1]
        b, s = positions.shape
        theta = positions.to(torch.float32).view(b, 1, s, 1) * freq
        if self.attention_scale != 1.0:
            return theta.cos() * self.attention_scale, theta.sin() * self.attention_scale
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


def _head_dim(ctx: BuildContext) -> int:
    """The layer's attention ``head_dim``; raises ``ValueError`` when the attention exposes none."""
    if ctx.head_dim is None:
        raise ValueError("rope needs the attention head_dim; the layer's attention module must expose head_dim")
    return ctx.head_dim


#: The key formula of the docs page (pymdownx.arithmatex).
MATH = r"""Query and key features form $r/2$ pairs $(a_i, b_i)$ ($r$ = the rotary width, head_dim or its partial
rotary part; half_split pairs feature $i$ with $i + r/2$, interleaved pairs $2i$ with $2i + 1$). At position $p$
each pair is rotated by the angle $p\, \theta_i$:

$$a_i' = a_i \cos(p\,\theta_i) - b_i \sin(p\,\theta_i), \qquad b_i' = b_i \cos(p\,\theta_i) + a_i \sin(p\,\theta_i),
\qquad \theta_i = \Theta^{-2i/r}$$

$\Theta$ = theta, $i = 0, \dots, r/2 - 1$. The score $q_m'^\top k_n'$ then depends on the positions only through
$m - n$. A scaling rescales the $\theta_i$ (linear: all by $1/s$; llama3: by frequency band; YaRN, LongRoPE: per
dimension, YaRN also scales the rotated values by its attention factor)."""


def rope_component() -> Component:
    """The ``rope`` registry entry (registered by :func:`modkit_plugins.position.register_components`)."""
    return Component(
        kind="position",
        type="rope",
        config=RopeConfig,
        factory=lambda cfg, ctx: Rope(cfg, _head_dim(ctx), ctx.max_seq_len),
        math=MATH,
        description="Rotary position embedding applied to queries and keys: each feature pair is rotated "
        "by position × frequency. Layouts half_split / interleaved, partial rotary (an even rotary width), and "
        "frequency scalings: linear, llama3, dynamic NTK, YaRN (with its attention factor) and LongRoPE.",
        reference="Su et al. 2021, RoFormer, arXiv:2104.09864; linear: Chen et al. 2023, arXiv:2306.15595; llama3: "
        "github.com/meta-llama/llama-models; dynamic NTK: transformers _compute_dynamic_ntk_parameters; YaRN: "
        "Peng et al. 2023, arXiv:2309.00071; LongRoPE: Ding et al. 2024, arXiv:2402.13753",
        capabilities={"acts_on": "qk", "compile_safe": True, "stateless": True, "unbounded_positions": True},
        param_count=lambda cfg, ctx: 0,
        flops=elementwise("RoPE rotates q/k feature pairs: element-wise multiplies and adds, no matrix product"),
        example={
            "type": "rope",
            "theta": 500000.0,
            "layout": "half_split",
            "scaling": {
                "type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_seq_len": 8192,
            },
        },
    )
