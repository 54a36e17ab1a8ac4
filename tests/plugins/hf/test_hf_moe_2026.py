"""The 2026 mixture-of-experts model types beyond the six checks of ``test_hf_types.py``: their flagship parameter
counts against transformers', Phi-3.5-MoE's LongRoPE (left out of the harness, whose RoPE must not depend on the
sequence's length), and what each type reads from keys no tiny fixture exercises (legacy keys, refused values,
nested DBRX keys, layer patterns)."""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit

transformers = pytest.importorskip("transformers")

from test_hf_parity import _quiet, make_hf  # noqa: E402

#: transformers' trainable parameter counts at the configuration classes' defaults, built on meta
#: (``AutoModelForCausalLM.from_config``), transformers 5.25, with the keys the defaults need to build or run: GLM-4.5's
#: head_dim (4096 // 96 = 42 rotates an odd 21 features), dots.llm1's experts (null in Dots1Config), DBRX's
#: attn_config.rope_theta (DbrxAttention reads it; DbrxConfig does not declare it). ERNIE 4.5's and AFMoE's
#: never-trained correction-bias parameters (requires_grad false) are buffers in modkit and not counted.
FLAGSHIPS = {
    "deepseek_v2": ({}, 38_612_307_968),
    "glm4_moe": ({"head_dim": 128}, 106_851_586_048),
    "dots1": ({"n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2}, 163_585_920_960),
    "ernie4_5_moe": ({}, 21_825_436_160),
    "minimax_m2": ({}, 228_689_748_992),
    "flex_olmo": ({}, 33_270_665_216),
    "granitemoeshared": ({}, 37_039_116_288),
    "afmoe": ({}, 19_232_598_016),
    "phimoe": ({}, 41_872_793_600),
    "dbrx": ({"attn_config": {"rope_theta": 10000.0}}, 2_459_207_680),
}


@pytest.mark.parametrize("model_type", sorted(FLAGSHIPS))
def test_flagship_defaults_give_transformers_parameter_count(model_type):
    fix, count = FLAGSHIPS[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("error", modkit.UnknownConfigKeyWarning)
        spec = modkit.from_hf_config({"model_type": model_type, **fix})
    assert modkit.count_params(spec) == count


@pytest.mark.parametrize("model_type", ["granitemoeshared", "phimoe", "minimax_m2"])
def test_flagship_count_is_transformers_own_on_meta(model_type):
    """Three of the counts above, recomputed (each builds in about a second on meta)."""
    fix, count = FLAGSHIPS[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.AutoConfig.for_model(model_type, **fix)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(cfg)
    assert sum(p.numel() for p in hf.parameters() if p.requires_grad) == count


# ------------------------------------------------------------------------------------------------ phimoe LongRoPE

PHIMOE_LONGROPE = dict(
    vocab_size=97,
    hidden_size=32,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=16,
    num_hidden_layers=1,
    num_local_experts=4,
    max_position_embeddings=64,
    pad_token_id=0,
    rope_parameters={
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.3, 1.7, 2.0, 2.5, 3.0, 3.5, 4.0],
        "long_factor": [2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
        "short_mscale": 1.2,
        "long_mscale": 1.2,
        "original_max_position_embeddings": 8,
    },
)


@pytest.mark.parametrize("length", [6, 13])
def test_phimoe_longrope_equals_transformers_below_and_past_the_trained_length(length, tmp_path):
    """Short factors at every length, cos/sin times the mscale: the same logits as ``PhimoeRotaryEmbedding`` for a
    sequence within and one past ``original_max_position_embeddings`` (8), and the file written back."""
    w = _quiet()
    try:
        hf = make_hf(transformers.PhimoeConfig, PHIMOE_LONGROPE, "causal")
        hf.save_pretrained(tmp_path / "hf")
    finally:
        w.__exit__(None, None, None)
    model = modkit.from_hf(tmp_path / "hf").eval()
    sc = model.spec.position.scaling
    assert sc.type == "longrope" and sc.long_factor == sc.short_factor and sc.attention_factor == 1.2
    ids = torch.randint(1, 97, (1, length), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = hf(ids).logits
        got = model(ids)
        got = got.logits if hasattr(got, "logits") else got
    assert (got - want).abs().max().item() <= 1e-5
    cfg = modkit.get_registry().hf_converter("phimoe").declaration.weights.hf_config(model.spec, hf.config.to_dict())
    assert cfg["rope_parameters"]["long_factor"] == PHIMOE_LONGROPE["rope_parameters"]["long_factor"]
    assert cfg["rope_parameters"]["short_mscale"] == cfg["rope_parameters"]["long_mscale"] == 1.2


def test_phimoe_refuses_two_mscales_and_other_top_k():
    base = {"model_type": "phimoe", "rope_parameters": dict(PHIMOE_LONGROPE["rope_parameters"], long_mscale=1.5)}
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(base)
    assert [p for p, _ in info.value.errors] == ["rope_parameters.long_mscale"], info.value.errors
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config({"model_type": "phimoe", "num_experts_per_tok": 4})
    assert any(p == "num_experts_per_tok" and "two experts" in m for p, m in info.value.errors)


# ------------------------------------------------------------------------------------------------ other keys


def test_minimax_m2_reads_the_legacy_rotary_dim():
    """MiniMax-M2's published config: ``rotary_dim`` 64 of ``head_dim`` 128 and a top-level ``rope_theta``."""
    spec = modkit.from_hf_config({"model_type": "minimax_m2", "rotary_dim": 64, "rope_theta": 5e6, "head_dim": 128})
    assert spec.position.partial_rotary == 0.5 and spec.position.theta == 5e6
    attention = spec.layer(0).attention
    assert attention.qk_norm_scope == "full" and spec.layer(0).ffn.router.correction_bias


def test_deepseek_v2_topk_methods():
    greedy = modkit.from_hf_config({"model_type": "deepseek_v2", "n_group": 8, "topk_group": 3})
    assert greedy.layer(0).ffn.router.n_group is None  # "greedy" ignores the groups, as DeepseekV2TopkRouter does
    grouped = modkit.from_hf_config(
        {"model_type": "deepseek_v2", "topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}
    )
    router = grouped.layer(0).ffn.router
    assert (router.type, router.n_group, router.topk_group, router.group_score) == ("topk", 8, 3, "max")
    assert not router.renormalize and grouped.position.layout == "interleaved"
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config({"model_type": "deepseek_v2", "topk_method": "noaux_tc"})
    assert [p for p, _ in info.value.errors] == ["topk_method"], info.value.errors


def test_dots1_and_ernie_layer_patterns():
    dots = modkit.from_hf_config(
        {"model_type": "dots1", **FLAGSHIPS["dots1"][0], "num_hidden_layers": 6, "max_window_layers": 4}
    )
    assert [dots.layer(i).attention.sliding_window for i in range(6)] == [None] * 4 + [4096] * 2
    ernie = modkit.from_hf_config(
        {"model_type": "ernie4_5_moe", "num_hidden_layers": 8, "moe_layer_start_index": 2, "moe_layer_interval": 2}
    )
    assert [ernie.layer(i).ffn.type == "moe" for i in range(8)] == [False, False, False, True, False, True, False, True]
    router = ernie.layer(3).ffn.router
    assert router.type == "topk" and router.correction_bias and router.renormalize


def test_dbrx_nested_keys():
    spec = modkit.from_hf_config(
        {
            "model_type": "dbrx",
            "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
            "ffn_config": {"moe_normalize_expert_weights": None, "moe_top_k": 4, "moe_num_experts": 16},
        }
    )
    attention, ffn = spec.layer(0).attention, spec.layer(0).ffn
    assert (attention.n_kv_heads, attention.clip_qkv) == (8, 8.0) and not ffn.router.renormalize
    assert spec.position.theta == 10000.0  # attn_config.rope_theta is not read by DbrxRotaryEmbedding
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config({"model_type": "dbrx", "ffn_config": {"ffn_act_fn": {"name": "gelu"}}})
    assert [p for p, _ in info.value.errors] == ["ffn_config.ffn_act_fn"], info.value.errors


def test_dbrx_clip_binds_in_the_fixture():
    """The harness's DBRX fixture clamps its projections for real: without the clamp the logits move."""
    from test_hf_types import FIXTURES

    _, cls, kwargs = next(f for f in FIXTURES if f[0] == "dbrx")
    w = _quiet()
    try:
        hf = make_hf(getattr(transformers, cls), kwargs, "causal")
    finally:
        w.__exit__(None, None, None)
    ids = torch.randint(1, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        clipped = hf(ids).logits
        for block in hf.transformer.blocks:
            block.norm_attn_norm.attn.clip_qkv = 1e9  # no clamp (None fails in transformers)
        free = hf(ids).logits
    assert (clipped - free).abs().max().item() > 1e-3
