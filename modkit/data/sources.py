"""Input files of ``modkit data prepare``: what each is, and the documents it holds, read as a stream.

Formats, told apart by the name:

* a text file (any name not listed below; ``.gz`` / ``.zst`` compressed too): one document, its whole text, read
  as UTF-8 with line breaks kept as they are;
* JSON Lines (``*.jsonl``, and compressed ``*.jsonl.gz``, ``*.jsonl.zst``, ``*.json.gz``, ``*.json.zst`` as Dolma
  and many crawls ship them): one JSON object per line, one document per record, its text in field ``text_field``
  (blank lines are skipped);
* Parquet (``*.parquet``, FineWeb's and most Hugging Face datasets' shards; needs ``pyarrow``): one document per
  row, its text in column ``text_field``;
* a Hugging Face ``datasets`` folder written by ``save_to_disk`` (it holds ``state.json`` or
  ``dataset_dict.json``; needs ``datasets``): one document per row; of a ``DatasetDict``, the split asked for;
* a folder: every file below it whose name ends in one of :data:`FOLDER_SUFFIXES`, recursively, sorted by
  relative path, skipping hidden files and folders (names starting with ``.``).

Streaming. A text file is read :data:`READ_BYTES` at a time and cut into pieces just before a space that follows a
non-space character, where every common pre-tokenizer (GPT-2's byte-level regex, cl100k / Llama 3 regexes,
SentencePiece's metaspace) splits anyway, so the ids equal those of encoding the whole file at once. Only a run of
more than ``2 * READ_BYTES`` characters without such a space is cut where the buffer ends (for ``char`` that
changes nothing; a BPE may merge differently across that one cut). Records and rows are read one batch at a time
(:data:`ROWS_PER_BATCH`), so memory stays bounded by the chunk sizes and the longest document, whatever the input.
"""

from __future__ import annotations

import codecs
import gzip
import hashlib
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from modkit.core.errors import DataError
from modkit.core.jsonio import JSONInputError, check_regular_file

#: Bytes read from a file at a time (the streaming chunk).
READ_BYTES = 1 << 18
#: Rows of a Parquet file or ``datasets`` folder read at a time.
ROWS_PER_BATCH = 1024
#: Compressed-file endings and their codec.
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
#: Name endings of JSON Lines files (plain and compressed).
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd", ".json.gz", ".json.zst", ".json.zstd")
#: File name endings a folder input picks up.
FOLDER_SUFFIXES = (".txt", ".text", ".md", ".markdown", ".rst", ".txt.gz", ".txt.zst") + JSONL_SUFFIXES + (".parquet",)
#: Files that mark a folder written by ``datasets``' ``save_to_disk`` (a Dataset; a DatasetDict).
DATASET_MARKERS = ("state.json", "dataset_dict.json")

# A space whose previous character is not whitespace, found from the end by searching the reversed text.
_CUT_REVERSED = re.compile(r" (?=\S)")


@dataclass(frozen=True)
class Source:
    """One input: ``path`` (resolved), ``format`` (``text``, ``jsonl``, ``parquet`` or ``dataset``), ``compression``
    (``None``, ``gzip``, ``zstd``), ``size`` in bytes (of the file, or of a dataset folder's data files) and, for a
    ``datasets`` folder holding a ``DatasetDict``, the ``split`` read."""

    path: Path
    format: str
    size: int
    compression: Optional[str] = None
    split: Optional[str] = None

    @property
    def jsonl(self) -> bool:
        """JSON Lines (plain or compressed)."""
        return self.format == "jsonl"

    @property
    def label(self) -> str:
        """The path, with the split of a ``DatasetDict`` (``folder[validation]``)."""
        return f"{self.path}[{self.split}]" if self.split else str(self.path)


@dataclass(frozen=True)
class Piece:
    """Text to encode: a whole document or part of one (a text file is read in pieces).

    ``starts`` / ``ends``: the piece is the first / last of its document (a begin-of-text token goes before,
    an end-of-text token after). ``line`` / ``column`` (1-based) locate it in a text file; for a record or row
    ``line`` is its number (1-based) and ``column`` is ``None``.
    """

    text: str
    source: Source
    line: int
    column: Optional[int]
    starts: bool = True
    ends: bool = True


def _is_dataset_folder(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in DATASET_MARKERS)


def find_sources(inputs: Sequence[str | Path], *, split: str = "train") -> list[Source]:
    """The inputs, in order: files as given, folders expanded (recursively, sorted, :data:`FOLDER_SUFFIXES`), a
    ``datasets`` folder as one source (its ``split`` when it holds a ``DatasetDict``).

    Raises:
        DataError: no inputs, a path that does not exist or is not a regular file (a FIFO, a device), a folder with
            no input files in it, a file listed twice, or a ``DatasetDict`` without the split.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise DataError("no inputs: give text files, .jsonl / .parquet files, datasets folders or folders of them")
    sources: list[Source] = []
    for item in inputs:
        path = Path(item).expanduser()
        if _is_dataset_folder(path):
            sources.append(_dataset_source(path, split))
        elif path.is_dir():
            found = sorted(
                (
                    p
                    for p in path.rglob("*")
                    if p.is_file()
                    and p.name.lower().endswith(FOLDER_SUFFIXES)
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                ),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not found:
                raise DataError(
                    f"{path}: no input files in this folder (looked for {', '.join('*' + s for s in FOLDER_SUFFIXES)})"
                )
            sources += [_file_source(p) for p in found]
        elif path.exists() or path.is_symlink():
            sources.append(_file_source(path))
        else:
            raise DataError(f"{path}: no such file or folder; check the input path")
    seen: set[str] = set()
    for src in sources:
        if src.label in seen:
            raise DataError(f"{src.label}: given twice (directly or inside a folder input); list each file once")
        seen.add(src.label)
    return sources


def _file_source(path: Path) -> Source:
    """A checked input file: a regular file (a FIFO, device or socket would block or never end; refused by name)."""
    try:
        check_regular_file(path)
    except JSONInputError as exc:
        raise DataError(f"{exc}; give text files, .jsonl / .parquet files or folders of them") from None
    path = path.resolve()
    name = path.name.lower()
    compression = next((c for s, c in COMPRESSION.items() if name.endswith(s)), None)
    fmt = "jsonl" if name.endswith(JSONL_SUFFIXES) else "parquet" if name.endswith(".parquet") else "text"
    if fmt == "parquet":
        _require("pyarrow", f"{path}: reading Parquet")
    if compression == "zstd":
        _require("zstandard", f"{path}: reading zstd-compressed files")
    return Source(path, fmt, path.stat().st_size, compression)


def _require(module: str, what: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise DataError(f"{what} needs the {module} package: pip install 'modkit-lm[data]' (or pip install {module})")


def _dataset_source(path: Path, split: str) -> Source:
    _require("datasets", f"{path}: reading a datasets folder (save_to_disk)")
    path = path.resolve()
    chosen = None
    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            raise DataError(
                f"{path}/dataset_dict.json: not a datasets DatasetDict file; save it again with save_to_disk"
            ) from None
        if split not in splits:
            raise DataError(
                f"{path}: a DatasetDict without split {split!r} (splits: {', '.join(map(repr, splits))}); choose one with --split / --val-split"
            )
        chosen, folder = split, path / split
    else:
        folder = path
    size = sum(p.stat().st_size for p in folder.glob("*.arrow"))
    return Source(path, "dataset", size, None, chosen)


# ------------------------------------------------------------------------------------------------ reading


class _Counting(io.RawIOBase):
    """A raw reader that hands every byte it reads from ``f`` to ``on_bytes`` (hash and progress of compressed files)."""

    def __init__(self, f, on_bytes: Callable[[bytes], None]):
        self.f, self.on_bytes = f, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        data = self.f.read(len(b))
        self.on_bytes(data)
        b[: len(data)] = data
        return len(data)


def _open(src: Source, on_bytes: Callable[[bytes], None]):
    """A binary stream of the file's (decompressed) bytes; ``on_bytes`` sees the bytes of the file itself."""
    raw = open(src.path, "rb")
    counted = io.BufferedReader(_Counting(raw, on_bytes), READ_BYTES)
    if src.compression == "gzip":
        return gzip.GzipFile(fileobj=counted, mode="rb"), raw
    if src.compression == "zstd":
        import zstandard

        return io.BufferedReader(
            zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True), READ_BYTES
        ), raw
    return counted, raw


def _read(src, read, *args):
    """``read(*args)`` on an input's stream, a failed decompression raised as the input's DataError.

    Raises:
        DataError: the stream is compressed and cannot be decompressed (gzip's OSError / EOFError, zstandard's
            ZstdError), named by :func:`_decompress_error`.
    """
    try:
        return read(*args)
    except (OSError, EOFError) as exc:
        raise _decompress_error(src, exc) from None
    except Exception as exc:  # zstandard.ZstdError
        if src.compression:
            raise _decompress_error(src, exc) from None
        raise


def _decompress_error(src: Source, exc: Exception) -> DataError:
    return DataError(f"{src.path}: not a valid {src.compression} file ({exc}); check the file or its name's ending")


def _safe_cut(text: str) -> int | None:
    """Index of the last space that follows a non-space character (a place to cut text), or ``None``."""
    m = _CUT_REVERSED.search(text[::-1])
    return None if m is None else len(text) - 1 - m.start()


def _text_pieces(src: Source, on_bytes: Callable[[bytes], None]) -> Iterator[Piece]:
    decoder = codecs.getincrementaldecoder("utf-8")()
    buf, offset, line, column, first = "", 0, 1, 1, True
    stream, raw_file = _open(src, on_bytes)
    with raw_file, stream:
        while True:
            raw = _read(src, stream.read, READ_BYTES)
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
            if not raw:
                break
            cut = _safe_cut(buf)
            if cut is None and len(buf) >= 2 * READ_BYTES:
                cut = len(buf)
            if cut:
                head, buf = buf[:cut], buf[cut:]
                yield Piece(head, src, line, column, starts=first, ends=False)
                first = False
                line, column = _advance(head, line, column)
    yield Piece(buf, src, line, column, starts=first, ends=True)  # the file's last piece ends its document


def _advance(text: str, line: int, column: int) -> tuple[int, int]:
    newlines = text.count("\n")
    if newlines:
        return line + newlines, len(text) - text.rfind("\n")
    return line, column + len(text)


def _jsonl_pieces(src: Source, on_bytes: Callable[[bytes], None], text_field: str) -> Iterator[Piece]:
    stream, raw_file = _open(src, on_bytes)
    with raw_file, stream:
        lineno = 0
        while True:
            raw = _read(src, stream.readline)
            if not raw:
                break
            lineno += 1
            if not raw.strip():
                continue
            where = f"{src.path}:{lineno}"
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise DataError(
                    f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); convert the file to UTF-8"
                ) from None
            except json.JSONDecodeError as exc:
                raise DataError(
                    f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line of a .jsonl file must be "
                    f'one JSON object, e.g. {{"{text_field}": "..."}}'
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
            yield Piece(text, src, lineno, None)


def _rows(
    src: Source, batches: Iterator, total_rows: int, on_size: Callable[[int], None], text_field: str, what: str
) -> Iterator[Piece]:
    """Documents of record batches (``{text_field: [...]}`` columns); progress in shares of the source's bytes."""
    row, reported = 0, 0
    for batch in batches:
        for text in batch:
            row += 1
            if not isinstance(text, str):
                kind = "null" if text is None else type(text).__name__
                raise DataError(
                    f"{src.label}: {what} {row}: {text_field!r} is {kind}, not a string of text; drop or fill those rows first"
                )
            yield Piece(text, src, row, None)
        share = src.size * row // max(total_rows, 1)
        on_size(share - reported)
        reported = share
    on_size(src.size - reported)


def _columns(names: Sequence[str], src: Source, text_field: str) -> None:
    if text_field not in names:
        shown = ", ".join(repr(n) for n in list(names)[:8]) or "none"
        raise DataError(
            f"{src.label}: no column {text_field!r} (columns: {shown}); name the text column with --text-field (text_field=...)"
        )


def _parquet_pieces(src: Source, on_size: Callable[[int], None], text_field: str) -> Iterator[Piece]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid and others
        raise DataError(f"{src.path}: not a Parquet file ({exc})") from None
    _columns(pf.schema_arrow.names, src, text_field)
    batches = (b.column(0).to_pylist() for b in pf.iter_batches(batch_size=ROWS_PER_BATCH, columns=[text_field]))
    yield from _rows(src, batches, pf.metadata.num_rows, on_size, text_field, "row")


def _dataset_pieces(src: Source, on_size: Callable[[int], None], text_field: str) -> Iterator[Piece]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(src.path))
    except Exception as exc:  # noqa: BLE001 - datasets raises several kinds
        raise DataError(f"{src.path}: not a datasets folder written by save_to_disk ({exc})") from None
    if src.split is not None:
        ds = ds[src.split]
    _columns(ds.column_names, src, text_field)
    ds = ds.select_columns([text_field])
    batches = (b[text_field] for b in ds.iter(batch_size=ROWS_PER_BATCH))
    yield from _rows(src, batches, len(ds), on_size, text_field, "row")


def pieces(
    src: Source, text_field: str, on_bytes: Callable[[bytes], None], on_size: Callable[[int], None]
) -> Iterator[Piece]:
    """The pieces of one source, in order. ``on_bytes(raw)`` sees every byte of a text or JSON Lines file as read
    (compressed bytes for a compressed one); ``on_size(n)`` advances by ``n`` bytes for Parquet and ``datasets``
    sources (read by rows)."""
    if src.format == "text":
        return _text_pieces(src, on_bytes)
    if src.format == "jsonl":
        return _jsonl_pieces(src, on_bytes, text_field)
    if src.format == "parquet":
        return _parquet_pieces(src, on_size, text_field)
    return _dataset_pieces(src, on_size, text_field)


def source_digest(src: Source) -> str:
    """sha256 of a Parquet file, or of a ``datasets`` folder's data files in order (text and JSON Lines files are
    hashed while they are read)."""
    h = hashlib.sha256()
    files = [src.path] if src.format == "parquet" else sorted((src.path / (src.split or "")).glob("*.arrow"))
    for file in files:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
