"""Shared fixtures: small specs built from dicts so tests never depend on files outside the repo."""

from __future__ import annotations

import copy
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# torch.compile's kernel cache lives in a folder of this test process alone (removed when it exits): a kernel
# compiled on another machine, or under another ATen CPU capability, and found in a shared cache crashed a test.
# Subprocesses the tests start inherit the variable, and with it the same folder.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import atexit
    import tempfile

    _INDUCTOR_CACHE = tempfile.mkdtemp(prefix="modkit-test-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE
    atexit.register(shutil.rmtree, _INDUCTOR_CACHE, ignore_errors=True)

# Under pytest-xdist (make test runs one worker per core) each worker gets an equal share of the cores for torch's
# intra-op threads: two workers of two threads each on two cores would fight over them and run slower than one.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

# Property-based tests (hypothesis). The default profile, "modkit", is derandomized: every run of every clone tries
# the same examples (a seed derived from each test), and no example database is kept, so a test's outcome never
# depends on a random draw or on what an earlier run stored. Exploring is opt-in, to find new cases:
#   MODKIT_HYPOTHESIS=explore .venv/bin/python -m pytest tests/spec/test_fuzz_properties.py   (or --hypothesis-profile explore)
# draws fresh random examples (2,000 per test), keeps failures in .hypothesis/ to replay them, and prints the seed
# (--hypothesis-seed N replays a run); a failure found that way becomes an explicit test. No deadline in either:
# the machine's load, not the code, decides how long one example takes.
_COMMON = dict(
    deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.register_profile("modkit", max_examples=150, derandomize=True, database=None, **_COMMON)
settings.register_profile("explore", max_examples=2000, derandomize=False, **_COMMON)
settings.register_profile("thorough", parent=settings.get_profile("explore"), max_examples=5000)
settings.load_profile(os.environ.get("MODKIT_HYPOTHESIS", "modkit"))


@pytest.fixture(autouse=True)
def _seeded_random_state():
    """Every test starts from the same random state (torch, Python's random, numpy), whatever ran before it in
    the process: a test that draws ``torch.randn`` without seeding gets the same numbers alone, in its file or in
    the whole suite."""
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


REPO = Path(__file__).resolve().parents[1]
#: seconds after which a subprocess a test starts is taken for hung: a guard against a hang, far beyond what any
#: load makes of the slowest one (a docs build or a pip install of a few minutes), so it never decides an outcome
HANG_TIMEOUT = 3600
SPECS = REPO / "specs"
DATA = Path(__file__).resolve().parent / "data"

TINY = {
    "schema_version": 1,
    "name": "test-tiny",
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 64},
        "norm": {"type": "rmsnorm", "eps": 1e-5},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm", "eps": 1e-5},
}


def tiny_spec(**changes) -> dict:
    """A deep copy of a tiny llama-like spec dict with top-level keys replaced and ``block__slot`` keys patched."""
    spec = copy.deepcopy(TINY)
    for key, value in changes.items():
        if key.startswith("block__"):
            spec["block"][key[len("block__") :]] = value
        else:
            spec[key] = value
    return spec


def registry_with(plugin_name: str, *components):
    """A fresh ``modkit.Registry`` holding the installed plugins plus one plugin ``plugin_name`` that registers
    ``components`` (``modkit.Component`` entries), the way a third-party package would."""
    import types

    import modkit

    reg = modkit.Registry()
    for info in modkit.get_registry().plugins():
        reg.register_plugin(info.obj, info.name)

    def register_components(register):
        for component in components:
            register(component)

    reg.register_plugin(types.SimpleNamespace(register_components=modkit.hookimpl(register_components)), plugin_name)
    return reg


@pytest.fixture
def tiny():
    """Factory fixture for :func:`tiny_spec`."""
    return tiny_spec


@pytest.fixture(autouse=True)
def _quiet_plugin_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        yield


def offline_build_possible() -> bool:
    """True when setuptools can build a wheel here without network (>= 70.1, or ``wheel`` installed);
    otherwise pip needs build isolation, which fetches setuptools from the index."""
    try:
        version = tuple(int(p) for p in md.version("setuptools").split(".")[:2])
    except (md.PackageNotFoundError, ValueError):
        return False
    if version >= (70, 1):
        return True
    try:
        md.version("wheel")
        return True
    except md.PackageNotFoundError:
        return False


def pip_install_copies(sources: list[Path], workdir: Path) -> tuple[Path, float, subprocess.CompletedProcess]:
    """Copy each package folder under ``workdir/src`` and pip-install the copies into ``workdir/site``.

    Installing into a target folder (seen through ``PYTHONPATH``, see :func:`env_with`) keeps the plugin out of the
    shared environment, so concurrent test runs never see it and nothing needs uninstalling.
    Returns ``(site folder, seconds, completed process)``.
    """
    copies = []
    for src in sources:
        dst = workdir / "src" / Path(src).name
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
        copies.append(str(dst))
    site = workdir / "site"
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "-q",
        "--disable-pip-version-check",
        "--target",
        str(site),
    ]
    if offline_build_possible():
        cmd += ["--no-build-isolation", "--no-index"]
    start = time.perf_counter()
    proc = subprocess.run(cmd + copies, capture_output=True, text=True, timeout=HANG_TIMEOUT)
    return site, time.perf_counter() - start, proc


def env_with(site: Path) -> dict:
    """The environment of a fresh process that sees the packages installed in ``site`` (debug/strict flags unset)."""
    env = {k: v for k, v in os.environ.items() if k not in {"MODKIT_DEBUG", "MODKIT_STRICT_PLUGINS"}}
    env["PYTHONPATH"] = os.pathsep.join([str(site)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env
