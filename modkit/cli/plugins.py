"""``modkit plugins [--json]``: the loaded plugins, their distributions and versions, what each registers, and the
plugins skipped as broken with the reason."""

from __future__ import annotations

import argparse
import json

from .common import _registry
from .output import _fit_table, _out


def add_subcommands(sub) -> None:
    """Add ``plugins``."""
    p = sub.add_parser(
        "plugins", help="list installed plugins", description="Installed plugins and what each registers."
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_plugins)


def cmd_plugins(args: argparse.Namespace) -> int:
    """``modkit plugins``: loaded plugins, versions, what each registers; skipped plugins with the reason."""
    reg = _registry()
    plugins = reg.plugins()
    skipped = reg.skipped_plugins()
    if args.json:
        data = {
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.provider.distribution,
                    "version": p.provider.version,
                    "components": [f"{k}/{t}" for k, t in p.components],
                    "hf_converters": list(p.converters),
                }
                for p in plugins
            ],
            "skipped": skipped,
        }
        _out(json.dumps(data, indent=2))
        return 0
    rows = []
    for p in plugins:
        what = [f"{k}/{t}" for k, t in p.components] + [f"hf:{m}" for m in p.converters]
        dist = p.provider.distribution or "-"
        rows.append((p.name, dist, p.provider.version or "-", ", ".join(what) or "(nothing)"))
    if rows:
        for line in _fit_table(("PLUGIN", "PACKAGE", "VERSION", "REGISTERS"), rows):
            _out(line)
    else:
        _out("no plugins loaded")
    if skipped:
        _out("")
        _out("skipped (broken) plugins:")
        for name, reason in sorted(skipped.items()):
            _out(f"  {name}: {reason}")
        _out("set MODKIT_STRICT_PLUGINS=1 to make a broken plugin an error")
    return 0
