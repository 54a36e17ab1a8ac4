"""Flagship hybrids of 2026: the shipped Kimi Linear and Qwen3.5 specs reproduce transformers' own parameter counts.

Each spec in ``specs/`` is what ``modkit.from_hf_config`` makes of a configuration written here (apart from its name
and description), and its parameter count is the one transformers builds on the meta device from the same
configuration (tied weights once), recorded here and recomputed with transformers when it is installed:

* ``kimi-linear-48b-a3b``: the keys of moonshotai/Kimi-Linear-48B-A3B-Instruct's ``config.json`` that shape the
  network. transformers' ``KimiLinearConfig`` names that checkpoint, and its class defaults are the same model except
  the layer pattern (latent attention on 0-indexed layers 4, 8, ..., 24 instead of the published 1-indexed
  ``full_attn_layers`` 4, 8, ..., 24, 27), so the published lists are used;
* ``qwen3.5-9b`` and ``qwen3.5-35b-a3b``: transformers' ``Qwen3_5TextConfig`` and ``Qwen3_5MoeTextConfig`` class
  defaults (the shapes of Qwen/Qwen3.5-9B's and Qwen/Qwen3.5-35B-A3B's language models) with the published RoPE
  theta and context, which change no count;
* ``lfm3-1.7b``: transformers' ``Lfm3Config`` class defaults, which its docstring calls the "LFM3-1.7B style
  configuration" (LiquidAI/LFM3-1.7B).
"""

from __future__ import annotations

import warnings

import pytest

import modkit
from modkit.analysis.cost import CostModel
from tests.conftest import SPECS

#: moonshotai/Kimi-Linear-48B-A3B-Instruct config.json, the keys that shape the network (1-indexed layer lists)
KIMI_LINEAR = {
    "model_type": "kimi_linear",
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "model_max_length": 1048576,
    "rms_norm_eps": 1e-05,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "linear_attn_config": {
        "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
        "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
        "num_heads": 32,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
    },
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_experts": 256,
    "num_experts_per_token": 8,
    "num_shared_experts": 1,
    "moe_intermediate_size": 1024,
    "first_k_dense_replace": 1,
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "num_expert_group": 1,
    "topk_group": 1,
}

#: the RoPE keys and context of the published Qwen3.5 configs (Qwen/Qwen3.5-9B, Qwen/Qwen3.5-35B-A3B text_config)
QWEN3_5_PUBLISHED = {
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "max_position_embeddings": 262144,
}

#: spec file -> (configuration, transformers 5.25's parameter count, the parameters a token does not use: layers x
#: experts it skips x one expert's parameters, the active count)
MODELS = {
    "kimi-linear-48b-a3b.json": (
        KIMI_LINEAR,
        49_122_675_072,
        26 * (256 - 8) * 3 * 2304 * 1024,
        3_484_453_248,
    ),
    "qwen3.5-9b.json": ({"model_type": "qwen3_5_text", **QWEN3_5_PUBLISHED}, 8_953_803_264, 0, 8_953_803_264),
    "qwen3.5-35b-a3b.json": (
        {"model_type": "qwen3_5_moe_text", **QWEN3_5_PUBLISHED},
        34_660_610_688,
        40 * (256 - 8) * 3 * 2048 * 512,
        3_454_988_928,
    ),
    "lfm3-1.7b.json": ({"model_type": "lfm3"}, 1_728_801_536, 0, 1_728_801_536),
}
NAMES = sorted(MODELS)

#: transformers' counts at the configuration classes' defaults (KimiLinearConfig's one attention layer fewer)
DEFAULTS = {"kimi_linear": 49_133_074_464, "qwen3_5_text": 8_953_803_264, "qwen3_5_moe_text": 34_660_610_688}
DEFAULTS["lfm3"] = 1_728_801_536


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


@pytest.mark.parametrize("name", NAMES)
def test_shipped_spec_is_the_converted_config(name):
    config, count, _, _ = MODELS[name]
    shipped = modkit.load_spec(SPECS / name)
    converted = modkit.from_hf_config(config)
    assert modkit.count_params(converted) == modkit.count_params(shipped) == count
    assert f"{count:,}" in shipped.description  # the description states the number it was checked against
    assert shipped.metadata["hf_model_type"] == config["model_type"]
    a, b = shipped.to_dict(), converted.to_dict()
    for d in (a, b):
        d.pop("name"), d.pop("description")
    assert a == b


@pytest.mark.parametrize("name", NAMES)
def test_count_is_transformers_own_on_meta(name):
    config, count, _, _ = MODELS[name]
    assert _transformers_count(config) == count


@pytest.mark.parametrize("model_type", sorted(DEFAULTS))
def test_class_defaults_count(model_type):
    """The configuration classes' defaults convert to transformers' count; Qwen3.5's are the shipped specs' shapes,
    Kimi Linear's differ from the published model by one attention layer (stated in the spec's description)."""
    count = DEFAULTS[model_type]
    assert modkit.count_params(modkit.from_hf_config({"model_type": model_type})) == count
    assert _transformers_count({"model_type": model_type}) == count
    if model_type == "kimi_linear":
        assert f"{count:,}" in modkit.load_spec(SPECS / "kimi-linear-48b-a3b.json").description


@pytest.mark.parametrize("name", NAMES)
def test_active_parameters_per_token(name):
    _, count, unused, active = MODELS[name]
    spec = modkit.load_spec(SPECS / name)
    assert modkit.active_params_per_token(modkit.build(spec, device="meta")) == count - unused == active
    if unused:
        assert f"{active:,}" in spec.description


def test_kimi_linear_cache_is_the_latent_per_token_and_the_delta_states_per_sequence():
    """``modkit cost`` reads the cache from the mixers' declarations: the 7 latent attention layers add their latent
    and shared rotated key per token (DeepSeek-V2 §2.1), the 20 Kimi Delta Attention layers hold a fixed-size state
    (``[32, 128, 128]`` float32) and the last 3 inputs of the convolutions over q, k, v (cache dtype) per sequence."""
    costs = CostModel(SPECS / "kimi-linear-48b-a3b.json")
    per_token = 7 * (512 + 64) * 2
    state = 20 * (32 * 128 * 128 * 4 + 3 * 32 * 128 * (4 - 1) * 2)
    assert costs.kv_cache_bytes_per_token("bfloat16") == per_token == 8_064
    assert costs.cache_state_bytes_per_sequence("bfloat16") == state == 43_417_600
    assert costs.kv_cache_bytes(1_048_576, 2, "bfloat16") == 2 * (1_048_576 * per_token + state)


@pytest.mark.parametrize(
    ("name", "attention_layers", "kv_heads"), [("qwen3.5-9b.json", 8, 4), ("qwen3.5-35b-a3b.json", 10, 2)]
)
def test_qwen3_5_cache_is_the_attention_keys_per_token_and_the_deltanet_states_per_sequence(
    name, attention_layers, kv_heads
):
    """Every fourth layer's keys and values (head_dim 256) grow with the context; the other layers' Gated DeltaNet
    holds a ``[32, 128, 128]`` float32 state and the last 3 inputs of its convolution over q, k (16 heads of 128) and
    v (32 heads of 128) per sequence."""
    costs = CostModel(SPECS / name)
    deltanet_layers = 4 * attention_layers - attention_layers
    assert costs.kv_cache_bytes_per_token("bfloat16") == attention_layers * 2 * kv_heads * 256 * 2
    state = deltanet_layers * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 3 * 2)
    assert costs.cache_state_bytes_per_sequence("bfloat16") == state


def test_kimi_linear_cost_command_states_the_latent_cache_and_the_fixed_state(capsys):
    """``modkit cost`` on Kimi Linear prints the latent attention's bytes per token and the delta layers' state."""
    from modkit.cli import main

    assert main(["cost", str(SPECS / "kimi-linear-48b-a3b.json")]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("KV cache:"))
    assert "8,064 bytes per token as the mixers declare" in line  # 7 x (512 + 64) x 2
    assert f"{43_417_600 / 2**20:.2f} MiB of fixed-size state per sequence" in line  # 41.41 MiB


def test_lfm3_cache_is_full_keys_per_token_a_window_of_sliding_keys_and_the_convolution_inputs():
    """LFM3-1.7B: the 6 full-attention layers keep keys and values (4 heads of 128) of every token, the 5 sliding
    layers at most their window of 256, the 13 short convolutions the last 6 inputs (d_model 2048) per sequence."""
    costs = CostModel(SPECS / "lfm3-1.7b.json")
    full, sliding, state = 6 * 2 * 4 * 128 * 2, 5 * 2 * 4 * 128 * 2, 13 * 2048 * (7 - 1) * 2
    assert costs.kv_cache_bytes_per_token("bfloat16") == full + sliding == 22_528
    assert costs.cache_state_bytes_per_sequence("bfloat16") == state == 319_488
    assert costs.kv_cache_bytes(4096, 1, "bfloat16") == 4096 * full + 256 * sliding + state == 53_272_576
