"""Text -> token files for training: ``train.bin``, ``val.bin``, ``tokenizer.json`` and ``meta.json`` in one folder.

The layout is nanoGPT's (karpathy/nanoGPT, ``data/shakespeare_char/prepare.py``): each split is a flat array of
token ids (``uint16`` when ``vocab_size <= 65536``, ``uint32`` otherwise, native byte order) that training maps
with ``numpy.memmap``; the validation split is the *last* ``val_fraction`` of the tokens.

Inputs, concatenated in the order given (a folder's files in sorted order of their relative paths):

* a text file (any name except ``*.jsonl``): its whole text, read as UTF-8 with line breaks kept as they are;
* a JSON Lines file (``*.jsonl``): one JSON object per line; the text is the string in field ``text_field``
  (blank lines are skipped); each record is encoded on its own;
* a folder: every file below it whose name ends in one of :data:`FOLDER_SUFFIXES`, recursively, skipping hidden
  files and folders (names starting with ``.``).

Nothing is inserted between files or records; put a separator in the text if the model should see one.

Streaming. Files are read :data:`READ_BYTES` (256 KiB) at a time and never whole, and encoded
:data:`BATCH_CHARS` characters at a time, so memory stays bounded whatever the input size. Text is cut into pieces
just before a space that follows a non-space character, where every common pre-tokenizer (GPT-2's byte-level
regex, cl100k / Llama 3 regexes, SentencePiece's metaspace) splits anyway, so the ids equal those of encoding the
whole file at once. Only a run of more than ``2 * READ_BYTES`` characters without such a space is cut where the
buffer ends (for ``char`` that changes nothing; a BPE may merge differently across that one cut).

A ``char`` or ``bpe:N`` tokenizer is trained on a first pass over the inputs and the text is encoded on a second.
Writes are atomic: everything goes to temporary names in the output folder, the old ``meta.json`` is removed, the
data files are renamed into place and ``meta.json`` comes last, so an interrupted run never leaves a folder that
:meth:`modkit.data.dataset.TokenData.open` accepts with the wrong contents.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np

from ..errors import DataError
from ..jsonio import JSONInputError, check_regular_file, read_json_file
from .tokenizer import TOKENIZER_FILE, Tokenizer, UnknownTokenError, load_tokenizer, parse_spec, train_tokenizer

#: ``meta.json``'s ``format`` and ``format_version``.
FORMAT = "modkit-token-data"
FORMAT_VERSION = 1
#: Bytes read from a file at a time (the streaming chunk).
READ_BYTES = 1 << 18
#: Characters of text handed to the tokenizer's (multi-threaded) ``encode_batch`` at once: it bounds the memory of
#: a run (the tokenizers library holds some 130 bytes per token of a batch while encoding it).
BATCH_CHARS = 1 << 20
#: File name endings a folder input picks up.
FOLDER_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst", ".jsonl")
#: How the splits are cut, as ``meta.json`` records it.
SPLIT_RULE = "train = the first int(n_tokens * (1 - val_fraction)) tokens, val = the rest (nanoGPT)"
#: The files of a prepared dataset.
TRAIN_FILE, VAL_FILE, META_FILE = "train.bin", "val.bin", "meta.json"

# A space whose previous character is not whitespace, found from the end by searching the reversed text.
_CUT_REVERSED = re.compile(r" (?=\S)")


@dataclass(frozen=True)
class Source:
    """One input file: ``path`` (resolved), ``jsonl`` (JSON Lines or plain text), ``size`` in bytes."""

    path: Path
    jsonl: bool
    size: int


@dataclass(frozen=True)
class _Piece:
    """Text to encode and where it starts: ``line``/``column`` (1-based) in a text file, ``line`` = record in JSONL."""

    text: str
    source: Source
    line: int
    column: int | None


def dtype_for(vocab_size: int) -> np.dtype:
    """``uint16`` when every id fits (``vocab_size <= 65536``), else ``uint32``."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def find_sources(inputs: Sequence[str | Path]) -> list[Source]:
    """The input files, in order: files as given, folders expanded (recursively, sorted, :data:`FOLDER_SUFFIXES`).

    Raises:
        DataError: no inputs, a path that does not exist or is not a regular file (a FIFO, a device), or a folder with
            no input files in it.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise DataError("no inputs: give text files, .jsonl files or folders of them")
    sources: list[Source] = []
    for item in inputs:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(
                (p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(FOLDER_SUFFIXES)
                 and not any(part.startswith(".") for part in p.relative_to(path).parts)),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not found:
                raise DataError(f"{path}: no input files in this folder (looked for {', '.join('*' + s for s in FOLDER_SUFFIXES)})")
            sources += [_source(p) for p in found]
        elif path.exists() or path.is_symlink():
            sources.append(_source(path))
        else:
            raise DataError(f"{path}: no such file or folder; check the input path")
    seen: set[Path] = set()
    for src in sources:
        if src.path in seen:
            raise DataError(f"{src.path}: given twice (directly or inside a folder input); list each file once")
        seen.add(src.path)
    return sources


def _source(path: Path) -> Source:
    """A checked input: a regular file (a FIFO, device or socket would block or never end; refused by name)."""
    try:
        check_regular_file(path)
    except JSONInputError as exc:
        raise DataError(f"{exc}; give text files, .jsonl files or folders of them") from None
    path = path.resolve()
    return Source(path, path.name.lower().endswith(".jsonl"), path.stat().st_size)


def _safe_cut(text: str) -> int | None:
    """Index of the last space that follows a non-space character (a place to cut text), or ``None``."""
    m = _CUT_REVERSED.search(text[::-1])
    return None if m is None else len(text) - 1 - m.start()


def _text_pieces(src: Source, on_bytes: Callable[[bytes], None]) -> Iterator[_Piece]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    buf, offset, line, column = "", 0, 1, 1
    with open(src.path, "rb") as f:
        while True:
            raw = f.read(READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                buf += decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                at = offset - pending + exc.start
                raise DataError(
                    f"{src.path}: not UTF-8 text ({exc.reason} at byte {at}); convert it to UTF-8 first, e.g. "
                    f"`iconv -f latin1 -t utf-8 {src.path.name} > {src.path.stem}.utf8{src.path.suffix}`"
                ) from None
            offset += len(raw)
            on_bytes(raw)
            if not raw:
                break
            cut = _safe_cut(buf)
            if cut is None and len(buf) >= 2 * READ_BYTES:
                cut = len(buf)
            if cut:
                head, buf = buf[:cut], buf[cut:]
                yield _Piece(head, src, line, column)
                line, column = _advance(head, line, column)
    if buf:
        yield _Piece(buf, src, line, column)


def _advance(text: str, line: int, column: int) -> tuple[int, int]:
    newlines = text.count("\n")
    if newlines:
        return line + newlines, len(text) - text.rfind("\n")
    return line, column + len(text)


def _jsonl_pieces(src: Source, on_bytes: Callable[[bytes], None], text_field: str) -> Iterator[_Piece]:
    with open(src.path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            on_bytes(raw)
            if not raw.strip():
                continue
            where = f"{src.path}:{lineno}"
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); convert the file to UTF-8") from None
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line of a .jsonl file must be "
                    f"one JSON object, e.g. {{\"{text_field}\": \"...\"}}"
                ) from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: a JSON {type(record).__name__}, not an object with a {text_field!r} field")
            if text_field not in record:
                fields = ", ".join(repr(k) for k in list(record)[:8]) or "none"
                raise DataError(
                    f"{where}: no field {text_field!r} (fields: {fields}); name the field that holds the text "
                    f"with --text-field (text_field=...)"
                )
            text = record[text_field]
            if not isinstance(text, str):
                raise DataError(f"{where}: field {text_field!r} is a {type(text).__name__}, not a string of text")
            yield _Piece(text, src, lineno, None)


def _pieces(sources: Iterable[Source], text_field: str, on_bytes: Callable[[bytes], None]) -> Iterator[_Piece]:
    for src in sources:
        yield from (_jsonl_pieces(src, on_bytes, text_field) if src.jsonl else _text_pieces(src, on_bytes))


class _Progress:
    """A tqdm bar over the input bytes that also shows the tokens written (no output when ``show`` is false)."""

    def __init__(self, total: int, desc: str, show: bool):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not show)
        self.tokens = 0

    def on_bytes(self, raw: bytes) -> None:
        self.bar.update(len(raw))

    def add_tokens(self, n: int) -> None:
        self.tokens += n
        self.bar.set_postfix_str(f"{self.tokens:,} tokens", refresh=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def _check_fraction(val_fraction) -> float:
    try:
        value = float(val_fraction)
    except (TypeError, ValueError):
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise DataError(f"val_fraction = {val_fraction!r} must be a number in (0, 1), e.g. 0.1 (the last 10% of the tokens)")
    return value


def _recipe(tokenizer: str, val_fraction: float, text_field: str, sources: Sequence[str]) -> dict:
    return {"tokenizer": tokenizer, "val_fraction": val_fraction, "text_field": text_field, "sources": list(sources)}


def _check_out_dir(out: Path, recipe: dict, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"{out}: exists and is not a folder; choose another output folder (-o)")
    meta_path = out / META_FILE
    if overwrite or not meta_path.is_file():
        return
    try:
        old = read_json_file(meta_path)
        old_recipe = _recipe(old["tokenizer"], old["val_fraction"], old["text_field"], [s["path"] for s in old["sources"]])
    except (ValueError, KeyError, TypeError):  # JSONInputError is a ValueError
        raise DataError(f"{out} holds a {META_FILE} that is not a modkit dataset's; choose another output folder (-o) or delete it") from None
    if old_recipe != recipe:
        diffs = [f"{k} {old_recipe[k]!r} there, {recipe[k]!r} now" for k in recipe if k != "sources" and old_recipe[k] != recipe[k]]
        if old_recipe["sources"] != recipe["sources"]:
            diffs.append(f"sources {_short(old_recipe['sources'])} there, {_short(recipe['sources'])} now")
        raise DataError(
            f"{out} already holds a different dataset ({'; '.join(diffs)}); choose another output folder (-o) or "
            f"delete {out} first"
        )


def _short(paths: Sequence[str]) -> str:
    names = [Path(p).name for p in paths[:3]]
    return "[" + ", ".join(names) + (f", ... {len(paths)} files" if len(paths) > 3 else "") + "]"


def _no_text(sources: Sequence[Source]) -> DataError:
    what = ", ".join(f"{s.path} ({s.size:,} bytes)" for s in sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    return DataError(f"the inputs hold no text: {what}; give files with text in them (for .jsonl, non-empty text fields)")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _encode_all(sources, tokenizer: Tokenizer, dtype, text_field: str, out, progress: _Progress, hashes, counts) -> None:
    """Encode every piece, appending the ids to ``out``; fills ``hashes`` (sha256 objects) and ``counts`` per source."""

    def on_bytes(raw: bytes) -> None:
        progress.on_bytes(raw)
        hashes[current[0]].update(raw)

    current = [None]
    batch: list[_Piece] = []
    size = 0

    def flush() -> None:
        try:
            encoded = tokenizer.encode_batch([p.text for p in batch])
        except UnknownTokenError as exc:
            raise _located(exc, batch[exc.index], tokenizer) from None
        for piece, ids in zip(batch, encoded):
            np.asarray(ids, dtype=dtype).tofile(out)
            counts[piece.source.path] += len(ids)
            progress.add_tokens(len(ids))
        batch.clear()

    for src in sources:
        current[0] = src.path
        pieces = _jsonl_pieces(src, on_bytes, text_field) if src.jsonl else _text_pieces(src, on_bytes)
        for piece in pieces:
            batch.append(piece)
            size += len(piece.text)
            if size >= BATCH_CHARS:
                flush()
                size = 0
    flush()


def _located(exc: UnknownTokenError, piece: _Piece, tokenizer: Tokenizer) -> DataError:
    pos = exc.position
    if piece.column is None:
        where = f"{piece.source.path}:{piece.line}: the record's text, character {pos}"
    else:
        before = piece.text.rfind("\n", 0, pos)
        line = piece.line + piece.text.count("\n", 0, pos)
        column = pos - before if before >= 0 else piece.column + pos
        where = f"{piece.source.path}:{line}:{column}"
    return DataError(f"{where}: {exc}".replace(f" at position {pos} ", " "))


def prepare(
    inputs: Sequence[str | Path],
    out_dir: str | Path,
    *,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    text_field: str = "text",
    show_progress: bool = True,
    overwrite: bool = False,
) -> dict:
    """Tokenize text into a dataset folder: ``train.bin``, ``val.bin``, ``tokenizer.json``, ``meta.json``.

    Args:
        inputs: text files, ``.jsonl`` files and folders (see the module docstring for what each contributes).
        out_dir: the dataset folder (created; it may already hold a dataset of the same inputs and options, which
            is replaced).
        tokenizer: ``"char"``, ``"bpe:N"`` (trained on the inputs) or the path of a ``tokenizer.json`` (or of a
            folder holding one).
        val_fraction: share of the tokens, taken from the end, that forms ``val.bin``; in (0, 1).
        text_field: the field of a JSON Lines record that holds its text.
        show_progress: show a tqdm bar (bytes read, tokens written) on stderr.
        overwrite: replace whatever dataset ``out_dir`` holds, even one of other inputs or options.

    Returns:
        the ``meta.json`` written: ``format``, ``format_version``, ``tokenizer`` (spec), ``vocab_size``, ``dtype``,
            ``tokens`` (``{"train": n, "val": m}``), ``val_fraction``, ``split`` (the rule), ``text_field``,
            ``sources`` (path, format, bytes, sha256, tokens of each input file) and ``files`` (bytes and sha256 of
            each file written).

    Raises:
        DataError: a missing input, a folder without input files, empty input, a file that is not UTF-8, a bad
            JSON Lines record, a bad tokenizer spec or one too small, text the tokenizer cannot encode,
            ``val_fraction`` outside (0, 1), too few tokens for two splits, or an ``out_dir`` holding a different
            dataset. Each message names the file (and line) and the fix.
    """
    val_fraction = _check_fraction(val_fraction)
    sources = find_sources(inputs)
    kind, size = parse_spec(tokenizer)
    tok: Tokenizer | None = None
    spec = {"char": "char", "bpe": f"bpe:{size}"}.get(kind, "")
    if kind == "path":
        tok = load_tokenizer(tokenizer)
        spec = tok.spec = str(Path(tok.spec).resolve())
    out = Path(out_dir).expanduser()
    _check_out_dir(out, _recipe(spec, val_fraction, text_field, [str(s.path) for s in sources]), overwrite)
    total = sum(s.size for s in sources)
    if tok is None:
        chars = [0, False]  # characters read, all read

        def texts() -> Iterator[str]:
            for piece in _pieces(sources, text_field, progress.on_bytes):
                chars[0] += len(piece.text)
                yield piece.text
            chars[1] = True

        with _Progress(total, f"tokenizer {spec}", show_progress) as progress:
            try:
                tok = train_tokenizer(spec, texts())
            except DataError:
                if chars == [0, True]:
                    raise _no_text(sources) from None
                raise
    dtype = dtype_for(tok.vocab_size)

    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    tmp = {name: out / f".{name}.tmp-{os.getpid()}" for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE, META_FILE)}
    done = False
    try:
        hashes = {s.path: hashlib.sha256() for s in sources}
        counts = {s.path: 0 for s in sources}
        with _Progress(total, "encode", show_progress) as progress, open(tmp[TRAIN_FILE], "wb") as f:
            _encode_all(sources, tok, dtype, text_field, f, progress, hashes, counts)
        n = sum(counts.values())
        if n == 0:
            raise _no_text(sources)
        n_train = int(n * (1.0 - val_fraction))
        if n_train == 0 or n_train == n:
            raise DataError(
                f"{n} tokens are too few to split with val_fraction = {val_fraction} ({n_train} train, {n - n_train} "
                f"val); give more text or another val_fraction"
            )
        _split(tmp[TRAIN_FILE], tmp[VAL_FILE], n_train * dtype.itemsize)
        tok.save(tmp[TOKENIZER_FILE])
        files = {
            name: {"bytes": tmp[name].stat().st_size, "sha256": _sha256(tmp[name])} for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE)
        }
        from .. import __version__

        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "tokenizer": tok.spec,
            "vocab_size": tok.vocab_size,
            "dtype": dtype.name,
            "tokens": {"train": n_train, "val": n - n_train},
            "val_fraction": val_fraction,
            "split": SPLIT_RULE,
            "text_field": text_field,
            "sources": [
                {
                    "path": str(s.path),
                    "format": "jsonl" if s.jsonl else "text",
                    "bytes": s.size,
                    "sha256": hashes[s.path].hexdigest(),
                    "tokens": counts[s.path],
                }
                for s in sources
            ],
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
