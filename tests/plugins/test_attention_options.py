"""Attention options of today's open models against their transformers modules (float32, same weights, 1e-5).

* gpt-oss: attention sinks, alternating sliding-window and global layers, biases on every projection
  (``GptOssAttention``);
* Llama 4: chunked local attention with interleaved RoPE and the weightless L2 QK-norm on one layer, a NoPE layer
  (``overrides[].position: none``) with attention temperature tuning on the other (``Llama4TextAttention``).

Each runs as a modkit model (full forward, and a prefill then chunks and single tokens through the KV cache, over a
left-padded batch); the attention's recorded input goes through the transformers module over the whole sequence
(its mask from ``transformers.masking_utils``, positions counted over real tokens). Then the helpers and
declarations the options add: the chunk mask, sinks on both attention paths (and their gradient), ``attention_span``
and the ring cache it sizes, exact parameter counts, the ``l2norm`` component, temperature tuning's formula; the
contract kit on configs with the options set (Qwen3-Next's output gate too, whose parity with transformers runs in
``tests/plugins/hf/test_hf_types.py``).
"""

from __future__ import annotations

import math
import re
from typing import Literal, Optional

import pytest
import torch
from pydantic import Field

import modkit
from modkit import AttentionInputs
from tests.hf_layers import CHUNKS, assert_close, hf_mask, left_padded, positions_of, record, set_seeded

transformers = pytest.importorskip("transformers")
T = transformers

VOCAB = 97


def _attention(model, i):
    return model.layers[i].attention


def _spec(attention: dict, *, overrides=(), position=None, n_layers=2) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": VOCAB,
        "d_model": 64,
        "n_layers": n_layers,
        "max_seq_len": 64,
        "position": position or {"type": "rope", "theta": 10000.0},
        "block": {
            "attention": attention,
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "overrides": list(overrides),
        "final_norm": {"type": "rmsnorm"},
    }


def _randomise(model, seed: int, std: float = 0.1) -> None:
    """Attention weights (and sinks) large enough that scores and sinks are O(1)."""
    for i, block in enumerate(model.layers):
        att = block.attention
        set_seeded([p for n, p in att.named_parameters() if n != "sinks"], seed + i, std)
        if att.sinks is not None:
            set_seeded([att.sinks], seed + 100 + i, 1.0)


# ------------------------------------------------------------------------------------------------ gpt-oss

GPT_OSS_ATTN = {
    "type": "gqa",
    "n_heads": 4,
    "n_kv_heads": 2,
    "head_dim": 16,
    "q_bias": True,
    "k_bias": True,
    "v_bias": True,
    "o_bias": True,
    "sinks": True,
}


def _gpt_oss(backend: str):
    attn = {**GPT_OSS_ATTN, "backend": backend}
    spec = _spec(attn, overrides=[{"layers": [0], "attention": {**attn, "sliding_window": 4}}])
    model = modkit.build(spec, seed=0).eval()
    _randomise(model, seed=1)
    cfg = T.GptOssConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        num_hidden_layers=2,
        vocab_size=VOCAB,
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
        attention_bias=True,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    cfg._attn_implementation = "eager"
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding

    refs = []
    for i in range(2):
        ref = GptOssAttention(cfg, i).eval()
        ref.load_state_dict(_attention(model, i).state_dict())  # same names: q/k/v/o_proj and sinks
        refs.append(ref)
    return model, cfg, refs, GptOssRotaryEmbedding(cfg)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize("cached", [False, True], ids=["forward", "cached"])
def test_gpt_oss_attention_equals_transformers(backend, cached):
    model, cfg, refs, rotary = _gpt_oss(backend)
    ids, mask = left_padded(2, 12, pad=3, vocab=VOCAB, seed=2)
    got = record(model, _attention, ids, mask, CHUNKS if cached else None)
    pos = positions_of(mask)
    for i, ref in enumerate(refs):
        x, out = got[i]
        kind = "sliding" if i == 0 else "causal"
        with torch.no_grad():
            want, _ = ref(x, position_embeddings=rotary(x, pos), attention_mask=hf_mask(kind, cfg, x, mask))
        assert_close(out, want, mask, f"layer {i} ({kind}, {backend}, {'cached' if cached else 'forward'})")
    assert model.windows == [4, None]


def test_gpt_oss_sinks_take_probability_mass():
    """The sinks change the output (the comparison above is not vacuous) and, very negative, vanish."""
    model, _, _, _ = _gpt_oss("sdpa")
    ids, mask = left_padded(2, 12, pad=0, vocab=VOCAB, seed=3)
    base = record(model, _attention, ids, mask)[1][1]
    with torch.no_grad():
        model.layers[1].attention.sinks.fill_(-1e4)
        no_sink = record(model, _attention, ids, mask)[1][1]
        model.layers[1].attention.sinks = None
        plain = record(model, _attention, ids, mask)[1][1]
    assert (base - plain).abs().max() > 1e-2
    assert torch.allclose(no_sink, plain, atol=1e-6)


# ------------------------------------------------------------------------------------------------ Llama 4

CHUNK = 4


def _llama4():
    rope_attn = {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "attention_chunk_size": CHUNK,
        "qk_norm": {"type": "l2norm", "eps": 1e-5},
    }
    nope_attn = {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "head_dim": 16,
        "temperature_tuning": {"floor_scale": 3, "attn_scale": 0.5},
    }
    spec = _spec(
        rope_attn,
        position={"type": "rope", "theta": 500000.0, "layout": "interleaved"},
        overrides=[{"layers": [1], "attention": nope_attn, "position": {"type": "none"}}],
    )
    model = modkit.build(spec, seed=0).eval()
    _randomise(model, seed=4, std=0.15)
    cfg = T.Llama4TextConfig(
        hidden_size=64,
        intermediate_size=32,
        intermediate_size_mlp=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        use_qk_norm=True,
        no_rope_layers=[1, 0],
        attention_chunk_size=CHUNK,
        attn_temperature_tuning=True,
        floor_scale=3,
        attn_scale=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        moe_layers=[],
    )
    cfg._attn_implementation = "eager"
    assert cfg.layer_types == ["chunked_attention", "full_attention"]
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    refs = []
    for i in range(2):
        ref = Llama4TextAttention(cfg, i).eval()
        ref.load_state_dict(_attention(model, i).state_dict())
        refs.append(ref)
    return model, cfg, refs, Llama4TextRotaryEmbedding(cfg)


@pytest.mark.parametrize("cached", [False, True], ids=["forward", "cached"])
@pytest.mark.parametrize("pad", [0, 3])
def test_llama4_chunked_and_nope_attention_equal_transformers(cached, pad):
    """12 tokens in chunks of 4 (the mask and the 4-slot ring both matter), temperature floor_scale 3 (it grows
    within the sequence). transformers scales the NoPE layer's queries by their cache index, which counts left
    padding; modkit by the token's position: with padding, that layer is compared on the unpadded row only."""
    model, cfg, refs, rotary = _llama4()
    ids, mask = left_padded(2, 12, pad=pad, vocab=VOCAB, seed=5)
    got = record(model, _attention, ids, mask, CHUNKS if cached else None)
    pos = positions_of(mask)
    for i, ref in enumerate(refs):
        x, out = got[i]
        kind = "chunked" if i == 0 else "causal"
        with torch.no_grad():
            want, _ = ref(x, position_embeddings=rotary(x, pos), attention_mask=hf_mask(kind, cfg, x, mask))
        rows = mask.clone()
        if i == 1 and pad:
            rows[0] = 0
        assert_close(out, want, rows, f"layer {i} ({kind}, pad {pad}, {'cached' if cached else 'forward'})")
    assert model.windows == [CHUNK, None]


def test_temperature_tuning_is_llama4_formula():
    m = _attention(_llama4()[0], 1)
    q = torch.ones(1, 1, 5, 2)
    pos = torch.tensor([[0, 1, 2, 5, 100]])
    got = m._tune_temperature(q, pos)[0, 0, :, 0]
    want = [math.log(math.floor((p + 1) / 3) + 1) * 0.5 + 1 for p in pos[0].tolist()]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert got[:2].tolist() == [1.0, 1.0]  # no change before floor_scale - 1


def test_l2norm_equals_llama4_l2norm_and_has_no_parameters():
    from transformers.models.llama4.modeling_llama4 import Llama4TextL2Norm

    spec = _spec({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "l2norm", "eps": 1e-5}})
    model = modkit.build(spec)
    att = model.layers[0].attention
    x = torch.randn(2, 4, 3, 16) * 3
    assert torch.equal(att.q_norm(x), Llama4TextL2Norm(1e-5)(x))
    assert sum(p.numel() for p in att.parameters()) == 64 * 64 * 2 + 64 * 32 * 2
    assert modkit.count_params(spec) == sum(p.numel() for p in model.parameters())
    assert torch.allclose(att.q_norm(x).pow(2).mean(-1), torch.ones(2, 4, 3), atol=1e-4)


# ------------------------------------------------------------------------------------------------ helpers, counts


def test_chunk_mask_from_positions():
    q = torch.arange(6)[None]
    mask = modkit.attention_mask(q, q, None, causal=True, chunk=3)[0, 0].int().tolist()
    assert mask == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 1, 1, 0],
        [0, 0, 0, 1, 1, 1],
    ]
    both = modkit.attention_mask(q, q, None, causal=True, window=2, chunk=3)[0, 0].int().tolist()
    assert both[2] == [0, 1, 1, 0, 0, 0] and both[4] == [0, 0, 0, 1, 1, 0]
    bidir = modkit.attention_mask(q, q, None, causal=False, chunk=4)[0, 0].int().tolist()
    assert bidir[1] == [1, 1, 1, 1, 0, 0] and bidir[5] == [0, 0, 0, 0, 1, 1]
    # decode: the query at position 7 of chunk 4..7 sees keys 4..7 only, bottom-right aligned
    k = torch.arange(8)[None]
    assert modkit.attention_mask(torch.tensor([[7]]), k, None, chunk=4)[0, 0, 0].int().tolist() == [
        0,
        0,
        0,
        0,
        1,
        1,
        1,
        1,
    ]


@pytest.mark.parametrize("bias", [False, True])
def test_sinks_sdpa_path_equals_eager_path_and_gets_gradient(bias):
    torch.manual_seed(0)
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    qp, kp = torch.arange(2, 7)[None].expand(2, 5), torch.arange(7)[None].expand(2, 7)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[0, :3] = False  # row 0: left padding, its first query sees no key
    mask = modkit.attention_mask(qp, kp, valid, window=3)
    sinks = torch.randn(4, requires_grad=True)
    extra = torch.randn(2, 4, 5, 7) if bias else None
    out_e, w = modkit.masked_attention(q, k, v, mask, extra, 0.3, eager=True, sinks=sinks)
    out_s, _ = modkit.masked_attention(q, k, v, mask, extra, 0.3, eager=False, sinks=sinks)
    assert torch.allclose(out_e, out_s, atol=1e-6)
    live = mask.any(-1)[:, 0][:, None].expand(2, 4, 5)  # [b, h, q]: the query sees a key
    assert int((~live).sum()) == 4  # row 0's first query, in each of the 4 heads
    sums = w.sum(-1)  # 1 - p_sink where the query sees a key, 0 where it sees none
    assert (sums[live] < 1 - 1e-4).all() and (sums[live] > 0).all() and torch.equal(sums[~live], torch.zeros(4))
    assert torch.equal(out_e[~live], torch.zeros(4, 8)) and torch.equal(out_s[~live], torch.zeros(4, 8))
    out_s.sum().backward()
    grad_s = sinks.grad.clone()
    sinks.grad = None
    out_e.sum().backward()
    assert torch.isfinite(grad_s).all() and grad_s.abs().min() > 0
    assert torch.allclose(grad_s, sinks.grad, atol=1e-5)


def test_sinks_parameter_count_init_and_tp_plan():
    spec = _spec({**GPT_OSS_ATTN})
    model = modkit.build(spec, seed=3)
    att = model.layers[0].attention
    assert att.sinks.shape == (4,)
    assert modkit.count_params(spec) == sum(p.numel() for p in model.parameters())
    plain = _spec({**GPT_OSS_ATTN, "sinks": False})
    assert modkit.count_params(spec) - modkit.count_params(plain) == 2 * 4
    plan = modkit.get_registry().get("attention", "gqa").capabilities["tp_plan"]
    assert plan["sinks"] == "heads"
    # drawn N(0, init_std) by the seeded init: the same seed gives the same logits, another seed others
    assert torch.equal(modkit.build(spec, seed=3).layers[0].attention.sinks, att.sinks)
    assert not torch.equal(modkit.build(spec, seed=4).layers[0].attention.sinks, att.sinks)
    wide = modkit.build({**spec, "init_std": 1.0}, seed=3).layers[0].attention.sinks
    assert torch.allclose(wide * 0.02, att.sinks)  # proportional to init_std: one standard normal draw


def test_attention_span_sizes_the_ring():
    spec = _spec(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "attention_chunk_size": 8},
        overrides=[
            {
                "layers": [1],
                "attention": {
                    "type": "gqa",
                    "n_heads": 4,
                    "n_kv_heads": 2,
                    "attention_chunk_size": 8,
                    "sliding_window": 5,
                },
            }
        ],
    )
    model = modkit.build(spec)
    assert [b.attention.attention_span for b in model.layers] == [8, 5]
    cache = model.new_cache(1, 64)
    assert [layer.only.slots for layer in cache.layers] == [8, 5]
    assert cache.nbytes() == 2 * 2 * 16 * 4 * (8 + 5)  # k and v, 2 kv heads of 16, float32, 8 + 5 slots


def test_chunked_cost_counts_only_pairs_within_a_chunk():
    from modkit.analysis.cost import CostModel, Workload

    spec = _spec({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "attention_chunk_size": 8})
    full = _spec({"type": "gqa", "n_heads": 4, "n_kv_heads": 2})
    per_layer = 2 * 2 * 4 * 16  # scores and weighted sum, 4 heads of 16
    cost, ref = CostModel(spec), CostModel(full)
    w = Workload(1, 20, 0)
    # chunks of 8, 8, 4 tokens: 36 + 36 + 10 causal pairs; against 210 without chunks
    diff = sum(ref.flops(w).values()) - sum(cost.flops(w).values())
    assert diff == 2 * per_layer * (210 - 82)
    decode = Workload(1, 1, 19)  # position 19, offset 3 in its chunk: 4 keys
    assert sum(ref.flops(decode).values()) - sum(cost.flops(decode).values()) == 2 * per_layer * (20 - 4)


def test_each_head_qk_norm_needs_the_groups_capability():
    bad = _spec(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "layernorm"}, "qk_norm_scope": "each_head"}
    )
    model = modkit.build(bad)
    assert model.layers[0].attention.q_norm.weight.shape == (4, 16)
    assert model.layers[0].attention.k_norm.bias.shape == (2, 16)
    assert modkit.count_params(bad) == sum(p.numel() for p in model.parameters())


def test_each_head_refuses_a_norm_without_groups():
    from modkit import Component, ComponentConfig, elementwise
    from tests.conftest import registry_with

    class Plain(ComponentConfig):
        type: Literal["plainnorm"] = "plainnorm"

    reg = registry_with(
        "plain",
        Component(
            kind="norm",
            type="plainnorm",
            config=Plain,
            factory=lambda c, x: torch.nn.Identity(),
            description="identity",
            flops=elementwise("nothing"),
        ),
    )
    spec = _spec(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "plainnorm"}, "qk_norm_scope": "each_head"}
    )
    with pytest.raises(modkit.SpecError, match="groups"):
        modkit.load_spec(spec, registry=reg)


def test_nope_override_leaves_rope_on_the_other_layers():
    """``overrides[].position: none`` on layer 1: layer 0 rotates, layer 1 does not, and the spec validates."""
    spec = _spec(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}, overrides=[{"layers": [1], "position": {"type": "none"}}]
    )
    model = modkit.build(spec, seed=0).eval()
    schemes = [type(model.positions[model.layer_position[i]]).__name__ for i in range(2)]
    assert schemes == ["Rope", "NoPosition"]
    q = torch.randn(1, 4, 3, 16)
    att_in = AttentionInputs(positions=torch.arange(3)[None] + 5)
    rot = model.positions[model.layer_position[1]].rotate(q, q[:, :2], att_in.positions)
    assert torch.equal(rot[0], q)


# ------------------------------------------------------------------------------------------------ the contract kit

KIT_CONFIGS = {
    "sinks": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sinks": True, "q_bias": True, "o_bias": True},
    "chunked-l2": {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "attention_chunk_size": 6,
        "qk_norm": {"type": "l2norm"},
    },
    "temperature": {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "temperature_tuning": {"floor_scale": 4, "attn_scale": 0.5},
    },
    "all-eager": {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "sinks": True,
        "sliding_window": 5,
        "attention_chunk_size": 6,
        "qk_norm": {"type": "layernorm", "bias": False},
        "qk_norm_scope": "each_head",
        "backend": "eager",
    },
    # Qwen3-Next's gated attention: the output gate (its projection with q_proj's bias) and a per-head QK-norm
    "output-gate": {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "output_gate": True,
        "q_bias": True,
        "qk_norm": {"type": "rmsnorm", "unit_offset": True},
    },
    # LFM3's gate: one sigmoid per head (gate_proj [n_heads, d_model]), no bias beside q_proj's
    "head-gate": {
        "type": "gqa",
        "n_heads": 4,
        "n_kv_heads": 2,
        "output_gate": True,
        "output_gate_scope": "head",
        "q_bias": True,
        "gate_bias": False,
    },
}
#: the kit's checks minus the slow ones (compile: see the closing note; shards: distributed)
KIT_CHECKS = (
    "shape_dtype",
    "gradients",
    "causality",
    "kv_cache_decode",
    "masked_row",
    "gqa_equals_mha",
    "meta_init",
    "param_count",
    "flops",
)


@pytest.mark.parametrize("name", list(KIT_CONFIGS))
def test_contract_kit_passes_the_options(name):
    """The kit on configs with the options set: cached decode (also with a window, a chunk and sinks added where
    unset), padding rows, causality, exact parameter count, FLOPs against FlopCounterMode (the sinks' extra column on
    the SDPA path included)."""
    from modkit.testing import check_component

    results = check_component("attention", "gqa", KIT_CONFIGS[name], checks=KIT_CHECKS)
    failed = [f"{r.check}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, failed
    passed = {r.check for r in results if r.status == "passed"}
    assert {"kv_cache_decode", "masked_row", "param_count", "flops", "causality"} <= passed
    kv = next(r for r in results if r.check == "kv_cache_decode").detail
    if name == "sinks":  # the kit adds the options the config leaves unset
        assert "sliding_window 16 and attention_chunk_size 12" in kv
    if name == "all-eager":
        assert "and sinks" not in kv and "attention_chunk_size 12" not in kv


class _FaultyConfig(modkit.ComponentConfig):
    """Config of the faulty test attentions: each forgets one option on the cached path only."""

    type: Literal["chunk_forgotten", "sinks_forgotten"]
    n_heads: int = Field(4, description="heads")
    attention_chunk_size: Optional[int] = Field(None, description="chunk of positions a query sees")
    sinks: bool = Field(False, description="a sink logit per head")


class _FaultyAttention(torch.nn.Module):
    """Multi-head attention from modkit's helpers that drops the chunk mask (or the sinks) once it decodes against
    cached keys: a full forward is right, cached decoding is not (a fault only the options' cache runs can see)."""

    def __init__(self, cfg: _FaultyConfig, d_model: int):
        super().__init__()
        self.fault = cfg.type
        self.n_heads = self.n_kv_heads = cfg.n_heads
        self.head_dim = d_model // cfg.n_heads
        self.sliding_window, self.attention_chunk_size = None, cfg.attention_chunk_size
        self.sinks = torch.nn.Parameter(torch.empty(cfg.n_heads)) if cfg.sinks else None
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    @property
    def attention_span(self):
        return self.attention_chunk_size

    def init_weights(self, init) -> None:
        if self.sinks is not None:
            init.normal_(self.sinks, std=1.0)

    def forward(self, x, inputs):
        b, s, _ = x.shape
        q, k, v = (f(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        if inputs.position is not None:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v)
        against_cache = k.shape[2] > s
        chunk = None if self.fault == "chunk_forgotten" and against_cache else self.attention_chunk_size
        sinks = None if self.fault == "sinks_forgotten" and against_cache else self.sinks
        mask = modkit.attention_mask(inputs.positions, k_pos, k_valid, chunk=chunk)
        out, _ = modkit.masked_attention(q, k, v, mask, None, None, sinks=sinks)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("fault,option", [("chunk_forgotten", "attention_chunk_size 12"), ("sinks_forgotten", "sinks")])
def test_kit_cache_check_catches_an_option_forgotten_in_the_cached_path(fault, option):
    from modkit.testing import check_component
    from tests.conftest import registry_with

    reg = registry_with(
        "faulty",
        modkit.Component(
            kind="attention",
            type=fault,
            config=_FaultyConfig,
            factory=lambda cfg, ctx: _FaultyAttention(cfg, ctx.d_model),
            description="test attention with a cached-path fault",
            capabilities={"causal_safe": True, "kv_cache": True},
            example={"type": fault},
        ),
    )
    (result,) = check_component("attention", fault, registry=reg, checks=["kv_cache_decode"])
    assert result.status == "failed", result.detail
    failing = re.findall(r"with position ([^:]+):", result.detail)
    assert failing and all(option in label for label in failing), failing  # only the runs with the option fail
