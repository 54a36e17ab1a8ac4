"""Writing several files into a folder as one atomic step, and recovering from an interrupted write.

A checkpoint is more than one file (``spec.json`` + ``model.safetensors``; ``config.json`` + shards + index), and
renaming each file into place is atomic only file by file: a process killed between two renames would leave a
new weights file beside an old ``spec.json``. The protocol here makes the whole set atomic across a crash at any
instant (SIGKILL, power loss once the data is on disk):

1. every new file is written into a private staging folder inside the target folder
   (``.modkit-tmp.<pid>.<random>/NAME``; a writer's own temporaries, such as the ``.tmpXXXXXX`` file safetensors
   writes first, stay inside it too), flushed and fsynced;
2. a journal ``.modkit-commit.json`` listing the renames (and the files to delete) is written under a temporary
   name and renamed into place: **this rename is the commit point**;
3. the renames and deletions are carried out, the staging folders removed, then the journal is removed.

:func:`recover` (run by every reader and writer of a folder before it touches it) finishes a journal it finds
(roll forward: the new files are all complete, the journal says where they go) and deletes temporaries that no
journal names and whose writing process is gone (a crash before the commit point: the old files were never
touched; the pid in a staging folder's name tells whose it is). So after a kill at any instant a reader sees the old set or the new set, complete, and temporary
files do not pile up. The same idea as a database's write-ahead log; SQLite's rollback journal and git's
``index.lock`` are the classic small-scale instances.

Fault injection: :func:`on_step` installs a hook called with the name of each file-system step just before the
step is taken (``"stage spec.json"``, ``"write spec.json"``, ``"fsync spec.json"``, ..., :data:`COMMIT_STEP`,
``"move spec.json"``, ...). A test stops the process in the hook, at each step of a save in turn, and checks what a
reader finds: deterministic kill points instead of kills at timed instants.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
import contextlib
from typing import Callable, Iterable, Iterator, Mapping, Optional, Sequence

from modkit.core.errors import CheckpointError

#: name of the commit journal inside a folder being written
JOURNAL = ".modkit-commit.json"
#: prefix of the staging folders; ``.modkit-tmp.<pid>.<random>``
STAGING = ".modkit-tmp."
_STAGING = re.compile(r"^\.modkit-tmp\.(\d+)\.[^/]+$")
#: the step of :func:`commit` that makes the new files the folder's content: the rename of the journal into place
COMMIT_STEP = "commit"

_hook: Optional[Callable[[str, Path], None]] = None


@contextlib.contextmanager
def on_step(hook: Callable[[str, Path], None]) -> Iterator[None]:
    """Call ``hook(step, folder)`` just before each file-system step of a write, commit or recovery in this process
    (fault injection for tests; see the module docstring). ``step`` names the step and its file: ``"stage NAME"``
    (create the staging folder of NAME), ``"write NAME"``, ``"fsync NAME"``, :data:`COMMIT_STEP`, ``"sync folder"``,
    ``"move NAME"``, ``"remove NAME"``, ``"clean staging"``, ``"remove journal"``. The previous hook is restored on exit.
    """
    global _hook
    previous, _hook = _hook, hook
    try:
        yield
    finally:
        _hook = previous


def _step(name: str, folder: Path) -> None:
    if _hook is not None:
        _hook(name, Path(folder))


def _tmp_name(target: Path) -> Path:
    """A path for ``target``'s new content, inside a fresh staging folder next to it."""
    _step(f"stage {target.name}", target.parent)
    staging = tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}.", dir=str(target.parent))
    return Path(staging) / target.name


def discard(tmp: Path) -> None:
    """Delete a temporary written by this module, with its staging folder."""
    shutil.rmtree(Path(tmp).parent, ignore_errors=True)


def _fsync_file(path: Path) -> None:
    with open(path, "rb") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems do not fsync folders
        pass
    finally:
        os.close(fd)


def write_text_tmp(text: str, target: Path) -> Path:
    """Write ``text`` (UTF-8) to a temporary file next to ``target`` (fsynced) and return its path."""
    tmp = _tmp_name(target)
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            _step(f"write {target.name}", target.parent)
            fh.write(text)
            fh.flush()
            _step(f"fsync {target.name}", target.parent)
            os.fsync(fh.fileno())
    except BaseException:
        discard(tmp)
        raise
    return tmp


def write_safetensors_tmp(tensors: Mapping, target: Path, metadata: Optional[Mapping[str, str]] = None) -> Path:
    """Write ``tensors`` to a temporary safetensors file next to ``target`` (fsynced) and return its path.

    Tensors are copied to contiguous CPU tensors that share no storage (safetensors refuses shared storage).
    """
    from safetensors.torch import save_file

    data = {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}
    tmp = _tmp_name(target)
    try:
        _step(f"write {target.name}", target.parent)
        save_file(data, str(tmp), metadata=dict(metadata or {}))
        _step(f"fsync {target.name}", target.parent)
        _fsync_file(tmp)
    except BaseException:
        discard(tmp)
        raise
    return tmp


def commit(pairs: Sequence[tuple[Path, Path]], remove: Iterable[Path] = ()) -> None:
    """Move every ``tmp`` over its ``target`` and delete ``remove``, all as one step that survives a crash.

    Every path must lie in one folder. See the module docstring for the protocol.

    Raises:
        CheckpointError: the paths lie in different folders.
        OSError: the folder cannot be written (nothing is changed then, unless the journal was written, in
            which case the next :func:`recover` completes the step).
    """
    pairs = [(Path(t), Path(g)) for t, g in pairs]
    remove = [Path(p) for p in remove]
    folders = (
        {t.parent.parent.resolve() for t, _ in pairs}
        | {g.parent.resolve() for _, g in pairs}
        | {p.parent.resolve() for p in remove}
    )
    if len(folders) != 1 or not all(t.parent.name.startswith(STAGING) for t, _ in pairs):
        raise CheckpointError(f"an atomic commit works inside one folder on files from write_*_tmp, got {pairs}")
    folder = folders.pop()
    record = {"moves": [[f"{t.parent.name}/{t.name}", g.name] for t, g in pairs], "remove": [p.name for p in remove]}
    try:
        journal_tmp = write_text_tmp(json.dumps(record), folder / JOURNAL)
    except BaseException:
        for tmp, _ in pairs:
            discard(tmp)
        raise
    _step(COMMIT_STEP, folder)
    os.replace(journal_tmp, folder / JOURNAL)  # the commit point
    discard(journal_tmp)
    _step("sync folder", folder)
    _fsync_dir(folder)
    _replay(folder, record)


def _replay(folder: Path, record: dict) -> None:
    for tmp, target in record["moves"]:
        _step(f"move {target}", folder)
        try:
            os.replace(folder / tmp, folder / target)
        except FileNotFoundError:  # already moved (by an earlier replay, or by a concurrent reader's recovery)
            pass
    for name in record["remove"]:
        _step(f"remove {name}", folder)
        (folder / name).unlink(missing_ok=True)
    _step("clean staging", folder)
    for tmp, _ in record["moves"]:
        shutil.rmtree(folder / tmp.split("/")[0], ignore_errors=True)
    _step("sync folder", folder)
    _fsync_dir(folder)
    _step("remove journal", folder)
    (folder / JOURNAL).unlink(missing_ok=True)
    _step("sync folder", folder)
    _fsync_dir(folder)


def _read_journal(folder: Path) -> Optional[dict]:
    from modkit.core.jsonio import JSONInputError, read_json_file

    path = folder / JOURNAL
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        record = read_json_file(path)
    except JSONInputError as exc:
        raise CheckpointError(f"unreadable commit journal ({exc}); delete it if no save is running") from None
    ok = (
        isinstance(record, dict)
        and isinstance(record.get("moves"), list)
        and isinstance(record.get("remove"), list)
        and all(
            isinstance(m, list) and len(m) == 2 and _staged_name(m[0]) and _plain_name(m[1]) for m in record["moves"]
        )
        and all(_plain_name(x) for x in record["remove"])
    )
    if not ok:
        raise CheckpointError(f"{path}: malformed commit journal; delete it if no save is running")
    return record


def _staged_name(name: object) -> bool:
    """``.modkit-tmp.<pid>.<random>/NAME``: a file in a staging folder of the same folder."""
    if not isinstance(name, str) or name.count("/") != 1:
        return False
    staging, base = name.split("/")
    return bool(_STAGING.match(staging)) and _plain_name(base)


def _plain_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
    )


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def recover(folder: Path) -> dict[str, Path]:
    """Finish an interrupted :func:`commit` in ``folder`` and delete stale temporary files.

    Returns:
        ``{file name: path to read}``: empty when the folder is consistent on disk. When the folder cannot be
            written (read-only), the journal's new files are returned here instead of being moved, so a reader
            still sees the complete new set.

    Raises:
        CheckpointError: a journal that is not one :func:`commit` writes.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    record = _read_journal(folder)
    pending: dict[str, Path] = {}
    if record is not None:
        try:
            _replay(folder, record)
        except PermissionError:
            for tmp, target in record["moves"]:
                if (folder / tmp).is_file():
                    pending[target] = folder / tmp
            return pending
    try:
        names = os.listdir(folder)
    except OSError:
        return pending
    for name in names:
        m = _STAGING.match(name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(folder / name, ignore_errors=True)
    return pending
