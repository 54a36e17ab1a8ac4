"""RoPE frequency scalings: exact values of each (linear, llama3, dynamic NTK, YaRN, LongRoPE), odd rotary widths
refused, and parity with transformers at lengths inside and beyond the trained length, and under the KV cache."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import modkit
from modkit import BuildContext, Init

ATOL = 1e-5


@pytest.fixture(scope="module")
def reg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.get_registry()


def rope(reg, scaling, head_dim=8, theta=1e4, partial=1.0, max_seq_len=64):
    entry = reg.get("position", "rope")
    cfg = modkit.load_component(
        "position", {"type": "rope", "theta": theta, "partial_rotary": partial, "scaling": scaling}, registry=reg
    )
    module = BuildContext(16, 1, 32, max_seq_len, reg, head_dim=head_dim).build(cfg)
    module.init_weights(Init(0, 0.02))
    assert entry.config is type(cfg)
    return module


def pairs(module, length: int) -> list[float]:
    """The inverse frequency of each rotated pair for a call reaching ``length`` positions (half_split layout)."""
    freq = module.frequencies(torch.arange(length)[None])
    return freq[module.rotary_dim // 2 :].tolist()


# head_dim 8, theta 1e4: the unscaled inverse frequencies are exactly 1, 0.1, 0.01, 0.001
PLAIN = [1.0, 0.1, 0.01, 0.001]


def test_unscaled_and_linear(reg):
    assert pairs(rope(reg, None), 5) == pytest.approx(PLAIN, rel=1e-6)
    assert pairs(rope(reg, {"type": "linear", "factor": 4.0}), 5) == pytest.approx(
        [0.25, 0.025, 0.0025, 0.00025], rel=1e-6
    )


def test_dynamic_ntk_grows_the_base_beyond_the_trained_length_only(reg):
    m = rope(reg, {"type": "dynamic", "factor": 2.0, "original_max_seq_len": 16})
    assert pairs(m, 10) == pytest.approx(PLAIN, rel=1e-6)
    assert pairs(m, 16) == pytest.approx(PLAIN, rel=1e-6)  # up to the trained length: theta unchanged
    # L = 32: base = 1e4 · (2 · 32 / 16 - 1) ** (8 / 6) = 1e4 · 3^(4/3), so pair i is 1e4^(-i/4) · 3^(-i/3)
    assert pairs(m, 32) == pytest.approx([1.0, 0.1 * 3 ** (-1 / 3), 0.01 * 3 ** (-2 / 3), 0.001 / 3], rel=1e-6)
    assert pairs(m, 32)[1] == pytest.approx(0.0693361, abs=1e-7)
    assert m.attention_scale == 1.0


def test_yarn_ramp_and_default_attention_factor(reg):
    # d = 8, theta 1e4, trained 16: beta_fast = 32 rotations falls below dimension 0 and beta_slow = 1 at 0.41, so
    # the ramp runs over [0, 1]: pair 0 is kept, the others are divided by the factor
    m = rope(reg, {"type": "yarn", "factor": 4.0, "original_max_seq_len": 16})
    assert pairs(m, 5) == pytest.approx([1.0, 0.025, 0.0025, 0.00025], rel=1e-6)
    assert pairs(m, 100) == pairs(m, 5)  # static
    assert m.attention_scale == pytest.approx(0.1 * math.log(4) + 1)  # 1.138629
    assert m.attention_scale == pytest.approx(1.1386294, abs=1e-7)
    # cos and sin carry the factor: a rotated vector's norm grows by it
    x = torch.randn(1, 1, 3, 8, generator=torch.Generator().manual_seed(0))
    q, _ = m.rotate(x, x, torch.tensor([[0, 7, 40]]))
    torch.testing.assert_close(q.norm(dim=-1), x.norm(dim=-1) * m.attention_scale, atol=1e-5, rtol=0)


def test_yarn_attention_factor_forms(reg):
    explicit = rope(reg, {"type": "yarn", "factor": 4.0, "original_max_seq_len": 16, "attention_factor": 1.5})
    assert explicit.attention_scale == 1.5
    deepseek = rope(
        reg, {"type": "yarn", "factor": 40.0, "original_max_seq_len": 16, "mscale": 1.0, "mscale_all_dim": 0.707}
    )
    assert deepseek.attention_scale == pytest.approx((0.1 * math.log(40) + 1) / (0.1 * 0.707 * math.log(40) + 1))
    only_one = rope(reg, {"type": "yarn", "factor": 40.0, "original_max_seq_len": 16, "mscale": 0.707})
    assert only_one.attention_scale == pytest.approx(0.1 * math.log(40) + 1)  # both mscales are needed
    assert rope(reg, {"type": "yarn", "factor": 1.0, "original_max_seq_len": 16}).attention_scale == 1.0


def test_yarn_wider_ramp(reg):
    # d = 16, theta 1e4, trained 2048, betas 32 / 1: 32 rotations at dimension 2.016, 1 rotation at 5.026, so the
    # truncated ramp runs over [floor 2.016, ceil 5.026] = [2, 6]
    m = rope(reg, {"type": "yarn", "factor": 8.0, "original_max_seq_len": 2048}, head_dim=16)
    plain = [1e4 ** (-i / 8) for i in range(8)]
    ramp = [min(max((i - 2) / 4, 0), 1) for i in range(8)]
    expected = [p / 8 * r + p * (1 - r) for p, r in zip(plain, ramp)]
    assert pairs(m, 3) == pytest.approx(expected, rel=1e-6)
    untruncated = rope(
        reg, {"type": "yarn", "factor": 8.0, "original_max_seq_len": 2048, "truncate": False}, head_dim=16
    )
    low = 16 * math.log(2048 / (32 * 2 * math.pi)) / (2 * math.log(1e4))
    high = 16 * math.log(2048 / (2 * math.pi)) / (2 * math.log(1e4))
    ramp = [min(max((i - low) / (high - low), 0), 1) for i in range(8)]
    assert pairs(untruncated, 3) == pytest.approx([p / 8 * r + p * (1 - r) for p, r in zip(plain, ramp)], rel=1e-6)


def test_longrope_short_and_long_factors(reg):
    sc = {
        "type": "longrope",
        "short_factor": [1.0, 2.0, 4.0, 8.0],
        "long_factor": [1.0, 4.0, 16.0, 64.0],
        "original_max_seq_len": 16,
    }
    m = rope(reg, sc, max_seq_len=512)
    assert pairs(m, 16) == pytest.approx([1.0, 0.05, 0.0025, 0.000125], rel=1e-6)
    assert pairs(m, 17) == pytest.approx([1.0, 0.025, 0.000625, 0.000015625], rel=1e-6)
    # default factor = max_seq_len / trained = 32: sqrt(1 + ln 32 / ln 16) = sqrt(1 + 5/4) = 1.5
    assert m.attention_scale == pytest.approx(1.5)
    assert rope(reg, {**sc, "factor": 4.0}, max_seq_len=512).attention_scale == pytest.approx(
        math.sqrt(1 + math.log(4) / math.log(16))
    )
    assert rope(reg, {**sc, "attention_factor": 1.25}).attention_scale == 1.25
    assert rope(reg, sc, max_seq_len=16).attention_scale == 1.0  # factor 1


def test_phi3_128k_attention_factor(reg):
    """Phi-3 mini 128k: trained 4096, max 131072, so factor 32 and sqrt(1 + ln 32 / ln 4096) = sqrt(17 / 12)."""
    sc = {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [1.0] * 48, "original_max_seq_len": 4096}
    assert rope(reg, sc, head_dim=96, max_seq_len=131072).attention_scale == pytest.approx(math.sqrt(17 / 12))


def test_dynamic_and_longrope_choose_by_the_longest_position_of_the_batch(reg):
    m = rope(reg, {"type": "dynamic", "factor": 2.0, "original_max_seq_len": 16})
    short_row_in_long_batch = torch.tensor([[0, 1, 2], [29, 30, 31]])
    assert m.frequencies(short_row_in_long_batch)[4:].tolist() == pytest.approx(pairs(m, 32), rel=1e-6)


def spec(position: dict, d_model=16, n_heads=4) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 32,
        "d_model": d_model,
        "n_layers": 1,
        "max_seq_len": 64,
        "position": position,
        "block": {
            "attention": {"type": "mha", "n_heads": n_heads},
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }


@pytest.mark.parametrize(
    "d_model,n_heads,partial,field,width",
    [
        (100, 4, 1.0, "position", 25),
        (16, 4, 0.75, "position.partial_rotary", 3),
        (16, 4, 0.4, "position.partial_rotary", 1),
    ],
)
def test_odd_rotary_width_is_a_spec_error(reg, d_model, n_heads, partial, field, width):
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(spec({"type": "rope", "partial_rotary": partial}, d_model, n_heads), registry=reg)
    ((path, msg),) = info.value.errors
    assert path == field
    assert f"rotary width of {width}" in msg and "head_dim" in msg
    if partial != 1.0:
        assert "partial_rotary" in msg


def test_odd_width_in_an_override_names_the_override(reg):
    s = spec({"type": "rope"})
    s["overrides"] = [{"layers": [0], "position": {"type": "rope", "partial_rotary": 0.75}}]
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(s, registry=reg)
    assert [p for p, _ in info.value.errors] == ["overrides[0].position.partial_rotary"]


def test_rope_module_refuses_an_odd_width_built_directly(reg):
    from modkit_plugins.position import Rope, RopeConfig

    with pytest.raises(ValueError, match=r"int\(4 × 0.75\) = 3"):
        Rope(RopeConfig(partial_rotary=0.75), head_dim=4)


# ------------------------------------------------------------------------------------------------ transformers parity

transformers = pytest.importorskip("transformers")
T = transformers

BASE = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=2,
    intermediate_size=96,
    vocab_size=97,
    max_position_embeddings=16,
)
SCALINGS = [
    (
        "linear",
        T.LlamaConfig,
        dict(BASE, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    ),
    (
        "llama3",
        T.LlamaConfig,
        dict(
            BASE,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8,
                "rope_theta": 500000.0,
            },
        ),
    ),
    (
        "dynamic",
        T.LlamaConfig,
        dict(BASE, rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}),
    ),
    (
        "yarn",
        T.LlamaConfig,
        dict(
            BASE,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "rope_theta": 10000.0,
            },
        ),
    ),
    (
        "yarn-explicit-factor",
        T.Qwen2Config,
        dict(
            BASE,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "attention_factor": 1.3,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "rope_theta": 10000.0,
            },
        ),
    ),
    (
        "yarn-mscale",
        T.LlamaConfig,
        dict(
            BASE,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 8,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
                "rope_theta": 10000.0,
            },
        ),
    ),
    (
        "longrope",
        T.Phi3Config,
        dict(
            BASE,
            partial_rotary_factor=0.5,
            original_max_position_embeddings=8,
            pad_token_id=0,
            eos_token_id=1,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0, 1.2, 1.5, 2.0],
                "long_factor": [1.0, 2.0, 4.0, 8.0],
                "rope_theta": 10000.0,
            },
        ),
    ),
]


def _pair(cls, kwargs, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(cls(**kwargs), attn_implementation="eager").eval()
        with torch.no_grad():
            for p in hf.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        hf.save_pretrained(tmp_path)
    return hf, modkit.from_hf(tmp_path)


@pytest.mark.parametrize("name,cls,kwargs", SCALINGS, ids=[c[0] for c in SCALINGS])
def test_parity_inside_and_beyond_the_trained_length_and_under_the_cache(name, cls, kwargs, tmp_path):
    hf, model = _pair(cls, kwargs, tmp_path)
    ids = torch.randint(1, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers renames past_key_values
        for length in (6, 16, 24):  # within, at and beyond max_position_embeddings (16; some trained lengths are 8)
            diff = (hf(ids[:, :length]).logits - model(ids[:, :length]).logits).abs().max().item()
            assert diff <= ATOL, f"{name} at length {length}: {diff:.3e}"
        # prefill 4 tokens, then one at a time past the trained length, with each side's own cache
        out = hf(ids[:, :4], use_cache=True)
        theirs, past = [out.logits], out.past_key_values
        cache = model.new_cache(2, 24)
        ours = [model(ids[:, :4], cache=cache).logits]
        for t in range(4, 24):
            out = hf(ids[:, t : t + 1], past_key_values=past, use_cache=True)
            theirs.append(out.logits)
            past = out.past_key_values
            ours.append(model(ids[:, t : t + 1], cache=cache).logits)
        diff = (torch.cat(theirs, 1) - torch.cat(ours, 1)).abs().max().item()
    print(f"\n[rope parity] {name:22s} cached decode to 24 positions: max|modkit - hf| = {diff:.3e}")
    assert diff <= ATOL, f"{name} cached: {diff:.3e}"


def test_greedy_generation_with_yarn_equals_transformers(tmp_path):
    from modkit.inference.generate import generate

    hf, model = _pair(T.LlamaConfig, SCALINGS[3][2], tmp_path)
    ids = torch.randint(1, 97, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # 5 + 11 tokens: up to max_seq_len (16), past the trained length (8); generate refuses runs past max_seq_len
        theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=11, do_sample=False)
    assert torch.equal(generate(model, ids, max_new_tokens=11, temperature=0), theirs)
