"""Attention: fully masked rows (zeros, not NaN), mask alignment, GQA/MHA equivalence, backends, sliding window,
cache."""

import math

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.core.interfaces import BuildContext
from tests.conftest import tiny_spec


def _attn(cfg: dict, d_model: int = 32, seed: int = 0):
    reg = modkit.get_registry()
    ctx = BuildContext(d_model=d_model, n_layers=1, vocab_size=8, max_seq_len=64, registry=reg)
    m = ctx.build(modkit.load_component("attention", cfg))
    torch.manual_seed(seed)
    for p in m.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return m


def _reference(m, x, positions, valid=None, causal=True, window=None):
    """Plain float64 attention with explicit loops over the mask, for comparison."""
    b, s, _ = x.shape
    q = m.q_proj(x).view(b, s, m.n_heads, m.head_dim).transpose(1, 2).double()
    k = m.k_proj(x).view(b, s, m.n_kv_heads, m.head_dim).transpose(1, 2).double()
    v = m.v_proj(x).view(b, s, m.n_kv_heads, m.head_dim).transpose(1, 2).double()
    rep = m.n_heads // m.n_kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) * m.scale
    allowed = torch.ones(b, s, s, dtype=torch.bool)
    for i in range(s):
        for j in range(s):
            d = positions[0, i] - positions[0, j]
            ok = (d >= 0) if causal else True
            if window is not None:
                ok = ok and abs(int(d)) < window
            allowed[:, i, j] = ok
    if valid is not None:
        allowed &= valid[:, None, :]
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    w = torch.softmax(scores, -1).nan_to_num(0.0)
    out = (w @ v).transpose(1, 2).reshape(b, s, -1).float()
    return m.o_proj(out)


@pytest.mark.parametrize("eager", [False, True])
def test_c05_fully_masked_row_is_zero_not_nan(eager):
    from modkit.plugin import masked_attention

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])[None, None]
    out, _ = masked_attention(q, k, v, mask, None, 0.5, eager=eager)
    assert torch.isfinite(out).all()
    assert torch.equal(out[0, 0, 2], torch.zeros(4))
    assert torch.allclose(out[0, 0, 0], v[0, 0, 0])  # row 0 sees only key 0
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_c05_left_padded_batch_equals_each_sequence_alone(backend):
    spec = tiny_spec(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "backend": backend})
    model = modkit.build(spec, seed=1)
    a, b = torch.tensor([5, 6, 7]), torch.tensor([9])
    ids = torch.tensor([[5, 6, 7], [0, 0, 9]])
    mask = torch.tensor([[1, 1, 1], [0, 0, 1]])
    out = model(ids, attention_mask=mask).logits
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0], model(a[None]).logits[0], atol=1e-5)
    assert torch.allclose(out[1, 2:], model(b[None]).logits[0], atol=1e-5)


@pytest.mark.parametrize("window,causal", [(None, True), (3, True), (None, False), (2, False)])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_matches_reference_with_padding_and_windows(window, causal, backend):
    m = _attn(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": window, "causal": causal, "backend": backend}
    )
    x = torch.randn(2, 6, 32)
    pos = torch.arange(6)[None].expand(2, 6)
    valid = torch.ones(2, 6, dtype=torch.bool)
    valid[1, 0] = False
    got = m(x, AttentionInputs(positions=pos, token_mask=valid))
    ref = _reference(m, x, pos, valid, causal, window)
    live = torch.ones(2, 6, dtype=torch.bool)
    assert torch.allclose(got[live], ref[live], atol=1e-5)


def test_gqa_with_n_kv_heads_equal_n_heads_is_mha():
    gqa = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 4})
    mha = _attn({"type": "mha", "n_heads": 4})
    mha.load_state_dict(gqa.state_dict())
    x = torch.randn(2, 5, 32)
    inputs = AttentionInputs(positions=torch.arange(5)[None].expand(2, 5))
    assert torch.equal(gqa(x, inputs), mha(x, inputs))


def test_eager_weights_sum_to_one_and_match_sdpa():
    m = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 1, "backend": "eager"})
    x = torch.randn(1, 5, 32)
    inputs = AttentionInputs(positions=torch.arange(5)[None])
    out, w = m.forward_with_weights(x, inputs)
    assert w.shape == (1, 4, 5, 5)
    assert torch.allclose(w.sum(-1), torch.ones(1, 4, 5), atol=1e-6)
    assert torch.equal(w.triu(1), torch.zeros_like(w))  # causal
    m.backend = "sdpa"
    assert torch.allclose(m(x, inputs), out, atol=1e-5)


def test_chunked_prefill_mask_is_bottom_right_aligned():
    model = modkit.build(
        tiny_spec(block__attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 4}), seed=2
    )
    ids = torch.randint(0, 64, (2, 11))
    full = model(ids).logits
    cache = model.new_cache(2, 11)
    parts = [model(ids[:, a:b], cache=cache).logits for a, b in ((0, 5), (5, 6), (6, 11))]
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)
    assert cache.layers[0].only.k.shape == (
        2,
        2,
        4,
        8,
    )  # sliding-window layer: a ring of window slots, n_kv_heads heads


def test_softmax_scale_override():
    m = _attn({"type": "mha", "n_heads": 2, "softmax_scale": 0.125})
    assert m.scale == 0.125
    assert _attn({"type": "mha", "n_heads": 2}).scale == pytest.approx(1 / math.sqrt(16))


def test_qk_norm_per_head_and_full_width():
    per_head = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm"}})
    full = _attn(
        {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm"}, "qk_norm_scope": "full"}
    )
    assert per_head.q_norm.weight.shape == (8,) and per_head.k_norm.weight.shape == (8,)
    assert full.q_norm.weight.shape == (32,) and full.k_norm.weight.shape == (16,)
    x = torch.randn(1, 3, 32)
    q = full.q_proj(x)
    # full-width: RMS over the whole projection, before splitting into heads
    expected = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) * full.q_norm.weight
    got, _, _ = full._project(x, AttentionInputs(positions=torch.arange(3)[None]))
    assert torch.allclose(got, expected.view(1, 3, 4, 8).transpose(1, 2), atol=1e-5)
    # per head: RMS over head_dim of each head separately
    qh = per_head.q_proj(x).view(1, 3, 4, 8).transpose(1, 2)
    expected = qh / torch.sqrt(qh.pow(2).mean(-1, keepdim=True) + 1e-6) * per_head.q_norm.weight
    gq, _, _ = per_head._project(x, AttentionInputs(positions=torch.arange(3)[None]))
    assert torch.allclose(gq, expected, atol=1e-5)


def test_head_dim_independent_of_d_model():
    m = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16})
    assert m.q_proj.weight.shape == (64, 32) and m.o_proj.weight.shape == (32, 64)
    x = torch.randn(1, 3, 32)
    assert m(x, AttentionInputs(positions=torch.arange(3)[None])).shape == (1, 3, 32)


def test_logit_softcap_caps_the_scores_before_the_mask():
    """Weights = softmax(cap · tanh(q·k·scale / cap)) under the causal mask (Gemma 2), on either backend setting."""
    for backend in ("sdpa", "eager"):
        m = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "logit_softcap": 0.7, "backend": backend})
        x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(3))
        pos = torch.arange(5).expand(2, 5)
        inputs = AttentionInputs(positions=pos)
        out, w = m.forward_with_weights(x, inputs)
        q = m.q_proj(x).view(2, 5, 4, 8).transpose(1, 2)
        k = m.k_proj(x).view(2, 5, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
        v = m.v_proj(x).view(2, 5, 2, 8).transpose(1, 2).repeat_interleave(2, 1)
        scores = 0.7 * torch.tanh(q @ k.transpose(-1, -2) * m.scale / 0.7)
        scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
        ref_w = torch.softmax(scores, -1)
        torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=0)
        ref = m.o_proj((ref_w @ v).transpose(1, 2).reshape(2, 5, 32))
        torch.testing.assert_close(m(x, inputs), ref, atol=1e-6, rtol=0)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
        assert scores[torch.isfinite(scores)].abs().max() < 0.7  # capped scores lie in (-0.7, 0.7)
    plain = _attn({"type": "gqa", "n_heads": 4, "n_kv_heads": 2})
    assert not torch.allclose(plain(x, inputs), m(x, inputs), atol=1e-3)  # the cap binds at 0.7
