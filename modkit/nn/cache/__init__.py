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
* **per block** (``growth="block"``, with ``block = m``): one slot per *completed* block of ``m`` positions, so the
  entry grows by one slot every ``m`` tokens (``max_len // m`` slots): block-compressed keys and values
  (DeepSeek-V4's compressed attention, ``m`` = 4 or 128). Slot ``j`` of a row holds what the mixer made of that
  row's positions ``[j·m, (j + 1)·m)``; the mixer writes it itself when the block's last position arrives (in
  place, ``state[name]``: which blocks complete in a forward differs per row under left padding) and keeps the raw
  tail of the unfinished block in ``growth="sequence"`` entries. Slots need no metadata: a query at position ``t``
  may read slot ``j`` exactly when ``j < (t + 1) // m``, which also says it was written.

**Contract change (block growth).** Before it, a cache's size was ``bytes_per_token · slots + bytes_per_sequence``
with one slot count per mixer; now per-block entries add ``Σ bytes · (max_len // m)``. :meth:`CacheSpec.nbytes` is
the one exact formula (``modkit build``, ``modkit cost``, ``generate``'s memory check and the kit read it);
:meth:`CacheSpec.bytes_per_token` counts a block entry as ``bytes / m`` per token (rounded up to a whole byte
where ``m`` does not divide it), its growth rate.

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
without a cache); in a layer with one mixer that is the layer's only state whatever the mixer, which outside a
mixer reads :attr:`LayerKVCache.only`. The members by which such a layer used to read as its mixer's state
(``layer.k``, ``layer.update(...)``, written before the contract) are deprecated aliases of :attr:`LayerKVCache.only`'s
(one :class:`DeprecationWarning` each, naming the replacement), kept for one release.

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
``batch · Σ_layers Σ_mixers (token bytes · slots + Σ_block entries bytes · (max_len // block) + bytes_per_sequence)``
with ``slots = max_len`` for global layers and ``min(window, max_len)`` for windowed ones; for the built-in attention ``bytes_per_token`` is
``2 · n_kv_heads · head_dim · bytes(dtype)``. Slot metadata (positions and validity, 9 bytes per slot per group) is
reported apart by :meth:`KVCache.metadata_nbytes`.

Ring layers assume that padding only precedes a row's first real token (left padding): a padding token after a
real one would take a ring slot a real key needs; :meth:`KVCache.prepare` refuses that case in eager mode.

The package's modules: :mod:`~modkit.nn.cache.declarations` (what a mixer declares: :class:`CacheEntry`,
:class:`CacheSpec`), :mod:`~modkit.nn.cache.state` (one mixer's tensors and the slot metadata: :class:`MixerCache`,
:class:`SlotGroup`) and :mod:`~modkit.nn.cache.kvcache` (a layer's and a model's cache: :class:`LayerKVCache`,
:class:`KVCache`). Every name is importable from ``modkit.nn.cache``.
"""

from __future__ import annotations

from modkit.nn.cache.declarations import GROWTH, CacheEntry, CacheSpec, LayerGeometry, LayerLayout, layer_specs
from modkit.nn.cache.kvcache import KVCache, LayerKVCache
from modkit.nn.cache.state import MixerCache, SlotGroup

__all__ = [
    "GROWTH",
    "CacheEntry",
    "CacheSpec",
    "KVCache",
    "LayerGeometry",
    "LayerKVCache",
    "LayerLayout",
    "MixerCache",
    "SlotGroup",
    "layer_specs",
]
