"""The component module of a plugin skeleton, one :class:`string.Template` text per kind
(:data:`COMPONENT_TEMPLATES`), and the README's spec snippet per kind (:data:`USAGE`).

Placeholders as in :mod:`modkit.cli.scaffold.templates`: ``$type`` (the component type name), ``$Class`` (its
class name), ``$ident`` (its Python identifier). Each module holds a config model, the ``nn.Module``, the factory,
``param_count`` and the ``Component`` entry, and passes the contract kit unchanged.
"""

from .mixer import MIXER

NORM = '''\
"""``norm/$type``: root-mean-square normalisation, the starting point of your norm. ``[..., dim] -> [..., dim]``.

    y = x / sqrt(mean(x ** 2) + eps) * weight

Contract of a norm (modkit.core.interfaces): ``forward(x) -> Tensor`` with the shape and dtype of ``x``; statistics in
float32 whatever the input dtype, result cast back. A norm acts on ``d_model`` except where the model asks for
another width (a per-head QK-norm acts on ``head_dim``): the factory reads ``ctx.dim`` when it is set.

Replace the math, the fields and the reference with yours; keep ``param_count`` exact (the kit compares it with
the built module).

Reference: Zhang & Sennrich 2019, Root Mean Square Layer Normalization, arXiv:1910.07467.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, Init


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Unknown keys are errors; every field has a description (docs and ``modkit show``)."""

    type: Literal["$type"] = "$type"
    eps: float = Field(1e-6, gt=0, description="added to the mean square before the square root")


class $Class(nn.Module):
    """``forward(x [..., dim]) -> [..., dim]`` in the dtype of ``x``. Parameter: ``weight [dim]``."""

    # What each parameter is (modkit.core.roles: hidden, embedding, norm_gain, bias, vector, ...): optimizers, weight
    # decay and muP read roles, never names. nn.Linear children need none (weight: hidden, bias: bias).
    param_roles = {"weight": "norm_gain"}

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.dim, self.eps = dim, eps
        # Shapes only: modkit builds on the meta device first and fills every value in init_weights.
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise over the last dimension in float32; return the input dtype."""
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)

    def init_weights(self, init: Init) -> None:
        """weight = 1. Every direct parameter and buffer must go through ``init`` (seeded, device-independent)."""
        init.ones_(self.weight)


def _dim(ctx: BuildContext) -> int:
    return ctx.dim if ctx.dim is not None else ctx.d_model


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext) -> nn.Module``."""
    return $Class(_dim(ctx), cfg.eps)


def param_count(cfg: ${Class}Config, ctx: BuildContext) -> int:
    """Exact number of parameters: ``dim``."""
    return _dim(ctx)


COMPONENT = Component(
    kind="norm",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="Root-mean-square normalisation over the last dimension, statistics in float32, scaled by a "
    "learned weight. [batch, seq, dim] -> [batch, seq, dim].",
    reference="Zhang & Sennrich 2019, Root Mean Square Layer Normalization, arXiv:1910.07467",
    capabilities={"compile_safe": True},
    param_count=param_count,
    example={"type": "$type", "eps": 1e-6},
)
'''

FFN = '''\
"""``ffn/$type``: a two-layer MLP, the starting point of your FFN. ``[batch, seq, d_model] -> [batch, seq, d_model]``.

    y = down(gelu(up(x)))

Contract of an ffn (modkit.core.interfaces): ``forward(x) -> Tensor`` of the shape of ``x``. An ffn that returns an
auxiliary loss returns ``(y, aux_loss)`` instead and declares the ``aux_loss`` capability.

Replace the math, the fields and the reference with yours; keep ``param_count`` exact (the kit compares it with
the built module).

Reference: Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762; GELU, Hendrycks & Gimpel 2016,
arXiv:1606.08415.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import BuildContext, Component, ComponentConfig, FFNWidth


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Strict like every spec object: unknown keys are errors, JSON types are not coerced, floats
    must be finite; sizes use the bounded types of ``modkit.core.limits``. Every field has a description (docs and
    ``modkit show``)."""

    type: Literal["$type"] = "$type"
    d_ff: FFNWidth = Field(..., description="hidden width")
    bias: bool = Field(False, description="biases on both projections")


class $Class(nn.Module):
    """``forward(x [batch, seq, d_model]) -> [batch, seq, d_model]``.

    ``nn.Linear`` children need no ``init_weights``: modkit gives them N(0, init_std) weights and zero biases.
    """

    def __init__(self, d_model: int, d_ff: int, bias: bool):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """``down(gelu(up(x)))``."""
        return self.down(nn.functional.gelu(self.up(x)))


def _d_model(ctx: BuildContext) -> int:
    return ctx.dim if ctx.dim is not None else ctx.d_model


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext) -> nn.Module``."""
    return $Class(_d_model(ctx), cfg.d_ff, cfg.bias)


def param_count(cfg: ${Class}Config, ctx: BuildContext) -> int:
    """Exact number of parameters: ``2 * d_model * d_ff`` (+ ``d_ff + d_model`` with biases)."""
    d = _d_model(ctx)
    return 2 * d * cfg.d_ff + (cfg.d_ff + d if cfg.bias else 0)


COMPONENT = Component(
    kind="ffn",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="Two-layer position-wise MLP down(gelu(up(x))). [batch, seq, d_model] -> [batch, seq, d_model].",
    reference="Vaswani et al. 2017, Attention Is All You Need, arXiv:1706.03762",
    capabilities={"compile_safe": True, "tp_plan": {"up": "colwise", "down": "rowwise"}},
    param_count=param_count,
    example={"type": "$type", "d_ff": 128},
)
'''

ATTENTION = '''\
"""``attention/$type``: causal grouped-query attention, the starting point of your attention.

``forward(x [batch, seq, d_model], inputs: AttentionInputs) -> [batch, seq, d_model]``.

Contract of an attention module (modkit.core.interfaces):

* declare what the cache keeps for it with ``cache_spec() -> modkit.CacheSpec`` (here keys and values of
  ``n_kv_heads`` heads, never ``n_heads``; any named per-token entries, or fixed-size per-sequence state, work the
  same way), and the per-head width its position scheme acts on with the config's ``position_geometry(ctx)``;
  every cache byte figure (``modkit build``, ``modkit cost``, ``generate``) comes from the declaration;
* let the layer's position scheme act: ``inputs.position.rotate(q, k, positions)`` on
  ``q [batch, n_heads, seq, head_dim]``, ``k [batch, n_kv_heads, seq, head_dim]``, and its additive bias (ALiBi);
* with ``inputs.cache`` set, store the new keys/values and attend over every key the cache hands back
  (``update_cache(inputs, k, v, mixer=self)``; ``update_cache_entries`` for entries of other names);
* mask by absolute position (bottom-right aligned in cached decode), hide padding keys, and output 0, not NaN, for a
  query that sees no key at all.

Everything but the projections and the score function comes from modkit's attention helpers
(``modkit.nn.attention``): ``update_cache`` (the cache update), ``prepare_mask`` (the mask from positions, token mask
and window, with the dead-row guard), ``position_bias`` and ``masked_attention`` (or ``masked_softmax`` for a score
function of your own). Keep them: copied mask code is where causality leaks and NaN rows come from.

Reference: Ainslie et al. 2023, GQA: Training Generalized Multi-Query Transformer Models, arXiv:2305.13245;
Vaswani et al. 2017, arXiv:1706.03762.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    CacheSpec,
    Component,
    ComponentConfig,
    HeadCount,
    HeadDim,
    PositionGeometry,
    masked_attention,
    position_bias,
    prepare_mask,
    update_cache,
)


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Strict like every spec object: unknown keys are errors, JSON types are not coerced, floats
    must be finite; sizes use the bounded types of ``modkit.core.limits``. Every field has a description (docs and
    ``modkit show``)."""

    type: Literal["$type"] = "$type"
    n_heads: HeadCount = Field(..., description="number of query heads")
    n_kv_heads: Optional[HeadCount] = Field(
        None, description="number of key/value heads; must divide n_heads; default n_heads"
    )
    head_dim: Optional[HeadDim] = Field(None, description="width of one head; default d_model / n_heads")

    @model_validator(mode="after")
    def _kv_heads_divide(self) -> "${Class}Config":
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_kv_heads = {self.kv_heads} does not divide n_heads = {self.n_heads}")
        return self

    @property
    def kv_heads(self) -> int:
        """The effective number of key/value heads."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    def position_geometry(self, ctx) -> PositionGeometry:
        """What the layer's position scheme acts on (checked at spec time, and how it is built): every head, whole."""
        head_dim = self.head_dim if self.head_dim is not None else ctx.d_model // self.n_heads
        return PositionGeometry(self.n_heads, head_dim, self.kv_heads)

    def check(self, ctx) -> list[tuple[str, str]]:
        """Cross-field check against the model (called while a spec validates): ``(field, message)`` pairs."""
        if self.head_dim is None and ctx.d_model % self.n_heads:
            return [("n_heads", f"d_model = {ctx.d_model} is not divisible by n_heads = {self.n_heads}; set head_dim")]
        return []


class $Class(nn.Module):
    """Causal GQA over ``scaled_dot_product_attention``. ``[batch, seq, d_model] -> [batch, seq, d_model]``."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int, head_dim: int):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(d_model, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * head_dim, d_model, bias=False)

    def cache_spec(self) -> CacheSpec:
        """What the cache keeps per token: keys and values ``[batch, n_kv_heads, slots, head_dim]`` each."""
        return CacheSpec.kv(self.n_kv_heads, self.head_dim)

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """Attend causally; updates ``inputs.cache`` when one is given."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)  # [b, n_heads, s, hd]
        k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [b, n_kv_heads, s, hd]
        v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if inputs.position is not None:  # RoPE rotates q and k (an identity for other schemes)
            q, k = inputs.position.rotate(q, k, inputs.positions)
        k, v, k_pos, k_valid = update_cache(inputs, k, v, mixer=self)  # store the new keys; every key the queries may see
        mask = prepare_mask(inputs, k_pos, k_valid, q.dtype, causal=True, window=None, mixer=self)
        bias = position_bias(inputs, k_pos, self.n_heads)  # ALiBi's [b, n_heads, q_len, kv_len] bias, or None
        out, _ = masked_attention(q, k, v, mask, bias)  # softmax(q·k / sqrt(head_dim) + bias) v; dead rows -> 0
        # a score function of your own instead of q·k (import masked_softmax from modkit.plugin):
        #     probs = masked_softmax(my_scores(q, k) + (0 if bias is None else bias), mask)  # dead rows -> 0
        #     out = probs.to(v.dtype) @ v.repeat_interleave(self.n_heads // self.n_kv_heads, dim=1)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


def _head_dim(cfg: ${Class}Config, ctx: BuildContext) -> int:
    return cfg.head_dim if cfg.head_dim is not None else ctx.d_model // cfg.n_heads


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext) -> nn.Module``."""
    return $Class(ctx.d_model, cfg.n_heads, cfg.kv_heads, _head_dim(cfg, ctx))


def param_count(cfg: ${Class}Config, ctx: BuildContext) -> int:
    """Exact number of parameters: q and o are ``d_model x n_heads*head_dim``, k and v ``d_model x n_kv_heads*head_dim``."""
    hd = _head_dim(cfg, ctx)
    return 2 * ctx.d_model * cfg.n_heads * hd + 2 * ctx.d_model * cfg.kv_heads * hd


COMPONENT = Component(
    kind="attention",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="Causal grouped-query attention over scaled_dot_product_attention with a KV cache. "
    "[batch, seq, d_model] -> [batch, seq, d_model]; the cache holds [batch, n_kv_heads, seq, head_dim].",
    reference="Ainslie et al. 2023, GQA, arXiv:2305.13245",
    capabilities={
        "causal_safe": True,
        "kv_cache": True,
        "compile_safe": True,
        "tp_plan": {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise"},
    },
    param_count=param_count,
    example={"type": "$type", "n_heads": 4, "n_kv_heads": 2},
)
'''

POSITION = '''\
"""``position/$type``: no position information (NoPE), the starting point of your position scheme.

A position scheme is a ``modkit.PositionScheme`` with three hooks; override those where your scheme acts, keep
the others as identities, and say where it acts with the ``acts_on`` capability:

* ``embed(x [batch, seq, d_model], positions [batch, seq]) -> x``: ``acts_on = "embedding"`` (sinusoidal, learned);
* ``rotate(q [batch, n_heads, seq, head_dim], k [batch, n_kv_heads, seq, head_dim], positions) -> (q, k)``:
  ``acts_on = "qk"`` (RoPE);
* ``attention_bias(q_positions [batch, q_len], k_positions [batch, kv_len], n_heads) -> [batch, n_heads, q_len,
  kv_len]`` float32, or ``None``: ``acts_on = "bias"`` (ALiBi).

The factory sees ``ctx.n_heads`` and ``ctx.head_dim`` of the attention it serves. Buffers (frequency tables)
are filled in ``init_weights(init)`` so a ``meta`` build is correct after materialisation.

Reference: Kazemnejad et al. 2023, The Impact of Positional Encoding on Length Generalization in Transformers,
arXiv:2305.19466.
"""

from __future__ import annotations

from typing import Literal, Optional

from torch import Tensor

from modkit.plugin import BuildContext, Component, ComponentConfig, PositionScheme


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Unknown keys are errors; add described ``Field``s for your scheme's settings."""

    type: Literal["$type"] = "$type"


class $Class(PositionScheme):
    """Identity everywhere: the causal mask alone breaks the permutation symmetry (NoPE)."""

    def embed(self, x: Tensor, positions: Tensor) -> Tensor:
        """Token embeddings ``x [batch, seq, d_model]`` unchanged."""
        return x

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys unchanged."""
        return q, k

    def attention_bias(self, q_positions: Tensor, k_positions: Tensor, n_heads: int) -> Optional[Tensor]:
        """No bias."""
        return None


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext) -> PositionScheme``."""
    return $Class()


def param_count(cfg: ${Class}Config, ctx: BuildContext) -> int:
    """Exact number of parameters: none."""
    return 0


COMPONENT = Component(
    kind="position",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="No explicit position information (NoPE): embeddings, queries and keys pass unchanged, no "
    "attention bias. Acts nowhere.",
    reference="Kazemnejad et al. 2023, arXiv:2305.19466",
    capabilities={"acts_on": "none", "compile_safe": True, "stateless": True},
    param_count=param_count,
    example={"type": "$type"},
)
'''

PLACEMENT = '''\
"""``placement/$type``: a pre-norm residual block, the starting point of your placement.

    x = x + attention(attn_norm(x), inputs)
    x = x + ffn(ffn_norm(x))

Contract of a placement (modkit.core.interfaces): its factory gets the built sublayers in ``ctx.attention`` and
``ctx.ffn`` and the block's norm config in ``ctx.norm`` (build each norm it needs with ``ctx.build(ctx.norm)``),
and returns a module with ``forward(x [batch, seq, d_model], inputs) -> (x, aux_loss or None)``. Call the ffn
through ``modkit.run_ffn`` so MoE layers get the padding mask and their aux loss is passed on.

Reference: Xiong et al. 2020, On Layer Normalization in the Transformer Architecture, arXiv:2002.04745.
"""

from __future__ import annotations

from typing import Literal, Optional

from torch import Tensor, nn

from modkit.plugin import AttentionInputs, BuildContext, Component, ComponentConfig, run_ffn


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Unknown keys are errors; add described ``Field``s for your placement's settings."""

    type: Literal["$type"] = "$type"


class $Class(nn.Module):
    """Pre-norm block. ``forward(x [batch, seq, d_model], inputs) -> ([batch, seq, d_model], aux_loss or None)``."""

    def __init__(self, ctx: BuildContext):
        super().__init__()
        self.attn_norm = ctx.build(ctx.norm)
        self.attention = ctx.attention
        self.ffn_norm = ctx.build(ctx.norm)
        self.ffn = ctx.ffn

    def forward(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Optional[Tensor]]:
        """Two residual steps; returns the ffn's aux loss (MoE) or ``None``."""
        x = x + self.attention(self.attn_norm(x), inputs)
        h, aux = run_ffn(self.ffn, self.ffn_norm(x), inputs)
        return x + h, aux


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext with attention, ffn and norm) -> block module``."""
    return $Class(ctx)


COMPONENT = Component(
    kind="placement",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="Pre-norm residual block: x + attn(norm(x)), then x + ffn(norm(x)); two norms per block. "
    "[batch, seq, d_model] -> [batch, seq, d_model].",
    reference="Xiong et al. 2020, arXiv:2002.04745",
    capabilities={"compile_safe": True},
    example={"type": "$type"},
)
'''

COMPONENT_TEMPLATES = {
    "norm": NORM,
    "ffn": FFN,
    "attention": ATTENTION,
    "mixer": MIXER,
    "position": POSITION,
    "placement": PLACEMENT,
}

#: the spec snippet of the README per kind (``$usage``)
USAGE = {
    "norm": '"block": {..., "norm": {"type": "$type"}}',
    "ffn": '"block": {..., "ffn": {"type": "$type", "d_ff": 128}}',
    "attention": '"block": {..., "attention": {"type": "$type", "n_heads": 4, "n_kv_heads": 2}}',
    "mixer": '"block": {..., "mixer": {"type": "$type", "expand": 2}}',
    "position": '"position": {"type": "$type"}',
    "placement": '"block": {..., "placement": {"type": "$type"}}',
}
