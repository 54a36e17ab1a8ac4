"""Static KV cache: cached decode equals the full forward for every attention × position × placement in the
registry, ring buffers for sliding windows (chunks longer than the window too), left padding, allocated bytes
equal the formula, unwritten slots masked, clear errors."""

from __future__ import annotations

import copy

import pytest
import torch

import modkit
from modkit.nn.cache import KVCache, LayerGeometry

REG = modkit.get_registry()

BASE = {
    "schema_version": 1,
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 64,
    "position": {"type": "rope"},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        "ffn": {"type": "swiglu", "d_ff": 48},
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
    "final_norm": {"type": "rmsnorm"},
}

#: prefill 3, one token, a chunk of 2, two single tokens, a chunk of 3, one token: 11 tokens
SCHEDULE = ((0, 3), (3, 4), (4, 6), (6, 7), (7, 8), (8, 11), (11, 12))
ATOL = 1e-5


def _spec(attention=None, position=None, placement=None, **top) -> dict:
    spec = copy.deepcopy(BASE)
    if attention is not None:
        spec["block"]["attention"] = attention
    if position is not None:
        spec["position"] = position
    if placement is not None:  # a placement holding a mixer of its own (shortcut-moe) gets the block's, as LongCat's
        has_mixer = "mixer" in placement and attention is not None
        spec["block"]["placement"] = dict(placement, mixer=attention) if has_mixer else placement
    spec.update(top)
    return spec


def _entries(kind: str, capability: str | None = None) -> list:
    out = [e for e in REG.components(kind) if capability is None or e.capabilities.get(capability)]
    return [pytest.param(e.example_config(), id=e.type) for e in out]


def _run_schedule(model, ids, mask=None, cache=None, schedule=SCHEDULE):
    cache = cache if cache is not None else model.new_cache(ids.shape[0], schedule[-1][1])
    parts = []
    for a, b in schedule:
        m = None if mask is None else mask[:, a:b]
        parts.append(model(ids[:, a:b], attention_mask=m, cache=cache).logits)
    return torch.cat(parts, 1), cache


def _with_window(attention: dict, window: int):
    fields = REG.get("attention", attention["type"]).config.model_fields
    return dict(attention, sliding_window=window) if "sliding_window" in fields else None


@pytest.mark.parametrize("placement", _entries("placement"))
@pytest.mark.parametrize("position", _entries("position"))
@pytest.mark.parametrize("attention", _entries("attention", "kv_cache"))
def test_cached_decode_equals_full_forward(attention, position, placement):
    """Every registered KV-cache attention with every position scheme and placement: chunked prefill, then
    single tokens and chunks, equal the full forward; also with a left-padded row and with a sliding window
    shorter than some chunks (ring buffer)."""
    n = SCHEDULE[-1][1]
    ids = torch.randint(1, 64, (2, n), generator=torch.Generator().manual_seed(0))
    try:
        model = modkit.build(_spec(attention, position, placement), seed=0).eval()
    except modkit.SpecError as exc:  # an attention may refuse a score-bias scheme (dsa: its indexer cannot see one)
        if "position_geometry() gives None" in str(exc):  # one that rotates itself takes no scheme at all
            assert attention["type"] == "compressed_attention" and position["type"] in ("rope", "alibi"), exc
            return
        assert "declares no n_heads" in str(exc) and position["type"] == "alibi", exc
        return
    with torch.no_grad():
        full = model(ids).logits
        got, cache = _run_schedule(model, ids)
        torch.testing.assert_close(got, full, atol=ATOL, rtol=1e-4)
        attn = next(m for m in model.modules() if getattr(m, "modkit_kind", None) == "attention")
        # what the block's attention declares (keys: n_kv_heads heads, never n_heads); max_len slots. A placement
        # with a sublayer of its own (shortcut-moe's second attention) keeps that one's state beside it.
        for layer in cache.layers:
            state, spec = layer.state(attn), attn.cache_spec()
            slots = {e.name: e.block_slots(n) if e.per_block else spec.slots(n) for e in spec.entries}
            assert {e.name: tuple(state[e.name].shape) for e in spec.entries} == {
                e.name: e.allocated_shape(2, slots[e.name]) for e in spec.entries
            }
            if state.k is not None:
                assert state.k.shape == (2, attn.n_kv_heads, n, attn.head_dim)

        mask = torch.ones(2, n, dtype=torch.long)
        mask[1, :4] = 0  # row 1 left-padded by 4
        full = model(ids, attention_mask=mask).logits
        got, _ = _run_schedule(model, ids, mask)
        torch.testing.assert_close(got[0], full[0], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(got[1, 4:], full[1, 4:], atol=ATOL, rtol=1e-4)

        windowed = _with_window(attention, 2)
        if windowed is not None:
            model = modkit.build(_spec(windowed, position, placement), seed=0).eval()
            full = model(ids).logits
            got, cache = _run_schedule(model, ids)
            torch.testing.assert_close(got, full, atol=ATOL, rtol=1e-4)
            attn = next(m for m in model.modules() if getattr(m, "modkit_kind", None) == "attention")
            assert all(layer.state(attn).k.shape[2] == 2 for layer in cache.layers)  # a ring of window slots


def test_cache_layout_dtype_and_lazy_allocation():
    model = modkit.build(_spec(), seed=0, dtype="bfloat16")
    cache = model.new_cache(3, 10)
    assert [tuple(layer.only.k.shape) for layer in cache.layers] == [(3, 2, 10, 8)] * 2
    assert cache.layers[0].only.k.dtype == torch.bfloat16 and cache.dtype == torch.bfloat16  # follows the model
    assert model.new_cache(1, 4, "float32").layers[1].only.v.dtype == torch.float32
    lazy = model.new_cache()  # sized at the first forward: its batch, spec.max_seq_len slots
    assert lazy.nbytes() == 0
    with torch.no_grad():
        model(torch.tensor([[1, 2], [3, 4]]), cache=lazy)
    assert lazy.layers[0].only.k.shape == (2, 2, 64, 8)
    with pytest.raises(ValueError, match="unknown cache dtype"):
        model.new_cache(1, 4, "int8")


def test_cache_in_another_dtype_than_the_model():
    model = modkit.build(_spec(), seed=1).eval()
    ids = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, cache = _run_schedule(model, ids, cache=model.new_cache(2, 12, torch.float64))
        torch.testing.assert_close(got, model(ids).logits, atol=ATOL, rtol=1e-4)
    assert cache.layers[0].only.k.dtype == torch.float64


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_allocated_bytes_equal_the_formula(dtype):
    """KV bytes = batch · bytes(dtype) · Σ_layers 2 · n_kv_heads · head_dim · slots, slots = max_len for global
    layers and min(window, max_len) for windowed ones; without windows: kv_cache_bytes_per_token · max_len · batch."""
    batch, max_len = 3, 40
    model = modkit.build(_spec(attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16}), device="meta")
    per_token = modkit.kv_cache_bytes_per_token(model, dtype)
    assert per_token == 2 * (2 * 2 * 16) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
    spec = _spec(attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16})
    model = modkit.build(spec, dtype=dtype)
    assert model.new_cache(batch, max_len).nbytes() == per_token * max_len * batch

    # layer 0 local (window 8 < max_len: a ring of 8 slots), layers 1 and 3 global, layer 2 window 100 >= max_len
    spec = _spec(
        n_layers=4,
        overrides=[
            {
                "layers": [0],
                "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "sliding_window": 8},
            },
            {"layers": [2], "attention": {"type": "mqa", "n_heads": 4, "sliding_window": 100}},
        ],
    )
    model = modkit.build(spec, dtype=dtype)
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    per_layer = [2 * 2 * 16, 2 * 2 * 8, 2 * 1 * 8, 2 * 2 * 8]  # 2 · n_kv_heads · head_dim (d_model 32 / 4 heads = 8)
    slots = [8, max_len, max_len, max_len]
    cache = model.new_cache(batch, max_len)
    assert cache.nbytes() == batch * size * sum(e * s for e, s in zip(per_layer, slots))
    full = modkit.kv_cache_bytes_per_token(model, dtype) * max_len * batch
    assert cache.nbytes() == full - batch * size * per_layer[0] * (max_len - 8)
    assert (
        sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.only.k, layer.only.v))
        == cache.nbytes()
    )
    assert cache.metadata_nbytes() == 8 + 8 * batch + (8 + 1) * batch * (8 + max_len)  # two slot groups


def test_chunk_longer_than_the_window_attends_correctly():
    spec = _spec(attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 3}, n_layers=3)
    model = modkit.build(spec, seed=2).eval()
    ids = torch.randint(1, 64, (2, 20), generator=torch.Generator().manual_seed(2))
    schedule = ((0, 7), (7, 8), (8, 9), (9, 14), (14, 15), (15, 20))
    with torch.no_grad():
        got, cache = _run_schedule(model, ids, schedule=schedule)
        torch.testing.assert_close(got, model(ids).logits, atol=ATOL, rtol=1e-4)
    g = cache.layers[0].only.group
    assert g.ring and g.size == 3 and cache.layers[0].only.k.shape == (2, 2, 3, 8)
    assert g.positions.sort(-1).values.tolist() == [[17, 18, 19]] * 2  # the ring holds the last window


def test_left_padding_with_ring_buffer_and_padding_after_real_is_refused():
    spec = _spec(attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 3})
    model = modkit.build(spec, seed=3).eval()
    ids = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[0, :5] = 0
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        got, _ = _run_schedule(model, ids, mask, schedule=((0, 6), (6, 7), (7, 10)))
        torch.testing.assert_close(got[0, 5:], full[0, 5:], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(got[1], full[1], atol=ATOL, rtol=1e-4)
        cache = model.new_cache(2, 10)
        model(ids[:, :4], cache=cache)
        with pytest.raises(ValueError, match="pad on the left only"):
            model(ids[:, 4:6], attention_mask=torch.tensor([[1, 0], [1, 1]]), cache=cache)


def test_unwritten_slots_are_invalid_and_empty():
    model = modkit.build(_spec(), seed=0).eval()
    cache = model.new_cache(2, 12)
    with torch.no_grad():
        model(torch.randint(1, 64, (2, 5)), cache=cache)
        model(torch.randint(1, 64, (2, 1)), cache=cache)
    g = cache.layers[0].only.group
    assert g.valid.tolist() == [[True] * 6 + [False] * 6] * 2
    assert g.positions[:, :6].tolist() == [list(range(6))] * 2
    assert int(cache.write_pos) == 6 and cache.seen_tokens == 6 and cache.next_position.tolist() == [6, 6]
    assert torch.equal(cache.layers[1].only.k[:, :, 6:], torch.zeros(2, 2, 6, 8))


def test_update_hands_back_fresh_keys_then_the_buffer():
    """An empty cache returns the new keys themselves (so prefill keeps the plain causal kernel); later
    forwards return the whole buffer, whose unwritten slots are invalid."""
    cache = KVCache([LayerGeometry(2, 4)], max_len=6, batch_size=1)
    layer = cache.layers[0].only
    k = torch.randn(1, 2, 3, 4)
    pos, _ = cache.prepare(1, 3)
    k_all, _, p_all, valid = layer.update(k, k, pos, None)
    assert k_all is k and p_all is pos and valid is None
    pos, _ = cache.prepare(1, 1)
    k_all, _, p_all, valid = layer.update(k[:, :, :1], k[:, :, :1], pos, None)
    assert k_all.shape == (1, 2, 6, 4) and p_all.tolist() == [[0, 1, 2, 3, 0, 0]]
    assert valid.tolist() == [[True] * 4 + [False] * 2]


def test_errors_and_reset():
    model = modkit.build(_spec(), seed=0).eval()
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(4))
    cache = model.new_cache(2, 5)
    with torch.no_grad():
        model(ids[:, :4], cache=cache)
        with pytest.raises(ValueError, match="KV cache is full: it holds 4 of max_len = 5 tokens and 2 more"):
            model(ids[:, 4:6], cache=cache)
        with pytest.raises(ValueError, match="batch_size = 2 rows, got a batch of 1"):
            model(ids[:1, 4:5], cache=cache)
        cache.reset()
        first = model(ids[:, :5], cache=cache).logits
        torch.testing.assert_close(first, model(ids[:, :5]).logits, atol=ATOL, rtol=1e-4)
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        model.new_cache(1, 0)
