"""Position schemes: ``none`` and ``rope``.

RoPE rotates pairs of query/key features by position-dependent angles. Pairs are either the two halves of
the rotary dims (``half_split``: GPT-NeoX, Hugging Face Llama) or adjacent features (``interleaved``: GPT-J,
Meta's reference Llama); transformers #25199 is what happens when the two are confused. Frequencies come from
the spec (theta, partial rotary fraction, scaling) and are recomputed by ``init_weights``, so a ``meta``
build is correct after materialisation (transformers #45902).

References: Su et al. 2021, RoFormer (arXiv:2104.09864); linear scaling, Chen et al. 2023
(arXiv:2306.15595); llama3 scaling, meta-llama/llama-models ``apply_scaling``.
"""

from __future__ import annotations

import math
from typing import Literal, Optional

import torch
from pydantic import Field, PositiveFloat, PositiveInt, model_validator
from torch import Tensor

from modkit import BuildContext, Component, ComponentConfig, Init, PositionScheme, hookimpl
from pydantic import BaseModel, ConfigDict


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
    """Rotary position embedding on q/k. ``rotate(q [b, h, s, hd], k [b, hkv, s, hd], positions [b, s])``."""

    def __init__(self, cfg: RopeConfig, head_dim: int):
        super().__init__()
        self.cfg = cfg
        self.head_dim = head_dim
        rot = int(head_dim * cfg.partial_rotary)
        self.rotary_dim = rot - rot % 2
        self.register_buffer("inv_freq", torch.empty(self.rotary_dim // 2, dtype=torch.float32), persistent=False)

    def init_weights(self, init: Init) -> None:
        """Recompute ``inv_freq`` from the config (it is a buffer, so meta builds need this)."""
        init.copy_(self.inv_freq, rope_inv_freq(self.rotary_dim, self.cfg.theta, self.cfg.scaling))

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        xf = rot.float()
        if self.cfg.layout == "half_split":
            x1, x2 = xf.chunk(2, dim=-1)
            c, s = cos, sin
            out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        else:
            x1, x2 = xf[..., 0::2], xf[..., 1::2]
            out = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        return torch.cat([out.to(x.dtype), rest], dim=-1) if rest.shape[-1] else out.to(x.dtype)

    def angles(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``cos, sin`` of shape ``[batch, 1, seq, rotary_dim // 2]`` (float32) for ``positions [batch, seq]``."""
        freqs = positions.to(torch.float32)[:, None, :, None] * self.inv_freq
        return freqs.cos(), freqs.sin()

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Rotate the first ``rotary_dim`` features of each q/k head by ``position * inv_freq``."""
        cos, sin = self.angles(positions)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)


def _head_dim(ctx: BuildContext) -> int:
    if ctx.head_dim is None:
        raise ValueError("rope needs the attention head_dim; the layer's attention module must expose head_dim")
    return ctx.head_dim


@hookimpl
def register_components(register) -> None:
    """Register ``none`` and ``rope``."""
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
        )
    )
