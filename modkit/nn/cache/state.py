"""One token mixer's state in the cache (:class:`MixerCache`) and the slot metadata its per-token entries share
with the other mixers of the same slot count (:class:`SlotGroup`); see :mod:`modkit.nn.cache` for what ``append``
and ``update`` return in each mode.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from modkit.nn.cache.declarations import CacheSpec


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
    written with :meth:`write`. Per-block entries (``growth="block"``: ``max_len // block`` slots) belong to the
    mixer alone: it reads ``state[name]`` and writes the slots of the blocks a forward completes in place (slot
    ``j`` at the position-``j·block`` block of each row), since which blocks complete depends on each row's positions.

    Attributes:
        spec: the declaration. key: the mixer's path inside its block (``""`` when built from a bare layout).
        max_len: tokens per row of the cache (the slots of per-block entries are ``max_len // block``).
        group: the :class:`SlotGroup` of the per-token entries (``None`` when the mixer has none).
        window: the window of the per-token entries, or ``None``.
        tensors: ``{name: tensor}`` (``None`` values until allocated).
    """

    def __init__(self, spec: CacheSpec, group: Optional[SlotGroup], key: str = "", max_len: int = 0):
        self.spec, self.group, self.key, self.max_len = spec, group, key, int(max_len)
        self.window = spec.window
        self.tensors: dict[str, Optional[Tensor]] = {e.name: None for e in spec.entries}
        self._axis = {e.name: e.slot_axis for e in spec.token_entries}
        self._blocks = {e.name for e in spec.block_entries}

    def allocate(self, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate every entry (zeros) for ``batch`` rows: per-token ones with ``group.size`` slots, per-block ones
        with ``max_len // block``."""
        slots = self.group.size if self.group is not None else 0
        for e in self.spec.entries:
            n = e.block_slots(self.max_len) if e.per_block else slots
            self.tensors[e.name] = torch.zeros(e.allocated_shape(batch, n), dtype=e.dtype or dtype, device=device)

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
            raise ValueError(
                f"this mixer declared no per-token cache entry (its entries: {list(self.tensors)}); "
                "read and write per-sequence state with state[name] and state.write(name, value)"
            )
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
                raise KeyError(
                    f"cache entries {unknown} are not declared per-token entries of this mixer; "
                    f"its per-token entries: {list(self._axis)}"
                )
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
            raise KeyError(
                f"update(k, v, ...) needs per-token entries 'k' and 'v'; this mixer declared "
                f"{list(self.tensors)}: use append({{name: tensor}}, positions, valid)"
            )
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
        if name in self._axis or name not in self.tensors or name in self._blocks:
            kinds = {e.name: e.growth for e in self.spec.entries}
            raise KeyError(f"write({name!r}) needs a declared per-sequence entry; this mixer's entries: {kinds}")
        self[name].copy_(value)

    def reset(self) -> None:
        """Zero the per-sequence and per-block entries (per-token slots are forgotten through the slot validity)."""
        for e in (*self.spec.sequence_entries, *self.spec.block_entries):
            t = self.tensors[e.name]
            if t is not None:
                t.zero_()

    def nbytes(self) -> int:
        """Bytes of the tensors allocated (0 before allocation)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values() if t is not None)
