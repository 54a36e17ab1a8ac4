"""The shipped default corpus, tiny shakespeare, and its prepared ``char`` dataset, cached once per machine.

``tinyshakespeare.txt`` (next to this module) is the "tiny shakespeare" corpus of karpathy/char-rnn
(``data/tinyshakespeare/input.txt``): 1,115,394 characters (40,000 lines) of Shakespeare's plays, public domain,
md5 ``6fb458f1232090904fb40fe944165e91``. It is the corpus of nanoGPT's ``shakespeare_char`` recipe; prepared with the
``char`` tokenizer and ``val_fraction = 0.1`` it gives a vocabulary of 65 symbols, 1,003,854 training tokens and
111,540 validation tokens.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from modkit.core.errors import DataError
from .dataset import TokenData
from .prepare import prepare
from .prepare_files import stale_temporaries

#: md5 of the shipped ``tinyshakespeare.txt`` (the published digest of char-rnn's ``input.txt``).
CORPUS_MD5 = "6fb458f1232090904fb40fe944165e91"
#: The cached dataset's folder name under ``<cache>/data``.
DEFAULT_DATASET = "tinyshakespeare-char"


def default_corpus() -> Path:
    """Path of the shipped ``tinyshakespeare.txt`` (1,115,394 characters, UTF-8, ``\\n`` line breaks)."""
    return Path(__file__).resolve().with_name("tinyshakespeare.txt")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """modkit's cache folder: ``cache_dir`` if given, else ``$MODKIT_CACHE``, else ``$XDG_CACHE_HOME/modkit``, else
    ``~/.cache/modkit``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("MODKIT_CACHE"):
        return Path(os.environ["MODKIT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "modkit"


def default_dataset(cache_dir: str | Path | None = None, *, show_progress: bool = False) -> Path:
    """The folder of tiny shakespeare prepared with ``char`` (val_fraction 0.1), made on first use and then reused.

    The folder is ``<cache>/data/tinyshakespeare-char`` with ``<cache>`` from :func:`cache_root`. The corpus is one
    document and nothing is inserted (``eot="none"``), so the ids are nanoGPT's. It is reused when
    its ``meta.json`` records the shipped corpus's sha256, the ``char`` tokenizer, val_fraction 0.1 and no
    separator, and its file sizes match; otherwise it is prepared again into a temporary sibling folder that is renamed into place, so
    processes starting together (one per rank) never see a half-written dataset. Temporary folders of earlier
    runs whose process no longer runs (killed while preparing) are removed first.

    Returns:
        the dataset folder, for :meth:`modkit.data.dataset.TokenData.open`.

    Raises:
        OSError: the cache folder cannot be written (set ``MODKIT_CACHE`` to a writable folder).
    """
    folder = cache_root(cache_dir) / "data" / DEFAULT_DATASET
    corpus = default_corpus()
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()
    if _is_current(folder, digest):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    for stale, _pid in stale_temporaries(folder.parent, (folder.name,), folders=True):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        # one document, nothing inserted: exactly nanoGPT's shakespeare_char ids (65 symbols)
        prepare([corpus], tmp, tokenizer="char", val_fraction=0.1, eot="none", show_progress=show_progress)
        if folder.exists() and not _is_current(folder, digest):
            shutil.rmtree(folder)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _is_current(folder, digest):  # not another process that finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _is_current(folder: Path, digest: str) -> bool:
    try:
        meta = TokenData.open(folder, verify=False).meta
    except DataError:
        return False
    return (
        meta["tokenizer"] == "char"
        and meta.get("val_fraction") == 0.1
        and (meta.get("documents") or {}).get("eot_policy", "none") == "none"
        and [s.get("sha256") for s in meta.get("sources", [])] == [digest]
    )
