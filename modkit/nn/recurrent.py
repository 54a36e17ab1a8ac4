"""Helpers for writing a recurrent token mixer: the short causal convolution with its cached window, padding, and the
gated RMSNorm of Mamba-2 and Gated DeltaNet.

A recurrent mixer (a state-space or linear-attention layer) is a ``mixer`` component: ``forward(x [batch, seq,
d_model], inputs) -> [batch, seq, d_model]``, like an attention. It keeps a **fixed-size state per sequence** between
forwards (:mod:`modkit.nn.cache`): it declares it with ``cache_spec()`` as ``growth="sequence"`` entries, finds it with
``inputs.cache_for(self)`` (``None`` without a cache), reads ``state[name]`` and writes it back with
``state.write(name, value)``. Its memory per sequence is then constant in the context length. What is the same
for every such mixer lives here:

* :func:`causal_conv`: a depthwise causal convolution of kernel ``d_conv`` over the sequence (Mamba's ``conv1d``),
  continuing from the last ``d_conv - 1`` inputs the cache keeps (entry shape ``(channels, d_conv - 1)``), so a
  prefill in chunks, or one token at a time, gives the full forward's numbers;
* :func:`padding_mask` / :func:`zero_padding`: padding tokens (``inputs.token_mask`` False) must not change the state:
  the mixer zeroes their inputs (the convolution then sees zeros, as at the start of a sequence) and their step
  sizes (no decay, no write), which makes left padding exact;
* :class:`GatedRMSNorm`: RMSNorm of the scan output gated by ``silu(z)``, the gate applied before the norm (Mamba-2)
  or after it (Gated DeltaNet, Falcon-H1's ``mamba_norm_before_gate``), statistics per group of channels;
* document boundaries (document-masked packing, ``inputs.documents``): :func:`document_starts` flags the first token
  of every document after the first; :func:`causal_conv` given the flags takes no input from before a token's
  document; a scan zeroes the decay into a start token (the state entering a document is zero), with
  :func:`chunk_boundaries` giving a chunked form the masks that do it without ``-inf`` in its cumulative sums. This
  is what the reference kernels do with a per-token sequence index (mamba_ssm's ``seq_idx``) or cumulative sequence
  lengths (flash-linear-attention's ``cu_seqlens``): every document of a packed row is computed as if it ran alone.

References: Gu & Dao 2023, Mamba (arXiv:2312.00752) §3.4 (the short convolution); Dao & Gu 2024, Transformers are
SSMs (arXiv:2405.21060) §7 (Mamba-2's block: gated RMSNorm, groups); Yang et al. 2024, Gated Delta Networks
(arXiv:2412.06464); transformers ``causal_conv1d_fn`` / ``causal_conv1d_update`` and ``MambaRMSNormGated`` (read,
not copied) for the cache layout and the norm; mamba_ssm's ``seq_idx`` (``mamba_chunk_scan_combined``,
``causal_conv1d_fn``) and flash-linear-attention's ``cu_seqlens`` (read, not copied) for the document boundaries.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor, nn

from modkit.nn.cache import MixerCache

__all__ = [
    "RECURRENT_CAPABILITIES",
    "ChunkBoundaries",
    "GatedRMSNorm",
    "causal_conv",
    "chunk_boundaries",
    "document_starts",
    "padding_mask",
    "zero_padding",
]


#: The registry capabilities every built-in recurrent mixer declares (a plugin spreads it into its entry's
#: ``capabilities``, adding its own such as ``overflow_prone``): causal, a cache (its fixed-size state), compilable,
#: restarted at document starts, and no context parallelism, since a shard of the sequence would start from a zero
#: state (there is no cross-rank scan).
RECURRENT_CAPABILITIES = {
    "causal_safe": True,
    "kv_cache": True,
    "compile_safe": True,
    "document_mask": True,
    "context_parallel": False,
}


def padding_mask(token_mask: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """``token_mask [batch, seq]`` bool (False = padding) as ``[batch, seq, 1]`` of ``dtype`` (1 real, 0 padding), or
    ``None`` when every token is real."""
    return None if token_mask is None else token_mask[..., None].to(dtype)


def zero_padding(x: Tensor, mask: Optional[Tensor]) -> Tensor:
    """``x [batch, seq, ...]`` with the padding tokens' values set to 0 (``mask`` from :func:`padding_mask`; ``x``
    unchanged when it is ``None``). Extra trailing axes of ``x`` broadcast."""
    if mask is None:
        return x
    while mask.dim() < x.dim():
        mask = mask[..., None]
    return x * mask


def document_starts(documents: Optional[Tensor]) -> Optional[Tensor]:
    """Where a new document starts inside a packed row: ``[batch, seq]`` bool from ``documents [batch, seq]`` int64
    (:func:`modkit.nn.documents.document_ids`), or ``None`` when ``documents`` is ``None``.

    True at a token whose document id differs from the previous token's: the state and the convolution window a
    recurrent mixer carries must restart there. The first token of the call is False: it continues whatever state
    the call starts from (zeros without a cache; a cached state belongs to the call's first document, as an initial
    state belongs to the first sequence of flash-linear-attention's ``cu_seqlens``).
    """
    if documents is None:
        return None
    starts = torch.zeros_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return starts


def causal_conv(
    x: Tensor,
    conv: nn.Conv1d,
    state: Optional[MixerCache] = None,
    name: str = "conv",
    starts: Optional[Tensor] = None,
) -> Tensor:
    """Depthwise causal convolution of ``x [batch, seq, channels]`` along the sequence, continuing the cached window.

    ``y_t = bias + Σ_{j<K} w_j · x_{t-K+1+j}`` per channel (kernel ``K = conv.kernel_size[0]``), with the inputs before
    the first token taken from the cache entry ``name`` (``[batch, channels, K - 1]``: the last ``K - 1`` inputs of
    the previous forwards; zeros in a new cache) or zeros without a cache. With a cache the entry is overwritten
    with the last ``K - 1`` inputs of ``[window, x]`` (in place), so calling this on chunks of a sequence equals
    calling it once on the whole.

    With ``starts`` (document boundaries) a tap that reaches before the first token of the output token's document
    reads 0, as if the document began the sequence: ``y_t = bias + Σ_j w_j · x_{t-K+1+j} · [t-K+1+j ≥ s_t]`` with
    ``s_t`` the last start at or before ``t`` (mamba_ssm's ``causal_conv1d_fn(..., seq_idx)`` does the same). The
    window kept in the cache then holds the last ``K - 1`` inputs of the last document, zeros before its start, so
    the next call (whose first token continues that document) reads nothing of the previous one either. Computed as
    a masked sum over the ``K`` taps instead of ``conv1d``: the same numbers up to summation order. ``starts = None``
    takes the ``conv1d`` path and keeps the raw last ``K - 1`` inputs.

    Args:
        x: ``[batch, seq, channels]`` (padding tokens already zeroed, see :func:`zero_padding`).
        conv: an ``nn.Conv1d(channels, channels, K, groups=channels)`` without padding (its weight ``[channels, 1,
            K]``, bias ``[channels]`` or ``None``).
        state: the mixer's cache state, or ``None``.
        name: the per-sequence entry holding the window.
        starts: ``[batch, seq]`` bool, True at the first token of a document (:func:`document_starts`; a True at
            position 0 also drops the cached window), or ``None``.

    Returns:
        ``[batch, seq, channels]`` in ``x``'s dtype, before any activation (FLOPs, as ``FlopCounterMode`` counts
            the convolution, ``2 · batch · seq · channels · K``; the masked sum is element-wise).
    """
    b, s, c = x.shape
    k = conv.kernel_size[0]
    xt = x.transpose(1, 2)  # [b, c, s]
    if state is not None:
        window = state[name]
        full = torch.cat([window.to(xt.dtype), xt], dim=-1)  # [b, c, K - 1 + s]
        kept = full[:, :, full.shape[-1] - (k - 1) :]
        state.write(name, kept if starts is None else _document_window(kept, starts, k))
    else:
        full = nn.functional.pad(xt, (k - 1, 0))
    w = conv.weight
    if starts is None:
        out = nn.functional.conv1d(full.to(w.dtype), w, conv.bias, groups=c)  # [b, c, s]
        return out.transpose(1, 2).to(x.dtype)
    taps = full.to(w.dtype).unfold(-1, k, 1)  # [b, c, s, K]: tap j of token t reads x_{t-K+1+j}
    since = _since_start(starts, k)  # [b, s]: tokens since the document's first one (>= K - 1 when none started)
    back = torch.arange(k - 1, -1, -1, device=x.device)  # tap j reaches K - 1 - j tokens back
    keep = (back <= since[..., None]).to(w.dtype)  # [b, s, K]
    out = (taps * keep[:, None] * w[:, 0][:, None, :]).sum(-1)  # [b, c, s]
    if conv.bias is not None:
        out = out + conv.bias[:, None]
    return out.transpose(1, 2).to(x.dtype)


def _document_window(kept: Tensor, starts: Tensor, k: int) -> Tensor:
    """``kept [batch, channels, K - 1]`` (the last ``K - 1`` inputs of ``[window, x]``, token ``s - K + 1 + j`` at
    ``j``) with the entries before each row's last document start zeroed (all of the old window when the call's first
    token starts a document)."""
    s = starts.shape[-1]
    index = torch.arange(s, device=starts.device).expand_as(starts)
    last = torch.where(starts, index, torch.full_like(index, -k)).amax(-1)  # [b]: -K when no start
    at = torch.arange(s - k + 1, s, device=starts.device)  # the token index of each kept entry (< 0: old window)
    return kept * (at[None, :] >= last[:, None])[:, None, :].to(kept.dtype)


def _since_start(starts: Tensor, k: int) -> Tensor:
    """``[batch, seq]`` int64: ``t - s_t`` with ``s_t`` the last start at or before ``t``; ``t + K`` when there is
    none (every tap of the window is then the document's own, cached or zero)."""
    index = torch.arange(starts.shape[-1], device=starts.device).expand_as(starts)
    last = torch.where(starts, index, torch.full_like(index, -k)).cummax(-1).values
    return index - last


class ChunkBoundaries(NamedTuple):
    """Masks (1 = no document start in the range, 0 = a start in it) that a chunked scan multiplies its decays by, so
    that no state crosses a document boundary: for chunk ``c`` of ``L`` tokens (token ``i`` of the chunk, ``c0`` its
    first token), the decays are products over ranges of tokens, and a range holding a start has decay 0.

    Attributes:
        same: ``[batch, chunks, L, L]``, ``(i, j)``: no start in ``(j, i]`` (the decay from token ``j`` to ``i``).
        from_start: ``[batch, chunks, L]``: no start in ``[c0, i]`` (the entering state reaches token ``i``).
        to_end: ``[batch, chunks, L]``: no start in ``(i, c0 + L - 1]`` (token ``i``'s write reaches the chunk's end).
        whole: ``[batch, chunks]``: no start in the chunk (the entering state passes through it).
    """

    same: Tensor
    from_start: Tensor
    to_end: Tensor
    whole: Tensor


def chunk_boundaries(starts: Tensor, chunk: int, dtype: torch.dtype) -> ChunkBoundaries:
    """The :class:`ChunkBoundaries` of ``starts [batch, T]`` bool (:func:`document_starts`; a True at position 0 drops
    the state the call starts from) cut into chunks of ``chunk`` tokens (``T`` padded at the end to whole chunks: the
    padding belongs to the last document), as ``dtype`` 0/1 masks.

    Setting the log decay of a start token to ``-inf`` would give ``-inf - (-inf)`` in the chunk's cumulative sums;
    masking the products instead is exact. With segment ids ``seg = cumsum(starts)``, a range ``(j, i]`` holds no start
    iff ``seg_i = seg_j``. Source: mamba_ssm's ``seq_idx`` masks in the chunked SSD kernels (read, not copied).
    """
    b, T = starts.shape
    nc = -(-T // chunk)
    seg = nn.functional.pad(starts.long(), (0, nc * chunk - T)).cumsum(-1).view(b, nc, chunk)
    before = torch.cat([seg.new_zeros(b, 1), seg[:, :-1, -1]], dim=1)  # seg of the token before each chunk
    end = seg[..., -1]
    return ChunkBoundaries(
        (seg[..., :, None] == seg[..., None, :]).to(dtype),
        (seg == before[..., None]).to(dtype),
        (seg == end[..., None]).to(dtype),
        (end == before).to(dtype),
    )


class GatedRMSNorm(nn.Module):
    """RMSNorm of ``x`` gated by ``silu(z)``, per group of channels: ``[..., dim], [..., dim] -> [..., dim]``.

    * gate first (``norm_before_gate=False``, Mamba-2): ``w ⊙ RMSNorm_g(x ⊙ silu(z))``;
    * norm first (``norm_before_gate=True``, Gated DeltaNet, Falcon-H1): ``(w ⊙ RMSNorm_g(x)) ⊙ silu(z)``;

    where ``RMSNorm_g`` divides each group of ``group_size`` consecutive channels by its own root mean square
    (``rsqrt(mean(h²) + eps)``; one group of ``dim`` channels by default). Computed in float32, returned in ``x``'s
    dtype. ``weight [dim]`` starts at 1.

    Source: Dao & Gu 2024 (arXiv:2405.21060) §7.3 and transformers ``MambaRMSNormGated`` (gate first, groups);
    Yang et al. 2024 (arXiv:2412.06464) and transformers ``Qwen3NextRMSNormGated`` (norm first).

    Raises:
        ValueError: ``group_size`` does not divide ``dim``.
    """

    param_roles = {"weight": "norm_gain"}

    def __init__(self, dim: int, eps: float, *, group_size: Optional[int] = None, norm_before_gate: bool = False):
        super().__init__()
        group_size = group_size or dim
        if dim % group_size:
            raise ValueError(f"gated RMSNorm: group_size = {group_size} does not divide dim = {dim}")
        self.dim, self.eps, self.group_size, self.norm_before_gate = dim, float(eps), group_size, norm_before_gate
        self.weight = nn.Parameter(torch.empty(dim))

    def init_weights(self, init) -> None:
        """``weight = 1``."""
        init.ones_(self.weight)

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        """``x, z [..., dim]`` → ``[..., dim]`` in ``x``'s dtype."""
        h = x.float()
        gate = nn.functional.silu(z.float())
        if not self.norm_before_gate:
            h = h * gate
        shape = h.shape
        g = h.view(*shape[:-1], shape[-1] // self.group_size, self.group_size)
        g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
        h = g.view(shape) * self.weight.float()
        if self.norm_before_gate:
            h = h * gate
        return h.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.dim}, group_size={self.group_size}, eps={self.eps}, norm_before_gate={self.norm_before_gate}"
