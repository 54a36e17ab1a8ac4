"""``modkit compare SPEC... --train CONFIG [--seeds K] [--lr-sweep LR,...] [--max-steps N] [--jobs N] [-o DIR]``.

Trains every spec with the same data, token budget, schedule and seeds (:func:`modkit.compare.compare`) and writes
a report folder: ``report.md`` (table, learning-rate sweep, loss by position), ``curves.png``, ``positions.png``,
``results.json`` and the runs.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path


def add_subcommands(subparsers) -> None:
    """Add ``modkit compare`` to the ``modkit`` subcommands (an extension module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "compare",
        help="train several specs under one recipe and write a comparison report",
        description="Train each spec with the same training config (data, token budget, schedule) and seeds, then "
        "write REPORT_DIR/report.md: parameters, active parameters, tokens/s, final train and validation loss (mean "
        "± std over seeds), diverged runs; overlaid validation curves (curves.png); validation loss by position "
        "bucket at twice the training seq_len (positions.png). With --lr-sweep each spec trains its first seed at "
        "every learning rate and the other seeds at the winner.",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec .json files (the report labels each by its file name)")
    p.add_argument("--train", required=True, metavar="CONFIG", help="training config JSON (its model field is replaced by each spec)")
    p.add_argument("--seeds", type=int, default=3, metavar="K", help="seeds per spec (default 3)")
    p.add_argument("--lr-sweep", metavar="LR,LR,...", help="learning rates to try per spec, e.g. 1e-3,3e-3 (default: the config's lr)")
    p.add_argument("-o", "--out", metavar="REPORT_DIR", default=None, help="report folder (default reports/compare)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N", help="override the config's step budget")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="training runs at once, each in its own process (default 1); on CPU keep N x the config's threads "
                        "within the cores")
    p.set_defaults(func=cmd_compare)


def command_line(args: argparse.Namespace, out: str) -> str:
    """The ``modkit compare`` command line that reruns ``args`` (every option spelled out, shell-quoted).

    Recorded in the report so a published comparison says exactly how it was made; the report folder is ``out``.
    """
    argv = ["modkit", "compare", *args.specs, "--train", args.train, "--seeds", str(args.seeds)]
    if args.lr_sweep is not None:
        argv += ["--lr-sweep", args.lr_sweep]
    if args.max_steps is not None:
        argv += ["--max-steps", str(args.max_steps)]
    if args.jobs != 1:
        argv += ["--jobs", str(args.jobs)]
    return shlex.join(argv + ["-o", out])


def cmd_compare(args: argparse.Namespace) -> int:
    """Handler of ``modkit compare``: check the arguments, run the comparison, print the table."""
    from . import UserError
    from ..compare import CompareError, compare, fmt_pm, parse_lrs

    for spec in args.specs:
        if not Path(spec).is_file():
            raise UserError(f"spec {spec}: no such file; give spec .json files")
    if not Path(args.train).is_file():
        raise UserError(f"--train {args.train}: no such file; give a training config JSON")
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    try:
        lrs = parse_lrs(args.lr_sweep) if args.lr_sweep is not None else None
    except CompareError as exc:
        raise UserError(str(exc)) from None
    overrides = {"max_steps": args.max_steps, "max_tokens": None} if args.max_steps is not None else {}
    out = args.out or "reports/compare"
    result = compare(args.specs, args.train, out, seeds=args.seeds, lr_sweep=lrs, overrides=overrides, jobs=args.jobs,
                     command=command_line(args, out))
    print()
    for row in result.rows:
        bpb = f" ({fmt_pm(row.val_bpb_mean, row.val_bpb_std)} bits/byte)" if row.val_bpb_mean is not None else ""
        print(f"{row.spec}: val {fmt_pm(row.val_loss_mean, row.val_loss_std)}{bpb}, train {fmt_pm(row.train_loss_mean, row.train_loss_std)}, "
              f"lr {row.lr:g}, {row.params:,} parameters, diverged {row.diverged}/{len(row.runs)}")
    print(f"report: {result.report}")
    return 0
