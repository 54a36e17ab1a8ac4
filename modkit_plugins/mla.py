"""Multi-head latent attention (``mla``): DeepSeek-V2/V3's attention, whose cache holds a compressed latent.

Shapes (``h`` = n_heads, ``d_nope`` = qk_nope_head_dim, ``d_rope`` = qk_rope_head_dim, ``d_v`` = v_head_dim,
``r_kv`` = kv_lora_rank, ``r_q`` = q_lora_rank, ``d_qk = d_nope + d_rope``)::

    x [b, s, d_model]
    q      = q_proj(x)                                   (q_lora_rank null: one d_model -> h·d_qk projection)
           = q_b_proj(q_a_layernorm(q_a_proj(x)))        (low-rank: d_model -> r_q -> h·d_qk)   -> [b, h, s, d_qk]
    q_nope, q_rope = q[..., :d_nope], q[..., d_nope:]
    c, k_rope = kv_a_proj_with_mqa(x)                   d_model -> r_kv + d_rope, split
    c      = kv_a_layernorm(c)                          the normalised latent       [b, s, r_kv]
    q_rope, k_rope = position.rotate(q_rope, k_rope)    RoPE on d_rope features; k_rope is one head shared by all
    cache  <- [c; k_rope] [b, slots, r_kv + d_rope]: r_kv + d_rope numbers per token and layer, side by side
    k_nope, v = kv_b_proj(c) split per head             r_kv -> h·(d_nope + d_v)   (W_UK [h, d_nope, r_kv], W_UV [h, d_v, r_kv])
    score_hij = α (q_nope_hi · k_nope_hj + q_rope_hi · k_rope_j),   o_hi = Σ_j softmax_j(score_hij) v_hj
    o_h    = o_h · sigmoid(g_proj(x))_h                 head_gate only: one gate per head and token (Ling 3)
    out    = o_proj(o)                                  h·d_v -> d_model

Two ways to compute the same scores (arXiv:2405.04434 §2.1.2, "absorbed" weights):

* **expanded** (a forward whose cache is empty, or no cache: prefill and training): ``kv_b_proj`` rebuilds per-head
  keys and values of every token, then ordinary attention over ``d_qk``-wide keys and ``d_v``-wide values;
* **absorbed** (a forward over a cache that holds earlier tokens: decoding): ``q_nope · k_nope_j = (W_UKᵀ q_nope) ·
  c_j``, so each query is mapped into the latent once (``q_lat = W_UKᵀ q_nope``, ``[b, h, s, r_kv]``) and scores are
  ``α (q_lat · c_j + q_rope · k_rope_j)`` straight against the cached latent, and ``o_h = W_UV (Σ_j p_hj c_j)``: the
  value up-projection after the weighted sum. A decode step never rebuilds per-head keys for the context; it reads
  ``r_kv + d_rope`` numbers per cached token, shared by every head (an MQA-shaped read of the latent).

LongCat-Flash (``lora_scale``; transformers ``LongcatFlashMLA``) multiplies the queries by ``sqrt(d_model / r_q)``
and the normalised latent, before it is cached, by ``sqrt(d_model / r_kv)``.

Softmax scale ``α = d_qk^{-1/2}``, times ``mscale²`` with DeepSeek's YaRN correction (``yarn_mscale``: ``mscale =
0.1 · mscale_all_dim · ln(factor) + 1`` for ``factor > 1``, transformers ``yarn_get_mscale``), or ``softmax_scale``;
under μP (spec ``parametrization``) ``d_qk^{-1/2}`` becomes μP's ``sqrt(base_d_qk) / d_qk``.

Parameter roles (:mod:`modkit.core.roles`): every projection is an ``nn.Linear``, so ``hidden`` (the latent down- and
up-projections too: they map between hidden widths, and the ladder scales ``kv_lora_rank`` / ``q_lora_rank`` with
``d_model``) and ``bias``; the latent norms declare their own gains. Nothing to declare here.
The rotated key uses the layer's position scheme at the width this attention declares (``qk_rope_head_dim``,
``PositionGeometry``): DeepSeek-V3's checkpoints store the rope features as interleaved pairs, which is the rope
``layout: "interleaved"`` (transformers' ``rope_interleave``); the half-split layout is ``"half_split"``.

Tensor parallelism: heads are sharded (``q_proj`` / ``q_b_proj`` and ``kv_b_proj`` colwise by head, ``o_proj``
rowwise); the latent projections and norms read the replicated input and are replicated, so every rank holds
the whole (small) latent cache, as DeepSeek's inference does. The rotated key reaches the local heads without a
sharded projection, so its gradient is summed over the ranks (``modkit.parallel.shared_by_heads``); the latent's is
summed by ``kv_b_proj``'s colwise style.

References: DeepSeek-AI 2024, DeepSeek-V2 (arXiv:2405.04434) §2.1; DeepSeek-V3 (arXiv:2412.19437) §2.1.1; the
transformers ``DeepseekV3Attention`` (``modeling_deepseek_v3.py``) for the layout, the mscale and the interleave;
transformers ``BailingHybridAttention`` (``modeling_bailing_hybrid.py``, Ling 3) for ``head_gate``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal, NamedTuple, Optional

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from modkit.plugin import (
    AttentionInputs,
    BuildContext,
    CacheEntry,
    CacheSpec,
    Component,
    ComponentConfig,
    HeadCount,
    HeadDim,
    hookimpl,
    is_plain_causal,
    latent_scores,
    latent_sum,
    masked_attention,
    MAX_MSCALE,
    MAX_MULTIPLIER,
    MAX_ROPE_FACTOR,
    MIN_SOFTMAX_SCALE,
    SoftmaxScale,
    position_bias,
    PositionGeometry,
    PreparedMask,
    prepare_mask,
    RopeFactor,
    shared_by_heads,
    Slot,
    StrictModel,
    update_cache_entries,
    Workload,
)


#: dtypes the softmax runs in as they are (narrower ones are widened to float32 first)
_WIDE = (torch.float32, torch.float64)


class YarnMscale(StrictModel):
    """DeepSeek's YaRN softmax-scale correction (the ``factor`` and ``mscale_all_dim`` of its rope scaling)."""

    factor: RopeFactor = Field(
        ...,
        description="the YaRN context-extension factor of the rope scaling (DeepSeek-V3: 40); at most "
        f"{MAX_ROPE_FACTOR:g}, far above published factors, so mscale stays small",
    )
    mscale_all_dim: float = Field(
        ...,
        ge=0,
        le=MAX_MSCALE,
        description="mscale_all_dim of the rope scaling; mscale = 0.1 · mscale_all_dim · ln(factor) + 1, "
        f"the softmax scale is multiplied by mscale² (0: no correction). At most {MAX_MSCALE:g} (DeepSeek: "
        "0.707-1), which keeps mscale² below about 10^4",
    )


class MLAConfig(ComponentConfig):
    """Config of ``mla`` (multi-head latent attention)."""

    type: Literal["mla"] = "mla"
    n_heads: HeadCount = Field(..., description="number of query heads (every head reads the shared latent)")
    q_lora_rank: Optional[HeadDim] = Field(
        None,
        description="rank of the low-rank query projection (DeepSeek-V3: 1536); null: a full d_model -> "
        "n_heads · (qk_nope_head_dim + qk_rope_head_dim) projection (DeepSeek-V2-Lite)",
    )
    kv_lora_rank: HeadDim = Field(
        ..., description="width of the compressed key/value latent that is cached (DeepSeek-V3: 512)"
    )
    qk_nope_head_dim: HeadDim = Field(
        ..., description="per-head query/key features without position (DeepSeek-V3: 128)"
    )
    qk_rope_head_dim: HeadDim = Field(
        ...,
        description="per-head query features, and features of the one key shared by all heads, that the position "
        "scheme rotates (DeepSeek-V3: 64); cached per token beside the latent",
    )
    v_head_dim: HeadDim = Field(..., description="per-head value width (DeepSeek-V3: 128)")
    latent_norm: ComponentConfig = Slot(
        "norm",
        description="norm of the latents (kv_a_layernorm, and q_a_layernorm with q_lora_rank), e.g. "
        '{"type": "rmsnorm", "eps": 1e-6}',
    )
    bias: bool = Field(
        False, description="biases on q_a_proj, kv_a_proj_with_mqa and o_proj (DeepSeek's attention_bias)"
    )
    softmax_scale: Optional[SoftmaxScale] = Field(
        None,
        description="multiplier of the scores; default (qk_nope_head_dim + qk_rope_head_dim)^-1/2, times mscale² "
        f"with yarn_mscale. Between {MIN_SOFTMAX_SCALE:g} and {MAX_MULTIPLIER:g}: published models use values "
        "between 1e-3 and 1; a smaller scale underflows the scores (1e-300 made the logits non-finite)",
    )
    yarn_mscale: Optional[YarnMscale] = Field(
        None,
        description="DeepSeek's YaRN softmax-scale correction {factor, mscale_all_dim} (copy them from the rope "
        "scaling); null for none",
    )
    head_gate: bool = Field(
        False,
        description="each head's output times sigmoid(g_proj(x)), one gate per head and token from a bias-free "
        "g_proj [n_heads, d_model], before o_proj (Ling 3's BailingHybridAttention); default off (DeepSeek)",
    )
    lora_scale: bool = Field(
        False,
        description="LongCat-Flash's latent scaling: the queries times sqrt(d_model / q_lora_rank) and the "
        "normalised (cached) latent times sqrt(d_model / kv_lora_rank) (mla_scale_q_lora, mla_scale_kv_lora); "
        "needs q_lora_rank. false: none (DeepSeek)",
    )

    @model_validator(mode="after")
    def _check_lora_scale(self) -> "MLAConfig":
        if self.lora_scale and self.q_lora_rank is None:
            raise ValueError(
                "lora_scale = true multiplies the queries by sqrt(d_model / q_lora_rank), but q_lora_rank is null; "
                "give q_lora_rank or set lora_scale false"
            )
        return self

    @property
    def qk_head_dim(self) -> int:
        """``qk_nope_head_dim + qk_rope_head_dim``: the width of one query (and expanded key) head in the scores."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def resolved_scale(self, base: Optional[float] = None) -> float:
        """The softmax scale: ``softmax_scale``, else ``base · mscale²`` (transformers ``yarn_apply_mscale``).

        ``base`` defaults to ``qk_head_dim^-1/2``; the module passes :meth:`BuildContext.attention_scale`'s, which is
        that under standard parametrization and μP's ``sqrt(base_head_dim) / qk_head_dim`` under μP.
        """
        if self.softmax_scale is not None:
            return float(self.softmax_scale)
        scale = self.qk_head_dim**-0.5 if base is None else base
        m = self.yarn_mscale
        if m is not None and m.mscale_all_dim and m.factor > 1:
            mscale = 0.1 * m.mscale_all_dim * math.log(m.factor) + 1.0
            scale = scale * mscale * mscale
        return scale

    def position_geometry(self, ctx) -> PositionGeometry:
        """The position scheme acts on the ``qk_rope_head_dim`` part: ``n_heads`` query heads, one shared key."""
        return PositionGeometry(self.n_heads, self.qk_rope_head_dim, 1)


class _Projected(NamedTuple):
    """The tensors MLA's scores are computed from (the queries of this call, the keys of every cached position)."""

    q_nope: Tensor  # [b, h, s, d_nope]: the un-rotated query features
    q_rope: Tensor  # [b, h, s, d_rope]: the rotated query features
    ckv: Tensor  # [b, kv, r_kv + d_rope]: per key position (cached and new), the normalised latent, then the rotated
    # key shared by every head


class _KeyMask(NamedTuple):
    """Where the keys sit and what masks or biases their scores (:func:`prepare_mask`, :func:`position_bias`)."""

    inputs: Any  # the layer's AttentionInputs
    k_pos: Tensor  # [b, kv] the key positions
    k_valid: Optional[Tensor]  # [b, kv] which key slots hold a token (None: all)
    bias: Optional[Tensor]  # [b, h, s, kv] float32 position bias (ALiBi), or None
    dropout_p: float  # attention dropout probability of this call
    selected: Optional[Tensor] = None  # [b, 1, s, kv] bool: the keys a sparse attention kept (mask included), or None


class MLA(nn.Module):
    """Multi-head latent attention. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    The cache holds ``latent [batch, slots, kv_lora_rank + qk_rope_head_dim]``: the latent, then the rotated key
    (:meth:`cache_spec`). ``absorb`` (default True) selects the absorbed computation for forwards over a cache that
    holds earlier tokens; False expands per-head keys there too (the same numbers; a reference for tests).
    """

    #: read as the per-head matrices ``W_UK`` / ``W_UV`` (:meth:`_kv_b`): decoding keeps it row-major
    matrix_weights = ("kv_b_proj.weight",)

    def __init__(self, cfg: MLAConfig, ctx: BuildContext):
        super().__init__()
        d, h = ctx.d_model, cfg.n_heads
        self.n_heads = h
        self.q_lora_rank, self.kv_lora_rank = cfg.q_lora_rank, cfg.kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = (
            cfg.qk_nope_head_dim,
            cfg.qk_rope_head_dim,
            cfg.v_head_dim,
        )
        self.qk_head_dim = cfg.qk_head_dim
        # qk_head_dim^-1/2 (times mscale²) under standard parametrization; muP's 1/head_dim form under muP
        self.scale = cfg.resolved_scale(ctx.attention_scale(self.qk_head_dim, standard=self.qk_head_dim**-0.5))
        self.attention_dropout = ctx.attention_dropout
        self.absorb = True
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(d, h * self.qk_head_dim, bias=False)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(d, cfg.q_lora_rank, bias=cfg.bias)
            self.q_a_layernorm = ctx.build(cfg.latent_norm, dim=cfg.q_lora_rank)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * self.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=cfg.bias)
        self.kv_a_layernorm = ctx.build(cfg.latent_norm, dim=cfg.kv_lora_rank)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, h * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(h * cfg.v_head_dim, d, bias=cfg.bias)
        self.g_proj = nn.Linear(d, h, bias=False) if cfg.head_gate else None
        #: LongCat-Flash's multipliers of the queries and of the normalised latent (1.0: none)
        self.q_scale = (d / cfg.q_lora_rank) ** 0.5 if cfg.lora_scale else 1.0
        self.latent_scale = (d / cfg.kv_lora_rank) ** 0.5 if cfg.lora_scale else 1.0

    def cache_spec(self) -> CacheSpec:
        """One entry per token, ``latent [kv_lora_rank + qk_rope_head_dim]``: the normalised latent, then the rotated
        shared key beside it (FlashMLA's 576-wide layout), so one product scores both parts in one read."""
        return CacheSpec((CacheEntry("latent", (self.kv_lora_rank + self.qk_rope_head_dim,)),))

    def head_layout(self) -> dict[str, tuple[int, int]]:
        """The projections whose outputs split into heads (the latent ones do not)."""
        out = {"kv_b_proj": (self.n_heads, self.qk_nope_head_dim + self.v_head_dim)}
        out["q_proj" if self.q_lora_rank is None else "q_b_proj"] = (self.n_heads, self.qk_head_dim)
        if self.g_proj is not None:
            out["g_proj"] = (self.n_heads, 1)
        return out

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """Attend. ``x [batch, seq, d_model]`` → ``[batch, seq, d_model]``; stores the latent in ``inputs.cache``."""
        return self._attend(x, inputs, need_weights=False)[0]

    def forward_with_weights(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """Like :meth:`forward`, also returning the attention weights ``[batch, n_heads, q_len, kv_len]`` (float32)."""
        return self._attend(x, inputs, need_weights=True)

    def _kv_b(self) -> tuple[Tensor, Tensor]:
        """``(W_UK [h, d_nope, r_kv], W_UV [h, d_v, r_kv])``: this rank's heads of ``kv_b_proj.weight``."""
        w = self.kv_b_proj.weight
        w = w.to_local() if hasattr(w, "to_local") else w  # a tensor-parallel shard holds whole heads
        w = w.view(self.n_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, : self.qk_nope_head_dim], w[:, self.qk_nope_head_dim :]

    def _queries(self, x: Tensor) -> tuple[Tensor, Optional[Tensor]]:
        """``(q [b, s, h·d_qk], q_resid [b, s, q_lora_rank] or None)``: the queries and the normalised query latent."""
        if self.q_proj is not None:
            return self.q_proj(x), None
        q_resid = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(q_resid)
        return (q if self.q_scale == 1.0 else q * self.q_scale), q_resid

    def _index(self, x: Tensor, q_resid: Optional[Tensor], inputs: AttentionInputs) -> tuple[dict[str, Tensor], Any]:
        """``(entries, state)``: per-token cache entries of the new tokens beyond the latent and the rotated key, and
        what :meth:`_selection` needs. None here; a sparse attention (``dsa``) caches its index keys."""
        return {}, None

    def _selection(self, x: Tensor, state: Any, seen: dict, keys: _KeyMask) -> Optional[Tensor]:
        """The keys each query attends to, ``[b, 1, s, kv]`` bool (mask included), or ``None``: every key the mask
        lets through (here; a sparse attention selects some)."""
        return None

    def _attend(self, x: Tensor, inputs: AttentionInputs, need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        b, s, _ = x.shape
        h, d_nope, d_rope, r = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        q, q_resid = self._queries(x)
        q = q.view(b, s, h, self.qk_head_dim).transpose(1, 2)  # [b, h, s, d_qk]
        q_nope, q_rope = q[..., :d_nope], q[..., d_nope:]
        c, k_rope = self.kv_a_proj_with_mqa(x).split([r, d_rope], dim=-1)
        c = self.kv_a_layernorm(c)  # [b, s, r_kv]
        c = c if self.latent_scale == 1.0 else c * self.latent_scale  # LongCat-Flash: cached as scaled
        k_rope = k_rope.view(b, 1, s, d_rope)
        if inputs.position is not None:
            q_rope, k_rope = inputs.position.rotate(q_rope, k_rope, inputs.positions)
        # every rank holds the shared key whole and its local heads read it directly: sum its gradient over them
        k_rope = shared_by_heads(k_rope, self.kv_b_proj.weight)
        state = inputs.cache_for(self)
        absorbed = self.absorb and state is not None and state.group is not None and state.group.mode != "fresh"
        extra, index_state = self._index(x, q_resid, inputs)
        new = {"latent": torch.cat([c, k_rope.squeeze(1)], dim=-1), **extra}
        seen, k_pos, k_valid = update_cache_entries(inputs, new, mixer=self)
        dropout_p = self.attention_dropout if self.training else 0.0
        bias = position_bias(inputs, k_pos, h)
        t, keys = _Projected(q_nope, q_rope, seen["latent"]), _KeyMask(inputs, k_pos, k_valid, bias, dropout_p)
        keys = keys._replace(selected=self._selection(x, index_state, seen, keys))
        out, weights = self._absorbed(t, keys, need_weights) if absorbed else self._expanded(t, keys, need_weights)
        if self.g_proj is not None:  # [b, h, s, d_v] times sigmoid of one gate per head and token, in float32
            out = out * torch.sigmoid(self.g_proj(x).float()).to(out.dtype).transpose(1, 2)[..., None]
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h * self.v_head_dim)), weights

    def _prepared(self, keys: _KeyMask, dtype: torch.dtype) -> PreparedMask:
        """The mask of this call: the selection when a sparse attention made one, else :func:`prepare_mask`'s."""
        if keys.selected is not None:
            return PreparedMask.of(keys.selected, dtype)
        return prepare_mask(keys.inputs, keys.k_pos, keys.k_valid, dtype, mixer=self)

    def _expanded(self, t: _Projected, keys: _KeyMask, need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        """Per-head keys ``[b, h, kv, d_qk]`` and values ``[b, h, kv, d_v]`` from the latents, then attention:
        ``([b, h, s, d_v], weights [b, h, s, kv] float32 or None)``."""
        q_nope, q_rope, ckv = t
        inputs, k_pos, k_valid, bias, dropout_p = keys[:5]
        b, h, s, _ = q_nope.shape
        kv, r = ckv.shape[1], self.kv_lora_rank
        c_all, k_rope_all = ckv[..., :r], ckv[..., r:]  # [b, kv, r_kv], [b, kv, d_rope]
        k_nope, v = (
            self.kv_b_proj(c_all).view(b, kv, h, -1).transpose(1, 2).split([self.qk_nope_head_dim, self.v_head_dim], -1)
        )
        k = torch.cat([k_nope, k_rope_all[:, None].expand(b, h, kv, self.qk_rope_head_dim)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        simple = keys.selected is None and is_plain_causal(inputs, k_pos, k_valid, bias) and not need_weights
        if simple:  # one fresh causal sequence: SDPA's causal kernel
            out = nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout_p, scale=self.scale
            )
            return out, None
        prepared = self._prepared(keys, q.dtype)
        eager = need_weights or (bias is not None and q.dtype != torch.float32)
        return masked_attention(q, k, v, prepared, bias, self.scale, eager=eager, dropout_p=dropout_p)

    def _absorbed(self, t: _Projected, keys: _KeyMask, need_weights: bool) -> tuple[Tensor, Optional[Tensor]]:
        """Scores against the cached latent with ``W_UK`` folded into the query; ``W_UV`` after the weighted sum:
        ``([b, h, s, d_v], probabilities [b, h, s, kv] float32, or None without need_weights)``.

        Every head reads the same cached ``[latent; rotated key]`` ``[b, kv, r_kv + d_rope]``, so the heads fold
        into the rows of one product per batch row (``[b, h·s, ·]``), and the latent part of the query and the
        rotated one sit side by side, so the scores are one product that reads the cache once (FlashMLA's 576-wide
        key, DeepSeek-V3's reference ``inference/model.py`` in its ``absorb`` mode); the weighted sum reads it once
        more. No per-head key or value of the context is ever formed. The softmax scale is folded into the (small)
        query and the additive mask joins the product (:func:`_latent_product`); both products run through oneDNN
        where they can (:func:`_onednn_fits`).
        """
        q_nope, q_rope, ckv = t
        bias, dropout_p = keys.bias, keys.dropout_p
        b, h, s, _ = q_nope.shape
        kv, r = ckv.shape[1], self.kv_lora_rank
        w_uk, w_uv = self._kv_b()
        # [b, h, s, d_nope] @ [h, d_nope, r_kv] -> [b, h, s, r_kv]: W_UKᵀ q_nope; then q_rope beside it, all scaled
        q_lat = torch.cat([torch.matmul(q_nope, w_uk), q_rope], dim=-1).mul_(self.scale).view(b, h * s, -1)
        prepared = self._prepared(keys, q_nope.dtype)
        base = prepared.additive  # [b, 1, s, kv]: 0 where allowed, -inf elsewhere (dead rows opened)
        if bias is not None:  # ALiBi: added in float32 at least, as the expanded path does
            base = base.to(torch.promote_types(base.dtype, torch.float32)) + bias
        base = base.expand(b, h, s, kv).reshape(b, h * s, kv) if s > 1 or base.shape[1] > 1 else base.view(b, 1, kv)
        late = base.dtype != q_lat.dtype  # a narrow model with a bias: the mask and bias join after the product
        # α (q_lat · c_j + q_rope · k_rope_j) (+ mask): one product over the cached [latent; rotated key]
        scores = latent_scores(q_lat, ckv, None if late else base)
        # [b, h·s, kv] in float32 at least (float64 stays float64)
        scores = scores if scores.dtype in _WIDE else scores.float()
        probs = torch.softmax(scores + base if late else scores, dim=-1)
        if dropout_p > 0:
            probs = nn.functional.dropout(probs, dropout_p)
        o_lat = latent_sum(probs.to(ckv.dtype), ckv, r).view(b, h, s, r)  # Σ_j p_hj c_j
        out = torch.matmul(o_lat, w_uv.transpose(1, 2))  # [b, h, s, r_kv] @ [h, r_kv, d_v] -> [b, h, s, d_v]
        out = out * prepared.live  # rows that see no key output 0
        if not need_weights:
            return out, None
        return out, probs.view(b, h, s, kv) * prepared.live.to(probs.dtype)


def _norm_params(cfg: MLAConfig, ctx: BuildContext, dim: int) -> int:
    return ctx.registry.entry_for_config(cfg.latent_norm).param_count(cfg.latent_norm, replace(ctx, dim=dim))


def _param_count(cfg: MLAConfig, ctx: BuildContext) -> int:
    d, h = ctx.d_model, cfg.n_heads
    if cfg.q_lora_rank is None:
        n = d * h * cfg.qk_head_dim
    else:
        n = d * cfg.q_lora_rank + cfg.q_lora_rank * cfg.bias + _norm_params(cfg, ctx, cfg.q_lora_rank)
        n += cfg.q_lora_rank * h * cfg.qk_head_dim
    n += d * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) + (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * cfg.bias
    n += _norm_params(cfg, ctx, cfg.kv_lora_rank)
    n += cfg.kv_lora_rank * h * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    n += h * cfg.v_head_dim * d + d * cfg.bias
    return n + d * h * cfg.head_gate


def _flops(cfg: MLAConfig, ctx: BuildContext, work: Workload, pairs: Optional[int] = None) -> dict[str, int]:
    """Matrix-product FLOPs of one call (1 multiply-add = 2 FLOPs; ``t`` = tokens, ``P`` = scored pairs per head,
    :meth:`Workload.pairs`).

    Projections on the ``t`` new tokens: the queries (``q_proj``, or ``q_a_proj`` and ``q_b_proj``), the latent and
    rotated key (``kv_a_proj``), ``o_proj``. Then, with no earlier token in the cache (``work.past == 0``: prefill,
    training), the expanded form: ``kv_b_proj`` rebuilds per-head keys and values of the ``t`` tokens
    (``2·t·r_kv·h·(d_nope + d_v)``), scores ``2·h·d_qk·P``, weighted sum ``2·h·d_v·P``. Over a cache holding earlier
    tokens (``past > 0``: decoding) the absorbed form: the query into the latent ``2·t·h·d_nope·r_kv``, scores against
    the latent and the shared key ``2·h·(r_kv + d_rope)·P``, weighted sum of latents ``2·h·r_kv·P``, value
    up-projection ``2·t·h·r_kv·d_v``: nothing grows with the context but the scores and the sum. The latent norms
    (norm components) declare their own; softmax, scaling and RoPE are element-wise. ``pairs`` replaces the causal
    pairs (a sparse attention's selected ones).
    """
    d, h, t = ctx.d_model, cfg.n_heads, work.tokens
    r, d_nope, d_rope, d_v = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    pairs = work.pairs(causal=True) if pairs is None else pairs
    out = {}
    if cfg.q_lora_rank is None:
        out["q_proj"] = 2 * t * d * h * cfg.qk_head_dim
    else:
        out["q_a_proj"] = 2 * t * d * cfg.q_lora_rank
        out["q_b_proj"] = 2 * t * cfg.q_lora_rank * h * cfg.qk_head_dim
    out["kv_a_proj"] = 2 * t * d * (r + d_rope)
    if work.past == 0:
        out["kv_b_proj"] = 2 * t * r * h * (d_nope + d_v)
        out["scores"] = 2 * h * cfg.qk_head_dim * pairs
        out["weighted_sum"] = 2 * h * d_v * pairs
    else:
        out["q_absorb"] = 2 * t * h * d_nope * r
        out["scores"] = 2 * h * (r + d_rope) * pairs
        out["weighted_sum"] = 2 * h * r * pairs
        out["v_up"] = 2 * t * h * r * d_v
    out["o_proj"] = 2 * t * h * d_v * d
    if cfg.head_gate:
        out["g_proj"] = 2 * t * d * h
    return out


#: Key formulas of the docs page (pymdownx.arithmatex).
_MATH = r"""With $c_j = \mathrm{norm}(W_{DKV} x_j) \in \mathbb{R}^{r}$ ($r$ = kv_lora_rank), the rotated key shared by
every head $k^R_j = \mathrm{RoPE}_j(W_{KR} x_j) \in \mathbb{R}^{d_R}$ ($d_R$ = qk_rope_head_dim), and per head $h$ the
query $[q^C_{hi}; q^R_{hi}]$ ($q^R$ rotated), key $k^C_{hj} = W^{(h)}_{UK} c_j$ and value $v_{hj} = W^{(h)}_{UV} c_j$:

$$s_{hij} = \alpha \left( q^{C\top}_{hi} W^{(h)}_{UK} c_j + q^{R\top}_{hi} k^R_j \right) + M_{ij}, \qquad
o_{hi} = W^{(h)}_{UV} \sum_j \mathrm{softmax}_j(s_{hij})\, c_j$$

The cache holds only $c_j$ and $k^R_j$: $r + d_R$ numbers per token and layer (576 for DeepSeek-V3, against
$128 \cdot (192 + 128) = 40{,}960$ for its 128 heads' keys and values). Decoding computes $W^{(h)\top}_{UK} q^C_{hi}$ once per query
("absorbed") and scores the cached latents directly; prefill expands $k^C$ and $v$ per head. $\alpha =
(d_{nope} + d_R)^{-1/2}\, m^2$ with DeepSeek's YaRN $m = 0.1\, \mu \ln s + 1$ ($s$ = factor, $\mu$ = mscale_all_dim;
$m = 1$ without yarn_mscale), $M_{ij}$ is the causal mask (0 where $j \le i$ and not padding, $-\infty$ elsewhere).
The heads' outputs are concatenated (with head_gate each first times $\sigma(w^{(h)\top}_g x_i)$, Ling 3's gate)
and projected by $W_O$."""


#: heads sharded (q by head, kv_b by head, o on its input); the latent path reads the replicated input, so its
#: projections and norms stay whole on every rank (and so does the latent cache)
TP_PLAN = {
    "q_proj": "colwise",
    "q_a_proj": "replicate",
    "q_a_layernorm": "replicate",
    "q_b_proj": "colwise",
    "kv_a_proj_with_mqa": "replicate",
    "kv_a_layernorm": "replicate",
    "kv_b_proj": "colwise",
    "o_proj": "rowwise",
    "g_proj": "colwise",
}

#: the example config of ``mla`` (the tiny models of the contract kit); ``dsa``'s extends it
EXAMPLE = {
    "type": "mla",
    "n_heads": 4,
    "q_lora_rank": 24,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
}


@hookimpl
def register_components(register) -> None:
    """Register ``mla``, and ``dsa`` (:mod:`modkit_plugins.dsa`: MLA with an indexer's top-k selection)."""
    from .dsa import dsa_component

    register(dsa_component())
    register(
        Component(
            kind="attention",
            type="mla",
            config=MLAConfig,
            factory=lambda cfg, ctx: MLA(cfg, ctx),
            description="Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): optional low-rank queries, a compressed "
            "key/value latent and a decoupled RoPE key shared by all heads. [batch, seq, d_model] -> [batch, seq, "
            "d_model]; the cache holds the latent and the rotated key side by side [batch, slots, kv_lora_rank + "
            "qk_rope_head_dim], and decoding attends over the latent with the key up-projection absorbed into the query; "
            "head_gate multiplies each head's output by sigmoid(g_proj(x)) (Ling 3).",
            reference="DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434 §2.1; DeepSeek-V3, arXiv:2412.19437; "
            "transformers DeepseekV3Attention; BailingHybridAttention (head_gate)",
            capabilities={
                "overflow_prone": True,
                "causal_safe": True,
                "kv_cache": True,
                "document_mask": True,
                # sequence sharded over ranks: update_cache_entries all-gathers the latent and the rotated key
                "context_parallel": "allgather_kv",
                "compile_safe": True,
                "returns_weights": True,
                "attention_dropout": True,
                "tp_plan": TP_PLAN,
            },
            param_count=_param_count,
            flops=_flops,
            example=EXAMPLE,
            math=_MATH,
        )
    )
