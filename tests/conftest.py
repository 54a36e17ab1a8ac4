"""Shared fixtures: small specs built from dicts so tests never depend on files outside the repo."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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


@pytest.fixture
def tiny():
    """Factory fixture for :func:`tiny_spec`."""
    return tiny_spec


@pytest.fixture(autouse=True)
def _quiet_plugin_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)
        yield
