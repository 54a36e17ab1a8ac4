"""Hugging Face config conversion: generality against transformers itself, and refusal of what cannot be expressed.

For every supported ``model_type``, small configs built with transformers' own config classes (varied GQA
ratios, biases, tying, free head_dim, sliding windows, partial rotary, QK-norm, MoE, Falcon's architectures...)
are converted with ``modkit.from_hf_config(cfg.to_dict())``; the modkit model built on ``meta`` must have exactly
as many parameters as ``AutoModelForCausalLM.from_config(cfg)`` (also on ``meta``; shared tensors counted once
by ``.parameters()``), and the same sliding window per layer where transformers exposes one.

transformers is a test-only reference: nothing under ``modkit/`` or ``plugins/`` imports it.
"""

from __future__ import annotations

import copy
import json
import warnings
from pathlib import Path

import pytest
import torch

import modkit

transformers = pytest.importorskip("transformers")

DATA = Path(__file__).resolve().parents[2] / "data" / "real-models"

T = transformers
SMALL = dict(vocab_size=97, max_position_embeddings=128)

# (id, config class, kwargs): two or more per model type, each varying features the converter must honour
CASES = [
    # llama: GQA 2:1, all attention + MLP biases, tied, linear RoPE scaling
    (
        "llama-bias-tied",
        T.LlamaConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            attention_bias=True,
            mlp_bias=True,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            **SMALL,
        ),
    ),
    # llama: MQA, head_dim 16 != 48 / 4, untied, llama3 scaling
    (
        "llama-mqa-headdim",
        T.LlamaConfig,
        dict(
            hidden_size=48,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=3,
            intermediate_size=80,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 500000.0,
            },
            **SMALL,
        ),
    ),
    # mistral: GQA 4:1 with a sliding window everywhere
    (
        "mistral-window",
        T.MistralConfig,
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=128,
            sliding_window=16,
            **SMALL,
        ),
    ),
    # mistral: MHA, head_dim 24 != 32 / 2, tied, no window
    (
        "mistral-mha-tied",
        T.MistralConfig,
        dict(
            hidden_size=32,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=24,
            num_hidden_layers=2,
            intermediate_size=40,
            sliding_window=None,
            tie_word_embeddings=True,
            **SMALL,
        ),
    ),
    # mixtral: 4 experts top-2
    (
        "mixtral-4x2",
        T.MixtralConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=32,
            num_local_experts=4,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.02,
            **SMALL,
        ),
    ),
    # mixtral: 3 experts top-1, MQA, head_dim 16 != 32 / 4, window, tied
    (
        "mixtral-3x1-mqa",
        T.MixtralConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=2,
            intermediate_size=24,
            num_local_experts=3,
            num_experts_per_tok=1,
            sliding_window=8,
            tie_word_embeddings=True,
            **SMALL,
        ),
    ),
    # qwen2: q/k/v biases, 7 heads, MQA, tied, sliding window from layer 2 on
    (
        "qwen2-window-layers",
        T.Qwen2Config,
        dict(
            hidden_size=56,
            num_attention_heads=7,
            num_key_value_heads=1,
            num_hidden_layers=4,
            intermediate_size=64,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=32,
            max_window_layers=2,
            **SMALL,
        ),
    ),
    # qwen2: MHA, untied, sliding window configured but switched off
    (
        "qwen2-mha",
        T.Qwen2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=2,
            intermediate_size=48,
            tie_word_embeddings=False,
            use_sliding_window=False,
            sliding_window=32,
            **SMALL,
        ),
    ),
    # qwen3: per-head QK-norm, head_dim 32 != 64 / 4, attention biases, tied
    (
        "qwen3-bias-tied",
        T.Qwen3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=96,
            attention_bias=True,
            tie_word_embeddings=True,
            **SMALL,
        ),
    ),
    # qwen3: head_dim 8, explicit layer_types with sliding layers (not a suffix)
    (
        "qwen3-layer-types",
        T.Qwen3Config,
        dict(
            hidden_size=48,
            num_attention_heads=6,
            num_key_value_heads=3,
            head_dim=8,
            num_hidden_layers=4,
            intermediate_size=64,
            use_sliding_window=True,
            sliding_window=16,
            max_window_layers=1,
            layer_types=["full_attention", "sliding_attention", "full_attention", "sliding_attention"],
            **SMALL,
        ),
    ),
    # gemma3: MQA, pattern 3 (layers 2 and 5 global), scalar != head_dim, linear scaling on global layers, softcap
    (
        "gemma3-pattern",
        T.Gemma3TextConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            num_hidden_layers=7,
            intermediate_size=96,
            sliding_window=16,
            sliding_window_pattern=3,
            query_pre_attn_scalar=24,
            final_logit_softcapping=30.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            **SMALL,
        ),
    ),
    # gemma3: MHA, attention biases, untied, explicit alternating layer_types
    (
        "gemma3-layer-types",
        T.Gemma3TextConfig,
        dict(
            hidden_size=48,
            num_attention_heads=2,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=4,
            intermediate_size=64,
            sliding_window=8,
            attention_bias=True,
            tie_word_embeddings=False,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            **SMALL,
        ),
    ),
    # olmo2: GQA with full-width QK-norm (k norm narrower than q norm)
    (
        "olmo2-gqa",
        T.Olmo2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            **SMALL,
        ),
    ),
    # olmo2: attention biases, tied, linear scaling
    (
        "olmo2-bias-tied",
        T.Olmo2Config,
        dict(
            hidden_size=48,
            num_attention_heads=6,
            num_key_value_heads=6,
            num_hidden_layers=3,
            intermediate_size=40,
            attention_bias=True,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
            **SMALL,
        ),
    ),
    # olmoe: GQA, 4 experts top-2 renormalised
    (
        "olmoe-4x2",
        T.OlmoeConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=True,
            **SMALL,
        ),
    ),
    # olmoe: MHA, 6 experts top-3 not renormalised, tied, biases
    (
        "olmoe-6x3-tied",
        T.OlmoeConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=2,
            intermediate_size=16,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            tie_word_embeddings=True,
            attention_bias=True,
            **SMALL,
        ),
    ),
    # falcon 40B-style: new decoder architecture, GQA 8/2, two norms per block, tied
    (
        "falcon-new-arch",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_kv_heads=2,
            num_hidden_layers=2,
            new_decoder_architecture=True,
            ffn_hidden_size=96,
            **SMALL,
        ),
    ),
    # falcon RW-style (rotary): sequential pre-norm blocks, MHA, biases, untied
    (
        "falcon-sequential-bias",
        T.FalconConfig,
        dict(
            hidden_size=48,
            num_attention_heads=4,
            num_hidden_layers=2,
            new_decoder_architecture=False,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            tie_word_embeddings=False,
            **SMALL,
        ),
    ),
    # falcon 7B-style: multi-query, parallel block with one shared norm
    (
        "falcon-7b-style",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            new_decoder_architecture=False,
            multi_query=True,
            parallel_attn=True,
            **SMALL,
        ),
    ),
    # falcon: new architecture with a single shared norm (num_ln_in_parallel_attn = 1), MHA
    (
        "falcon-new-arch-1ln",
        T.FalconConfig,
        dict(
            hidden_size=32,
            num_attention_heads=4,
            num_kv_heads=4,
            num_hidden_layers=2,
            new_decoder_architecture=True,
            num_ln_in_parallel_attn=1,
            bias=True,
            **SMALL,
        ),
    ),
    # phi: partial rotary 0.5, per-head LayerNorm QK-norm, untied head with bias
    (
        "phi-qk-layernorm",
        T.PhiConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=128,
            qk_layernorm=True,
            partial_rotary_factor=0.5,
            **SMALL,
        ),
    ),
    # phi: GQA, partial rotary 0.4, tied weight (bias stays separate)
    (
        "phi-gqa-tied",
        T.PhiConfig,
        dict(
            hidden_size=48,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=3,
            intermediate_size=64,
            partial_rotary_factor=0.4,
            tie_word_embeddings=True,
            **SMALL,
        ),
    ),
    # phi3: GQA, sliding window, partial rotary 0.75
    (
        "phi3-window-partial",
        T.Phi3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            sliding_window=16,
            partial_rotary_factor=0.75,
            pad_token_id=0,
            eos_token_id=1,
            **SMALL,
        ),
    ),
    # phi3: MHA, tied
    (
        "phi3-mha-tied",
        T.Phi3Config,
        dict(
            hidden_size=48,
            num_attention_heads=6,
            num_hidden_layers=2,
            intermediate_size=40,
            tie_word_embeddings=True,
            pad_token_id=0,
            eos_token_id=1,
            **SMALL,
        ),
    ),
    # gemma2: GQA, alternating sliding/global layers (even layers slide), attention and final softcaps, tied
    (
        "gemma2-softcap",
        T.Gemma2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=4,
            intermediate_size=96,
            sliding_window=16,
            query_pre_attn_scalar=24,
            **SMALL,
        ),
    ),
    # gemma2: MQA, head_dim 32 != 48 / 2, biases, untied, caps off, explicit layer_types, linear scaling
    (
        "gemma2-nocap-untied",
        T.Gemma2Config,
        dict(
            hidden_size=48,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            num_hidden_layers=3,
            intermediate_size=64,
            attention_bias=True,
            tie_word_embeddings=False,
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            sliding_window=8,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            **SMALL,
        ),
    ),
    # llama: YaRN with the default attention factor
    (
        "llama-yarn",
        T.LlamaConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 32,
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
    ),
    # qwen2: dynamic NTK scaling
    (
        "qwen2-dynamic",
        T.Qwen2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
            **SMALL,
        ),
    ),
    # phi3: LongRoPE on a partial rotary width (Phi-3 128k style: factor from the two lengths)
    (
        "phi3-longrope",
        T.Phi3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_hidden_layers=2,
            intermediate_size=96,
            partial_rotary_factor=0.5,
            original_max_position_embeddings=32,
            pad_token_id=0,
            eos_token_id=1,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6],
                "long_factor": [1.0, 2.0, 4.0, 8.0],
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
    ),
    # gpt2: defaults (n_inner = 4 * n_embd, gelu_new, tied)
    ("gpt2-small", T.GPT2Config, dict(n_embd=64, n_head=4, n_layer=2, n_positions=128, vocab_size=101)),
    # gpt2: explicit n_inner, relu, untied, no 1/sqrt(d) scaling
    (
        "gpt2-untied-relu",
        T.GPT2Config,
        dict(
            n_embd=48,
            n_head=3,
            n_layer=3,
            n_positions=64,
            vocab_size=89,
            n_inner=100,
            activation_function="relu",
            tie_word_embeddings=False,
            scale_attn_weights=False,
        ),
    ),
]

MODEL_TYPES = [
    "falcon",
    "gemma2",
    "gemma3_text",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "olmoe",
    "phi",
    "phi3",
    "qwen2",
    "qwen3",
]


def _hf_model(cfg):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(cfg)


def test_cases_cover_every_model_type():
    covered = {cls.model_type for _, cls, _ in CASES}
    assert covered == set(MODEL_TYPES)
    assert all(sum(cls.model_type == t for _, cls, _ in CASES) >= 2 for t in MODEL_TYPES)
    assert set(MODEL_TYPES) <= set(modkit.get_registry().hf_model_types())


@pytest.mark.parametrize("name,cls,kwargs", CASES, ids=[c[0] for c in CASES])
def test_param_count_matches_transformers(name, cls, kwargs):
    cfg = cls(**kwargs)
    spec = modkit.from_hf_config(cfg.to_dict())
    model = modkit.build(spec, device="meta")
    hf = _hf_model(cfg)
    expected = sum(p.numel() for p in hf.parameters())
    got = modkit.breakdown(model)
    assert got["total"] == expected, f"{name}: modkit {got} vs transformers {expected}"
    assert "other" not in got
    # per-layer sliding windows, where transformers exposes them on the attention module
    for i, layer in enumerate(_hf_layers(hf)):
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "sliding_window"):
            assert spec.layer(i).attention.sliding_window == attn.sliding_window, f"layer {i}"


def _hf_layers(hf):
    base = getattr(hf, "model", None) or getattr(hf, "transformer", None)
    return list(getattr(base, "layers", None) or getattr(base, "h", None) or [])


def test_tied_head_counted_once_and_lm_head_bias_kept():
    cfg = T.PhiConfig(
        hidden_size=32,
        num_attention_heads=4,
        num_hidden_layers=1,
        intermediate_size=64,
        tie_word_embeddings=True,
        **SMALL,
    )
    spec = modkit.from_hf_config(cfg.to_dict())
    assert spec.tie_embeddings and spec.lm_head_bias
    b = modkit.breakdown(modkit.build(spec, device="meta"))
    assert b["lm_head"] == SMALL["vocab_size"]  # the bias only; the weight is the embedding


def test_sliding_window_overrides_are_compact():
    cfg = T.Gemma3TextConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_hidden_layers=26,
        intermediate_size=48,
        sliding_window=512,
        **SMALL,
    )
    d = modkit.io.hf.hf_config_to_dict(cfg.to_dict())
    assert d["block"]["attention"]["sliding_window"] == 512
    assert [o["layers"] for o in d["overrides"]] == [{"start": 5, "step": 6}]
    assert "sliding_window" not in d["overrides"][0]["attention"]
    cfg = T.Qwen2Config(
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=6,
        use_sliding_window=True,
        sliding_window=64,
        max_window_layers=4,
        **SMALL,
    )
    d = modkit.io.hf.hf_config_to_dict(cfg.to_dict())
    assert d["block"]["attention"].get("sliding_window") is None
    assert d["overrides"] == [{"layers": {"start": 4}, "attention": dict(d["block"]["attention"], sliding_window=64)}]


def test_legacy_and_new_rope_forms_agree():
    legacy = json.loads((DATA / "llama-3.1-8b" / "config.json").read_text())
    new = T.LlamaConfig(**legacy).to_dict()
    assert "rope_parameters" in new and "rope_scaling" not in new
    a = modkit.from_hf_config(legacy).to_dict()
    b = modkit.from_hf_config(new).to_dict()
    assert a["position"] == b["position"]
    assert a["position"]["scaling"]["type"] == "llama3"
    assert a["block"] == b["block"]


def test_gemma3_legacy_pattern_and_layer_types_agree():
    legacy = json.loads((DATA / "gemma-3-1b-pt" / "config.json").read_text())
    new = T.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k not in ("architectures",)}).to_dict()
    assert "layer_types" in new
    a, b = modkit.from_hf_config(legacy).to_dict(), modkit.from_hf_config(new).to_dict()
    for key in ("position", "block", "overrides", "embedding_scale", "final_norm", "tie_embeddings"):
        assert a[key] == b[key], key


def test_gemma3_legacy_rope_scaling_applies_to_global_layers_only():
    legacy = json.loads((DATA / "gemma-3-1b-pt" / "config.json").read_text())
    legacy["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}  # as in the 4B/12B/27B configs
    new = T.Gemma3TextConfig(**{k: v for k, v in legacy.items() if k != "architectures"}).to_dict()
    for cfg in (legacy, new):
        spec = modkit.from_hf_config(cfg)
        local, glob = spec.layer(0).position, spec.layer(5).position
        assert (local.theta, local.scaling) == (10000.0, None)
        assert glob.theta == 1e6 and (glob.scaling.type, glob.scaling.factor) == ("linear", 8.0)


# --------------------------------------------------------------------------------------------- refusals


def _llama(**changes) -> dict:
    cfg = json.loads((DATA / "llama-3.2-1b" / "config.json").read_text())
    cfg.update(changes)
    return cfg


def _errors(cfg) -> list[tuple[str, str]]:
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    return info.value.errors


@pytest.mark.parametrize(
    "rope_scaling,field",
    [
        ({"rope_type": "axial", "factor": 2.0}, "rope_scaling.rope_type"),
        ({"type": "ntk-by-parts", "factor": 2.0}, "rope_scaling.type"),
    ],
)
def test_unsupported_rope_scaling_names_field_and_value(rope_scaling, field):
    errors = _errors(_llama(rope_scaling=rope_scaling))
    assert any(
        p == field and repr(rope_scaling.get("rope_type") or rope_scaling.get("type")) in m for p, m in errors
    ), errors


def test_unsupported_rope_type_in_transformers5_form():
    cfg = T.LlamaConfig(
        hidden_size=32,
        num_attention_heads=2,
        num_hidden_layers=1,
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
    ).to_dict()
    cfg["rope_parameters"]["rope_type"] = "axial"
    errors = _errors(cfg)
    assert any(p == "rope_parameters.rope_type" and "'axial'" in m for p, m in errors), errors


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"factor": -1.0}, "factor"),
        ({"beta_fast": "fast"}, "beta_fast"),
        ({"truncate": "yes"}, "truncate"),
        ({"original_max_position_embeddings": 0.5}, "original_max_position_embeddings"),
    ],
)
def test_bad_yarn_values_name_the_field(bad, field):
    errors = _errors(
        _llama(rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192, **bad})
    )
    assert any(p == f"rope_scaling.{field}" for p, _ in errors), errors


def test_longrope_factors_must_be_lists_of_one_value_per_pair():
    cfg = {
        "model_type": "phi3",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "max_position_embeddings": 64,
        "original_max_position_embeddings": 16,
        "rope_scaling": {"type": "longrope", "short_factor": "1", "long_factor": [1.0] * 4},
    }
    assert any(p == "rope_scaling.short_factor" for p, _ in _errors(cfg))
    cfg["rope_scaling"]["short_factor"] = [1.0] * 3  # head_dim 8 rotates 4 pairs
    errors = _errors(cfg)
    # reported at the config's key, naming the spec field it becomes
    assert any(
        p == "rope_scaling.short_factor"
        and "position.scaling.short_factor" in m
        and "one per rotated pair" in m
        and "= 4" in m
        for p, m in errors
    ), errors


def test_unknown_rope_parameter_is_dropped_with_a_warning_or_refused_when_strict():
    cfg = _llama(rope_scaling={"rope_type": "linear", "factor": 2.0, "attention_factor": 0.5})
    with pytest.warns(modkit.UnknownConfigKeyWarning, match=r"rope_scaling.attention_factor = 0.5") as rec:
        spec = modkit.from_hf_config(cfg)
    assert [w.message.keys for w in rec if isinstance(w.message, modkit.UnknownConfigKeyWarning)] == [
        {"rope_scaling.attention_factor": 0.5}
    ]
    assert spec.position.scaling.factor == 2.0
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg, strict=True)
    assert any(p == "rope_scaling.attention_factor" and "0.5" in m for p, m in info.value.errors), info.value.errors


def test_unknown_keys_are_reported_in_one_warning_naming_each_key_and_value():
    cfg = _llama(foo_bar=3, legacy_flag=True, extra_list=[1, 2])
    with pytest.warns(modkit.UnknownConfigKeyWarning) as rec:
        spec = modkit.from_hf_config(cfg)
    ours = [w.message for w in rec if isinstance(w.message, modkit.UnknownConfigKeyWarning)]
    assert len(ours) == 1 and ours[0].model_type == "llama"
    assert ours[0].keys == {"extra_list": [1, 2], "foo_bar": 3, "legacy_flag": True}
    assert (
        "foo_bar = 3" in str(ours[0]) and "legacy_flag = True" in str(ours[0]) and "extra_list = [1, 2]" in str(ours[0])
    )
    assert spec == modkit.from_hf_config(_llama())  # the same network


def test_strict_refuses_unknown_keys_naming_field_and_value():
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(_llama(foo_bar=3), strict=True)
    assert any(p == "foo_bar" and "3" in m and "strict" in m for p, m in info.value.errors), info.value.errors
    # a key another model type reads is unknown to this one: MistralConfig has no attention_bias (no biases at all)
    mistral = json.loads((DATA / "mistral-7b-v0.1" / "config.json").read_text())
    mistral["attention_bias"] = True
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(mistral, strict=True)
    assert [p for p, _ in info.value.errors] == ["attention_bias"]
    with pytest.warns(modkit.UnknownConfigKeyWarning, match="attention_bias = True"):
        assert not modkit.from_hf_config(mistral).block.attention.q_bias


@pytest.mark.parametrize("value", [None, False, [], {}])
def test_unknown_key_with_nothing_value_is_accepted_silently(value):
    import warnings as w

    with w.catch_warnings():
        w.simplefilter("error", modkit.UnknownConfigKeyWarning)
        modkit.from_hf_config(_llama(foo_bar=value), strict=True)


def test_all_problems_reported_together():
    errors = _errors(_llama(foo_bar=3, rope_scaling={"rope_type": "axial", "factor": 4.0}, hidden_act="quick_gelu"))
    fields = {p for p, _ in errors}
    assert {"rope_scaling.rope_type", "hidden_act"} <= fields and "foo_bar" not in fields, errors
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(
            _llama(foo_bar=3, rope_scaling={"rope_type": "axial", "factor": 4.0}, hidden_act="quick_gelu"),
            strict=True,
        )
    assert {"foo_bar", "rope_scaling.rope_type", "hidden_act"} <= {p for p, _ in info.value.errors}


def test_irrelevant_keys_are_ignored_whatever_their_value():
    cfg = _llama(
        attention_dropout=0.3, torch_dtype="float32", use_cache=False, pretraining_tp=4, bos_token_id=5, temperature=0.7
    )
    assert modkit.count_params(modkit.from_hf_config(cfg)) == 1235814400


@pytest.mark.parametrize(
    "model,changes,field",
    [
        ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
        ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
        ("gpt2", {"activation_function": "quick_gelu"}, "activation_function"),
        ("gemma-3-1b-pt", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),  # transformers 5 ignores it
        ("gemma-3-1b-pt", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ("gemma-3-1b-pt", {"layer_types": ["chunked_attention"] * 26}, "layer_types"),
        ("qwen2.5-0.5b", {"use_mrope": True}, "use_mrope"),
        ("llama-3.2-1b", {"is_encoder_decoder": True}, "is_encoder_decoder"),
        ("llama-3.2-1b", {"num_key_value_heads": 5}, "num_key_value_heads"),
        ("mixtral-8x7b-v0.1", {"num_local_experts": 0}, "num_local_experts"),
    ],
)
def test_unsupported_values_name_the_field(model, changes, field):
    cfg = json.loads((DATA / model / "config.json").read_text())
    cfg.update(changes)
    errors = _errors(cfg)
    assert any(p == field for p, _ in errors), errors


@pytest.mark.parametrize(
    "cls,kwargs,field",
    [
        (T.OlmoeConfig, dict(clip_qkv=8.0), "clip_qkv"),
        (T.FalconConfig, dict(new_decoder_architecture=True, num_kv_heads=4, parallel_attn=False), "parallel_attn"),
    ],
)
def test_unsupported_values_from_transformers_configs(cls, kwargs, field):
    base = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, **SMALL)
    cfg = cls(**{**base, **kwargs}).to_dict()
    errors = _errors(cfg)
    assert any(p == field for p, _ in errors), errors


def test_phi3_legacy_su_scaling_is_longrope():
    cfg = {
        "model_type": "phi3",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "max_position_embeddings": 128,
        "original_max_position_embeddings": 16,
        "rope_scaling": {"type": "su", "short_factor": [1.0] * 4, "long_factor": [1.5] * 4},
    }
    sc = modkit.from_hf_config(cfg).position.scaling
    assert (sc.type, sc.short_factor, sc.long_factor, sc.original_max_seq_len) == ("longrope", [1.0] * 4, [1.5] * 4, 16)


def test_rope_scalings_in_both_config_forms_agree():
    """transformers 4.x files (rope_scaling + rope_theta) and 5.x to_dict() (rope_parameters) convert alike."""
    for scaling in (
        {"rope_type": "dynamic", "factor": 2.0},
        {"type": "dynamic", "factor": 3.0},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 16.0,
            "attention_factor": 1.2,
        },
        {"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 1.0},
    ):
        legacy = {
            "model_type": "llama",
            "hidden_size": 32,
            "num_attention_heads": 2,
            "num_hidden_layers": 1,
            "max_position_embeddings": 128,
            "rope_theta": 5e5,
            "rope_scaling": dict(scaling),
        }
        new = T.LlamaConfig.from_dict(legacy).to_dict()
        assert "rope_parameters" in new
        a, b = modkit.from_hf_config(legacy).position, modkit.from_hf_config(new).position
        assert a == b, (a, b)
    yarn = modkit.from_hf_config(legacy).position.scaling
    assert (yarn.factor, yarn.original_max_seq_len, yarn.mscale, yarn.mscale_all_dim) == (4.0, 128, 0.707, 1.0)


def test_yarn_factor_defaults_to_the_ratio_of_lengths():
    cfg = _llama(
        max_position_embeddings=32768,
        rope_scaling={"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 8192},
    )
    assert modkit.from_hf_config(cfg).position.scaling.factor == 4.0


def test_dynamic_scaling_takes_the_trained_length_from_max_position_embeddings():
    sc = modkit.from_hf_config(_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0})).position.scaling
    assert (sc.type, sc.factor, sc.original_max_seq_len) == ("dynamic", 2.0, 131072)


def test_unsupported_model_type_lists_supported_ones():
    errors = _errors({"model_type": "t5", "hidden_size": 8})
    assert errors[0][0] == "model_type"
    for t in MODEL_TYPES:
        assert t in errors[0][1]


def test_missing_model_type():
    errors = _errors({"hidden_size": 8})
    assert errors[0][0] == "model_type"


def test_converters_do_not_import_transformers():
    root = Path(modkit.__file__).resolve().parents[1]
    for path in list((root / "modkit_plugins").rglob("*.py")) + list((root / "modkit").rglob("*.py")):
        text = path.read_text()
        assert "import transformers" not in text and "from transformers" not in text, path


def test_conversion_does_not_mutate_input():
    cfg = _llama()
    before = copy.deepcopy(cfg)
    modkit.from_hf_config(cfg)
    assert cfg == before


def _modkit_attention(block):
    return next(m for m in block.modules() if getattr(m, "modkit_kind", None) == "attention")


@pytest.mark.parametrize("name,cls,kwargs", CASES, ids=[c[0] for c in CASES])
def test_rope_frequencies_and_softmax_scale_match_transformers(name, cls, kwargs):
    """Per layer: the rotary inverse frequencies (theta, partial rotary, scaling) and the q·k scale agree."""
    cfg = cls(**kwargs)
    spec = modkit.from_hf_config(cfg.to_dict())
    model = modkit.build(spec, device="cpu", seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(cfg)
    base = getattr(hf, "model", None) or getattr(hf, "transformer", None)
    rot = getattr(base, "rotary_emb", None)
    layer_types = getattr(cfg, "layer_types", None)
    for i, layer in enumerate(_hf_layers(hf)):
        ours = model.positions[model.layer_position[i]]
        if rot is not None:
            theirs = getattr(rot, f"{layer_types[i]}_inv_freq", None) if layer_types else None
            theirs = theirs if theirs is not None else rot.inv_freq
            assert torch.allclose(ours.inv_freq.float(), theirs.float(), rtol=1e-5), f"layer {i}"
            theirs_scale = getattr(rot, f"{layer_types[i]}_attention_scaling", None) if layer_types else None
            theirs_scale = theirs_scale if theirs_scale is not None else rot.attention_scaling
            assert ours.attention_scale == pytest.approx(float(theirs_scale), rel=1e-7), f"layer {i}"
        attn = getattr(layer, "self_attn", None)
        if attn is not None and hasattr(attn, "scaling"):
            assert _modkit_attention(model.layers[i]).scale == pytest.approx(attn.scaling, rel=1e-9), f"layer {i}"


def test_falcon_alibi_bias_is_scaled_like_transformers():
    cfg = T.FalconConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1, alibi=True, **SMALL).to_dict()
    spec = modkit.from_hf_config(cfg)
    assert spec.position.type == "alibi" and spec.position.scale == pytest.approx(16**-0.5)


@pytest.mark.parametrize(
    "flags,kv",
    [
        (dict(new_decoder_architecture=True, num_kv_heads=2), 2),  # grouped (Falcon-40B)
        (dict(multi_query=True), 1),  # multi-query (Falcon-7B)
        (dict(multi_query=False, parallel_attn=False), 4),
    ],  # multi-head, sequential (Falcon-RW)
)
def test_falcon_num_key_value_heads_is_read_checked_and_written(flags, kv):
    """transformers 5.25+ writes ``num_key_value_heads`` (the KV width the flags give) into a Falcon config: it is
    accepted when present and equal to the flags' width, accepted when absent (older transformers), refused by name
    when it disagrees, and written on export."""
    from modkit.io.hf import _mapper

    base = dict(model_type="falcon", hidden_size=64, num_attention_heads=4, num_hidden_layers=1, vocab_size=64, **flags)
    for cfg in (base, dict(base, num_key_value_heads=kv)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", modkit.UnknownConfigKeyWarning)
            spec = modkit.from_hf_config(cfg, strict=True)
        assert spec.block.attention.kv_heads == kv
        assert _mapper("falcon", modkit.get_registry()).hf_config(spec, None)["num_key_value_heads"] == kv
    wrong = 3 if kv != 3 else 1
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(dict(base, num_key_value_heads=wrong))
    assert [p for p, _ in info.value.errors] == ["num_key_value_heads"], info.value.errors
    assert f"give {kv} key/value heads" in info.value.errors[0][1]
