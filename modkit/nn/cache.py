"""Static (preallocated) cache for prefill, chunked prefill and token-by-token decoding: each token mixer's
declared state.

**The contract.** A token mixer (an attention, a recurrent mixer) declares what it keeps between forwards with a
``cache_spec() -> CacheSpec`` method on its module: named :class:`CacheEntry` s, each either

* **per token** (``growth="token"``): one slot per token, e.g. keys ``[n_kv_heads, head_dim]`` or an MLA latent
  ``[kv_lora_rank]``; the slot axis goes where the entry says (``slot_axis``), so the built-in attention keeps its
  ``[batch, n_kv_heads, slots, head_dim]`` layout. A layer without a window has ``slots = max_len``; a
  sliding-window layer whose window ``W`` is shorter than ``max_len`` keeps a ring buffer of ``slots = W``;
* **per sequence** (``growth="sequence"``): a fixed-size state per row, whatever the number of tokens (a
  recurrent mixer's convolution window or SSM state), possibly in another dtype (float32 state).

The cache allocates exactly that (zeros), nothing else: ``[batch, *shape]`` with the slot axis inserted at
``slot_axis`` for per-token entries, ``[batch, *shape]`` for per-sequence ones, in the entry's dtype or the cache's.
Every byte figure (``modkit build``, ``modkit cost``, ``generate``'s memory check, the contract kit) comes from the
same declarations (:meth:`CacheSpec.bytes_per_token`, :meth:`CacheSpec.bytes_per_sequence`), and the kit checks
they equal what is allocated. A module without ``cache_spec`` but tagged ``attention`` and exposing
``n_kv_heads`` / ``head_dim`` gets keys and values (``CacheSpec.kv``), as before the contract existed.

**Where a mixer finds its state.** ``KVCache.layers[i]`` is a :class:`LayerKVCache`: one :class:`MixerCache` per
mixer of layer ``i``, keyed by the mixer's path inside its block (``"attention"``; a hybrid block holding an
attention and a recurrent mixer side by side, Falcon-H1 style, has two). The model tags each mixer module with that
key (``modkit_cache_key``) when it is built; in ``forward`` a mixer asks ``inputs.cache_for(self)`` (``None``
without a cache). A layer with one mixer also reads as that mixer's state (``layer.k``, ``layer.update(...)``), so
attentions written before the contract keep working.

**Reading and writing.** Per-token entries: :meth:`MixerCache.append` stores the new tokens' values of any named
entries and hands back every value the new tokens may attend to, with their positions and validity (the k/v form
:meth:`MixerCache.update` is ``append({"k": k, "v": v}, ...)``; :func:`modkit.nn.attention.update_cache` and
:func:`modkit.nn.attention.update_cache_entries` are the helpers mixers call). Per-sequence entries: read
``state["name"]`` (``[batch, *shape]``) and write it back with :meth:`MixerCache.write` (in place, static shapes);
they are zero in a new or :meth:`KVCache.reset` cache, and the mixer itself skips padding tokens
(``inputs.token_mask``) when it updates them.

**Slot metadata.** Next to the per-token entries, each *slot group* (mixers whose entries have the same number of
slots) holds the absolute position of every slot ``[batch, slots]`` int64 and whether it holds a real token
``[batch, slots]`` bool. Slots never written are invalid, so attention masks them whatever their (zero) position;
the causal mask is computed from positions, so it is aligned bottom-right whenever the query length differs from
the key length.

Write pointer. All rows of a batch share the slot index of a token (``write_pos``, a 0-d int64 tensor, so a
compiled decode step has static shapes and never recompiles per token); each row's next *position* is
``next_position [batch]``: left-padded rows have fewer real tokens, so their positions lag their slots.

What ``append`` / ``update`` return (per forward, decided once for all mixers of a slot group by
:meth:`KVCache.prepare`):

* ``fresh``: the cache was empty: the new values and the positions/validity passed in, unchanged (a prefill
  attends to itself only and may use a plain causal kernel);
* ``buffer``: a global layer, or a ring layer fed one token: the whole buffer after writing (unwritten slots
  invalid; the ring slot overwritten lies exactly ``W`` positions back, outside the window);
* ``concat``: a ring layer fed a chunk of several tokens: the old ring followed by the new chunk (so the chunk's
  first queries still see keys its later tokens overwrite, also when the chunk is longer than the window).

Bytes. :meth:`KVCache.nbytes` counts the entries allocated:
``batch · Σ_layers Σ_mixers (bytes_per_token · slots + bytes_per_sequence)`` with ``slots = max_len`` for global
layers and ``min(window, max_len)`` for windowed ones; for the built-in attention ``bytes_per_token`` is
``2 · n_kv_heads · head_dim · bytes(dtype)``. Slot metadata (positions and validity, 9 bytes per slot per group) is
reported apart by :meth:`KVCache.metadata_nbytes`.

Ring layers assume that padding only precedes a row's first real token (left padding): a padding token after a
real one would take a ring slot a real key needs; :meth:`KVCache.prepare` refuses that case in eager mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

#: How an entry grows: one slot per token, or one fixed-size state per sequence.
GROWTH = ("token", "sequence")


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
            ``"sequence"``: one fixed-size state per row.
        slot_axis: for per-token entries, the axis of the allocated tensor ``[batch, ...]`` that indexes slots
            (``1``: ``[batch, slots, *shape]``; the built-in keys use ``2``: ``[batch, n_kv_heads, slots,
            head_dim]``); between 1 and ``len(shape) + 1``. Ignored for per-sequence entries.
        dtype: the entry's dtype, or ``None`` for the cache's (the model's by default); a recurrent state may ask
            for ``torch.float32`` in a bfloat16 model.

    Raises:
        ValueError: an empty or non-identifier name, a non-positive size, an unknown growth, a slot axis out of
            range, or a dtype that is not floating (each names the value).
    """

    name: str
    shape: tuple[int, ...]
    growth: str = "token"
    slot_axis: int = 1
    dtype: Optional[torch.dtype] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"a cache entry's name must be an identifier such as 'k' or 'latent', got {self.name!r}")
        shape = tuple(self.shape) if isinstance(self.shape, (tuple, list, torch.Size)) else (self.shape,)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape):
            raise ValueError(f"cache entry {self.name!r}: shape must hold positive integers, got {self.shape!r}")
        object.__setattr__(self, "shape", tuple(int(n) for n in shape))
        if self.growth not in GROWTH:
            raise ValueError(f"cache entry {self.name!r}: growth must be 'token' or 'sequence', got {self.growth!r}")
        if self.growth == "token" and not 1 <= self.slot_axis <= len(shape) + 1:
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
    def numel(self) -> int:
        """Numbers per token (per-token entry) or per sequence (per-sequence entry)."""
        return math.prod(self.shape)

    def nbytes(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes per token or per sequence, in the entry's dtype or else ``dtype`` (the cache's)."""
        return self.numel * torch.empty((), dtype=self.dtype or _dtype(dtype), device="meta").element_size()

    def allocated_shape(self, batch: int, slots: int) -> tuple[int, ...]:
        """The shape the cache allocates for ``batch`` rows: ``[batch, *shape]`` with ``slots`` inserted at
        ``slot_axis`` for a per-token entry."""
        if not self.per_token:
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
    def sequence_entries(self) -> tuple[CacheEntry, ...]:
        """The per-sequence (fixed-size) entries."""
        return tuple(e for e in self.entries if not e.per_token)

    def slots(self, max_len: int) -> int:
        """Slots of the per-token entries in a cache of ``max_len``: ``min(window, max_len)`` or ``max_len``."""
        return min(self.window, max_len) if self.window is not None else max_len

    def bytes_per_token(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes one token adds: ``Σ`` per-token entries ``prod(shape) · bytes(entry dtype or dtype)``."""
        return sum(e.nbytes(dtype) for e in self.token_entries)

    def bytes_per_sequence(self, dtype: Union[str, torch.dtype]) -> int:
        """Bytes of the fixed-size state of one row: ``Σ`` per-sequence entries ``prod(shape) · bytes``."""
        return sum(e.nbytes(dtype) for e in self.sequence_entries)

    def nbytes(self, max_len: int, batch: int, dtype: Union[str, torch.dtype]) -> int:
        """Bytes a cache of ``batch`` rows and ``max_len`` tokens allocates for this mixer:
        ``batch · (bytes_per_token · slots(max_len) + bytes_per_sequence)``."""
        return batch * (self.bytes_per_token(dtype) * self.slots(max_len) + self.bytes_per_sequence(dtype))


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
    raise TypeError(f"a cache layout item is a LayerGeometry, a CacheSpec or {{key: CacheSpec}}, got {type(layout).__name__}")


class SlotGroup:
    """Slot metadata shared by the layers that have the same number of slots.

    Attributes:
        size: number of slots (``max_len``, or the window of ring layers).
        ring: whether slots are reused modulo ``size`` (window shorter than ``max_len``).
        positions: ``[batch, size]`` int64 absolute position of the key in each slot (0 where never written).
        valid: ``[batch, size]`` bool, True where a slot holds a real (non-padding) key.
        mode: what ``update`` returns in the current forward: ``"fresh"``, ``"buffer"`` or ``"concat"``.
        write_index: ``[n_write]`` int64 slots the current forward writes (its last ``n_write`` tokens).
        write_from: index of the first new token written (``seq - n_write``).
        view_positions, view_valid: key positions / validity returned by ``update`` in the current forward.
        scratch: a dict emptied at every forward, where attention modules may keep tensors derived only from
            this group's positions and validity (e.g. the mask), so the layers of a group compute them once.
    """

    def __init__(self, size: int, ring: bool):
        self.size, self.ring = size, ring
        self.positions: Optional[Tensor] = None
        self.valid: Optional[Tensor] = None
        self.mode = "fresh"
        self.write_index: Optional[Tensor] = None
        self.write_from = 0
        self.view_positions: Optional[Tensor] = None
        self.view_valid: Optional[Tensor] = None
        self.scratch: dict = {}

    def allocate(self, batch: int, device: torch.device) -> None:
        """Allocate ``positions`` and ``valid`` for ``batch`` rows, all slots invalid."""
        self.positions = torch.zeros(batch, self.size, dtype=torch.long, device=device)
        self.valid = torch.zeros(batch, self.size, dtype=torch.bool, device=device)

    def prepare(self, slots: Tensor, positions: Tensor, valid: Optional[Tensor], fresh: bool) -> None:
        """Record the new tokens' metadata and decide what ``update`` returns in this forward.

        Args:
            slots: ``[seq]`` int64 absolute slot indices of the new tokens (``write_pos + arange(seq)``).
            positions: ``[batch, seq]`` their positions. valid: ``[batch, seq]`` bool, or ``None`` (all real).
            fresh: nothing was written before this forward.
        """
        self.scratch = {}
        seq = slots.shape[0]
        n_write = min(seq, self.size)
        self.write_from = seq - n_write
        index = slots[self.write_from :] if self.write_from else slots
        self.write_index = index % self.size if self.ring else index
        if fresh:
            self.mode = "fresh"
        elif self.ring and seq > 1:
            self.mode = "concat"
            new_valid = valid if valid is not None else torch.ones_like(positions, dtype=torch.bool)
            self.view_positions = torch.cat([self.positions, positions], dim=1)
            self.view_valid = torch.cat([self.valid, new_valid], dim=1)
        else:
            self.mode = "buffer"
        pos_w = positions[:, self.write_from :] if self.write_from else positions
        self.positions.index_copy_(1, self.write_index, pos_w)
        if valid is None:
            self.valid.index_fill_(1, self.write_index, True)
        else:
            self.valid.index_copy_(1, self.write_index, valid[:, self.write_from :] if self.write_from else valid)
        if self.mode == "buffer":
            self.view_positions, self.view_valid = self.positions, self.valid


class MixerCache:
    """One token mixer's state in one layer: the tensors of its :class:`CacheSpec`.

    A mixer gets it with ``inputs.cache_for(self)`` (see the module docstring). Per-token entries are written with
    :meth:`append` (or :meth:`update` for keys and values), per-sequence entries read with ``state[name]`` and
    written with :meth:`write`.

    Attributes:
        spec: the declaration. key: the mixer's path inside its block (``""`` when built from a bare layout).
        group: the :class:`SlotGroup` of the per-token entries (``None`` when the mixer has none).
        window: the window of the per-token entries, or ``None``.
        tensors: ``{name: tensor}`` (``None`` values until allocated).
    """

    def __init__(self, spec: CacheSpec, group: Optional[SlotGroup], key: str = ""):
        self.spec, self.group, self.key = spec, group, key
        self.window = spec.window
        self.tensors: dict[str, Optional[Tensor]] = {e.name: None for e in spec.entries}
        self._axis = {e.name: e.slot_axis for e in spec.token_entries}

    def allocate(self, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate every entry (zeros) for ``batch`` rows: per-token ones with ``group.size`` slots."""
        slots = self.group.size if self.group is not None else 0
        for e in self.spec.entries:
            self.tensors[e.name] = torch.zeros(e.allocated_shape(batch, slots), dtype=e.dtype or dtype, device=device)

    def state(self, mixer: Any = None) -> "MixerCache":
        """This state itself (so a :class:`MixerCache` may stand where a :class:`LayerKVCache` is expected)."""
        return self

    def __getitem__(self, name: str) -> Tensor:
        """The allocated tensor of entry ``name``.

        Raises:
            KeyError: no such entry (names the declared ones). RuntimeError: not allocated yet.
        """
        if name not in self.tensors:
            raise KeyError(f"this mixer declared no cache entry {name!r}; its entries: {list(self.tensors)}")
        t = self.tensors[name]
        if t is None:
            raise RuntimeError("this cache is not allocated yet; pass it to model(..., cache=cache) first")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    @property
    def k(self) -> Optional[Tensor]:
        """The ``"k"`` entry (keys ``[batch, n_kv_heads, slots, head_dim]`` of a k/v attention), or ``None``."""
        return self.tensors.get("k")

    @property
    def v(self) -> Optional[Tensor]:
        """The ``"v"`` entry, or ``None``."""
        return self.tensors.get("v")

    @property
    def scratch(self) -> dict:
        """Per-forward dict shared by the mixers of this slot group (see :class:`SlotGroup`); ``{}`` without one."""
        return self.group.scratch if self.group is not None else {}

    @property
    def slots(self) -> int:
        """Slots of the per-token entries (``max_len``, or the window for a ring); 0 without per-token entries."""
        return self.group.size if self.group is not None else 0

    def _group(self) -> SlotGroup:
        if self.group is None:
            raise ValueError(f"this mixer declared no per-token cache entry (its entries: {list(self.tensors)}); "
                             "read and write per-sequence state with state[name] and state.write(name, value)")
        return self.group

    def _put(self, name: str, x: Tensor, g: SlotGroup) -> Tensor:
        """Write the new tokens ``x`` of entry ``name`` and return what the new tokens see of it."""
        buf = self.tensors[name]
        if buf is None:
            raise RuntimeError("this cache is not allocated yet; pass it to model(..., cache=cache) first")
        axis = self._axis[name]
        if x.dtype != buf.dtype:
            x = x.to(buf.dtype)
        if g.mode == "concat":
            seen = torch.cat([buf, x], dim=axis)
        x_w = x.narrow(axis, g.write_from, x.shape[axis] - g.write_from) if g.write_from else x
        buf.index_copy_(axis, g.write_index, x_w)
        if g.mode == "fresh":
            return x
        return buf if g.mode == "buffer" else seen

    def append(
        self, new: Mapping[str, Tensor], positions: Tensor, valid: Optional[Tensor] = None
    ) -> tuple[dict[str, Tensor], Tensor, Optional[Tensor]]:
        """Store the new tokens' values of per-token entries and return everything the new tokens may attend to.

        Args:
            new: ``{name: tensor}`` for declared per-token entries, each shaped like the allocated entry with
                ``seq`` (the new tokens) on its slot axis: an MLA latent ``[batch, seq, kv_lora_rank]``, keys
                ``[batch, n_kv_heads, seq, head_dim]``.
            positions: ``[batch, seq]`` their positions (``AttentionInputs.positions``).
            valid: ``[batch, seq]`` bool, False for padding (``AttentionInputs.token_mask``; ``None``: all real).
                Positions and validity are recorded once per forward by :meth:`KVCache.prepare`; these two are
                only handed back in the ``fresh`` case.

        Returns:
            ``(seen, positions_all, valid_all)``: ``{name: tensor}`` in the cache dtype with ``kv_len`` on the slot
                axis (``seq`` for a fresh cache, the slot count, or ``window + seq`` for a ring fed a chunk; see
                the module docstring), ``[batch, kv_len]`` positions and validity (``valid_all`` is ``None`` only
                when every returned token is real).

        Raises:
            KeyError: a name that is not a declared per-token entry (eager mode). ValueError: the mixer has no
            per-token entry. RuntimeError: the cache was not allocated.
        """
        g = self._group()
        if not torch.compiler.is_compiling():
            unknown = [n for n in new if n not in self._axis]
            if unknown:
                raise KeyError(f"cache entries {unknown} are not declared per-token entries of this mixer; "
                               f"its per-token entries: {list(self._axis)}")
        seen = {name: self._put(name, x, g) for name, x in new.items()}
        if g.mode == "fresh":
            return seen, positions, valid
        return seen, g.view_positions, g.view_valid

    def update(
        self, k: Tensor, v: Tensor, positions: Tensor, valid: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """Store the new keys/values (entries ``"k"`` and ``"v"``) and return every key the new queries may see.

        ``append({"k": k, "v": v}, positions, valid)`` in the tuple form attention modules use.

        Args:
            k, v: ``[batch, n_kv_heads, seq, head_dim]`` keys (already rotated by RoPE) and values of the new tokens.
            positions, valid: as in :meth:`append`.

        Returns:
            ``(k_all, v_all, positions_all, valid_all)``: ``[batch, n_kv_heads, kv_len, head_dim]`` keys and
                values in the cache dtype, ``[batch, kv_len]`` positions and validity.

        Raises:
            RuntimeError: the cache was not allocated. KeyError: the mixer declared no ``"k"`` / ``"v"`` entries.
        """
        if "k" not in self._axis or "v" not in self._axis:
            raise KeyError(f"update(k, v, ...) needs per-token entries 'k' and 'v'; this mixer declared "
                           f"{list(self.tensors)}: use append({{name: tensor}}, positions, valid)")
        g = self._group()
        k_all, v_all = self._put("k", k, g), self._put("v", v, g)
        if g.mode == "fresh":
            return k_all, v_all, positions, valid
        return k_all, v_all, g.view_positions, g.view_valid

    def write(self, name: str, value: Tensor) -> None:
        """Overwrite the per-sequence entry ``name`` with ``value`` (``[batch, *shape]``; cast to its dtype), in place.

        Raises:
            KeyError: not a declared per-sequence entry. RuntimeError: not allocated.
        """
        if name in self._axis or name not in self.tensors:
            kinds = {e.name: e.growth for e in self.spec.entries}
            raise KeyError(f"write({name!r}) needs a declared per-sequence entry; this mixer's entries: {kinds}")
        self[name].copy_(value)

    def reset(self) -> None:
        """Zero the per-sequence entries (per-token slots are forgotten through the slot validity)."""
        for e in self.spec.sequence_entries:
            t = self.tensors[e.name]
            if t is not None:
                t.zero_()

    def nbytes(self) -> int:
        """Bytes of the tensors allocated (0 before allocation)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values() if t is not None)


class LayerKVCache:
    """One layer's cache: the :class:`MixerCache` of every token mixer the layer holds, by mixer key.

    What ``AttentionInputs.cache`` holds inside a layer. A mixer finds its own state with :meth:`state` (through
    ``inputs.cache_for(self)``). A layer with a single mixer (every layer but a hybrid's) also reads as that
    mixer's state: ``k``, ``v``, ``group``, ``window``, ``scratch``, ``slots``, :meth:`update` and :meth:`append`
    delegate to it, which is how attentions written before mixers declared their state use the cache.

    Attributes:
        mixers: ``{mixer key: MixerCache}`` in the block's module order.
    """

    def __init__(self, mixers: Mapping[str, MixerCache]):
        self.mixers = dict(mixers)
        self._only = next(iter(self.mixers.values())) if len(self.mixers) == 1 else None

    def state(self, mixer: Any = None) -> MixerCache:
        """The state of ``mixer`` (a module tagged with ``modkit_cache_key``, or the key itself); with one mixer
        in the layer, that one whatever ``mixer`` is.

        Raises:
            KeyError: several mixers and ``mixer`` names none of them (lists the keys and the fix).
        """
        if self._only is not None:
            return self._only
        key = mixer if isinstance(mixer, str) else getattr(mixer, "modkit_cache_key", None)
        if key not in self.mixers:
            raise KeyError(
                f"this layer's cache holds {len(self.mixers)} mixers ({', '.join(map(repr, self.mixers))}), and "
                f"{key!r} is none of them; a mixer in a layer with several asks for its own state with "
                "inputs.cache_for(self) (or passes mixer=self to modkit.nn.attention.update_cache)"
            )
        return self.mixers[key]

    @property
    def only(self) -> MixerCache:
        """The layer's single mixer state (raises ``KeyError`` when it holds several)."""
        return self._only if self._only is not None else self.state(None)

    @property
    def k(self) -> Optional[Tensor]:
        """The single mixer's ``"k"`` entry (see :attr:`MixerCache.k`)."""
        return self.only.k

    @property
    def v(self) -> Optional[Tensor]:
        """The single mixer's ``"v"`` entry."""
        return self.only.v

    @property
    def group(self) -> Optional[SlotGroup]:
        """The single mixer's slot group."""
        return self.only.group

    @property
    def window(self) -> Optional[int]:
        """The single mixer's window."""
        return self.only.window

    @property
    def spec(self) -> CacheSpec:
        """The single mixer's declaration."""
        return self.only.spec

    @property
    def scratch(self) -> Optional[dict]:
        """Per-forward dict of the single mixer's slot group (see :class:`SlotGroup`); ``None`` in a layer with
        several mixers (ask the mixer's own state: ``inputs.cache_for(self).scratch``)."""
        return self._only.scratch if self._only is not None else None

    @property
    def slots(self) -> int:
        """Slots of the single mixer's per-token entries."""
        return self.only.slots

    def update(self, k: Tensor, v: Tensor, positions: Tensor, valid: Optional[Tensor] = None):
        """:meth:`MixerCache.update` of the single mixer."""
        return self.only.update(k, v, positions, valid)

    def append(self, new: Mapping[str, Tensor], positions: Tensor, valid: Optional[Tensor] = None):
        """:meth:`MixerCache.append` of the single mixer."""
        return self.only.append(new, positions, valid)

    def allocate(self, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate every mixer's entries."""
        for m in self.mixers.values():
            m.allocate(batch, dtype, device)

    def reset(self) -> None:
        """Zero every mixer's per-sequence entries."""
        for m in self.mixers.values():
            m.reset()

    def nbytes(self) -> int:
        """Bytes of every mixer's tensors allocated (0 before allocation)."""
        return sum(m.nbytes() for m in self.mixers.values())


class KVCache:
    """A model's static cache: one :class:`LayerKVCache` per layer, preallocated for ``batch_size × max_len``.

    Create with :meth:`modkit.nn.model.Model.new_cache` and pass to ``model(input_ids, cache=cache)``; every forward
    appends its tokens (prefill, chunks, or one token at a time). A new generation needs a fresh cache (or
    :meth:`reset`): state never leaks between calls (litgpt #1596, torchtune #959).

    Args:
        layers: the layout, one item per layer: a :class:`LayerGeometry` (keys and values), a mixer's
            :class:`CacheSpec`, or ``{mixer key: CacheSpec}`` (what :meth:`Model.cache_layout` returns).
        max_len, batch_size, dtype, device: see the attributes.

    Attributes:
        layers: one :class:`LayerKVCache` per model layer.
        layout: ``[{mixer key: CacheSpec}]`` per layer: the declarations the cache was allocated from.
        groups: the :class:`SlotGroup` s (one per distinct slot count of per-token entries).
        max_len: slots of global layers: the most tokens (prompt + generated, padding included) one row may hold.
        batch_size: rows; ``None`` until the first forward when created without one.
        dtype, device: of the entries (an entry may declare its own dtype).
        write_pos: ``[]`` int64 tensor, the slot the next token is written to (= tokens written so far).
        next_position: ``[batch]`` int64 tensor, the position each row's next real token takes.
        seen_tokens: host-side copy of ``write_pos`` kept by eager forwards (and by :func:`modkit.inference.generate`'s
            compiled decode); a forward traced by ``torch.compile`` does not update it. Used for error messages.

    Raises:
        ValueError: ``max_len`` or ``batch_size`` below 1, an unknown dtype. TypeError: a bad layout item.
    """

    def __init__(
        self,
        layers: Sequence[LayerLayout],
        max_len: int,
        batch_size: Optional[int] = None,
        *,
        dtype: Union[str, torch.dtype] = torch.float32,
        device: Union[str, torch.device, None] = None,
    ):
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.max_len = int(max_len)
        self.dtype = _dtype(dtype)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        groups: dict[int, SlotGroup] = {}
        self.layers: list[LayerKVCache] = []
        self.layout: list[dict[str, CacheSpec]] = []
        for item in layers:
            specs = layer_specs(item)
            mixers = {}
            for key, spec in specs.items():
                group = None
                if spec.token_entries:
                    size = spec.slots(self.max_len)
                    group = groups.setdefault(size, SlotGroup(size, size < self.max_len))
                mixers[key] = MixerCache(spec, group, key)
            self.layers.append(LayerKVCache(mixers))
            self.layout.append(specs)
        self.groups = list(groups.values())
        self.batch_size: Optional[int] = None
        self.write_pos = torch.zeros((), dtype=torch.long, device=self.device)
        self.next_position: Optional[Tensor] = None
        self.seen_tokens = 0
        self.empty = True
        if batch_size is not None:
            self.allocate(batch_size)

    # ------------------------------------------------------------------ allocation
    def allocate(self, batch_size: int) -> None:
        """Allocate every buffer for ``batch_size`` rows (done by the constructor when it is given one)."""
        self.batch_size = int(batch_size)
        for g in self.groups:
            g.allocate(self.batch_size, self.device)
        for layer in self.layers:
            layer.allocate(self.batch_size, self.dtype, self.device)
        self.next_position = torch.zeros(self.batch_size, dtype=torch.long, device=self.device)

    def reset(self) -> None:
        """Forget every stored token and zero every per-sequence state (buffers stay allocated): as new."""
        self.write_pos.zero_()
        self.seen_tokens = 0
        self.empty = True
        if self.next_position is not None:
            self.next_position.zero_()
        for g in self.groups:
            if g.valid is not None:
                g.valid.zero_()
                g.positions.zero_()
        for layer in self.layers:
            layer.reset()

    # ------------------------------------------------------------------ per forward
    def prepare(
        self, batch: int, seq: int, token_mask: Optional[Tensor] = None, positions: Optional[Tensor] = None
    ) -> tuple[Tensor, Optional[Tensor]]:
        """Start a forward of ``seq`` new tokens: positions, slot metadata and the write pointer.

        Called once by :meth:`Model.forward` before the layers run (allocates on first use when the cache was
        created without a batch size).

        Args:
            batch, seq: shape of the new tokens.
            token_mask: ``[batch, seq]`` bool, False for padding, or ``None`` (all real).
            positions: ``[batch, seq]`` explicit positions, or ``None``: each row continues from
                ``next_position`` counting only its real tokens (left padding shifts them, as in a full forward).

        Returns:
            ``(positions [batch, seq] int64, token_mask)``.

        Raises:
            ValueError: the batch size differs from the cache's, the tokens do not fit in ``max_len`` slots, or a
                padding token follows a real one while a layer keeps a ring buffer (checked in eager mode only).
        """
        eager = not torch.compiler.is_compiling()
        if self.batch_size is None:
            self.allocate(batch)
        if eager:
            if batch != self.batch_size:
                raise ValueError(f"this cache holds batch_size = {self.batch_size} rows, got a batch of {batch}")
            if self.seen_tokens + seq > self.max_len:
                raise ValueError(
                    f"the KV cache is full: it holds {self.seen_tokens} of max_len = {self.max_len} tokens and "
                    f"{seq} more were given; create it with a larger max_len (model.new_cache(batch_size, max_len))"
                )
            if token_mask is not None and any(g.ring for g in self.groups):
                after_real = token_mask.long().cummax(-1).values.bool() | (self.next_position > 0)[:, None]
                if bool((after_real & ~token_mask).any()):
                    raise ValueError(
                        "a padding token follows a real token while a sliding-window layer keeps a ring buffer of "
                        "window slots; pad on the left only"
                    )
        device = self.write_pos.device
        steps = torch.arange(seq, device=device)
        if positions is None:
            if token_mask is None:
                positions = self.next_position[:, None] + steps
                self.next_position.add_(seq)
            else:
                positions = (self.next_position[:, None] + token_mask.long().cumsum(-1) - 1).clamp(min=0)
                self.next_position.add_(token_mask.long().sum(-1))
        else:
            self.next_position.copy_(positions[:, -1] + 1)
        slots = self.write_pos + steps
        for g in self.groups:
            g.prepare(slots, positions, token_mask, self.empty)
        self.write_pos.add_(seq)
        self.empty = False
        if eager:
            self.seen_tokens += seq
        return positions, token_mask

    # ------------------------------------------------------------------ reporting
    def __len__(self) -> int:
        return len(self.layers)

    def nbytes(self) -> int:
        """Bytes of every entry allocated (the formula is in the module docstring)."""
        return sum(layer.nbytes() for layer in self.layers)

    def declared_nbytes(self, batch_size: Optional[int] = None) -> int:
        """Bytes the layout declares for ``batch_size`` rows (default the cache's): ``Σ CacheSpec.nbytes``; equals
        :meth:`nbytes` once allocated (the contract kit checks it)."""
        batch = batch_size if batch_size is not None else (self.batch_size or 0)
        return sum(spec.nbytes(self.max_len, batch, self.dtype) for specs in self.layout for spec in specs.values())

    def metadata_nbytes(self) -> int:
        """Bytes of the slot metadata (positions int64 and validity bool per slot group) and the pointers."""
        total = self.write_pos.numel() * self.write_pos.element_size()
        if self.next_position is not None:
            total += self.next_position.numel() * self.next_position.element_size()
        for g in self.groups:
            if g.positions is not None:
                total += g.positions.numel() * g.positions.element_size() + g.valid.numel() * g.valid.element_size()
        return total

    def __repr__(self) -> str:
        groups = ", ".join(f"{'ring' if g.ring else 'global'}×{g.size}" for g in self.groups)
        return (
            f"KVCache(layers={len(self.layers)}, batch_size={self.batch_size}, max_len={self.max_len}, "
            f"dtype={str(self.dtype).replace('torch.', '')}, slots=[{groups}], seen_tokens={self.seen_tokens}, "
            f"nbytes={self.nbytes()})"
        )
