"""Kimi Delta Attention (``kimi_delta``) and Gated DeltaNet's negative-eigenvalue option.

* float64, the functions: the chunked form (chunk lengths 1, 3, 8, 64, from a non-zero state) equals the plain
  token-by-token recurrence written here (``S = diag(α) S; S += β k (v - Sᵀ k)ᵀ; o = Sᵀ q``) to 1e-12, with decays
  strong enough to underflow a factorised ``exp(cum)`` / ``exp(-cum)`` form, and β in (0, 2); with document starts,
  each document equals itself alone;
* float32, in a model: token-by-token decoding through the cache and uneven cached chunks equal the full forward;
  the chunk length changes no number; left padding changes no state; the cache holds a constant state;
* against transformers' ``KimiLinearDeltaAttention`` (its PyTorch fallbacks) on the same random weights, 1e-5;
* ``gated_deltanet``'s ``allow_neg_eigval``: off by default (the same numbers as before), on it equals transformers'
  ``OlmoHybridGatedDeltaNet`` with ``linear_allow_neg_eigval=True``.

Packed documents at the model level and the contract checks run for every registered mixer in
``test_mixer_documents.py`` and ``tests/testing/test_contracts.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.analysis.cost import CostModel, Workload
from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes
from modkit_plugins.kimi_delta import _flops, kda_chunked, kda_step

D = 32
TOL = 1e-5
EXACT = 1e-12
MIXER = {"type": "kimi_delta", "n_heads": 2, "head_dim": 8, "chunk_size": 8}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _inputs(b: int = 2, T: int = 29, H: int = 3, dk: int = 5, dv: int = 4, seed: int = 0):
    """Float64 ``q, k, v, g, beta``: unit q and k, per-channel log decays in (-40, 0] (some channels keep, some
    forget within a token), β in (0, 2)."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    q, k = (torch.nn.functional.normalize(r(b, H, T, dk), dim=-1) for _ in range(2))
    v = r(b, H, T, dv)
    scale = torch.tensor([0.01, 0.3, 1.0, 5.0, 40.0], dtype=torch.float64)[:dk]
    g = -torch.rand(b, H, T, dk, generator=gen, dtype=torch.float64) * scale
    beta = 2 * torch.rand(b, H, T, generator=gen, dtype=torch.float64)
    return q, k, v, g, beta


def _recurrence(q, k, v, g, beta, state, starts=None):
    """The token-by-token reference, written out."""
    s, out = state.clone(), []
    for t in range(q.shape[2]):
        alpha = g[:, :, t].exp()
        if starts is not None:
            alpha = alpha * (~starts[:, t])[:, None, None]
        s = s * alpha[..., None]
        err = v[:, :, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, :, t])
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, :, t], err * beta[:, :, t, None])
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, :, t]))
    return torch.stack(out, 2), s


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_chunked_form_equals_the_recurrence_in_float64(chunk):
    q, k, v, g, beta = _inputs()
    s0 = torch.randn(2, 3, 5, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    want, want_state = _recurrence(q, k, v, g, beta, s0)
    got, state = kda_chunked(q, k, v, g, beta, chunk, s0.clone())
    assert (got - want).abs().max().item() <= EXACT
    assert (state - want_state).abs().max().item() <= EXACT
    step_state, outs = s0.clone(), []
    for t in range(q.shape[2]):
        o, step_state = kda_step(q[:, :, t], k[:, :, t], v[:, :, t], g[:, :, t], beta[:, :, t], step_state)
        outs.append(o)
    assert (torch.stack(outs, 2) - want).abs().max().item() <= EXACT
    assert (step_state - want_state).abs().max().item() <= EXACT


def test_document_starts_make_each_document_its_own_sequence_in_float64():
    q, k, v, g, beta = _inputs(seed=2)
    starts = torch.zeros(2, 29, dtype=torch.bool)
    starts[0, [3, 4, 11, 28]] = True
    starts[1, [8, 16]] = True
    got, state = kda_chunked(q, k, v, g, beta, 8, None, starts)
    zero = q.new_zeros(2, 3, 5, 4)
    want, want_state = _recurrence(q, k, v, g, beta, zero, starts)
    assert (got - want).abs().max().item() <= EXACT and (state - want_state).abs().max().item() <= EXACT
    for row, edges in ((0, [0, 3, 4, 11, 28, 29]), (1, [0, 8, 16, 29])):
        for a, b in zip(edges[:-1], edges[1:]):
            part = [t[row : row + 1, :, a:b] for t in (q, k, v, g, beta)]
            alone, _ = _recurrence(*part, zero[:1])
            assert (got[row : row + 1, :, a:b] - alone).abs().max().item() <= EXACT, (row, a, b)
    unmasked, _ = kda_chunked(q, k, v, g, beta, 8)
    assert (unmasked - got).abs().max().item() > 1e-3  # the starts are what makes them equal


# ------------------------------------------------------------------------------------------------- in a model


def _spec(mixer: dict, n_layers: int = 2) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": n_layers,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "init_std": 0.2,
        "block": {"mixer": mixer, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
        "final_norm": {"type": "rmsnorm"},
    }


def _model(**changes):
    return modkit.build(_spec({**MIXER, **changes}), seed=0).eval()


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in units of the reference's scale max(1, max |want|) (float32 rounding grows with it)."""
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


def test_cached_decoding_and_chunked_prefill_equal_the_full_forward():
    model = _model()
    ids = torch.randint(0, 64, (2, 29), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 29)
        steps = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(29)], 1)
        cache = model.new_cache(2, 29)
        chunks = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in ((0, 5), (5, 6), (6, 19), (19, 29))], 1)
        other = [_model(chunk_size=c)(ids).logits for c in (1, 3, 64)]
    assert _err(steps, full) <= TOL and _err(chunks, full) <= TOL
    assert all(_err(o, full) <= TOL for o in other)


def test_left_padding_changes_no_state():
    model = _model()
    ids = torch.randint(1, 64, (2, 20), generator=torch.Generator().manual_seed(10))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :6] = False
    with torch.no_grad():
        assert _err(model(ids, attention_mask=mask).logits[0, 6:], model(ids[:1, 6:]).logits[0]) <= TOL
        cache, single = model.new_cache(2, 20), model.new_cache(1, 14)
        model(ids, attention_mask=mask, cache=cache)
        model(ids[:1, 6:], cache=single)
    for layer, ref in zip(cache.layers, single.layers):
        for key, state in layer.mixers.items():
            for name in ("conv", "recurrent"):
                assert _err(state[name][0].float(), ref.mixers[key][name][0].float()) <= TOL, (key, name)


def test_the_state_is_constant_and_counted():
    model = _model()
    mixer = model.layers[0].attention
    assert {e.name: e.shape for e in mixer.cache_spec().entries} == {"conv": (48, 3), "recurrent": (2, 8, 8)}
    # per layer: recurrent 2·8·8 float32 + conv 48·3 bfloat16
    assert cache_state_bytes_per_sequence(model, "bfloat16") == 2 * (2 * 8 * 8 * 4 + 48 * 3 * 2) == 1600
    assert kv_cache_bytes(model, 1024, 1, "bfloat16") == kv_cache_bytes(model, 32768, 1, "bfloat16") == 1600
    assert modkit.kv_cache_bytes_per_token(model, "bfloat16") == 0
    # q, k, v 3·32·16, conv 48·4, the two low-rank gates 2·(32·8 + 8·16), dt_bias 16, A_log 2, b_proj 32·2,
    # the norm 8, o_proj 16·32
    per_layer = 1536 + 192 + 768 + 16 + 2 + 64 + 8 + 512
    assert sum(p.numel() for p in mixer.parameters()) == per_layer == 3098


def test_cost_reads_the_declarations(tmp_path):
    import json

    path = tmp_path / "kda.json"
    path.write_text(json.dumps(_spec(MIXER)))
    report = CostModel(path).report(context=1024)
    assert report["cache_state_bytes_per_sequence"] == 1600 and report["kv_cache_bytes"] == 1600


# ------------------------------------------------------------------------------------------------- vs transformers

transformers = pytest.importorskip("transformers")


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Every parameter N(0, 0.3²) (A_log and dt_bias too: decays far from their init)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


def _one_layer(mixer: dict):
    model = modkit.build(_spec(mixer, 1), seed=0).eval()
    return model.layers[0].attention


def test_kimi_delta_equals_transformers_kimi_linear():
    from hf_fallback import force_torch_fallback

    force_torch_fallback()
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    cfg = transformers.KimiLinearConfig(
        hidden_size=D,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_heads=2,
        linear_head_dim=8,
        linear_conv_kernel_dim=4,
    )
    hf = KimiLinearDeltaAttention(cfg, 0).eval()
    _perturb(hf, seed=4)
    ours = _one_layer({**MIXER, "norm_eps": cfg.rms_norm_eps})
    weights = {k.removeprefix("forget_gate."): v for k, v in hf.state_dict().items()}
    weights["A_log"] = weights["A_log"].reshape(-1)
    ours.load_state_dict(weights)
    x = torch.randn(2, 37, D, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        diff = (ours(x, AttentionInputs(positions=torch.arange(37).expand(2, 37))) - hf(x)).abs().max().item()
    print(f"\n[kimi_delta] max |modkit - KimiLinearDeltaAttention| = {diff:.2e}")
    assert diff <= TOL


def test_gated_deltanet_negative_eigenvalues_equal_olmo_hybrid():
    from hf_fallback import force_torch_fallback

    force_torch_fallback()
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet

    nk, nv, dk, dv = 2, 4, 8, 6
    cfg = transformers.OlmoHybridConfig(
        hidden_size=D,
        num_hidden_layers=2,
        linear_num_key_heads=nk,
        linear_num_value_heads=nv,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=4,
        linear_allow_neg_eigval=True,
        layer_types=["linear_attention", "full_attention"],
    )
    hf = OlmoHybridGatedDeltaNet(cfg, 0).eval()
    _perturb(hf, seed=6)
    mixer = {"type": "gated_deltanet", "n_heads": nk, "n_value_heads": nv, "key_head_dim": dk}
    mixer.update(value_head_dim=dv, chunk_size=8, norm_eps=hf.o_norm.variance_epsilon)
    names = {"o_proj": "out_proj", "o_norm": "norm"}
    weights = {
        names.get(k.split(".")[0], k.split(".")[0]) + k[len(k.split(".")[0]) :]: v for k, v in hf.state_dict().items()
    }
    x = torch.randn(2, 37, D, generator=torch.Generator().manual_seed(7))
    outs = {}
    for flag in (False, True):
        ours = _one_layer({**mixer, "allow_neg_eigval": flag})
        ours.load_state_dict(weights)
        with torch.no_grad():
            outs[flag] = ours(x, AttentionInputs(positions=torch.arange(37).expand(2, 37)))
    with torch.no_grad():
        want = hf(x)
        diff = (outs[True] - want).abs().max().item()
    print(f"\n[kimi_delta] max |modkit gated_deltanet(allow_neg_eigval) - OlmoHybridGatedDeltaNet| = {diff:.2e}")
    assert diff <= TOL
    assert (outs[False] - want).abs().max().item() > 1e-2  # off (the default) is the (0, 1) rule


# ------------------------------------------------------------------------------- Ling 3's bounded gate (bailing_hybrid)

LING = {**MIXER, "full_rank_gates": True, "forget_gate": "bounded"}


def _ling_pair(safe_gate: bool, lower_bound: float = -5.0):
    """transformers' ``BailingHybridDeltaAttention`` (4 heads of 8 on d_model 32, perturbed weights) and modkit's
    ``kimi_delta`` with the same weights, the bounded gate when ``safe_gate``."""
    from hf_fallback import force_torch_fallback

    force_torch_fallback()
    from transformers.models.bailing_hybrid.modeling_bailing_hybrid import BailingHybridDeltaAttention

    cfg = transformers.BailingHybridConfig(
        hidden_size=D,
        num_attention_heads=4,
        head_dim=8,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        kda_safe_gate=safe_gate,
        kda_lower_bound=lower_bound,
    )
    hf = BailingHybridDeltaAttention(cfg, 0).eval()
    _perturb(hf, seed=11)
    gate = {"forget_gate": "bounded", "gate_lower_bound": lower_bound} if safe_gate else {}
    mixer = {**MIXER, "n_heads": 4, "full_rank_gates": True, **gate, "norm_eps": cfg.rms_norm_eps}
    ours = _one_layer(mixer)
    ours.load_state_dict({k.removeprefix("forget_gate."): v for k, v in hf.state_dict().items()})
    return hf, ours


def _positions(b: int, s: int) -> torch.Tensor:
    return torch.arange(s).expand(b, s)


@pytest.mark.parametrize("safe_gate", [True, False])
def test_ling_gates_equal_transformers_bailing_hybrid_chunked_and_decoding(safe_gate):
    """A chunked forward of 37 tokens, then a 30-token prefill through the cache and 7 decode steps, against
    ``BailingHybridDeltaAttention`` over the whole sequence (its chunked PyTorch form), float32."""
    hf, ours = _ling_pair(safe_gate)
    x = torch.randn(2, 37, D, generator=torch.Generator().manual_seed(12))
    cache = modkit.build(_spec({**LING, "n_heads": 4}, 1), seed=0).new_cache(2, 37)  # a one-layer model's cache

    def cached(part: torch.Tensor) -> torch.Tensor:
        positions, _ = cache.prepare(2, part.shape[1])
        return ours(part, AttentionInputs(positions=positions, cache=cache.layers[0]))

    with torch.no_grad():
        want = hf(x)
        full = ours(x, AttentionInputs(positions=_positions(2, 37)))
        steps = torch.cat([cached(x[:, :30]), *(cached(x[:, t : t + 1]) for t in range(30, 37))], 1)
    diff, step_diff = (full - want).abs().max().item(), (steps - want).abs().max().item()
    print(f"\n[kimi_delta] safe_gate={safe_gate}: chunked {diff:.2e}, prefill + decode {step_diff:.2e}")
    assert diff <= TOL and step_diff <= TOL


def test_ling_bounded_gate_resets_at_document_starts():
    """Two packed documents (17 + 20 tokens) equal transformers' module run on each document alone."""
    hf, ours = _ling_pair(True, lower_bound=-3.0)
    x = torch.randn(1, 37, D, generator=torch.Generator().manual_seed(13))
    docs = torch.cat([torch.zeros(1, 17), torch.ones(1, 20)], 1).long()
    with torch.no_grad():
        packed = ours(x, AttentionInputs(positions=_positions(1, 37), documents=docs))
        want = torch.cat([hf(x[:, :17]), hf(x[:, 17:])], 1)
        unpacked = ours(x, AttentionInputs(positions=_positions(1, 37)))
    assert (packed - want).abs().max().item() <= TOL
    assert (unpacked[:, 17:] - want[:, 17:]).abs().max().item() > 1e-3  # the reset is what makes them equal


def test_bounded_gate_stays_within_its_bound():
    """Whatever the input, the bounded gate's log decays lie in (gate_lower_bound, 0); softplus's go below it."""
    bounded = _one_layer({**LING, "gate_lower_bound": -2.0})
    softplus = _one_layer({**MIXER, "full_rank_gates": True})
    x = 50 * torch.randn(2, 11, D, generator=torch.Generator().manual_seed(14))
    with torch.no_grad():
        for m in (bounded, softplus):
            m.A_log.fill_(1.0)
        g, _ = bounded._gates(x, None)
        g_soft, _ = softplus._gates(x, None)
    assert g.shape == (2, 2, 11, 8) and -2.0 <= g.min().item() and g.max().item() <= 0
    assert g_soft.min().item() < -2.0


def test_ling_options_count_their_parameters_and_flops():
    """Full-rank gates: f_proj and g_proj [16, 32] in place of the rank-8 pairs (32·8 + 8·16 each)."""
    mixer = _one_layer(LING)
    names = {n for n, _ in mixer.named_parameters()}
    assert {"f_proj.weight", "g_proj.weight"} <= names and not any("_a_proj" in n or "_b_proj." in n for n in names)
    per_layer = 1536 + 192 + 2 * 16 * 32 + 16 + 2 + 64 + 8 + 512
    assert sum(p.numel() for p in mixer.parameters()) == per_layer == 3354
    model = modkit.build(_spec(LING, 1), seed=0)
    assert modkit.count_params(model.spec) == sum(p.numel() for p in model.parameters())
    cfg = model.spec.layer(0).attention
    assert _flops(cfg, SimpleNamespace(d_model=D), Workload(batch=1, new=4))["gate_proj"] == 2 * 2 * 4 * 32 * 16


@pytest.mark.parametrize(
    "change,says",
    [
        ({"full_rank_gates": True, "gate_rank": 4}, "drop gate_rank"),
        ({"gate_lower_bound": -3.0}, "set forget_gate 'bounded'"),
        ({"forget_gate": "bounded", "gate_lower_bound": 2.0}, "gate_lower_bound"),
        ({"forget_gate": "sigmoid"}, "forget_gate"),
    ],
)
def test_ling_options_refuse_what_does_not_fit(change, says):
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(_spec({**MIXER, **change}))
    assert says in str(info.value)


def test_the_contract_kit_passes_on_the_ling_options():
    """The kit's checks (document resets, decoding through the cache, causality, FLOPs, counts...) on the bounded
    gate with full-rank gates, as the registry's example runs them on the default form."""
    from modkit.testing import check_component

    results = check_component("mixer", "kimi_delta", {**LING, "gate_lower_bound": -2.0})
    bad = {r.check: r.detail for r in results if r.status == "failed"}
    assert not bad, bad
    passed = {r.check for r in results if r.status == "passed"}
    assert {"kv_cache_decode", "causality", "flops", "param_count", "gradients"} <= passed
    assert any("document" in name for name in passed), passed
