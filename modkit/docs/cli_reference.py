"""``reference/cli.md``: every ``modkit`` subcommand, walked from the argparse parser."""

from __future__ import annotations

import argparse

from .markdown import _cell, _table


def _argparse_sections(parser: argparse.ArgumentParser, words: list[str], depth: int) -> list[str]:
    out: list[str] = []
    title = " ".join(words)
    out += [f"{'#' * min(depth, 4)} `{title}`", ""]
    desc = parser.description or ""
    if desc:
        out += [_cell(desc), ""]
    usage = parser.format_usage().strip()
    if usage.startswith("usage: "):
        usage = usage[len("usage: ") :]
    out += ["```text", usage, "```", ""]
    rows, subs = [], None
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walker
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            subs = action
            continue
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        if action.option_strings:
            meta = ""
            if action.nargs != 0:
                meta = " " + (action.metavar or action.dest.upper())
            names = ", ".join(f"`{o}{meta}`" for o in action.option_strings)
        else:
            names = f"`{action.metavar or action.dest}`"
        default = ""
        if action.default not in (None, argparse.SUPPRESS, False) and action.nargs != 0:
            default = f"`{action.default}`"
        help_text = (action.help or "") if action.help != argparse.SUPPRESS else ""
        if action.required and action.option_strings:
            help_text = "(required) " + help_text
        rows.append(
            (
                names,
                default,
                _cell(help_text % {"default": action.default, "prog": parser.prog} if "%(" in help_text else help_text),
            )
        )
    if rows:
        out += [_table(("argument", "default", "meaning"), rows), ""]
    if parser.epilog:
        out += [_cell(parser.epilog), ""]
    if subs is not None:
        helps = {a.dest: a.help for a in subs._choices_actions}  # noqa: SLF001
        seen = set()
        for name, sub in subs.choices.items():
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            if not sub.description and helps.get(name):
                sub.description = helps[name]
            out += _argparse_sections(sub, words + [name], depth + 1)
    return out


def cli_reference_page() -> str:
    """Markdown of ``reference/cli.md``, walked from :func:`modkit.cli.build_parser` (extension commands too)."""
    from ..cli import build_parser

    parser = build_parser()
    parts = [
        "# Command line",
        "",
        "Generated from the `modkit` argument parser when the site was built, subcommands contributed by other "
        "modules included. Errors in the input print one message to stderr and exit with status 1, usage errors "
        "with 2; `MODKIT_DEBUG=1` shows tracebacks.",
        "",
    ]
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
    if sub is not None:
        helps = {a.dest: a.help for a in sub._choices_actions}  # noqa: SLF001
        parts += [
            _table(
                ("command", "what it does"),
                ((f"[`modkit {n}`](#modkit-{n})", _cell(helps.get(n, ""))) for n in sub.choices),
            ),
            "",
        ]
    parts += _argparse_sections(parser, ["modkit"], 2)
    return "\n".join(parts)
