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
  or after it (Gated DeltaNet, Falcon-H1's ``mamba_norm_before_gate``), statistics per group of channels.

References: Gu & Dao 2023, Mamba (arXiv:2312.00752) §3.4 (the short convolution); Dao & Gu 2024, Transformers are
SSMs (arXiv:2405.21060) §7 (Mamba-2's block: gated RMSNorm, groups); Yang et al. 2024, Gated Delta Networks
(arXiv:2412.06464); transformers ``causal_conv1d_fn`` / ``causal_conv1d_update`` and ``MambaRMSNormGated`` (read,
not copied) for the cache layout and the norm.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from modkit.nn.cache import MixerCache

__all__ = ["GatedRMSNorm", "causal_conv", "padding_mask", "zero_padding"]


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


def causal_conv(x: Tensor, conv: nn.Conv1d, state: Optional[MixerCache] = None, name: str = "conv") -> Tensor:
    """Depthwise causal convolution of ``x [batch, seq, channels]`` along the sequence, continuing the cached window.

    ``y_t = bias + Σ_{j<K} w_j · x_{t-K+1+j}`` per channel (kernel ``K = conv.kernel_size[0]``), with the inputs before
    the first token taken from the cache entry ``name`` (``[batch, channels, K - 1]``: the last ``K - 1`` inputs of
    the previous forwards; zeros in a new cache) or zeros without a cache. With a cache the entry is overwritten
    with the last ``K - 1`` inputs of ``[window, x]`` (in place), so calling this on chunks of a sequence equals
    calling it once on the whole.

    Args:
        x: ``[batch, seq, channels]`` (padding tokens already zeroed, see :func:`zero_padding`).
        conv: an ``nn.Conv1d(channels, channels, K, groups=channels)`` without padding (its weight ``[channels, 1,
            K]``, bias ``[channels]`` or ``None``).
        state: the mixer's cache state, or ``None``.
        name: the per-sequence entry holding the window.

    Returns:
        ``[batch, seq, channels]`` in ``x``'s dtype, before any activation (FLOPs, as ``FlopCounterMode`` counts
            the convolution, ``2 · batch · seq · channels · K``).
    """
    b, s, c = x.shape
    k = conv.kernel_size[0]
    xt = x.transpose(1, 2)  # [b, c, s]
    if state is not None:
        window = state[name]
        full = torch.cat([window.to(xt.dtype), xt], dim=-1)  # [b, c, K - 1 + s]
        state.write(name, full[:, :, full.shape[-1] - (k - 1) :])
    else:
        full = nn.functional.pad(xt, (k - 1, 0))
    w = conv.weight
    out = nn.functional.conv1d(full.to(w.dtype), w, conv.bias, groups=c)  # [b, c, s]
    return out.transpose(1, 2).to(x.dtype)


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
