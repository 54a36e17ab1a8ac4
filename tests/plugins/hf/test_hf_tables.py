"""The declarative Hugging Face model types: their tables against transformers' configuration classes, the weight
layout transforms against the layouts transformers 5 saves, and a third-party type derived in a few lines.

* every key of a type's transformers configuration class (``AutoConfig.for_model(t).to_dict()``) is a row of the
  type's table, irrelevant for every type, or one of the keys every type must leave at one value;
* a config holding only ``model_type`` converts to the very spec transformers' class defaults give;
* every refused row refuses a value other than the one modkit can express, naming the key;
* each transform maps the tensors as the transformers modeling code reads them (gpt-oss's interleaved
  ``gate_up_proj``, Llama 4's concatenated one, the stacked ``[n_experts, 2 * d_ff, d_model]`` layout, GPT-NeoX's
  per-head ``query_key_value``, Falcon's grouped one, MLA's ``kv_a_proj_with_mqa`` and ``kv_b_proj``), and back
  bitwise.
"""

from __future__ import annotations

import types as pytypes
import warnings

import pytest
import torch

import modkit
from modkit_plugins.hf import Chain, Concat, FusedQKV, HFType, PerHead, Refuse, StackExperts, Transpose
from modkit_plugins.hf._reader import EXPECTED, IRRELEVANT
from modkit_plugins.hf._weights import Ctx
from modkit_plugins.hf.llama import LLAMA

transformers = pytest.importorskip("transformers")

DECLARED = {
    t: c.declaration
    for t in modkit.get_registry().hf_model_types()
    if isinstance((c := modkit.get_registry().hf_converter(t)).declaration, HFType)
}


#: the keys a type's class defaults need beside ``model_type`` for a model transformers can run, with why: GLM-4.5's
#: class defaults give head_dim 4096 // 96 = 42, whose half (the rotated width, 21) is odd, so the published 128;
#: dots.llm1's leave the experts null (Dots1MoE cannot be built), so the published 128 experts, top-6, 2 shared
DEFAULT_FIXES = {
    "glm4_moe": {"head_dim": 128},
    "dots1": {"n_routed_experts": 128, "num_experts_per_tok": 6, "n_shared_experts": 2},
}


def _defaults(t: str) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {**transformers.AutoConfig.for_model(t).to_dict(), **DEFAULT_FIXES.get(t, {})}


def _same_network(a, b) -> bool:
    a, b = a.to_dict(), b.to_dict()
    for d in (a, b):
        d.pop("name"), d.pop("description")
    return a == b


def test_the_built_in_types_are_declared():
    """Every built-in type is a declared table, or the language model of a vision-language checkpoint declared
    around one."""
    from modkit_plugins.hf._wrapper import LanguageModelOf

    registry = modkit.get_registry()
    wrappers = [
        t for t in registry.hf_model_types() if isinstance(registry.hf_converter(t).declaration, LanguageModelOf)
    ]
    assert all(registry.hf_converter(t).declaration.text in DECLARED.values() for t in wrappers)
    assert len(DECLARED) + len(wrappers) == len(registry.hf_model_types()) >= 19


@pytest.mark.parametrize("t", sorted(DECLARED))
def test_every_key_of_the_transformers_config_class_has_a_row(t):
    table = DECLARED[t].keys
    listed = {k for name, row in table.items() for k in row.config_keys(name)}
    missing = sorted(set(_defaults(t)) - listed - IRRELEVANT - set(EXPECTED))
    assert not missing, f"{t}: keys of transformers' config class without a row: {missing}"


@pytest.mark.parametrize("t", sorted(DECLARED))
def test_absent_keys_take_transformers_class_defaults(t):
    with warnings.catch_warnings():
        warnings.simplefilter("error", modkit.UnknownConfigKeyWarning)
        ours = modkit.from_hf_config({"model_type": t, **DEFAULT_FIXES.get(t, {})})
        theirs = modkit.from_hf_config(_defaults(t), strict=True)
    assert _same_network(ours, theirs)


def _bad(allowed):
    return True if allowed is False else "something_else" if isinstance(allowed, str) else 3.0


@pytest.mark.parametrize(
    "t,key", [(t, k) for t, d in sorted(DECLARED.items()) for k, row in d.keys.items() if isinstance(row, Refuse)]
)
def test_refused_keys_are_refused_by_name(t, key):
    row = DECLARED[t].keys[key]
    cfg = dict(_defaults(t), **{key: _bad(row.allowed)})
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    assert any(p == key and row.why in m for p, m in info.value.errors), info.value.errors


@pytest.mark.parametrize("cls", ["MistralConfig", "Qwen2Config"])
def test_a_null_sliding_window_means_global_attention(cls):
    kwargs = dict(
        hidden_size=32, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2, sliding_window=None
    )
    if cls == "Qwen2Config":
        kwargs["use_sliding_window"] = True
    cfg = getattr(transformers, cls)(**kwargs)
    spec = modkit.from_hf_config(cfg.to_dict())
    assert cfg.sliding_window is None
    assert [spec.layer(i).attention.sliding_window for i in range(2)] == [None, None]


@pytest.mark.parametrize("t", ["gemma2", "gemma3_text", "olmo3"])
def test_a_null_window_on_sliding_layers_is_refused(t):
    """transformers cannot build those layers' mask (``create_sliding_window_causal_mask`` raises); modkit names the key
    instead of inventing a window."""
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config({"model_type": t, "sliding_window": None})
    assert any(p == "sliding_window" for p, _ in info.value.errors), info.value.errors


# ------------------------------------------------------------------------------------------------ transforms


def _ctx(ours_shapes, layer=None, spec=None, config=None):
    names = tuple(f"t{k}" for k in range(len(ours_shapes)))
    return Ctx(spec, dict(zip(names, ours_shapes)), config or {}, layer, names, ("hf",))


def _round_trip(transform, hf, ctx):
    ours = transform.to_ours([hf], ctx)
    back = transform.to_hf(ours, ctx, {})
    assert len(back) == 1 and torch.equal(back[0], hf)
    return ours


def test_interleaved_gate_up_as_gpt_oss_stores_it():
    """GptOssExperts: ``gate_up_proj [n_experts, d_model, 2 * d_ff]``, gate at even columns, up at odd ones."""
    g = torch.Generator().manual_seed(0)
    e, d, ff = 3, 4, 5
    fused = torch.randn(e, d, 2 * ff, generator=g)
    gate, up = _round_trip(Concat(dim=-1, interleaved=True), fused, _ctx([(e, d, ff), (e, d, ff)]))
    assert torch.equal(gate, fused[..., ::2]) and torch.equal(up, fused[..., 1::2])
    bias = torch.randn(e, 2 * ff, generator=g)  # gate_up_proj_bias, interleaved the same way
    gb, ub = _round_trip(Concat(dim=-1, interleaved=True), bias, _ctx([(e, ff), (e, ff)]))
    assert torch.equal(gb, bias[..., ::2]) and torch.equal(ub, bias[..., 1::2])


def test_concatenated_gate_up_as_llama4_stores_it():
    """Llama4TextExperts: ``gate_up_proj [n_experts, d_model, 2 * d_ff]``, ``gate, up = chunk(2, dim=-1)``."""
    fused = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(1))
    gate, up = _round_trip(Concat(dim=-1), fused, _ctx([(2, 4, 3), (2, 4, 3)]))
    ref_gate, ref_up = fused.chunk(2, dim=-1)
    assert torch.equal(gate, ref_gate) and torch.equal(up, ref_up)


def test_stacked_experts_in_transformers_5_memory_layout():
    """Qwen2MoeExperts (and the MoE models transformers 5 fuses in memory): ``gate_up_proj [n_experts, 2 * d_ff, d_model]``
    used as ``F.linear(x, gate_up_proj[e]).chunk(2, -1)``, i.e. rows gate then up; modkit stacks ``[n_experts, in, out]``."""
    e, d, ff = 3, 4, 5
    fused = torch.randn(e, 2 * ff, d, generator=torch.Generator().manual_seed(2))
    x = torch.randn(7, d)
    gate, up = _round_trip(Chain((Transpose(), Concat(dim=-1))), fused, _ctx([(e, d, ff), (e, d, ff)]))
    for k in range(e):
        ref_gate, ref_up = torch.nn.functional.linear(x, fused[k]).chunk(2, dim=-1)
        assert torch.allclose(x @ gate[k], ref_gate) and torch.allclose(x @ up[k], ref_up)


def test_one_linear_per_expert_stacks_into_modkit_experts():
    ws = [torch.randn(5, 4, generator=torch.Generator().manual_seed(k)) for k in range(3)]  # [out, in] per expert
    (stacked,) = StackExperts().to_ours(ws, _ctx([(3, 4, 5)]))
    assert stacked.shape == (3, 4, 5) and all(torch.equal(stacked[k], ws[k].t()) for k in range(3))
    assert all(torch.equal(a, b) for a, b in zip(StackExperts().to_hf([stacked], _ctx([(3, 4, 5)]), {}), ws))


def _attention_spec(n_heads, n_kv, hd):
    att = pytypes.SimpleNamespace(n_heads=n_heads, kv_heads=n_kv, resolved_head_dim=lambda d: hd)
    return pytypes.SimpleNamespace(d_model=n_heads * hd, layer=lambda i: pytypes.SimpleNamespace(attention=att))


def test_per_head_fused_qkv_as_gpt_neox_stores_it():
    """GPTNeoXAttention: ``query_key_value`` output viewed ``[..., n_heads, 3 * head_dim]`` and chunked in three."""
    n, hd, d = 4, 3, 12
    w = torch.randn(3 * n * hd, d, generator=torch.Generator().manual_seed(3))
    x = torch.randn(5, d)
    ctx = _ctx([(n * hd, d)] * 3, layer=0, spec=_attention_spec(n, n, hd))
    q, k, v = _round_trip(FusedQKV("per_head"), w, ctx)
    ref_q, ref_k, ref_v = (x @ w.t()).view(5, n, 3 * hd).chunk(3, dim=-1)
    for ours, ref in ((q, ref_q), (k, ref_k), (v, ref_v)):
        assert torch.allclose((x @ ours.t()).view(5, n, hd), ref)


def test_grouped_fused_qkv_as_falcon_stores_it():
    """FalconAttention (new architecture): per KV group its query heads, then its key, then its value head."""
    n, kv, hd, d = 6, 2, 2, 8
    w = torch.randn((n + 2 * kv) * hd, d, generator=torch.Generator().manual_seed(4))
    q, k, v = _round_trip(
        FusedQKV("grouped"), w, _ctx([(n * hd, d), (kv * hd, d), (kv * hd, d)], 0, _attention_spec(n, kv, hd))
    )
    g = w.view(kv, n // kv + 2, hd, d)
    assert torch.equal(q.view(kv, n // kv, hd, d), g[:, : n // kv]) and torch.equal(k.view(kv, hd, d), g[:, -2])
    assert torch.equal(v.view(kv, hd, d), g[:, -1])


def test_latent_attention_up_projection_splits_head_by_head():
    """DeepseekV3Attention: ``kv_b_proj(latent).view(..., n_heads, qk_nope_head_dim + v_head_dim)`` split in two."""
    n, nope, v_dim, rank = 3, 4, 2, 5
    w = torch.randn(n * (nope + v_dim), rank, generator=torch.Generator().manual_seed(6))
    x = torch.randn(7, rank)
    k, v = _round_trip(PerHead(), w, _ctx([(n * nope, rank), (n * v_dim, rank)], 0, _attention_spec(n, n, nope)))
    ref_k, ref_v = (x @ w.t()).view(7, n, nope + v_dim).split([nope, v_dim], dim=-1)
    assert torch.allclose((x @ k.t()).view(7, n, nope), ref_k) and torch.allclose((x @ v.t()).view(7, n, v_dim), ref_v)


def test_latent_attention_down_projection_splits_into_latent_and_shared_key():
    """DeepseekV3Attention: ``kv_a_proj_with_mqa`` output split ``[kv_lora_rank, qk_rope_head_dim]``."""
    rank, rope, d = 6, 2, 5
    w = torch.randn(rank + rope, d, generator=torch.Generator().manual_seed(5))
    latent, key = _round_trip(Concat(), w, _ctx([(rank, d), (rope, d)]))
    assert torch.equal(latent, w[:rank]) and torch.equal(key, w[rank:])


# ------------------------------------------------------------------------------------------------ a third-party type


def test_a_plugin_derives_and_registers_a_type_in_a_few_lines(tmp_path):
    """A made-up ``my_llama`` (Llama with another default width and a refused key), registered with ``register(TYPE)``
    by a plugin of its own: converts configs, loads and exports weights under its own model type."""
    mine = LLAMA.derive(
        "my_llama",
        architecture="MyLlamaForCausalLM",
        defaults={"hidden_size": 64},
        keys={"my_gate": Refuse(False, "the gated variant is not supported")},
    )
    reg = modkit.Registry()
    for info in modkit.get_registry().plugins():
        reg.register_plugin(info.obj, info.name)

    def register_hf_converters(register):
        register(mine)

    reg.register_plugin(pytypes.SimpleNamespace(register_hf_converters=modkit.hookimpl(register_hf_converters)), "mine")
    conv = reg.hf_converter("my_llama")
    assert conv.declaration is mine and conv.weights is mine.weights and conv.provider.plugin == "mine"
    base = {
        "model_type": "my_llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 1,
        "intermediate_size": 32,
        "vocab_size": 50,
        "max_position_embeddings": 16,
    }
    spec = modkit.from_hf_config(base, registry=reg)
    assert spec.d_model == 64 and spec.metadata["hf_model_type"] == "my_llama"
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(dict(base, my_gate=True), registry=reg)
    assert [p for p, _ in info.value.errors] == ["my_gate"]
    model = modkit.build(spec, registry=reg, seed=0)
    out = modkit.to_hf(model, tmp_path / "out", registry=reg)
    again = modkit.from_hf(out, registry=reg)
    assert (out / "config.json").read_text().count('"my_llama"') == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


@pytest.mark.parametrize("model_type", sorted(DECLARED))
def test_supports_agrees_with_the_converted_defaults(model_type):
    """The reference page's "supports" labels that a type's defaults decide agree with the spec they convert to:
    interleaved RoPE exactly when the converted position layout is interleaved (DeepSeek's ``rope_interleave``, GLM,
    Cohere, Llama 4), latent attention exactly when the attention is ``mla`` or ``dsa``, and no GQA / MQA label for a latent
    attention (its key/value head count is fixed to the heads)."""
    from modkit.io.hf import convert_hf_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = convert_hf_config({"model_type": model_type, **DEFAULT_FIXES.get(model_type, {})})[1]
    supports = DECLARED[model_type].supports()
    assert ("interleaved RoPE" in supports) == (getattr(spec.position, "layout", None) == "interleaved")
    # a hybrid's attention layers; mla, or dsa (latent attention with a selection)
    mla = any(hasattr(spec.layer(i).attention, "kv_lora_rank") for i in range(spec.n_layers))
    assert ("latent attention (MLA)" in supports) == mla
    assert not (mla and "GQA / MQA" in supports)


# ------------------------------------------------------------------------------------------------ 2026 dense types

#: transformers' parameter counts of the 2026 dense types at their configuration classes' defaults: the sum over
#: ``AutoModelForCausalLM.from_config(AutoConfig.for_model(t, **changes))`` built on meta, transformers 5.25 (written
#: here: the builds take seconds each). Hunyuan's class defaults do not build (its attention reads ``head_dim``,
#: null by default), so it is counted with ``head_dim`` 128, hidden_size / num_attention_heads
DENSE_2026_COUNTS = {
    "apertus": ({}, 6_979_596_352),
    "arcee": ({}, 4_022_766_080),
    "exaone4": ({}, 9_429_069_824),
    "hunyuan_v1_moe": ({"head_dim": 128}, 13_188_337_664),
    "mimo_v2_flash": ({}, 308_778_768_832),
    "seed_oss": ({}, 28_921_040_896),
}


@pytest.mark.parametrize("model_type", sorted(DENSE_2026_COUNTS))
def test_2026_dense_defaults_give_transformers_parameter_count(model_type):
    changes, count = DENSE_2026_COUNTS[model_type]
    spec = modkit.from_hf_config({"model_type": model_type, **changes})
    assert modkit.count_params(spec) == count


#: (config, the key each error names, what it says): what the 2026 dense types cannot express is refused by name
DENSE_2026_REFUSED = [
    ({"model_type": "llama", "hidden_act": "relu2"}, "hidden_act", "gated FFN takes silu"),
    ({"model_type": "qwen3_moe", "hidden_act": "xielu"}, "hidden_act", "experts take silu"),
    ({"model_type": "hunyuan_v1_moe", "num_experts": [4, 8]}, "num_experts", "one positive integer for every layer"),
    ({"model_type": "exaone4", "sliding_window": None}, "layer_types", "list one type per layer"),
    ({"model_type": "mimo_v2_flash", "num_key_value_heads": 64}, "num_key_value_heads", "twice as many"),
]


@pytest.mark.parametrize(
    "cfg,key,says", DENSE_2026_REFUSED, ids=[f"{c['model_type']}-{k}" for c, k, _ in DENSE_2026_REFUSED]
)
def test_2026_dense_types_refuse_by_key(cfg, key, says):
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf_config(cfg)
    assert [p for p, _ in info.value.errors] == [key] and says in info.value.errors[0][1], info.value.errors


def test_hunyuan_per_layer_lists_of_one_value_read_as_that_value():
    spec = modkit.from_hf_config(
        {"model_type": "hunyuan_v1_moe", "num_hidden_layers": 2, "num_experts": [4, 4], "moe_topk": [2, 2]}
    )
    assert [(spec.layer(i).ffn.n_experts, spec.layer(i).ffn.top_k) for i in range(2)] == [(4, 2), (4, 2)]


def test_exaone4_rotates_every_layer_without_a_window():
    """``sliding_window`` null: no NoPE layer (``Exaone4Attention`` rotates when there is no window)."""
    spec = modkit.from_hf_config(
        {"model_type": "exaone4", "num_hidden_layers": 4, "sliding_window": None, "layer_types": ["full_attention"] * 4}
    )
    assert [spec.layer(i).position.type for i in range(4)] == ["rope"] * 4
    windowed = modkit.from_hf_config({"model_type": "exaone4", "num_hidden_layers": 4, "sliding_window": 8})
    assert [windowed.layer(i).position.type for i in range(4)] == ["rope", "rope", "rope", "none"]
    assert [windowed.layer(i).attention.sliding_window for i in range(4)] == [8, 8, 8, None]


def test_exaone4_with_a_nope_first_layer_exports_its_rope():
    """Layer 0 full (NoPE) and the rest sliding with a RoPE of base 5e5: the export writes the rotating layers' RoPE
    (the RoPE row reads layer 0's position), and the written config converts back to the same network."""
    cfg = transformers.Exaone4Config(
        hidden_size=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=4,
        intermediate_size=48,
        sliding_window=4,
        layer_types=["full_attention"] + ["sliding_attention"] * 3,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
    )
    spec = modkit.from_hf_config(cfg.to_dict())
    assert [spec.layer(i).position.type for i in range(4)] == ["none", "rope", "rope", "rope"]
    written = DECLARED["exaone4"].weights.hf_config(spec, cfg.to_dict())
    assert _same_network(modkit.from_hf_config(written), spec)
