"""Hugging Face configs whose layer lists name no layer are refused, naming the key.

Before: a Llama 4 ``moe_layers: [99]`` on a 48-layer model gave a model with no mixture layer at all, and DeepSeek's
``first_k_dense_replace: -1`` was accepted (every layer a mixture, as 0 would say).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import modkit

FRONTIER = Path(__file__).resolve().parents[2] / "data" / "real-models" / "frontier"


def _config(name: str, **changes) -> dict:
    return {**json.loads((FRONTIER / name / "config.json").read_text()), **changes}


def _errors(cfg: dict) -> list[tuple[str, str]]:
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    return info.value.errors


def test_moe_layers_outside_the_model_are_refused_naming_the_key():
    cfg = _config("llama-4-scout-17b-16e", moe_layers=[1, 99, -1])
    assert _errors(cfg) == [
        ("moe_layers", "layers [-1, 99] outside 0..47 (num_hidden_layers = 48); list existing layers")
    ]


def test_moe_layers_inside_the_model_are_the_mixture_layers():
    spec = modkit.from_hf_config(_config("llama-4-scout-17b-16e", moe_layers=[0, 47]))
    assert [i for i in range(spec.n_layers) if spec.layer(i).ffn.type == "moe"] == [0, 47]


def test_a_negative_first_k_dense_replace_is_refused_naming_the_key():
    assert _errors(_config("deepseek-v3", first_k_dense_replace=-1)) == [
        ("first_k_dense_replace", "must be >= 0, got -1")
    ]
    spec = modkit.from_hf_config(_config("deepseek-v3", first_k_dense_replace=0))
    assert spec.layer(0).ffn.type == "moe"
