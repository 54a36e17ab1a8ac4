"""``modkit docs build`` and ``modkit docs serve``: the subcommands :func:`modkit.cli.build_parser` adds."""

from __future__ import annotations

import argparse
from pathlib import Path

from .markdown import DocsError
from .site import build_site, find_config, _log_to_stderr, _quiet_banners, _require_mkdocs


CONFIG_HELP = (
    "mkdocs.yml to use (default: the repository's in a checkout of modkit, else the one shipped in the "
    "package; the gallery shows specs/ next to it, else ./specs)"
)


def _config_path(args) -> Path:
    if args.config_file:
        path = Path(args.config_file)
        if not path.is_file():
            raise FileNotFoundError(f"{args.config_file}: no such file")
        return path
    return find_config()


def cmd_docs_build(args: argparse.Namespace) -> int:
    """``modkit docs build [-o DIR] [--no-strict]``."""
    import sys
    import time

    _require_mkdocs()
    config = _config_path(args)
    _quiet_banners()
    _log_to_stderr()
    start = time.perf_counter()
    try:
        out = build_site(config, Path(args.output) if args.output else None, strict=not args.no_strict)
    except DocsError as exc:
        print(f"modkit: error: {exc}", file=sys.stderr)
        return 1
    print(f"built the site in {out} ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    print(
        f"view it: open {(out / 'index.html').as_uri()} in a browser (it works from disk, links and search "
        f"included), or serve it with: modkit docs serve{' -f ' + str(config) if args.config_file else ''}",
        file=sys.stderr,
    )
    return 0


def cmd_docs_serve(args: argparse.Namespace) -> int:
    """``modkit docs serve [-a ADDR]``: live-reloading server (rebuilds on edits to the pages, and in a checkout to
    modkit/ and plugins/, and to the gallery's specs/)."""
    _require_mkdocs()
    from mkdocs.commands.serve import serve

    from .plugin import spec_folder

    config = _config_path(args)
    _quiet_banners()
    _log_to_stderr()
    root = config.parent
    watch = [str(root / d) for d in ("modkit", "plugins") if (root / d).is_dir()]
    specs = spec_folder(config)
    if specs is not None:
        watch.append(str(specs))
    serve(config_file=str(config), dev_addr=args.dev_addr, livereload=True, watch=watch, strict=False)
    return 0


def add_subcommands(subparsers) -> None:
    """Add ``modkit docs build`` and ``modkit docs serve`` (called by :func:`modkit.cli.build_parser`)."""
    p = subparsers.add_parser(
        "docs",
        help="build or serve the documentation site",
        description="Build or serve the mkdocs site; component pages and the model gallery are generated from "
        "the installed components (third-party plugins included) and specs/ (needs pip install 'modkit-lm[docs]').",
    )
    sub = p.add_subparsers(dest="docs_command", metavar="ACTION", parser_class=type(p))
    sub.required = True
    b = sub.add_parser(
        "build", help="build the static site", description="Build the static site (strict: any warning fails)."
    )
    b.add_argument(
        "-o",
        "--output",
        metavar="DIR",
        help="output folder (default: site/ next to the repository's mkdocs.yml in a checkout, else ./site)",
    )
    b.add_argument("-f", "--config-file", metavar="FILE", help=CONFIG_HELP)
    b.add_argument("--no-strict", action="store_true", help="do not fail on warnings")
    b.set_defaults(func=cmd_docs_build)
    s = sub.add_parser(
        "serve",
        help="serve the site with live reload",
        description="Serve the site on a local address, rebuilding on edits.",
    )
    s.add_argument("-a", "--dev-addr", metavar="IP:PORT", default="127.0.0.1:8000", help="address to serve on")
    s.add_argument("-f", "--config-file", metavar="FILE", help=CONFIG_HELP)
    s.set_defaults(func=cmd_docs_serve)
