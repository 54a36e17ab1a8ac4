"""``modkit validate SPEC...`` (``ok SPEC``, or one ``SPEC: path: message`` line per error) and ``modkit schema
[--train] [-o FILE]`` (the JSON Schema of specs with the installed components, or of training configs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .common import _registry
from .output import _err, _out, _spec_error_lines


def add_subcommands(sub) -> None:
    """Add ``validate`` and ``schema``."""
    p = sub.add_parser(
        "validate",
        help="validate spec files",
        description="Validate spec files; one line per error. A spec holding components whose math can overflow "
        "(recurrent mixers, latent attention, mixtures of experts, soft-caps, scales and multipliers) also runs one "
        "forward pass of a tiny instance on the CPU, whose logits must be finite (modkit.spec.finite).",
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec .json file(s)")
    p.add_argument(
        "--no-forward-check",
        dest="forward_check",
        action="store_false",
        help="skip the finite-forward check of a tiny instance",
    )
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "schema", help="print the JSON Schema of specs", description="JSON Schema of specs (installed components)."
    )
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument(
        "--train", action="store_true", help="the JSON Schema of training configs (modkit train --config) instead"
    )
    p.set_defaults(func=cmd_schema)


def cmd_validate(args: argparse.Namespace) -> int:
    """``modkit validate SPEC...``: ``ok SPEC`` per good spec; ``SPEC: path: message`` per error (stderr), and
    ``SPEC: message`` when the finite-forward check of a tiny instance fails (:mod:`modkit.spec.finite`)."""
    import modkit

    reg = _registry()
    failed = 0
    for name in args.specs:
        path = Path(name)
        if path.is_dir():
            _err(f"{name}: is a directory; give a spec .json file")
            failed += 1
            continue
        try:  # a missing, special (FIFO, device) or unreadable file is a SpecError naming it: go on to the next
            spec = modkit.load_spec(path, registry=reg)
        except modkit.SpecError as exc:
            for line in _spec_error_lines(exc, name):
                _err(line)
            failed += 1
            continue
        problem = _forward_problem(spec, reg) if getattr(args, "forward_check", True) else None
        if problem:
            _err(f"{name}: {problem}")
            failed += 1
        else:
            _out(f"ok {name}")
    if failed and len(args.specs) > 1:
        _err(f"{failed} of {len(args.specs)} spec(s) invalid")
    return 1 if failed else 0


def _forward_problem(spec, registry):
    """The finite-forward check of :mod:`modkit.spec.finite` (``None``: finite, or not needed)."""
    from modkit.spec.finite import finite_forward_problem

    return finite_forward_problem(spec, registry)


def cmd_schema(args: argparse.Namespace) -> int:
    """``modkit schema [--train] [-o FILE]``: JSON Schema of specs with the installed components, or of training configs."""
    import modkit

    if args.train:
        from modkit.train.config import json_schema as train_schema

        schema = train_schema()
    else:
        schema = modkit.json_schema()
    text = json.dumps(schema, indent=2) + "\n"
    if args.output and args.output != "-":
        Path(args.output).write_text(text)
        _err(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return 0
