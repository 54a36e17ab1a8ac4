"""The ``modkit`` command tells its own errors (which name the file, row or field) from foreign ones.

Before: the reporter printed the text of any ``ValueError`` as a tidy ``modkit: error: ...`` line, so raw Python and
library text (``Corrupt snappy compressed data.``, a lone surrogate's ``'utf-8' codec can't encode ...``, Python's
integer digit limit, ``embedded null byte``) read as if modkit had checked the input and had nothing to name. Now
such an error is marked as internal, with its type, what was being read, the command line and a request to report.
"""

from __future__ import annotations

import pytest

from modkit import cli
from modkit.cli.errors import is_own
from modkit.core.errors import DataError, reading

HINT = (
    "modkit: this error comes from Python or a library, not from modkit's checks, so it may name no file or field: a "
    "bug in modkit or a plugin. Please report it with the command above; rerun with MODKIT_DEBUG=1 for the traceback"
)


def _snappy(args):
    with reading("corpus.parquet (a Parquet file)"):
        raise ValueError("Corrupt snappy compressed data.")


def _surrogate(args):
    "\udc80".encode("utf-8")


def _digits(args):
    int("9" * 5000)


def _null_byte(args):
    open("a\x00b")


def _stderr(capsys, monkeypatch, command) -> list[str]:
    monkeypatch.setattr(cli.list_show, "cmd_list", command)
    assert cli.main(["list", "norm"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err.splitlines()


@pytest.mark.parametrize(
    "command, first",
    [
        (_snappy, "modkit: internal error: ValueError: Corrupt snappy compressed data."),
        (
            _surrogate,
            "modkit: internal error: UnicodeEncodeError: 'utf-8' codec can't encode character '\\udc80' in position 0: "
            "surrogates not allowed",
        ),
        (_digits, "modkit: internal error: ValueError: Exceeds the limit (4300 digits) for integer string conversion:"),
        (_null_byte, "modkit: internal error: ValueError: embedded null byte"),
    ],
    ids=["snappy", "surrogate", "digits", "null-byte"],
)
def test_a_foreign_error_is_marked_internal_with_its_type_the_command_and_a_hint(capsys, monkeypatch, command, first):
    lines = _stderr(capsys, monkeypatch, command)
    assert lines[0].startswith(first)
    assert lines[-2:] == ["modkit:   in: modkit list norm", HINT]
    assert not any(line.startswith("modkit: error:") for line in lines)


def test_a_foreign_error_says_what_was_being_read(capsys, monkeypatch):
    lines = _stderr(capsys, monkeypatch, _snappy)
    assert lines == [
        "modkit: internal error: ValueError: Corrupt snappy compressed data.",
        "modkit:   while reading corpus.parquet (a Parquet file)",
        "modkit:   in: modkit list norm",
        HINT,
    ]


def test_modkits_own_errors_stay_one_line_naming_what_they_are_about(capsys, monkeypatch):
    def own(args):
        with reading("data/train.jsonl"):  # a modkit error passes the note by: it names its file already
            raise DataError("data/train.jsonl, line 3: not a JSON object")

    assert _stderr(capsys, monkeypatch, own) == ["modkit: error: data/train.jsonl, line 3: not a JSON object"]


def test_a_value_error_raised_by_modkits_code_is_its_own_a_builtins_is_not():
    from modkit.experiments.stats import mean_difference

    with pytest.raises(ValueError) as info:
        mean_difference([], [1.0])
    assert is_own(info.value)
    with pytest.raises(ValueError) as info:
        _digits(None)
    assert not is_own(info.value)
    with pytest.raises(UnicodeEncodeError) as info:
        _surrogate(None)
    assert not is_own(info.value)
