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
:data:`~modkit.data.encode.BATCH_CHARS` characters; the batches are the same whatever ``N`` is and are written in
order, so the files are byte for byte those of one process. At most ``2 N`` batches are in flight and a long
document is read and encoded in pieces (:mod:`modkit.data.sources`, :mod:`modkit.data.cutting`), so memory stays
bounded by constants, whatever the input size and however long one document is. A tqdm bar shows the bytes read and
the tokens written (:mod:`modkit.data.encode`).

A ``char`` or ``bpe:N`` tokenizer is trained on a first pass over the inputs and the text is encoded on a second.
Writes are atomic: everything goes to temporary names in the output folder (``.train.bin.tmp-PID`` and so on, PID
the process id), the old ``meta.json`` is removed, the data files are renamed into place and ``meta.json`` comes
last, so an interrupted run never leaves a folder that :meth:`modkit.data.dataset.TokenData.open` accepts with the
wrong contents. A run that ends by an exception removes its temporary files; one that is killed cannot, so each
run first removes the temporary files of processes that no longer run, and says so in a
:class:`~modkit.data.sources.DataNote` warning (:func:`~modkit.data.prepare_files.stale_temporaries`).

The pieces: :mod:`modkit.data.prepare_format` (file names, ``meta.json``'s format, dtype, separators),
:mod:`modkit.data.prepare_checks` (the arguments and the output folder checked, the tokenizer made ready),
:mod:`modkit.data.encode` (text -> ids) and :mod:`modkit.data.prepare_files` (the split cut, file hashes); every
name they define is importable from here too.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import numpy as np

from modkit.core.errors import DataError
from modkit.core.jsonio import read_json_file  # noqa: F401 - re-exported
from . import sources as _sources
from .encode import (  # noqa: F401 - re-exported: the encoding pass lived here
    _WORKER,
    BATCH_CHARS,
    EncodeStats,
    _batches,
    _located,
    _pieces,
    _Progress,
    _worker_encode,
    _worker_init,
    encode_pieces,
    encode_sources,
)
from .prepare_checks import (  # noqa: F401 - re-exported
    _check_fraction,
    _check_out_dir,
    _check_policy,
    _check_workers,
    _no_text,
    _old_recipe,
    _recipe,
    _short,
    _special,
    _tokenizer,
)
from .prepare_files import (  # noqa: F401 - re-exported
    _count,
    _find,
    removed_note,
    stale_temporaries,
    _sha256,
    _split,
    _starts_document,
    _Tokens,
    document_cut,
)
from .prepare_format import (  # noqa: F401 - re-exported: the names of the format lived here
    AUTO,
    FORMAT,
    FORMAT_VERSION,
    META_FILE,
    NONE,
    SPLIT_RULE,
    SPLIT_RULE_DOCUMENTS,
    SPLIT_RULE_INPUTS,
    TRAIN_FILE,
    VAL_FILE,
    Separators,
    dtype_for,
)
from .sources import (  # noqa: F401 - re-exported
    FOLDER_SUFFIXES,
    DataNote,
    Piece,
    Source,
    find_sources,
    source_digest,
)
from .tokenizer import (  # noqa: F401 - re-exported
    BOS_TOKEN,
    EOT_TOKEN,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    Tokenizer,
    UnknownTokenError,
    load_tokenizer,
    parse_spec,
    train_tokenizer,
)

# kept for callers (and tests) that patch or read them here
READ_BYTES = _sources.READ_BYTES
_text_pieces = _sources._text_pieces


# ------------------------------------------------------------------------------------------------ prepare


@dataclass(frozen=True)
class PrepareRequest:
    """One preparation: the arguments of :func:`prepare` (documented there), as one value.

    Attributes:
        inputs: text files, JSON Lines, Parquet files, ``datasets`` folders and folders of them.
        out_dir: the dataset folder.
        tokenizer: ``"char"``, ``"bpe:N"`` or the path of a ``tokenizer.json`` (or of a folder holding one).
        val_fraction: share of the tokens, taken from the end, that forms ``val.bin``; in (0, 1).
        val_inputs: inputs that form the validation split instead (``None``: cut by ``val_fraction``).
        text_field: the field (JSON Lines) or column (Parquet, ``datasets``) that holds the text.
        eot, bos: the separators' policies (``"auto"``, ``"none"``, a token; ``bos`` also ``True`` / ``False``).
        split, val_split: the split of a ``datasets`` DatasetDict folder read for ``inputs`` / ``val_inputs``.
        workers: encoding processes. show_progress: a tqdm bar on stderr. overwrite: replace any dataset there.
        follow_symlinks: read links inside a folder input that lead outside it (skipped with a note otherwise).
    """

    inputs: Sequence[str | Path]
    out_dir: str | Path
    tokenizer: str = "char"
    val_fraction: float = 0.1
    val_inputs: Optional[Sequence[str | Path]] = None
    text_field: str = "text"
    eot: Union[str, None] = AUTO
    bos: Union[bool, str, None] = False
    split: str = "train"
    val_split: str = "validation"
    workers: int = 1
    show_progress: bool = True
    overwrite: bool = False
    follow_symlinks: bool = False


@dataclass
class _Plan:
    """A checked request: the split fraction, the separator policies, the sources, the tokenizer spec (and the
    tokenizer itself when one is given) and the output folder."""

    request: PrepareRequest
    fraction: float
    eot_policy: str
    bos_policy: str
    srcs: list[Source]
    val_srcs: list[Source]
    spec: str
    kind: str
    tok: Optional[Tokenizer]
    out: Path


@dataclass
class _Splits:
    """What encoding wrote: tokens per split, the rule of the cut and the stats of each split's inputs."""

    n_train: int
    n_val: int
    rule: str
    within: bool
    train: EncodeStats
    val: Optional[EncodeStats]


def prepare(inputs: Sequence[str | Path], out_dir: str | Path, **options: Any) -> dict:
    """Tokenize text into a dataset folder: ``train.bin``, ``val.bin``, ``tokenizer.json``, ``meta.json``.

    The keyword arguments are the fields of :class:`PrepareRequest` (:func:`run_prepare` takes one whole).

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
        follow_symlinks: read links inside a folder input that lead outside the folder (by default they are skipped
            and listed in a :class:`~modkit.data.sources.DataNote` warning, with the other entries skipped).

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
        TypeError: a keyword that is not a field of :class:`PrepareRequest`.
    """
    return run_prepare(PrepareRequest(inputs, out_dir, **options))


def run_prepare(request: PrepareRequest) -> dict:
    """Run one :class:`PrepareRequest`: check it, train the tokenizer if one is to be trained, write the folder.

    Returns:
        the ``meta.json`` written (see :func:`prepare`).

    Raises:
        DataError: as :func:`prepare`.
    """
    plan = _plan(request)
    tok = plan.tok if plan.tok is not None else _train(plan)
    return _write_dataset(plan, tok)


def _plan(request: PrepareRequest) -> _Plan:
    """Check the arguments, find the sources, load a given tokenizer and check the output folder, in that order."""
    r = request
    fraction = _check_fraction(r.val_fraction) if r.val_inputs is None else float(r.val_fraction)
    eot_policy, bos_policy = _check_policy("eot", r.eot), _check_policy("bos", r.bos)
    _check_workers(r.workers)
    srcs = find_sources(r.inputs, split=r.split, follow_symlinks=r.follow_symlinks)
    val_srcs = (
        find_sources(r.val_inputs, split=r.val_split, follow_symlinks=r.follow_symlinks)
        if r.val_inputs is not None
        else []
    )
    kind, size = parse_spec(r.tokenizer)
    tok: Tokenizer | None = None
    spec = {"char": "char", "bpe": f"bpe:{size}"}.get(kind, "")
    if kind == "path":
        tok = load_tokenizer(r.tokenizer)
        spec = tok.spec = str(Path(tok.spec).resolve())
        tok.set_special(
            eot=_special("eot", eot_policy, tok, EOT_TOKEN), bos=_special("bos", bos_policy, tok, BOS_TOKEN)
        )
    out = _output_path(r.out_dir)
    recipe = _recipe(
        spec, fraction, r.text_field, [s.label for s in srcs], [s.label for s in val_srcs], eot_policy, bos_policy
    )
    _check_out_dir(out, recipe, r.overwrite)
    return _Plan(r, fraction, eot_policy, bos_policy, srcs, val_srcs, spec, kind, tok, out)


def _output_path(value) -> Path:
    """The output folder as a path.

    Raises:
        DataError: a path holding a NUL byte (no folder can be named so).
    """
    text = str(Path(value))
    if "\x00" in text:
        raise DataError(f"{text!r}: not a usable path (it holds a NUL byte); choose another output folder (-o)")
    return Path(text).expanduser()


def _train(plan: _Plan) -> Tokenizer:
    """Train the ``char`` / ``bpe:N`` tokenizer of ``plan`` on its inputs (a ``char`` one on the validation inputs
    too), reserving the separators its policies name.

    Raises:
        DataError: inputs without text, or what training the tokenizer raises.
    """
    chars = [0, False]  # characters read, all read
    trained_on = plan.srcs + (plan.val_srcs if plan.kind == "char" else [])

    def texts() -> Iterator[str]:
        for piece in _pieces(trained_on, plan.request.text_field, progress):
            chars[0] += len(piece.text)
            yield piece.text
        chars[1] = True

    with _Progress(sum(s.size for s in trained_on), f"tokenizer {plan.spec}", plan.request.show_progress) as progress:
        try:
            return _tokenizer(plan.spec, plan.eot_policy, plan.bos_policy, texts())
        except DataError:
            if chars == [0, True]:
                raise _no_text(trained_on) from None
            raise


def _write_dataset(plan: _Plan, tok: Tokenizer) -> dict:
    """Encode, split and describe the dataset under temporary names in the output folder, then rename the files into
    place (``meta.json`` last); whatever happens, no temporary file stays, nor a folder this call created empty.
    Temporary files of earlier runs whose process no longer runs are removed first (with a note).

    Raises:
        DataError: what encoding raises, or a write that fails (named by the file and the reason).
    """
    out = plan.out
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        stale = stale_temporaries(out, (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, META_FILE))
        for path, _pid in stale:
            path.unlink(missing_ok=True)
    except OSError as exc:
        raise _write_error(out, exc) from None
    if stale:
        warnings.warn(removed_note(out, stale), DataNote, stacklevel=3)
    names = (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, META_FILE)
    tmp = {name: out / f".{name}.tmp-{os.getpid()}" for name in names}
    done = False
    try:
        splits = _encode_splits(plan, tok, tmp)
        tok.save(tmp[TOKENIZER_FILE])
        special = tok.special_config()  # the special tokens the corpus was prepared with, for every run trained on it
        if special is not None:
            tmp[TOKENIZER_CONFIG_FILE].write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
        meta = _meta(plan, tok, splits, tmp)
        tmp[META_FILE].write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        (out / META_FILE).unlink(missing_ok=True)  # from here until the last rename the folder holds no dataset
        if special is None:
            (out / TOKENIZER_CONFIG_FILE).unlink(missing_ok=True)  # an earlier preparation's
        for name in names:
            if name != TOKENIZER_CONFIG_FILE or special is not None:
                os.replace(tmp[name], out / name)
        done = True
    except OSError as exc:  # the inputs' read errors are DataErrors already: this is a write
        raise _write_error(out, exc) from None
    finally:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        if created and not done and not any(out.iterdir()):
            out.rmdir()
    return meta


def _write_error(out: Path, exc: OSError) -> DataError:
    """A failed write into the output folder, named by the file and the reason."""
    where = exc.filename or out
    return DataError(
        f"{where}: cannot write the dataset ({exc.strerror or exc}); check that {out} is a folder you can write "
        "to with free space, or choose another output folder (-o)"
    )


def _encode_splits(plan: _Plan, tok: Tokenizer, tmp: dict[str, Path]) -> _Splits:
    """Encode the inputs into ``tmp[TRAIN_FILE]`` and the validation inputs into ``tmp[VAL_FILE]``, or cut the
    validation split off the end of the training file (:func:`_cut`).

    Raises:
        DataError: inputs without text, text the tokenizer cannot encode, too few tokens for two splits.
    """
    r = plan.request
    seps = Separators(tok.eot_id, tok.bos_id)
    common = dict(separators=seps, text_field=r.text_field, workers=r.workers, show_progress=r.show_progress)
    with open(tmp[TRAIN_FILE], "wb") as f:
        train_stats = encode_sources(plan.srcs, tok, f, **common, desc="encode")
    if train_stats.text_tokens == 0:
        raise _no_text(plan.srcs)
    if not plan.val_srcs:
        return _cut(plan.fraction, seps, dtype_for(tok.vocab_size), tmp, train_stats)
    with open(tmp[VAL_FILE], "wb") as f:
        val_stats = encode_sources(plan.val_srcs, tok, f, **common, desc="encode val")
    if val_stats.text_tokens == 0:
        raise _no_text(plan.val_srcs)
    return _Splits(train_stats.tokens, val_stats.tokens, SPLIT_RULE_INPUTS, False, train_stats, val_stats)


def _cut(fraction: float, seps: Separators, dtype: np.dtype, tmp: dict[str, Path], stats: EncodeStats) -> _Splits:
    """Move the last ``fraction`` of the training file's tokens into the validation file: at a document start when
    the documents are separated (:func:`document_cut`), else at exactly ``int(n * (1 - fraction))`` (nanoGPT).

    Raises:
        DataError: a split that would be empty.
    """
    n = stats.tokens
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
    rule = SPLIT_RULE_DOCUMENTS if separated else SPLIT_RULE
    within = separated and n_train == target and not _starts_document(tmp[TRAIN_FILE], dtype, target, seps)
    _split(tmp[TRAIN_FILE], tmp[VAL_FILE], n_train * dtype.itemsize)
    return _Splits(n_train, n - n_train, rule, within, stats, None)


def _source_entries(source_list: Sequence[Source], stats: EncodeStats) -> list[dict]:
    """``meta.json``'s ``sources`` / ``val_sources``: path, format, bytes, sha256, tokens, documents of each."""
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


def _meta(plan: _Plan, tok: Tokenizer, splits: _Splits, tmp: dict[str, Path]) -> dict:
    """The ``meta.json`` of the files written under ``tmp`` (the keys: see :func:`prepare`)."""
    from .. import __version__

    seps, dtype = Separators(tok.eot_id, tok.bos_id), dtype_for(tok.vocab_size)
    files = {
        name: {"bytes": tmp[name].stat().st_size, "sha256": _sha256(tmp[name])}
        for name in (TRAIN_FILE, VAL_FILE, TOKENIZER_FILE)
    }
    marker = seps.eot_id if seps.eot_id is not None else seps.bos_id
    counts = {
        s: _count(_Tokens(tmp[f], dtype), marker) if marker is not None else None
        for s, f in (("train", TRAIN_FILE), ("val", VAL_FILE))
    }
    val_stats = splits.val
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tokenizer": tok.spec,
        "vocab_size": tok.vocab_size,
        "dtype": dtype.name,
        "tokens": {"train": splits.n_train, "val": splits.n_val},
        "val_fraction": plan.fraction,
        "split": splits.rule,
        "split_within_document": splits.within,
        "text_field": plan.request.text_field,
        "documents": {
            "eot_policy": plan.eot_policy,
            "bos_policy": plan.bos_policy,
            "eot": tok.eot if seps.eot_id is not None else None,
            "eot_id": seps.eot_id,
            "bos": tok.bos if seps.bos_id is not None else None,
            "bos_id": seps.bos_id,
            "count": splits.train.documents + (val_stats.documents if val_stats else 0),
            "separated": marker is not None,
            # documents ending (end-of-text) or starting (begin-of-text only) in each split; None: not separated
            "train": counts["train"],
            "val": counts["val"],
        },
        "sources": _source_entries(plan.srcs, splits.train),
        **({"val_sources": _source_entries(plan.val_srcs, val_stats)} if val_stats else {}),
        "files": files,
        "modkit_version": __version__,
    }
