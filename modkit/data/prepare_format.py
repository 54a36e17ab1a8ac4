"""The folder :func:`modkit.data.prepare.prepare` writes: its file names, ``meta.json``'s format, the split rules it
records, the token dtype and the separators written around each document.

The layout is nanoGPT's (karpathy/nanoGPT, ``data/shakespeare_char/prepare.py``): each split is a flat array of
token ids (``uint16`` when ``vocab_size <= 65536``, ``uint32`` otherwise, native byte order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

#: ``meta.json``'s ``format`` and ``format_version``.
FORMAT = "modkit-token-data"
FORMAT_VERSION = 1
#: How the splits are cut, as ``meta.json`` records it.
SPLIT_RULE = "train = the first int(n_tokens * (1 - val_fraction)) tokens, val = the rest (nanoGPT)"
SPLIT_RULE_DOCUMENTS = (
    "val starts at the first document that starts at or after token int(n_tokens * (1 - val_fraction)), else at the "
    "last one before it, else at that token"
)
SPLIT_RULE_INPUTS = "train = the inputs, val = the validation inputs"
#: The files of a prepared dataset.
TRAIN_FILE, VAL_FILE, META_FILE = "train.bin", "val.bin", "meta.json"
#: What ``eot`` / ``bos`` accept besides a token: insert the tokenizer's own (or a reserved) one; insert nothing.
AUTO, NONE = "auto", "none"


def dtype_for(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (``vocab_size <= 65536``), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class Separators:
    """The ids written around each document: ``eot_id`` after it, ``bos_id`` before it (``None``: nothing)."""

    eot_id: Optional[int] = None
    bos_id: Optional[int] = None
