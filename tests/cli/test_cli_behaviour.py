"""One CLI behaviour across commands: an unknown flag is reported (with its close match) before a missing argument;
a flag of another command is named with it; every ``--device`` is checked the same way; ``show KIND`` lists the
types of KIND; a misspelt path gets its close matches; every ``--help`` runs without importing torch; training's
progress is plain lines when its stream is not a terminal.
"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

import modkit

from modkit.cli import main
from modkit.cli.errors import close_paths

from conftest import REPO

TINY = str(REPO / "specs" / "tiny-llama.json")


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_unknown_flag_is_reported_before_a_missing_argument(capsys):
    code, _, err = _run(capsys, "trace", TINY, "--txt", "hello")
    assert code == 2
    assert err.splitlines()[-1] == "modkit trace: error: unrecognized arguments: --txt; did you mean --text?"


def test_a_flag_of_another_command_is_named_and_the_flag_it_extends_suggested(capsys):
    code, _, err = _run(capsys, "train", "--lr-sweep", "1e-3")
    assert code == 2
    assert err.splitlines()[-1] == (
        "modkit train: error: unrecognized arguments: --lr-sweep 1e-3; did you mean --lr? "
        "(--lr-sweep is a flag of modkit compare)"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["build", TINY, "--device", "gpu"],
        ["trace", TINY, "--text", "hi", "--random-init", "--device", "gpu"],
        ["generate", TINY, "--prompt", "hi", "--device", "gpu"],
        ["check", "--type", "rmsnorm", "--device", "gpu"],
    ],
)
def test_every_device_flag_is_checked_alike(capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert (code, out) == (1, "")
    assert err == "modkit: error: invalid device 'gpu'; use cpu, meta, cuda or cuda:N (any torch device type works)\n"


def test_show_kind_lists_its_types(capsys):
    code, out, err = _run(capsys, "show", "mixer")
    assert code == 0
    types = sorted(line.split()[1] for line in out.splitlines()[1:])
    assert types == sorted(e.type for e in modkit.get_registry().components("mixer"))
    assert {"gated_deltanet", "mamba2", "parallel"} <= set(types)
    assert err == "modkit show mixer TYPE describes one of them\n"


def test_a_misspelt_path_gets_its_close_match(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    assert close_paths("specs/tiny-lama.json") == ["specs/tiny-llama.json"]
    assert close_paths("spec/tiny-lama.json") == ["specs/tiny-llama.json"]  # the folder misspelt too
    assert close_paths("specs/zzzz-qqqq.json") == []
    code, _, err = _run(capsys, "build", "specs/tiny-lama.json")
    assert (code, err) == (
        1,
        "modkit: error: specs/tiny-lama.json: no such file; did you mean specs/tiny-llama.json?\n",
    )


_HELP_RUNNER = """
import contextlib, io, os, sys
from modkit.cli import build_parser, iter_parsers, main
words = [w for w, _ in iter_parsers(build_parser(lazy=True))]
assert "torch" not in sys.modules, "building the parser imported torch"
for w in words:
    pid = os.fork()
    if pid == 0:  # a fresh copy of this torch-free process per command
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            code = main([*w, "--help"])
        ok = code == 0 and "usage: modkit" in out.getvalue() and "torch" not in sys.modules
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    print(" ".join(w) or "(modkit)", os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_help_runs_without_importing_torch():
    out = subprocess.run(
        [sys.executable, "-c", _HELP_RUNNER], capture_output=True, text=True, cwd=REPO, timeout=600, check=True
    ).stdout
    rows = dict(line.rsplit(" ", 1) for line in out.splitlines())
    assert len(rows) >= 25 and "generate" in rows and "train" in rows
    assert {k: v for k, v in rows.items() if v != "0"} == {}


def test_progress_is_plain_lines_off_a_terminal():
    from modkit.train.progress import _ProgressBar

    stream, notes = io.StringIO(), []
    with _ProgressBar(40, 0, enabled=True, echo=notes.append, stream=stream) as bar:
        for step in range(1, 41):
            bar.update(step, loss=2.0 - step / 100, lr=1e-3, tps=1000.0)
        bar.note("step 40: train 1.6000, val 1.7000")
    lines = stream.getvalue().splitlines()
    assert [line[:10] for line in lines] == [f"step {s:>2}/40" for s in range(2, 41, 2)]
    # the ETA is a wall-clock reading: only its label is checked
    assert lines[-1].startswith("step 40/40 loss 1.6000 lr 1.00e-03 recent 1,000 tok/s ETA ")
    assert "━" not in stream.getvalue() and notes == ["step 40: train 1.6000, val 1.7000"]


def test_a_progress_line_says_its_rate_is_recent_and_fits_80_columns():
    """The live tokens/s covers the steps since the last logged one (the run's mean is in the summary): it says so,
    and a long run's line with a GPU's rate still fits a terminal of 80 columns."""
    from modkit.train.progress import _ProgressBar

    stream = io.StringIO()
    with _ProgressBar(200_000, 0, enabled=True, echo=print, stream=stream) as bar:
        bar.update(200_000, loss=10.1234, lr=3e-4, tps=1_234_567.0)
    (line,) = stream.getvalue().splitlines()
    assert line.startswith("step 200000/200000 loss 10.1234 lr 3.00e-04 recent 1,234,567 tok/s ETA ")
    assert len(line) < 80
