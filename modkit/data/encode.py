"""Documents -> token ids: the encoding pass of :func:`modkit.data.prepare.prepare` (and of ``modkit eval`` on text).

Each document is encoded ordinarily (a special token written in the text is text) and the separators are written
around it: a begin-of-text id before, an end-of-text id after (:class:`~modkit.data.prepare_format.Separators`).

Processes. ``workers = N`` encodes on ``N`` processes: the parent reads the inputs and hands out batches of
:data:`BATCH_CHARS` characters; the batches are the same whatever ``N`` is and are written in order, so the bytes
are those of one process. At most ``2 N`` batches are in flight and a piece holds at most
:data:`~modkit.data.sources.PIECE_CHARS` characters (a longer document is encoded in pieces:
:mod:`modkit.data.cutting`), so memory stays bounded by these constants, whatever the input size and however long
a document. A tqdm bar shows the bytes read and the tokens written.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import numpy as np

from modkit.core.errors import DataError
from . import sources as _sources
from .prepare_format import Separators, dtype_for
from .sources import Piece, Source, source_digest
from .tokenizer import Tokenizer, UnknownTokenError

#: Characters of text handed to the tokenizer's (multi-threaded) ``encode_batch`` at once: it bounds the memory of
#: a run (the tokenizers library holds some 130 bytes per token of a batch while encoding it).
BATCH_CHARS = 1 << 20

# ------------------------------------------------------------------------------------------------ progress


class _Progress:
    """A tqdm bar over the input bytes that also shows the tokens written (no output when ``show`` is false)."""

    def __init__(self, total: int, desc: str, show: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not show)
        self.tokens = 0

    def on_bytes(self, raw: bytes) -> None:
        self.bar.update(len(raw))

    def on_size(self, n: int) -> None:
        self.bar.update(n)

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        self.bar.set_postfix_str(f"{self.tokens:,} tokens", refresh=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


# ------------------------------------------------------------------------------------------------ encoding


def _pieces(
    srcs: Iterable[Source], text_field: str, progress: _Progress, hashes: Optional[dict] = None
) -> Iterator[Piece]:
    for src in srcs:
        h = hashes.get(src.label) if hashes is not None else None

        def on_bytes(raw: bytes, h=h) -> None:
            progress.on_bytes(raw)
            if h is not None:
                h.update(raw)

        yield from _sources.pieces(src, text_field, on_bytes, progress.on_size)


def encode_pieces(
    tokenizer: Tokenizer, batch: Sequence[Piece], seps: Separators, dtype
) -> tuple[np.ndarray, list[int], list[int]]:
    """Ids of a batch of pieces with the separators around its documents.

    Returns:
        ``(ids [n] of dtype, tokens per piece (separators included), text tokens per piece)``.

    Raises:
        UnknownTokenError: with ``index`` = the piece that cannot be encoded.
    """
    encoded = tokenizer.encode_batch([p.text for p in batch], ordinary=True)
    parts, lengths, texts = [], [], []
    for piece, ids in zip(batch, encoded):
        before = [seps.bos_id] if seps.bos_id is not None and piece.starts else []
        after = [seps.eot_id] if seps.eot_id is not None and piece.ends else []
        row = before + ids + after
        parts.append(row)
        lengths.append(len(row))
        texts.append(len(ids))
    flat = np.fromiter((i for row in parts for i in row), dtype=dtype, count=sum(lengths))
    return flat, lengths, texts


_WORKER: dict[str, Any] = {}


def _worker_init(tokenizer_json: str, spec: str) -> None:
    """A preparation worker: one tokenizer thread per process (the processes are the parallelism)."""
    os.environ["RAYON_NUM_THREADS"] = os.environ["RAYON_RS_NUM_CPUS"] = "1"
    import tokenizers

    _WORKER["tokenizer"] = Tokenizer(tokenizers.Tokenizer.from_str(tokenizer_json), spec)


def _worker_encode(texts: list[str], flags: list[tuple[bool, bool]], seps: Separators, dtype: str):
    batch = [Piece(t, None, 0, None, starts=s, ends=e) for t, (s, e) in zip(texts, flags)]  # type: ignore[arg-type]
    try:
        return encode_pieces(_WORKER["tokenizer"], batch, seps, np.dtype(dtype))
    except DataError:
        return None  # the parent encodes this batch again itself, for the error with its file and line


@dataclass
class EncodeStats:
    """What encoding some inputs wrote: ``tokens`` (separators included) and ``text_tokens``, ``documents``, and
    per source label: ``tokens``, ``documents`` and the sha256 (``hashes``)."""

    tokens: int = 0
    text_tokens: int = 0
    documents: int = 0
    per_source: dict[str, dict] = field(default_factory=dict)


def _batches(pieces: Iterator[Piece]) -> Iterator[list[Piece]]:
    batch: list[Piece] = []
    size = 0
    for piece in pieces:
        batch.append(piece)
        size += len(piece.text)
        if size >= BATCH_CHARS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def encode_sources(
    srcs: Sequence[Source],
    tokenizer: Tokenizer,
    out,
    *,
    separators: Separators = Separators(),
    text_field: str = "text",
    workers: int = 1,
    show_progress: bool = False,
    desc: str = "encode",
) -> EncodeStats:
    """Encode every document of ``srcs`` into the binary file object ``out`` (ids of ``dtype_for(vocab_size)``).

    Args:
        srcs: from :func:`~modkit.data.sources.find_sources`.
        tokenizer: encodes the text (ordinarily: special tokens written in the text are text).
        out: a file opened for binary writing.
        separators: the ids written before / after each document.
        text_field: the field (JSON Lines) or column (Parquet, ``datasets``) that holds the text.
        workers: encoding processes (1: this one); the bytes written are the same for any number.
        show_progress: a tqdm bar (bytes read, tokens written) on stderr.

    Returns:
        :class:`EncodeStats`.

    Raises:
        DataError: unreadable input or text the tokenizer cannot encode (named with file and line).
    """
    dtype = dtype_for(tokenizer.vocab_size)
    stats = EncodeStats(per_source={s.label: {"tokens": 0, "documents": 0, "sha256": None} for s in srcs})
    hashes = {s.label: hashlib.sha256() for s in srcs if s.format in ("text", "jsonl")}

    def write(batch: list[Piece], result) -> None:
        if result is None:  # a worker could not encode it: do it here, for the located error
            result = _encode_here(batch)
        flat, lengths, texts = result
        flat.tofile(out)
        for piece, n, t in zip(batch, lengths, texts):
            entry = stats.per_source[piece.source.label]
            entry["tokens"] += n
            entry["documents"] += piece.ends
            stats.documents += piece.ends
            stats.text_tokens += t
        stats.tokens += len(flat)
        progress.add_tokens(len(flat))

    def _encode_here(batch: list[Piece]):
        try:
            return encode_pieces(tokenizer, batch, separators, dtype)
        except UnknownTokenError as exc:
            raise _located(exc, batch[exc.index]) from None

    total = sum(s.size for s in srcs)
    with _Progress(total, desc, show_progress) as progress:
        stream = _batches(_pieces(srcs, text_field, progress, hashes))
        if workers <= 1:
            for batch in stream:
                write(batch, _encode_here(batch))
        else:
            _encode_in_pool(stream, tokenizer, separators, workers, write)
    for src in srcs:
        digest = hashes[src.label].hexdigest() if src.label in hashes else source_digest(src)
        stats.per_source[src.label]["sha256"] = digest
    return stats


def _encode_in_pool(
    stream: Iterable[list[Piece]],
    tokenizer: Tokenizer,
    separators: Separators,
    workers: int,
    write: Callable[[list[Piece], Any], None],
) -> None:
    """Encode the batches of ``stream`` on ``workers`` processes and ``write`` each (with its ids, or ``None`` when
    a worker could not encode it) in the order of the stream, with at most ``2 workers`` batches in flight."""
    dtype = dtype_for(tokenizer.vocab_size)
    context = multiprocessing.get_context("spawn")  # no fork of a process whose tokenizer threads already ran
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_worker_init, initargs=(tokenizer.backend.to_str(), tokenizer.spec)
    ) as pool:
        pending: deque = deque()
        for batch in stream:
            flags = [(p.starts, p.ends) for p in batch]
            texts = [p.text for p in batch]
            pending.append((batch, pool.submit(_worker_encode, texts, flags, separators, dtype.name)))
            if len(pending) >= 2 * workers:
                done, future = pending.popleft()
                write(done, future.result())
        while pending:
            done, future = pending.popleft()
            write(done, future.result())


def _located(exc: UnknownTokenError, piece: Piece) -> DataError:
    pos = exc.position
    if piece.column is None:
        what = "row" if piece.source.format in ("parquet", "dataset") else "record"
        where = f"{piece.source.label}:{piece.line}: the {what}'s text, character {piece.offset + pos}"
    else:
        before = piece.text.rfind("\n", 0, pos)
        line = piece.line + piece.text.count("\n", 0, pos)
        column = pos - before if before >= 0 else piece.column + pos
        where = f"{piece.source.path}:{line}:{column}"
    return DataError(f"{where}: {exc}".replace(f" at position {pos} ", " "))
