"""``modkit convert hf CONFIG [-o SPEC]`` (a Hugging Face ``config.json`` or model folder -> a spec, or with weights
a modkit checkpoint) and ``modkit convert modkit DIR --to hf -o OUT`` (a modkit checkpoint -> a Hugging Face
folder). Safetensors only: pickle weights are refused."""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path
from typing import Optional

from .common import _registry
from .errors import UserError
from .output import _count, _err, _short_count, _spec_error_lines


def add_subcommands(sub) -> None:
    """Add ``convert hf`` and ``convert modkit``."""
    p = sub.add_parser(
        "convert",
        help="convert a foreign config or checkpoint",
        description="Convert a foreign config into a modkit spec, or a checkpoint between formats (safetensors only).",
    )
    conv = p.add_subparsers(dest="source", metavar="SOURCE", parser_class=type(p))
    conv.required = True
    h = conv.add_parser(
        "hf",
        help="Hugging Face config.json or model folder",
        description="Hugging Face config.json (file or model folder) -> spec. A folder holding safetensors weights "
        "with -o OUT becomes a modkit checkpoint folder OUT (spec.json + model.safetensors). Pickle weights "
        "(pytorch_model.bin, *.pt) are refused: unpickling can execute arbitrary code.",
    )
    h.add_argument("config", metavar="CONFIG", help="config.json, or a model folder holding one (and its weights)")
    h.add_argument(
        "-o",
        "--output",
        metavar="OUT",
        help="where to write: for a folder with weights, the checkpoint folder OUT (unless OUT ends in .json: the spec "
        "only); otherwise the spec (default: the spec to stdout)",
    )
    h.add_argument("--dtype", default=None, help="with weights: float32, bfloat16 or float16 (default: as stored)")
    h.add_argument(
        "--strict",
        action="store_true",
        help="refuse config keys the converter does not know (default: drop them with one warning naming each key and value)",
    )
    h.set_defaults(func=cmd_convert_hf)
    m = conv.add_parser(
        "modkit",
        help="modkit checkpoint -> Hugging Face folder",
        description="A modkit checkpoint folder (spec.json + model.safetensors) -> a Hugging Face folder "
        "(config.json + model.safetensors, sharded above --max-shard-size) that transformers loads. The model "
        "type is --model-type, else the spec's metadata.hf_model_type, else the one registered type whose "
        "components express the spec (several: name one with --model-type). A run's tokenizer files travel along.",
    )
    m.add_argument("checkpoint", metavar="DIR", help="modkit checkpoint folder (or its model.safetensors)")
    m.add_argument("--to", required=True, choices=["hf"], help="target format (hf)")
    m.add_argument("-o", "--output", required=True, metavar="OUT", help="output folder")
    m.add_argument(
        "--model-type",
        default=None,
        metavar="TYPE",
        help="Hugging Face model_type to write, e.g. llama (default: the spec's, or the only one that fits)",
    )
    m.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: as stored)")
    m.add_argument("--max-shard-size", default=None, metavar="SIZE", help="largest shard, e.g. 5GB (default), 500MB")
    m.set_defaults(func=cmd_convert_modkit)


def cmd_convert_hf(args: argparse.Namespace) -> int:
    """``modkit convert hf CONFIG [-o SPEC]``: Hugging Face ``config.json`` (file or folder) -> validated spec."""
    import modkit
    from modkit.io.hf import convert_hf_config

    src = Path(args.config)
    if not src.exists():
        raise FileNotFoundError(f"{args.config}: no such file")
    if src.is_dir() and args.output and args.output != "-" and not args.output.endswith(".json") and _has_weights(src):
        return _convert_hf_weights(src, Path(args.output), args.dtype, args.strict)
    reg = _registry()
    try:
        data, spec = convert_hf_config(src, registry=reg, strict=args.strict)
    except modkit.SpecError as exc:
        for line in _spec_error_lines(exc, args.config):
            _err(line)
        return 1
    text = json.dumps(data, indent=2) + "\n"
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        total = modkit.count_params(spec, registry=reg)
        _err(f"wrote {args.output} ({spec.name or 'unnamed'}: {_count(total)} parameters, {_short_count(total)})")
    else:
        sys.stdout.write(text)
    return 0


def _has_weights(folder: Path) -> bool:
    """Whether a model folder holds weights: safetensors, or pickle files (refused when converting)."""
    from modkit.io.checkpoint import PICKLE_SUFFIXES

    return any(
        p.suffix == ".safetensors" or p.name.endswith(".safetensors.index.json") or p.suffix.lower() in PICKLE_SUFFIXES
        for p in folder.iterdir()
        if p.is_file()
    )


def _weights_summary(model) -> str:
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    dtype = next((str(p.dtype).replace("torch.", "") for p in model.parameters()), "-")
    extras = len(getattr(model, "checkpoint_extras", None) or {})
    kept = f", {extras} source tensor(s) kept alongside" if extras else ""
    return f"{model.spec.name or 'unnamed'}: {_count(total)} parameters, {_short_count(total)}, {dtype}{kept}"


def _convert_hf_weights(src: Path, out: Path, dtype: Optional[str], strict: bool = False) -> int:
    """``modkit convert hf DIR -o OUT``: load the folder's safetensors weights and save a modkit checkpoint."""
    import modkit

    model = modkit.from_hf(src, dtype=dtype, registry=_registry(), strict=strict)
    modkit.save(model, out)
    _err(f"wrote {out}/ (spec.json + model.safetensors; {_weights_summary(model)})")
    return 0


def cmd_convert_modkit(args: argparse.Namespace) -> int:
    """``modkit convert modkit DIR --to hf -o OUT``: a modkit checkpoint -> Hugging Face folder."""
    import modkit
    from modkit.io.hf_types import choose_hf_model_type

    src = Path(args.checkpoint)
    if not src.exists():
        raise FileNotFoundError(f"{args.checkpoint}: no such file")
    kwargs = {} if args.max_shard_size is None else {"max_shard_size": _parse_size(args.max_shard_size)}
    model = modkit.load(src, dtype=args.dtype, registry=_registry())
    out = Path(args.output)
    model_type, note = choose_hf_model_type(model.spec, _registry(), args.model_type)
    if note:
        _err(f"note: {note} (name another with --model-type)")
    modkit.to_hf(model, out, registry=_registry(), model_type=model_type, **kwargs)
    tokenizer = (src if src.is_dir() else src.parent) / "tokenizer.json"
    if tokenizer.is_file():  # a training run's checkpoint carries its tokenizer; the export keeps it beside the weights
        shutil.copyfile(tokenizer, out / "tokenizer.json")
        for name in ("tokenizer_config.json", "special_tokens_map.json"):  # its special tokens, for AutoTokenizer
            if tokenizer.with_name(name).is_file():
                shutil.copyfile(tokenizer.with_name(name), out / name)
    _err(
        f"wrote {out}/ (Hugging Face {model_type}: config.json + safetensors{' + tokenizer.json' if tokenizer.is_file() else ''}; "
        f"{_weights_summary(model)})"
    )
    return 0


def _parse_size(text: str) -> int:
    """``5GB``, ``500MB``, ``2GiB``, ``1000`` -> bytes."""
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    try:
        value = float(num) * units[t[len(num) :]]
    except (ValueError, KeyError):
        raise UserError(f"invalid size {text!r}; use e.g. 5GB, 500MB, 2GiB or a number of bytes") from None
    if not math.isfinite(value):
        raise UserError(f"invalid size {text!r}: not a finite number of bytes")
    if value < 1:
        raise UserError(f"invalid size {text!r}: must be at least 1 byte")
    return int(value)
