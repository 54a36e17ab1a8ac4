"""DeepSeek Sparse Attention (``dsa``): multi-head latent attention in which each query attends only to the
``index_topk`` earlier tokens a lightning indexer scores highest (DeepSeek-V3.2).

Shapes (``H`` = index_n_heads, ``D`` = index_head_dim, ``d_rope`` = qk_rope_head_dim, ``k`` = index_topk; the MLA
names of :mod:`modkit_plugins.mla`)::

    x [b, s, d_model]
    q_resid = q_a_layernorm(q_a_proj(x))                 the query latent of MLA           [b, s, q_lora_rank]
    q_I     = wq_b(q_resid)                              indexer queries                   [b, s, H, D]
    k_I     = index_norm(wk(x))                          one indexer key per token         [b, s, D]
    q_I, k_I: RoPE on their first d_rope features (index_rope_layout: half-split pairs in DeepSeek-V3.2)
    cache  <- k_I [b, slots, D] float32 beside MLA's latent and rotated key
    w       = weights_proj(x) · H^-1/2                   one weight per indexer head       [b, s, H]
    I_ij    = Σ_h w_ih · ReLU(D^-1/2 · q_I,ih · k_I,j)   index score of key j for query i  [b, s, kv]
    S_i     = top-k_j of I_ij over the keys the mask lets through (all of them when fewer than k)
    out     = MLA(x) with the scores of keys outside S_i masked (-inf before the softmax)

The attention itself is MLA's, expanded in prefill and absorbed over the cached latent when decoding
(:mod:`modkit_plugins.mla`); the selection is one more mask. The indexer is O(kv) per query (dense over every past
token) but narrow (``H·(D + 1)`` multiply-adds per key against MLA's ``h·(2·r_kv + d_rope)``); attention is O(k)
per query, so at 128K tokens a decoded token scores 2,048 keys with MLA instead of 131,072.

**Exactness.** The selection is discrete: transformers (``DeepseekV32Indexer``) computes the index scores in
float32 whatever the model's dtype, and so does this module (its projections run on float32 copies of ``x`` and
``q_resid``), and the index keys are cached in float32 (declared by :meth:`DSA.cache_spec`), so a prefill, a chunked
prefill and a token-by-token decode select the same keys. Ties go to the earlier key (a stable sort; ReLU makes a
score exactly 0 wherever every indexer head's ``q·k`` is negative, so ties are common with few heads); transformers'
``topk`` breaks ties in an order of its own, so agreement with it needs scores without ties at the k-th place.

**Shared selections** (GLM-5): a layer with ``index_source = j`` builds no indexer and caches no index keys; it
attends to the keys layer ``j`` (an earlier ``dsa`` with its own indexer) selected in the same forward, handed over
in the per-forward dict the layers share (the cache slot group's, else ``AttentionInputs.scratch``).

**Training.** The LM loss gives the indexer no gradient: the top-k is discrete, and transformers runs the indexer
under ``torch.no_grad``. DeepSeek trains it with its own objective (a KL divergence between the indexer's scores and
the main attention's distribution, DeepSeek-V3.2 report §2.1), which modkit does not implement; the indexer's
parameters are therefore created with ``requires_grad = False`` (optimizers skip them; a checkpoint sets them).

References: DeepSeek-AI 2025, DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency with DeepSeek Sparse Attention
(§2.1, the lightning indexer and fine-grained token selection); transformers ``DeepseekV32Indexer`` and
``DeepseekV32Attention`` (``modeling_deepseek_v32.py``) for the layout, the scales and the half-split RoPE.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

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
    HeadCount,
    HeadDim,
    MAX_LAYERS,
    PositionGeometry,
    SeqLen,
    Slot,
    Workload,
    prepare_mask,
)

from .mla import (
    EXAMPLE as MLA_EXAMPLE,
    MLA,
    MLAConfig,
    TP_PLAN as MLA_TP_PLAN,
    _flops as _mla_flops,
    _KeyMask,
    _norm_params,
    _param_count as _mla_params,
)


class DSAConfig(MLAConfig):
    """Config of ``dsa``: the fields of ``mla`` (low-rank queries required: the indexer reads their latent) and the
    lightning indexer's."""

    type: Literal["dsa"] = "dsa"  # type: ignore[assignment]
    q_lora_rank: HeadDim = Field(  # type: ignore[assignment]
        ...,
        description="rank of the low-rank query projection (DeepSeek-V3.2: 1536); required: the indexer's queries "
        "are projected from the normalised query latent",
    )
    index_n_heads: HeadCount = Field(..., description="indexer query heads (DeepSeek-V3.2: 64)")
    index_head_dim: HeadDim = Field(
        ...,
        description="width of an indexer query head and of the one indexer key per token, cached (DeepSeek-V3.2: "
        "128); its first qk_rope_head_dim features are rotated",
    )
    index_topk: SeqLen = Field(
        ...,
        description="keys each query attends to: the index_topk best-scored among those the mask lets through "
        "(all of them when fewer; DeepSeek-V3.2: 2048)",
    )
    index_norm: ComponentConfig = Slot(
        "norm", description='norm of the indexer key (DeepSeek-V3.2: {"type": "layernorm", "eps": 1e-6})'
    )
    index_source: Optional[int] = Field(
        None,
        ge=0,
        le=MAX_LAYERS,
        description="null: the layer selects with its own indexer. An earlier layer's index: this layer reuses that "
        "layer's selection in the same forward and builds no indexer and caches no index keys (GLM-5's 'shared' "
        "layers; the index fields then only describe the source)",
    )
    index_rope_layout: Literal["half_split", "interleaved"] = Field(
        "half_split",
        description="how the indexer's rotated features pair up, whatever the attention's RoPE layout: "
        "half_split (DeepSeek-V3.2: (i, i + d_rope/2)) or interleaved ((2i, 2i + 1): GLM-5)",
    )

    def position_geometry(self, ctx) -> PositionGeometry:
        """RoPE acts on the ``qk_rope_head_dim`` features of MLA's queries and shared key (and of the indexer's);
        no head count is declared for a score bias (ALiBi): the indexer selects keys without seeing it, and keys
        that the bias alone tells apart (equal tokens) would tie in the indexer, a tie decided by rounding."""
        return PositionGeometry(None, self.qk_rope_head_dim, 1)

    def check(self, ctx) -> list[tuple[str, str]]:
        """The indexer rotates its first ``qk_rope_head_dim`` features, so its heads must be at least that wide."""
        if self.index_head_dim < self.qk_rope_head_dim:
            return [
                (
                    "index_head_dim",
                    f"= {self.index_head_dim} is narrower than qk_rope_head_dim = {self.qk_rope_head_dim}: the "
                    "indexer rotates its first qk_rope_head_dim features; use index_head_dim >= qk_rope_head_dim",
                )
            ]
        return []


def _relayout(x: Tensor, src: str, dst: str) -> Tensor:
    """``x [..., d]`` with its rotated pairs moved from layout ``src`` to ``dst`` (half-split pairs ``(i, i + d/2)``,
    interleaved ``(2i, 2i + 1)``); a permutation, so dot products between tensors moved alike are unchanged."""
    if src == dst:
        return x
    n = x.shape[-1] // 2
    if src == "half_split":
        return torch.stack([x[..., :n], x[..., n:]], dim=-1).flatten(-2)
    return x.unflatten(-1, (n, 2)).transpose(-1, -2).flatten(-2)


class LightningIndexer(nn.Module):
    """The indexer: ``keys(x, inputs) -> [b, s, D]`` float32 and ``select(x, q_resid, k_all, allowed, positions)
    -> [b, 1, s, kv]`` bool (see the module docstring for the formulas)."""

    #: read in float32 (:meth:`_linear`): decoding with low-precision weights keeps them as built
    matrix_weights = ("wq_b.weight", "wk.weight", "weights_proj.weight")

    def __init__(self, cfg: DSAConfig, ctx: BuildContext):
        super().__init__()
        d, self.n_heads, self.head_dim = ctx.d_model, cfg.index_n_heads, cfg.index_head_dim
        self.rope_dim, self.topk, self.layout = cfg.qk_rope_head_dim, cfg.index_topk, cfg.index_rope_layout
        self.wq_b = nn.Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(d, self.head_dim, bias=False)
        self.k_norm = ctx.build(cfg.index_norm, dim=self.head_dim)
        self.weights_proj = nn.Linear(d, self.n_heads, bias=False)
        for p in self.parameters():  # no gradient reaches them through the top-k (see the module docstring)
            p.requires_grad_(False)

    @staticmethod
    def _linear(x: Tensor, layer: nn.Linear) -> Tensor:
        return nn.functional.linear(x.float(), layer.weight.float())

    def _rotate(self, q: Tensor, k: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """RoPE on the first ``rope_dim`` features of ``q [b, H, s, D]`` and ``k [b, 1, s, D]`` in the indexer's own
        pair layout (the scheme's rotation applied to the features moved into the scheme's layout and back)."""
        scheme = inputs.position
        if scheme is None:
            return q, k
        theirs = getattr(getattr(scheme, "cfg", None), "layout", self.layout)
        r = self.rope_dim
        q_rot, k_rot = (_relayout(t[..., :r], self.layout, theirs) for t in (q, k))
        q_rot, k_rot = scheme.rotate(q_rot, k_rot, inputs.positions)
        q_rot, k_rot = (_relayout(t, theirs, self.layout) for t in (q_rot, k_rot))
        return torch.cat([q_rot, q[..., r:]], dim=-1), torch.cat([k_rot, k[..., r:]], dim=-1)

    def project(self, x: Tensor, q_resid: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor]:
        """``(q_I [b, H, s, D], k_I [b, s, D])``: the new tokens' indexer queries and keys, rotated, float32."""
        b, s, _ = x.shape
        q = self._linear(q_resid, self.wq_b).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_norm(self._linear(x, self.wk)).float().view(b, 1, s, self.head_dim)
        q, k = self._rotate(q, k, inputs)
        return q, k.squeeze(1)

    def select(self, x: Tensor, q: Tensor, k_all: Tensor, allowed: Tensor) -> Tensor:
        """The kept keys ``[b, 1, s, kv]`` bool: the ``topk`` best index scores among ``allowed [b, 1, s, kv]``.

        ``q [b, H, s, D]`` (from :meth:`project`), ``k_all [b, kv, D]`` every visible key's index key.
        """
        scores = torch.matmul(q.transpose(1, 2), k_all.float().transpose(1, 2).unsqueeze(1))  # [b, s, H, kv]
        scores = torch.relu(scores * self.head_dim**-0.5)
        w = self._linear(x, self.weights_proj) * self.n_heads**-0.5  # [b, s, H]
        index = torch.matmul(w.unsqueeze(-2), scores).squeeze(-2)  # [b, s, kv]
        mask = allowed[:, 0]
        index = index.masked_fill(~mask, float("-inf"))
        # ties (ReLU makes a score exactly 0 wherever every head's q·k is negative) go to the earlier key: a stable
        # sort keeps the slot order, which is the position order in a fresh forward and in the cache alike
        top = index.sort(dim=-1, descending=True, stable=True).indices[..., : self.topk]
        kept = torch.zeros_like(mask).scatter_(-1, top, True)
        return (kept & mask)[:, None]


class DSA(MLA):
    """DeepSeek Sparse Attention. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]``.

    MLA (:class:`modkit_plugins.mla.MLA`) whose queries each attend to the ``index_topk`` keys a
    :class:`LightningIndexer` selects. The cache holds MLA's ``latent`` and ``k_rope`` and the indexer's ``index_k
    [batch, slots, index_head_dim]`` float32 (:meth:`cache_spec`).
    """

    def __init__(self, cfg: DSAConfig, ctx: BuildContext):
        super().__init__(cfg, ctx)
        self.layer_index, self.index_source = ctx.layer_index, cfg.index_source
        if cfg.index_source is not None and ctx.layer_index is not None and cfg.index_source >= ctx.layer_index:
            raise ValueError(
                f"dsa: layer {ctx.layer_index} reuses the selection of layer index_source = {cfg.index_source}, "
                "which does not run before it; name an earlier layer with its own indexer"
            )
        self.indexer = LightningIndexer(cfg, ctx) if cfg.index_source is None else None

    def cache_spec(self) -> CacheSpec:
        """MLA's latent and rotated key, and (with an indexer of its own) the indexer key ``[index_head_dim]`` in
        float32, per token."""
        if self.indexer is None:
            return super().cache_spec()
        entry = CacheEntry("index_k", (self.indexer.head_dim,), dtype=torch.float32)
        return CacheSpec((*super().cache_spec().entries, entry))

    def _index(self, x: Tensor, q_resid: Optional[Tensor], inputs: AttentionInputs) -> tuple[dict[str, Tensor], Any]:
        """``({"index_k": [b, s, D]}, q_I [b, H, s, D])``: the new tokens' indexer keys (cached) and queries
        (``({}, None)`` in a layer reusing another's selection)."""
        if self.indexer is None:
            return {}, None
        with torch.no_grad():
            q, k = self.indexer.project(x, q_resid, inputs)
        return {"index_k": k}, q

    def _shared(self, inputs: AttentionInputs) -> Optional[dict]:
        """The dict every layer of this forward shares (the cache slot group's, else the inputs'), or ``None``."""
        state = inputs.cache_for(self)
        return state.scratch if state is not None else inputs.scratch

    def _selection(self, x: Tensor, state: Any, seen: dict, keys: _KeyMask) -> Tensor:
        """The kept keys ``[b, 1, s, kv]``: the indexer's top-k among the keys the mask lets through, or the
        selection layer ``index_source`` made in this forward."""
        shared = self._shared(keys.inputs)
        if self.indexer is None:
            kept = shared.get(("dsa_selection", self.index_source)) if shared is not None else None
            if kept is None:
                raise ValueError(
                    f"dsa: layer {self.layer_index} reuses the selection of layer {self.index_source}, which made "
                    "none in this forward (its attention must be a dsa with its own indexer, index_source null)"
                )
            return kept
        base = prepare_mask(keys.inputs, keys.k_pos, keys.k_valid, torch.float32, mixer=self)
        allowed = base.allowed & base.live.bool()  # the mask itself: rows that see no key stay empty
        with torch.no_grad():
            kept = self.indexer.select(x, state, seen["index_k"], allowed)
        if shared is not None:
            shared[("dsa_selection", self.layer_index)] = kept
        return kept


def _param_count(cfg: DSAConfig, ctx: BuildContext) -> int:
    d, h, dim = ctx.d_model, cfg.index_n_heads, cfg.index_head_dim
    if cfg.index_source is not None:  # reuses another layer's selection: no indexer
        return _mla_params(cfg, ctx)
    norm = _norm_params(cfg.model_copy(update={"latent_norm": cfg.index_norm}), ctx, dim)
    return _mla_params(cfg, ctx) + cfg.q_lora_rank * h * dim + d * dim + norm + d * h


def _flops(cfg: DSAConfig, ctx: BuildContext, work: Workload) -> dict[str, int]:
    """Matrix-product FLOPs of one call (1 multiply-add = 2 FLOPs; ``t`` = tokens).

    MLA's parts (:func:`modkit_plugins.mla._flops`) over the selected pairs only: query ``p`` scores
    ``min(p + 1, index_topk)`` keys, which :meth:`Workload.pairs` counts as a causal window of ``index_topk``. The
    indexer over every causal pair ``P``: its queries ``2·t·r_q·H·D``, keys ``2·t·d·D`` and head weights
    ``2·t·d·H``, the scores ``2·H·D·P`` and their weighted sum over heads ``2·H·P``. ReLU, top-k and the selection
    mask are element-wise. A dense kernel (``work.dense``) scores the whole rectangle in both.
    """
    d, t, h, dim = ctx.d_model, work.tokens, cfg.index_n_heads, cfg.index_head_dim
    out = _mla_flops(cfg, ctx, work, pairs=work.pairs(causal=True, window=cfg.index_topk))
    if cfg.index_source is not None:  # another layer's selection: no indexer here
        return out
    every = work.pairs(causal=True)
    out["index_q"] = 2 * t * cfg.q_lora_rank * h * dim
    out["index_k"] = 2 * t * d * dim
    out["index_weights"] = 2 * t * d * h
    out["index_scores"] = 2 * h * dim * every
    out["index_sum"] = 2 * h * every
    return out


#: Key formulas of the docs page (pymdownx.arithmatex).
_MATH = r"""With MLA's scores $s_{hij}$ (the ``mla`` page), the indexer's queries $q^I_{th} = W^{I}_{Q,h}\, c^Q_t$ (from
the query latent $c^Q_t$), one key per token $k^I_s = \mathrm{norm}(W^I_K x_s)$ (both rotated on their first
$d_R$ features) and head weights $w_{th} = (W^I_w x_t)_h / \sqrt{H}$:

$$I_{ts} = \sum_{h=1}^{H} w_{th}\, \mathrm{ReLU}\!\left(\frac{q^{I\top}_{th} k^I_s}{\sqrt{D}}\right), \qquad
S_t = \operatorname{top-}k_{\,s \le t}\; I_{ts}, \qquad
o_{ht} = \sum_{s \in S_t} \mathrm{softmax}_{s \in S_t}(s_{hts})\, v_{hs}$$

The cache holds MLA's $c_s$ and $k^R_s$ and the indexer key $k^I_s$ ($D$ numbers, float32). A query scores every
earlier token with the indexer ($H (D + 1)$ multiply-adds each) and $\min(t + 1, k)$ tokens with MLA."""


def dsa_component() -> Component:
    """The registry entry of ``dsa`` (registered by :mod:`modkit_plugins.mla`'s hook)."""
    return Component(
        kind="attention",
        type="dsa",
        config=DSAConfig,
        factory=lambda cfg, ctx: DSA(cfg, ctx),
        description="DeepSeek Sparse Attention (DeepSeek-V3.2): multi-head latent attention in which each query "
        "attends only to the index_topk earlier tokens a lightning indexer (its own query heads over the query "
        "latent, one cached float32 key per token, ReLU scores weighted per head) scores highest. [batch, seq, "
        "d_model] -> [batch, seq, d_model]; the cache holds MLA's latent and rotated key and the indexer key.",
        reference="DeepSeek-AI 2025, DeepSeek-V3.2-Exp (DeepSeek Sparse Attention) §2.1; transformers "
        "DeepseekV32Indexer, DeepseekV32Attention",
        capabilities={
            "selects_keys": True,
            "overflow_prone": True,
            "causal_safe": True,
            "kv_cache": True,
            "document_mask": True,
            "compile_safe": True,
            "returns_weights": True,
            "attention_dropout": True,
            # MLA's plan (heads sharded, the latent path replicated); the indexer reads the replicated input and query
            # latent, so it is replicated too and every rank selects the same keys for its heads
            "tp_plan": {**MLA_TP_PLAN, "indexer": "replicate"},
            # the dense attention this one selects from: the type of the same kind with the fields both have
            # (modkit cost compares the two)
            "selects_from": "mla",
        },
        param_count=_param_count,
        flops=_flops,
        example={
            **MLA_EXAMPLE,
            "type": "dsa",
            "index_n_heads": 2,
            "index_head_dim": 8,
            "index_topk": 3,
            "index_norm": {"type": "layernorm", "eps": 1e-6},
        },
        math=_MATH,
    )
