"""``modkit check``: run the contract suite from the command line.

::

    modkit check [--plugin NAME] [--kind K] [--type T] [--config JSON|FILE] [--check C] [--neighbour KIND=TYPE]
                 [--device D] [--distributed] [-v]

Prints a table component x check (``passed`` / ``FAILED`` / ``skip``) whose last column names the neighbours
the tiny models were filled with (modkit's built-ins, or those named with ``--neighbour``), then one line per
failed check with the measured values, and exits 1 if any check failed (0 otherwise). ``--distributed`` also runs ``shards`` (a
component's ``tp_plan`` trains like the single process under tensor parallelism, tp = 2, in 2 gloo processes on
the CPU: logits, gradients and one AdamW step: seconds, one session for all selected components); without it ``shards`` is reported skipped.
``--config`` checks one component with a config of its own instead of its example (``modkit check --kind attention
--type mla --config '{"type": "mla", "n_heads": 8, ...}'``, or a JSON file); the selection must then match exactly
one component. ``modkit.cli`` picks this module up through
``add_subcommands(subparsers)``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence, TextIO

CELL = {"passed": "passed", "failed": "FAILED", "skipped": "skip"}


def add_subcommands(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``check`` subcommand on ``modkit``'s subparsers; its handler is :func:`cmd_check`."""
    p = subparsers.add_parser(
        "check",
        help="run the contract checks on registered components",
        description="Run the modkit contract suite (shape/dtype, gradients, causality, cached decode, meta init, "
        "parameter count, compile, ...) on registered components and print a component x check table. "
        "Exits 1 naming each failed check. The 'shards' check (tensor parallelism, tp = 2, in 2 gloo processes on "
        "the CPU) is slow and runs only with --distributed.",
    )
    p.add_argument(
        "--plugin",
        action="append",
        metavar="NAME",
        help="only components of this plugin (entry-point or distribution name; repeatable; wildcards)",
    )
    p.add_argument(
        "--kind", action="append", metavar="KIND", help="only this kind, e.g. attention (repeatable; wildcards)"
    )
    p.add_argument("--type", action="append", metavar="TYPE", help="only this type, e.g. gqa (repeatable; wildcards)")
    p.add_argument(
        "--config",
        metavar="JSON|FILE",
        help="check the selected component (exactly one: give --kind and --type) with this config instead of its "
        'example: a JSON object, or a file holding one; its "type" may be left out',
    )
    p.add_argument("--check", action="append", metavar="CHECK", help="only this check, e.g. causality (repeatable)")
    p.add_argument(
        "--neighbour",
        action="append",
        metavar="KIND=TYPE",
        type=_neighbour,
        help="fill the KIND slot of the tiny models with this registered TYPE (its example config) instead of the "
        "built-in (repeatable); by default neighbours are modkit's built-ins only, so another installed plugin never "
        "changes a verdict",
    )
    p.add_argument("--device", default="cpu", help="device the tiny models run on (default cpu)")
    p.add_argument(
        "--distributed",
        action="store_true",
        help="also run 'shards': components with a non-empty tp_plan are sharded over 2 gloo processes on the CPU "
        "and their logits, gradients and one optimiser step compared with the single process (slow: seconds; "
        "skipped without this flag)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="also print every skip reason and passing detail")
    p.set_defaults(func=cmd_check)


def _neighbour(text: str) -> tuple[str, str]:
    """Parse ``KIND=TYPE`` (argparse type of ``--neighbour``)."""
    kind, sep, type_ = text.partition("=")
    if not sep or not kind or not type_:
        raise argparse.ArgumentTypeError(f"expected KIND=TYPE, e.g. attention=gqa; got {text!r}")
    return kind.strip(), type_.strip()


def _config_arg(text: str) -> dict:
    """The ``--config`` value: a JSON object given inline, or the path of a file holding one.

    Raises:
        ValueError: not JSON, not an object, or a file that cannot be read (the message says which).
    """
    import json
    from pathlib import Path

    source = "--config"
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--config {text!r} is neither a JSON object nor a file")
        source, text = str(path), path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a component config is a JSON object, got {type(data).__name__}")
    return data


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return [fmt(headers)] + [fmt(r) for r in rows]


def render(results: Sequence, *, verbose: bool = False) -> list[str]:
    """Lines of the report for ``results`` (:class:`~modkit.testing.CheckResult`): table, failures, summary."""
    from .checks import CHECK_NAMES

    components = list(dict.fromkeys(r.component for r in results))
    checks = [c for c in CHECK_NAMES if any(r.check == c for r in results)]
    cell = {(r.component, r.check): CELL[r.status] for r in results}
    neighbours = {r.component: r.neighbours for r in results if r.neighbours}
    rows = [[comp] + [cell.get((comp, c), "-") for c in checks] + [neighbours.get(comp, "-")] for comp in components]
    lines = _table(["component"] + checks + ["neighbours"], rows)
    failed = [r for r in results if r.status == "failed"]
    if verbose:
        lines.append("")
        for r in results:
            if r.status != "failed":
                lines.append(f"{CELL[r.status]:6s} {r.id}: {r.detail}")
    if failed:
        lines.append("")
        lines.append(f"{len(failed)} failed check(s):")
        for r in failed:
            lines.append(f"FAILED {r.id}: {r.detail}")
    n = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "skipped")}
    lines.append("")
    lines.append(f"{len(components)} component(s): {n['passed']} passed, {n['failed']} failed, {n['skipped']} skipped")
    return lines


def cmd_check(args: argparse.Namespace, *, out: Optional[TextIO] = None, registry=None) -> int:
    """Handler of ``modkit check``: run the selected checks, print the table, return 1 if any check failed.

    Raises:
        RegistryError: the selection matches no component (``modkit.cli`` prints it as an error, exit 1).
        ValueError: an unknown check name.
    """
    from .checks import check_component, run_checks, select_components

    stream = out or sys.stdout
    emit: Callable[[str], None] = lambda line: print(line, file=stream)  # noqa: E731
    options = dict(
        checks=args.check,
        device=args.device,
        distributed=getattr(args, "distributed", False),
        neighbours=dict(getattr(args, "neighbour", None) or []),
    )
    if getattr(args, "config", None) is not None:
        entries = select_components(registry, plugin=args.plugin, kind=args.kind, type=args.type)
        if len(entries) != 1:
            names = ", ".join(f"{e.kind}/{e.type}" for e in entries[:8]) + (", ..." if len(entries) > 8 else "")
            raise ValueError(
                f"--config checks one component, but the selection matches {len(entries)} ({names}); "
                "name it with --kind and --type"
            )
        entry = entries[0]
        config = {"type": entry.type, **_config_arg(args.config)}
        results = check_component(entry.kind, entry.type, config, registry=registry, **options)
    else:
        results = run_checks(registry, plugin=args.plugin, kind=args.kind, type=args.type, **options)
    for line in render(results, verbose=args.verbose):
        emit(line)
    failed = [r for r in results if r.status == "failed"]
    if failed:
        print(f"modkit check: {len(failed)} check(s) failed: {', '.join(r.id for r in failed)}", file=sys.stderr)
        return 1
    return 0
