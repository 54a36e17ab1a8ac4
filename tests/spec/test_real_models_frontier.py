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

DATA = Path(__file__).resolve().parents[1] / "data" / "real-models" / "frontier"
SPECS = Path(__file__).resolve().parents[2] / "specs"
EXPECTED = json.loads((DATA / "expected.json").read_text())

#: expected.json key -> shipped spec file
SPEC_FILES = {
    "pythia-160m": "pythia-160m.json",
    "pythia-6.9b": "pythia-6.9b.json",
    "qwen3-30b-a3b": "qwen3-30b-a3b.json",
    "deepseek-v3": "deepseek-v3.json",
    "deepseek-v3.2": "deepseek-v3.2.json",
    "gpt-oss-20b": "gpt-oss-20b.json",
    "gpt-oss-120b": "gpt-oss-120b.json",
    "llama-4-scout-17b-16e": "llama-4-scout-17b-16e.json",
    "nemotron-h-8b": "nemotron-h-8b.json",
}
MODELS = sorted(SPEC_FILES)

#: the RoPE keys of the published ``config.json`` files, which the frontier data leaves out (they do not change a
#: count); the shipped specs are converted with them, so that they also hold the models' positions (gpt-oss's
#: YaRN is transformers' default). deepseek-ai/DeepSeek-V3, Qwen/Qwen3-30B-A3B and meta-llama/Llama-4-Scout-17B-16E
#: (``text_config``) config.json
PUBLISHED = {
    "deepseek-v3": {
        "rope_theta": 10000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
    },
    "qwen3-30b-a3b": {"rope_theta": 1000000.0},
    "llama-4-scout-17b-16e": {
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
}


def _config(model: str, published: bool = False) -> dict:
    config = json.loads((DATA / model / "config.json").read_text())
    return {**config, **PUBLISHED.get(model, {})} if published else config


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
    assert (
        f"{EXPECTED[model]['total']:,}" in spec.description
    )  # the description states the number it was checked against


@pytest.mark.parametrize("model", MODELS)
def test_shipped_spec_is_the_converted_config(model):
    shipped = modkit.load_spec(SPECS / SPEC_FILES[model]).to_dict()
    converted = modkit.from_hf_config(_config(model, published=True)).to_dict()
    for d in (shipped, converted):
        d.pop("name"), d.pop("description")
    assert shipped == converted


def test_the_counts():
    assert EXPECTED["pythia-160m"]["total"] == 162_322_944
    assert EXPECTED["pythia-6.9b"]["total"] == 6_857_302_016
    assert EXPECTED["qwen3-30b-a3b"]["total"] == 30_532_122_624
    assert EXPECTED["deepseek-v3"]["total"] == 671_026_404_352
    # DeepSeek-V3 and, per layer, the indexer: wq_b 1536 x 64·128, wk 7168 x 128, k_norm 2·128, weights_proj 7168 x 64
    assert EXPECTED["deepseek-v3.2"]["total"] == 671_026_404_352 + 61 * (1536 * 8192 + 7168 * 128 + 256 + 7168 * 64)
    assert EXPECTED["gpt-oss-20b"]["total"] == 20_914_757_184
    assert EXPECTED["gpt-oss-120b"]["total"] == 116_829_156_672
    assert EXPECTED["llama-4-scout-17b-16e"]["total"] == 107_769_861_120
    assert EXPECTED["nemotron-h-8b"]["total"] == 8_100_852_736


#: active parameters per token (modkit.active_params_per_token: every parameter but the routed experts a token does
#: not use), with the arithmetic: layers x unused experts x one expert's parameters
ACTIVE = {
    "qwen3-30b-a3b": (48 * (128 - 8) * 3 * 2048 * 768, 3_353_032_704),
    "deepseek-v3": (58 * (256 - 8) * 3 * 7168 * 2048, 37_552_282_624),
    "deepseek-v3.2": (58 * (256 - 8) * 3 * 7168 * 2048, 38_403_807_488),
    # a gpt-oss expert: gate, up, down of 2880 x 2880 and their biases
    "gpt-oss-20b": (24 * (32 - 4) * (3 * 2880 * 2880 + 3 * 2880), 4_187_440_704),
    "gpt-oss-120b": (36 * (128 - 4) * (3 * 2880 * 2880 + 3 * 2880), 5_711_982_912),
    "llama-4-scout-17b-16e": (48 * (16 - 1) * 3 * 5120 * 8192, 17_172_894_720),
}


@pytest.mark.parametrize("model", sorted(ACTIVE))
def test_active_parameters_per_token(model):
    unused, active = ACTIVE[model]
    built = modkit.build(modkit.load_spec(SPECS / SPEC_FILES[model]), device="meta")
    assert modkit.active_params_per_token(built) == EXPECTED[model]["total"] - unused == active
    assert f"{active:,}" in modkit.load_spec(SPECS / SPEC_FILES[model]).description


def test_gpt_oss_published_figures():
    """OpenAI's model card (arXiv:2508.10925, Table 1) gives 20.91B / 116.83B total and 3.61B / 5.13B active
    parameters: its active count leaves out the token embedding (201,088 x 2880), which a token reads one row of."""
    embedding = 201_088 * 2880
    for model, total, active in (("gpt-oss-20b", 20.91e9, 3.61e9), ("gpt-oss-120b", 116.83e9, 5.13e9)):
        assert round(EXPECTED[model]["total"] / 1e7) == round(total / 1e7)
        assert round((ACTIVE[model][1] - embedding) / 1e7) == round(active / 1e7)


@pytest.mark.parametrize("model", ["pythia-160m", "gpt-oss-120b", "deepseek-v3.2", "nemotron-h-8b"])
def test_expected_is_transformers_count(model):
    """The recorded figure is what transformers builds from the config (checked here for the quick ones)."""
    assert _transformers_count(_config(model)) == EXPECTED[model]["total"]
