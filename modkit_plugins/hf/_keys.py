"""The config side of a Hugging Face model type: a table of ``config.json`` keys and what each one is.

A model type's table maps each key it knows (in transformers' configuration class of that type) to one of:

* **mapped**: :class:`Key` reads one key into one or more fields of the network description (:data:`._spec.FIELDS`),
  with transformers' class default for an absent key, and writes the field back on export; group rows read
  several keys that only mean something together (:class:`HeadDim`, :class:`KVHeads`, :class:`Rope`,
  :class:`RopeByLayerType`, :class:`SlidingWindow`, :class:`QwenWindows`, :class:`LayerTypes`);
* **ignored** harmlessly (:class:`Ignore`): the key does not change the network (carried over on export);
* **refused** (:class:`Refuse`): the key changes the network in a way modkit cannot express, so any value but the
  one modkit can express is an error naming the key, the value and why. Never dropped.

A key a table does not list is either irrelevant for every model type (:data:`._reader.IRRELEVANT`: provenance,
tokenizer ids, generation defaults) or unknown: dropped with one :class:`modkit.UnknownConfigKeyWarning`, or
refused with ``strict=True``.

Every row has ``read(r, f, name)`` (config → fields, through the recording reader :class:`._reader.HFConfig`),
``write(f, base, name)`` (fields → config keys; ``base`` is the config the model was imported from) and
``describe(name)`` (the rows of the reference page). Semantics follow transformers' configuration classes (read,
not copied).

The rows live in three modules, all re-exported here (a model type imports them from ``._keys``):
:mod:`._key_rows` (:class:`Entry` and the one-key rows), :mod:`._group_rows` (heads and RoPE) and
:mod:`._layer_rows` (layer types, sliding windows, which layers are sparse).
"""

from __future__ import annotations

# the rows, and the helpers beside them that type modules use (``_read``, ``_types``)
from ._group_rows import ROPE_KEYS, HeadDim, KVHeads, Rope, RopeByLayerType, _divisible, rope_parameters  # noqa: F401
from ._key_rows import LAYER_TYPES, Entry, Ignore, Key, Own, Refuse, Row, Same, _read, _text, sizes  # noqa: F401
from ._layer_rows import (
    FirstDense,
    LayerTypes,
    QwenWindows,
    SlidingWindow,
    SparseStep,  # noqa: F401
    UseSlidingWindow,
    _experts,
    _types,
    _types_of,
)

__all__ = [
    "Entry",
    "HeadDim",
    "Ignore",
    "KVHeads",
    "Key",
    "LAYER_TYPES",
    "LayerTypes",
    "Own",
    "QwenWindows",
    "Refuse",
    "Rope",
    "RopeByLayerType",
    "Row",
    "Same",
    "SlidingWindow",
    "rope_parameters",
    "sizes",
    "UseSlidingWindow",
    "SparseStep",
    "FirstDense",
]
