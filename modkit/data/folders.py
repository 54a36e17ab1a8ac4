"""The input files below a folder input of ``modkit data prepare``, and the entries it skips, each with the reason.

Read: every regular file below the folder whose name ends in one of the input endings, recursively, sorted by
relative path. Skipped (and listed, so nothing is left out without a word): hidden files and folders (names
starting with ``.``), files of other names, entries that are not regular files (FIFOs, sockets, devices), broken
links, and links that lead outside the folder, unless ``follow_symlinks`` is set: a folder input reads what it
holds, not what a link in it points to elsewhere. A link to a folder inside that is read already (a loop, or a
second name for it) is skipped too, so no file is read twice through links.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

#: Skipped entries named in a note, at most (the rest are counted).
NOTE_NAMES = 20


def folder_files(root: Path, suffixes: Sequence[str], *, follow_symlinks: bool) -> tuple[list[Path], list[tuple]]:
    """The input files below ``root`` and the entries skipped.

    Args:
        root: the folder.
        suffixes: the name endings of input files (lower case).
        follow_symlinks: read links that lead outside ``root`` too.

    Returns:
        ``(files sorted by relative path, [(relative name, reason)] sorted by name)``; folder names end in ``/``.
    """
    root_real = root.resolve()
    found: list[Path] = []
    skipped: list[tuple] = []
    seen, stack = {root_real}, [root]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            skipped.append((folder.relative_to(root).as_posix() + "/", f"cannot be read: {exc.strerror or exc}"))
            continue
        for entry in entries:
            path = Path(entry.path)
            is_dir = entry.is_dir()
            shown = path.relative_to(root).as_posix() + ("/" if is_dir else "")
            why = _skip_reason(entry, path, root_real, is_dir, follow_symlinks, suffixes)
            if why is None and is_dir and path.resolve() in seen:
                why = "a link to a folder that is read already"
            if why is not None:
                skipped.append((shown, why))
            elif is_dir:
                seen.add(path.resolve())
                stack.append(path)
            else:
                found.append(path)
    found.sort(key=lambda p: p.relative_to(root).as_posix())
    return found, sorted(skipped)


def _skip_reason(entry, path: Path, root_real: Path, is_dir: bool, follow: bool, suffixes) -> str | None:
    """Why an entry of a folder input is skipped, or ``None`` for a file to read or a folder to walk."""
    if entry.name.startswith("."):
        return "hidden"
    if entry.is_symlink():
        target = path.resolve()
        if not target.exists():
            return f"a broken link (to {target})"
        inside = target == root_real or root_real in target.parents
        if not inside and not follow:
            return f"a link to a {'folder' if is_dir else 'file'} outside the folder ({target})"
    if is_dir:
        return None
    if not entry.is_file():
        return "not a regular file"
    return None if entry.name.lower().endswith(tuple(suffixes)) else "not an input name"


def skipped_note(root: Path, skipped: Sequence[tuple]) -> str:
    """One line naming the skipped entries of a folder input (the first :data:`NOTE_NAMES`) with their reasons."""
    shown = ", ".join(f"{name} ({why})" for name, why in skipped[:NOTE_NAMES])
    more = f", and {len(skipped) - NOTE_NAMES:,} more" if len(skipped) > NOTE_NAMES else ""
    links = any("outside the folder" in why for _, why in skipped)
    hint = "; --follow-symlinks (follow_symlinks=True) reads links that lead outside it" if links else ""
    what = "entry that is not an input" if len(skipped) == 1 else "entries that are not inputs"
    return f"{root}: skipped {len(skipped):,} {what}: {shown}{more}{hint}"
