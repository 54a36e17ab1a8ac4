"""``attention/latent-attention``: the plugin guide's example of an attention with a latent-only cache.

Written as a third-party plugin would be, against modkit's cache contract only (``cache_spec()``,
``update_cache_entries``, ``position_geometry``): it caches a latent and one rotated key shared by every head, with
no core edit and no padding. The guide (``docs/guides/writing-a-plugin.md``, "The cache holds what a mixer
declares") shows this file verbatim; ``tests/nn/test_cache_contract.py`` registers it and runs the contract kit on it.
Multi-head latent attention in the manner of DeepSeek-V2 (arXiv:2405.04434 §2.1), without the absorbed decode of
the built-in ``mla``.
"""

from typing import Literal

import torch
from pydantic import Field
from torch import nn

from modkit.plugin import (
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    PositionGeometry,
    hookimpl,
    masked_attention,
    position_bias,
    prepare_mask,
    update_cache_entries,
)


class LatentAttentionConfig(ComponentConfig):
    """Per-head keys and values expanded from a cached latent, plus one rotated key shared by every head."""

    type: Literal["latent-attention"] = "latent-attention"
    n_heads: int = Field(4, description="query heads")
    latent: int = Field(16, description="width of the cached latent")
    head_dim: int = Field(8, description="per-head key/value width expanded from the latent")
    rope_dim: int = Field(4, description="rotated width of the queries and of the shared key")

    def position_geometry(self, ctx) -> PositionGeometry:
        """The position scheme rotates the rope_dim part: n_heads query heads, one shared key."""
        return PositionGeometry(self.n_heads, self.rope_dim, 1)


class LatentAttention(nn.Module):
    """``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``; caches latent + shared rotated key."""

    def __init__(self, cfg: LatentAttentionConfig, d_model: int):
        super().__init__()
        self.n_heads, self.latent, self.head_dim, self.rope_dim = cfg.n_heads, cfg.latent, cfg.head_dim, cfg.rope_dim
        self.q = nn.Linear(d_model, cfg.n_heads * (cfg.head_dim + cfg.rope_dim), bias=False)
        self.down = nn.Linear(d_model, cfg.latent + cfg.rope_dim, bias=False)  # latent and shared key
        self.up = nn.Linear(cfg.latent, cfg.n_heads * 2 * cfg.head_dim, bias=False)  # per-head keys and values
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, d_model, bias=False)

    def cache_spec(self) -> CacheSpec:
        """Per token: the latent [batch, slots, latent] and the rotated key [batch, slots, rope_dim]; nothing else."""
        return CacheSpec((CacheEntry("latent", (self.latent,)), CacheEntry("k_rope", (self.rope_dim,))))

    def forward(self, x, inputs):
        b, s, _ = x.shape
        h, hd, r = self.n_heads, self.head_dim, self.rope_dim
        q_nope, q_rope = self.q(x).view(b, s, h, hd + r).transpose(1, 2).split([hd, r], -1)
        c, k_rope = self.down(x).split([self.latent, r], -1)
        k_rope = k_rope[:, None]  # [b, 1, s, r]: one key head
        if inputs.position is not None:
            q_rope, k_rope = inputs.position.rotate(q_rope, k_rope, inputs.positions)
        seen, k_pos, k_valid = update_cache_entries(inputs, {"latent": c, "k_rope": k_rope[:, 0]}, mixer=self)
        n = seen["latent"].shape[1]  # every token the new queries may see
        k_nope, v = self.up(seen["latent"]).view(b, n, h, 2 * hd).transpose(1, 2).split([hd, hd], -1)
        k = torch.cat([k_nope, seen["k_rope"][:, None].expand(b, h, n, r)], -1)
        mask = prepare_mask(inputs, k_pos, k_valid, q_nope.dtype, mixer=self)
        out, _ = masked_attention(torch.cat([q_nope, q_rope], -1), k, v, mask, position_bias(inputs, k_pos, h))
        return self.o(out.transpose(1, 2).reshape(b, s, h * hd))


COMPONENT = Component(
    kind="attention",
    type="latent-attention",
    config=LatentAttentionConfig,
    factory=lambda cfg, ctx: LatentAttention(cfg, ctx.d_model),
    description="Attention over a cached latent and one shared rotated key (an MLA-style cache, no padding).",
    capabilities={"causal_safe": True, "kv_cache": True, "compile_safe": True},
    param_count=lambda cfg, ctx: (
        ctx.d_model * (cfg.n_heads * (cfg.head_dim + cfg.rope_dim) + cfg.latent + cfg.rope_dim)
        + cfg.latent * cfg.n_heads * 2 * cfg.head_dim
        + cfg.n_heads * cfg.head_dim * ctx.d_model
    ),
)


@hookimpl
def register_components(register) -> None:
    """Register ``attention/latent-attention`` (the entry point of a package holding this module)."""
    register(COMPONENT)
