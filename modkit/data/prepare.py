"""Text -> token files for training: ``train.bin``, ``val.bin``, ``tokenizer.json`` and ``meta.json`` in one folder.

The layout is nanoGPT's (karpathy/nanoGPT, ``data/shakespeare_char/prepare.py``): each split is a flat array of
token ids (``uint16`` when ``vocab_size <= 65536``, ``uint32`` otherwise, native byte order) that training maps
with ``numpy.memmap``.

Inputs (:mod:`modkit.data.sources`): text files (one document each), JSON Lines (one document per record; gzip- and
zstd-compressed too), Parquet files (one document per row), ``datasets`` folders written by ``save_to_disk``, and
folders of them (many shards), concatenated in the order given.

Documents stay apart. After every document the end-of-text token is written (``eot="auto"``: a trained ``char`` /
``bpe:N`` tokenizer reserves :data:`~modkit.data.tokenizer.EOT_TOKEN`, a given tokenizer's own end-of-text token is
used), as nanoGPT's OpenWebText preparation appends GPT-2's ``<|endoftext|>``; ``bos=True`` also writes a
begin-of-text token before every document; ``eot="none"`` (and no ``bos``) inserts nothing, the documents then run
together. Document text is encoded ordinarily: a literal ``<|endoftext|>`` in a document is text, not the separator.
``meta.json`` records the policy, the separator ids and the document counts (``documents``), which document-masked
training (:mod:`modkit.nn.documents`) reads.

Splits. With ``val_inputs`` the validation split is those inputs, encoded alike. Otherwise it is the last
``val_fraction`` of the tokens: with documents separated, the split starts at the first document that starts at or
after token ``int(n * (1 - val_fraction))`` (else at the last one before it; a document is cut only when there is
no boundary at all); with nothing inserted it is nanoGPT's cut at exactly that token.

Processes. ``workers = N`` encodes on ``N`` processes: the parent reads the inputs and hands out batches of
:data:`BATCH_CHARS` characters; the batches are the same whatever ``N`` is and are written in order, so the files
are byte for byte those of one process. At most ``2 N`` batches are in flight, so memory stays bounded by the
chunk sizes (and the longest record), whatever the input size. A tqdm bar shows the bytes read and the tokens
written.

A ``char`` or ``bpe:N`` tokenizer is trained on a first pass over the inputs and the text is encoded on a second.
Writes are atomic: everything goes to temporary names in the output folder, the old ``meta.json`` is removed, the
data files are renamed into place and ``meta.json`` comes last, so an interrupted run never leaves a folder that
:meth:`modkit.data.dataset.TokenData.open` accepts with the wrong contents.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

import numpy as np

from modkit.core.errors import DataError
from modkit.core.jsonio import read_json_file
from . import sources as _sources
from .sources import FOLDER_SUFFIXES, Piece, Source, find_sources, source_digest  # noqa: F401 - re-exported
from .tokenizer import (
    BOS_TOKEN,
    EOT_TOKEN,
    TOKENIZER_FILE,
    Tokenizer,
    UnknownTokenError,
    load_tokenizer,
    parse_spec,
    train_tokenizer,
)

#: ``meta.json``'s ``format`` and ``format_version``.
FORMAT = "modkit-token-data"
FORMAT_VERSION = 1
#: Characters of text handed to the tokenizer's (multi-threaded) ``encode_batch`` at once: it bounds the memory of
#: a run (the tokenizers library holds some 130 bytes per token of a batch while encoding it).
BATCH_CHARS = 1 << 20
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

# kept for callers (and tests) that patch or read them here
READ_BYTES = _sources.READ_BYTES
_text_pieces = _sources._text_pieces


def dtype_for(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (``vocab_size <= 65536``), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


@dataclass(frozen=True)
class Separators:
    """The ids written around each document: ``eot_id`` after it, ``bos_id`` before it (``None``: nothing)."""

    eot_id: Optional[int] = None
    bos_id: Optional[int] = None


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


def _pieces(srcs: Iterable[Source], text_field: str, progress: _Progress, hashes: Optional[dict] = None) -> Iterator[Piece]:
    for src in srcs:
        h = hashes.get(src.label) if hashes is not None else None

        def on_bytes(raw: bytes, h=h) -> None:
            progress.on_bytes(raw)
            if h is not None:
                h.update(raw)

        yield from _sources.pieces(src, text_field, on_bytes, progress.on_size)


def encode_pieces(tokenizer: Tokenizer, batch: Sequence[Piece], seps: Separators, dtype) -> tuple[np.ndarray, list[int], list[int]]:
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
            context = multiprocessing.get_context("spawn")  # no fork of a process whose tokenizer threads already ran
            with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init,
                                     initargs=(tokenizer.backend.to_str(), tokenizer.spec)) as pool:
                pending: deque = deque()
                for batch in stream:
                    flags = [(p.starts, p.ends) for p in batch]
                    pending.append((batch, pool.submit(_worker_encode, [p.text for p in batch], flags, separators, dtype.name)))
                    if len(pending) >= 2 * workers:
                        done, future = pending.popleft()
                        write(done, future.result())
                while pending:
                    done, future = pending.popleft()
                    write(done, future.result())
    for src in srcs:
        stats.per_source[src.label]["sha256"] = hashes[src.label].hexdigest() if src.label in hashes else source_digest(src)
    return stats


def _located(exc: UnknownTokenError, piece: Piece) -> DataError:
    pos = exc.position
    if piece.column is None:
        what = "row" if piece.source.format in ("parquet", "dataset") else "record"
        where = f"{piece.source.label}:{piece.line}: the {what}'s text, character {pos}"
    else:
        before = piece.text.rfind("\n", 0, pos)
        line = piece.line + piece.text.count("\n", 0, pos)
        column = pos - before if before >= 0 else piece.column + pos
        where = f"{piece.source.path}:{line}:{column}"
    return DataError(f"{where}: {exc}".replace(f" at position {pos} ", " "))


# ------------------------------------------------------------------------------------------------ checks


def _check_fraction(val_fraction) -> float:
    try:
        value = float(val_fraction)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise DataError(f"val_fraction = {val_fraction!r} must be a number in (0, 1), e.g. 0.1 (the last 10% of the tokens)")
    return value


def _check_policy(name: str, value: Union[str, bool, None]) -> str:
    """``eot`` / ``bos`` as stored: ``"auto"``, ``"none"`` or a token (``bos``: True = auto, False / None = none)."""
    if value is True:
        return AUTO
    if value is False or value is None:
        return NONE
    if isinstance(value, str) and value.strip():
        return value.strip() if value.strip().lower() not in (AUTO, NONE) else value.strip().lower()
    raise DataError(f"{name} = {value!r}: give 'auto' (the tokenizer's own token), 'none' (insert nothing) or a token of the vocabulary")


def _recipe(tokenizer: str, val_fraction: float, text_field: str, sources: Sequence[str], val_sources: Sequence[str], eot: str, bos: str) -> dict:
    return {"tokenizer": tokenizer, "val_fraction": val_fraction, "text_field": text_field, "sources": list(sources),
            "val_sources": list(val_sources), "eot": eot, "bos": bos}


def _old_recipe(old: dict) -> dict:
    """The recipe of an existing ``meta.json`` (one written before documents were separated inserted nothing)."""
    docs = old.get("documents") or {}
    return _recipe(old["tokenizer"], old["val_fraction"], old["text_field"], [s.get("label", s["path"]) for s in old["sources"]],
                   [s.get("label", s["path"]) for s in old.get("val_sources", [])], docs.get("eot_policy", NONE), docs.get("bos_policy", NONE))


def _check_out_dir(out: Path, recipe: dict, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder; choose another output folder (-o)")
    meta_path = out / META_FILE
    if overwrite or not meta_path.is_file():
        return
    try:
        old_recipe = _old_recipe(read_json_file(meta_path))
    except (ValueError, KeyError, TypeError, AttributeError):  # JSONInputError is a ValueError
        raise DataError(f"{out} holds a {META_FILE} that is not a modkit dataset's; choose another output folder (-o) or delete it") from None
    if old_recipe != recipe:
        diffs = [f"{k} {old_recipe[k]!r} there, {recipe[k]!r} now" for k in recipe
                 if k not in ("sources", "val_sources") and old_recipe[k] != recipe[k]]
        for k in ("sources", "val_sources"):
            if old_recipe[k] != recipe[k]:
                diffs.append(f"{k} {_short(old_recipe[k])} there, {_short(recipe[k])} now")
        raise DataError(
            f"{out} already holds a different dataset ({'; '.join(diffs)}); choose another output folder (-o) or "
            f"delete {out} first"
        )


def _short(paths: Sequence[str]) -> str:
    names = [Path(p).name for p in paths[:3]]
    return "[" + ", ".join(names) + (f", ... {len(paths)} files" if len(paths) > 3 else "") + "]"


def _no_text(srcs: Sequence[Source]) -> DataError:
    what = ", ".join(f"{s.label} ({s.size:,} bytes)" for s in srcs[:3]) + (f" and {len(srcs) - 3} more" if len(srcs) > 3 else "")
    return DataError(f"the inputs hold no text: {what}; give files with text in them (for .jsonl, non-empty text fields)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------------ tokenizer


def _special(kind: str, policy: str, tok: Optional[Tokenizer], reserved: str) -> Optional[str]:
    """The token a policy names: for a tokenizer to train (``tok`` None), the one to reserve; for a given one, its own."""
    if policy == NONE:
        return None
    if tok is None:
        return reserved if policy == AUTO else policy
    if policy == AUTO:
        own = tok.eot if kind == "eot" else tok.bos
        if own is None:
            what = "end-of-text" if kind == "eot" else "begin-of-text"
            specials = ", ".join(repr(t) for t in tok.special_tokens()[:8]) or "none"
            raise DataError(
                f"tokenizer {tok.spec!r} has no {what} token its files name (special tokens: {specials}); name one "
                f"with --{kind} TOKEN ({kind}=...), or --{kind} none to insert nothing"
            )
        return own
    return policy


def _tokenizer(spec_text: str, eot: str, bos: str, texts) -> Tokenizer:
    kind, size = parse_spec(spec_text)
    spec = {"char": "char", "bpe": f"bpe:{size}"}[kind]
    eot_token, bos_token = _special("eot", eot, None, EOT_TOKEN), _special("bos", bos, None, BOS_TOKEN)
    reserved = [t for t in (eot_token, bos_token) if t is not None]
    tok = train_tokenizer(spec, texts, special_tokens=reserved)
    tok.set_special(eot=eot_token, bos=bos_token)
    return tok


# ------------------------------------------------------------------------------------------------ split


class _Tokens:
    """A token file read in slices with plain reads (no memory map: the pages read never stay in this process)."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, np.dtype(dtype)
        self.n = path.stat().st_size // self.dtype.itemsize

    def __len__(self) -> int:
        return self.n

    def read(self, lo: int, hi: int) -> np.ndarray:
        lo, hi = max(lo, 0), min(hi, self.n)
        with open(self.path, "rb") as f:
            f.seek(lo * self.dtype.itemsize)
            return np.fromfile(f, dtype=self.dtype, count=max(hi - lo, 0))


def _find(tokens: _Tokens, value: int, start: int, stop: int, step: int, chunk: int = 1 << 22) -> Optional[int]:
    """The first index ``i`` from ``start`` towards ``stop`` (``step`` +1 or -1, ``stop`` excluded) where
    ``tokens[i] == value``, reading ``chunk`` tokens at a time; ``None`` when there is none."""
    if step > 0:
        for lo in range(start, stop, chunk):
            hits = np.flatnonzero(tokens.read(lo, min(lo + chunk, stop)) == value)
            if len(hits):
                return lo + int(hits[0])
    else:
        for hi in range(start + 1, stop + 1, -chunk):
            lo = max(hi - chunk, stop + 1)
            hits = np.flatnonzero(tokens.read(lo, hi) == value)
            if len(hits):
                return lo + int(hits[-1])
    return None


def document_cut(tokens: _Tokens, target: int, seps: Separators) -> int:
    """Where the validation split starts: the first document start at or after ``target`` (a document starts after
    each end-of-text id and at each begin-of-text id), else the last one before it, else ``target`` itself."""
    n = len(tokens)

    def start_at_or_after(i: int) -> Optional[int]:
        found = []
        if seps.eot_id is not None:
            e = _find(tokens, seps.eot_id, max(i - 1, 0), n - 1, 1)  # an end-of-text token at e: a document starts at e + 1
            found.append(e + 1 if e is not None else None)
        if seps.bos_id is not None:
            found.append(_find(tokens, seps.bos_id, i, n, 1))
        found = [f for f in found if f is not None and i <= f < n]
        return min(found) if found else None

    def start_before(i: int) -> Optional[int]:
        found = []
        if seps.eot_id is not None:
            e = _find(tokens, seps.eot_id, i - 2, -1, -1)
            found.append(e + 1 if e is not None else None)
        if seps.bos_id is not None:
            found.append(_find(tokens, seps.bos_id, i - 1, 0, -1))
        found = [f for f in found if f is not None and 0 < f < i]
        return max(found) if found else None

    cut = start_at_or_after(target)
    if cut is None:
        cut = start_before(target)
    return target if cut is None else cut


def _count(tokens: _Tokens, value: Optional[int], chunk: int = 1 << 22) -> Optional[int]:
    if value is None:
        return None
    return int(sum(np.count_nonzero(tokens.read(i, i + chunk) == value) for i in range(0, len(tokens), chunk)))


# ------------------------------------------------------------------------------------------------ prepare


def prepare(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    val_inputs: Optional[Sequence[str | Path]] = None,
    text_field: str = "text",
    eot: Union[str, None] = AUTO,
    bos: Union[bool, str, None] = False,
    split: str = "train",
    val_split: str = "validation",
    workers: int = 1,
    show_progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Tokenize text into a dataset folder: ``train.bin``, ``val.bin``, ``tokenizer.json``, ``meta.json``.

    Args:
        inputs: text files, JSON Lines files (plain, ``.gz``, ``.zst``), Parquet files, ``datasets`` folders and
            folders of them (see :mod:`modkit.data.sources`).
        out_dir: the dataset folder (created; it may already hold a dataset of the same inputs and options, which
            is replaced).
        tokenizer: ``"char"``, ``"bpe:N"`` (trained on the inputs) or the path of a ``tokenizer.json`` or of a
            folder holding one (a Hugging Face model folder: its special tokens come with it).
        val_fraction: share of the tokens, taken from the end, that forms ``val.bin``; in (0, 1). Unused with
            ``val_inputs``.
        val_inputs: inputs that form the validation split instead (a ``bpe:N`` is trained on ``inputs`` only, a
            ``char`` vocabulary covers both, as nanoGPT's whole-text vocabulary does).
        text_field: the field of a JSON Lines record (column of a Parquet file / ``datasets`` folder) with the text.
        eot: end-of-text token written after every document: ``"auto"`` (reserved by a trained tokenizer, the
            given tokenizer's own), a token of the vocabulary, or ``"none"``.
        bos: begin-of-text token written before every document: ``False`` / ``"none"``, ``True`` / ``"auto"``, or a
            token.
        split, val_split: the split of a ``datasets`` DatasetDict folder read for ``inputs`` / ``val_inputs``.
        workers: encoding processes; the files are byte for byte the same for any number.
        show_progress: show a tqdm bar (bytes read, tokens written) on stderr.
        overwrite: replace whatever dataset ``out_dir`` holds, even one of other inputs or options.

    Returns:
        the ``meta.json`` written: ``format``, ``format_version``, ``tokenizer`` (spec), ``vocab_size``, ``dtype``,
            ``tokens`` (``{"train": n, "val": m}``), ``val_fraction``, ``split`` (the rule), ``text_field``,
            ``documents`` (``eot_policy``, ``bos_policy``, ``eot`` / ``bos`` token and id or ``None``, ``count``,
            ``train`` / ``val``: the separators in each split), ``sources`` and ``val_sources`` (path, format,
            bytes, sha256, tokens, documents of each input) and ``files`` (bytes and sha256 of each file written).

    Raises:
        DataError: a missing input, a folder without input files, empty input, a file that is not UTF-8, a bad
            JSON Lines record, a bad tokenizer spec or one too small, a tokenizer without the separator asked
            for, text the tokenizer cannot encode, ``val_fraction`` outside (0, 1), too few tokens for two splits,
            or an ``out_dir`` holding a different dataset. Each message names the file (and line) and the fix.
    """
    fraction = _check_fraction(val_fraction) if val_inputs is None else float(val_fraction)
    eot_policy, bos_policy = _check_policy("eot", eot), _check_policy("bos", bos)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DataError(f"workers = {workers!r} must be a positive integer (encoding processes)")
    srcs = find_sources(inputs, split=split)
    val_srcs = find_sources(val_inputs, split=val_split) if val_inputs is not None else []
    kind, size = parse_spec(tokenizer)
    tok: Tokenizer | None = None
    spec = {"char": "char", "bpe": f"bpe:{size}"}.get(kind, "")
    if kind == "path":
        tok = load_tokenizer(tokenizer)
        spec = tok.spec = str(Path(tok.spec).resolve())
        tok.set_special(eot=_special("eot", eot_policy, tok, EOT_TOKEN), bos=_special("bos", bos_policy, tok, BOS_TOKEN))
    out = Path(out_dir).expanduser()
    recipe = _recipe(spec, fraction, text_field, [s.label for s in srcs], [s.label for s in val_srcs], eot_policy, bos_policy)
    _check_out_dir(out, recipe, overwrite)
    if tok is None:
        chars = [0, False]  # characters read, all read
        trained_on = srcs + (val_srcs if kind == "char" else [])

        def texts() -> Iterator[str]:
            for piece in _pieces(trained_on, text_field, progress):
                chars[0] += len(piece.text)
                yield piece.text
            chars[1] = True

        with _Progress(sum(s.size for s in trained_on), f"tokenizer {spec}", show_progress) as progress:
            try:
                tok = _tokenizer(spec, eot_policy, bos_policy, texts())
            except DataError:
                if chars == [0, True]:
                    raise _no_text(trained_on) from None
                raise
    seps = Separators(tok.eot_id, tok.bos_id)
    dtype = dtype_for(tok.vocab_size)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tmp = {name: out / f".{name}.tmp-{os.getpid()}" for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE, META_FILE)}
    done = False
    common = dict(separators=seps, text_field=text_field, workers=workers, show_progress=show_progress)
    try:
        with open(tmp[TRAIN_FILE], "wb") as f:
            train_stats = encode_sources(srcs, tok, f, **common, desc="encode")
        if train_stats.text_tokens == 0:
            raise _no_text(srcs)
        if val_srcs:
            with open(tmp[VAL_FILE], "wb") as f:
                val_stats = encode_sources(val_srcs, tok, f, **common, desc="encode val")
            if val_stats.text_tokens == 0:
                raise _no_text(val_srcs)
            n_train, n_val, rule, within = train_stats.tokens, val_stats.tokens, SPLIT_RULE_INPUTS, False
        else:
            val_stats = None
            n = train_stats.tokens
            target = int(n * (1.0 - fraction))
            n_train = target
            separated = seps.eot_id is not None or seps.bos_id is not None
            if separated and 0 < target < n:
                n_train = document_cut(_Tokens(tmp[TRAIN_FILE], dtype), target, seps)
            if n_train == 0 or n_train == n:
                raise DataError(
                    f"{n} tokens are too few to split with val_fraction = {fraction} ({n_train} train, {n - n_train} "
                    f"val); give more text or another val_fraction"
                )
            n_val, rule = n - n_train, SPLIT_RULE_DOCUMENTS if separated else SPLIT_RULE
            within = separated and n_train == target and not _starts_document(tmp[TRAIN_FILE], dtype, target, seps)
            _split(tmp[TRAIN_FILE], tmp[VAL_FILE], n_train * dtype.itemsize)
        tok.save(tmp[TOKENIZER_FILE])
        files = {
            name: {"bytes": tmp[name].stat().st_size, "sha256": _sha256(tmp[name])} for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE)
        }
        marker = seps.eot_id if seps.eot_id is not None else seps.bos_id
        splits = {
            s: _count(_Tokens(tmp[f], dtype), marker) if marker is not None else None
            for s, f in (("train", TRAIN_FILE), ("val", VAL_FILE))
        }
        from .. import __version__

        def entries(source_list: Sequence[Source], stats: EncodeStats) -> list[dict]:
            return [
                {
                    "path": str(s.path),
                    **({"label": s.label, "split": s.split} if s.split else {}),
                    "format": s.format,
                    **({"compression": s.compression} if s.compression else {}),
                    "bytes": s.size,
                    "sha256": stats.per_source[s.label]["sha256"],
                    "tokens": stats.per_source[s.label]["tokens"],
                    "documents": stats.per_source[s.label]["documents"],
                }
                for s in source_list
            ]

        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tokenizer": tok.spec,
            "vocab_size": tok.vocab_size,
            "dtype": dtype.name,
            "tokens": {"train": n_train, "val": n_val},
            "val_fraction": fraction,
            "split": rule,
            "split_within_document": within,
            "text_field": text_field,
            "documents": {
                "eot_policy": eot_policy,
                "bos_policy": bos_policy,
                "eot": tok.eot if seps.eot_id is not None else None,
                "eot_id": seps.eot_id,
                "bos": tok.bos if seps.bos_id is not None else None,
                "bos_id": seps.bos_id,
                "count": train_stats.documents + (val_stats.documents if val_stats else 0),
                "separated": marker is not None,
                # documents ending (end-of-text) or starting (begin-of-text only) in each split; None: not separated
                "train": splits["train"],
                "val": splits["val"],
            },
            "sources": entries(srcs, train_stats),
            **({"val_sources": entries(val_srcs, val_stats)} if val_stats else {}),
            "files": files,
            "modkit_version": __version__,
        }
        tmp[META_FILE].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (out / META_FILE).unlink(missing_ok=True)  # from here until the last rename the folder holds no dataset
        for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE, META_FILE):
            os.replace(tmp[name], out / name)
        done = True
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        if created and not done and not any(out.iterdir()):
            out.rmdir()
    return meta


def _starts_document(path: Path, dtype, i: int, seps: Separators) -> bool:
    tokens = _Tokens(path, dtype)
    return (seps.eot_id is not None and i > 0 and int(tokens.read(i - 1, i)[0]) == seps.eot_id) or (
        seps.bos_id is not None and int(tokens.read(i, i + 1)[0]) == seps.bos_id
    )


def _split(train: Path, val: Path, train_bytes: int) -> None:
    """Move everything after ``train_bytes`` of ``train`` into ``val`` (copy the tail, truncate); both fsynced."""
    with open(train, "r+b") as src, open(val, "wb") as dst:
        src.seek(train_bytes)
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())
        src.truncate(train_bytes)
        src.flush()
        os.fsync(src.fileno())
