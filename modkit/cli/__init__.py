"""The ``modkit`` command line.

Every command lives in a module of :data:`COMMAND_MODULES` (one ordered tuple of module names, the order of
``modkit --help``) that exposes ``add_subcommands(subparsers)``; :func:`build_parser` imports each one the same way
and lets it add its subcommands. A subpackage of modkit with a command of its own (``modkit.train``,
``modkit.data``, ``modkit.evaluation``, ``modkit.docs``, ``modkit.testing``) defines it in its ``cli`` module,
beside the code it drives; every other command is a module of this package. Adding a command means writing such a
module and naming it in :data:`COMMAND_MODULES`, nothing else. Which module holds which command (checked against
:func:`build_parser` by ``tests/cli/test_cli_usage.py``; ``modkit --help`` has the one-line help of each, ``modkit
COMMAND --help`` its flags, and the generated CLI reference of the docs all of them)::

    list, show        modkit.cli.list_show      registered components; one component's fields and capabilities
    plugins           modkit.cli.plugins        installed plugins, what each registers, skipped ones and why
    validate, schema  modkit.cli.validate       spec problems, one per line; JSON Schema of specs or training configs
    convert           modkit.cli.convert        Hugging Face config / checkpoint <-> modkit spec / checkpoint
    build             modkit.cli.build          components, parameter table, bytes, one forward pass
    generate          modkit.cli.generate       stream a continuation, then prefill ms and decode tokens/s
    check             modkit.testing.cli        the contract checks on registered components
    new               modkit.cli.new            a new plugin package (templates: :mod:`modkit.cli.scaffold`)
    docs              modkit.docs.cli           build or serve the documentation site
    train             modkit.train.cli          train a model on text
    data              modkit.data.cli           prepare token data for training
    eval              modkit.evaluation.cli     loss, perplexity, bits per byte; lm-eval tasks
    cost              modkit.cli.cost           FLOPs by part, cache bytes, memory, roofline latency
    plan              modkit.cli.plan           parallel layouts that fit N GPUs, ranked by step time
    trace             modkit.cli.trace          a text's journey through the model, per-layer readings
    compare           modkit.cli.compare        several specs under one recipe, one report (ladders too)
    coordcheck        modkit.cli.coordcheck     activation sizes after a few steps across widths, SP vs muP

Shared pieces: ``output.py`` (stdout / stderr lines, tables, counts, byte sizes), ``errors.py`` (:class:`UserError`
and :func:`_report`, the one-line error messages), ``common.py`` (the registry, a spec path, a device).

Every handler is ``func(args) -> int``. User errors print one clear message to stderr and exit 1 (argparse usage
errors exit 2); ``MODKIT_DEBUG=1`` re-raises instead, for a traceback.

Start-up stays light: no command module imports torch (or loads the plugins) before its handler runs, so
``modkit --help``, ``modkit --version`` and a usage error take a fraction of a second. A parser whose arguments
need the registry (``generate``'s sampling flags) defers them with :meth:`_Parser.defer` until that subcommand is
parsed; :func:`build_parser` adds them all at once, for the generated CLI reference.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import warnings
from typing import Callable, Optional, Sequence

# re-exported: command modules (cli.cost, docs, train.cli, ...) import these helpers from modkit.cli
from .common import _check_device, _registry, _spec_path, _sync  # noqa: F401
from .errors import PROG, UserError, _report
from .output import (
    _bytes,
    _count,
    _debug,
    _err,
    _fit_table,
    _one_line,
    _out,
    _short_count,  # noqa: F401
    _spec_error_lines,
    _table,
)

#: The modules that define the commands, in the order of ``modkit --help``; each has ``add_subcommands(subparsers)``
#: and imports torch (and loads plugins) only inside its handlers, so assembling the parser stays light.
COMMAND_MODULES = (
    "modkit.cli.list_show",
    "modkit.cli.plugins",
    "modkit.cli.validate",
    "modkit.cli.convert",
    "modkit.cli.build",
    "modkit.cli.generate",
    "modkit.testing.cli",
    "modkit.cli.new",
    "modkit.docs.cli",
    "modkit.train.cli",
    "modkit.data.cli",
    "modkit.evaluation.cli",
    "modkit.cli.cost",
    "modkit.cli.plan",
    "modkit.cli.trace",
    "modkit.cli.compare",
    "modkit.cli.coordcheck",
)

__all__ = ["COMMAND_MODULES", "EXTENSION_MODULES", "PROG", "UserError", "build_parser", "main"]


def __getattr__(name: str):
    """``EXTENSION_MODULES``: the old name of :data:`COMMAND_MODULES` (a :class:`DeprecationWarning`); a command
    module of this package by its short name (``modkit.cli.list_show``), imported on first use.

    Raises:
        AttributeError: ``name`` is neither.
    """
    if name == "EXTENSION_MODULES":
        warnings.warn(
            "modkit.cli.EXTENSION_MODULES is deprecated: every command module is in modkit.cli.COMMAND_MODULES",
            DeprecationWarning,
            stacklevel=2,
        )
        return COMMAND_MODULES
    if f"{__name__}.{name}" in COMMAND_MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors come from the subcommand they belong to (exit status 2), with close
    matches, and whose costly arguments can wait until the parser is used (:meth:`defer`).

    * No flag is matched by a prefix (``allow_abbrev`` is always off): ``--lr`` is not ``--lr-sweep``, and
      ``--seed`` is not ``--seeds``. A flag of its own that starts another one (``--lr`` beside ``--lr-sweep``)
      would otherwise change what an existing command line means.
    * An unknown flag is reported by the innermost subcommand on the command line, with its usage and the flags
      it meant (:func:`unknown_arguments_message`): ``modkit build spec.json --devices meta`` answers with the
      usage of ``modkit build`` and "did you mean --device?". The same holds for every flag a module adds,
      generated ones included (``modkit train``'s training-config fields).
    * An invalid choice (a subcommand name, a ``choices`` value) names the closest valid one.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._deferred: list[tuple[Callable, Optional[Callable]]] = []

    def parse_args(self, args=None, namespace=None):  # noqa: D102 - unknown arguments: the subcommand's error
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = chosen_parser(self, namespace)
            parser.error(unknown_arguments_message(parser, extras, root=self))
        return namespace

    def error(self, message):  # noqa: D102 - an unknown flag is the first thing to report, before missing ones
        if message.startswith(("the following arguments are required", "one of the arguments")):
            known = set(_option_strings(self))
            words = getattr(self, "_words", [])
            words = words[: words.index("--")] if "--" in words else words
            unknown = [w for w in words if _looks_like_flag(w) and w.split("=", 1)[0] not in known]
            if unknown:
                message = unknown_arguments_message(self, unknown, root=_ROOT[0] if _ROOT else None)
        super().error(message)

    def _check_value(self, action, value):  # noqa: D102 - add the closest valid choice to argparse's message
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            hint = _close_choice(action, value)
            if hint and "did you mean" not in str(exc) and "maybe you meant" not in str(exc):
                raise argparse.ArgumentError(action, f"{exc.message}; did you mean {hint!r}?") from None
            raise

    def defer(
        self,
        configure: Callable[[argparse.ArgumentParser], None],
        light: Optional[Callable[[argparse.ArgumentParser], None]] = None,
    ) -> None:
        """Call ``configure(self)`` before this parser first parses or prints its help (not when only its name and
        one-line help are listed by the parent's ``--help``). ``light(self)``, when given, stands in for it when
        the command line only asks for ``--help``: it adds the same flags without what is costly (the registry,
        torch), and says where the rest are listed."""
        self._deferred.append((configure, light))

    def configure(self, *, light: bool = False) -> None:
        """Run the deferred ``configure`` calls now (once each; their ``light`` stand-ins with ``light``)."""
        while self._deferred:
            full, stand_in = self._deferred.pop(0)
            (stand_in if light and stand_in is not None else full)(self)

    def parse_known_args(self, args=None, namespace=None):  # the subparsers action calls this on the chosen one
        self._words = [str(a) for a in (sys.argv[1:] if args is None else args)]
        words = self._words[: self._words.index("--")] if "--" in self._words else self._words
        self.configure(light=any(w in ("-h", "--help") for w in words))
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self.configure()
        return super().format_help()

    def format_usage(self) -> str:
        self.configure()
        return super().format_usage()


#: the root parser of the last :func:`build_parser` (a subcommand's error names the other commands that have a flag)
_ROOT: list[argparse.ArgumentParser] = []


def _looks_like_flag(word: str) -> bool:
    """``--txt`` or ``-x``, not ``-`` (stdin) nor a negative number (``-1``, ``-.5``)."""
    return word.startswith("-") and len(word) > 1 and not word[1:2].isdigit() and word[1:2] != "."


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [o for action in parser._actions for o in action.option_strings]  # noqa: SLF001


def close_flags(parser: argparse.ArgumentParser, word: str, n: int = 3) -> list[str]:
    """The flags of ``parser`` that an unknown flag ``word`` (``--devices``, ``--ctx=8``) probably meant.

    First those it is a prefix of (what argparse's abbreviation matching used to pick silently: ``--lr`` ->
    ``--lr-sweep``), when there are none, those it extends by a hyphenated word (``--lr-sweep`` -> ``--lr``), then the close spellings (:class:`difflib.SequenceMatcher` ratio at least 0.6 and within 0.1
    of the best one: ``--devices`` -> ``--device``, ``--ctx`` -> ``--context``, ``--strict`` -> ``--no-strict``);
    at most ``n``, never ``--help``.
    """
    import difflib

    word = word.split("=", 1)[0]
    options = [
        o for o in _option_strings(parser) if o not in ("-h", "--help") and (o.startswith("--") or len(word) <= 2)
    ]
    found = [o for o in options if len(word) > 2 and o.startswith(word) and o != word]
    found = found or [o for o in options if len(o) > 2 and word.startswith(o + "-")]
    ratios = sorted(((difflib.SequenceMatcher(None, word, o).ratio(), o) for o in options), reverse=True)
    floor = max(0.75 if found else 0.6, ratios[0][0] - 0.1) if ratios else 1.0
    found += [o for r, o in ratios if r >= floor]
    return list(dict.fromkeys(found))[:n]


def unknown_arguments_message(
    parser: argparse.ArgumentParser, extras: Sequence[str], root: Optional[argparse.ArgumentParser] = None
) -> str:
    """``unrecognized arguments: --devices meta; did you mean --device?`` for the arguments ``parser`` did not
    know (one "did you mean" per unknown flag that has close matches, naming the flag when there are several);
    with the ``root`` parser, a flag another command has is named with it (``--lr-sweep is a flag of modkit
    compare``)."""
    flags = [a.split("=", 1)[0] for a in extras if _looks_like_flag(a)]
    hints = [(flag, close_flags(parser, flag)) for flag in dict.fromkeys(flags)]
    hints = [(flag, found) for flag, found in hints if found]
    msg = f"unrecognized arguments: {' '.join(extras)}"
    for flag, found in hints:
        meant = " or ".join(found)
        msg += f"; {flag}: did you mean {meant}?" if len(hints) > 1 else f"; did you mean {meant}?"
    for flag in dict.fromkeys(flags) if root is not None else ():
        others = [
            " ".join((PROG, *words))
            for words, p in iter_parsers(root)
            if p is not parser and flag in _option_strings(p)
        ]
        if others:
            msg += f" ({flag} is a flag of {', '.join(others[:3])})"
    return msg


def _close_choice(action: argparse.Action, value) -> Optional[str]:
    import difflib

    if action.choices is None or not isinstance(value, str):
        return None
    found = difflib.get_close_matches(value, [str(c) for c in action.choices], n=1, cutoff=0.6)
    return found[0] if found else None


def chosen_parser(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand parser that ``namespace`` (a parse by ``parser``) went through: ``modkit docs build``
    -> the parser of ``docs build``. Follows each subparsers action's ``dest``; ``parser`` itself without one."""
    while True:
        action = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)  # noqa: SLF001
        name = (
            getattr(namespace, action.dest, None) if action is not None and action.dest != argparse.SUPPRESS else None
        )
        sub = action._name_parser_map.get(name) if action is not None and isinstance(name, str) else None  # noqa: SLF001
        if sub is None:
            return parser
        parser = sub


def iter_parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()):
    """``(words, parser)`` for ``parser`` and every subcommand parser below it (``("docs", "build")``, ...), each
    once (aliases skipped)."""
    yield words, parser
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from iter_parsers(sub, (*words, name))


def _no_abbreviations(parser: argparse.ArgumentParser) -> None:
    """Switch off prefix matching in ``parser`` and every parser below it, whatever class a module gave them."""
    for _, p in iter_parsers(parser):
        p.allow_abbrev = False


def _configure_all(parser: argparse.ArgumentParser) -> None:
    """Run every deferred configuration of ``parser`` and its subparsers, recursively."""
    if isinstance(parser, _Parser):
        parser.configure()
    for action in parser._actions:  # noqa: SLF001 - argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for sub in dict.fromkeys(action.choices.values()):
                _configure_all(sub)


def build_parser(*, lazy: bool = False) -> argparse.ArgumentParser:
    """The ``modkit`` argument parser: the subcommands of every module of :data:`COMMAND_MODULES`, in order.

    Args:
        lazy: leave the deferred arguments (those that need the registry) until a subcommand is parsed, as
            :func:`main` does; by default every argument is in place (for walking the parser, e.g. the docs).
    """
    from modkit import __version__

    parser = _Parser(
        prog=PROG,
        description="Compose decoder-only Transformers from registry components declared in JSON specs.",
        epilog="Set MODKIT_DEBUG=1 for tracebacks, MODKIT_STRICT_PLUGINS=1 to make a broken plugin an error.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_commands(sub)
    _no_abbreviations(parser)
    _ROOT[:] = [parser]
    if not lazy:
        _configure_all(parser)
    return parser


def _add_commands(subparsers) -> None:
    """Import every module of :data:`COMMAND_MODULES` and add its subcommands (``add_subcommands(subparsers)``).

    Every one of them imports with the base install, so a failure to import is a broken install or a bug, and it
    is an error of every command (:class:`UserError` naming the module and the cause), never a command that
    silently disappears (argparse would then answer ``invalid choice``). The one exception is a package of an
    optional extra (:func:`optional_extra`): its commands are skipped with a warning naming the extra and the
    command that installs it.

    Raises:
        UserError: a built-in command module failed to import for another reason than a missing optional extra.
    """
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported with the module's name
            if _debug():
                raise
            missing = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
            extra = optional_extra(missing) if missing else None
            if extra is None:
                raise UserError(
                    f"the built-in command module {name} failed to import ({type(exc).__name__}: {exc}); its "
                    "commands cannot run. This is a broken install or a bug in modkit: reinstall (make setup, or "
                    "pip install -e .) and rerun with MODKIT_DEBUG=1 for the traceback"
                ) from exc
            _err(
                f"{PROG}: warning: the commands of {name} are unavailable: they need {missing!r} from the "
                f"optional extra {extra!r} (pip install 'modkit-lm[{extra}]')"
            )
            continue
        module.add_subcommands(subparsers)


def optional_extra(module: str) -> Optional[str]:
    """The optional extra of the ``modkit-lm`` distribution (``data``, ``eval``, ``docs``, ...) that provides the
    importable ``module`` (``lm_eval``, ``pyarrow.parquet``), read from the installed distribution's own metadata;
    None when no extra lists it (a base dependency, modkit itself, or an unknown package)."""
    import importlib.metadata as md
    import re

    top = module.split(".")[0]
    try:
        dists = {d.lower().replace("_", "-") for d in md.packages_distributions().get(top, [top])}
        requires = md.requires("modkit-lm") or []
    except md.PackageNotFoundError:
        return None
    for req in requires:
        found = re.match(r"\s*([A-Za-z0-9_.\-]+).*;\s*extra\s*==\s*[\"']([^\"']+)[\"']", req)
        if found and found.group(1).lower().replace("_", "-") in dists and found.group(2) != "test":
            return found.group(2)
    return None


@contextlib.contextmanager
def _plugin_warnings_to_stderr():
    """Show modkit's plugin, spec and parameter-role warnings as one ``modkit: warning: ...`` line on stderr (never on
    stdout)."""
    from modkit.core.errors import SpecWarning

    with warnings.catch_warnings():
        default = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if category.__name__ in ("PluginWarning", "RoleWarning") or issubclass(category, SpecWarning):
                _err(f"{PROG}: warning: {message}")
            else:
                default(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status (0 ok, 1 error, 2 usage error)."""
    with _plugin_warnings_to_stderr():
        try:
            parser = build_parser(lazy=True)
            if argv is None:
                argv = sys.argv[1:]
            if not argv:
                parser.print_help(sys.stderr)
                return 2
            try:
                args = parser.parse_args(argv)
            except SystemExit as exc:  # --help, --version, usage errors
                return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            func: Callable[[argparse.Namespace], int] = args.func
            device = getattr(args, "device", None)
            if isinstance(device, str) and device != "auto":  # every --device checked alike, before any work
                _check_device(device)
            return int(func(args) or 0)
        except KeyboardInterrupt:
            _err(f"{PROG}: interrupted")
            return 130
        except BrokenPipeError:  # `modkit list | head`: the reader left; exit quietly like other Unix tools
            try:
                sys.stdout = open(os.devnull, "w")
            except OSError:
                pass
            return 0
        except Exception as exc:  # noqa: BLE001
            if _debug():
                raise
            return _report(exc, list(argv) if argv else None)
