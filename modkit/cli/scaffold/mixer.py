"""The component module of the ``mixer`` skeleton (``modkit new plugin NAME --kind mixer``): a recurrent token
mixer whose state lives only in the cache it declares, as a :class:`string.Template` text (placeholders as in
:mod:`modkit.cli.scaffold.components`). It passes the contract kit as written and decodes from its declared state.
"""

MIXER = '''\
"""``mixer/$type``: a recurrent token mixer with its state in the cache, the starting point of your mixer.

``forward(x [batch, seq, d_model], inputs: AttentionInputs) -> [batch, seq, d_model]``, per channel ``c`` of
``d_inner`` with a learned decay ``a_c = sigmoid(decay_logit_c)`` in ``(0, 1)``:

    u_t = W_in x_t,    h_t = a ⊙ h_{t-1} + (1 - a) ⊙ u_t,    y_t = W_out (h_t ⊙ silu(W_g x_t))

Contract of a token mixer (modkit.core.interfaces, kind ``mixer``; an attention is the other kind of token mixer):

* ``forward(x, inputs)`` in the block's ``mixer`` slot (``"block": {"mixer": {...}}``, ``overrides[].mixer``), causal:
  position ``t`` reads positions ``<= t`` only;
* the state kept between forwards lives in the cache and nowhere else: declare it with ``cache_spec()``
  (``growth="sequence"`` entries: a fixed size per sequence; ``growth="token"`` entries grow with the context),
  find it with ``inputs.cache_for(self)`` (``None`` without a cache), read ``state[name]`` and write it back with
  ``state.write(name, value)``. Never keep it on the module (``self.h = ...``): a cache reset, a copied cache or a
  batch of other sequences would then see stale numbers;
* padding tokens (``inputs.token_mask`` False) change no state, so left padding is exact;
* declare what the module does not do: the config's ``position_geometry`` returns ``None`` (no queries and keys for
  a rotary or bias position scheme to act on), and there is no ``document_mask`` capability until the state
  restarts at each document boundary (``inputs.documents``);
* ``param_roles`` gives every parameter the module owns directly a role (``nn.Linear`` children need none); ``flops``
  declares the matrix-product FLOPs of one call: they do not grow with the context here (``modkit cost`` reads that:
  a mixer whose FLOPs per token are constant never overtakes the FFN).

The loop over the sequence is the recurrence itself, exact and slow: replace it with a chunked or parallel form
(``modkit.nn.recurrent`` holds the short causal convolution, padding helpers and a gated RMSNorm) once the kit is
green, and check both forms give the same numbers.

Reference: Orvieto et al. 2023, Resurrecting Recurrent Neural Networks for Long Sequences (a diagonal linear
recurrence), arXiv:2303.06349; Gu & Dao 2023, Mamba, arXiv:2312.00752 (the gate).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    Init,
    Workload,
    padding_mask,
)


class ${Class}Config(ComponentConfig):
    """Config of ``$type``. Strict like every spec object: unknown keys are errors, JSON types are not coerced, floats
    must be finite. Every field has a description (docs and ``modkit show``)."""

    type: Literal["$type"] = "$type"
    expand: int = Field(2, ge=1, le=16, description="d_inner = expand * d_model channels of state")
    decay_min: float = Field(0.9, gt=0, lt=1, description="smallest initial per-channel decay a")
    decay_max: float = Field(0.999, gt=0, lt=1, description="largest initial per-channel decay a")

    def position_geometry(self, ctx) -> None:
        """No queries or keys: a rotary or bias position scheme does not act here."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """Cross-field check (called while a spec validates): ``(field, message)`` pairs."""
        if self.decay_min > self.decay_max:
            return [("decay_min", f"decay_min = {self.decay_min} exceeds decay_max = {self.decay_max}")]
        return []


class $Class(nn.Module):
    """``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``; the cache holds ``h [batch,
    d_inner]`` (float32) per sequence."""

    # What each parameter the module owns directly is (modkit.core.roles): optimizers, weight decay and muP read
    # roles, never names. A per-channel vector is "vector" (no width multiplier, no weight decay).
    param_roles = {"decay_logit": "vector"}

    def __init__(self, d_model: int, d_inner: int, decay: tuple[float, float]):
        super().__init__()
        self.d_inner, self.decay = d_inner, decay
        self.in_proj = nn.Linear(d_model, d_inner, bias=False)
        self.g_proj = nn.Linear(d_model, d_inner, bias=False)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        # Shapes only: modkit builds on the meta device first and fills every value in init_weights.
        self.decay_logit = nn.Parameter(torch.empty(d_inner))

    def cache_spec(self) -> CacheSpec:
        """The state per sequence: ``h [d_inner]`` in float32, whatever the context length."""
        return CacheSpec((CacheEntry("h", (self.d_inner,), growth="sequence", dtype=torch.float32),))

    def init_weights(self, init: Init) -> None:
        """Decays log-spaced in ``[decay_min, decay_max]``, stored as logits. Every direct parameter goes through
        ``init``; the ``nn.Linear`` children get modkit's N(0, init_std)."""
        lo, hi = self.decay
        a = torch.exp(torch.linspace(math.log(lo), math.log(hi), self.d_inner))
        init.copy_(self.decay_logit, torch.log(a) - torch.log1p(-a))  # sigmoid^-1

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """Run the recurrence over ``x``, from the cached state when ``inputs`` carries a cache, and store the last."""
        b, s, _ = x.shape
        state = inputs.cache_for(self)  # this layer's entries, or None without a cache
        real = padding_mask(inputs.token_mask, torch.float32)  # [b, s, 1], 1 real / 0 padding, or None
        real = real if real is not None else x.new_ones(b, s, 1, dtype=torch.float32)
        a = torch.sigmoid(self.decay_logit.float())  # [d_inner]
        keep = 1 - (1 - a) * real  # padding: keep the state as it is (a -> 1) ...
        write = (1 - a) * real  # ... and write nothing
        u = self.in_proj(x).float()
        h = state["h"] if state is not None else u.new_zeros(b, self.d_inner)
        hs = []
        for t in range(s):  # the recurrence; a chunked or parallel form computes the same numbers faster
            h = keep[:, t] * h + write[:, t] * u[:, t]
            hs.append(h)
        if state is not None:
            state.write("h", h)  # the only place the state is kept
        y = torch.stack(hs, dim=1) * nn.functional.silu(self.g_proj(x).float())
        return self.out_proj(y.to(x.dtype))


def _d_inner(cfg: ${Class}Config, ctx: BuildContext) -> int:
    return cfg.expand * ctx.d_model


def build_$ident(cfg: ${Class}Config, ctx: BuildContext) -> $Class:
    """Factory: ``(validated config, BuildContext) -> nn.Module``."""
    return $Class(ctx.d_model, _d_inner(cfg, ctx), (cfg.decay_min, cfg.decay_max))


def param_count(cfg: ${Class}Config, ctx: BuildContext) -> int:
    """Exact number of parameters: three ``d_model x d_inner`` projections and ``d_inner`` decays."""
    return 3 * ctx.d_model * _d_inner(cfg, ctx) + _d_inner(cfg, ctx)


def flops(cfg: ${Class}Config, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (1 multiply-add = 2 FLOPs): the three projections on every token; the
    recurrence and the gate are element-wise. Constant per token: the cached context does not enter."""
    per = 2 * work.tokens * ctx.d_model * _d_inner(cfg, ctx)
    return {"in_proj": per, "g_proj": per, "out_proj": per}


COMPONENT = Component(
    kind="mixer",
    type="$type",
    config=${Class}Config,
    factory=build_$ident,
    description="Gated diagonal linear recurrence h_t = a*h_(t-1) + (1-a)*W_in x_t per channel, output "
    "W_out(h_t * silu(W_g x_t)); the cache holds a fixed-size state h [d_inner] per sequence. "
    "[batch, seq, d_model] -> [batch, seq, d_model].",
    reference="Orvieto et al. 2023, Resurrecting Recurrent Neural Networks for Long Sequences, arXiv:2303.06349",
    capabilities={"causal_safe": True, "kv_cache": True},
    param_count=param_count,
    flops=flops,
    example={"type": "$type", "expand": 2},
)
'''
