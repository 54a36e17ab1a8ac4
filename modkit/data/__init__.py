"""Training data: tokenizers, ``prepare`` (text -> ``train.bin`` / ``val.bin`` + ``meta.json``), and samplers.

::

    from modkit.data import TokenData, RandomWindows, default_dataset, prepare

    prepare(["corpus/"], "data/my-corpus", tokenizer="bpe:4096")    # or `modkit data prepare corpus/ -o data/my-corpus`
    data = TokenData.open(default_dataset())                        # tiny shakespeare, char tokenizer, cached
    batches = RandomWindows(data.train, batch_size=64, seq_len=256, seed=0)
    x, y = batches.next()                                           # [64, 256] int64, y = x shifted by one

The shipped default corpus ``tinyshakespeare.txt`` is the "tiny shakespeare" text of karpathy/char-rnn
(``data/tinyshakespeare/input.txt``, public domain, 1,115,394 characters, md5 ``6fb458f1232090904fb40fe944165e91``);
see :mod:`modkit.data.corpus`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modkit.core._lazy import make_lazy

if TYPE_CHECKING:  # for type checkers and editors; at run time the names load on first use (modkit.core._lazy)
    from modkit.core.errors import DataError
    from .corpus import cache_root, default_corpus, default_dataset
    from .dataset import RandomWindows, SequentialEpochs, TokenData, eval_batches
    from .prepare import prepare
    from .tokenizer import Tokenizer, UnknownTokenError, byte_tokenizer, check_fits, load_tokenizer, train_tokenizer

#: exported name -> the module defining it
_EXPORTS = {
    "DataError": "modkit.core.errors",
    "cache_root": "modkit.data.corpus",
    "default_corpus": "modkit.data.corpus",
    "default_dataset": "modkit.data.corpus",
    "RandomWindows": "modkit.data.dataset",
    "SequentialEpochs": "modkit.data.dataset",
    "TokenData": "modkit.data.dataset",
    "eval_batches": "modkit.data.dataset",
    "prepare": "modkit.data.prepare",
    "Tokenizer": "modkit.data.tokenizer",
    "UnknownTokenError": "modkit.data.tokenizer",
    "byte_tokenizer": "modkit.data.tokenizer",
    "check_fits": "modkit.data.tokenizer",
    "load_tokenizer": "modkit.data.tokenizer",
    "train_tokenizer": "modkit.data.tokenizer",
}

__all__ = [
    "DataError",
    "RandomWindows",
    "SequentialEpochs",
    "TokenData",
    "Tokenizer",
    "UnknownTokenError",
    "byte_tokenizer",
    "cache_root",
    "check_fits",
    "default_corpus",
    "default_dataset",
    "eval_batches",
    "load_tokenizer",
    "prepare",
    "train_tokenizer",
]

make_lazy(__name__, _EXPORTS)
