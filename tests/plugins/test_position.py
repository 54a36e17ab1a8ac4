"""Position schemes: RoPE layouts and frequencies, sinusoidal, ALiBi, meta builds, partial rotary, cached decode."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import modkit
from modkit import AttentionInputs, BuildContext, Init
from modkit_plugins.position import (
    Alibi,
    Learned,
    Rope,
    LinearScaling,
    Llama3Scaling,
    Sinusoidal,
    alibi_slopes,
    rope_inv_freq,
    sinusoidal_table,
)

ATOL = 1e-5


@pytest.fixture(scope="module")
def reg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.get_registry()


def ctx(reg, **kw) -> BuildContext:
    base = dict(d_model=16, n_layers=2, vocab_size=32, max_seq_len=64)
    base.update(kw)
    return BuildContext(registry=reg, **base)


def make(reg, config: dict, **kw):
    """Build a position scheme through the registry (as the model does) and initialise it."""
    entry = reg.get("position", config["type"])
    module = ctx(reg, **kw).build(entry.config(**config))
    if hasattr(type(module), "init_weights"):
        module.init_weights(Init(0, 0.02))
    return module


def spec(position: dict, **kw) -> dict:
    s = {
        "schema_version": 1,
        "vocab_size": 32,
        "d_model": 16,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": position,
        "block": {
            "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }
    s.update(kw)
    return s


# ------------------------------------------------------------------------------------------------ registry


@pytest.mark.parametrize(
    "name, acts_on",
    [("none", "none"), ("rope", "qk"), ("sinusoidal", "embedding"), ("learned", "embedding"), ("alibi", "bias")],
)
def test_entries_declare_where_they_act(reg, name, acts_on):
    e = reg.get("position", name)
    assert e.kind == "position"
    assert e.capabilities["acts_on"] == acts_on
    assert e.capabilities["compile_safe"] is True
    assert e.description and e.reference and e.param_count is not None


@pytest.mark.parametrize(
    "position, expected",
    [
        ({"type": "learned"}, 64 * 16),
        ({"type": "sinusoidal"}, 0),
        ({"type": "alibi"}, 0),
        ({"type": "rope"}, 0),
        ({"type": "none"}, 0),
    ],
)
def test_param_count_declared_equals_built(reg, position, expected):
    s = modkit.load_spec(spec(position), registry=reg)
    entry = reg.entry_for_config(s.position)
    declared = entry.param_count(s.position, ctx(reg, n_heads=4, head_dim=4))
    assert declared == expected
    assert modkit.breakdown(s)["position"] == expected


# ------------------------------------------------------------------------------------------------ RoPE layout


def _e1_at_1(rope: Rope) -> torch.Tensor:
    x = torch.zeros(1, 1, 1, 8)
    x[..., 1] = 1.0
    q, k = rope.rotate(x, x.clone(), torch.tensor([[1]]))
    assert torch.equal(q, k)
    return q.flatten()


def test_c01_interleaved_e1(reg):
    rope = make(reg, {"type": "rope", "theta": 1e4, "layout": "interleaved"}, head_dim=8)
    expected = torch.zeros(8)
    expected[0], expected[1] = -0.841471, 0.540302
    torch.testing.assert_close(_e1_at_1(rope), expected, atol=ATOL, rtol=0)


def test_c01_half_split_e1(reg):
    rope = make(reg, {"type": "rope", "theta": 1e4, "layout": "half_split"}, head_dim=8)
    expected = torch.zeros(8)
    expected[1], expected[5] = 0.995004, 0.099833
    torch.testing.assert_close(_e1_at_1(rope), expected, atol=ATOL, rtol=0)


def test_c01_layouts_differ_by_permutation(reg):
    half = make(reg, {"type": "rope", "layout": "half_split"}, head_dim=8)
    inter = make(reg, {"type": "rope", "layout": "interleaved"}, head_dim=8)
    P = torch.tensor([0, 2, 4, 6, 1, 3, 5, 7])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 8, generator=g)
    pos = torch.randint(0, 1000, (2, 5), generator=g)
    a, _ = half.rotate(x[..., P], x[..., P], pos)
    b, _ = inter.rotate(x, x, pos)
    torch.testing.assert_close(a, b[..., P], atol=ATOL, rtol=0)
    assert not torch.allclose(half.rotate(x, x, pos)[0], b, atol=1e-3)  # the layouts really differ


def test_c01_checkpoint_conversion_reproduces_logits(reg):
    """Permuting the rows of Wq and Wk per head with P converts an interleaved checkpoint to half_split."""
    hd, n_heads, n_kv = 4, 4, 2
    inter = modkit.build(spec({"type": "rope", "layout": "interleaved"}), seed=3, registry=reg)
    half = modkit.build(spec({"type": "rope", "layout": "half_split"}), seed=9, registry=reg)
    P = torch.cat([torch.arange(0, hd, 2), torch.arange(1, hd, 2)])
    sd = copy.deepcopy(inter.state_dict())
    for key in list(sd):
        for proj, heads in (("q_proj", n_heads), ("k_proj", n_kv)):
            if key.endswith(f"attention.{proj}.weight"):
                rows = torch.cat([h * hd + P for h in range(heads)])
                sd[key] = sd[key][rows]
    half.load_state_dict(sd)
    ids = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(1))
    a, b = inter(ids).logits, half(ids).logits
    torch.testing.assert_close(b, a, atol=ATOL, rtol=0)
    assert not torch.allclose(
        half(ids).logits,
        modkit.build(spec({"type": "rope", "layout": "half_split"}), seed=3, registry=reg)(ids).logits,
        atol=1e-4,
    )


# ------------------------------------------------------------------------------------------------ RoPE frequencies


def _llama3(factor: float) -> Llama3Scaling:
    return Llama3Scaling(type="llama3", factor=factor, low_freq_factor=1, high_freq_factor=4, original_max_seq_len=8192)


def test_c02_llama3_scaling_bands(reg):
    plain = rope_inv_freq(64, 5e5, None)
    scaled = rope_inv_freq(64, 5e5, _llama3(32))
    assert plain.shape == scaled.shape == (32,)
    assert torch.equal(scaled[:15], plain[:15])
    assert torch.equal(scaled[18:], plain[18:] / 32)
    ratio = plain[15:18].double() / scaled[15:18].double()
    torch.testing.assert_close(
        ratio, torch.tensor([1.651329, 3.292262, 9.666729], dtype=torch.float64), atol=2e-6, rtol=0
    )
    ratio8 = plain[15:18].double() / rope_inv_freq(64, 5e5, _llama3(8))[15:18].double()
    torch.testing.assert_close(
        ratio8, torch.tensor([1.553415, 2.694530, 5.257327], dtype=torch.float64), atol=2e-6, rtol=0
    )


def test_c02_frequencies_come_from_the_spec(reg):
    """The built module's buffer follows theta and scaling from the spec, after a meta build."""
    rope = make(reg, {"type": "rope", "theta": 1e6}, head_dim=128)
    assert rope.inv_freq.shape == (64,)
    assert rope.inv_freq[1].item() == pytest.approx(0.805842, abs=1e-6)
    scaled = make(
        reg,
        {
            "type": "rope",
            "theta": 5e5,
            "scaling": {
                "type": "llama3",
                "factor": 32,
                "low_freq_factor": 1,
                "high_freq_factor": 4,
                "original_max_seq_len": 8192,
            },
        },
        head_dim=64,
    )
    assert torch.equal(scaled.inv_freq, rope_inv_freq(64, 5e5, _llama3(32)))
    s = spec(
        {"type": "rope", "theta": 1e6},
        d_model=32,
        block={**spec({})["block"], "attention": {"type": "gqa", "n_heads": 2, "n_kv_heads": 1}},
    )
    model = modkit.build(s, registry=reg)
    torch.testing.assert_close(model.positions[0].inv_freq, rope_inv_freq(16, 1e6, None), atol=0, rtol=0)


def test_linear_scaling_divides_everything():
    sc = LinearScaling(type="linear", factor=4)
    torch.testing.assert_close(rope_inv_freq(16, 1e4, sc), rope_inv_freq(16, 1e4, None) / 4)


# ------------------------------------------------------------------------------------------------ partial rotary


def test_partial_rotary_leaves_the_rest_untouched(reg):
    rope = make(reg, {"type": "rope", "partial_rotary": 0.5}, head_dim=8)
    full4 = make(reg, {"type": "rope"}, head_dim=4)
    assert rope.rotary_dim == 4
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 6, 8, generator=g)
    pos = torch.arange(3, 9).expand(2, 6)
    rq, rk = rope.rotate(q, k, pos)
    assert torch.equal(rq[..., 4:], q[..., 4:]) and torch.equal(rk[..., 4:], k[..., 4:])
    eq, ek = full4.rotate(q[..., :4], k[..., :4], pos)
    torch.testing.assert_close(rq[..., :4], eq, atol=ATOL, rtol=0)
    torch.testing.assert_close(rk[..., :4], ek, atol=ATOL, rtol=0)
    assert not torch.allclose(rq[..., :4], q[..., :4], atol=1e-3)


# ------------------------------------------------------------------------------------------------ sinusoidal


def test_c03_sinusoidal_odd_d_model():
    pe = sinusoidal_table(3, 5)
    expected = torch.tensor(
        [
            [0.0, 1.0, 0.0, 1.0, 0.0],
            [0.841471, 0.540302, 0.025116, 0.999685, 0.000631],
            [0.909297, -0.416147, 0.050217, 0.998738, 0.001262],
        ]
    )
    assert pe.dtype == torch.float32
    torch.testing.assert_close(pe, expected, atol=ATOL, rtol=0)


def test_c03_sinusoidal_model_with_odd_d_model_builds(reg):
    s = spec({"type": "sinusoidal"}, d_model=5, block={**spec({})["block"], "attention": {"type": "mha", "n_heads": 1}})
    model = modkit.build(s, registry=reg)
    assert model.positions[0].pe.shape == (64, 5)
    torch.testing.assert_close(model.positions[0].pe[:3], sinusoidal_table(3, 5), atol=0, rtol=0)
    assert model(torch.tensor([[1, 2, 3]])).logits.isfinite().all()


def test_sinusoidal_even_matches_reference_formula():
    n, d, base = 50, 16, 10000.0
    pe = sinusoidal_table(n, d, base)
    p = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(d // 2, dtype=torch.float64)
    ref = torch.stack([torch.sin(p / base ** (2 * i / d)), torch.cos(p / base ** (2 * i / d))], dim=-1).flatten(1)
    torch.testing.assert_close(pe, ref.float(), atol=1e-6, rtol=0)
    custom = sinusoidal_table(4, 4, 100.0)
    assert custom[1, 2].item() == pytest.approx(math.sin(0.1), abs=1e-7)


def test_sinusoidal_embed_adds_the_table(reg):
    sin = make(reg, {"type": "sinusoidal", "base": 500.0}, d_model=6, max_seq_len=20)
    assert isinstance(sin, Sinusoidal)
    x = torch.randn(2, 3, 6)
    pos = torch.tensor([[0, 1, 2], [7, 3, 19]])
    torch.testing.assert_close(sin.embed(x, pos), x + sinusoidal_table(20, 6, 500.0)[pos], atol=0, rtol=0)
    assert sin.rotate(x, x, pos)[0] is x and sin.attention_bias(pos, pos, 2) is None
    # a position past the table (20: generation asked to run past max_seq_len) gets the row the formula gives it
    torch.testing.assert_close(sin.embed(x, pos + 1), x + sinusoidal_table(21, 6, 500.0)[pos + 1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="sinusoidal positions must be >= 0; got min -1"):
        sin.embed(x, pos - 1)
    assert "pe" not in sin.state_dict()  # recomputed, never loaded


# ------------------------------------------------------------------------------------------------ learned


def test_learned_weight_and_embed(reg):
    learned = make(reg, {"type": "learned"}, d_model=8, max_seq_len=10)
    assert isinstance(learned, Learned)
    assert [n for n, _ in learned.named_parameters()] == ["weight"]
    assert learned.weight.shape == (10, 8)
    x = torch.randn(2, 3, 8)
    pos = torch.tensor([[0, 1, 2], [9, 4, 4]])
    torch.testing.assert_close(learned.embed(x, pos), x + learned.weight[pos], atol=0, rtol=0)
    with pytest.raises(ValueError, match="max_seq_len = 10"):
        learned.embed(x, pos + 1)
    out = learned.embed(x, pos).sum()
    out.backward()
    assert learned.weight.grad is not None and learned.weight.grad[9].abs().sum() > 0
    assert learned.weight.grad[5].abs().sum() == 0


def test_absolute_schemes_meta_build_then_materialise(reg):
    """build() goes through meta + to_empty + init_weights; buffers/params equal a direct computation."""
    sin = modkit.build(spec({"type": "sinusoidal"}), registry=reg)
    torch.testing.assert_close(sin.positions[0].pe, sinusoidal_table(64, 16), atol=0, rtol=0)
    lm = modkit.build(spec({"type": "learned"}), registry=reg, seed=5)
    w = lm.positions[0].weight
    assert w.shape == (64, 16) and w.isfinite().all()
    assert 0.015 < w.std().item() < 0.025 and abs(w.mean().item()) < 0.005
    assert torch.equal(w, modkit.build(spec({"type": "learned"}), registry=reg, seed=5).positions[0].weight)
    assert not torch.equal(w, modkit.build(spec({"type": "learned"}), registry=reg, seed=6).positions[0].weight)
    # explicit meta → to_empty → init_weights
    meta = modkit.build(spec({"type": "sinusoidal"}), device="meta", registry=reg)
    assert meta.positions[0].pe.is_meta
    meta.to_empty(device="cpu")
    meta.init_weights(0)
    torch.testing.assert_close(meta.positions[0].pe, sinusoidal_table(64, 16), atol=0, rtol=0)


def test_learned_in_bfloat16(reg):
    model = modkit.build(spec({"type": "learned"}), registry=reg, dtype="bfloat16")
    assert model.positions[0].weight.dtype == torch.bfloat16
    sm = modkit.build(spec({"type": "sinusoidal"}), registry=reg, dtype="bfloat16")
    assert sm.positions[0].pe.dtype == torch.float32
    for m in (model, sm):
        out = m(torch.tensor([[1, 2, 3]])).logits
        assert out.dtype == torch.bfloat16 and out.isfinite().all()


# ------------------------------------------------------------------------------------------------ ALiBi


@pytest.mark.parametrize(
    "n, expected",
    [
        (6, [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]),
        (8, [2.0**-i for i in range(1, 9)]),
        (12, [2.0**-i for i in range(1, 9)] + [0.707107, 0.353553, 0.176777, 0.088388]),
        (1, [2.0**-8]),
        (4, [0.25, 0.0625, 0.015625, 0.00390625]),
    ],
)
def test_c04_alibi_slopes(n, expected):
    assert alibi_slopes(n) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("n_heads", [6, 8, 12])
def test_c04_alibi_bias(reg, n_heads):
    alibi = make(reg, {"type": "alibi"}, n_heads=n_heads, head_dim=4)
    assert isinstance(alibi, Alibi)
    slopes = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32)
    torch.testing.assert_close(alibi.slopes, slopes, atol=0, rtol=0)
    pos = torch.arange(5)[None]
    bias = alibi.attention_bias(pos, pos, n_heads)
    assert bias.shape == (1, n_heads, 5, 5) and bias.dtype == torch.float32
    for h in range(n_heads):
        for i in range(5):
            for j in range(i + 1):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h].item() * (i - j), abs=1e-7)
    assert torch.all(bias[0, :, torch.arange(5), torch.arange(5)] == 0)


def test_alibi_bias_uses_absolute_positions_for_decode(reg):
    """A single decoded query at position 6 against 7 cached keys gets the bottom row of the full bias."""
    alibi = make(reg, {"type": "alibi"}, n_heads=6, head_dim=4)
    full = alibi.attention_bias(torch.arange(7)[None].expand(2, 7), torch.arange(7)[None].expand(2, 7), 6)
    one = alibi.attention_bias(torch.tensor([[6], [6]]), torch.arange(7)[None].expand(2, 7), 6)
    assert one.shape == (2, 6, 1, 7)
    torch.testing.assert_close(one, full[:, :, -1:], atol=0, rtol=0)
    other = alibi.attention_bias(torch.tensor([[3]]), torch.tensor([[0, 1, 2, 3]]), 12)  # heads computed on the fly
    torch.testing.assert_close(other[0, :, 0, 0], -3 * torch.tensor(alibi_slopes(12)), atol=1e-7, rtol=0)


def test_alibi_meta_build_recomputes_slopes(reg):
    s = spec(
        {"type": "alibi"}, block={**spec({})["block"], "attention": {"type": "gqa", "n_heads": 8, "n_kv_heads": 2}}
    )
    model = modkit.build(s, registry=reg)
    torch.testing.assert_close(model.positions[0].slopes, torch.tensor([2.0**-i for i in range(1, 9)]), atol=0, rtol=0)


def test_alibi_reaches_attention_weights(reg):
    """Eager attention weights equal softmax(q·k·scale + alibi bias) under the causal mask."""
    s = spec(
        {"type": "alibi"}, block={**spec({})["block"], "attention": {"type": "mha", "n_heads": 4, "backend": "eager"}}
    )
    model = modkit.build(s, registry=reg)
    attn = model.layers[0].attention
    pos_scheme = model.positions[model.layer_position[0]]
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)[None]
    _, weights = attn.forward_with_weights(x, AttentionInputs(positions=positions, position=pos_scheme))
    q = attn.q_proj(x).view(1, 5, 4, 4).transpose(1, 2)
    k = attn.k_proj(x).view(1, 5, 4, 4).transpose(1, 2)
    slopes = torch.tensor(alibi_slopes(4))
    dist = (torch.arange(5)[:, None] - torch.arange(5)[None]).float()
    scores = q @ k.transpose(-1, -2) / 2.0 - slopes[:, None, None] * dist
    scores = scores.masked_fill(dist < 0, float("-inf"))
    torch.testing.assert_close(weights, torch.softmax(scores, -1), atol=ATOL, rtol=0)


# ------------------------------------------------------------------------------------------------ cached decode


@pytest.mark.parametrize(
    "position",
    [
        {"type": "none"},
        {"type": "rope"},
        {"type": "rope", "layout": "interleaved", "partial_rotary": 0.5},
        {"type": "sinusoidal"},
        {"type": "learned"},
        {"type": "alibi"},
    ],
    ids=["none", "rope", "rope-partial", "sinusoidal", "learned", "alibi"],
)
def test_cached_decode_equals_full_forward(reg, position):
    model = modkit.build(spec(position), registry=reg, seed=0).eval()
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(ids.shape[1])]
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=ATOL, rtol=0)
        cache = model.new_cache()  # chunked prefill, then single tokens
        parts = [model(ids[:, :4], cache=cache).logits, model(ids[:, 4:7], cache=cache).logits]
        parts += [model(ids[:, t : t + 1], cache=cache).logits for t in range(7, 10)]
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)


@pytest.mark.parametrize("position", [{"type": "sinusoidal"}, {"type": "learned"}, {"type": "alibi"}, {"type": "rope"}])
def test_position_changes_the_output(reg, position):
    """Same weights with and without the scheme: the scheme must change the logits; q/k and bias schemes leave
    position 0 (a single visible key) unchanged."""
    model = modkit.build(spec(position), registry=reg, seed=0).eval()
    nope = modkit.build(spec({"type": "none"}), registry=reg, seed=0).eval()
    nope.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("positions.")})
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = model(ids).logits, nope(ids).logits
    assert not torch.allclose(a[:, -1], b[:, -1], atol=1e-4)
    if position["type"] in ("alibi", "rope"):
        torch.testing.assert_close(a[:, 0], b[:, 0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("name", ["none", "rope", "sinusoidal", "learned", "alibi"])
def test_example_config_validates_and_builds(reg, name):
    e = reg.get("position", name)
    s = modkit.load_spec(spec(e.example_config()), registry=reg)
    assert s.position.type == name
    assert modkit.build(s, registry=reg)(torch.tensor([[1, 2, 3]])).logits.isfinite().all()
