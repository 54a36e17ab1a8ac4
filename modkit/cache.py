"""Static (preallocated) KV cache for prefill, chunked prefill and token-by-token decoding.

Layout. Every layer stores keys and values as ``[batch, n_kv_heads, slots, head_dim]`` (``n_kv_heads``, never
``n_heads``: torchtune #38) in one dtype (the model's by default). A global layer has ``slots = max_len``; a
sliding-window layer whose window ``W`` is shorter than ``max_len`` keeps a ring buffer of ``slots = W``.
Next to the keys, each *slot group* (layers with the same number of slots) holds the absolute position of every
slot ``[batch, slots]`` int64 and whether it holds a real key ``[batch, slots]`` bool. Slots never written are
invalid, so attention masks them whatever their (zero) position; the causal mask is computed from positions, so it
is aligned bottom-right whenever the query length differs from the key length.

Write pointer. All rows of a batch share the slot index of a token (``write_pos``, a 0-d int64 tensor, so a
compiled decode step has static shapes and never recompiles per token); each row's next *position* is
``next_position [batch]``: left-padded rows have fewer real tokens, so their positions lag their slots.

What ``update`` returns (per forward, decided once for all layers of a slot group by :meth:`KVCache.prepare`):

* ``fresh``: the cache was empty: the new ``k, v`` and the positions/validity passed in, unchanged (a prefill
  attends to itself only and may use a plain causal kernel);
* ``buffer``: a global layer, or a ring layer fed one token: the whole buffer after writing (unwritten slots
  invalid; the ring slot overwritten lies exactly ``W`` positions back, outside the window);
* ``concat``: a ring layer fed a chunk of several tokens: the old ring followed by the new chunk (so the chunk's
  first queries still see keys its later tokens overwrite, also when the chunk is longer than the window).

Bytes. :meth:`KVCache.nbytes` counts the key and value tensors allocated:
``batch · bytes(dtype) · Σ_layers 2 · n_kv_heads · head_dim · slots`` with ``slots = max_len`` for global layers and
``min(window, max_len)`` for windowed ones; for a model without windows that is
``modkit.kv_cache_bytes_per_token(model, dtype) · max_len · batch``. Slot metadata (positions and validity,
9 bytes per slot per group) is reported apart by :meth:`KVCache.metadata_nbytes`.

Ring layers assume that padding only precedes a row's first real token (left padding): a padding token after a
real one would take a ring slot a real key needs; :meth:`KVCache.prepare` refuses that case in eager mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import Tensor


@dataclass(frozen=True)
class LayerGeometry:
    """What the cache needs to know about one layer's attention.

    Attributes:
        n_kv_heads: key/value heads stored (``attention.n_kv_heads``).
        head_dim: width of one key/value head (``attention.head_dim``).
        window: the layer's sliding window in positions, or ``None`` for global attention.
    """

    n_kv_heads: int
    head_dim: int
    window: Optional[int] = None


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


class LayerKVCache:
    """One layer's keys and values; :meth:`update` is what attention modules call.

    Attributes:
        k, v: ``[batch, n_kv_heads, slots, head_dim]`` buffers in the cache dtype (``None`` until allocated).
        window: the layer's sliding window, or ``None``.
        group: the :class:`SlotGroup` holding this layer's slot positions and validity.
    """

    def __init__(self, geometry: LayerGeometry, group: SlotGroup):
        self.geometry = geometry
        self.window = geometry.window
        self.group = group
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None

    def allocate(self, batch: int, dtype: torch.dtype, device: torch.device) -> None:
        """Allocate ``k`` and ``v`` (zeros) for ``batch`` rows."""
        shape = (batch, self.geometry.n_kv_heads, self.group.size, self.geometry.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    @property
    def scratch(self) -> dict:
        """Per-forward dict shared by the layers of this slot group (see :class:`SlotGroup`)."""
        return self.group.scratch

    @property
    def slots(self) -> int:
        """Number of key slots held (``max_len``, or the window for a ring layer)."""
        return self.group.size

    def update(
        self, k: Tensor, v: Tensor, positions: Tensor, valid: Optional[Tensor] = None
    ) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
        """Store the new keys/values and return every key the new queries may attend to.

        Args:
            k, v: ``[batch, n_kv_heads, seq, head_dim]`` keys (already rotated by RoPE) and values of the new tokens.
            positions: ``[batch, seq]`` their positions: the ``AttentionInputs.positions`` of this forward.
            valid: ``[batch, seq]`` bool, False for padding: the ``AttentionInputs.token_mask`` (``None``: all real).
                Positions and validity are recorded once per forward by :meth:`KVCache.prepare`; these two
                arguments are only handed back in the ``fresh`` case.

        Returns:
            ``(k_all, v_all, positions_all, valid_all)``: ``[batch, n_kv_heads, kv_len, head_dim]`` keys and
                values in the cache dtype, ``[batch, kv_len]`` positions and validity (``valid_all`` is ``None``
                only when every returned key is real). ``kv_len`` is ``seq`` (fresh cache), the number of slots, or
                ``window + seq`` (ring layer fed a chunk); see the module docstring.

        Raises:
            RuntimeError: the cache was not allocated (use it through ``model(..., cache=cache)``).
        """
        if self.k is None:
            raise RuntimeError("this KV cache is not allocated yet; pass it to model(..., cache=cache) first")
        g = self.group
        if k.dtype != self.k.dtype:
            k, v = k.to(self.k.dtype), v.to(self.v.dtype)
        if g.mode == "concat":
            k_all, v_all = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        k_w = k[:, :, g.write_from :] if g.write_from else k
        v_w = v[:, :, g.write_from :] if g.write_from else v
        self.k.index_copy_(2, g.write_index, k_w)
        self.v.index_copy_(2, g.write_index, v_w)
        if g.mode == "fresh":
            return k, v, positions, valid
        if g.mode == "buffer":
            return self.k, self.v, g.view_positions, g.view_valid
        return k_all, v_all, g.view_positions, g.view_valid

    def nbytes(self) -> int:
        """Bytes of the key and value buffers allocated (0 before allocation)."""
        if self.k is None:
            return 0
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()


def _dtype(dtype: Union[str, torch.dtype]) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    out = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise ValueError(f"unknown cache dtype {dtype!r}; use float32, bfloat16 or float16")
    return out


class KVCache:
    """A model's static KV cache: one :class:`LayerKVCache` per layer, preallocated for ``batch_size × max_len``.

    Create with :meth:`modkit.model.Model.new_cache` and pass to ``model(input_ids, cache=cache)``; every forward
    appends its tokens (prefill, chunks, or one token at a time). A new generation needs a fresh cache (or
    :meth:`reset`): state never leaks between calls (litgpt #1596, torchtune #959).

    Attributes:
        layers: one :class:`LayerKVCache` per model layer.
        groups: the :class:`SlotGroup` s (one per distinct slot count).
        max_len: slots of global layers: the most tokens (prompt + generated, padding included) one row may hold.
        batch_size: rows; ``None`` until the first forward when created without one.
        dtype, device: of the key/value buffers.
        write_pos: ``[]`` int64 tensor, the slot the next token is written to (= tokens written so far).
        next_position: ``[batch]`` int64 tensor, the position each row's next real token takes.
        seen_tokens: host-side copy of ``write_pos`` kept by eager forwards (and by :func:`modkit.generate`'s
            compiled decode); a forward traced by ``torch.compile`` does not update it. Used for error messages.
    """

    def __init__(
        self,
        layers: list[LayerGeometry],
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
        for geo in layers:
            ring = geo.window is not None and geo.window < self.max_len
            size = geo.window if ring else self.max_len
            group = groups.setdefault(size, SlotGroup(size, ring))
            self.layers.append(LayerKVCache(geo, group))
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
        """Forget every stored token (buffers stay allocated): the cache is as new."""
        self.write_pos.zero_()
        self.seen_tokens = 0
        self.empty = True
        if self.next_position is not None:
            self.next_position.zero_()
        for g in self.groups:
            if g.valid is not None:
                g.valid.zero_()
                g.positions.zero_()

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
        """Bytes of the key and value buffers allocated (the formula is in the module docstring)."""
        return sum(layer.nbytes() for layer in self.layers)

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
