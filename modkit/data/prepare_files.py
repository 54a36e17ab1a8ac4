"""The token files of :func:`modkit.data.prepare.prepare` read and cut: where the validation split starts
(:func:`document_cut`), how many separators a split holds, moving the tail of ``train.bin`` into ``val.bin``, the
sha256 of a written file, and the temporary files of killed runs found (:func:`stale_temporaries`).

Every read is a plain ``read`` of a slice (no memory map), so the pages read never stay in the preparing process.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from .prepare_format import Separators


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
            # an end-of-text token at e: a document starts at e + 1
            e = _find(tokens, seps.eot_id, max(i - 1, 0), n - 1, 1)
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (``True`` when that cannot be known: another user's process,
    or Windows, where probing a process with signal 0 would end it)."""
    if os.name == "nt" or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):  # no process has such a number
        return False
    return True


def stale_temporaries(folder: Path, names: Sequence[str], *, folders: bool = False) -> list[tuple[Path, int]]:
    """The temporary entries ``.NAME.tmp-PID`` in ``folder`` (``NAME`` one of ``names``) left by processes that no
    longer run: a run killed before it could clean up (a running process's own are never listed). Files, or
    folders with ``folders``.

    Returns:
        ``[(path, pid)]`` sorted by name. The check is by process id on this machine: on a folder shared by
        several machines a run elsewhere could hold a file of the same pattern; give each run its own folder.
    """
    pattern = re.compile(r"\.(" + "|".join(re.escape(n) for n in names) + r")\.tmp-([0-9]{1,12})")
    found = []
    try:
        entries = sorted(folder.iterdir())
    except OSError:
        return []
    for path in entries:
        m = pattern.fullmatch(path.name)
        kind_ok = path.is_dir() if folders else path.is_file()
        if m and kind_ok and not path.is_symlink() and not _running(int(m.group(2))):
            found.append((path, int(m.group(2))))
    return found


def removed_note(folder: Path, removed: Sequence[tuple[Path, int]]) -> str:
    """The note that says which temporary files of earlier runs were removed."""
    pids = sorted({pid for _, pid in removed})
    noun = "process" if len(pids) == 1 else "processes"
    files = "file" if len(removed) == 1 else "files"
    return (
        f"{folder}: removed {len(removed)} temporary {files} of runs that did not finish ({noun} "
        f"{', '.join(map(str, pids))}): {', '.join(p.name for p, _ in removed)}"
    )
