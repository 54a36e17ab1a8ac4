"""A prepared dataset (:class:`TokenData`) and the samplers that draw training batches from its token arrays.

Every sampler has one interface: ``next() -> (x, y)``, both ``[batch, seq_len]`` int64 CPU tensors with
``y[:, t] = x[:, t + 1]`` (the next token of every position, as in nanoGPT's ``get_batch``), and
``state_dict()`` / ``load_state_dict(d)`` holding a few JSON-serialisable integers, so a resumed run draws exactly
the batches an uninterrupted one would have drawn.

Samplers are counter-based: batch ``i`` depends only on ``(seed, i)`` (or ``(seed, epoch)``), never on a generator
that has been advanced, so the state is a counter. Random numbers come from NumPy's ``SeedSequence`` of
``(stream, seed, counter)``; the stream tag keeps :class:`RandomWindows`, :class:`SequentialEpochs` and
:func:`eval_batches` independent for one seed.

Distributed training. ``batch_size`` is the *global* batch: every rank computes the same global batch and keeps
rows ``[rank * batch_size / world_size, (rank + 1) * batch_size / world_size)``, so N processes together see exactly
the batch one process sees, and a run may resume with another ``world_size``.

Windows are read from the (memory-mapped) token array by NumPy fancy indexing: only the ``batch * (seq_len + 1)``
tokens of the batch are read and converted, never the whole array.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from modkit.core.errors import DataError
from modkit.core.jsonio import JSONInputError, read_json_file
from .prepare import FORMAT, FORMAT_VERSION, META_FILE, TRAIN_FILE, VAL_FILE, dtype_for
from .tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer

# SeedSequence stream tags: one seed gives unrelated draws to each sampler kind.
_RANDOM, _EPOCHS, _EVAL = 0, 1, 2
_DTYPES = ("uint16", "uint32")


class TokenData:
    """A folder written by :func:`modkit.data.prepare.prepare`, opened read-only.

    Attributes:
        path: the folder.
        meta: its ``meta.json`` (see :func:`modkit.data.prepare.prepare` for the keys).
        train: the training tokens, a read-only ``numpy.memmap`` ``[n_train]`` of ``uint16``/``uint32`` ids.
        val: the validation tokens, likewise ``[n_val]``.
        tokenizer: the dataset's :class:`~modkit.data.tokenizer.Tokenizer` (``spec`` from ``meta.json``).
        vocab_size: ``meta["vocab_size"]``: every id is below it (a model needs at least this ``vocab_size``).
    """

    def __init__(self, path: Path, meta: dict, train: np.memmap, val: np.memmap, tokenizer: Tokenizer):
        self.path, self.meta, self.train, self.val, self.tokenizer = path, meta, train, val, tokenizer
        self.vocab_size: int = int(meta["vocab_size"])

    @classmethod
    def open(cls, path: str | Path, *, verify: bool = True) -> "TokenData":
        """Open a prepared dataset folder, checking ``meta.json`` and the files against it.

        Args:
            path: the folder given to ``prepare`` (``modkit data prepare ... -o DIR``).
            verify: also compare each file's sha256 with ``meta.json`` (reads every byte once: about a second per
                GB); sizes are always checked.

        Raises:
            DataError: no such folder, no or unreadable ``meta.json``, a format this version does not read, a dtype
                that does not fit ``vocab_size``, a missing ``.bin`` or ``tokenizer.json``, a ``.bin`` whose size
                is not its token count times the dtype's size (truncated, or written with another dtype), or
                (``verify``) contents that differ from when the dataset was prepared.
        """
        path = Path(path).expanduser()
        again = f"prepare it again with `modkit data prepare INPUT... -o {path}`"
        if not path.is_dir():
            raise DataError(f"{path}: no such dataset folder; {again}")
        meta = _read_meta(path, again)
        dtype = np.dtype(meta["dtype"])
        splits = {}
        for split, name in (("train", TRAIN_FILE), ("val", VAL_FILE)):
            file, n = path / name, meta["tokens"][split]
            if not file.is_file():
                raise DataError(f"{file}: missing; {again}")
            size, expected = file.stat().st_size, n * dtype.itemsize
            if size != expected:
                other = np.dtype("uint32" if dtype.name == "uint16" else "uint16")
                hint = (
                    f" (the size fits {n:,} {other.name} ids: written with another dtype?)"
                    if size == n * other.itemsize
                    else ""
                )
                raise DataError(
                    f"{file}: {size:,} bytes, expected {expected:,} ({n:,} tokens of {dtype.name}, as {META_FILE} "
                    f"says){hint}; the file is truncated or not this dataset's: {again}"
                )
            splits[split] = file
        if not (path / TOKENIZER_FILE).is_file():
            raise DataError(f"{path / TOKENIZER_FILE}: missing; {again}")
        if verify:
            for name, entry in meta.get("files", {}).items():
                if _sha256(path / name) != entry.get("sha256"):
                    raise DataError(
                        f"{path / name}: contents differ from {META_FILE} (sha256): corrupt or changed after prepare; {again}"
                    )
        tokenizer = load_tokenizer(path / TOKENIZER_FILE, spec=meta["tokenizer"])
        docs = meta.get("documents") or {}
        if docs.get("eot") is not None or docs.get("bos") is not None:  # the separators prepare wrote
            tokenizer.set_special(eot=docs.get("eot") or tokenizer.eot, bos=docs.get("bos") or tokenizer.bos)
        if tokenizer.vocab_size != meta["vocab_size"]:
            raise DataError(
                f"{path / TOKENIZER_FILE}: vocab_size {tokenizer.vocab_size}, but {META_FILE} says {meta['vocab_size']}; {again}"
            )
        train, val = (np.memmap(splits[s], dtype=dtype, mode="r", shape=(meta["tokens"][s],)) for s in ("train", "val"))
        return cls(path, meta, train, val, tokenizer)

    @property
    def separators(self) -> tuple[Optional[int], Optional[int]]:
        """``(eot_id, bos_id)`` that ``prepare`` wrote after / before every document (``None``: not written; a
        dataset prepared before documents were separated has neither)."""
        docs = self.meta.get("documents") or {}
        return docs.get("eot_id"), docs.get("bos_id")

    def __repr__(self) -> str:
        return (
            f"TokenData({str(self.path)!r}, tokenizer={self.meta['tokenizer']!r}, vocab_size={self.vocab_size}, "
            f"train={len(self.train):,}, val={len(self.val):,} tokens)"
        )


def _read_meta(path: Path, again: str) -> dict:
    file = path / META_FILE
    if not file.is_file():
        raise DataError(f"{path}: no {META_FILE}, so not a prepared dataset (or an interrupted prepare); {again}")
    try:  # strictly: a regular file of bounded size, UTF-8, no duplicate keys (modkit.core.jsonio)
        meta = read_json_file(file)
    except JSONInputError as exc:
        raise DataError(f"{exc}; {again}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise DataError(f'{file}: not a modkit dataset\'s {META_FILE} (no "format": "{FORMAT}"); {again}')
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise DataError(
            f"{file}: format_version {version!r}, this modkit reads {FORMAT_VERSION}; {again} (or upgrade modkit)"
        )
    problems = []
    tokens = meta.get("tokens")
    if not isinstance(meta.get("tokenizer"), str):
        problems.append("tokenizer: not a string")
    if not (isinstance(meta.get("vocab_size"), int) and meta["vocab_size"] > 0):
        problems.append(f"vocab_size = {meta.get('vocab_size')!r}: not a positive integer")
    if meta.get("dtype") not in _DTYPES:
        problems.append(f"dtype = {meta.get('dtype')!r}: not one of {', '.join(_DTYPES)}")
    if not (
        isinstance(tokens, dict) and all(isinstance(tokens.get(s), int) and tokens[s] > 0 for s in ("train", "val"))
    ):
        problems.append(f'tokens = {tokens!r}: not {{"train": n, "val": m}} with positive counts')
    if problems:
        raise DataError(f"{file}: {'; '.join(problems)}; {again}")
    if np.dtype(meta["dtype"]) != dtype_for(meta["vocab_size"]):
        raise DataError(
            f"{file}: dtype {meta['dtype']} does not fit vocab_size {meta['vocab_size']} (needs "
            f"{dtype_for(meta['vocab_size']).name}); {again}"
        )
    return meta


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ samplers


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataError(f"{name} = {value!r} must be a positive integer")
    return int(value)


def _seed(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise DataError(f"seed = {value!r} must be an integer >= 0")
    return int(value)


def _rng(stream: int, seed: int, counter: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([stream, seed, counter]))


class _Sampler:
    """Shared checks, rank slicing and window reading of the samplers."""

    kind = ""

    def __init__(self, tokens, batch_size: int, seq_len: int, *, seed: int, rank: int = 0, world_size: int = 1):
        tokens = tokens if isinstance(tokens, np.ndarray) else np.asarray(tokens)
        if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
            raise DataError(
                f"tokens: a 1-D array of integer ids is needed, got shape {tuple(tokens.shape)} of {tokens.dtype}"
            )
        self.tokens = tokens
        self.batch_size = _positive_int("batch_size", batch_size)
        self.seq_len = _positive_int("seq_len", seq_len)
        self.seed = _seed(seed)
        self.world_size = _positive_int("world_size", world_size)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.world_size:
            raise DataError(f"rank = {rank!r} must be in [0, world_size = {self.world_size})")
        self.rank = int(rank)
        if self.batch_size % self.world_size:
            raise DataError(
                f"batch_size = {self.batch_size} (the global batch) is not divisible by world_size = {self.world_size}; "
                f"use a multiple of {self.world_size}"
            )
        if len(tokens) < self.seq_len + 1:
            raise DataError(
                f"{len(tokens):,} tokens are too few for one window of seq_len + 1 = {self.seq_len + 1} tokens; "
                f"use a shorter seq_len or more data (or a larger val_fraction for the validation split)"
            )

    def _batch(self, starts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of this rank's rows of the global batch whose windows start at ``starts`` ``[batch_size]``."""
        local = self.batch_size // self.world_size
        mine = starts[self.rank * local : (self.rank + 1) * local]
        windows = np.asarray(self.tokens[mine[:, None] + np.arange(self.seq_len + 1)], dtype=np.int64)
        return torch.from_numpy(np.ascontiguousarray(windows[:, :-1])), torch.from_numpy(
            np.ascontiguousarray(windows[:, 1:])
        )

    def _config(self) -> dict:
        return {
            "sampler": self.kind,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "n_tokens": len(self.tokens),
        }

    def _check_state(self, state: dict, counters: tuple[str, ...]) -> None:
        if not isinstance(state, dict):
            raise DataError(
                f"sampler state: a dict from {self.kind}.state_dict() is needed, got {type(state).__name__}"
            )
        for key, value in self._config().items():
            if state.get(key) != value:
                raise DataError(
                    f"sampler state: {key} = {state.get(key)!r} in the state, {value!r} here; resume with the data, "
                    f"sampler, seed, batch_size and seq_len of the saved run"
                )
        for key in counters:
            if isinstance(state.get(key), bool) or not isinstance(state.get(key), int) or state[key] < 0:
                raise DataError(f"sampler state: {key} = {state.get(key)!r} must be an integer >= 0")

    def __iter__(self):
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next()


class RandomWindows(_Sampler):
    """nanoGPT's sampler (``get_batch`` in karpathy/nanoGPT ``train.py``): random contiguous windows.

    Batch ``i`` holds ``batch_size`` windows whose starts are uniform in ``[0, len(tokens) - seq_len - 1]``, drawn
    from a generator seeded from ``(seed, i)``; windows may overlap and repeat. ``x, y`` are ``[batch_size /
    world_size, seq_len]`` int64 with ``y`` = ``x`` shifted by one token.

    Args:
        tokens: 1-D integer token array (e.g. :attr:`TokenData.train`, a memmap: only the batch's windows are read).
        batch_size: the global batch (all ranks together); divisible by ``world_size``.
        seq_len: tokens per row.
        seed: integer >= 0.
        rank, world_size: this process's rows of the global batch.

    Raises:
        DataError: a non-positive size, a negative seed, ``rank`` outside ``[0, world_size)``, a ``batch_size``
            that ``world_size`` does not divide, or fewer than ``seq_len + 1`` tokens.
    """

    kind = "RandomWindows"

    def __init__(self, tokens, batch_size: int, seq_len: int, *, seed: int, rank: int = 0, world_size: int = 1):
        super().__init__(tokens, batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)
        self.step = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch ``(x, y)``, each ``[batch_size / world_size, seq_len]`` int64 on the CPU."""
        starts = _rng(_RANDOM, self.seed, self.step).integers(0, len(self.tokens) - self.seq_len, size=self.batch_size)
        self.step += 1
        return self._batch(starts)

    def state_dict(self) -> dict:
        """``{"sampler", "seed", "batch_size", "seq_len", "n_tokens", "step"}``: JSON-serialisable; ``step`` = batches drawn."""
        return {**self._config(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a sampler with the same tokens and settings).

        Raises:
            DataError: a state of another sampler kind, seed, batch_size, seq_len or token count, or a bad counter.
        """
        self._check_state(state, ("step",))
        self.step = state["step"]


class SequentialEpochs(_Sampler):
    """Non-overlapping windows covering the tokens once per epoch, in an order shuffled per epoch.

    Window ``k`` starts at ``k * seq_len``; there are ``(len(tokens) - 1) // seq_len`` of them (each needs
    ``seq_len + 1`` tokens for its targets; the tail that fills no window is never used). Epoch ``e`` visits them in
    the order of a permutation drawn from ``(seed, e)`` (in order without ``shuffle``). Batches are consecutive runs
    of ``batch_size`` windows of that stream, so the last batch of an epoch may continue into the next: every window
    appears exactly once per epoch and every batch is full. ``x, y`` are ``[batch_size / world_size, seq_len]``.

    Args:
        tokens, batch_size, seq_len, seed, rank, world_size: as :class:`RandomWindows`.
        shuffle: permute the windows per epoch (default) or visit them in order.

    Attributes:
        epoch: the epoch the next batch starts in (0-based).
        position: how many windows of that epoch were used before the next batch.
        windows_per_epoch: ``(len(tokens) - 1) // seq_len``.

    Raises:
        DataError: as :class:`RandomWindows`.
    """

    kind = "SequentialEpochs"

    def __init__(
        self,
        tokens,
        batch_size: int,
        seq_len: int,
        *,
        seed: int,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__(tokens, batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)
        self.shuffle = bool(shuffle)
        self.windows_per_epoch = (len(self.tokens) - 1) // self.seq_len
        self.epoch, self.position = 0, 0
        self._order_cache: tuple[int, np.ndarray] | None = None

    def _order(self, epoch: int) -> np.ndarray:
        if self._order_cache is None or self._order_cache[0] != epoch:
            n = self.windows_per_epoch
            order = _rng(_EPOCHS, self.seed, epoch).permutation(n) if self.shuffle else np.arange(n)
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch ``(x, y)``, each ``[batch_size / world_size, seq_len]`` int64 on the CPU."""
        parts, need = [], self.batch_size
        while need:
            take = self._order(self.epoch)[self.position : self.position + need]
            parts.append(take)
            need -= len(take)
            self.position += len(take)
            if self.position == self.windows_per_epoch:
                self.epoch, self.position = self.epoch + 1, 0
        return self._batch(np.concatenate(parts) * self.seq_len)

    def _config(self) -> dict:
        return {**super()._config(), "shuffle": self.shuffle}

    def state_dict(self) -> dict:
        """``{"sampler", "seed", "batch_size", "seq_len", "n_tokens", "shuffle", "epoch", "position"}`` (JSON-serialisable)."""
        return {**self._config(), "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` (from :meth:`state_dict` of a sampler with the same tokens and settings).

        Raises:
            DataError: a state of another sampler kind or settings, or a position outside the epoch.
        """
        self._check_state(state, ("epoch", "position"))
        if state["position"] >= self.windows_per_epoch:
            raise DataError(
                f"sampler state: position = {state['position']} is not below windows_per_epoch = {self.windows_per_epoch}"
            )
        self.epoch, self.position = state["epoch"], state["position"]


def eval_batches(
    tokens, batch_size: int, seq_len: int, n_batches: int, *, seed: int, rank: int = 0, world_size: int = 1
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A fixed list of ``n_batches`` evaluation batches: the same windows on every call with the same arguments.

    Windows are random contiguous ones as in :class:`RandomWindows` (starts uniform in
    ``[0, len(tokens) - seq_len - 1]``), drawn from ``(seed, i)`` on a stream of their own, so evaluating the
    training split with the training seed does not replay the first training batches. Each ``(x, y)`` is
    ``[batch_size / world_size, seq_len]`` int64; ranks keep their rows of each global batch.

    Raises:
        DataError: as :class:`RandomWindows`, or ``n_batches`` < 1.
    """
    n_batches = _positive_int("n_batches", n_batches)
    sampler = _Sampler(tokens, batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)
    high = len(sampler.tokens) - sampler.seq_len
    return [
        sampler._batch(_rng(_EVAL, sampler.seed, i).integers(0, high, size=sampler.batch_size))
        for i in range(n_batches)
    ]
