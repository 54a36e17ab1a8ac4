"""Plugin isolation end to end: real ``python -m modkit`` processes discovering fake distributions.

Each scenario lays out distributions the way an installer would (``NAME-0.1.dist-info/`` with ``METADATA`` and
``entry_points.txt`` in the ``modkit`` group, next to the plugin module) in folders that are put on
``PYTHONPATH``, so ``importlib.metadata`` finds them exactly as it finds installed packages; no pip involved.

* a plugin whose import fails and one whose hook has a wrong signature are each skipped with exactly one
  warning naming them, while the built-ins still list (simonw/llm #1280);
* with ``MODKIT_STRICT_PLUGINS=1`` each makes the command fail with a message naming it and no traceback;
* the same distribution found twice on the path (as editable installs can produce) loads once;
* two distributions registering the same ``kind/type`` fail with one error naming both providers.

Every scenario is a separate interpreter (the registry is process-wide and loads entry points once); they run
concurrently because each start costs an import of torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import HANG_TIMEOUT

#: real processes discovering fake distributions: end to end, left out of make test-fast
pytestmark = pytest.mark.slow

GOOD_NORM = '''
"""A working plugin: one norm, ``{type}``."""
from typing import Literal

import torch
from torch import nn

import modkit


class Config(modkit.ComponentConfig):
    """Config of ``{type}``."""

    type: Literal["{type}"] = "{type}"


class Scale(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        return (x.float() * self.weight.float()).to(x.dtype)

    def init_weights(self, init):
        init.ones_(self.weight)


@modkit.hookimpl
def register_components(register):
    register(
        modkit.Component(
            kind="norm",
            type="{type}",
            config=Config,
            factory=lambda cfg, ctx: Scale(ctx.dim or ctx.d_model),
            description="per-channel scale (test plugin). [batch, seq, dim] -> [batch, seq, dim].",
        )
    )
'''

IMPORT_FAILS = '''
"""A plugin whose import fails."""
import modkit_isolation_no_such_module  # noqa: F401
'''

BAD_SIGNATURE = '''
"""A plugin whose hook implementation has the wrong argument name (pluggy rejects it)."""
import modkit


@modkit.hookimpl
def register_components(reg):
    raise AssertionError("never called")
'''


def make_dist(root: Path, dist: str, ep_name: str, module: str, source: str, version: str = "0.1") -> Path:
    """Write module ``module`` and a ``dist``-``version``.dist-info advertising ``ep_name = module`` under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[modkit]\n{ep_name} = {module}\n")
    return root


def _env(paths: list[Path], strict: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in {"MODKIT_DEBUG", "MODKIT_STRICT_PLUGINS", "PYTHONPATH"}}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    if strict:
        env["MODKIT_STRICT_PLUGINS"] = "1"
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Lay out every scenario, run all the ``python -m modkit`` commands concurrently, return their results."""
    tmp = tmp_path_factory.mktemp("plugin-isolation")
    broken = tmp / "broken"
    make_dist(
        broken, "modkit-isolation-importfail", "isolation-importfail", "modkit_isolation_importfail", IMPORT_FAILS
    )
    make_dist(broken, "modkit-isolation-badsig", "isolation-badsig", "modkit_isolation_badsig", BAD_SIGNATURE)
    only_importfail = make_dist(
        tmp / "only-importfail",
        "modkit-isolation-importfail",
        "isolation-importfail",
        "modkit_isolation_importfail",
        IMPORT_FAILS,
    )
    only_badsig = make_dist(
        tmp / "only-badsig", "modkit-isolation-badsig", "isolation-badsig", "modkit_isolation_badsig", BAD_SIGNATURE
    )
    good = GOOD_NORM.format(type="isolation-scale")
    copy_a = make_dist(tmp / "copy-a", "modkit-isolation-dup", "isolation-dup", "modkit_isolation_dup", good)
    copy_b = make_dist(tmp / "copy-b", "modkit-isolation-dup", "isolation-dup", "modkit_isolation_dup", good)
    clash = tmp / "clash"
    make_dist(
        clash, "modkit-isolation-one", "isolation-one", "modkit_isolation_one", GOOD_NORM.format(type="isolation-same")
    )
    make_dist(
        clash, "modkit-isolation-two", "isolation-two", "modkit_isolation_two", GOOD_NORM.format(type="isolation-same")
    )

    commands = {
        "broken-list": (["list"], [broken], False),
        "strict-importfail": (["list"], [only_importfail], True),
        "strict-badsig": (["list"], [only_badsig], True),
        "duplicate": (["plugins", "--json"], [copy_a, copy_b], False),
        "clash": (["list"], [clash], False),
    }
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "modkit", *argv],
            env=_env(paths, strict),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
        )
        for name, (argv, paths, strict) in commands.items()
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


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line.lower()]


def _table_types(stdout: str) -> list[tuple[str, str]]:
    return [tuple(line.split()[:2]) for line in stdout.splitlines()[1:] if line.strip()]


def test_broken_plugins_warn_once_each_and_builtins_still_load(runs):
    r = runs["broken-list"]
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    warnings = _warnings(r.stderr)
    for plugin, dist, why in (
        ("isolation-importfail", "modkit-isolation-importfail", "modkit_isolation_no_such_module"),
        ("isolation-badsig", "modkit-isolation-badsig", "reg"),
    ):
        mine = [w for w in warnings if plugin in w]
        assert len(mine) == 1, r.stderr
        assert dist in mine[0] and why in mine[0], mine[0]
    types = _table_types(r.stdout)
    assert ("norm", "rmsnorm") in types and ("attention", "gqa") in types


@pytest.mark.parametrize(
    "command, plugin, dist",
    [
        ("strict-importfail", "isolation-importfail", "modkit-isolation-importfail"),
        ("strict-badsig", "isolation-badsig", "modkit-isolation-badsig"),
    ],
)
def test_strict_mode_fails_naming_the_plugin(runs, command, plugin, dist):
    r = runs[command]
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    assert plugin in r.stderr and dist in r.stderr, r.stderr
    assert "MODKIT_STRICT_PLUGINS" in r.stderr
    assert r.stdout == ""


def test_same_distribution_twice_on_the_path_loads_once(runs):
    r = runs["duplicate"]
    assert r.returncode == 0, r.stderr
    assert not [w for w in _warnings(r.stderr) if "isolation-dup" in w], r.stderr  # no second attempt, no clash
    data = json.loads(r.stdout)
    mine = [p for p in data["plugins"] if p["name"] == "isolation-dup"]
    assert len(mine) == 1
    assert mine[0]["distribution"] == "modkit-isolation-dup" and mine[0]["components"] == ["norm/isolation-scale"]
    assert "isolation-dup" not in data["skipped"]


def test_two_providers_of_one_type_fail_naming_both(runs):
    r = runs["clash"]
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if "norm/isolation-same" in line]
    assert len(errors) == 1, r.stderr
    for name in ("isolation-one", "modkit-isolation-one", "isolation-two", "modkit-isolation-two"):
        assert name in errors[0], errors[0]
    assert r.stdout == ""
