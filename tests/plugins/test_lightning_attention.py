"""``lightning_attention`` (MiniMax-01's decayed linear attention) against its recurrence, its cache, packed
documents, the contract kit and transformers' ``MiniMaxLightningAttention``.

* float64, the functions: the block-wise form (chunk lengths 1, 4, 8 and longer than the sequence; padding tokens;
  document starts, one at position 0; a non-zero entering state) equals the one-token recurrence to 1e-12; a packed
  row's documents equal each document alone;
* float32, in a model: decoding token by token through the cache and a prefill in uneven pieces equal the full
  forward; packed documents equal the documents alone; the contract kit passes every applicable check;
* float32, the module: equal to ``MiniMaxLightningAttention`` (layer 1 of 3, so the per-layer rate scaling acts) on
  the same weights to 1e-5, with a block size other than ours.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit_plugins import lightning_attention as la
from modkit_plugins.lightning_attention import decay_rates, lightning_chunked, lightning_step

TOL = 1e-5
D = 32
T = 29
EXACT = 1e-12


def _registry():
    """The process registry with ``lightning_attention`` in it (registered here when the installed package's entry
    points predate the module: an editable install reads them at install time)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = modkit.get_registry()
    if "lightning_attention" not in reg.types("mixer"):
        reg.register_plugin(la, "builtin-lightning-attention", distribution="modkit-lm")
    return reg


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(seed: int = 11, b: int = 2, H: int = 3, d: int = 6):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = r(b, H, T, d), r(b, H, T, d), r(b, H, T, d)
    rates = torch.rand(H, generator=g, dtype=torch.float64) + 0.05
    return q, k, v, rates


def _recurrence(q, k, v, rates, real, state, starts):
    """The reference: one token at a time through :func:`lightning_step`."""
    ys = []
    for t in range(q.shape[2]):
        decay = torch.exp(-rates[None, :] * real[:, t : t + 1])
        reset = None if starts is None else starts[:, t]
        y, state = lightning_step(q[:, :, t], k[:, :, t], v[:, :, t], decay, state, reset)
        ys.append(y)
    return torch.stack(ys, 2), state


@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
def test_the_block_wise_form_equals_the_recurrence_in_float64(chunk):
    q, k, v, rates = _inputs()
    real = torch.ones(2, T, dtype=torch.float64)
    real[0, :5] = 0  # left padding
    real[1, 12] = 0  # a padding token inside (a chunked prefill over a masked token)
    q, k, v = (t * real[:, None, :, None] for t in (q, k, v))
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[0, [0, 9, 10, 17]] = True  # a start at 0 drops the entering state
    starts[1, [4, 8, 28]] = True
    state = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for flags in (None, starts):
        got, final = lightning_chunked(q, k, v, rates, real, chunk, state.clone(), flags)
        want, last = _recurrence(q, k, v, rates, real, state.clone(), flags)
        assert (got - want).abs().max().item() <= EXACT
        assert (final - last).abs().max().item() <= EXACT
    # the sum it stands for, without state or padding: o_t = Σ_{s<=t} exp(-r (t - s)) (q_t · k_s) v_s
    ones = torch.ones(2, T, dtype=torch.float64)
    got, _ = lightning_chunked(q, k, v, rates, ones, chunk)
    t = torch.arange(T, dtype=torch.float64)
    decay = torch.exp(-rates[:, None, None] * (t[:, None] - t[None, :])).tril()  # [H, T, T]
    want = ((q @ k.transpose(-1, -2)) * decay) @ v
    assert (got - want).abs().max().item() <= EXACT


def test_packed_documents_equal_each_document_alone_in_float64():
    q, k, v, rates = _inputs(seed=5)
    ones = torch.ones(2, T, dtype=torch.float64)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[:, [3, 4, 13, 28]] = True
    packed, _ = lightning_chunked(q, k, v, rates, ones, 8, None, starts)
    unflagged, _ = lightning_chunked(q, k, v, rates, ones, 8)
    for a, b in zip([0, 3, 4, 13, 28], [3, 4, 13, 28, T]):
        alone, _ = lightning_chunked(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], rates, ones[:, a:b], 8)
        assert (packed[:, :, a:b] - alone).abs().max().item() <= EXACT
    assert (packed - unflagged).abs().max().item() > 1e-3  # without the flags the documents mix


# ----------------------------------------------------------------------------------------------- in a model


def _spec(mixer: dict, n_layers: int = 2) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": n_layers,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "init_std": 0.2,
        "block": {
            "mixer": mixer,
            "ffn": {"type": "mlp", "d_ff": 64, "activation": "gelu"},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }


MIXER = {"type": "lightning_attention", "n_heads": 4, "chunk_size": 8}


def _model(**changes):
    _registry()
    return modkit.build(_spec({**MIXER, **changes}), seed=0).eval()


def _scaled(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


def test_cached_decoding_and_uneven_prefill_equal_the_full_forward():
    model = _model()
    ids = torch.randint(0, 64, (2, T), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, T)
        steps = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(T)], 1)
        cache = model.new_cache(2, T)
        pieces = ((0, 3), (3, 4), (4, 17), (17, 18), (18, 28), (28, 29))
        chunks = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in pieces], 1)
        other = _model(chunk_size=3)(ids).logits  # the chunk length changes no number
    assert _scaled(steps, full) <= TOL and _scaled(chunks, full) <= TOL and _scaled(other, full) <= TOL
    state = cache.layers[0].mixers
    (entry,) = next(iter(state.values())).spec.sequence_entries
    assert entry.shape == (4, 8, 8) and entry.dtype == torch.float32


def test_packed_documents_in_a_model_equal_each_document_alone():
    model = _model()
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(4))
    docs = torch.tensor([[0] * 5 + [1] + [2] * 13 + [3] * 5, [0] * 9 + [1] * 15])
    with torch.no_grad():
        packed = model(ids, documents=docs).logits
        for r, pieces in enumerate([[(0, 5), (5, 6), (6, 19), (19, 24)], [(0, 9), (9, 24)]]):
            for a, b in pieces:
                assert _scaled(packed[r, a:b], model(ids[r : r + 1, a:b]).logits[0]) <= TOL


def test_the_contract_kit_passes():
    from modkit.testing import check_component

    _registry()
    results = check_component("mixer", "lightning_attention")
    assert not [f"{r.id}: {r.detail}" for r in results if r.status == "failed"]
    passed = {r.check for r in results if r.status == "passed"}
    assert {"kv_cache_decode", "document_mask", "masked_row", "flops", "param_count", "compile"} <= passed


# ----------------------------------------------------------------------------------------------- vs transformers


def test_equals_transformers_minimax_lightning_attention():
    transformers = pytest.importorskip("transformers")
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    cfg = transformers.MiniMaxConfig(
        hidden_size=D,
        num_attention_heads=4,
        head_dim=8,
        num_hidden_layers=3,
        block_size=8,
        layer_types=["linear_attention"] * 3,
    )
    hf = MiniMaxLightningAttention(cfg, layer_idx=1).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    _registry()
    model = modkit.build(_spec({**MIXER, "head_dim": 8, "chunk_size": 5}, n_layers=3), seed=0).eval()
    ours = model.layers[1].attention
    ours.load_state_dict(hf.state_dict(), strict=False)  # transformers also keeps its decay tables as buffers
    assert set(ours.state_dict()) == {"qkv_proj.weight", "output_gate.weight", "norm.weight", "out_proj.weight"}
    assert torch.equal(ours.rates, hf.slope_rate.flatten())  # the same rates, float32
    assert torch.allclose(ours.rates.double(), decay_rates(4, 1, 3, True), rtol=1e-7, atol=0)
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = hf(x, None, None)
        got = ours(x, AttentionInputs(positions=torch.arange(T).expand(2, T)))
    diff = (got - want).abs().max().item()
    print(f"\n[lightning] max |modkit - MiniMaxLightningAttention| = {diff:.2e}")
    assert diff <= TOL
