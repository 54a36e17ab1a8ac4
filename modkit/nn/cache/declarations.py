"""What a token mixer declares it keeps in the cache: :class:`CacheSpec`, a set of named :class:`CacheEntry` s
(the contract of :mod:`modkit.nn.cache`), and the byte counts every report reads from those declarations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Union

import torch

#: How an entry grows: one slot per token, one slot per completed block of ``block`` tokens, or one fixed-size state
#: per sequence.
GROWTH = ("token", "block", "sequence")


def _dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        out = dtype
    else:
        out = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise ValueError(f"unknown cache dtype {dtype!r}; use float32, bfloat16 or float16")
    return out


@dataclass(frozen=True)
class CacheEntry:
    """One named tensor a token mixer keeps in the cache (an item of :class:`CacheSpec`).

    Attributes:
        name: the entry's name, unique within its mixer (``"k"``, ``"latent"``, ``"ssm"``).
        shape: per token (``growth="token"``) or per sequence (``growth="sequence"``), batch and slot axes
            excluded: keys ``(n_kv_heads, head_dim)``, an MLA latent ``(kv_lora_rank,)``, an SSM state
            ``(n_heads, head_dim, d_state)``.
        growth: ``"token"``: one slot per token (``max_len`` slots, or ``min(window, max_len)`` in a ring);
            ``"block"``: one slot per completed block of ``block`` positions (``max_len // block`` slots; slot ``j``
            holds what the mixer made of positions ``[j·block, (j + 1)·block)``, written by the mixer itself once
            the block's last position arrives, and visible by position: a query at ``t`` may read slots
            ``j < (t + 1) // block``; compressed attention); ``"sequence"``: one fixed-size state per row.
        slot_axis: for per-token and per-block entries, the axis of the allocated tensor ``[batch, ...]`` that indexes slots
            (``1``: ``[batch, slots, *shape]``; the built-in keys use ``2``: ``[batch, n_kv_heads, slots,
            head_dim]``); between 1 and ``len(shape) + 1``. Ignored for per-sequence entries.
        dtype: the entry's dtype, or ``None`` for the cache's (the model's by default); a recurrent state may ask
            for ``torch.float32`` in a bfloat16 model.
        block: positions per slot of a ``growth="block"`` entry (DeepSeek-V4: 4 or 128); ``None`` otherwise.

    Raises:
        ValueError: an empty or non-identifier name, a non-positive size, an unknown growth, a slot axis out of
            range, a dtype that is not floating, or a block size missing (growth "block"), below 1 or given for
            another growth (each names the value).
    """

    name: str
    shape: tuple[int, ...]
    growth: str = "token"
    slot_axis: int = 1
    dtype: Optional[torch.dtype] = None
    block: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a cache entry's name must be an identifier such as 'k' or 'latent', got {self.name!r}")
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list, torch.Size)) else (self.shape,)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
            raise ValueError(f"cache entry {self.name!r}: shape must hold positive integers, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        if self.growth not in GROWTH:
            raise ValueError(
                f"cache entry {self.name!r}: growth must be 'token', 'block' or 'sequence', got {self.growth!r}"
            )
        if (self.growth == "block") != (self.block is not None) or (
            self.block is not None
            and (isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1)
        ):
            raise ValueError(
                f"cache entry {self.name!r}: block = {self.block!r} with growth {self.growth!r}; a 'block' entry needs "
                "block >= 1 (positions per slot), the other growths none"
            )
        if self.growth != "sequence" and not 1 <= self.slot_axis <= len(shape) + 1:
            raise ValueError(
                f"cache entry {self.name!r}: slot_axis = {self.slot_axis} is outside [1, {len(shape) + 1}] for a "
                f"[batch, ...] tensor of {len(shape) + 1} axes plus the slot axis (1 puts slots right after batch)"
            )
        if self.dtype is not None:
            object.__setattr__(self, "dtype", _dtype(self.dtype))

    @property
    def per_token(self) -> bool:
        """Whether the entry has one slot per token (``growth == "token"``)."""
        return self.growth == "token"

    @property
    def per_block(self) -> bool:
        """Whether the entry has one slot per completed block of ``block`` positions (``growth == "block"``)."""
        return self.growth == "block"

    def block_slots(self, max_len: int) -> int:
        """Slots of a per-block entry in a cache of ``max_len`` tokens: ``max_len // block`` (complete blocks)."""
        return int(max_len) // int(self.block)

    @property
    def numel(self) -> int:
        """Numbers per token (per-token entry) or per sequence (per-sequence entry)."""
        return math.prod(self.shape)

    def nbytes(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes per token or per sequence, in the entry's dtype or else ``dtype`` (the cache's)."""
        return self.numel * torch.empty((), dtype=self.dtype or _dtype(dtype), device="meta").element_size()

    def allocated_shape(self, batch: int, slots: int) -> tuple[int, ...]:
        """The shape the cache allocates for ``batch`` rows: ``[batch, *shape]`` with ``slots`` inserted at
        ``slot_axis`` for a per-token or per-block entry (``slots`` counts blocks for the latter)."""
        if self.growth == "sequence":
            return (batch, *self.shape)
        axis = self.slot_axis - 1
        return (batch, *self.shape[:axis], slots, *self.shape[axis:])


@dataclass(frozen=True)
class CacheSpec:
    """What one token mixer keeps in the cache: its entries, and the window of its per-token entries.

    Returned by a mixer module's ``cache_spec()`` (the contract of :mod:`modkit.nn.cache`).

    Attributes:
        entries: the :class:`CacheEntry` s (names unique).
        window: the sliding window in positions of the per-token entries, or ``None`` (global): a window below
            the cache's ``max_len`` makes them a ring buffer of ``window`` slots.

    Raises:
        ValueError: duplicate names, a non-entry item, or a window below 1.
    """

    entries: tuple[CacheEntry, ...]
    window: Optional[int] = None

    def __post_init__(self) -> None:
        entries = tuple(self.entries)
        bad = [e for e in entries if not isinstance(e, CacheEntry)]
        if bad:
            raise ValueError(f"a CacheSpec holds CacheEntry items, got {type(bad[0]).__name__}")
        names = [e.name for e in entries]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"cache entry names must be unique within a mixer; repeated: {dup}")
        if self.window is not None and (isinstance(self.window, bool) or int(self.window) < 1):
            raise ValueError(f"a cache window must be >= 1 position or None, got {self.window!r}")
        object.__setattr__(self, "entries", entries)

    @classmethod
    def kv(cls, n_kv_heads: int, head_dim: int, window: Optional[int] = None) -> "CacheSpec":
        """Keys and values ``[batch, n_kv_heads, slots, head_dim]`` each (the built-in attention's layout)."""
        shape = (int(n_kv_heads), int(head_dim))
        return cls((CacheEntry("k", shape, slot_axis=2), CacheEntry("v", shape, slot_axis=2)), window)

    @property
    def token_entries(self) -> tuple[CacheEntry, ...]:
        """The per-token entries."""
        return tuple(e for e in self.entries if e.per_token)

    @property
    def block_entries(self) -> tuple[CacheEntry, ...]:
        """The per-block entries (one slot per completed block of ``entry.block`` positions)."""
        return tuple(e for e in self.entries if e.per_block)

    @property
    def sequence_entries(self) -> tuple[CacheEntry, ...]:
        """The per-sequence (fixed-size) entries."""
        return tuple(e for e in self.entries if e.growth == "sequence")

    def slots(self, max_len: int) -> int:
        """Slots of the per-token entries in a cache of ``max_len``: ``min(window, max_len)`` or ``max_len``."""
        return min(self.window, max_len) if self.window is not None else max_len

    def bytes_per_token(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes one token adds, as the declarations give them: ``Σ`` per-token entries ``prod(shape) · bytes(entry
        dtype or dtype)`` plus ``Σ`` per-block entries ``prod(shape) · bytes / block`` (a block entry adds its slot
        once per ``block`` tokens; rounded up to a whole byte where ``block`` does not divide it, so the exact
        size at a length is :meth:`nbytes`)."""
        blocks = sum(-(-e.nbytes(dtype) // e.block) for e in self.block_entries)
        return sum(e.nbytes(dtype) for e in self.token_entries) + blocks

    def bytes_per_block_slots(self, max_len: int, dtype: Union[str, torch.dtype]) -> int:
        """Bytes of the per-block entries of one row in a cache of ``max_len``: ``Σ prod(shape) · bytes ·
        (max_len // block)``."""
        return sum(e.nbytes(dtype) * e.block_slots(max_len) for e in self.block_entries)

    def bytes_per_sequence(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes of the fixed-size state of one row: ``Σ`` per-sequence entries ``prod(shape) · bytes``."""
        return sum(e.nbytes(dtype) for e in self.sequence_entries)

    def nbytes(self, max_len: int, batch: int, dtype: Union[str, torch.dtype]) -> int:
        """Bytes a cache of ``batch`` rows and ``max_len`` tokens allocates for this mixer:
        ``batch · (Σ_token-entries bytes · slots(max_len) + Σ_block-entries bytes · (max_len // block) +
        bytes_per_sequence)``."""
        tokens = sum(e.nbytes(dtype) for e in self.token_entries) * self.slots(max_len)
        return batch * (tokens + self.bytes_per_block_slots(max_len, dtype) + self.bytes_per_sequence(dtype))


@dataclass(frozen=True)
class LayerGeometry:
    """The key/value geometry of one layer's attention (the form of a cache layout before mixers declared
    their state; :meth:`cache_spec` turns it into keys and values).

    Attributes:
        n_kv_heads: key/value heads stored (``attention.n_kv_heads``).
        head_dim: width of one key/value head (``attention.head_dim``).
        window: the layer's sliding window in positions, or ``None`` for global attention.
    """

    n_kv_heads: int
    head_dim: int
    window: Optional[int] = None

    def cache_spec(self) -> CacheSpec:
        """``CacheSpec.kv(n_kv_heads, head_dim, window)``."""
        return CacheSpec.kv(self.n_kv_heads, self.head_dim, self.window)


#: One layer of a cache layout: a :class:`LayerGeometry` (keys and values), one mixer's :class:`CacheSpec`, or
#: ``{mixer key: CacheSpec}`` for a layer holding several mixers.
LayerLayout = Union[LayerGeometry, CacheSpec, Mapping[str, CacheSpec]]


def layer_specs(layout: LayerLayout) -> dict[str, CacheSpec]:
    """``{mixer key: CacheSpec}`` of one layer of a layout (key ``""`` for a single unnamed mixer).

    Raises:
        TypeError: an item of another type.
    """
    if isinstance(layout, LayerGeometry):
        return {"": layout.cache_spec()}
    if isinstance(layout, CacheSpec):
        return {"": layout}
    if isinstance(layout, Mapping) and all(isinstance(v, CacheSpec) for v in layout.values()):
        return dict(layout)
    raise TypeError(
        f"a cache layout item is a LayerGeometry, a CacheSpec or {{key: CacheSpec}}, got {type(layout).__name__}"
    )
