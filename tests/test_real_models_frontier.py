"""Frontier models: conversion and shipped specs reproduce transformers' own parameter counts exactly.

``tests/data/real-models/frontier`` holds, per model, the keys of the published ``config.json`` that shape the
network and ``expected.json`` (transformers' own count, built on the meta device from that config, tied weights
once). Both ``modkit.from_hf_config(config)`` and the reviewed spec in ``specs/`` must give that count, and the
shipped spec must stay what the converter makes of the config (apart from its name and description). The small
ones are also counted here with transformers itself, on the meta device.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

import modkit

DATA = Path(__file__).resolve().parent / "data" / "real-models" / "frontier"
SPECS = Path(__file__).resolve().parents[1] / "specs"
EXPECTED = json.loads((DATA / "expected.json").read_text())

#: expected.json key -> shipped spec file
SPEC_FILES = {
    "pythia-160m": "pythia-160m.json",
    "pythia-6.9b": "pythia-6.9b.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
}
MODELS = sorted(SPEC_FILES)


def _config(model: str) -> dict:
    return json.loads((DATA / model / "config.json").read_text())


def _transformers_count(config: dict) -> int:
    """transformers' own count: ``AutoModelForCausalLM.from_config`` on the meta device, tied weights once."""
    transformers = pytest.importorskip("transformers")
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(**config)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def test_every_model_with_a_shipped_spec_has_a_config_and_a_count():
    for model, fname in SPEC_FILES.items():
        assert (SPECS / fname).is_file(), fname
        assert (DATA / model / "config.json").is_file(), model
        assert model in EXPECTED, model


@pytest.mark.parametrize("model", MODELS)
def test_converted_config_has_transformers_count(model):
    assert modkit.count_params(modkit.from_hf_config(_config(model))) == EXPECTED[model]["total"]


@pytest.mark.parametrize("model", MODELS)
def test_shipped_spec_has_transformers_count(model):
    spec = modkit.load_spec(SPECS / SPEC_FILES[model])
    assert modkit.count_params(spec) == EXPECTED[model]["total"]
    assert f"{EXPECTED[model]['total']:,}" in spec.description  # the description states the number it was checked against


@pytest.mark.parametrize("model", MODELS)
def test_shipped_spec_is_the_converted_config(model):
    shipped = modkit.load_spec(SPECS / SPEC_FILES[model]).to_dict()
    converted = modkit.from_hf_config(_config(model)).to_dict()
    for d in (shipped, converted):
        d.pop("name"), d.pop("description")
    assert shipped == converted


def test_the_counts():
    assert EXPECTED["pythia-160m"]["total"] == 162_322_944
    assert EXPECTED["pythia-6.9b"]["total"] == 6_857_302_016
    assert EXPECTED["qwen3-30b-a3b"]["total"] == 30_532_122_624


def test_qwen3_moe_active_parameters_per_token():
    """Of 128 experts a token uses 8: 48 layers x 120 unused experts x 3 x 2048 x 768 fewer than the total."""
    model = modkit.build(modkit.load_spec(SPECS / "qwen3-30b-a3b.json"), device="meta")
    assert modkit.active_params_per_token(model) == 30_532_122_624 - 48 * 120 * 3 * 2048 * 768 == 3_353_032_704


@pytest.mark.parametrize("model", ["pythia-160m"])
def test_expected_is_transformers_count(model):
    """The recorded figure is what transformers builds from the config (checked here for the quick ones)."""
    assert _transformers_count(_config(model)) == EXPECTED[model]["total"]
