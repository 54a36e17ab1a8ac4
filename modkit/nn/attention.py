"""Helpers for writing an attention component: the mask, the dead-row guard and the KV-cache update.

An attention module is its projections and its score function; everything about *which* keys a query may see is
the same for every attention and lives here, so a plugin never has to copy it (copied mask code is where causality
leaks and NaN rows come from). The order inside ``forward(x, inputs)``::

    q, k, v = ...                                                    # projections, [batch, heads, seq, head_dim]
    if inputs.position is not None:
        q, k = inputs.position.rotate(q, k, inputs.positions)        # RoPE (identity for other schemes)
    k, v, k_pos, k_valid = update_cache(inputs, k, v, mixer=self)    # store new keys, get every visible key
    mask = prepare_mask(inputs, k_pos, k_valid, q.dtype, causal=True, window=None, mixer=self)
    bias = position_bias(inputs, k_pos, n_heads)                     # ALiBi (None for other schemes)
    out, _ = masked_attention(q, k, v, mask, bias, scale)            # softmax attention, dead rows -> 0
    # or, with a score function of your own:
    probs = masked_softmax(my_scores(q, k) + bias, mask)             # dead rows -> all-zero probabilities
    out = probs.to(v.dtype) @ v

* **The mask** is built from absolute positions (``q_pos >= k_pos``), so it is aligned bottom-right whenever the
  query is shorter than the keys (cached decode, chunked prefill); ``is_causal=True`` alone aligns top-left and is
  wrong there. Padding keys (``token_mask`` False, or cache slots not written yet) are hidden; a sliding window
  hides keys ``window`` or more positions back; chunked local attention (Llama 4) hides keys outside the query's
  fixed-size chunk of positions (``q_pos // chunk != k_pos // chunk``).
* **Attention sinks** (gpt-oss): a learned logit per head joins the softmax denominator and takes probability mass
  without contributing a value; :func:`masked_attention` and :func:`masked_softmax` take them as ``sinks``.
* **Dead rows.** A query that sees no key at all (a padding query whose keys are all padding, an all-padding row,
  the first chunk of a chunked prefill over left padding) would give ``softmax`` of all ``-inf``: NaN, which then
  spreads through the cache into every later token (pytorch #103749). :class:`PreparedMask` opens those rows
  everywhere (finite softmax) and ``live`` zeroes them, so they output exactly 0.
* **The cache** holds what the attention declares (``cache_spec()``: keys and values of ``n_kv_heads`` heads, never
  ``n_heads``: torchtune #38; or any named per-token entries, such as an MLA latent) and hands back every key the
  new queries may see, with their positions and validity (:func:`update_cache`, :func:`update_cache_entries`);
  see :mod:`modkit.nn.cache`.

References: Vaswani et al. 2017 (arXiv:1706.03762) for scaled dot-product attention; the layout follows
torchtune ``modules/attention.py`` and Hugging Face's ``sdpa_mask`` (bottom-right causal alignment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor, nn

from modkit.core.interfaces import AttentionInputs

__all__ = [
    "PreparedMask",
    "attention_mask",
    "is_plain_causal",
    "masked_attention",
    "masked_softmax",
    "position_bias",
    "prepare_mask",
    "shared_kv",
    "update_cache",
    "update_cache_entries",
]


def attention_mask(
    q_pos: Tensor,
    k_pos: Tensor,
    k_valid: Optional[Tensor] = None,
    causal: bool = True,
    window: Optional[int] = None,
    chunk: Optional[int] = None,
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
        chunk: chunked local attention: hide keys outside the query's chunk, ``k_pos // chunk != q_pos // chunk``
            (Llama 4's ``attention_chunk_size``; transformers ``chunked_overlay``, whose left-padding offset is
            already in positions that count real tokens only); ``None`` for none. Combines with ``window`` and
            ``causal``.
        q_doc, k_doc: ``[batch, q_len]`` / ``[batch, kv_len]`` int64 document index of each query and key, or
            ``None``: with both given, a query sees only keys of its own document (document-masked packing, as in
            Llama 3 and torchtitan's document mask); ``causal`` and ``window`` then apply within the document.

    Returns:
        ``[batch, 1, q_len, kv_len]`` bool. Query 2 of ``q_pos = [[0, 1, 2]]`` with causal and ``window = 2``
            sees keys 1 and 2 only; with ``chunk = 2`` instead it sees key 2 only (its chunk is positions 2-3).
    """
    diff = q_pos[:, :, None] - k_pos[:, None, :]
    mask = diff >= 0 if causal else torch.ones_like(diff, dtype=torch.bool)
    if window is not None:
        mask = mask & (diff < window) if causal else mask & (diff.abs() < window)
    if chunk is not None:
        q_chunk, k_chunk = (torch.div(p, chunk, rounding_mode="floor") for p in (q_pos, k_pos))
        mask = mask & (q_chunk[:, :, None] == k_chunk[:, None, :])
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


def update_cache(
    inputs: AttentionInputs, k: Tensor, v: Tensor, *, mixer: Optional[nn.Module] = None
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """Store the new keys and values in the layer's cache (if any) and return every key the new queries may see.

    The k/v form of :func:`update_cache_entries`, for an attention whose ``cache_spec()`` declares per-token
    entries ``"k"`` and ``"v"`` (:meth:`modkit.nn.cache.CacheSpec.kv`; also what an attention without ``cache_spec``
    gets).

    Args:
        inputs: the layer's :class:`~modkit.AttentionInputs` (``positions``, ``token_mask``, ``cache``).
        k, v: ``[batch, n_kv_heads, seq, head_dim]`` keys (already rotated by the position scheme) and values of
            the new tokens.
        mixer: the calling module (``mixer=self``), so that it finds its own state in a layer holding several
            mixers; optional in a layer with one.

    Returns:
        ``(k_all, v_all, k_pos, k_valid)``: keys and values ``[batch, n_kv_heads, kv_len, head_dim]`` in the
            dtype of ``k`` (a cache made in another dtype is cast back), their positions ``[batch, kv_len]`` and
            validity ``[batch, kv_len]`` bool (``None`` when every key is real). Without a cache: ``(k, v,
            inputs.positions, inputs.token_mask)``. Under context parallelism (``inputs.sequence``, no cache) the
            keys and values of the whole sequence, all-gathered from the ranks along ``seq`` (their gradients summed
            back to the rank that computed them), with the whole sequence's positions and validity. See
            :meth:`modkit.nn.cache.MixerCache.update` for ``kv_len``.
    """
    if inputs.cache is None:
        seq = inputs.sequence
        if seq is not None:  # context parallelism: this rank's queries attend to the whole sequence's keys
            out = seq.gather(k, 2), seq.gather(v, 2), seq.key_positions, seq.key_mask
        else:
            out = k, v, inputs.positions, inputs.token_mask
        return _publish(inputs, mixer, out)
    cache = inputs.cache.state(mixer)  # with one mixer in the layer, its state whatever `mixer` is
    k_all, v_all, k_pos, k_valid = cache.update(k, v, inputs.positions, inputs.token_mask)
    if k_all.dtype != k.dtype:  # a cache made in another dtype than the model
        k_all, v_all = k_all.to(k.dtype), v_all.to(v.dtype)
    return _publish(inputs, mixer, (k_all, v_all, k_pos, k_valid))


def _publish(inputs: AttentionInputs, mixer: Optional[nn.Module], out: tuple) -> tuple:
    """Leave ``out`` (what the new queries attend over) in ``inputs.shared_kv`` when ``mixer`` is the source of
    layers that read its keys and values (spec ``kv_sharing``, :mod:`modkit.nn.sharing`); returns ``out``."""
    source = getattr(mixer, "modkit_kv_publish", None)
    if source is not None and inputs.shared_kv is not None:
        inputs.shared_kv[source] = out
    return out


def shared_kv(inputs: AttentionInputs, mixer: nn.Module) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """The keys and values a reader layer attends over (spec ``kv_sharing``): what its source layer's
    :func:`update_cache` returned in this forward, ``(k_all, v_all, k_pos, k_valid)`` as there (its cache's whole
    content with a cache, so prefill and decode read what the source reads). Gemma 3n's
    ``num_kv_shared_layers``, transformers ``Gemma3nTextAttention``; YOCO (arXiv:2405.05254).

    Raises:
        RuntimeError: the source layer has not run in this forward (a reader called on its own, outside
            :meth:`modkit.Model.forward`).
    """
    source = mixer.modkit_kv_source
    found = inputs.shared_kv.get(source) if inputs.shared_kv is not None else None
    if found is None:
        raise RuntimeError(
            f"this attention reads the keys and values of layer {source} (spec kv_sharing), which did not run before "
            "it in this forward; run it inside the model's forward"
        )
    return found


def update_cache_entries(
    inputs: AttentionInputs, new: dict[str, Tensor], *, mixer: Optional[nn.Module] = None
) -> tuple[dict[str, Tensor], Tensor, Optional[Tensor]]:
    """Store the new tokens' values of any declared per-token cache entries and return everything they may see.

    What a mixer with its own cache layout calls (multi-head latent attention stores its latent and its rotated
    shared key side by side in one entry: ``update_cache_entries(inputs, {"latent": torch.cat([c, k_pe], -1)},
    mixer=self)``).

    Args:
        inputs: the layer's :class:`~modkit.AttentionInputs`.
        new: ``{name: tensor}`` for per-token entries the mixer's ``cache_spec()`` declares, each with the new
            tokens on the entry's slot axis (``[batch, seq, kv_lora_rank]`` for an entry with ``slot_axis = 1``).
        mixer: the calling module (``mixer=self``); optional in a layer with one mixer.

    Returns:
        ``(seen, k_pos, k_valid)``: ``{name: tensor}`` with ``kv_len`` on the slot axis, in the dtype of the
            tensor given (a cache made in another dtype is cast back), positions ``[batch, kv_len]`` and validity
            ``[batch, kv_len]`` bool (``None`` when every token is real). Without a cache: ``(new,
            inputs.positions, inputs.token_mask)``; under context parallelism (``inputs.sequence``) every token's
            entries, all-gathered along each entry's declared ``slot_axis`` (1 when the mixer declares none). See
            :meth:`modkit.nn.cache.MixerCache.append`.

    Raises:
        KeyError: a name the mixer did not declare as a per-token entry.
    """
    if inputs.cache is None:
        seq = inputs.sequence
        if seq is not None:  # context parallelism: every token's entries, gathered along their slot axis
            axes = _slot_axes(mixer)
            gathered = {n: seq.gather(t, axes.get(n, 1)) for n, t in new.items()}
            return gathered, seq.key_positions, seq.key_mask
        return dict(new), inputs.positions, inputs.token_mask
    cache = inputs.cache.state(mixer)  # with one mixer in the layer, its state whatever `mixer` is
    seen, k_pos, k_valid = cache.append(new, inputs.positions, inputs.token_mask)
    return {n: t if t.dtype == new[n].dtype else t.to(new[n].dtype) for n, t in seen.items()}, k_pos, k_valid


def _slot_axes(mixer: Optional[nn.Module]) -> dict[str, int]:
    """``{entry name: slot axis}`` of the per-token entries ``mixer.cache_spec()`` declares (empty without one)."""
    declare = getattr(mixer, "cache_spec", None)
    if not callable(declare):
        return {}
    return {e.name: e.slot_axis for e in declare().token_entries}


def prepare_mask(
    inputs: AttentionInputs,
    k_pos: Tensor,
    k_valid: Optional[Tensor],
    dtype: torch.dtype,
    *,
    causal: bool = True,
    window: Optional[int] = None,
    chunk: Optional[int] = None,
    mixer: Optional[nn.Module] = None,
) -> PreparedMask:
    """The :class:`PreparedMask` of the new queries (``inputs.positions``) over the keys ``k_pos`` / ``k_valid``.

    With a cache, the mask depends only on positions and validity, which every layer of a cache slot group shares
    within a forward: it is computed once and kept in the group's per-forward ``scratch`` dict (keyed by
    ``causal``, ``window``, ``chunk`` and ``dtype``, no tensor ids, so ``torch.compile`` installs no identity guard).
    With ``inputs.documents`` (document-masked packing, no cache) the mask also keeps each query inside its document
    and is kept in ``inputs.scratch``, so it is built once per forward. Under context parallelism
    (``inputs.sequence``) the local queries' mask over the whole sequence's keys (``sequence.key_documents`` on the
    key side), kept in ``inputs.scratch`` too.

    Raises:
        ValueError: ``inputs.documents`` together with a cache (or keys other than the new tokens').

    Args:
        inputs: the layer's :class:`~modkit.AttentionInputs`.
        k_pos, k_valid: from :func:`update_cache`.
        dtype: the query dtype (of ``PreparedMask.additive`` and ``live``).
        causal, window, chunk: as in :func:`attention_mask`.
        mixer: the calling module (``mixer=self``): in a layer holding several mixers, the mask is then shared
            through its own state's slot group (without it, it is computed for this call alone there).
    """
    scratch = _shared_scratch(inputs, mixer)
    docs = k_docs = inputs.documents
    seq = inputs.sequence
    if seq is not None:  # context parallelism: local queries over the whole sequence's keys, built once a forward
        scratch, k_docs = inputs.scratch, seq.key_documents
    elif docs is not None:
        if inputs.cache is not None or k_pos is not inputs.positions:
            raise ValueError(
                "document-masked attention needs the keys of the new tokens alone (no KV cache); "
                "drop the cache or the document ids"
            )
        scratch = inputs.scratch  # one forward's mask over its own keys: the same for every layer
    key = ("mask", causal, window, chunk, dtype)
    prepared = scratch.get(key) if scratch is not None else None
    if prepared is None:
        prepared = PreparedMask.of(
            attention_mask(inputs.positions, k_pos, k_valid, causal, window, chunk, docs, k_docs), dtype
        )
        if scratch is not None:
            scratch[key] = prepared
    return prepared


def _shared_scratch(inputs: AttentionInputs, mixer: Optional[nn.Module]) -> Optional[dict]:
    """The per-forward dict of the caller's slot group, where :func:`prepare_mask` keeps a mask for the other layers
    of the group; ``None`` without a cache, or in a layer of several mixers when the caller is not named (the mask
    is then computed for this call alone)."""
    cache = inputs.cache
    if cache is None or (mixer is None and len(getattr(cache, "mixers", ())) > 1):
        return None
    return cache.state(mixer).scratch


def is_plain_causal(inputs: AttentionInputs, k_pos: Tensor, k_valid: Optional[Tensor], bias: Optional[Tensor]) -> bool:
    """Whether SDPA's ``is_causal=True`` alone gives this layer's mask: the fast path's one shared condition.

    True only for one fresh sequence attending to itself: the keys are the queries' own tokens (``k_pos is
    inputs.positions``: no cache, or an empty one), every key is valid (``k_valid is None``), no additive position
    bias, and no document-masked packing (``inputs.documents is None``: with documents a token must not see the
    earlier documents of its row, which ``is_causal`` cannot express). A mixer adds its own conditions (a window, a
    chunk, sinks, a soft cap) on top. Every built-in attention asks this before taking the causal kernel, so a
    condition added to the inputs later is honoured by all of them at once.
    """
    return bias is None and k_valid is None and k_pos is inputs.positions and inputs.documents is None


def position_bias(inputs: AttentionInputs, k_pos: Tensor, n_heads: int) -> Optional[Tensor]:
    """The layer's additive position bias ``[batch, n_heads, q_len, kv_len]`` float32 (ALiBi), or ``None``.

    ``inputs.position.attention_bias(inputs.positions, k_pos, n_heads)``; ``None`` without a position scheme or
    for a scheme that acts elsewhere (``acts_on`` other than ``"bias"``). Add it to the scores before the softmax.
    """
    if inputs.position is None:
        return None
    return inputs.position.attention_bias(inputs.positions, k_pos, n_heads)


def masked_softmax(
    scores: Tensor, mask: PreparedMask, dropout_p: float = 0.0, sinks: Optional[Tensor] = None
) -> Tensor:
    """Softmax over the keys of ``scores`` with the mask applied and dead rows set to all-zero probabilities.

    The dead-row guard for an attention with a score function of its own: ``probs @ v`` is then exactly 0 for a
    query that sees no key, never NaN.

    Args:
        scores: ``[batch, n_heads, q_len, kv_len]`` (bias already added); computed in float32, or float64 for
            float64 scores (never below their own precision).
        mask: from :func:`prepare_mask` / :meth:`PreparedMask.of`.
        dropout_p: probability of dropping a probability (training only: pass 0 in eval), scaled by
            ``1 / (1 - p)`` as in ``scaled_dot_product_attention``.
        sinks: ``[n_heads]`` attention-sink logits, or ``None``. Each joins its head's softmax as one more column
            that every query sees, and is dropped afterwards: the probabilities of the keys then sum to
            ``1 - p_sink`` (gpt-oss; transformers ``GptOssAttention``'s eager path, which also subtracts the row
            maximum first, as ``softmax`` does).

    Returns:
        ``[batch, n_heads, q_len, kv_len]`` probabilities in that dtype (rows sum to 1, or ``1 - p_sink`` with
            sinks, or 0 for dead rows, before dropout).
    """
    dtype = torch.promote_types(scores.dtype, torch.float32)
    scores = scores.to(dtype).masked_fill(~mask.allowed, float("-inf"))
    if sinks is None:
        probs = torch.softmax(scores, dim=-1)
    else:
        b, h, q, _ = scores.shape
        column = sinks.to(dtype).view(1, h, 1, 1).expand(b, h, q, 1)
        probs = torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]
    probs = probs * mask.live.to(dtype)
    return nn.functional.dropout(probs, dropout_p) if dropout_p > 0 else probs


def _sink_column(
    k: Tensor, v: Tensor, attn_mask: Tensor, sinks: Tensor, q_shape: torch.Size
) -> tuple[Tensor, Tensor, Tensor]:
    """Keys and values with one zero column appended, and the additive mask with the sink logits as that column.

    ``q·0 = 0``, so the column's score is exactly its additive mask, the sink logit of the head; its value 0 adds
    nothing to the output. ``k [b, h_kv, kv, d] -> [b, h_kv, kv + 1, d]`` (``v`` likewise, at its own width); ``attn_mask [b, 1 or h, q, kv] ->
    [b, h, q, kv + 1]`` in the mask's dtype.
    """
    b, h, q_len, _ = q_shape
    zero = k.new_zeros(k.shape[0], k.shape[1], 1, k.shape[3])
    zero_v = v.new_zeros(v.shape[0], v.shape[1], 1, v.shape[3])  # the value width may differ (MiMo-V2-Flash)
    k, v = torch.cat([k, zero], dim=2), torch.cat([v, zero_v], dim=2)
    mask = attn_mask.expand(b, h, q_len, attn_mask.shape[-1])
    column = sinks.to(attn_mask.dtype).view(1, h, 1, 1).expand(b, h, q_len, 1)
    return k, v, torch.cat([mask, column], dim=-1)


# size: a public helper that third-party attentions call positionally and with these keywords; its arguments are the
# tensors and options of one formula, softmax(scale · q·kᵀ + bias + mask) · v
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
    sinks: Optional[Tensor] = None,
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
        sinks: ``[n_heads]`` attention-sink logits (gpt-oss), or ``None``: each head's softmax gets one more
            column, the sink logit, that takes probability mass and adds no value (:func:`masked_softmax`). The
            eager path appends it to the scores; the SDPA path appends a zero key (score 0), a zero value and the
            sink as that column's additive mask, which is the same softmax (the kernel then scores one more
            column per query). Dead rows still output 0.

    Raises:
        ValueError: ``softcap`` without ``eager``.

    Returns:
        ``(out [batch, n_heads, q_len, head_dim] in q's dtype, weights [batch, n_heads, q_len, kv_len] float32
            (float64 for float64 inputs) with eager, else None)``.
    """
    if softcap is not None and not eager:
        raise ValueError("softcap needs eager=True: scaled_dot_product_attention cannot soft-cap the scores")
    prepared = mask if isinstance(mask, PreparedMask) else PreparedMask.of(mask, q.dtype)
    scale = scale if scale is not None else q.shape[-1] ** -0.5
    rep = q.shape[1] // k.shape[1]
    if eager:
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        ft = torch.promote_types(q.dtype, torch.float32)  # float32 scores, float64 for float64 inputs
        scores = torch.matmul(q.to(ft), k.to(ft).transpose(-1, -2)) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        if bias is not None:
            scores = scores + bias
        weights = masked_softmax(scores, prepared, sinks=sinks)
        probs = nn.functional.dropout(weights, dropout_p) if dropout_p > 0 else weights
        out = torch.matmul(probs.to(v.dtype), v)
    else:
        weights = None
        attn_mask = prepared.additive if bias is None else bias.to(q.dtype) + prepared.additive
        if sinks is not None:
            k, v, attn_mask = _sink_column(k, v, attn_mask, sinks, q.shape)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale, enable_gqa=rep > 1
        )
    return out * prepared.live, weights
