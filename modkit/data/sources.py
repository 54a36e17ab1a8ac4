"""Input files of ``modkit data prepare``: what each is, and the documents it holds, read as a stream.

Formats, told apart by the name:

* a text file (any name not listed below; ``.gz`` / ``.zst`` compressed too): one document, its whole text, read
  as UTF-8 with line breaks kept as they are;
* JSON Lines (``*.jsonl`` and ``*.json``, and compressed ``*.jsonl.gz``, ``*.jsonl.zst``, ``*.json.gz``,
  ``*.json.zst`` as Dolma and many crawls ship them): one JSON object per line, one document per record, its text
  in field ``text_field`` (blank lines are skipped). A ``.json`` file is read as JSON Lines too; one that holds a
  single JSON document (an array of records, a pretty-printed object) is refused with the reason and the fix;
* Parquet (``*.parquet``, FineWeb's and most Hugging Face datasets' shards; needs ``pyarrow``): one document per
  row, its text in column ``text_field``;
* a Hugging Face ``datasets`` folder written by ``save_to_disk`` (it holds ``state.json`` or
  ``dataset_dict.json``; needs ``datasets``): one document per row; of a ``DatasetDict``, the split asked for;
* a folder: every file below it whose name ends in one of :data:`FOLDER_SUFFIXES`, recursively, sorted by
  relative path (:mod:`modkit.data.folders`). What it skips (hidden entries, other names, links that lead outside
  the folder unless ``follow_symlinks``) is listed in a :class:`DataNote` warning.

Memory is bounded by constants, not by the input. Files are read :data:`READ_BYTES` at a time (every read asks for
at most that many bytes; a JSON Lines record is never read as a whole line when it is longer than
:data:`LINE_BYTES`: :mod:`modkit.data.jsonl` streams it). A document (a text file, a record's text, a row) longer
than :data:`PIECE_CHARS` characters is encoded in pieces of at most that many characters, cut just before a space
that follows a non-space, where the common pre-tokenizers split anyway, so the ids equal those of the whole
document; only a run of more than :data:`PIECE_CHARS` characters without such a space is cut at that size, where a
BPE may merge differently (:mod:`modkit.data.cutting` says exactly how pieces join). Parquet and ``datasets`` rows
are read :data:`ROWS_PER_BATCH` at a time; a Parquet value cannot be read in part, so their memory also grows with
the longest row of a batch.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from modkit.core.errors import DataError
from modkit.core.jsonio import JSONInputError, check_regular_file
from . import compressed
from . import cutting as _cutting
from .cutting import TextCutter
from .folders import folder_files, skipped_note
from .jsonl import records

#: Bytes of a file (decompressed) asked for by one read: no read asks for more.
READ_BYTES = 1 << 18
#: Characters of the longest piece encoded at once: longer documents are cut (:mod:`modkit.data.cutting`).
PIECE_CHARS = 1 << 19
#: Bytes of the longest JSON Lines line parsed whole; longer records are parsed as they stream in.
LINE_BYTES = 1 << 20
#: Rows of a Parquet file or ``datasets`` folder read at a time.
ROWS_PER_BATCH = 1024
#: Compressed-file endings and their codec.
COMPRESSION = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
#: Name endings of JSON Lines files (plain and compressed).
JSONL_SUFFIXES = (
    ".jsonl",
    ".json",
    ".jsonl.gz",
    ".jsonl.zst",
    ".jsonl.zstd",
    ".json.gz",
    ".json.zst",
    ".json.zstd",
)
#: File name endings a folder input picks up.
FOLDER_SUFFIXES = (
    (".txt", ".text", ".md", ".markdown", ".rst", ".txt.gz", ".txt.zst", ".txt.zstd") + JSONL_SUFFIXES + (".parquet",)
)
#: Files that mark a folder written by ``datasets``' ``save_to_disk`` (a Dataset; a DatasetDict).
DATASET_MARKERS = ("state.json", "dataset_dict.json")


class DataNote(UserWarning):
    """Something ``prepare`` skipped or cleaned up that the user should know of: the entries a folder input skips
    (with the reasons), temporary files of earlier runs removed. ``modkit data prepare`` prints each as a
    ``modkit: note: ...`` line on stderr."""


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
    """Text to encode: a whole document or part of one (at most :data:`PIECE_CHARS` characters).

    ``starts`` / ``ends``: the piece is the first / last of its document (a begin-of-text token goes before,
    an end-of-text token after). ``line`` / ``column`` (1-based) locate it in a text file; for a record or row
    ``line`` is its number (1-based) and ``column`` is ``None``. ``offset``: characters of the document before
    the piece.
    """

    text: str
    source: Source
    line: int
    column: Optional[int]
    starts: bool = True
    ends: bool = True
    offset: int = 0


def _is_dataset_folder(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in DATASET_MARKERS)


def _input_path(item) -> Path:
    """An input as a path.

    Raises:
        DataError: a path holding a NUL byte (no file can be named so), or one that is not text.
    """
    try:
        text = str(Path(item))
    except TypeError:
        raise DataError(f"{item!r}: not a path; give the inputs as file or folder names") from None
    if "\x00" in text:
        raise DataError(f"{text!r}: not a usable path (it holds a NUL byte); check the input path")
    return Path(text).expanduser()


def find_sources(inputs: Sequence[str | Path], *, split: str = "train", follow_symlinks: bool = False) -> list[Source]:
    """The inputs, in order: files as given, folders expanded (recursively, sorted, :data:`FOLDER_SUFFIXES`), a
    ``datasets`` folder as one source (its ``split`` when it holds a ``DatasetDict``).

    What a folder skips is listed in one :class:`DataNote` warning per folder (:mod:`modkit.data.folders`); links
    inside a folder that lead outside it are read only with ``follow_symlinks``.

    Raises:
        DataError: no inputs, a path that does not exist, holds a NUL byte or is not a regular file (a FIFO, a
            device), a folder with no input files in it, a file listed twice, or a ``DatasetDict`` without the
            split.
    """
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    if not inputs:
        raise DataError("no inputs: give text files, .jsonl / .parquet files, datasets folders or folders of them")
    sources: list[Source] = []
    for item in inputs:
        path = _input_path(item)
        if _is_dataset_folder(path):
            sources.append(_dataset_source(path, split))
        elif path.is_dir():
            found, skipped = folder_files(path, FOLDER_SUFFIXES, follow_symlinks=follow_symlinks)
            if skipped:
                warnings.warn(skipped_note(path, skipped), DataNote, stacklevel=2)
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


def split_text(text: str) -> list[str]:
    """``text`` cut into pieces of at most :data:`PIECE_CHARS` characters, before a space that follows a non-space
    where there is one (:func:`modkit.data.cutting.split_text`)."""
    return _cutting.split_text(text, PIECE_CHARS)


def _text_pieces(src: Source, on_bytes: Callable[[bytes], None]) -> Iterator[Piece]:
    """The pieces of a text file (one document), read :data:`READ_BYTES` at a time."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    cutter = TextCutter(PIECE_CHARS)
    offset, line, column, first = 0, 1, 1, True
    stream, raw_file = compressed.open_stream(src, on_bytes)
    with raw_file, stream:
        while True:
            raw = compressed.read_checked(src, stream.read, READ_BYTES)
            pending = len(decoder.getstate()[0])
            try:
                chunk = decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as exc:
                at = offset - pending + exc.start
                raise DataError(
                    f"{src.path}: not UTF-8 text ({exc.reason} at byte {at}); convert it to UTF-8 first, e.g. "
                    f"`iconv -f latin1 -t utf-8 {src.path.name} > {src.path.stem}.utf8{src.path.suffix}`"
                ) from None
            offset += len(raw)
            for head, at in cutter.feed(chunk):
                yield Piece(head, src, line, column, starts=first, ends=False, offset=at)
                first = False
                line, column = _advance(head, line, column)
            if not raw:
                break
    text, at = cutter.finish()
    yield Piece(text, src, line, column, starts=first, ends=True, offset=at)  # the file's last piece ends it


def _advance(text: str, line: int, column: int) -> tuple[int, int]:
    newlines = text.count("\n")
    if newlines:
        return line + newlines, len(text) - text.rfind("\n")
    return line, column + len(text)


def _jsonl_pieces(src: Source, on_bytes: Callable[[bytes], None], text_field: str) -> Iterator[Piece]:
    """The pieces of every record of a JSON Lines file (:func:`modkit.data.jsonl.records`)."""
    stream, raw_file = compressed.open_stream(src, on_bytes)

    def read(n: int) -> bytes:
        return compressed.read_checked(src, stream.read, n)

    with raw_file, stream:
        parts = records(src, read, text_field, read_bytes=READ_BYTES, line_bytes=LINE_BYTES, piece_chars=PIECE_CHARS)
        for text, line, starts, ends, offset in parts:
            yield Piece(text, src, line, None, starts=starts, ends=ends, offset=offset)


def _row_pieces(src: Source, row: int, text) -> Iterator[Piece]:
    """The pieces of one row's text (cut when longer than :data:`PIECE_CHARS`)."""
    offset, parts = 0, split_text(text)
    for i, part in enumerate(parts):
        yield Piece(part, src, row, None, starts=i == 0, ends=i == len(parts) - 1, offset=offset)
        offset += len(part)


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
            yield from _row_pieces(src, row, text)
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


def _parquet_batches(src: Source, pf, text_field: str) -> Iterator[list]:
    """The text column of a Parquet file, :data:`ROWS_PER_BATCH` rows at a time, row group by row group.

    Raises:
        DataError: a row group that cannot be read (a damaged or truncated page, a failed page checksum), naming
            the file, the row group and its rows.
    """
    first = 0
    for group in range(pf.num_row_groups):
        rows = pf.metadata.row_group(group).num_rows
        try:
            for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, row_groups=[group], columns=[text_field]):
                yield batch.column(0).to_pylist()
        except Exception as exc:  # noqa: BLE001 - pyarrow raises OSError, ArrowInvalid and others
            raise DataError(
                f"{src.path}: row group {group + 1} (rows {first + 1} to {first + rows}): cannot be read ({exc}); "
                "the file is damaged or cut short: fetch or write it again"
            ) from None
        first += rows


def _parquet_pieces(src: Source, on_size: Callable[[int], None], text_field: str) -> Iterator[Piece]:
    """The rows of a Parquet file (pages checked against their checksums where the writer stored them)."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(src.path, page_checksum_verification=True)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid and others
        raise DataError(
            f"{src.path}: not a Parquet file, or one cut short (its footer is missing or damaged: {exc}); check the "
            "file, or fetch or write it again"
        ) from None
    _columns(pf.schema_arrow.names, src, text_field)
    yield from _rows(src, _parquet_batches(src, pf, text_field), pf.metadata.num_rows, on_size, text_field, "row")


def _dataset_pieces(src: Source, on_size: Callable[[int], None], text_field: str) -> Iterator[Piece]:
    """The rows of a ``datasets`` folder (of its split)."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(src.path))
    except Exception as exc:  # noqa: BLE001 - datasets raises several kinds
        raise DataError(f"{src.path}: not a datasets folder written by save_to_disk ({exc})") from None
    if src.split is not None:
        ds = ds[src.split]
    _columns(ds.column_names, src, text_field)
    ds = ds.select_columns([text_field])

    def batches() -> Iterator[list]:
        done = 0
        try:
            for b in ds.iter(batch_size=ROWS_PER_BATCH):
                yield b[text_field]
                done += len(b[text_field])
        except Exception as exc:  # noqa: BLE001 - datasets and pyarrow raise several kinds
            raise DataError(
                f"{src.label}: rows from {done + 1}: cannot be read ({exc}); the folder is damaged: save it again"
            ) from None

    yield from _rows(src, batches(), len(ds), on_size, text_field, "row")


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
