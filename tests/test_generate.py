"""Sampling (C11) and generation with a fresh cache per call (C12)."""


import pytest
import torch

import modkit
from modkit.generate import filter_logits, generate, sample, top_p_mask


def _logits(p):
    return torch.tensor(p, dtype=torch.float32).log()[None]


def _kept(p, top_p):
    return torch.isfinite(filter_logits(_logits(p), top_p=top_p))[0].nonzero().flatten().tolist()


def test_c11_top_p_boundaries():
    assert _kept([0.5, 0.35, 0.10, 0.05], 0.9) == [0, 1, 2]
    probs = torch.softmax(filter_logits(_logits([0.5, 0.35, 0.10, 0.05]), top_p=0.9), -1)[0]
    assert torch.allclose(probs[:3], torch.tensor([0.526316, 0.368421, 0.105263]), atol=1e-6)
    assert _kept([0.5, 0.25, 0.125, 0.125], 0.75) == [0, 1]
    assert _kept([0.5, 0.35, 0.10, 0.05], 0.1) == [0]
    assert _kept([0.5, 0.35, 0.10, 0.05], 1.0) == [0, 1, 2, 3]
    assert top_p_mask(torch.tensor([[0.25, 0.25, 0.25, 0.25]]), 1e-6).sum() == 1  # never empty


def test_c11_temperature_zero_and_top_k():
    logits = torch.tensor([[0.1, 3.0, -2.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
    out = sample(logits, temperature=0)
    assert out.tolist() == [1, 0]
    assert torch.equal(filter_logits(logits, top_k=10), logits)  # top_k >= vocab: no truncation
    kept = torch.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[False, True, False, True], [True, True, True, True]]  # ties at the k-th value stay
    with pytest.raises(ValueError, match="top_p must be in"):
        filter_logits(logits, top_p=0)


def test_seeded_sampling_is_reproducible_and_follows_distribution():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    g = torch.Generator().manual_seed(0)
    draws = sample(logits, temperature=1.0, generator=g)
    freq = torch.bincount(draws, minlength=3).float() / draws.numel()
    assert torch.allclose(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.02)
    again = sample(logits, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)


C12_SPEC = {
    "schema_version": 1,
    "vocab_size": 32,
    "d_model": 16,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope"},
    "block": {
        "attention": {"type": "mha", "n_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 32},
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm"},
}


def _no_cache_greedy(model, ids, n):
    ids = torch.as_tensor(ids)[None] if not torch.is_tensor(ids) else ids
    for _ in range(n):
        nxt = model(ids).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], 1)
    return ids


@pytest.mark.parametrize("first,second", [([1, 2, 3, 4, 5, 6], [7, 8]), ([7, 8], [1, 2, 3, 4, 5, 6, 9, 10, 11])])
def test_c12_cache_reset_between_calls(first, second):
    model = modkit.build(C12_SPEC, seed=0).eval()
    generate(model, first, max_new_tokens=8, temperature=0)
    reused = generate(model, second, max_new_tokens=8, temperature=0)
    fresh = generate(modkit.build(C12_SPEC, seed=0).eval(), second, max_new_tokens=8, temperature=0)
    assert torch.equal(reused, fresh)
    with torch.no_grad():
        assert torch.equal(reused, _no_cache_greedy(model, torch.tensor([second]), 8))


def test_c12_batch_of_two_with_left_padding():
    model = modkit.build(C12_SPEC, seed=0).eval()
    generate(model, [[1, 2, 3, 4, 5, 6]], max_new_tokens=8, temperature=0)
    ids = torch.tensor([[0, 0, 7, 8], [3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    out = generate(model, ids, attention_mask=mask, max_new_tokens=8, temperature=0)
    with torch.no_grad():
        assert torch.equal(out[0, 2:], _no_cache_greedy(model, torch.tensor([[7, 8]]), 8)[0])
        assert torch.equal(out[1], _no_cache_greedy(model, torch.tensor([[3, 4, 5, 6]]), 8)[0])


def test_eos_stops_and_pads():
    model = modkit.build(C12_SPEC, seed=0).eval()
    greedy = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0)[0, 3:].tolist()
    eos = greedy[1]
    out = generate(model, [1, 2, 3], max_new_tokens=6, temperature=0, eos_token_id=eos)[0, 3:].tolist()
    assert out == greedy[: greedy.index(eos) + 1]


def test_seeded_generation_reproducible():
    model = modkit.build(C12_SPEC, seed=0).eval()
    a = generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3)
    b = generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=3)
    assert torch.equal(a, b)
    assert a.shape == (1, 12) and int(a.max()) < 32
    assert not torch.equal(a, generate(model, [1, 2], max_new_tokens=10, temperature=1.0, top_p=0.9, seed=4))
