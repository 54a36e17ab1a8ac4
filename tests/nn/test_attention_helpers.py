"""modkit's public attention helpers (``modkit.nn.attention``): the mask, the dead-row guard, the cache update.

Values are checked against explicit small cases and a plain softmax reference; the built-in attention and a
hand-written attention built from the helpers give the same logits as each other's math.
"""

from __future__ import annotations

import math

import pytest
import torch

import modkit
from modkit import AttentionInputs, KVCache
from modkit.nn.cache import LayerGeometry


def test_mask_from_positions_token_mask_and_window():
    q = torch.tensor([[0, 1, 2, 3]])
    got = modkit.attention_mask(q, q, None, causal=True, window=2)[0, 0]
    want = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)
    # a single decode query at position 3 over 4 cached keys: bottom-right aligned, it sees all of them
    assert modkit.attention_mask(torch.tensor([[3]]), q)[0, 0].tolist() == [[True, True, True, True]]
    # padding keys are hidden; bidirectional windows are symmetric
    valid = torch.tensor([[False, True, True, True]])
    assert modkit.attention_mask(q, q, valid)[0, 0, 3].tolist() == [False, True, True, True]
    assert modkit.attention_mask(q, q, None, causal=False, window=2)[0, 0, 1].tolist() == [True, True, True, False]


def test_masked_softmax_zeroes_dead_rows_and_matches_softmax_elsewhere():
    torch.manual_seed(0)
    scores = torch.randn(1, 2, 3, 4)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], dtype=torch.bool)[None, None]
    probs = modkit.masked_softmax(scores, modkit.PreparedMask.of(mask, torch.float32))
    assert torch.equal(probs[0, :, 2], torch.zeros(2, 4))  # the dead row: zero, not NaN
    ref = torch.softmax(scores[..., :2, :].masked_fill(~mask[..., :2, :], float("-inf")), -1)
    torch.testing.assert_close(probs[..., :2, :], ref, rtol=0, atol=0)
    assert torch.allclose(probs[..., :2, :].sum(-1), torch.ones(1, 2, 2))
    torch.manual_seed(1)
    dropped = modkit.masked_softmax(scores, modkit.PreparedMask.of(mask, torch.float32), dropout_p=0.5)
    kept = dropped[..., :2, :] != 0
    torch.testing.assert_close(dropped[..., :2, :][kept], 2 * ref[kept])  # kept probabilities scaled by 1 / (1 - p)


@pytest.mark.parametrize("eager", [False, True])
def test_masked_attention_bool_and_prepared_masks_agree(eager):
    torch.manual_seed(2)
    q = torch.randn(2, 4, 5, 8)
    k, v = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)  # GQA: 2 key/value heads for 4 query heads
    pos = torch.arange(5).expand(2, 5)
    valid = torch.tensor([[False, False, True, True, True], [True] * 5])
    mask = modkit.attention_mask(pos, pos, valid)
    out, weights = modkit.masked_attention(q, k, v, mask, eager=eager)
    again, _ = modkit.masked_attention(q, k, v, modkit.PreparedMask.of(mask, q.dtype), None, 8**-0.5, eager=eager)
    torch.testing.assert_close(out, again)
    assert torch.equal(out[0, :, :2], torch.zeros(4, 2, 8))  # padding queries with only padding keys
    # reference: query head h reads key/value head h // 2
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kr.transpose(-1, -2)) / math.sqrt(8)
    ref = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0) @ vr
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert (weights is not None) == eager


def test_update_cache_and_prepare_mask_share_per_forward():
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    pos = torch.arange(3)[None]
    plain = AttentionInputs(positions=pos)
    got = modkit.update_cache(plain, k, v)
    assert got[0] is k and got[1] is v and got[2] is pos and got[3] is None
    cache = KVCache([LayerGeometry(2, 4, None)], max_len=8, batch_size=1, dtype=torch.bfloat16)
    positions, token_mask = cache.prepare(1, 3)
    inputs = AttentionInputs(positions=positions, token_mask=token_mask, cache=cache.layers[0])
    k_all, v_all, k_pos, k_valid = modkit.update_cache(inputs, k, v)
    assert k_all.dtype == torch.float32 and torch.equal(k_all, k.to(torch.bfloat16).float())  # cast back to k's dtype
    positions, _ = cache.prepare(1, 1)  # one decode step: all 8 slots come back, 4 of them written
    step = AttentionInputs(positions=positions, cache=cache.layers[0])
    k_all, _, k_pos, k_valid = modkit.update_cache(step, k[:, :, :1], v[:, :, :1])
    assert k_all.shape == (1, 2, 8, 4) and k_valid.tolist() == [[True] * 4 + [False] * 4]
    first = modkit.prepare_mask(step, k_pos, k_valid, torch.float32)
    assert modkit.prepare_mask(step, k_pos, k_valid, torch.float32) is first  # computed once per forward
    assert first.allowed[0, 0, 0].tolist() == [True] * 4 + [False] * 4
    assert modkit.prepare_mask(step, k_pos, k_valid, torch.float32, window=2) is not first


def test_position_bias_is_the_schemes_bias():
    spec = {
        "schema_version": 1,
        "name": "t",
        "vocab_size": 16,
        "d_model": 16,
        "n_layers": 1,
        "max_seq_len": 8,
        "position": {"type": "alibi"},
        "block": {
            "attention": {"type": "mha", "n_heads": 2},
            "ffn": {"type": "mlp", "d_ff": 16},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    model = modkit.build(spec)
    pos = torch.arange(3)[None]
    bias = modkit.position_bias(AttentionInputs(positions=pos, position=model.positions[0]), pos, 2)
    assert bias.shape == (1, 2, 3, 3) and bias[0, 0, 2, 0].item() == pytest.approx(-2 * 2**-4)
    assert modkit.position_bias(AttentionInputs(positions=pos), pos, 2) is None


def test_eager_attention_keeps_float64_inputs_in_float64():
    """Float64 queries, keys and values give float64 scores and probabilities (the kit's precision reference runs
    in float64): the eager path agrees with a float64 computation to 1e-13, a float32 rounding of the scores would
    leave about 1e-7."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(6).expand(1, 6)
    mask = modkit.attention_mask(pos, pos, None)
    sinks = torch.tensor([0.5, -1.0], dtype=torch.float64)
    out, weights = modkit.masked_attention(q, k, v, mask, eager=True, sinks=sinks)
    assert weights.dtype == torch.float64 and out.dtype == torch.float64
    s = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    s = torch.cat([s.masked_fill(~mask, float("-inf")), sinks.view(1, 2, 1, 1).expand(1, 2, 6, 1)], -1)
    ref = torch.softmax(s, -1)[..., :-1]
    assert (weights - ref).abs().max().item() < 1e-13
    assert (out - ref @ v).abs().max().item() < 1e-13
