"""``modkit compare SPEC... [--train CONFIG] [--seeds K] [--lr-grid LR,...] [--FIELD V ...] [--widths W,...] [--ladder]``.

Trains every spec with the same data, token budget, schedule and seeds (:func:`modkit.experiments.compare.compare`) and writes
a report folder: ``report.md`` (table, verdicts with confidence intervals, learning rates, instability, ladder fits,
loss by position), the plots, ``results.json`` and the runs. ``--merge DIR...`` writes one report from several.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

#: compare's options in the order its recorded command line spells them (after --seeds and the learning rates and
#: the training-config fields)
_AFTER_FIELDS = (
    ("override", "--override"),
    ("set", "--set"),
    ("widths", "--widths"),
    ("depths", "--depths"),
    ("ladder", "--ladder"),
    ("tokens_per_param", "--tokens-per-param"),
    ("tokens", "--tokens"),
    ("holdout_width", "--holdout-width"),
    ("holdout_depth", "--holdout-depth"),
    ("throughput_steps", "--throughput-steps"),
    ("spike_margin", "--spike-margin"),
)


def add_subcommands(subparsers) -> None:
    """Add ``modkit compare`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "compare",
        help="train several specs under one recipe and write a comparison report (ladders, lr grids, verdicts)",
        description="Train each spec with the same training config (data, token budget, schedule) and seeds, then "
        "write REPORT_DIR/report.md: parameters, tokens/s (with the load it was measured under), train and validation "
        "loss (mean ± std over seeds), diverged and unstable runs; each design against the first as a difference with "
        "a 95% confidence interval over seeds, resolved only when it excludes zero; train-loss, gradient-norm and "
        "validation curves; loss by position at twice the training seq_len where a model can be scored. Every "
        "training-config field is a flag (as for modkit train). --lr-grid trains every seed at every rate, --lr-sweep "
        "the first seed only; --override LABEL:FIELD=VALUE sets a training-config field for one spec, --set "
        "LABEL:PATH=JSON a field of its spec (one spec file as two designs: base=s.json qk=s.json --set "
        '\'qk:block.attention.qk_norm={"type": "rmsnorm"}\'); --widths/--depths train each '
        "spec at several sizes and --ladder fits L(C) = E + A C^-alpha with a held-out check. --merge DIR... writes "
        "one report from several report folders.",
    )
    _add_run_flags(p)
    _add_ladder_flags(p)
    _add_report_flags(p)
    defer = getattr(p, "defer", None)
    defer(_fields) if defer is not None else _fields(p)
    p.set_defaults(func=cmd_compare)


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """The specs, the training config, the seeds, the learning rates and the per-spec overrides."""
    p.add_argument(
        "specs",
        nargs="+",
        metavar="SPEC",
        help="spec .json files, or LABEL=FILE (the report labels each by "
        "LABEL or its file name); with --merge: report folders",
    )
    p.add_argument(
        "--train",
        default=None,
        metavar="CONFIG",
        help="training config JSON (its model field is replaced by each spec; default: the built-in defaults)",
    )
    p.add_argument("--seeds", type=int, default=3, metavar="K", help="seeds per spec (default 3)")
    p.add_argument(
        "--lr-sweep",
        metavar="LR,LR,...",
        help="learning rates tried on the first seed of each spec; the other seeds train at the winner",
    )
    p.add_argument("--lr-grid", metavar="LR,LR,...", help="learning rates every seed of every spec trains at")
    p.add_argument(
        "--override",
        action="append",
        default=None,
        metavar="LABEL:FIELD=VALUE",
        help='a training-config field for one spec\'s runs (repeatable), e.g. muon:optimizer=\'{"type": "muon"}\'',
    )
    p.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="LABEL:PATH=JSON",
        help="a field of one spec, by its dotted path in the spec (repeatable; validated as a spec before any run "
        'trains), e.g. \'qk:block.attention.qk_norm={"type": "rmsnorm"}\' or qk:block.ffn.d_ff=256',
    )


def _add_ladder_flags(p: argparse.ArgumentParser) -> None:
    """The sizes every spec trains at, their token budgets, the ladder fit and its held-out size."""
    p.add_argument(
        "--widths", metavar="W,W,...", help="train each spec at these d_model (d_ff and head_dim scaled with it)"
    )
    p.add_argument("--depths", metavar="L,L,...", help="train each spec at these n_layers")
    p.add_argument(
        "--ladder",
        action="store_true",
        help="fit validation loss against training FLOPs per spec (needs 3+ fitted sizes, checked before training)",
    )
    p.add_argument(
        "--tokens-per-param",
        metavar="R[,R...]",
        help="token budget of each size: R x its parameters (several: every size at every budget, and an L(N, D) fit)",
    )
    p.add_argument("--tokens", metavar="T,T,...", help="token budget of each size, one per size in order")
    p.add_argument(
        "--holdout-width",
        type=int,
        default=None,
        metavar="W",
        help="a larger d_model every spec also trains at, which the ladder fit does not see and predicts",
    )
    p.add_argument("--holdout-depth", type=int, default=None, metavar="L", help="n_layers of the held-out size")


def _add_report_flags(p: argparse.ArgumentParser) -> None:
    """The throughput timing, the instability margin, merging, the report folder and the parallel runs."""
    p.add_argument(
        "--throughput-steps",
        type=int,
        default=0,
        metavar="N",
        help="after training, time N steps of every variant round-robin in one process (3 rounds, median): "
        "throughput that every variant measured under the same load (default 0: off)",
    )
    p.add_argument(
        "--spike-margin",
        type=float,
        default=0.1,
        metavar="NATS",
        help="margin of the instability reading (default 0.1)",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="SPEC... are report folders of earlier comparisons: write one report from them (nothing trains)",
    )
    p.add_argument("-o", "--out", metavar="REPORT_DIR", default=None, help="report folder (default reports/compare)")
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="training runs at once, each in its own process (default 1); on CPU keep N x the config's threads "
        "within the cores",
    )


def _fields(p: argparse.ArgumentParser) -> None:
    from ..train.cli import _add_field_flags, add_tracker_flag

    add_tracker_flag(p)
    _add_field_flags(p, skip=("model",))


def _field_flags(args: argparse.Namespace) -> list[tuple[str, str]]:
    """``(name, text)`` of every training-config field given as a flag, in the config's field order."""
    from ..train.config import TrainConfig

    return [(n, v) for n in TrainConfig.model_fields if (v := getattr(args, f"field_{n}", None)) is not None]


def command_line(args: argparse.Namespace, out: str) -> str:
    """The ``modkit compare`` command line that reruns ``args`` (every option spelled out, shell-quoted).

    Recorded in the report so a published comparison says exactly how it was made; the report folder is ``out``.
    """
    argv = ["modkit", "compare", *args.specs]
    if getattr(args, "merge", False):
        return shlex.join(argv + ["--merge", "-o", out])
    if args.train is not None:
        argv += ["--train", args.train]
    argv += ["--seeds", str(args.seeds)]
    if args.lr_sweep is not None:
        argv += ["--lr-sweep", args.lr_sweep]
    if getattr(args, "lr_grid", None) is not None:
        argv += ["--lr-grid", args.lr_grid]
    for name, text in _field_flags(args):
        argv += ["--" + name.replace("_", "-"), text]
    for item in getattr(args, "tracker", None) or []:
        argv += ["--tracker", item]
    for attr, flag in _AFTER_FIELDS:
        value = getattr(args, attr, None)
        if attr in ("override", "set"):
            for item in value or []:
                argv += [flag, item]
        elif attr == "ladder":
            argv += [flag] if value else []
        elif attr == "throughput_steps":
            argv += [flag, str(value)] if value else []
        elif attr == "spike_margin":
            argv += [flag, f"{value:g}"] if value != 0.1 else []
        elif value is not None:
            argv += [flag, str(value)]
    if args.jobs != 1:
        argv += ["--jobs", str(args.jobs)]
    return shlex.join(argv + ["-o", out])


def _spec_overrides(items, labels_hint: str) -> dict:
    from . import UserError
    from ..train.config import TrainConfig, parse_flag_value

    out: dict = {}
    for item in items or []:
        label, sep, rest = item.partition(":")
        name, eq, text = rest.partition("=")
        name = name.replace("-", "_")
        if not sep or not eq or not label or not name:
            raise UserError(
                f'--override {item!r}: write LABEL:FIELD=VALUE, e.g. muon:optimizer=\'{{"type": "muon"}}\' ({labels_hint})'
            )
        if name not in TrainConfig.model_fields:
            raise UserError(f"--override {item!r}: {name!r} is not a training-config field ('modkit schema --train')")
        out.setdefault(label, {})[name] = parse_flag_value(name, text)
    return out


def _spec_fields(items) -> dict:
    """``--set LABEL:PATH=JSON`` entries as ``{label: {path: value}}``; :class:`UserError` for a malformed one."""
    from . import UserError
    from modkit.experiments.compare import CompareError
    from modkit.experiments.compare.spec_fields import parse_spec_field

    out: dict = {}
    for item in items or []:
        try:
            label, path, value = parse_spec_field(item)
        except CompareError as exc:
            raise UserError(str(exc)) from None
        out.setdefault(label, {})[path] = value
    return out


def cmd_compare(args: argparse.Namespace) -> int:
    """Handler of ``modkit compare``: check the arguments, run the comparison (or merge reports), print the table."""
    from . import UserError
    from modkit.experiments.compare import CompareError, CompareRequest, compare

    out = args.out or "reports/compare"
    if args.merge:
        return _merge(args, out)
    _check_inputs(args)
    lists = _parsed_lists(args)
    from ..train.cli import tracker_overrides

    overrides = tracker_overrides(args, _field_overrides(args))
    spec_overrides = _spec_overrides(args.override, "labels are the spec file names or LABEL of LABEL=FILE")
    spec_fields = _spec_fields(args.set)
    holdout = (args.holdout_width, args.holdout_depth) if (args.holdout_width or args.holdout_depth) else None
    try:
        request = CompareRequest(
            args.specs,
            args.train,
            out,
            seeds=args.seeds,
            overrides=overrides,
            spec_overrides=spec_overrides,
            spec_fields=spec_fields,
            ladder=args.ladder,
            holdout=holdout,
            throughput_steps=args.throughput_steps,
            spike_margin=args.spike_margin,
            jobs=args.jobs,
            command=command_line(args, out),
            **lists,
        )
        result = compare(request)
    except CompareError as exc:
        raise UserError(str(exc)) from None
    _print_result(result)
    return 0


def _merge(args: argparse.Namespace, out: str) -> int:
    """``--merge``: check that every folder holds a ``results.json``, write one report from them into ``out``."""
    from . import UserError
    from modkit.experiments.compare import CompareError, merge_reports

    for d in args.specs:
        if not (Path(d) / "results.json").is_file():
            raise UserError(f"--merge {d}: no results.json; give report folders written by modkit compare")
    try:
        result = merge_reports(args.specs, out, command=command_line(args, out))
    except CompareError as exc:
        raise UserError(str(exc)) from None
    print(f"report: {result.report}")
    return 0


def _check_inputs(args: argparse.Namespace) -> None:
    """Raise :class:`UserError` for a missing spec or training-config file, ``--seeds`` / ``--jobs`` /
    ``--holdout-width`` / ``--holdout-depth`` below 1, or a
    meaningless ``--spike-margin`` / ``--throughput-steps`` (:func:`~modkit.experiments.compare.plan.check_options`)."""
    from . import UserError
    from modkit.experiments.compare.plan import CompareError, check_options

    for spec in args.specs:
        path = spec.split("=", 1)[1] if "=" in spec and not Path(spec).is_file() else spec
        if not Path(path).is_file():
            raise UserError(f"spec {path}: no such file; give spec .json files (or LABEL=FILE)")
    if args.train is not None and not Path(args.train).is_file():
        raise UserError(f"--train {args.train}: no such file; give a training config JSON")
    if args.seeds < 1:
        raise UserError(f"--seeds must be >= 1, got {args.seeds}")
    if args.jobs < 1:
        raise UserError(f"--jobs must be >= 1, got {args.jobs}")
    for name, value in (("--holdout-width", args.holdout_width), ("--holdout-depth", args.holdout_depth)):
        if value is not None and value < 1:
            raise UserError(f"{name} {value}: give a positive integer (the held-out size's d_model / n_layers)")
    try:
        check_options(
            spike_margin=args.spike_margin,
            throughput_steps=args.throughput_steps,
            names={"spike_margin": "--spike-margin", "throughput_steps": "--throughput-steps"},
        )
    except CompareError as exc:
        raise UserError(str(exc)) from None


def _parsed_lists(args: argparse.Namespace) -> dict:
    """The comma-separated options parsed, keyed by their :class:`CompareRequest` field (``None`` where not given).

    Raises :class:`UserError` naming the option whose list does not parse.
    """
    from . import UserError
    from modkit.experiments.compare.plan import CompareError, parse_ints, parse_lrs, parse_ratios

    try:
        return dict(
            lr_sweep=parse_lrs(args.lr_sweep) if args.lr_sweep is not None else None,
            lr_grid=parse_lrs(args.lr_grid, "--lr-grid") if args.lr_grid is not None else None,
            widths=parse_ints(args.widths, "--widths") if args.widths else None,
            depths=parse_ints(args.depths, "--depths") if args.depths else None,
            tokens=parse_ints(args.tokens, "--tokens") if args.tokens else None,
            tokens_per_param=parse_ratios(args.tokens_per_param) if args.tokens_per_param else None,
        )
    except CompareError as exc:
        raise UserError(str(exc)) from None


def _field_overrides(args: argparse.Namespace) -> dict:
    """The training-config fields given as flags, parsed; a step budget without a token budget clears the other."""
    from ..train.config import parse_flag_value

    overrides = {name: parse_flag_value(name, text) for name, text in _field_flags(args)}
    if "max_steps" in overrides and "max_tokens" not in overrides:
        overrides["max_tokens"] = None
    if "max_tokens" in overrides and "max_steps" not in overrides:
        overrides["max_steps"] = None
    return overrides


def _print_result(result) -> None:
    """Print one line per spec, one per verdict and the report's path."""
    from modkit.experiments.compare import fmt_pm

    print()
    for row in result.rows:
        bpb = f" ({fmt_pm(row.val_bpb_mean, row.val_bpb_std)} bits/byte)" if row.val_bpb_mean is not None else ""
        print(
            f"{row.spec}: val {fmt_pm(row.val_loss_mean, row.val_loss_std)}{bpb}, train {fmt_pm(row.train_loss_mean, row.train_loss_std)}, "
            f"lr {row.lr:g}, {row.params:,} parameters, diverged {row.diverged}/{len(row.runs)}"
        )
    for v in result.verdicts:
        print(("" if v.lr is None else f"lr {v.lr:g}: ") + v.text())
    print(f"report: {result.report}")
