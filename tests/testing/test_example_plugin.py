"""The worked third-party plugin in ``docs/examples/modkit-extra`` as a user meets it: pip-installed, then used
from fresh interpreters, which discover entry points at start-up: ``python -m modkit check --plugin extra``, and
one interpreter running ``modkit list``, ``plugins --json``, ``show norm dyt`` and ``build SPEC --json`` through
``modkit.cli.main`` (one import of torch instead of four).

The package is copied to a temporary folder (so no build artefacts land in the repository) and installed there
with ``pip install --target`` (not editable, no dependencies, offline where the environment can build wheels
without network), and the commands run with that folder on ``PYTHONPATH``. Installing into a private target
instead of the shared environment keeps concurrent test runs and other processes from ever seeing the plugin,
and leaves nothing to uninstall if the run is killed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import HANG_TIMEOUT, env_with, pip_install_copies

#: pip-installs packages: end to end, left out of make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "modkit-extra"

#: A tiny Llama-like spec with every norm a DyT (a per-head QK-norm too: built at head_dim) and a squared-ReLU FFN.
SPEC = {
    "schema_version": 1,
    "name": "tiny-dyt-relu2",
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "dyt"}},
        "ffn": {"type": "relu2", "d_ff": 64},
        "norm": {"type": "dyt"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "dyt", "alpha_init": 0.8},
}


def pip_install(sources: list[Path], workdir: Path) -> tuple[Path, float]:
    """Install copies of ``sources`` into ``workdir/site`` (see :func:`tests.conftest.pip_install_copies`)."""
    site, seconds, proc = pip_install_copies(sources, workdir)
    assert proc.returncode == 0, f"pip install failed:\n{proc.stdout}\n{proc.stderr}"
    return site, seconds


#: Runs several ``modkit`` commands in one fresh interpreter (entry points are discovered at its start-up, as
#: for ``python -m modkit``), each through ``modkit.cli.main`` with its own captured stdout/stderr: one import of
#: torch instead of one per command.
#: An entry whose argv starts with "pytest" runs ``pytest.main`` on the rest instead.
DRIVER = """
import contextlib, io, json, sys
from modkit import cli
results = {}
for name, argv in json.loads(sys.argv[1]).items():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        if argv[0] == "pytest":
            import pytest
            code = int(pytest.main(argv[1:]))
        else:
            code = cli.main(argv)
    results[name] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


def run_all(commands: dict[str, list[str]], env: dict, cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run ``python ARGS`` for every entry concurrently (each start imports torch); results by name."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, *argv], env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, argv in commands.items()
    }
    results = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=HANG_TIMEOUT)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    return results


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Install modkit-extra once; run every command of this module against it (two fresh processes at once)."""
    work = tmp_path_factory.mktemp("modkit-extra")
    site, install_s = pip_install([EXAMPLE], work)
    (work / "spec.json").write_text(json.dumps(SPEC))
    cli_commands = {
        "list": ["list"],
        "plugins": ["plugins", "--json"],
        "show": ["show", "norm", "dyt"],
        "build": ["build", "spec.json", "--json"],
        # the example's own tests against the installed package; its contract tests repeat `modkit check` below
        "own-tests": [
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--capture=sys",
            "-k",
            "math or spec",
            str(work / "src" / EXAMPLE.name / "tests"),
        ],
    }
    start = time.perf_counter()
    procs = run_all(
        {"check": ["-m", "modkit", "check", "--plugin", "extra"], "driver": ["-c", DRIVER, json.dumps(cli_commands)]},
        env_with(site),
        work,
    )
    seconds = {"install": install_s, "commands": time.perf_counter() - start}
    driver = procs.pop("driver")
    assert driver.returncode == 0, driver.stderr
    results = {
        name: subprocess.CompletedProcess(["modkit", *cli_commands[name]], *r)
        for name, r in json.loads(driver.stdout).items()
    }
    results.update(procs)
    results["_seconds"] = seconds
    return site, results


def test_installed_where_expected(installed):
    site, _ = installed
    assert (site / "modkit_extra" / "dyt.py").is_file()
    assert list(site.glob("modkit_extra-0.1.0.dist-info"))
    assert not list(EXAMPLE.glob("*.egg-info")) and not (EXAMPLE / "build").exists()  # nothing built in the repo


def test_list_shows_both_components(installed):
    r = installed[1]["list"]
    assert r.returncode == 0, r.stderr
    rows = {tuple(line.split()[:3]) for line in r.stdout.splitlines()[1:]}
    assert ("norm", "dyt", "extra") in rows and ("ffn", "relu2", "extra") in rows
    assert ("norm", "rmsnorm", "builtin-norm") in rows  # the built-ins are still there


def test_plugins_names_the_distribution(installed):
    r = installed[1]["plugins"]
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    extra = [p for p in data["plugins"] if p["name"] == "extra"]
    assert extra == [
        {
            "name": "extra",
            "distribution": "modkit-extra",
            "version": "0.1.0",
            "components": ["norm/dyt", "ffn/relu2"],
            "hf_converters": [],
        }
    ]
    assert "extra" not in data["skipped"]


def test_show_describes_dyt(installed):
    r = installed[1]["show"]
    assert r.returncode == 0, r.stderr
    assert "provider: extra (modkit-extra 0.1.0)" in r.stdout
    assert "alpha_init" in r.stdout and "arXiv:2503.10622" in r.stdout


def test_spec_using_the_plugin_validates_builds_and_runs(installed):
    r = installed[1]["build"]
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    used = {(c["kind"], c["type"]): c for c in data["components"]}
    assert used[("norm", "dyt")]["plugin"] == "extra" and used[("ffn", "relu2")]["plugin"] == "extra"
    fw = data["forward"]
    assert fw["finite"] and fw["output_shape"] == [*fw["input_shape"], 64]


def test_example_own_tests_pass(installed):
    r = installed[1]["own-tests"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 passed" in r.stdout, r.stdout


def test_contract_kit_passes(installed):
    r = installed[1]["check"]
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dyt" in r.stdout and "relu2" in r.stdout


def test_timings_are_reported(installed, capsys):
    seconds = installed[1]["_seconds"]
    with capsys.disabled():
        print(
            f"\nmodkit-extra: pip install {seconds['install']:.1f}s; list, plugins, show, build, own tests + check (2 processes) {seconds['commands']:.1f}s"
        )


def test_guide_shows_the_example_verbatim():
    """Every code block of the plugin guide is a verbatim part of a file of the examples, or of a skeleton that
    ``modkit new plugin`` writes (the attention guide shows the attention skeleton's ``forward``)."""
    from modkit.cli import scaffold

    guide = (REPO / "docs" / "guides" / "writing-a-plugin.md").read_text()
    # the worked plugin package, and the guide's single-module examples beside it (docs/examples/latent_attention.py)
    files = {
        p: p.read_text()
        for p in EXAMPLE.parent.rglob("*")
        if p.suffix in {".py", ".toml", ".json"} and "__pycache__" not in p.parts
    }
    for kind in scaffold.KINDS:
        files.update({f"skeleton:{kind}:{rel}": text for rel, text in scaffold.plugin_files("my-plugin", kind).items()})
    blocks = re.findall(r"```(python|toml|json)\n(.*?)```", guide, re.S)
    assert len(blocks) >= 9
    for lang, body in blocks:
        lines = body.splitlines()
        if lang != "json" and lines and re.fullmatch(r"# [\w./-]+", lines[0]):  # a "# path" label line
            lines = lines[1:]
        text = "\n".join(lines)
        assert any(text in content for content in files.values()), (
            f"guide block not found in the example:\n{body[:300]}"
        )
