"""``modkit trace MODEL (--text TEXT | --ids IDS) [--tokenizer T] [--html OUT] [--random-init]``.

MODEL is a spec ``.json``, a modkit checkpoint folder (``spec.json`` + ``model.safetensors``), a training run folder
(its ``best`` checkpoint, else ``last``) or a Hugging Face folder (``config.json``). A spec has no weights: it is
traced on the ``meta`` device (shapes only, instant even for a 70B spec) unless ``--random-init`` builds it with
random weights, whose statistics are then those of an *untrained* model.

The tokenizer (:func:`choose_tokenizer`): ``--tokenizer`` (a ``tokenizer.json``, a folder holding one, or
``bytes``), else the ``tokenizer.json`` a checkpoint or Hugging Face folder carries. A spec carries none, so
``--text`` on a spec uses a default that fits its ``vocab_size``: ``bytes`` (one id per UTF-8 byte, 0 to 255) when
``vocab_size >= 256``, else the ``char`` tokenizer of the shipped tiny shakespeare (65 symbols: the vocabulary of
the ``*-shakespeare-char`` specs) when ``vocab_size >= 65``; below that ``--text`` is refused naming both sizes
(give ``--ids``). Weights without a tokenizer get no default: they were trained with one the folder does not hold.
A tokenizer with more ids than the model is an error naming both sizes; one with fewer, given by hand, a warning.

Prints the terminal view (:func:`modkit.analysis.trace_report.print_trace`) and, with ``--html OUT``, writes the
self-contained report (:func:`modkit.analysis.trace_report.write_html`). Errors reach the user as one
``modkit: error: ...`` line (exit status 1).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Optional

from modkit.core.errors import ModkitError

TOKENIZER_FILE = "tokenizer.json"


class TraceInputError(ModkitError, ValueError):
    """A ``modkit trace`` argument that cannot be used (the message names it and the fix)."""


def add_subcommands(subparsers) -> None:
    """Add ``modkit trace`` to the ``modkit`` subcommands (a command module of :mod:`modkit.cli`)."""
    p = subparsers.add_parser(
        "trace",
        help="show the shapes after every stage and per-layer statistics of one text",
        description="Run one text through a model and show the shape after every stage (ids, embedding, position, "
        "norms, q/k/v per head, attention scores, FFN expansion, residual adds, final norm, logits) and, with "
        "weights, per layer: residual-stream norm, relative update, cosine with the previous layer, FFN sparsity, "
        "attention entropy per head and the logit lens. A spec without --random-init is traced on the meta device "
        "(shapes only).",
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="spec .json, modkit checkpoint folder, training run folder or Hugging Face folder",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--text",
        help="the text to trace (tokenized by --tokenizer, the checkpoint's tokenizer.json or, "
        "for a spec, a default that fits its vocab_size)",
    )
    what.add_argument("--ids", help="token ids to trace, separated by commas or spaces (e.g. 1,2,3)")
    p.add_argument(
        "--tokenizer",
        metavar="T",
        help="a tokenizers tokenizer.json, a folder holding one, or 'bytes' "
        "(default: the checkpoint's; for a spec, bytes when vocab_size >= 256, else tiny shakespeare's "
        "65 characters when vocab_size >= 65)",
    )
    p.add_argument("--html", metavar="OUT", help="also write a self-contained HTML report with plots to OUT")
    p.add_argument(
        "--random-init",
        action="store_true",
        help="for a spec: build it with random weights (seed --seed) to get statistics of an untrained model",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of --random-init (default 0)")
    p.add_argument(
        "--device", default="cpu", help="device for a checkpoint or --random-init: cpu (default), cuda, cuda:N"
    )
    p.add_argument(
        "--dtype", default=None, help="float32, bfloat16 or float16 (default: float32 for a spec, as stored otherwise)"
    )
    p.add_argument("--top-k", type=int, default=5, metavar="K", help="tokens per layer in the logit lens (default 5)")
    p.set_defaults(func=cmd_trace)


def parse_ids(text: str) -> list[int]:
    """``"1,2, 3"`` or ``"1 2 3"`` -> ``[1, 2, 3]``.

    Raises:
        TraceInputError: an item that is not a non-negative integer (named).
    """
    items = [s for s in re.split(r"[,\s]+", text.strip()) if s]
    bad = next((s for s in items if not s.isdigit()), None)
    if bad is not None or not items:
        raise TraceInputError(
            f"--ids {text!r}: {'no ids' if bad is None else repr(bad) + ' is not a token id'}; give non-negative integers such as --ids 1,2,3"
        )
    return [int(s) for s in items]


def _checkpoint_folder(path: Path) -> Optional[Path]:
    """The modkit checkpoint a folder stands for (``spec.json`` + ``model.safetensors``): itself, or a run folder's
    ``best`` (else ``last``) checkpoint; ``None`` otherwise (e.g. a Hugging Face folder)."""
    if (path / "model.safetensors").is_file() and (path / "spec.json").is_file():
        return path
    for link in ("best", "last"):
        if (path / link / "model.safetensors").is_file() and (path / link / "spec.json").is_file():
            return path / link
    return None


def load_for_trace(
    model: str, *, random_init: bool, seed: int, device: str, dtype: Optional[str]
) -> tuple[Any, str, Optional[Path]]:
    """``(model, weights description, folder holding a tokenizer.json or None)`` for ``modkit trace MODEL``.

    Raises:
        TraceInputError: a path that is none of the accepted kinds, ``--random-init`` with a checkpoint, ``meta``
            asked for a checkpoint.
        FileNotFoundError: no such path.
    """
    import modkit

    path = Path(model)
    if not path.exists():
        raise FileNotFoundError(2, "no such file", model)
    if path.is_file():
        if path.suffix != ".json":
            raise TraceInputError(f"{model}: give a spec .json file, a checkpoint folder or a training run folder")
        spec = modkit.load_spec(path)
        if not random_init:
            return (
                modkit.build(spec, device="meta"),
                "none (meta device): shapes only; add --random-init for statistics of an untrained model",
                None,
            )
        built = modkit.build(spec, device=device, dtype=dtype, seed=seed)
        return built, f"untrained (random init, seed {seed}): statistics describe no training", None
    if random_init:
        raise TraceInputError(f"--random-init applies to a spec .json; {model} is a folder with weights")
    if device == "meta":
        raise TraceInputError(
            "--device meta is for specs (the default for them); a checkpoint is traced with its weights on cpu or cuda"
        )
    folder = _checkpoint_folder(path)
    if folder is not None:
        return modkit.load(folder, device=device, dtype=dtype), f"trained checkpoint {folder}", folder
    if (path / "config.json").is_file():
        return modkit.from_hf(path, device=device, dtype=dtype), f"Hugging Face weights {path}", path
    raise TraceInputError(
        f"{model}: neither a modkit checkpoint (spec.json + model.safetensors), a training run (best/ or last/) nor a "
        "Hugging Face folder (config.json)"
    )


def choose_tokenizer(
    arg: Optional[str], folder: Optional[Path], *, weights: bool, vocab_size: int, needed: bool
) -> tuple[Any, str, Optional[str]]:
    """``(tokenizer or None, what it is, warning or None)`` for ``modkit trace`` (the rules in the module docstring).

    Args:
        arg: ``--tokenizer`` (a path or ``bytes``), or ``None``.
        folder: the checkpoint or Hugging Face folder, whose ``tokenizer.json`` is the default; ``None`` for a spec.
        weights: the model has trained weights (no default tokenizer is made up for them).
        vocab_size: the model's.
        needed: ``--text`` was given (otherwise a missing tokenizer only means ids are shown as numbers).

    Raises:
        TraceInputError: ``--text`` with no tokenizer that fits, naming the model's ``vocab_size``.
        modkit.core.errors.DataError: a tokenizer with more ids than ``vocab_size`` (both named), or one that cannot be
            read.
    """
    from ..data import byte_tokenizer, check_fits, load_tokenizer
    from ..data.corpus import default_corpus
    from ..data.tokenizer import char_tokenizer

    if arg:
        tok = byte_tokenizer() if arg == "bytes" else load_tokenizer(arg)
        what = "bytes (one id per UTF-8 byte, 0 to 255)" if arg == "bytes" else f"{tok.spec} ({tok.vocab_size:,} ids)"
        return tok, what, check_fits(tok, vocab_size)
    if folder is not None and (folder / TOKENIZER_FILE).is_file():
        tok = load_tokenizer(folder / TOKENIZER_FILE)
        check_fits(tok, vocab_size)
        return tok, f"{folder / TOKENIZER_FILE} ({tok.vocab_size:,} ids)", None
    if weights:
        if needed:
            raise TraceInputError(
                "--text needs the tokenizer these weights were trained with and the folder holds no tokenizer.json: "
                "give --tokenizer PATH (a tokenizer.json), or the token ids with --ids 1,2,3"
            )
        return None, "", None
    if vocab_size >= 256:
        return (
            byte_tokenizer(),
            f"bytes (one id per UTF-8 byte, 0 to 255): the default for a spec with vocab_size {vocab_size:,} >= 256",
            None,
        )
    chars = char_tokenizer(default_corpus().read_text(encoding="utf-8"))
    if vocab_size >= chars.vocab_size:
        chars.spec = "char (tiny shakespeare)"
        return (
            chars,
            (
                f"char (tiny shakespeare's {chars.vocab_size} characters): the default for a spec with vocab_size "
                f"{vocab_size:,} < 256"
            ),
            None,
        )
    if needed:
        raise TraceInputError(
            f"--text: no default tokenizer fits vocab_size {vocab_size:,} (bytes need 256 ids, tiny shakespeare's "
            f"characters {chars.vocab_size}): give --tokenizer PATH with at most {vocab_size:,} ids, or --ids 1,2,3"
        )
    return None, "", None


def cmd_trace(args: argparse.Namespace) -> int:
    """Run :func:`modkit.analysis.trace.trace` and print it; write the HTML report with ``--html``."""
    from modkit.analysis.trace import trace
    from modkit.analysis.trace_report import print_trace, write_html
    from .output import _err

    if args.top_k < 1:
        raise TraceInputError(f"--top-k must be >= 1, got {args.top_k}")
    if args.html and not Path(args.html).resolve().parent.is_dir():
        raise TraceInputError(f"--html {args.html}: folder {Path(args.html).resolve().parent} does not exist")
    ids = parse_ids(args.ids) if args.ids is not None else None
    model, weights, folder = load_for_trace(
        args.model, random_init=args.random_init, seed=args.seed, device=args.device, dtype=args.dtype
    )
    tokenizer, what, warning = choose_tokenizer(
        args.tokenizer,
        folder,
        weights=folder is not None,
        vocab_size=model.spec.vocab_size,
        needed=args.text is not None,
    )
    if warning:
        _err(f"modkit: warning: {warning}")
    if ids is None:
        # one sequence: a tokenizer.json that pads to a fixed length (sentence-transformers folders) must not pad it
        tokenizer.backend.no_padding()
        ids = tokenizer.encode(args.text)
    result = trace(model.eval(), ids, tokenizer=tokenizer, top_k=args.top_k, weights=weights)
    result.tokenizer = what
    print_trace(result)
    if args.html:
        out = write_html(result, args.html)
        print(f"wrote {out}")
    return 0
