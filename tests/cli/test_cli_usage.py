"""Usage errors of every ``modkit`` command: no flag matched by a prefix, and an unknown flag answered by the
subcommand it was given to, with its usage and the flags it probably meant.

The parser tree is walked, so a command or flag added later (a command module's, ``modkit train``'s generated
training-config flags) is covered without a list kept here. Nothing here runs a handler: every case fails while
parsing, before torch or the plugins are loaded.
"""

from __future__ import annotations

import argparse

import pytest

from modkit import cli
from modkit.cli import build_parser, close_flags, iter_parsers


def _leaves() -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``(words, parser)`` of every subcommand that runs a handler (``("docs", "build")``, ...)."""
    return [
        (w, p)
        for w, p in iter_parsers(build_parser())
        if w and not any(isinstance(a, argparse._SubParsersAction) for a in p._actions)
    ]


def _matches(parser: argparse.ArgumentParser, token: str) -> list[argparse.Action]:
    """The actions argparse would bind ``token`` to (its own optional-argument lookup; tuple or list of tuples
    depending on the Python version)."""
    found = parser._parse_optional(token)
    items = found if isinstance(found, list) else [found] if isinstance(found, tuple) else []
    return [t[0] for t in items if t and t[0] is not None]


def _minimal_argv(parser: argparse.ArgumentParser) -> list[str]:
    """Arguments that satisfy ``parser``'s required positionals, options and groups (never run: the test adds an
    unknown flag, and the error comes first)."""
    argv: list[str] = []
    for group in parser._mutually_exclusive_groups:
        if group.required:
            action = group._group_actions[0]
            argv += [action.option_strings[-1]] + ([] if action.nargs == 0 else ["1"])
    grouped = {a for g in parser._mutually_exclusive_groups for a in g._group_actions}
    for action in parser._actions:
        if action in grouped or isinstance(action, argparse._SubParsersAction):
            continue
        value = str(next(iter(action.choices))) if action.choices else "1"
        if not action.option_strings and action.nargs not in ("?", "*"):
            argv.append(value)
        elif action.option_strings and action.required:
            argv += [action.option_strings[-1]] + ([] if action.nargs == 0 else [value])
    return argv


def test_every_parser_refuses_abbreviations():
    leaves = _leaves()
    names = {" ".join(w) for w, _ in leaves}
    assert {"build", "cost", "train", "docs build", "compare", "trace", "generate", "convert hf", "new plugin"} <= names
    checked = 0
    for words, parser in iter_parsers(build_parser()):
        assert parser.allow_abbrev is False, f"modkit {' '.join(words)}: allow_abbrev is on"
        options = {o for a in parser._actions for o in a.option_strings}
        for option in options:
            if not option.startswith("--"):
                continue
            for end in range(3, len(option)):  # every proper prefix: --d, --de, --dev, ...
                prefix = option[:end]
                if prefix in options:
                    continue
                bound = _matches(parser, prefix)
                assert not bound, f"modkit {' '.join(words)}: {prefix} is taken as {bound[0].option_strings}"
                checked += 1
    assert checked > 500


def test_the_reported_prefix_cases_are_refused(capsys):
    # `compare --lr` ran as --lr-sweep and `--seed` as --seeds; --devices went to the top-level usage. compare now
    # takes every training field as a flag (--lr and --seed are flags of their own), so the prefixes are shorter
    code = cli.main(["compare", "a.json", "--train", "t.json", "--lr-sw", "1e-2", "--see", "5"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("usage: modkit compare ")
    assert "unrecognized arguments: --lr-sw 1e-2 --see 5" in err
    assert "--lr-sw: did you mean --lr-sweep?" in err and "--see: did you mean --seeds or --seed?" in err
    for argv, usage, hint in (
        (["build", "spec.json", "--devices", "meta"], "usage: modkit build ", "did you mean --device?"),
        (["cost", "spec.json", "--ctx", "8"], "usage: modkit cost ", "did you mean --context?"),
        (["cost", "spec.json", "--ctx=8"], "usage: modkit cost ", "did you mean --context?"),
        (["train", "--lrate", "1e-3"], "usage: modkit train ", "did you mean --lr?"),
        (["docs", "build", "--strict"], "usage: modkit docs build ", "did you mean --no-strict?"),
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(usage), (argv, err)
        assert (
            f"modkit {' '.join(usage.split()[2:])}: error: unrecognized arguments: {' '.join(argv[argv.index(next(a for a in argv if a.startswith('--'))) :])}; {hint}"
            in err
        ), err
        assert "usage: modkit [-h]" not in err


@pytest.mark.parametrize("words", [w for w, _ in _leaves()], ids=lambda w: " ".join(w))
def test_each_command_names_its_own_flag(words, capsys):
    """For every command: its longest flag misspelt (one letter doubled) gets that command's usage and the flag."""
    parser = dict(_leaves())[words]
    options = sorted(
        (o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"), key=len
    )
    flag = options[-1] if options else None  # `modkit validate` has none: its usage all the same, no hint
    typo = flag + flag[-1] if flag else "--zzzz"
    if flag:
        assert close_flags(parser, typo)[0] == flag
    code = cli.main([*words, *_minimal_argv(parser), typo])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"usage: modkit {' '.join(words)} "), err
    assert f"modkit {' '.join(words)}: error: unrecognized arguments: {typo}" in err
    assert (f"did you mean {flag}" in err) if flag else ("did you mean" not in err)


def test_unknown_subcommand_names_the_closest(capsys):
    assert cli.main(["bild"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bild'" in err and "did you mean 'build'?" in err
    assert cli.main(["docs", "biuld"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: modkit docs ") and "did you mean 'build'?" in err


def test_close_flags():
    p = argparse.ArgumentParser(prog="x")
    for flag in ("--device", "--dtype", "--lr-sweep", "--seeds", "--context", "--no-strict"):
        p.add_argument(flag)
    assert close_flags(p, "--devices") == ["--device"]
    assert close_flags(p, "--lr") == ["--lr-sweep"]
    assert close_flags(p, "--seed=3") == ["--seeds"]
    assert close_flags(p, "--ctx") == ["--context"]
    assert close_flags(p, "--strict") == ["--no-strict"]
    assert close_flags(p, "--zzzzzz") == []
    assert "--help" not in close_flags(p, "--hlp")


def test_benchmark_and_page_scripts_match_no_flag_by_prefix():
    """The scripts under benchmarks/ and docs/experiments/scripts/ parse like modkit itself: ``--seq`` is not taken
    for ``--seq-lens`` (argparse's ``allow_abbrev`` is off in every parser they build)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    scripts = sorted([*(root / "benchmarks").glob("*.py"), *(root / "docs" / "experiments" / "scripts").glob("*.py")])
    parsers = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "ArgumentParser":
                abbrev = [k.value for k in node.keywords if k.arg == "allow_abbrev"]
                parsers.append(
                    (path.name, len(abbrev) == 1 and isinstance(abbrev[0], ast.Constant) and abbrev[0].value is False)
                )
    assert len(parsers) >= 13
    assert [name for name, off in parsers if not off] == []


def _extension(tmp_path, monkeypatch, name: str, body: str) -> None:
    """Put a command module ``name`` (source ``body``) on the path and make it the CLI's last command module."""
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "COMMAND_MODULES", cli.COMMAND_MODULES + (name,))
    monkeypatch.delenv("MODKIT_DEBUG", raising=False)


def test_a_built_in_command_module_that_fails_to_import_is_an_error_naming_it(tmp_path, monkeypatch, capsys):
    """A broken command module stops every command with its name and cause (it used to vanish, and argparse said
    ``invalid choice``)."""
    _extension(tmp_path, monkeypatch, "mk_broken_cmd", "from modkit.cli import no_such_helper\n")
    assert cli.main(["coordcheck", "--help"]) == 1
    err = capsys.readouterr().err
    assert "the built-in command module mk_broken_cmd failed to import" in err
    assert "no_such_helper" in err and "invalid choice" not in err


def test_a_command_module_missing_an_optional_extra_is_skipped_naming_the_extra(tmp_path, monkeypatch, capsys):
    """Only a package of an optional extra may make a module's commands unavailable, and the warning names the
    extra and how to install it; every other command still runs."""
    _extension(tmp_path, monkeypatch, "mk_needs_eval", "raise ImportError('no lm_eval here', name='lm_eval')\n")
    assert cli.main(["coordcheck", "--help"]) == 0
    captured = capsys.readouterr()
    assert "usage: modkit coordcheck" in captured.out
    assert "optional extra 'eval' (pip install 'modkit-lm[eval]')" in captured.err


def _commands_by_module() -> list[tuple[str, list[str]]]:
    """``(module name, [the subcommands it adds])`` for every module of ``COMMAND_MODULES``, in order, each module's
    ``add_subcommands`` called on a fresh parser the way :func:`modkit.cli.build_parser` calls it."""
    import importlib

    sub = argparse.ArgumentParser().add_subparsers()
    found = []
    for name in cli.COMMAND_MODULES:
        before = set(sub.choices)
        importlib.import_module(name).add_subcommands(sub)
        found.append((name, [c for c in sub.choices if c not in before]))
    return found


def test_the_command_map_of_the_cli_docstring_is_the_parser():
    """The map in ``modkit.cli``'s docstring (which module holds which command) lists every subcommand of
    ``build_parser()``, in the order of ``modkit --help``, under the module that really adds it."""
    import re

    documented = []
    for line in cli.__doc__.splitlines():
        row = re.match(r"^    ([a-z][a-z0-9, -]*?)\s{2,}(modkit\.[a-z0-9_.]+)\s", line)
        if row:
            documented.append((row.group(2), [w.strip() for w in row.group(1).split(",")]))
    assert documented == _commands_by_module()
    parser = build_parser(lazy=True)
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(action.choices) == [c for _, commands in documented for c in commands]


def test_every_module_that_defines_commands_is_a_command_module():
    """One way to register a command: a module of modkit that defines ``add_subcommands`` is in
    ``COMMAND_MODULES`` (so it is imported, and reported when broken, like every other), and each adds one."""
    import ast
    from pathlib import Path

    root = Path(cli.__file__).resolve().parents[1]
    defining = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.FunctionDef) and n.name == "add_subcommands" for n in tree.body):
            parts = path.relative_to(root.parent).with_suffix("").parts
            defining.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert defining == set(cli.COMMAND_MODULES)
    assert len(set(cli.COMMAND_MODULES)) == len(cli.COMMAND_MODULES)
    assert all(commands for _, commands in _commands_by_module())


def test_extension_modules_is_a_deprecated_name_of_command_modules():
    with pytest.warns(DeprecationWarning, match="COMMAND_MODULES"):
        assert cli.EXTENSION_MODULES == cli.COMMAND_MODULES


def test_no_help_text_prints_a_doubled_percent_sign():
    """argparse %-formats help strings but prints descriptions as written: a ``%%`` in a description (``95%%``)
    reached the screen doubled. Every parser's full help, as printed, has no ``%%``; compare's says 95%."""
    seen = {}
    for words, parser in iter_parsers(build_parser()):
        text = parser.format_help()
        assert "%%" not in text, f"modkit {' '.join(words)} --help prints %%"
        seen[" ".join(words)] = text
    assert "a 95% confidence interval" in " ".join(seen["compare"].split())
