"""``modkit train``: train a spec on text, resume a run; every training-config field is also a flag.

Run under ``torchrun --nproc-per-node N`` the same command trains data-parallel (FSDP2), ``--tp K`` adds tensor
parallelism from the components' plans, ``--ep K`` expert parallelism (the experts of every mixture split over K
data-parallel processes, tokens dispatched by all-to-all), ``--pp K`` pipeline stages (the layers cut into K
stages run by a ``torch.distributed.pipelining`` schedule; :mod:`modkit.train.pipelined`); ``--ep`` and ``--pp``
compose (``torchrun --nproc-per-node 4 ... --ep 2 --pp 2``).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_subcommands(subparsers) -> None:
    """Add ``train`` to the ``modkit`` parser."""
    p = subparsers.add_parser(
        "train",
        help="train a model on text (tiny shakespeare by default)",
        description="Train a model spec on prepared token data and write a run folder (config, spec, tokenizer, "
        "metrics.jsonl, loss.png, checkpoints, a sample). With no arguments: nanoGPT's shakespeare-char GPT on the "
        "shipped tiny shakespeare, nanoGPT's CPU recipe. Every training-config field is a flag overriding the "
        "config file (--lr 3e-4, --max-steps 500, --model specs/tiny-llama.json, --data text.txt). Under torchrun "
        "the processes train data-parallel (FSDP2); --tp K adds tensor parallelism, --ep K expert parallelism, --pp K "
        "pipeline stages.",
    )
    p.add_argument("--config", "-c", metavar="FILE", help="training config JSON (default: the built-in defaults)")
    p.add_argument("--out", "-o", metavar="RUN", help="run folder (default runs/<model name>, numbered when taken)")
    p.add_argument("--resume", metavar="RUN", help="continue the run in RUN from its last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (status lines only)")
    add_tracker_flag(p)
    # one flag per config field: read from the pydantic model, so modkit's parser adds them when `train` is parsed
    defer = getattr(p, "defer", None)
    defer(_add_field_flags) if defer is not None else _add_field_flags(p)
    p.set_defaults(func=cmd_train)


def add_tracker_flag(p: argparse.ArgumentParser) -> None:
    """``--tracker TYPE[:VALUE]`` (repeatable): the trackers list (:mod:`modkit.train.trackers`)."""
    p.add_argument(
        "--tracker",
        action="append",
        metavar="TYPE[:VALUE]",
        help="log the run to an experiment tracker besides metrics.jsonl (repeatable; replaces the config's trackers): "
        "tensorboard, wandb[:offline], mlflow[:TRACKING_URI], jsonl[:PATH] or a plugin's ('modkit list tracker')",
    )


def tracker_overrides(args: argparse.Namespace, overrides: dict) -> dict:
    """``overrides`` with ``trackers`` set from the ``--tracker`` flags, when any.

    Raises:
        UserError: both ``--tracker`` and ``--trackers``. TrackerError: an unknown tracker type, or a value for a
            tracker that takes none.
    """
    from .trackers import parse_tracker_flag

    if not getattr(args, "tracker", None):
        return overrides
    if "trackers" in overrides:
        from ..cli import UserError

        raise UserError("give the trackers either as --tracker TYPE[:VALUE] flags or as --trackers JSON, not both")
    return {**overrides, "trackers": [parse_tracker_flag(t) for t in args.tracker]}


def _add_field_flags(p: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """One ``--field-name V`` flag per :class:`~modkit.train.config.TrainConfig` field (``--compile`` alone: true),
    but ``schema_version`` and the fields in ``skip`` (``modkit compare`` sets ``model`` itself)."""
    from .config import TrainConfig

    fields = p.add_argument_group("training-config fields (see 'modkit schema --train')")
    for name, info in TrainConfig.model_fields.items():
        if name == "schema_version" or name in skip:
            continue
        default = info.get_default(call_default_factory=True)
        flag_only = info.annotation is bool  # --compile alone means --compile true
        fields.add_argument(
            _flag(name),
            dest=f"field_{name}",
            metavar="V",
            default=None,
            **({"nargs": "?", "const": "true"} if flag_only else {}),
            help=f"{info.description} (default {json.dumps(default)})".replace("%", "%%"),
        )


def cmd_train(args: argparse.Namespace) -> int:
    """Handler of ``modkit train``."""
    from .config import TrainConfig, parse_flag_value
    from .loop import train

    overrides = {
        name: parse_flag_value(name, value)
        for name in TrainConfig.model_fields
        if (value := getattr(args, f"field_{name}", None)) is not None
    }
    overrides = tracker_overrides(args, overrides)
    if args.resume and args.config:
        from ..cli import UserError

        raise UserError("--resume continues a run with its own config; drop --config (flags still override fields)")
    if args.resume and args.out and Path(args.out) != Path(args.resume):
        from ..cli import UserError

        raise UserError("--resume RUN writes into RUN; drop --out")
    result = train(
        args.config,
        args.resume or args.out,
        overrides=overrides,
        resume=bool(args.resume),
        progress=not args.no_progress,
    )
    if int(os.environ.get("RANK", "0")) != 0:  # under torchrun one report is enough
        return 0
    print(f"\ndone: {result.steps} steps, {result.tokens:,} tokens in {result.elapsed_s:.1f} s")
    if result.step_s > 0:  # a resumed run that had finished trained nothing
        print(
            f"whole-run mean: {result.tokens_per_s:,.0f} tokens/s over {result.step_s:.1f} s of training steps "
            "(evals and checkpoints left out)"
        )
    if result.skipped_steps:
        print(f"skipped: {result.skipped_steps} step(s) whose loss or gradient was not finite (--on-nonfinite skip)")
    if result.val_loss is not None:
        print(
            f"last estimate: train {result.train_loss:.4f}, val {result.val_loss:.4f} (eval_batches fixed windows); best val {result.best_val_loss:.4f}"
        )
    if result.final_val_loss is not None:
        print(f"validation loss over the validation split: {result.final_val_loss:.4f}")
    print(
        f"run folder: {result.run_dir} (best checkpoint: {result.run_dir / 'best'}, loss curve: {result.run_dir / 'loss.png'})"
    )
    if result.sample is not None:
        print("\nsample from the best checkpoint:\n" + "-" * 60 + "\n" + result.sample + "\n" + "-" * 60)
    return 0
