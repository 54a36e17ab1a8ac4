"""``modkit coordcheck SPEC --widths 64,128,256,512 [--steps 5] [--lr 1e-2] [--base-d-model W] [--data DIR |
--random-tokens] [-o DIR]``.

The coordinate check (:mod:`modkit.experiments.coordcheck`): the spec trained for a few steps at several widths under standard
parametrization and under μP, on windows of text (the shipped tiny shakespeare, or the prepared folder ``--data``;
``--random-tokens``: uniform random token ids instead); ``DIR/report.md`` (how much each activation's change grows from the smallest to the
largest width), ``coordcheck.png`` and ``coordcheck.json``.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path


def add_subcommands(subparsers) -> None:
    """Add ``modkit coordcheck`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "coordcheck",
        help="coordinate check: activation sizes after a few steps at several widths, standard vs muP",
        description="Train SPEC for a few steps at each width (d_model; d_ff and head_dim scaled with it, heads fixed) "
        "at one constant learning rate, under standard parametrization and under muP with the smallest width as base, "
        "and plot how much each activation (embedding, token mixer, ffn, residual stream, logits) changed against the "
        "width. Under muP the curves are flat; under standard parametrization they grow with the width "
        "(Yang et al. 2022, arXiv:2203.03466). The batches are windows of text: the shipped tiny shakespeare "
        "(characters) unless --data names a prepared data folder; the model's vocab_size is set to the data's. "
        "--random-tokens trains and measures on uniform random token ids over the spec's vocabulary instead; there "
        "the measured batch shares almost nothing with the training batches, so muP's hidden changes shrink with "
        "width (about 1/sqrt(width)) although muP is right: use it only to reproduce older checks.",
    )
    p.add_argument("spec", metavar="SPEC", help="spec .json file (its own parametrization is replaced)")
    p.add_argument("--widths", required=True, metavar="W,W,...", help="d_model values, increasing, e.g. 64,128,256,512")
    p.add_argument(
        "--base-d-model", type=int, default=None, metavar="W", help="muP's base width (default: the smallest width)"
    )
    p.add_argument("--steps", type=int, default=5, metavar="N", help="optimizer steps (default 5)")
    p.add_argument("--lr", type=float, default=1e-2, metavar="LR", help="constant learning rate (default 1e-2)")
    p.add_argument(
        "--optimizer", default='{"type": "adamw"}', metavar="JSON", help='optimizer config (default {"type": "adamw"})'
    )
    p.add_argument("--seeds", type=int, default=2, metavar="K", help="seeds averaged per width (default 2)")
    p.add_argument("--batch", type=int, default=8, metavar="B", help="sequences per batch (default 8)")
    p.add_argument("--seq-len", type=int, default=32, metavar="T", help="tokens per sequence (default 32)")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--data",
        default=None,
        metavar="DIR",
        help="prepared data folder (modkit data prepare) whose windows train and are measured (default: the shipped "
        "tiny shakespeare, characters)",
    )
    source.add_argument(
        "--random-tokens",
        action="store_true",
        help="uniform random token ids instead of text (the older check; muP then reads as shrinking with width)",
    )
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads (torch.set_num_threads)")
    p.add_argument(
        "-o", "--out", default="reports/coordcheck", metavar="DIR", help="report folder (default reports/coordcheck)"
    )
    p.set_defaults(func=cmd_coordcheck)


def cmd_coordcheck(args: argparse.Namespace) -> int:
    """Handler of ``modkit coordcheck``."""
    from . import UserError

    try:
        widths = [int(w) for w in args.widths.split(",")]
    except ValueError:
        raise UserError(f"--widths {args.widths!r}: give integers separated by commas, e.g. 64,128,256") from None
    try:
        optimizer = json.loads(args.optimizer)
    except ValueError:
        raise UserError(f'--optimizer {args.optimizer!r} is not JSON; e.g. \'{{"type": "muon"}}\'') from None
    if not Path(args.spec).is_file():
        raise UserError(f"spec {args.spec}: no such file")
    if args.data is not None and not (Path(args.data) / "meta.json").is_file():
        raise UserError(
            f"--data {args.data}: not a prepared data folder (no meta.json); prepare text with "
            f"`modkit data prepare FILES -o {args.data}`"
        )
    import torch

    from modkit.core.errors import DataError
    from modkit.experiments.coordcheck import CoordCheckError, coord_check, write_report

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        result = coord_check(
            args.spec,
            widths,
            base_d_model=args.base_d_model,
            steps=args.steps,
            lr=args.lr,
            optimizer=optimizer,
            seeds=args.seeds,
            batch=args.batch,
            seq_len=args.seq_len,
            data=args.data,
            random_tokens=args.random_tokens,
        )
    except (CoordCheckError, DataError) as exc:
        raise UserError(str(exc)) from None
    argv = [
        "modkit",
        "coordcheck",
        args.spec,
        "--widths",
        args.widths,
        "--steps",
        str(args.steps),
        "--lr",
        f"{args.lr:g}",
        "--seeds",
        str(args.seeds),
        "--batch",
        str(args.batch),
        "--seq-len",
        str(args.seq_len),
    ]
    if args.base_d_model is not None:
        argv += ["--base-d-model", str(args.base_d_model)]
    if args.data is not None:
        argv += ["--data", args.data]
    if args.random_tokens:
        argv += ["--random-tokens"]
    if optimizer != {"type": "adamw"}:
        argv += ["--optimizer", json.dumps(optimizer)]
    report = write_report(result, args.out, command=shlex.join(argv + ["-o", args.out]))
    print(f"data: {result.data} (vocabulary {result.vocab_size})")
    for par in result.change:
        growth = ", ".join(f"{q} {result.growth(par, q):.2f}x" for q in result.change[par])
        print(f"{par}: growth of mean |h_t - h_0| from d_model {widths[0]} to {widths[-1]}: {growth}")
    print(f"report: {report}")
    return 0
