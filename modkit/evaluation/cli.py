"""``modkit eval CHECKPOINT``: cross-entropy, perplexity and bits per byte on data, or lm-evaluation-harness tasks.

::

    modkit eval runs/x/best                                   # the run's validation split, as the run scored it
    modkit eval runs/x/best --data texts/ --seq-len 256 --stride 128
    modkit eval runs/x/best --tasks hellaswag,arc_easy --num-fewshot 0 --batch-size 16 --output results.json

``--include-path DIR`` adds lm-eval task files, and lm-eval runs the Python code they name (a ``!function`` entry
imports a module beside the YAML and calls it): a task folder is code, trusted as a plugin is.
"""

from __future__ import annotations

import argparse
import json
import difflib
import math
import sys
from pathlib import Path


def add_subcommands(subparsers) -> None:
    """Add ``modkit eval`` to the ``modkit`` parser (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "eval",
        help="score a checkpoint: loss, perplexity, bits per byte; or lm-eval tasks",
        description="Score a modkit checkpoint. Without --tasks: mean cross-entropy (nats/token), perplexity and bits "
        "per byte on a prepared data folder's split or on text inputs (whole split, in non-overlapping windows of "
        "--seq-len tokens, or strided with --stride). A checkpoint inside a run folder defaults to the run's data, "
        "seq_len, batch_size, document mask and final_eval_tokens, so it repeats the validation score the run "
        "reported. With --tasks: lm-evaluation-harness tasks through the 'modkit' model type (pip install "
        "'modkit-lm[eval]').",
    )
    p.add_argument("checkpoint", metavar="CHECKPOINT", help="a modkit checkpoint folder (runs/x/best)")
    p.add_argument(
        "--data",
        nargs="+",
        metavar="PATH",
        help="a prepared data folder, or text / .jsonl / .parquet inputs (default: the run's data)",
    )
    p.add_argument("--split", default="val", choices=("val", "train"), help="split of a prepared folder (default val)")
    p.add_argument(
        "--seq-len", type=int, metavar="N", help="tokens per window (default: the run's seq_len, else max_seq_len)"
    )
    p.add_argument(
        "--stride",
        type=int,
        metavar="S",
        help="strided windows: one every S tokens, each scoring what the last did not",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        metavar="N",
        help="score at most N tokens (default: the run's final_eval_tokens, else all)",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        metavar="B",
        help="windows (or lm-eval requests) per forward (default: the run's, else 8)",
    )
    mask = p.add_mutually_exclusive_group()
    mask.add_argument(
        "--document-mask",
        dest="document_mask",
        action="store_const",
        const=True,
        default=None,
        help="document-masked windows (default: as the run trained)",
    )
    mask.add_argument(
        "--no-document-mask", dest="document_mask", action="store_const", const=False, help="plain causal windows"
    )
    p.add_argument(
        "--text-field", default="text", metavar="NAME", help="field / column with the text of .jsonl / .parquet inputs"
    )
    p.add_argument("--tasks", metavar="T[,T...]", help="lm-eval tasks (or groups) to run instead of scoring data")
    p.add_argument(
        "--include-path",
        metavar="DIR",
        help="folder of extra lm-eval task YAML files. lm-eval runs the Python code they name (a '!function' "
        "entry imports a module beside the YAML and calls it), so, like installing a plugin, give only a folder "
        "whose code you trust",
    )
    p.add_argument("--num-fewshot", type=int, metavar="K", help="lm-eval few-shot examples")
    p.add_argument(
        "--limit", type=float, metavar="N", help="lm-eval: at most N documents per task (a fraction when < 1)"
    )
    p.add_argument("--output", "-o", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--device", metavar="DEV", help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_eval)


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse flags that are given but meaningless (they used to fall back to defaults, or run perplexity instead of
    tasks): a window or batch option below 1, ``--num-fewshot`` below 0, a ``--limit`` that is not a positive finite
    number, ``--tasks`` naming no task.

    Raises:
        UserError: naming the flag, the value and the fix.
    """
    from ..cli import UserError

    for name in ("seq_len", "stride", "max_tokens", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} {value}: give a positive number, or leave {flag} out for the default")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UserError(f"--num-fewshot {args.num_fewshot}: give 0 or more examples")
    if args.limit is not None and not (math.isfinite(args.limit) and args.limit > 0):
        raise UserError(f"--limit {args.limit}: give a positive number of documents (a fraction when below 1)")
    if args.tasks is not None and not [t for t in args.tasks.split(",") if t.strip()]:
        raise UserError(
            f"--tasks {args.tasks!r} names no task; give lm-eval task names separated by commas (e.g. "
            "hellaswag,arc_easy), or leave --tasks out to score cross-entropy on data"
        )
    if args.text_field is not None and not args.text_field.strip():
        raise UserError(
            f"--text-field {args.text_field!r} names no field; give the field holding the text of .jsonl / .parquet "
            "records (e.g. --text-field text), or leave it out for 'text'"
        )
    if args.include_path is not None and not Path(args.include_path).expanduser().is_dir():
        what = "is not a folder" if Path(args.include_path).expanduser().exists() else "does not exist"
        raise UserError(
            f"--include-path {args.include_path} {what}; give the folder holding the lm-eval task .yaml files"
        )
    if args.device is not None:
        from ..cli import _check_device

        if _check_device(args.device).type == "meta":
            raise UserError(
                f"--device {args.device!r} holds no data and cannot evaluate (it is for building models without "
                "memory); use cpu, cuda, cuda:N or mps"
            )


def cmd_eval(args: argparse.Namespace) -> int:
    """Handler of ``modkit eval``."""
    _check_flags(args)
    if args.tasks is not None:
        return _tasks(args)
    from .run import evaluate_checkpoint

    result = evaluate_checkpoint(
        args.checkpoint,
        args.data,
        split=args.split,
        seq_len=args.seq_len,
        stride=args.stride,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        document_mask=args.document_mask,
        text_field=args.text_field,
        device=args.device,
    )
    record = result.to_json()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(record, f, indent=2)
    if args.json:
        print(json.dumps(record, indent=2))
        return 0
    s, st = result.score, result.settings
    windows = (
        f"strided windows of {s.seq_len} (stride {s.stride})"
        if s.stride != s.seq_len
        else f"non-overlapping windows of {s.seq_len}"
    )
    print(
        f"{args.checkpoint} on {st['data']} ({st['split']}: {st['split_tokens']:,} tokens), {windows}, "
        f"document mask {'on' if st['document_mask'] else 'off'}"
    )
    print(f"  cross-entropy  {s.loss:.4f} nats/token")
    print(f"  perplexity     {s.perplexity:.4f}")
    bpb = s.bits_per_byte
    print(f"  bits per byte  {bpb:.4f}" if bpb is not None else "  bits per byte  n/a (no text bytes scored)")
    bytes_note = f" ({s.bytes:,} bytes)" if s.bytes is not None else ""
    print(f"  scored {s.tokens:,} tokens{bytes_note} in {s.windows:,} windows")
    return 0


def _tasks(args: argparse.Namespace) -> int:
    from ..cli import UserError

    try:
        import lm_eval
        from lm_eval.tasks import TaskManager
    except ImportError:
        raise UserError("--tasks needs lm-evaluation-harness: pip install 'modkit-lm[eval]'") from None
    from .harness import ModkitLM

    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    manager = None
    if args.include_path:  # tasks all in the given folder: no need to index lm-eval's thousands of task files
        local = TaskManager(include_path=args.include_path, include_defaults=False)
        manager = local if all(t in local.all_tasks for t in tasks) else TaskManager(include_path=args.include_path)
    manager = manager or TaskManager()
    _check_tasks(tasks, manager.all_tasks, args.include_path)
    lm = ModkitLM(args.checkpoint, batch_size=args.batch_size or 8, device=args.device)
    results = lm_eval.simple_evaluate(
        model=lm, tasks=tasks, num_fewshot=args.num_fewshot, limit=args.limit, task_manager=manager
    )
    if results is None:
        return 0
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"results": results["results"], "configs": results.get("configs", {})}, f, indent=2, default=str)
    if args.json:
        print(json.dumps(results["results"], indent=2, default=str))
    else:
        from lm_eval.utils import make_table

        sys.stdout.write(make_table(results) + "\n")
    return 0


def _check_tasks(tasks: list, known: list, include_path) -> None:
    """Refuse, before the model is loaded, task names lm-eval's task manager does not know (nor YAML files).

    Raises:
        UserError: naming the unknown task(s), the close matches of each and where tasks are looked up.
    """
    from ..cli import UserError

    names = set(known)
    unknown = [t for t in tasks if t not in names and not Path(t).is_file()]
    if not unknown:
        return
    parts = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        parts.append(f"{name!r}" + (f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""))
    where = f"lm-eval's tasks and {include_path}" if include_path else "lm-eval's tasks"
    raise UserError(
        f"--tasks: {', '.join(parts)} {'is not a task' if len(unknown) == 1 else 'are not tasks'} in {where} "
        f"({len(known):,} names); run 'lm-eval ls tasks' for the list, or add the folder of your task files with "
        "--include-path DIR"
    )
