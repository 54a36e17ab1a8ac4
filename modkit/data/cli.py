"""``modkit data prepare INPUT... -o DIR [--tokenizer char|bpe:N|PATH] [--val INPUT... | --val-fraction F]
[--text-field NAME] [--eot auto|none|TOKEN] [--bos [TOKEN]] [--workers N] [--follow-symlinks]``.

Tokenizes text, JSON Lines, Parquet and ``datasets`` inputs (and folders of them) into a dataset folder (``train.bin``, ``val.bin``,
``tokenizer.json``, ``meta.json``; see :mod:`modkit.data.prepare`) and prints a short summary. Errors in the input
are :class:`~modkit.core.errors.DataError` and reach the user as one ``modkit: error: ...`` line (exit status 1);
notes (:class:`~modkit.data.sources.DataNote`: the entries a folder input skips, temporary files of killed runs
removed) as ``modkit: note: ...`` lines on stderr. Paths that are not valid UTF-8 are printed with their odd bytes
escaped (``\\udcff``), never as an encoding error.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import warnings


def add_subcommands(subparsers) -> None:
    """Add ``modkit data prepare`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    data = subparsers.add_parser(
        "data", help="prepare token data for training", description="Prepare token data for training."
    )
    sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "prepare",
        help="tokenize text into train.bin / val.bin + meta.json",
        description="Tokenize documents into DIR: train.bin and val.bin (token ids, uint16 or uint32), tokenizer.json "
        "and meta.json. Inputs: text files (one document each), .jsonl records (also .jsonl.gz / .jsonl.zst), "
        ".parquet rows, datasets save_to_disk folders, and folders of them (recursively, in sorted order). An "
        "end-of-text token follows every document (--eot; a trained tokenizer reserves <|endoftext|>, a given one's "
        "own is used). The validation split is --val inputs, or the last --val-fraction of the tokens, cut at a "
        "document boundary.",
    )
    _add_input_flags(p)
    _add_document_flags(p)
    p.set_defaults(func=cmd_data_prepare)


def _add_input_flags(p: argparse.ArgumentParser) -> None:
    """The inputs, the output folder, the tokenizer and the validation split."""
    p.add_argument(
        "inputs",
        nargs="+",
        metavar="INPUT",
        help="text, .jsonl(.gz/.zst), .parquet file, datasets folder, or folder of them",
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="dataset folder to write")
    p.add_argument(
        "--tokenizer",
        default="char",
        metavar="{char,bpe:N,PATH}",
        help="char (one id per character, nanoGPT's shakespeare_char; default), bpe:N (byte-level BPE trained on the "
        "inputs to N ids, N >= 256), or PATH of a tokenizer.json or of a folder holding one (a Hugging Face model "
        "folder: its special tokens come with it)",
    )
    p.add_argument(
        "--val",
        nargs="+",
        metavar="INPUT",
        dest="val_inputs",
        help="inputs that form the validation split (instead of --val-fraction)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=0.1,
        metavar="F",
        help="share of the tokens, from the end, kept for validation (default 0.1)",
    )


def _add_document_flags(p: argparse.ArgumentParser) -> None:
    """Where a record holds its text, the tokens around every document, the datasets splits, the workers."""
    p.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="field of a .jsonl record / column of a .parquet file or dataset holding the text (default: text)",
    )
    p.add_argument(
        "--eot",
        default="auto",
        metavar="{auto,none,TOKEN}",
        help="end-of-text token after every document: auto (default: the tokenizer's own, or <|endoftext|> "
        "reserved by char / bpe:N), none (insert nothing: documents run together), or a token of the vocabulary",
    )
    p.add_argument(
        "--bos",
        nargs="?",
        const="auto",
        default="none",
        metavar="TOKEN",
        help="also a begin-of-text token before every document (--bos alone: the tokenizer's own, or "
        "<|begin_of_text|> reserved by char / bpe:N)",
    )
    p.add_argument(
        "--split", default="train", metavar="NAME", help="split of a datasets DatasetDict input (default train)"
    )
    p.add_argument(
        "--val-split",
        default="validation",
        metavar="NAME",
        help="split of a DatasetDict --val input (default validation)",
    )
    p.add_argument(
        "--workers",
        "-j",
        type=int,
        default=1,
        metavar="N",
        help="encoding processes (the files are the same for any N; default 1)",
    )
    p.add_argument(
        "--follow-symlinks",
        action="store_true",
        help="read links inside a folder input that lead outside the folder (by default they are skipped, with a note)",
    )


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Run :func:`modkit.data.prepare.prepare` and print tokens per split, vocabulary, dtype and the files."""
    from .prepare import prepare

    start = time.perf_counter()
    with _notes_to_stderr():
        meta = prepare(
            args.inputs,
            args.output,
            tokenizer=args.tokenizer,
            val_fraction=args.val_fraction,
            val_inputs=args.val_inputs,
            text_field=args.text_field,
            eot=args.eot,
            bos=args.bos,
            split=args.split,
            val_split=args.val_split,
            workers=args.workers,
            show_progress=sys.stderr.isatty(),
            follow_symlinks=args.follow_symlinks,
        )
    seconds = time.perf_counter() - start
    out = _shown(args.output)
    every = meta["sources"] + meta.get("val_sources", [])
    n_bytes = sum(s["bytes"] for s in every)
    n_src = len(every)
    print(f"prepared {out} in {seconds:.1f} s from {n_src} input{'s' if n_src != 1 else ''} ({n_bytes:,} bytes)")
    print(f"  tokenizer  {_shown(meta['tokenizer'])}  vocab_size {meta['vocab_size']:,}  dtype {meta['dtype']}")
    docs = meta["documents"]
    seps = [f"{k} {docs[k]!r} (id {docs[k + '_id']})" for k in ("bos", "eot") if docs[k] is not None]
    print(f"  documents  {docs['count']:,}, " + (" and ".join(seps) if seps else "nothing inserted between them"))
    for split, name in (("train", "train.bin"), ("val", "val.bin")):
        print(f"  {split:<5}      {meta['tokens'][split]:>14,} tokens  {out}/{name}")
    print(f"  also       {out}/tokenizer.json, {out}/meta.json")
    return 0


def _shown(text: str) -> str:
    """``text`` printable on any terminal: characters UTF-8 cannot hold (the escaped bytes of a path that is not
    UTF-8, lone surrogates) written as ``\\udcff``."""
    return str(text).encode("utf-8", "backslashreplace").decode("utf-8")


@contextlib.contextmanager
def _notes_to_stderr():
    """Print :class:`~modkit.data.sources.DataNote` warnings as ``modkit: note: ...`` lines on stderr."""
    from .sources import DataNote

    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, DataNote):
                print(f"modkit: note: {_shown(str(message))}", file=sys.stderr)
            else:
                default(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.simplefilter("always", DataNote)
        yield
