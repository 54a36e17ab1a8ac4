"""Checkpoints: safetensors only, checked name by name and shape by shape, written atomically.

Two on-disk formats go through this module:

* **modkit's own** (:func:`save` / :func:`load`): a folder holding ``spec.json`` (the spec, for people and
  editors) and ``model.safetensors`` (the model's ``state_dict``; its safetensors metadata entry
  ``modkit.spec`` holds the same spec, which is what :func:`load` builds). A lone ``.safetensors`` file written
  by :func:`save` loads too.
* **Hugging Face** (``config.json`` + ``model.safetensors``, or shards listed in
  ``model.safetensors.index.json``), through :func:`modkit.from_hf` / :func:`modkit.to_hf` in :mod:`modkit.io.hf`.
  This module supplies the engine they use: a :class:`WeightMapper` registered by a plugin per ``model_type``
  (``register(model_type, convert, weights=mapper)``) describes the correspondence as :class:`Link` objects;
  the core names no model type.

Safety and no data loss:

* weights are read only from safetensors; pickle checkpoints (``pytorch_model.bin``, ``*.pt``, ``*.pth``,
  ``*.ckpt``...) are refused with :class:`~modkit.core.errors.CheckpointError`, because unpickling can execute
  arbitrary code; the message says how to convert them once in a trusted environment;
* every missing tensor, unexpected tensor and shape mismatch is collected into one ``CheckpointError`` that
  names each tensor (and both shapes); nothing is skipped silently. A checkpoint whose head differs from a tied
  embedding is refused by :class:`~modkit.nn.model.Model` itself;
* tensors of a source checkpoint that modkit's model does not compute (BERT's pooler, a buffer such as
  ``position_ids``) are not dropped either: a mapper declares them as *kept*; they travel with the model in
  ``model.checkpoint_extras`` (and in :func:`save` files) and are written back on export;
* a folder's files are written under temporary names and replaced as one atomic step (:mod:`modkit.io.atomic`:
  a journal is committed, then the renames are done; readers finish an interrupted step first), so a save
  killed at any instant leaves the old checkpoint or the new one, complete, never a mix;
* every file is read strictly (:mod:`modkit.core.jsonio`: regular files only, bounded sizes, UTF-8, no duplicate
  keys); tensors of a dtype the model cannot take are refused by name, and NaN or infinite weights are counted
  tensor by tensor (a warning, or an error with ``nonfinite="error"``).

The package, by what each module does: :mod:`~modkit.io.checkpoint.files` (metadata keys, file names, the path
and pickle checks), :mod:`~modkit.io.checkpoint.source` (:class:`TensorSource`, reading safetensors),
:mod:`~modkit.io.checkpoint.mapping` (:class:`Link`, :class:`WeightMapper`, :func:`gather`, :func:`export`),
:mod:`~modkit.io.checkpoint.state` (:func:`materialize`, the non-finite count) and
:mod:`~modkit.io.checkpoint.native` (:func:`save`, :func:`load`). Every name is imported from
``modkit.io.checkpoint`` itself.
"""

from __future__ import annotations

import os  # noqa: F401 - ``modkit.io.checkpoint.os`` as before (a test patches os.replace through it)

from .files import (  # noqa: F401 - the module's names, importable from here as before
    EXTRAS_PREFIX,
    FORMAT_KEY,
    FORMAT_VERSION,
    HF_CONFIG_FILE,
    HF_CONFIG_KEY,
    HF_INDEX_FILE,
    PICKLE_SUFFIXES,
    SPEC_FILE,
    SPEC_KEY,
    WEIGHTS_FILE,
    checked_path,
    pickle_message,
    refuse_pickle,
)
from .mapping import Link, WeightMapper, expected_foreign_shapes, export, gather  # noqa: F401
from .native import load, save
from .source import TensorSource
from .state import LOADABLE_FLOAT_DTYPES, materialize, nonfinite_counts, report_nonfinite  # noqa: F401

__all__ = [
    "Link",
    "TensorSource",
    "WeightMapper",
    "export",
    "gather",
    "load",
    "materialize",
    "pickle_message",
    "refuse_pickle",
    "save",
]
