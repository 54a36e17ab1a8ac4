"""A layer's cache (:class:`LayerKVCache`: the :class:`~modkit.nn.cache.state.MixerCache` of each of its token
mixers) and a model's (:class:`KVCache`: one per layer, the slot groups and the write pointer).
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from modkit.nn.cache.declarations import CacheSpec, LayerLayout, _dtype, layer_specs
from modkit.nn.cache.state import MixerCache, SlotGroup


#: members of :class:`LayerKVCache` that warned already (each warns once per process)
_warned: set[str] = set()


class _SingleMixerAlias:
    """A deprecated member of :class:`LayerKVCache` standing for the member of the same name of the layer's single
    mixer state (:attr:`LayerKVCache.only`): a property reads it, a method is its bound method.

    The first use in a process warns (:class:`DeprecationWarning` naming the replacement); the member goes in
    modkit 0.3. In a layer holding several mixers it raises as :attr:`LayerKVCache.only` does (``KeyError``),
    unless ``several`` gives the value to return there (``scratch`` reads ``None``).
    """

    _RAISE = object()

    def __init__(self, doc: str, several: Any = _RAISE):
        self.__doc__ = doc
        self.several = several
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, layer: Optional["LayerKVCache"], owner: type) -> Any:
        if layer is None:
            return self
        if self.name not in _warned:
            _warned.add(self.name)
            warnings.warn(
                f"LayerKVCache.{self.name} is deprecated and goes in modkit 0.3: use the mixer's own state, "
                f"MixerCache.{self.name} (inputs.cache_for(self).{self.name} in a mixer, "
                f"LayerKVCache.only.{self.name} elsewhere)",
                DeprecationWarning,
                stacklevel=2,
            )
        if layer._only is None and self.several is not self._RAISE:
            return self.several
        return getattr(layer.only, self.name)


class LayerKVCache:
    """One layer's cache: the :class:`MixerCache` of every token mixer the layer holds, by mixer key.

    What ``AttentionInputs.cache`` holds inside a layer. A mixer finds its own state with :meth:`state` (through
    ``inputs.cache_for(self)``); outside a mixer, a layer with a single mixer (every layer but a hybrid's) gives
    that mixer's state as :attr:`only`. The members by which such a layer used to read as its mixer's state
    (``k``, ``v``, ``group``, ``window``, ``spec``, ``scratch``, ``slots``, ``update`` and ``append``, as attentions
    written before mixers declared their state use it) are deprecated aliases of :attr:`only`'s: each warns once
    (:class:`DeprecationWarning` naming the replacement), and they go in modkit 0.3.

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

    # deprecated (modkit 0.3 removes them): the single mixer's members, read through `only`
    k = _SingleMixerAlias("Deprecated: ``only.k``, the single mixer's ``'k'`` entry (see :attr:`MixerCache.k`).")
    v = _SingleMixerAlias("Deprecated: ``only.v``, the single mixer's ``'v'`` entry.")
    group = _SingleMixerAlias("Deprecated: ``only.group``, the single mixer's slot group.")
    window = _SingleMixerAlias("Deprecated: ``only.window``, the single mixer's window.")
    spec = _SingleMixerAlias("Deprecated: ``only.spec``, the single mixer's declaration.")
    scratch = _SingleMixerAlias(
        "Deprecated: ``only.scratch``, the per-forward dict of the single mixer's slot group (see :class:`SlotGroup`); "
        "``None`` in a layer with several mixers (ask the mixer's own state: ``inputs.cache_for(self).scratch``).",
        several=None,
    )
    slots = _SingleMixerAlias("Deprecated: ``only.slots``, slots of the single mixer's per-token entries.")
    update = _SingleMixerAlias("Deprecated: ``only.update(k, v, positions, valid)`` (:meth:`MixerCache.update`).")
    append = _SingleMixerAlias("Deprecated: ``only.append(new, positions, valid)`` (:meth:`MixerCache.append`).")

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
                mixers[key] = MixerCache(spec, group, key, self.max_len)
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
