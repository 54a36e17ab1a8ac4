"""``mlstm`` (xLSTM's matrix-memory LSTM) against its recurrence, its cache, packed documents, the contract kit and
transformers' ``xLSTMLayer`` and native kernels.

* float64, the functions: the chunkwise form (chunk lengths 1, 4, 8 and longer than the sequence; padding tokens;
  document starts, one at position 0; a non-zero entering state) equals the one-token recurrence to 1e-12; a packed
  row's documents equal each document alone;
* float32, in a model: decoding token by token through the cache and a prefill in uneven pieces equal the full
  forward (each within 1e-5 of the float64 forward); another chunk length gives the same logits; left padding
  changes neither logits nor state; packed documents equal the documents alone; the contract kit runs and passes
  the checks of a recurrent mixer; the declared state is ``C``, ``n``, ``m`` in float32, read by cache bytes and
  ``modkit cost``; widths the heads do not divide are refused by name;
* float32, the module: equal to transformers' ``xLSTMLayer`` on the same weights to 1e-5 (with and without biases,
  a sequence that is no multiple of either chunk length), and the chunkwise function's final state equal to the one
  transformers' chunkwise kernel returns.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes
from modkit_plugins import mlstm as ml
from modkit_plugins.mlstm import Gates, State, mlstm_chunked, mlstm_step

TOL = 1e-5
EXACT = 1e-12
D = 32
T = 29


def _registry():
    """The process registry with ``mlstm`` in it (registered here when the installed package's entry points predate
    the module)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reg = modkit.get_registry()
    if "mlstm" not in reg.types("mixer"):
        reg.register_plugin(ml, "builtin-mlstm", distribution="modkit-lm")
    return reg


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _inputs(seed: int = 11, b: int = 2, H: int = 3, dk: int = 4, dv: int = 6, n: int = T):
    """Float64 q, k, v and gates (input pre-activations in [-6, 6], forget gates of either strength)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = r(b, H, n, dk), r(b, H, n, dk), r(b, H, n, dv)
    i = (torch.rand(b, H, n, generator=g, dtype=torch.float64) - 0.5) * 12
    lf = torch.nn.functional.logsigmoid(r(b, H, n) * 3)
    return q, k, v, Gates(i, lf)


def _masked(q, k, v, gates, real):
    """Padding tokens: no q, k, v; ``i = -inf`` and ``log σ(f) = 0`` (the state is kept)."""
    q, k, v = (t * real[:, None, :, None] for t in (q, k, v))
    return q, k, v, Gates(torch.where(real[:, None] > 0, gates.i, -torch.inf), gates.lf * real[:, None])


def _recurrence(q, k, v, gates, state, starts):
    """The reference: one token at a time through :func:`mlstm_step`."""
    hs = []
    for t in range(q.shape[2]):
        reset = None if starts is None else starts[:, t]
        gt = Gates(gates.i[..., t], gates.lf[..., t])
        h, state = mlstm_step(q[:, :, t], k[:, :, t], v[:, :, t], gt, state, 1e-6, reset)
        hs.append(h)
    return torch.stack(hs, 2), state


def _warm_state(seed: int = 3) -> State:
    """A state after 5 tokens: non-zero memory and normaliser, a stabiliser away from 0."""
    q, k, v, gates = _inputs(seed=seed, n=5)
    _, state = mlstm_chunked(q, k, v, gates, 8, 1e-6)
    return state


@pytest.mark.parametrize("chunk", [1, 4, 8, 64])
def test_the_chunkwise_form_equals_the_recurrence_in_float64(chunk):
    real = torch.ones(2, T, dtype=torch.float64)
    real[0, :5] = 0  # left padding
    real[1, 12] = 0  # a padding token inside (a chunked prefill over a masked token)
    q, k, v, gates = _masked(*_inputs(), real)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[0, [0, 9, 10, 17]] = True  # a start at 0 drops the entering state
    starts[1, [4, 8, 28]] = True
    warm = _warm_state()
    for flags in (None, starts):
        got, final = mlstm_chunked(q, k, v, gates, chunk, 1e-6, warm, flags)
        want, last = _recurrence(q, k, v, gates, warm, flags)
        assert (got - want).abs().max().item() <= EXACT
        for a, b in zip(final, last):
            assert (a - b).abs().max().item() <= EXACT


def test_the_recurrence_is_the_unstabilised_sum():
    """Without padding or state, and eps 0 (where the stabiliser cancels): ``h_t = q̂_t · Σ_j e^{w_t - w_j + i_j} k_j
    v_jᵀ / max(|q̂_t · Σ_j e^{w_t - w_j + i_j} k_j|, 1)``, the floor 1 being the initial ``m = 0``."""
    q, k, v, gates = _inputs(seed=5, n=9)
    got, _ = mlstm_chunked(q, k, v, gates, 4, 0.0)
    w = gates.lf.cumsum(-1)
    logw = (w[..., :, None] - w[..., None, :] + gates.i[..., None, :]).masked_fill(
        ~torch.ones(9, 9, dtype=torch.bool).tril(), -torch.inf
    )
    weights = torch.exp(logw)
    qs = q * q.shape[-1] ** -0.5
    scores = (qs @ k.transpose(-1, -2)) * weights
    num, den = scores @ v, scores.sum(-1)
    want = num / torch.clamp(den.abs(), min=1.0)[..., None]
    assert (got - want).abs().max().item() <= 1e-9 * max(1.0, want.abs().max().item())


def test_packed_documents_equal_each_document_alone_in_float64():
    q, k, v, gates = _inputs(seed=5)
    starts = torch.zeros(2, T, dtype=torch.bool)
    starts[:, [3, 4, 13, 28]] = True
    packed, _ = mlstm_chunked(q, k, v, gates, 8, 1e-6, None, starts)
    unflagged, _ = mlstm_chunked(q, k, v, gates, 8, 1e-6)
    for a, b in zip([0, 3, 4, 13, 28], [3, 4, 13, 28, T]):
        piece = Gates(gates.i[..., a:b], gates.lf[..., a:b])
        alone, _ = mlstm_chunked(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], piece, 8, 1e-6)
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


MIXER = {"type": "mlstm", "n_heads": 4, "chunk_size": 8}


def _model(**changes):
    """A 2-layer model whose gates are drawn too (xLSTM's init leaves them constant)."""
    _registry()
    model = modkit.build(_spec({**MIXER, **changes}), seed=0).eval()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for layer in model.layers:
            for gate in (layer.attention.igate_preact, layer.attention.fgate_preact):
                gate.weight.copy_(torch.randn(gate.weight.shape, generator=g) * 0.3)
                gate.bias.copy_(torch.randn(gate.bias.shape, generator=g))
    return model


def _scaled(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


def test_cached_decoding_and_uneven_prefill_equal_the_full_forward():
    """Each float32 path within 1e-5 (in units of the logits' scale) of the full forward in float64: the per-head
    LayerNorm of a read-out held at its floor magnifies float32 rounding, so two float32 paths may differ by 1e-5
    from each other (as Gated DeltaNet's gated norm does in ``test_mixers.py``)."""
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
        exact = _model().double()(ids).logits
    for got in (full, steps, chunks, other):
        assert _scaled(got.double(), exact) <= TOL
    state = next(iter(cache.layers[0].mixers.values())).spec.sequence_entries
    assert [(e.name, e.shape, e.dtype) for e in state] == [
        ("C", (4, 4, 8), torch.float32),
        ("n", (4, 4), torch.float32),
        ("m", (4,), torch.float32),
    ]
    per_sequence = 2 * 4 * (4 * 4 * 8 + 4 * 4 + 4)  # layers · float32 bytes · (C, n, m)
    assert modkit.kv_cache_bytes_per_token(model, "bfloat16") == 0
    assert cache_state_bytes_per_sequence(model, "bfloat16") == per_sequence
    assert kv_cache_bytes(model, 1024, 1, "bfloat16") == kv_cache_bytes(model, 32768, 1, "bfloat16") == per_sequence
    assert model.new_cache(3, 48).nbytes() == 3 * per_sequence


def test_cost_reads_the_declared_state(tmp_path):
    """``modkit cost``: the state bytes are the declared entries' sum, the same at 1K and 32K of context."""
    from modkit.analysis.cost import CostModel

    _registry()
    path = tmp_path / "mlstm.json"
    path.write_text(json.dumps(_spec(MIXER)))
    short, long = (CostModel(path).report(context=n) for n in (1024, 32768))
    assert short["cache_state_bytes_per_sequence"] == long["cache_state_bytes_per_sequence"] == 2 * 4 * 148
    assert short["kv_cache_bytes"] == long["kv_cache_bytes"] == 2 * 4 * 148


def test_packed_documents_in_a_model_equal_each_document_alone():
    model = _model()
    ids = torch.randint(3, 64, (2, 24), generator=torch.Generator().manual_seed(4))
    docs = torch.tensor([[0] * 5 + [1] + [2] * 13 + [3] * 5, [0] * 9 + [1] * 15])
    with torch.no_grad():
        packed = model(ids, documents=docs).logits
        for r, pieces in enumerate([[(0, 5), (5, 6), (6, 19), (19, 24)], [(0, 9), (9, 24)]]):
            for a, b in pieces:
                assert _scaled(packed[r, a:b], model(ids[r : r + 1, a:b]).logits[0]) <= TOL


def test_the_contract_kit_runs_the_recurrent_checks_and_they_pass():
    """The checks a recurrent mixer's declarations decide (every check, compile included, runs in
    ``tests/testing/test_contracts.py`` over every built-in): none skipped, none failed."""
    from modkit.testing import check_component

    _registry()
    wanted = {"kv_cache_decode", "document_mask", "masked_row", "flops", "param_count"}
    results = check_component("mixer", "mlstm", checks=sorted(wanted))
    assert not [f"{r.id}: {r.detail}" for r in results if r.status == "failed"]
    assert {r.check for r in results if r.status == "passed"} == wanted


def test_the_init_is_xlstm_7bs():
    model = modkit.build(_spec(MIXER), seed=0)
    m = model.layers[0].attention
    assert torch.equal(m.igate_preact.weight, torch.zeros(4, D)) and torch.equal(
        m.fgate_preact.weight, torch.zeros(4, D)
    )
    assert torch.equal(m.igate_preact.bias, torch.full((4,), -10.0))
    assert torch.allclose(m.fgate_preact.bias, torch.linspace(3.0, 6.0, 4)) and torch.equal(
        m.multihead_norm.weight, torch.ones(32)
    )


# ----------------------------------------------------------------------------------------------- vs transformers


def _hf_layer(bias: bool):
    transformers = pytest.importorskip("transformers")
    from transformers.models.xlstm import modeling_xlstm as mx

    if mx.external_xlstm:
        pytest.skip("the xlstm package replaces transformers' own layer")
    cfg = transformers.xLSTMConfig(
        hidden_size=D,
        num_heads=4,
        qk_dim_factor=0.5,
        v_dim_factor=2.0,
        chunk_size=8,
        use_bias=bias,
        num_hidden_layers=1,
    )
    hf = mx.xLSTMLayer(cfg).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return hf, mx


@pytest.mark.parametrize("bias", [False, True])
def test_equals_transformers_xlstm_layer(bias):
    """transformers' inference path: chunks of 8 for the first 24 tokens, then its step kernel for the last 5; ours:
    chunks of 5."""
    hf, _ = _hf_layer(bias)
    _registry()
    model = modkit.build(_spec({**MIXER, "v_dim": 64, "chunk_size": 5, "bias": bias}, n_layers=1), seed=0).eval()
    ours = model.layers[0].attention
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = hf(x)
        got = ours(x, AttentionInputs(positions=torch.arange(T).expand(2, T)))
    diff = (got - want).abs().max().item()
    print(f"\n[mlstm] max |modkit - xLSTMLayer| = {diff:.2e} (bias={bias})")
    assert diff <= TOL


def test_the_final_state_equals_transformers_chunkwise_kernel():
    """The state the chunkwise form hands on (``C``, ``n``, ``m``) is the one of transformers' native kernel, from a
    non-zero entering state (float32, 1e-5 relative)."""
    _, mx = _hf_layer(False)
    q, k, v, gates = (t.float() if isinstance(t, torch.Tensor) else t for t in _inputs(seed=7, n=24))
    i, lf = gates.i.float(), gates.lf.float()
    f = torch.log(torch.expm1(-lf).reciprocal())  # the pre-activation whose log-sigmoid is lf
    warm = State(*(t.float() for t in _warm_state()))
    want_h, (C, n, m) = mx.mlstm_chunkwise_native_autograd(
        q, k, v, i, f, warm.C, warm.n, warm.m[..., None], return_last_states=True, chunk_size=8
    )
    got_h, state = mlstm_chunked(q, k, v, Gates(i, torch.nn.functional.logsigmoid(f)), 5, 1e-6, warm)
    assert _scaled(got_h, want_h) <= TOL
    for got, want in zip(state, (C, n, m[..., 0])):
        assert _scaled(got, want) <= TOL


def test_widths_the_heads_do_not_divide_are_refused_by_name():
    _registry()
    with pytest.raises(modkit.SpecError) as info:
        modkit.build(_spec({**MIXER, "qk_dim": 18}), device="meta")
    assert any(path.endswith("qk_dim") and "n_heads = 4" in msg for path, msg in info.value.errors), info.value.errors


def test_left_padding_changes_no_state():
    """A row padded on the left by 6 gives the logits and, fed through the cache in chunks (the first all padding),
    the state of the row alone."""
    model = _model()
    ids = torch.randint(1, 64, (2, 20), generator=torch.Generator().manual_seed(10))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :6] = False
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        alone = model(ids[:1, 6:]).logits
        assert _scaled(padded[0, 6:], alone[0]) <= TOL
        cache = model.new_cache(2, 20)
        for a, b in ((0, 4), (4, 11), (11, 20)):
            model(ids[:, a:b], attention_mask=mask[:, :b], cache=cache)
        single = model.new_cache(1, 14)
        model(ids[:1, 6:], cache=single)
    for layer, ref in zip(cache.layers, single.layers):
        for key, state in layer.mixers.items():
            for name in ("C", "n", "m"):
                assert _scaled(state[name][0], ref.mixers[key][name][0]) <= TOL, (key, name)
