"""Block-compressed attention (``compressed_attention``): DeepSeek-V4's sliding, compressed-sparse (CSA) and heavily
compressed (HCA) attention, one shared key/value head with sinks and a grouped output projection.

Shapes (``H`` = n_heads, ``D`` = head_dim, ``r`` = rope_dim, ``W`` = window, ``m`` = compress_ratio, ``g`` =
o_groups; ``H_I``, ``D_I``, ``k`` the indexer's heads, width and top-k)::

    x [b, s, d_model]
    c_q  = rms(q_a_proj(x)) · w_qa                        the query latent            [b, s, q_lora_rank]
    q    = rms_unweighted(q_b_proj(c_q)) per head, RoPE on its last r features       [b, H, s, D]
    kv   = rms(kv_proj(x)) · w_kv, RoPE on its last r features: the one key = value   [b, 1, s, D]
    cache <- kv (a ring of W slots: the sliding window)
    compressed entries (m set): per block j of m positions, from C = kv_c(x), Z = gate_c(x) + B (B [m, ·]):
        HCA (overlap false): e_j = rms(Σ_{p in block j} softmax_p(Z_p) ⊙ C_p) · w, RoPE at position j·m   [D]
        CSA (overlap true):  C, Z are 2·D wide; e_j mixes the first D of block j-1 with the last D of block j
                             (2m slots, one softmax), so the entries overlap by one block
    cache <- e_j [b, max_len // m, D]: ONE SLOT PER BLOCK (growth "block"), plus the raw C, Z of the unfinished
             block (and, with overlap, of the block before it) as a fixed-size tail
    a query at t sees the keys kv of positions (t - W, t] and the entries j < (t + 1) // m; with an indexer (CSA)
    only the k entries its lightning indexer scores highest among those:
        I_tj = Σ_h w_th · ReLU(q^I_th · e^I_j) / sqrt(D_I),  q^I = RoPE(q_b_I(c_q)), w = weights_proj(x) / sqrt(H_I),
        e^I_j: the entries of a second, D_I-wide overlapping compressor (cached beside e_j)
    o    = Σ softmax(q·k / sqrt(D), one sink logit per head) v over those keys; RoPE with -sin at the query's
           position on its last r features (the values carried their keys' rotation)
    out  = o_b_proj(grouped o_a_proj(o))   heads in g groups, each H·D/g -> o_lora_rank, then g·o_lora_rank -> d

The cache of a layer is ``W`` window slots + ``max_len // m`` entries (+ as many indexer keys) + a tail of ``m``
(``2m`` with overlap) raw positions: against dense attention's ``max_len`` keys and values per layer, so at 128K
tokens an HCA layer (m = 128) keeps 1,024 entries and a CSA layer (m = 4) 32,768 (:mod:`modkit.nn.cache`, growth
``"block"``).

**Padding and chunks.** Blocks are cut by position, not by index: with left padding each row's blocks start at its
first real token, and a prefill, a chunked prefill and a token-by-token decode compress the same blocks (each
forward completes the blocks its tokens close, from the cached tail and its own tokens). transformers cuts blocks by
index, so it compresses padding into a left-padded row's first blocks; this module does not.

**Positions.** The layer rotates with its own RoPE (``rope_theta``, interleaved pairs on the last ``rope_dim``
features, as transformers' ``apply_rotary_pos_emb`` of DeepSeek-V4); the model's position scheme is not used. With
``rope_scaling`` (YaRN, as the published DeepSeek-V4 configs scale their compressed layers) the frequencies are
YaRN's over a rotary width of ``rope_dim`` and every cos and sin (queries, keys, entries, the indexer's queries and
the output's inverse rotation) is multiplied by YaRN's attention factor, as transformers'
``DeepseekV4RotaryEmbedding`` does for the layer's rope label (``main`` sliding, ``compress`` compressed).

**Training.** The indexer's output is a discrete top-k, so the LM loss gives its parameters no gradient; they are
created with ``requires_grad = False`` (as in ``dsa``).

References: DeepSeek-AI 2026, DeepSeek-V4 (§2.3.1 compressed sparse attention and the lightning indexer, §2.3.2
heavily compressed attention, grouped output projection); transformers ``DeepseekV4Attention``,
``DeepseekV4CSACompressor``, ``DeepseekV4HCACompressor``, ``DeepseekV4Indexer`` (``modeling_deepseek_v4.py``).
"""

from __future__ import annotations

from typing import Literal, Optional

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
    PositionGeometry,
    PreparedMask,
    SeqLen,
    attention_mask,
    hookimpl,
    masked_softmax,
    update_cache_entries,
)

from .rope import YarnScaling, yarn_attention_factor, yarn_inv_freq


class CompressedAttentionConfig(ComponentConfig):
    """Config of ``compressed_attention`` (DeepSeek-V4's attention; one layer type per set of fields)."""

    type: Literal["compressed_attention"] = "compressed_attention"
    n_heads: HeadCount = Field(..., description="query heads (DeepSeek-V4: 64); one shared key/value head")
    head_dim: HeadDim = Field(..., description="width of a head, key and value alike (DeepSeek-V4: 512)")
    q_lora_rank: HeadDim = Field(..., description="rank of the low-rank query projection (DeepSeek-V4: 1024)")
    rope_dim: HeadDim = Field(..., description="features rotated, the last ones of each head (DeepSeek-V4: 64)")
    rope_theta: float = Field(
        10000.0, gt=1, le=1e12, description="RoPE base (DeepSeek-V4: 10000 on sliding layers, 160000 compressed)"
    )
    rope_scaling: Optional[YarnScaling] = Field(
        None,
        description="YaRN scaling of this layer's RoPE over a rotary width of rope_dim (DeepSeek-V4's published "
        "configs: factor 16 on compressed layers, original_max_seq_len 65536, attention_factor 1); null: plain RoPE",
    )
    window: Optional[SeqLen] = Field(
        ..., description="sliding window of raw keys: a query sees positions (t - window, t]; null: every position"
    )
    compress_ratio: Optional[SeqLen] = Field(
        None, description="m, positions per compressed entry (CSA 4, HCA 128); null: sliding attention alone"
    )
    overlap: bool = Field(
        False, description="entries mix two series over 2m positions with stride m (CSA); false: one block (HCA)"
    )
    index_n_heads: Optional[HeadCount] = Field(None, description="indexer heads (CSA: 64); null: every entry seen")
    index_head_dim: HeadDim = Field(128, description="indexer head and key width (DeepSeek-V4: 128)")
    index_topk: SeqLen = Field(512, description="entries each query keeps (DeepSeek-V4: 512)")
    o_groups: HeadCount = Field(..., description="groups of heads of the grouped output projection (DeepSeek-V4: 8)")
    o_lora_rank: HeadDim = Field(..., description="per-group width of the grouped output projection (1024)")
    eps: float = Field(1e-6, gt=0, le=0.1, description="epsilon of every RMS normalisation (rms_norm_eps)")

    def position_geometry(self, ctx) -> Optional[PositionGeometry]:
        """None: the layer rotates with its own RoPE (``rope_theta``, ``rope_scaling``) and takes no position
        scheme."""
        return None

    def check(self, ctx) -> list[tuple[str, str]]:
        """Rotated features fit a head, groups divide the heads, an indexer or overlap needs compression."""
        bad = []
        if self.rope_dim > self.head_dim or self.rope_dim % 2:
            bad.append(("rope_dim", f"= {self.rope_dim} must be even and at most head_dim = {self.head_dim}"))
        if self.n_heads % self.o_groups:
            bad.append(("o_groups", f"= {self.o_groups} must divide n_heads = {self.n_heads}"))
        if self.compress_ratio is None and (self.overlap or self.index_n_heads is not None):
            bad.append(("compress_ratio", "is null, but overlap or an indexer needs compressed entries; set it"))
        if self.index_n_heads is not None and self.index_head_dim < self.rope_dim:
            bad.append(("index_head_dim", f"= {self.index_head_dim} is narrower than rope_dim = {self.rope_dim}"))
        return bad


def _rms(x: Tensor, weight: Optional[Tensor], eps: float) -> Tensor:
    """transformers' DeepSeek-V4 RMS norm: float32 statistics, ``(weight · x̂)`` cast back to ``x``'s dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h if weight is None else weight * h).to(x.dtype)


def rope_frequencies(dim: int, theta: float, scaling: Optional[YarnScaling] = None) -> tuple[Tensor, float]:
    """``(inv_freq [dim // 2] float32, attention factor)`` of a rotary width ``dim``: ``theta^(-2i/dim)`` computed
    in float32 like transformers' ``compute_default_rope_parameters`` (factor 1), or with ``scaling`` YaRN's
    frequencies and factor (:func:`modkit_plugins.rope.yarn_inv_freq`, :func:`~modkit_plugins.rope.
    yarn_attention_factor`; transformers ``_compute_yarn_parameters`` with ``head_dim · partial_rotary_factor =
    dim``)."""
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    if scaling is None:
        return inv, 1.0
    return yarn_inv_freq(inv, dim, theta, scaling).to(torch.float32), yarn_attention_factor(scaling)


def rope(x: Tensor, positions: Tensor, inv: Tensor, scale: float = 1.0, inverse: bool = False) -> Tensor:
    """DeepSeek-V4's RoPE on the last ``dim = 2 · len(inv)`` features of ``x [b, h, s, D]`` at ``positions [b, s]``:
    interleaved pairs ``(2i, 2i + 1)`` turned by ``position · inv[i]`` (radians), cos and sin multiplied by
    ``scale`` (YaRN's attention factor; 1 otherwise), float32; ``inverse`` rotates by ``-angle``.
    Source: transformers ``DeepseekV4RotaryEmbedding`` and ``apply_rotary_pos_emb``."""
    dim = 2 * inv.shape[0]
    freqs = positions[:, None, :, None].float() * inv.float()
    cos = freqs.cos() * scale if scale != 1.0 else freqs.cos()
    sin = freqs.sin() * scale if scale != 1.0 else freqs.sin()
    cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
    sin = -sin if inverse else sin
    nope, r = x[..., :-dim], x[..., -dim:]
    half = torch.stack((-r[..., 1::2], r[..., 0::2]), dim=-1).flatten(-2)
    return torch.cat([nope, (r.float() * cos + half.float() * sin).to(x.dtype)], dim=-1)


class BlockCompressor(nn.Module):
    """One entry per block of ``m`` positions: ``kv_proj``, ``gate_proj`` ``d -> c·D`` (c = 2 with overlap),
    ``position_bias [m, c·D]`` float32 and ``kv_norm`` (weight ``[D]``). :meth:`entries` maps the raw projections of
    aligned blocks to ``[b, n, D]`` entries (the module docstring's ``e_j``); transformers'
    ``DeepseekV4HCACompressor`` / ``DeepseekV4CSACompressor`` / the indexer's compressor."""

    def __init__(self, d_model: int, dim: int, m: int, overlap: bool, eps: float):
        super().__init__()
        c = 2 if overlap else 1
        self.dim, self.m, self.overlap, self.eps = dim, m, overlap, eps
        self.kv_proj = nn.Linear(d_model, c * dim, bias=False)
        self.gate_proj = nn.Linear(d_model, c * dim, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(m, c * dim))
        self.kv_norm = nn.Parameter(torch.ones(dim))

    #: the gate bias is one logit per slot and channel; the norm's gain
    param_roles = {"position_bias": "vector", "kv_norm": "norm_gain"}

    def init_weights(self, init) -> None:
        """``position_bias`` 0 and the norm's gain 1 (transformers' ``_init_weights``); the projections by default."""
        init.zeros_(self.position_bias)
        init.ones_(self.kv_norm)

    @property
    def tail(self) -> int:
        """Raw positions kept between forwards: the unfinished block, and with overlap the block before it."""
        return 2 * self.m if self.overlap else self.m

    def raw(self, x: Tensor) -> Tensor:
        """``[b, s, 2·c·D]``: the projections ``C`` and gate logits ``Z`` of each token, side by side."""
        return torch.cat([self.kv_proj(x), self.gate_proj(x)], dim=-1)

    def entries(self, buf: Tensor, blocks: Tensor, filled: Tensor, rot: tuple[Tensor, float]) -> Tensor:
        """Entries of the blocks of ``buf [b, nb·m, 2·c·D]`` (block 0 starts at a multiple of m; with overlap block
        0 only lends its first half), rotated at positions ``blocks [b, n]·m`` by the layer's ``rot`` (``(inv_freq,
        attention factor)``, :func:`rope`): ``[b, n, D]``. Positions not
        ``filled [b, nb·m]`` (before a row's or a document's first token, after its last) get no weight."""
        b, n_pos, _ = buf.shape
        kv, gate = buf.view(b, n_pos // self.m, self.m, -1).chunk(2, dim=-1)
        gate = (gate + self.position_bias).float()  # the softmax is float32 (transformers'), the mask after the bias
        gate = gate.masked_fill(~filled.view(b, -1, self.m, 1), torch.finfo(torch.float32).min)
        d = self.dim
        if self.overlap:
            kv = torch.cat([kv[:, :-1, :, :d], kv[:, 1:, :, d:]], dim=2)
            gate = torch.cat([gate[:, :-1, :, :d], gate[:, 1:, :, d:]], dim=2)
        out = (kv * gate.softmax(dim=2).to(kv.dtype)).sum(dim=2)
        out = _rms(out, self.kv_norm, self.eps)
        return rope(out[:, None], blocks * self.m, *rot)[:, 0]


def _rows(positions: Tensor, valid: Optional[Tensor]) -> tuple[Tensor, Tensor, Tensor]:
    """Per row ``(p0, p1, has)``: the first and one-past-last position of this forward's real tokens (real tokens
    take consecutive positions: padding only precedes them), and whether the row has any."""
    if valid is None:
        p1 = positions[:, -1] + 1
        return p1 - positions.shape[1], p1, torch.ones_like(p1, dtype=torch.bool)
    has = valid.any(-1)
    p1 = torch.where(valid, positions + 1, torch.zeros_like(positions)).amax(-1)
    return p1 - valid.long().sum(-1), p1, has


# size: the pieces of one layout (compressor, raw projections, cached tail, positions, rows, span of positions)
def _assemble(comp, raw: Tensor, tail: Optional[Tensor], positions: Tensor, rows: tuple, extent: int) -> tuple:
    """Lay the cached tail and the new tokens' raw projections out by position from ``a`` (the first block the
    forward needs, a multiple of m), over ``extent`` positions after the tail: ``(buf [b, N, w], filled [b, N]
    bool, a [b])``; ``positions`` of padding are negative (dropped)."""
    p0 = rows[0]
    b, s, w = raw.shape
    m, span = comp.m, comp.tail
    a = torch.div(p0, m, rounding_mode="floor") * m - (span - m)
    n = -(-(span + extent) // m) * m
    buf = raw.new_zeros(b, n + 1, w)
    filled = torch.zeros(b, n + 1, dtype=torch.bool, device=raw.device)
    if tail is not None:
        back = torch.arange(span, device=raw.device)
        old = tail.gather(1, ((a[:, None] + back) % span)[..., None].expand(b, span, w).long()).to(raw.dtype)
        keep = ((a[:, None] + back) < p0[:, None]) & ((a[:, None] + back) >= 0)
        buf[:, :span] = torch.where(keep[..., None], old, buf[:, :span])
        filled[:, :span] = keep
    at = positions - a[:, None]
    at = torch.where((at >= 0) & (at < n), at, torch.full_like(at, n))  # padding: the dropped last column
    buf.scatter_(1, at[..., None].expand(b, s, w), raw)
    filled.scatter_(1, at, torch.ones_like(at, dtype=torch.bool))
    return buf[:, :n], filled[:, :n], a


def _documents(inputs: AttentionInputs, m: int, span: int) -> tuple[Tensor, Optional[Tensor], Optional[Tensor]]:
    """Under document-masked packing (no cache), each document's tokens moved to positions of their own, apart by
    at least ``span`` and starting at multiples of m, so no block mixes two documents: ``(positions [b, s], the
    first block of each token's document [b, s], the first blocks of the documents [b, n_docs])``; otherwise
    ``(inputs.positions, None, None)``."""
    docs = inputs.documents
    if docs is None:
        return inputs.positions, None, None
    counts = torch.zeros(docs.shape[0], int(docs.max()) + 1, dtype=torch.long, device=docs.device)
    counts.scatter_add_(1, docs, torch.ones_like(docs))
    stride = -(-counts // m) * m + span
    starts = torch.div(stride.cumsum(-1) - stride, m, rounding_mode="floor")  # in blocks
    first = starts.gather(1, docs)
    return inputs.positions + first * m, first, starts


# size: one compressor's pass: the compressor, its input, the inputs, the cache, its entries' names, rows, rotation
def _compress(comp, x: Tensor, inputs: AttentionInputs, state, names: tuple[str, str], rows: tuple, rot) -> tuple:
    """Compress the blocks this forward completes: ``(entries [b, T, D], their block index within their document
    [b, T], the first block of each entry's document [b, T] or None)`` every query may look up (the cache's whole
    per-block entry, or this forward's own entries without a cache); writes the cache's per-block entry and tail."""
    valid = inputs.token_mask
    raw = comp.raw(x)
    if valid is not None:
        raw = raw.masked_fill(~valid[..., None], 0.0)
    positions, _, starts = _documents(inputs, comp.m, comp.tail)
    if starts is not None:  # one forward over the packed row: every document's blocks from position 0
        rows = (torch.zeros_like(rows[0]), *rows[1:])
    if valid is not None:  # padding goes to the dropped column
        positions = torch.where(valid, positions, torch.full_like(positions, -(10**9)))
    tail = state[names[1]] if state is not None else None
    # a row's new tokens span at most seq positions; packed documents, apart, span up to the last one's
    extent = x.shape[1] if starts is None else int(positions.max()) + 1
    buf, filled, a = _assemble(comp, raw, tail, positions, rows, extent)
    first = torch.div(a, comp.m, rounding_mode="floor") + (1 if comp.overlap else 0)
    index = first[:, None] + torch.arange(buf.shape[1] // comp.m - (1 if comp.overlap else 0), device=x.device)
    home = None
    if starts is not None:  # each entry's document: the last one starting at or before it
        which = (torch.searchsorted(starts, index, right=True) - 1).clamp(min=0)
        home = starts.gather(1, which)
    fresh = comp.entries(buf, index if home is None else index - home, filled, rot)  # [b, n, D]
    if state is None:  # the blocks the new tokens can complete: ceil(extent / m) from the first one's
        n = (buf.shape[1] - comp.tail) // comp.m
        index, home = index[:, :n], None if home is None else home[:, :n]
        return fresh[:, :n], index if home is None else index - home, home
    _write(comp, state, names, fresh, index, buf, a, rows)
    store = state[names[0]]
    return store.to(fresh.dtype), torch.arange(store.shape[1], device=x.device).expand(store.shape[0], -1), None


# size: one write of the two cached parts of a compressor (its entries and its raw tail), each argument one of them
def _write(comp, state, names, fresh: Tensor, index: Tensor, buf: Tensor, a: Tensor, rows: tuple) -> None:
    """Store the entries of the blocks completed in this forward and the raw tail the next forward needs."""
    p0, p1, has = rows
    store, tail = state[names[0]], state[names[1]]
    m, span = comp.m, comp.tail
    done = ((index + 1) * m <= p1[:, None]) & ((index + 1) * m > p0[:, None]) & (index < store.shape[1])
    done = done & (index >= 0) & has[:, None]
    r, j = done.nonzero(as_tuple=True)
    store[r, index[r, j]] = fresh[r, j].to(store.dtype)
    want = p1[:, None] - span + torch.arange(span, device=buf.device)  # the positions the tail keeps
    put = (want >= a[:, None]) & (want >= 0) & has[:, None]
    r, j = put.nonzero(as_tuple=True)
    tail[r, want[r, j] % span] = buf[r, want[r, j] - a[r]].to(tail.dtype)


class CompressedAttention(nn.Module):
    """DeepSeek-V4 attention. ``forward(x [batch, seq, d_model], inputs) -> [batch, seq, d_model]`` (the formulas in
    the module docstring); the cache is :meth:`cache_spec`'s.

    Raises (in ``forward``): ValueError under context parallelism, which it does not implement. Packed documents
    (``inputs.documents``) each get blocks of their own.
    """

    def __init__(self, cfg: CompressedAttentionConfig, ctx: BuildContext):
        super().__init__()
        d, h, dim = ctx.d_model, cfg.n_heads, cfg.head_dim
        self.cfg, self.n_heads, self.head_dim, self.n_kv_heads = cfg, h, dim, 1
        self.q_a_proj = nn.Linear(d, cfg.q_lora_rank, bias=False)
        self.q_a_norm = nn.Parameter(torch.ones(cfg.q_lora_rank))
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, h * dim, bias=False)
        self.kv_proj = nn.Linear(d, dim, bias=False)
        self.kv_norm = nn.Parameter(torch.ones(dim))
        self.o_a_proj = nn.Linear(h * dim // cfg.o_groups, cfg.o_groups * cfg.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(cfg.o_groups * cfg.o_lora_rank, d, bias=False)
        self.sinks = nn.Parameter(torch.zeros(h))
        inv, self.rope_scale = rope_frequencies(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling)
        self.register_buffer("inv_freq", inv, persistent=False)  # once per layer; init_weights recomputes it
        m, eps = cfg.compress_ratio, cfg.eps
        self.compressor = BlockCompressor(d, dim, m, cfg.overlap, eps) if m else None
        self.indexer = None
        if cfg.index_n_heads is not None:
            ih, idim = cfg.index_n_heads, cfg.index_head_dim
            self.indexer = nn.ModuleDict(
                {
                    "compressor": BlockCompressor(d, idim, m, True, eps),
                    "q_b_proj": nn.Linear(cfg.q_lora_rank, ih * idim, bias=False),
                    "weights_proj": nn.Linear(d, ih, bias=False),
                }
            )
            for p in self.indexer.parameters():  # a top-k passes no gradient (module docstring)
                p.requires_grad_(False)

    #: the norms' gains and the per-head sink logits
    param_roles = {"q_a_norm": "norm_gain", "kv_norm": "norm_gain", "sinks": "vector"}
    #: read as per-group matrices (the grouped output projection): decoding keeps it as built
    matrix_weights = ("o_a_proj.weight",)

    def init_weights(self, init) -> None:
        """Norm gains 1 and sinks 0 (transformers' ``_init_weights``); the projections by default; the RoPE
        frequencies ``inv_freq`` recomputed from the config (a buffer: meta builds need this)."""
        init.ones_(self.q_a_norm)
        init.ones_(self.kv_norm)
        init.zeros_(self.sinks)
        init.copy_(self.inv_freq, rope_frequencies(self.cfg.rope_dim, self.cfg.rope_theta, self.cfg.rope_scaling)[0])

    def _rot(self) -> tuple[Tensor, float]:
        """The layer's RoPE: ``(inv_freq [rope_dim // 2], attention factor)`` (:func:`rope`)."""
        return self.inv_freq, self.rope_scale

    def cache_spec(self) -> CacheSpec:
        """The window's keys ``kv [1, D]`` per token (a ring of ``window`` slots); with compression the entries
        ``ckv [D]`` per block of m (growth ``"block"``) and the raw tail ``ckv_tail [tail, 2·c·D]``; with an indexer
        its keys ``index_k [D_I]`` per block and ``index_tail [2m, 4·D_I]``."""
        cfg = self.cfg
        entries = [CacheEntry("kv", (1, self.head_dim), slot_axis=2)]
        for name, comp in (("ckv", self.compressor), ("index", self._index_compressor())):
            if comp is None:
                continue
            key = "ckv" if name == "ckv" else "index_k"
            entries.append(CacheEntry(key, (comp.dim,), growth="block", block=cfg.compress_ratio))
            width = 2 * comp.kv_proj.out_features
            entries.append(CacheEntry(f"{name}_tail", (comp.tail, width), growth="sequence"))
        return CacheSpec(tuple(entries), window=cfg.window)

    def _index_compressor(self) -> Optional[BlockCompressor]:
        return self.indexer["compressor"] if self.indexer is not None else None

    def _queries(self, x: Tensor, inputs: AttentionInputs) -> tuple[Tensor, Tensor, Tensor]:
        """``(c_q [b, s, q_lora_rank], q [b, H, s, D], kv [b, 1, s, D])``, rotated."""
        b, s, _ = x.shape
        cfg = self.cfg
        c_q = _rms(self.q_a_proj(x), self.q_a_norm, cfg.eps)
        q = _rms(self.q_b_proj(c_q).view(b, s, self.n_heads, self.head_dim).transpose(1, 2), None, cfg.eps)
        q = rope(q, inputs.positions, *self._rot())
        kv = _rms(self.kv_proj(x), self.kv_norm, cfg.eps).view(b, 1, s, self.head_dim)
        return c_q, q, rope(kv, inputs.positions, *self._rot())

    def _select(self, x: Tensor, c_q: Tensor, inputs, state, rows, visible: Tensor) -> Tensor:
        """The indexer's top-k among the visible entries ``visible [b, s, T]``: ``[b, s, T]`` bool."""
        cfg, ix = self.cfg, self.indexer
        keys = _compress(ix["compressor"], x, inputs, state, ("index_k", "index_tail"), rows, self._rot())[0]
        b, s, _ = x.shape
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        q = ix["q_b_proj"](c_q).view(b, s, ih, idim).transpose(1, 2)
        q = rope(q, inputs.positions, *self._rot()).transpose(1, 2)
        # the heads folded into the rows: one [b, s·H_I, D_I] x [b, D_I, T] product (a broadcast over s copied the
        # keys once per query for a batch of two rows or more)
        scores = torch.matmul(q.float().reshape(b, s * ih, idim), keys.float().transpose(-1, -2)).view(b, s, ih, -1)
        scores = torch.relu(scores) * idim**-0.5
        w = ix["weights_proj"](x).float() * ih**-0.5
        index = (scores * w[..., None]).sum(dim=2).masked_fill(~visible, float("-inf"))  # [b, s, T]
        # ties go to the earlier entry (a stable sort); transformers' topk has an order of its own there
        top = index.sort(dim=-1, descending=True, stable=True).indices[..., : cfg.index_topk]
        return torch.zeros_like(visible).scatter_(-1, top, True) & visible

    def forward(self, x: Tensor, inputs: AttentionInputs) -> Tensor:
        """``[batch, seq, d_model] -> [batch, seq, d_model]``."""
        if inputs.sequence is not None:
            raise ValueError("compressed_attention does not implement context parallelism; train it on one rank")
        cfg = self.cfg
        b, s, _ = x.shape
        c_q, q, kv = self._queries(x, inputs)
        state = inputs.cache_for(self)
        seen, k_pos, k_valid = update_cache_entries(inputs, {"kv": kv}, mixer=self)
        keys = seen["kv"]
        docs = inputs.documents
        mask = attention_mask(inputs.positions, k_pos, k_valid, True, cfg.window, None, docs, docs)
        if self.compressor is not None:
            rows = _rows(inputs.positions, inputs.token_mask)
            entries, index, home = _compress(self.compressor, x, inputs, state, ("ckv", "ckv_tail"), rows, self._rot())
            limit = torch.div(inputs.positions + 1, cfg.compress_ratio, rounding_mode="floor")
            visible = index[:, None, :] < limit[..., None]  # [b, s, T]
            if home is not None:  # packed documents: a query sees its own document's entries only
                mine = _documents(inputs, cfg.compress_ratio, self.compressor.tail)[1]
                visible = visible & (home[:, None, :] == mine[..., None])
            if self.indexer is not None:
                with torch.no_grad():
                    visible = self._select(x, c_q, inputs, state, rows, visible)
            keys = torch.cat([keys, entries[:, None].to(keys.dtype)], dim=2)
            mask = torch.cat([mask, visible[:, None]], dim=-1)
        prepared = PreparedMask.of(mask, torch.float32)
        # every head reads the one key/value head: the heads folded into the rows of one [b, H·s, ·] product each
        # (a broadcast over the heads copied the keys once per head for the backward at two rows or more)
        h, k = self.n_heads, keys[:, 0]  # [b, T, D]
        scores = torch.matmul(q.float().reshape(b, h * s, -1), k.float().transpose(-1, -2)).view(b, h, s, -1)
        probs = masked_softmax(scores * self.head_dim**-0.5, prepared, sinks=self.sinks)
        out = torch.matmul(probs.to(k.dtype).reshape(b, h * s, -1), k).view(b, h, s, -1)  # values are the keys
        out = rope(out, inputs.positions, *self._rot(), inverse=True).transpose(1, 2)
        g = cfg.o_groups
        w = self.o_a_proj.weight.view(g, cfg.o_lora_rank, -1)
        grouped = torch.einsum("bsgi,goi->bsgo", out.reshape(b, s, g, -1), w)
        return self.o_b_proj(grouped.reshape(b, s, -1))


def _compressor_params(d: int, dim: int, m: int, overlap: bool) -> int:
    c = 2 if overlap else 1
    return 2 * d * c * dim + m * c * dim + dim


def _param_count(cfg: CompressedAttentionConfig, ctx: BuildContext) -> int:
    """Projections, norms, sinks, the grouped output projection, the compressor and the indexer."""
    d, h, dim, r = ctx.d_model, cfg.n_heads, cfg.head_dim, cfg.q_lora_rank
    n = d * r + r + r * h * dim + d * dim + dim + h * dim * cfg.o_lora_rank + cfg.o_groups * cfg.o_lora_rank * d + h
    if cfg.compress_ratio:
        n += _compressor_params(d, dim, cfg.compress_ratio, cfg.overlap)
    if cfg.index_n_heads is not None:
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        n += _compressor_params(d, idim, cfg.compress_ratio, True) + r * ih * idim + d * ih
    return n


def _sum_blocks(n: int, m: int, cap: Optional[int]) -> int:
    """``Σ_{q=1..n} min(q // m, cap)``: the entries seen by the queries at positions ``0..n-1`` (``cap``: top-k)."""
    if cap is not None and n > cap * m - 1:
        return _sum_blocks(cap * m - 1, m, None) + cap * (n - cap * m + 1)
    k = n // m
    return m * (k - 1) * k // 2 + k * (n - k * m + 1)


def _block_pairs(work, m: int, cap: Optional[int] = None) -> int:
    """(query, entry) pairs of one head: those the mask (and a top-k ``cap``) lets through, or with ``work.dense``
    every entry computed (``ceil(new / m)`` without a cache, the cache's ``(past + new) // m`` with one)."""
    if work.dense:
        total = (work.past + work.new) // m if work.past else -(-work.new // m)
        return work.batch * work.new * total
    return work.batch * (_sum_blocks(work.past + work.new, m, cap) - _sum_blocks(work.past, m, cap))


def _flops(cfg: CompressedAttentionConfig, ctx: BuildContext, work) -> dict[str, int]:
    """Matrix-product FLOPs of one call (1 multiply-add = 2 FLOPs; ``t`` = tokens): the projections, the
    compressors' two projections per token, the indexer's queries, head weights and scores over every visible entry,
    and the attention's scores and values over the window's keys and the entries kept."""
    d, t, h, dim, r = ctx.d_model, work.tokens, cfg.n_heads, cfg.head_dim, cfg.q_lora_rank
    out = {
        "q_proj": 2 * t * (d * r + r * h * dim),
        "kv_proj": 2 * t * d * dim,
        "o_proj": 2 * t * (h * dim * cfg.o_lora_rank + cfg.o_groups * cfg.o_lora_rank * d),
    }
    keys = work.pairs(causal=True, window=cfg.window)
    m = cfg.compress_ratio
    if m:
        out["compressor"] = 2 * t * d * 2 * (2 if cfg.overlap else 1) * dim
        cap = cfg.index_topk if cfg.index_n_heads is not None else None
        keys += _block_pairs(work, m, cap)
    if cfg.index_n_heads is not None:
        ih, idim = cfg.index_n_heads, cfg.index_head_dim
        out["index_compressor"] = 2 * t * d * 4 * idim
        out["index_q"] = 2 * t * r * ih * idim
        out["index_weights"] = 2 * t * d * ih
        out["index_scores"] = 2 * ih * idim * _block_pairs(work, m)
    out["scores"] = 2 * h * dim * keys
    out["values"] = 2 * h * dim * keys
    return out


EXAMPLE = {
    "type": "compressed_attention",
    "n_heads": 4,
    "head_dim": 16,
    "q_lora_rank": 12,
    "rope_dim": 8,
    "window": 4,
    "compress_ratio": 2,
    "overlap": True,
    "index_n_heads": 2,
    "index_head_dim": 8,
    "index_topk": 2,
    "o_groups": 2,
    "o_lora_rank": 8,
}


@hookimpl
def register_components(register) -> None:
    """Register ``compressed_attention``."""
    register(
        Component(
            kind="attention",
            type="compressed_attention",
            config=CompressedAttentionConfig,
            factory=lambda cfg, ctx: CompressedAttention(cfg, ctx),
            description="DeepSeek-V4's attention: one shared key/value head (the key is the value) over a sliding "
            "window, plus entries compressed from blocks of compress_ratio positions (HCA; overlapping blocks and a "
            "lightning indexer's top-k: CSA), per-head sinks, its own interleaved RoPE and a grouped output "
            "projection. [batch, seq, d_model] -> [batch, seq, d_model]; the cache holds the window's keys, one "
            "entry per completed block (growth 'block') and the raw tail of the unfinished block.",
            reference="DeepSeek-AI 2026, DeepSeek-V4 §2.3; transformers DeepseekV4Attention, DeepseekV4CSACompressor, "
            "DeepseekV4HCACompressor, DeepseekV4Indexer",
            capabilities={
                "document_mask": True,
                "causal_safe": True,
                "kv_cache": True,
                "selects_keys": True,
                "overflow_prone": True,
                # modkit cost compares it with itself made dense: every raw key of every position, no compression
                "selects_from": "compressed_attention",
                "dense_twin": {"window": None, "compress_ratio": None, "overlap": False, "index_n_heads": None},
            },
            param_count=_param_count,
            flops=_flops,
            example=EXAMPLE,
        )
    )
