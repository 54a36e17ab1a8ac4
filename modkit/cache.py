"""KV cache for incremental decoding.

Keys and values are stored per layer as ``[batch, n_kv_heads, length, head_dim]`` (never ``n_heads``;
torchtune #38), together with the absolute position of every stored key, so attention can align the causal
mask bottom-right and apply sliding windows by position, whatever the query length.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


class LayerKVCache:
    """One layer's cache. Grows by concatenation; :meth:`update` returns everything stored so far.

    Attributes:
        k, v: ``[batch, n_kv_heads, length, head_dim]`` or ``None`` before the first update.
        positions: ``[batch, length]`` int64 positions of the stored keys.
        valid: ``[batch, length]`` bool, False for padding keys.
        window: if set, only the last ``window`` keys are kept (sliding-window layers).
    """

    def __init__(self, window: Optional[int] = None):
        self.window = window
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.positions: Optional[Tensor] = None
        self.valid: Optional[Tensor] = None

    def update(
        self, k: Tensor, v: Tensor, positions: Tensor, valid: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Append ``k, v [batch, n_kv_heads, new, head_dim]`` at ``positions [batch, new]``.

        Args:
            valid: ``[batch, new]`` bool, False for padding tokens; ``None`` means all real.

        Returns:
            ``(k_all, v_all, positions_all, valid_all)`` including the new entries (before window trimming,
            so the current queries see every key they need).
        """
        if valid is None:
            valid = torch.ones(positions.shape, dtype=torch.bool, device=positions.device)
        if self.k is None:
            k_all, v_all, p_all, m_all = k, v, positions, valid
        else:
            k_all = torch.cat([self.k, k], dim=2)
            v_all = torch.cat([self.v, v], dim=2)
            p_all = torch.cat([self.positions, positions], dim=1)
            m_all = torch.cat([self.valid, valid], dim=1)
        w = self.window
        if w is not None and k_all.shape[2] > w:
            self.k, self.v, self.positions, self.valid = k_all[:, :, -w:], v_all[:, :, -w:], p_all[:, -w:], m_all[:, -w:]
        else:
            self.k, self.v, self.positions, self.valid = k_all, v_all, p_all, m_all
        return k_all, v_all, p_all, m_all

    @property
    def length(self) -> int:
        """Number of key positions stored."""
        return 0 if self.k is None else self.k.shape[2]

    def nbytes(self) -> int:
        """Bytes held by the stored keys and values."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


class KVCache:
    """A model's cache: one :class:`LayerKVCache` per layer.

    Create with :meth:`modkit.model.Model.new_cache`; pass it to ``model(..., cache=cache)``. A fresh cache
    must be used for each new generation (state never leaks between calls).
    """

    def __init__(self, n_layers: int, windows: Optional[list[Optional[int]]] = None):
        windows = windows or [None] * n_layers
        self.layers = [LayerKVCache(w) for w in windows]
        self.seen_tokens = 0
        self.mask: Optional[Tensor] = None

    def __len__(self) -> int:
        return len(self.layers)

    def nbytes(self) -> int:
        """Total bytes of keys and values stored."""
        return sum(layer.nbytes() for layer in self.layers)
