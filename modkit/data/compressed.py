"""The byte stream of an input file of ``modkit data prepare``: plain, gzip or zstd, read in bounded pieces and
checked to its end.

* Every read asks for a bounded number of bytes (``read(n)``, never ``readline()`` or ``read()`` to the end): a
  record of any length costs the reader the bound, not the record (:mod:`modkit.data.jsonl`).
* gzip: Python's ``gzip`` raises at a stream that ends before its end-of-stream marker; that is reported as the
  file cut short.
* zstd: a zstd decoder given a frame cut off in the middle returns the bytes it has (or none) and no error, so
  :func:`check_zstd_frames` first walks the file's frames by their headers (RFC 8878, section 3.1): every frame
  must be complete (all its blocks, up to the one marked last, and its checksum when the frame has one), and
  nothing but frames may follow the first. A file cut *exactly between two frames* holds only whole frames: no
  reader can tell it from a shorter file.
* An empty ``.gz`` / ``.zst`` file is refused: both tools write a header even for empty input, so an empty file is
  a failed copy or download.
"""

from __future__ import annotations

import gzip
import io
import os
from pathlib import Path
from typing import Callable

from modkit.core.errors import DataError

#: The magic number of a zstd frame, and the range of a skippable frame's (RFC 8878, sections 3.1.1 and 3.1.2).
ZSTD_MAGIC = 0xFD2FB528
ZSTD_SKIPPABLE = range(0x184D2A50, 0x184D2A60)
#: Bytes read from the file at a time under the decompressor.
RAW_READ_BYTES = 1 << 18


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


def open_stream(src, on_bytes: Callable[[bytes], None]):
    """``(stream, raw_file)``: a binary stream of the file's (decompressed) bytes and the file under it (close both).

    ``on_bytes`` sees the bytes of the file itself as they are read (compressed bytes for a compressed file).

    Raises:
        DataError: a file that cannot be opened, an empty compressed file, or a zstd file whose frames are cut
            short or followed by other bytes (:func:`check_zstd_frames`).
    """
    if src.compression and src.size == 0:
        tool = "gzip" if src.compression == "gzip" else "zstd"
        raise DataError(
            f"{src.path}: an empty file, not a {tool} file ({tool} writes a header even for empty input); copy or "
            "download it again"
        )
    if src.compression == "zstd":
        check_zstd_frames(src.path)
    try:
        raw = open(src.path, "rb")
    except OSError as exc:
        raise DataError(
            f"{src.path}: cannot be read ({exc.strerror or exc}); check that it exists and is readable"
        ) from None
    counted = io.BufferedReader(_Counting(raw, on_bytes), RAW_READ_BYTES)
    if src.compression == "gzip":
        return gzip.GzipFile(fileobj=counted, mode="rb"), raw
    if src.compression == "zstd":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(counted, read_across_frames=True)
        return io.BufferedReader(reader, RAW_READ_BYTES), raw
    return counted, raw


def read_checked(src, read: Callable[..., bytes], *args) -> bytes:
    """``read(*args)`` on an input's stream, a failed decompression raised as the input's DataError.

    Raises:
        DataError: the file cannot be read, or it is compressed and cannot be decompressed (gzip's OSError /
            EOFError, zstandard's ZstdError; named by :func:`decompress_error`).
    """
    try:
        return read(*args)
    except (OSError, EOFError) as exc:
        if not src.compression:
            raise DataError(f"{src.path}: cannot be read ({exc}); check the file and the disk") from None
        raise decompress_error(src, exc) from None
    except Exception as exc:  # zstandard.ZstdError
        if src.compression:
            raise decompress_error(src, exc) from None
        raise


def decompress_error(src, exc: Exception) -> DataError:
    """The DataError of a file that does not decompress: cut short (gzip's EOFError) or not valid."""
    if isinstance(exc, EOFError):
        return DataError(
            f"{src.path}: cut short: the {src.compression} stream ends before its end-of-stream marker ({exc}); "
            "the file is incomplete (an interrupted download or copy?): fetch or compress it again"
        )
    return DataError(f"{src.path}: not a valid {src.compression} file ({exc}); check the file or its name's ending")


def _frame_end(fd: int, offset: int, size: int) -> int:
    """The byte after the zstd frame that starts at ``offset`` (its header, blocks and checksum read by headers);
    may lie past ``size`` when the file is cut short.

    Raises:
        ValueError: the bytes at ``offset`` are not a frame (the message says what is wrong).
    """
    head = os.pread(fd, 5, offset)
    if len(head) < 4:
        return offset + 5
    magic = int.from_bytes(head[:4], "little")
    if magic in ZSTD_SKIPPABLE:
        length = os.pread(fd, 4, offset + 4)
        return offset + 8 + int.from_bytes(length, "little") if len(length) == 4 else offset + 8
    if magic != ZSTD_MAGIC:
        raise ValueError(f"not a zstd frame at byte {offset:,} (magic number {head[:4].hex()})")
    if len(head) < 5:
        return offset + 6
    fhd = head[4]
    single, checksum, did, fcs = (fhd >> 5) & 1, (fhd >> 2) & 1, fhd & 3, fhd >> 6
    pos = offset + 5 + (0 if single else 1) + (0, 1, 2, 4)[did] + ((1 if single else 0), 2, 4, 8)[fcs]
    while True:
        header = os.pread(fd, 3, pos)
        if len(header) < 3:
            return pos + 3
        value = int.from_bytes(header, "little")
        kind, length = (value >> 1) & 3, value >> 3
        if kind == 3:
            raise ValueError(f"a block of the reserved type at byte {pos:,}")
        pos += 3 + (1 if kind == 1 else length)
        if value & 1 or pos > size:  # the last block, or cut short
            return pos + 4 * checksum


def check_zstd_frames(path: Path) -> None:
    """Walk the zstd frames of ``path`` by their headers (block sizes, the last-block flag, the checksum flag) to
    the end of the file, without decompressing.

    Raises:
        DataError: a frame cut short (naming the frame, where it starts, the bytes it needs and the file's size) or
            bytes that are not a frame.
    """
    size = path.stat().st_size
    fd = os.open(path, os.O_RDONLY)
    try:
        offset, frame = 0, 0
        while offset < size:
            frame += 1
            try:
                end = _frame_end(fd, offset, size)
            except ValueError as exc:
                raise DataError(
                    f"{path}: {exc}: not a zstd file, or damaged there; check the file or its name's ending"
                ) from None
            if end > size:
                raise DataError(
                    f"{path}: cut short: zstd frame {frame} (from byte {offset:,}) needs at least {end:,} bytes, the "
                    f"file has {size:,}; the file is incomplete (an interrupted download or copy?): fetch or "
                    "compress it again"
                )
            offset = end
    finally:
        os.close(fd)
