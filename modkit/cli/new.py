"""``modkit new plugin NAME --kind KIND``: write a plugin package skeleton (:mod:`modkit.cli.scaffold` holds the templates)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from modkit.cli.scaffold import KINDS, ScaffoldError, import_name, plugin_files, scaffold_plugin


def _clashes(name: str, kind: str, type_: str) -> list[str]:
    """Why the new plugin would clash with what is installed: its plugin name or its ``kind/type`` already taken."""
    try:
        from modkit.core.registry import get_registry

        reg = get_registry()
        problems = []
        taken = {p.name: p.provider for p in reg.plugins()}
        if name in taken:
            problems.append(
                f"a plugin named {name!r} is already installed ({taken[name]}); modkit would load only one of the two, "
                "pick another NAME"
            )
        if type_ in reg.types(kind):
            problems.append(
                f"{kind} type {type_!r} is already provided by {reg.get(kind, type_).provider}; pick another name with --type"
            )
        return problems
    except Exception:  # noqa: BLE001 - a broken environment must not stop the scaffold
        return []


def cmd_new_plugin(args: argparse.Namespace) -> int:
    """``modkit new plugin NAME --kind KIND [--type TYPE] [-o DIR]``: write the skeleton; 0 ok, 1 error."""
    try:
        files = plugin_files(args.name, args.kind, args.type)
        type_ = args.type if args.type is not None else import_name(args.name)
        clashes = _clashes(args.name, args.kind, type_)
        if clashes:
            raise ScaffoldError("; ".join(clashes))
        target = scaffold_plugin(args.name, args.kind, args.type, Path(args.output))
    except ScaffoldError as exc:
        print(f"modkit: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"modkit: error: cannot write the plugin: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {target}/ ({args.kind} component {type_!r}):")
    for rel in files:
        print(f"  {rel}")
    print("")
    print("next:")
    print(f"  cd {target}")
    print("  pip install -e .")
    print(f"  modkit show {args.kind} {type_}")
    print(f"  modkit check --plugin {args.name}")
    return 0


def add_subcommands(subparsers) -> None:
    """Add ``new`` (``new plugin``) to the ``modkit`` command (called by :mod:`modkit.cli`)."""
    new = subparsers.add_parser(
        "new", help="create a new project from a template", description="Create a new project from a template."
    )
    what = new.add_subparsers(dest="template", metavar="TEMPLATE")
    what.required = True
    p = what.add_parser(
        "plugin",
        help="a plugin package with one working component",
        description="Write a plugin package: pyproject.toml with the 'modkit' entry point, one component file "
        "(config model, module, factory, param_count, registry entry) that passes the contract kit, and a test "
        "running the kit. NAME is the distribution and plugin name; the import name is NAME with '-' -> '_'.",
    )
    p.add_argument("name", metavar="NAME", help="distribution and plugin name, e.g. my-norms (import name my_norms)")
    p.add_argument("--kind", "-k", required=True, choices=KINDS, help="the kind of component to start from")
    p.add_argument("--type", "-t", metavar="TYPE", help="component type name used in specs (default: the import name)")
    p.add_argument(
        "-o", "--output", metavar="DIR", default=".", help="parent directory (default: .); DIR/NAME must not exist"
    )
    p.set_defaults(func=cmd_new_plugin)
