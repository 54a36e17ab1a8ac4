"""``modkit data prepare INPUT... -o DIR [--tokenizer char|bpe:N|PATH] [--val-fraction F] [--text-field NAME]``.

Tokenizes text files, JSON Lines files and folders into a dataset folder (``train.bin``, ``val.bin``,
``tokenizer.json``, ``meta.json``; see :mod:`modkit.data.prepare`) and prints a short summary. Errors in the input
are :class:`~modkit.errors.DataError` and reach the user as one ``modkit: error: ...`` line (exit status 1).
"""

from __future__ import annotations

import argparse
import sys
import time


def add_subcommands(subparsers) -> None:
    """Add ``modkit data prepare`` to the ``modkit`` subcommands (an extension module of :mod:`modkit.cli`)."""
    data = subparsers.add_parser(
        "data", help="prepare token data for training", description="Prepare token data for training."
    )
    sub = data.add_subparsers(dest="data_command", metavar="COMMAND")
    sub.required = True
    p = sub.add_parser(
        "prepare",
        help="tokenize text into train.bin / val.bin + meta.json",
        description="Tokenize text files, .jsonl files (one JSON object per line) and folders of them (*.txt, *.md, "
        "*.rst, *.jsonl, ... recursively, in sorted order) into DIR: train.bin and val.bin (token ids, uint16 or "
        "uint32), tokenizer.json and meta.json. The validation split is the last --val-fraction of the tokens.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="text file, .jsonl file or folder")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="dataset folder to write")
    p.add_argument(
        "--tokenizer",
        default="char",
        metavar="{char,bpe:N,PATH}",
        help="char (one id per character, nanoGPT's shakespeare_char; default), bpe:N (byte-level BPE trained on the "
        "inputs to N ids, N >= 256) or PATH of a tokenizer.json (or a folder holding one)",
    )
    p.add_argument("--val-fraction", type=float, default=0.1, metavar="F", help="share of the tokens, from the end, kept for validation (default 0.1)")
    p.add_argument("--text-field", default="text", metavar="NAME", help="field of a .jsonl record that holds its text (default: text)")
    p.set_defaults(func=cmd_data_prepare)


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Run :func:`modkit.data.prepare.prepare` and print tokens per split, vocabulary, dtype and the files."""
    from .prepare import prepare

    start = time.perf_counter()
    meta = prepare(
        args.inputs,
        args.output,
        tokenizer=args.tokenizer,
        val_fraction=args.val_fraction,
        text_field=args.text_field,
        show_progress=sys.stderr.isatty(),
    )
    seconds = time.perf_counter() - start
    n_bytes = sum(s["bytes"] for s in meta["sources"])
    n_src = len(meta["sources"])
    print(f"prepared {args.output} in {seconds:.1f} s from {n_src} file{'s' if n_src != 1 else ''} ({n_bytes:,} bytes)")
    print(f"  tokenizer  {meta['tokenizer']}  vocab_size {meta['vocab_size']:,}  dtype {meta['dtype']}")
    for split, name in (("train", "train.bin"), ("val", "val.bin")):
        print(f"  {split:<5}      {meta['tokens'][split]:>14,} tokens  {args.output}/{name}")
    print(f"  also       {args.output}/tokenizer.json, {args.output}/meta.json")
    return 0
