"""Helpers for writing an attention component: the mask, the dead-row guard and the KV-cache update.

An attention module is its projections and its score function; everything about *which* keys a query may see is
the same for every attention and lives here, so a plugin never has to copy it (copied mask code is where causality
leaks and NaN rows come from). The order inside ``forward(x, inputs)``::

    q, k, v = ...                                                    # projections, [batch, heads, seq, head_dim]
    if inputs.position is not None:
        q, k = inputs.position.rotate(q, k, inputs.positions)        # RoPE (identity for other schemes)
    k, v, k_pos, k_valid = update_cache(inputs, k, v)                # store new keys, get every visible key
    mask = prepare_mask(inputs, k_pos, k_valid, q.dtype, causal=True, window=None)
    bias = position_bias(inputs, k_pos, n_heads)                     # ALiBi (None for other schemes)
    out, _ = masked_attention(q, k, v, mask, bias, scale)            # softmax attention, dead rows -> 0
    # or, with a score function of your own:
    probs = masked_softmax(my_scores(q, k) + bias, mask)             # dead rows -> all-zero probabilities
    out = probs.to(v.dtype) @ v

* **The mask** is built from absolute positions (``q_pos >= k_pos``), so it is aligned bottom-right whenever the
  query is shorter than the keys (cached decode, chunked prefill); ``is_causal=True`` alone aligns top-left and is
  wrong there. Padding keys (``token_mask`` False, or cache slots not written yet) are hidden; a sliding window
  hides keys ``window`` or more positions back.
* **Dead rows.** A query that sees no key at all (a padding query whose keys are all padding, an all-padding row,
  the first chunk of a chunked prefill over left padding) would give ``softmax`` of all ``-inf``: NaN, which then
  spreads through the cache into every later token (pytorch #103749). :class:`PreparedMask` opens those rows
  everywhere (finite softmax) and ``live`` zeroes them, so they output exactly 0.
* **The cache** stores ``n_kv_heads`` heads (never ``n_heads``: torchtune #38) and hands back every key the new
  queries may see, with their positions and validity; see :mod:`modkit.cache`.

References: Vaswani et al. 2017 (arXiv:1706.03762) for scaled dot-product attention; the layout follows
torchtune ``modules/attention.py`` and Hugging Face's ``sdpa_mask`` (bottom-right causal alignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor, nn

from .interfaces import AttentionInputs

__all__ = [
    "PreparedMask",
    "attention_mask",
    "masked_attention",
    "masked_softmax",
    "position_bias",
    "prepare_mask",
    "update_cache",
]


def attention_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Optional[Tensor] = None,
    causal: bool = True,
    window: Optional[int] = None,
    q_doc: Optional[Tensor] = None,
    k_doc: Optional[Tensor] = None,
) -> Tensor:
    """Boolean mask ``[batch, 1, q_len, kv_len]`` (True = may attend) from absolute positions.

    Args:
        q_pos: ``[batch, q_len]`` int64 query positions.
        k_pos: ``[batch, kv_len]`` int64 key positions.
        k_valid: ``[batch, kv_len]`` bool, False for padding keys (and unwritten cache slots), or ``None``.
        causal: hide keys after the query (``k_pos > q_pos``); false for a bidirectional (encoder) layer.
        window: sliding window: hide keys with ``q_pos - k_pos >= window`` (``|q_pos - k_pos| >= window`` when
            bidirectional); ``None`` for global attention (Mistral, Gemma 2 local layers).
        q_doc, k_doc: ``[batch, q_len]`` / ``[batch, kv_len]`` int64 document index of each query and key, or
            ``None``: with both given, a query sees only keys of its own document (document-masked packing, as in
            Llama 3 and torchtitan's document mask); ``causal`` and ``window`` then apply within the document.

    Returns:
        ``[batch, 1, q_len, kv_len]`` bool. Query 2 of ``q_pos = [[0, 1, 2]]`` with causal and ``window = 2``
            sees keys 1 and 2 only.
    """
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    mask = diff >= 0 if causal else torch.ones_like(diff, dtype=torch.bool)
    if window is not None:
        mask = mask & (diff < window) if causal else mask & (diff.abs() < window)
    if k_valid is not None:
        mask = mask & k_valid[:, None, :]
    if q_doc is not None and k_doc is not None:
        mask = mask & (q_doc[:, :, None] == k_doc[:, None, :])
    return mask[:, None]


@dataclass(frozen=True)
class PreparedMask:
    """A boolean mask in the forms attention consumes, with the dead-row guard built in.

    Compute it once per forward with :meth:`of` (or :func:`prepare_mask`, which shares it between the layers of a
    cache slot group) and hand it to :func:`masked_attention` or :func:`masked_softmax`.

    Attributes:
        allowed: ``[batch, 1 or n_heads, q_len, kv_len]`` bool, True = may attend; rows with no visible key
            (dead rows) are opened everywhere so their softmax stays finite.
        additive: ``allowed`` as ``0 / -inf`` in the query dtype (what ``scaled_dot_product_attention`` would
            otherwise rebuild from a bool mask in every layer).
        live: ``[batch, 1 or n_heads, q_len, 1]`` in the query dtype: 1 for rows with a visible key, 0 for dead
            rows; multiplying an output by it zeroes the opened rows in one op.
    """

    allowed: Tensor
    additive: Tensor
    live: Tensor

    @staticmethod
    def of(mask: Tensor, dtype: torch.dtype) -> "PreparedMask":
        """Prepare a bool ``mask [batch, 1 or n_heads, q_len, kv_len]`` (True = may attend) for queries of ``dtype``."""
        live = mask.any(-1, keepdim=True)
        allowed = mask | ~live
        additive = torch.zeros(allowed.shape, dtype=dtype, device=mask.device).masked_fill_(~allowed, float("-inf"))
        return PreparedMask(allowed, additive, live.to(dtype))


def update_cache(inputs: AttentionInputs, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Store the new keys and values in ``inputs.cache`` (if any) and return every key the new queries may see.

    Args:
        inputs: the layer's :class:`~modkit.AttentionInputs` (``positions``, ``token_mask``, ``cache``).
        k, v: ``[batch, n_kv_heads, seq, head_dim]`` keys (already rotated by the position scheme) and values of
            the new tokens.

    Returns:
        ``(k_all, v_all, k_pos, k_valid)``: keys and values ``[batch, n_kv_heads, kv_len, head_dim]`` in the
            dtype of ``k`` (a cache made in another dtype is cast back), their positions ``[batch, kv_len]`` and
            validity ``[batch, kv_len]`` bool (``None`` when every key is real). Without a cache: ``(k, v,
            inputs.positions, inputs.token_mask)``. See :meth:`modkit.LayerKVCache.update` for ``kv_len``.
    """
    if inputs.cache is None:
        return k, v, inputs.positions, inputs.token_mask
    k_all, v_all, k_pos, k_valid = inputs.cache.update(k, v, inputs.positions, inputs.token_mask)
    if k_all.dtype != k.dtype:  # a cache made in another dtype than the model
        k_all, v_all = k_all.to(k.dtype), v_all.to(v.dtype)
    return k_all, v_all, k_pos, k_valid


def prepare_mask(
    inputs: AttentionInputs,
    k_pos: Tensor,
    k_valid: Optional[Tensor],
    dtype: torch.dtype,
    *,
    causal: bool = True,
    window: Optional[int] = None,
) -> PreparedMask:
    """The :class:`PreparedMask` of the new queries (``inputs.positions``) over the keys ``k_pos`` / ``k_valid``.

    With a cache, the mask depends only on positions and validity, which every layer of a cache slot group shares
    within a forward: it is computed once and kept in the group's per-forward ``scratch`` dict (keyed by
    ``causal``, ``window`` and ``dtype``, no tensor ids, so ``torch.compile`` installs no identity guard). With
    ``inputs.documents`` (document-masked packing, no cache) the mask also keeps each query inside its document and
    is kept in ``inputs.scratch``, so it is built once per forward.

    Raises:
        ValueError: ``inputs.documents`` together with a cache (or keys other than the new tokens').

    Args:
        inputs: the layer's :class:`~modkit.AttentionInputs`.
        k_pos, k_valid: from :func:`update_cache`.
        dtype: the query dtype (of ``PreparedMask.additive`` and ``live``).
        causal, window: as in :func:`attention_mask`.
    """
    scratch = getattr(inputs.cache, "scratch", None)
    docs = inputs.documents
    if docs is not None:
        if inputs.cache is not None or k_pos is not inputs.positions:
            raise ValueError("document-masked attention needs the keys of the new tokens alone (no KV cache); "
                             "drop the cache or the document ids")
        scratch = inputs.scratch  # one forward's mask over its own keys: the same for every layer
    key = ("mask", causal, window, dtype)
    prepared = scratch.get(key) if scratch is not None else None
    if prepared is None:
        prepared = PreparedMask.of(attention_mask(inputs.positions, k_pos, k_valid, causal, window, docs, docs), dtype)
        if scratch is not None:
            scratch[key] = prepared
    return prepared


def position_bias(inputs: AttentionInputs, k_pos: Tensor, n_heads: int) -> Optional[Tensor]:
    """The layer's additive position bias ``[batch, n_heads, q_len, kv_len]`` float32 (ALiBi), or ``None``.

    ``inputs.position.attention_bias(inputs.positions, k_pos, n_heads)``; ``None`` without a position scheme or
    for a scheme that acts elsewhere (``acts_on`` other than ``"bias"``). Add it to the scores before the softmax.
    """
    if inputs.position is None:
        return None
    return inputs.position.attention_bias(inputs.positions, k_pos, n_heads)


def masked_softmax(scores: Tensor, mask: PreparedMask, dropout_p: float = 0.0) -> Tensor:
    """Softmax over the keys of ``scores`` with the mask applied and dead rows set to all-zero probabilities.

    The dead-row guard for an attention with a score function of its own: ``probs @ v`` is then exactly 0 for a
    query that sees no key, never NaN.

    Args:
        scores: ``[batch, n_heads, q_len, kv_len]`` (bias already added); computed in float32.
        mask: from :func:`prepare_mask` / :meth:`PreparedMask.of`.
        dropout_p: probability of dropping a probability (training only: pass 0 in eval), scaled by
            ``1 / (1 - p)`` as in ``scaled_dot_product_attention``.

    Returns:
        ``[batch, n_heads, q_len, kv_len]`` float32 probabilities (rows sum to 1, or to 0 for dead rows, before
            dropout).
    """
    probs = torch.softmax(scores.float().masked_fill(~mask.allowed, float("-inf")), dim=-1) * mask.live.float()
    return nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs


def masked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Union[Tensor, PreparedMask],
    bias: Optional[Tensor] = None,
    scale: Optional[float] = None,
    *,
    eager: bool = False,
    dropout_p: float = 0.0,
    softcap: Optional[float] = None,
) -> tuple[Tensor, Optional[Tensor]]:
    """Scaled dot-product attention with a mask; rows with no visible key output exactly 0 (never NaN).

    Args:
        q: ``[batch, n_heads, q_len, head_dim]``; k, v: ``[batch, n_kv_heads, kv_len, head_dim]`` (``n_kv_heads``
            divides ``n_heads``; groups of ``n_heads / n_kv_heads`` query heads share a key/value head, GQA).
        mask: a bool ``[batch, 1 or n_heads, q_len, kv_len]`` (True = may attend) or a :class:`PreparedMask`.
        bias: additive float bias broadcastable to the scores (ALiBi), or ``None``.
        scale: multiplier of q·k; default ``head_dim ** -0.5``.
        eager: explicit float32 softmax (returns the weights) instead of ``scaled_dot_product_attention``.
        dropout_p: attention-probability dropout (training only: pass 0 in eval); the returned weights are the
            probabilities before dropout.
        softcap: map the scaled scores to ``softcap * tanh(scores / softcap)`` before the bias and the mask
            (Gemma 2's attention logit soft-capping, arXiv:2408.00118); needs ``eager`` (SDPA has no soft-cap).

    Raises:
        ValueError: ``softcap`` without ``eager``.

    Returns:
        ``(out [batch, n_heads, q_len, head_dim] in q's dtype, weights [batch, n_heads, q_len, kv_len] float32
            with eager, else None)``.
    """
    if softcap is not None and not eager:
        raise ValueError("softcap needs eager=True: scaled_dot_product_attention cannot soft-cap the scores")
    prepared = mask if isinstance(mask, PreparedMask) else PreparedMask.of(mask, q.dtype)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    rep = q.shape[1] // k.shape[1]
    if eager:
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + bias
        weights = masked_softmax(scores, prepared)
        probs = nn.functional.dropout(weights, dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(probs.to(v.dtype), v)
    else:
        weights = None
        attn_mask = prepared.additive if bias is None else bias.to(q.dtype) + prepared.additive
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=rep > 1
        )
    return out * prepared.live, weights
