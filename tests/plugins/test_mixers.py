"""The recurrent token mixers against transformers' own PyTorch implementation of the same layer, and against
themselves: chunked (parallel) form = recurrent step, cached decoding = full forward, padding changes no state, the
state does not grow with the context.

* ``mamba2`` = ``Mamba2Mixer`` (groups, biases) and ``FalconH1Mixer`` (its own width, norm before the gate, no norm,
  μP projection multipliers); ``gated_deltanet`` = ``Qwen3NextGatedDeltaNet`` (grouped values, key width ≠ value
  width); ``mamba`` = ``JambaMambaMixer`` (Δ/B/C RMSNorms, biases), on the same weights, float32, 1e-5;
* every mixer (and the ``parallel`` hybrid of attention and Mamba-2): a sequence fed token by token through the
  cache, or in uneven chunks, equals its full forward (1e-5 of the logits' largest magnitude: the per-head gated
  RMSNorm of a near-zero read-out, ``q_t ⊥ k_t``, magnifies float32 rounding; the chunked and recurrent functions
  agree to 1e-15 in float64), whatever the chunk length of the chunked form;
* a left-padded row leaves the same state and the same logits as the row alone; the cache holds the same bytes at
  1K and 32K context.

transformers runs its PyTorch fallbacks here (:mod:`hf_fallback` makes the kernel packages unimportable).
"""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes

transformers = pytest.importorskip("transformers")

from hf_fallback import force_torch_fallback  # noqa: E402

force_torch_fallback()

from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector  # noqa: E402
from transformers.models.jamba.modeling_jamba import JambaMambaMixer  # noqa: E402
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer  # noqa: E402
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet  # noqa: E402

TOL = 1e-5
D = 32


def _max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in units of the reference's scale, max(1, max |want|): float32 rounding grows with the
    logits, and the per-head gated norm of a near-zero read-out magnifies it (1.4e-5 absolute at |logits| 4.7 for
    Gated DeltaNet at chunk 3 against chunk 1), so an absolute bound passes or fails by the machine's summation
    order. The exact math is checked in float64 at 1e-12 (``test_the_chunked_functions_equal_their_recurrence_in_float64``)."""
    return (got - want).abs().max().item() / max(1.0, want.abs().max().item())


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    yield
    torch.set_num_threads(n)


def _spec(mixer: dict, n_layers: int = 1, **top) -> dict:
    position = {"type": "rope"} if mixer["type"] == "parallel" else {"type": "none"}
    return {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": n_layers,
        "max_seq_len": 64,
        "position": position,
        "init_std": 0.2,
        "block": {"mixer": mixer, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
        "final_norm": {"type": "rmsnorm"},
        **top,
    }


def _mixer(cfg: dict):
    """A modkit model of one layer holding the mixer, and the mixer module."""
    model = modkit.build(_spec(cfg), seed=0).eval()
    return model, model.layers[0].attention


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter drawn N(0, 0.3²) (A_log and dt_bias too: decays far from their init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _inputs(b: int, s: int, mask=None) -> AttentionInputs:
    return AttentionInputs(positions=torch.arange(s).expand(b, s), token_mask=mask)


def _x(b: int = 2, s: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randn(b, s, D, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------- vs transformers


@pytest.mark.parametrize("bias", [False, True], ids=["plain", "biases"])
def test_mamba2_equals_transformers_mamba2_mixer(bias):
    cfg = transformers.Mamba2Config(
        hidden_size=D,
        num_heads=8,
        head_dim=8,
        state_size=16,
        n_groups=2,
        expand=2,
        conv_kernel=4,
        use_bias=bias,
        use_conv_bias=True,
        chunk_size=16,
    )
    hf = Mamba2Mixer(cfg, 0).eval()
    _perturb(hf)
    _, ours = _mixer(
        {
            "type": "mamba2",
            "d_state": 16,
            "head_dim": 8,
            "expand": 2,
            "n_groups": 2,
            "d_conv": 4,
            "in_proj_bias": bias,
            "out_proj_bias": bias,
            "chunk_size": 8,
            "norm_eps": cfg.layer_norm_epsilon,
        }
    )
    ours.load_state_dict(hf.state_dict())
    x = _x()
    with torch.no_grad():
        diff = (ours(x, _inputs(2, 37)) - hf(x)).abs().max().item()
    print(f"\n[mixers] mamba2 ({'biases' if bias else 'plain'}) max |modkit - Mamba2Mixer| = {diff:.2e}")
    assert diff <= TOL


FALCON_VARIANTS = {
    # Falcon-H1's defaults: no gated norm (y * silu(z)), d_ssm independent of expand, μP multipliers on every part
    "no-norm": dict(mamba_rms_norm=False, ssm_multipliers=[0.5, 2.0, 0.25, 1.5, 0.75]),
    # the gated norm, normalising before the gate, over 2 groups, with projection and convolution biases
    "norm-first": dict(
        mamba_rms_norm=True, mamba_norm_before_gate=True, mamba_n_groups=2, mamba_proj_bias=True, projectors_bias=True
    ),
    # gate first (Mamba-2's order) with a step-size clamp
    "gate-first": dict(mamba_rms_norm=True, mamba_norm_before_gate=False, time_step_limit=(0.05, 1.5)),
}


@pytest.mark.parametrize("variant", sorted(FALCON_VARIANTS))
def test_mamba2_equals_transformers_falcon_h1_mixer(variant):
    kw = dict(
        hidden_size=D,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=48,
        mamba_n_heads=6,
        mamba_d_head=8,
        mamba_d_state=8,
        mamba_n_groups=1,
        mamba_d_conv=3,
        num_hidden_layers=1,
        mamba_chunk_size=8,
    )
    kw.update(FALCON_VARIANTS[variant])
    cfg = transformers.FalconH1Config(**kw)
    hf = FalconH1Mixer(cfg, 0).eval()
    hf.register_buffer("mup_vector", compute_mup_vector(cfg), persistent=False)
    _perturb(hf, seed=2)
    lo, hi = cfg.time_step_limit
    mixer = {
        "type": "mamba2",
        "d_inner": 48,
        "head_dim": 8,
        "d_state": 8,
        "n_groups": cfg.mamba_n_groups,
        "d_conv": 3,
        "conv_bias": True,
        "in_proj_bias": cfg.mamba_proj_bias,
        "out_proj_bias": cfg.projectors_bias,
        "gated_norm": cfg.mamba_rms_norm,
        "norm_before_gate": cfg.mamba_norm_before_gate,
        "norm_eps": cfg.rms_norm_eps,
        "chunk_size": 5,
        "dt_clamp_min": lo,
        **({"dt_clamp_max": hi} if hi != float("inf") else {}),
    }
    if variant == "no-norm":
        mixer["projection_multipliers"] = list(cfg.ssm_multipliers)
    _, ours = _mixer(mixer)
    ours.load_state_dict(hf.state_dict(), strict=False)  # Falcon-H1 has no norm weight without the gated norm
    assert {k for k in ours.state_dict()} == {k for k in hf.state_dict()}
    x = _x(seed=3)
    with torch.no_grad():
        diff = (ours(x, _inputs(2, 37)) - hf(x)).abs().max().item()
    print(f"\n[mixers] mamba2 as Falcon-H1 ({variant}) max |modkit - FalconH1Mixer| = {diff:.2e}")
    assert diff <= TOL


def _qwen3_next_weights(hf, nk: int, nv: int, dk: int, dv: int) -> dict:
    """Qwen3-Next's fused projections split as modkit holds them: ``in_proj_qkvz`` is, per key head, its q and k
    rows then the q, k, v, z rows of its value heads; ``in_proj_ba`` per key head its β then its α rows."""
    r = nv // nk
    q, k, v, z = hf.in_proj_qkvz.weight.view(nk, 2 * dk + 2 * r * dv, D).split([dk, dk, r * dv, r * dv], 1)
    b, a = hf.in_proj_ba.weight.view(nk, 2 * r, D).split([r, r], 1)
    flat = lambda t: t.reshape(-1, D)  # noqa: E731
    return {
        "q_proj.weight": flat(q),
        "k_proj.weight": flat(k),
        "v_proj.weight": flat(v),
        "g_proj.weight": flat(z),
        "b_proj.weight": flat(b),
        "a_proj.weight": flat(a),
        "conv1d.weight": hf.conv1d.weight,
        "dt_bias": hf.dt_bias,
        "A_log": hf.A_log,
        "norm.weight": hf.norm.weight,
        "out_proj.weight": hf.out_proj.weight,
    }


def test_gated_deltanet_equals_transformers_qwen3_next():
    nk, nv, dk, dv = 2, 4, 8, 6
    cfg = transformers.Qwen3NextConfig(
        hidden_size=D,
        linear_num_key_heads=nk,
        linear_num_value_heads=nv,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
    )
    hf = Qwen3NextGatedDeltaNet(cfg, 0).eval()
    _perturb(hf, seed=4)
    _, ours = _mixer(
        {
            "type": "gated_deltanet",
            "n_heads": nk,
            "n_value_heads": nv,
            "key_head_dim": dk,
            "value_head_dim": dv,
            "chunk_size": 8,
            "norm_eps": cfg.rms_norm_eps,
        }
    )
    ours.load_state_dict(_qwen3_next_weights(hf, nk, nv, dk, dv))
    x = _x(seed=5)
    with torch.no_grad():
        diff = (ours(x, _inputs(2, 37)) - hf(x)).abs().max().item()
    print(f"\n[mixers] gated_deltanet max |modkit - Qwen3NextGatedDeltaNet| = {diff:.2e}")
    assert diff <= TOL


def test_mamba_equals_transformers_jamba_mixer():
    cfg = transformers.JambaConfig(
        hidden_size=D,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        mamba_proj_bias=True,
        num_hidden_layers=1,
    )
    hf = JambaMambaMixer(cfg, 0).eval()
    _perturb(hf, seed=6)
    _, ours = _mixer(
        {
            "type": "mamba",
            "d_state": 8,
            "d_conv": 4,
            "expand": 2,
            "dt_rank": 4,
            "bias": True,
            "chunk_size": 8,
            "inner_norm": {"type": "rmsnorm", "eps": cfg.rms_norm_eps},
        }
    )
    names = {"dt_layernorm": "dt_norm", "b_layernorm": "b_norm", "c_layernorm": "c_norm"}
    ours.load_state_dict(
        {names.get(k.split(".")[0], k.split(".")[0]) + k[len(k.split(".")[0]) :]: v for k, v in hf.state_dict().items()}
    )
    x = _x(seed=7)
    with torch.no_grad():
        diff = (ours(x, _inputs(2, 37)) - hf(x)).abs().max().item()
    print(f"\n[mixers] mamba max |modkit - JambaMambaMixer| = {diff:.2e}")
    assert diff <= TOL


# ------------------------------------------------------------------------------------------------- the two forms

MIXERS = {
    "mamba2": {"type": "mamba2", "d_state": 16, "head_dim": 8, "n_groups": 2, "chunk_size": 8},
    "gated_deltanet": {
        "type": "gated_deltanet",
        "n_heads": 2,
        "n_value_heads": 4,
        "key_head_dim": 8,
        "value_head_dim": 8,
        "chunk_size": 8,
    },
    "mamba": {"type": "mamba", "d_state": 8, "dt_rank": 4, "chunk_size": 8, "inner_norm": {"type": "rmsnorm"}},
    "parallel": {
        "type": "parallel",
        "mixers": [
            {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
            {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 8},
        ],
        "in_multipliers": [1.0, 0.5],
        "out_multipliers": [0.5, 2.0],
    },
}
#: ``[start, end)`` chunks fed through the cache: a prefill shorter than a chunk, single tokens, a chunk that
#: crosses the chunked form's chunk boundaries, and more single tokens (29 tokens in all)
SCHEDULE = ((0, 3), (3, 4), (4, 17), (17, 18), (18, 19), (19, 28), (28, 29))


def _model(name: str, n_layers: int = 2, **changes):
    cfg = {**MIXERS[name], **changes}
    return modkit.build(_spec(cfg, n_layers), seed=0).eval()


def _scan_inputs(kind: str, b: int = 2, T: int = 29):
    """Float64 inputs of the three chunked functions (the kind's layout), decays of either strength."""
    g = torch.Generator().manual_seed(11)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    u = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)  # noqa: E731
    if kind == "ssd":  # x [b, T, H, P], dt [b, T, H], A [H], B/C [b, T, G, N]
        return r(b, T, 4, 3), u(b, T, 4), -u(4) * 3, r(b, T, 2, 5), r(b, T, 2, 5)
    if kind == "scan":  # x, dt [b, T, D], A [D, N], B/C [b, T, N]
        return r(b, T, 6), u(b, T, 6), -u(6, 5) * 3, r(b, T, 5), r(b, T, 5)
    unit = lambda t: t / t.norm(dim=-1, keepdim=True)  # noqa: E731  # q, k [b, H, T, dk], v [b, H, T, dv], g, β
    return unit(r(b, 3, T, 8)), unit(r(b, 3, T, 8)), r(b, 3, T, 6), -u(b, 3, T) * 3, u(b, 3, T)


@pytest.mark.parametrize("kind", ["ssd", "scan", "delta_rule"])
def test_the_chunked_functions_equal_their_recurrence_in_float64(kind):
    """The chunked form is the same math as the recurrent step: 1e-12 in float64, from a non-zero state."""
    from modkit_plugins.gated_deltanet import delta_rule_chunked, delta_rule_step
    from modkit_plugins.mamba import scan_chunked, scan_step
    from modkit_plugins.mamba2 import ssd_chunked, ssd_step

    chunked, step = {
        "ssd": (ssd_chunked, ssd_step),
        "scan": (scan_chunked, scan_step),
        "delta_rule": (delta_rule_chunked, delta_rule_step),
    }[kind]
    args = _scan_inputs(kind)
    time_axis = 2 if kind == "delta_rule" else 1
    T = args[0].shape[time_axis]
    at = lambda t, i: t.select(time_axis, i) if t.dim() > 1 and t.shape[time_axis] == T else t  # noqa: E731
    _, warm = chunked(
        *(at(a, 0).unsqueeze(time_axis) if a.dim() > 1 and a.shape[time_axis] == T else a for a in args), 1
    )  # a state after one token to start from
    y, final = chunked(*args, 8, warm.clone())
    state, ys = warm.clone(), []
    for i in range(T):
        out, state = step(*(at(a, i) for a in args), state)
        ys.append(out)
    assert (y - torch.stack(ys, time_axis)).abs().max().item() <= 1e-12
    assert (final - state).abs().max().item() <= 1e-12


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_recurrent_step_and_cached_chunks_equal_the_full_forward(name):
    model = _model(name)
    ids = torch.randint(0, 64, (2, 29), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 29)
        steps = torch.cat([model(ids[:, t : t + 1], cache=cache).logits for t in range(29)], 1)  # the recurrent form
        cache = model.new_cache(2, 29)
        chunks = torch.cat([model(ids[:, a:b], cache=cache).logits for a, b in SCHEDULE], 1)
    assert _max_error(steps, full) <= TOL
    assert _max_error(chunks, full) <= TOL


@pytest.mark.parametrize("name", ["mamba2", "gated_deltanet", "mamba"])
def test_the_chunk_length_changes_no_number(name):
    ids = torch.randint(0, 64, (2, 29), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        outs = [_model(name, chunk_size=c)(ids).logits for c in (1, 3, 8, 64)]
    for out in outs[1:]:
        assert _max_error(out, outs[0]) <= TOL


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_left_padding_changes_no_state(name):
    """A row padded on the left by 6 leaves the state and the logits of the row alone, also fed through the cache in
    chunks (the first of them all padding)."""
    model = _model(name)
    ids = torch.randint(1, 64, (2, 20), generator=torch.Generator().manual_seed(10))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[0, :6] = False
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        alone = model(ids[:1, 6:]).logits
        assert _max_error(padded[0, 6:], alone[0]) <= TOL
        cache = model.new_cache(2, 20)
        for a, b in ((0, 4), (4, 11), (11, 20)):
            model(ids[:, a:b], attention_mask=mask[:, :b], cache=cache)
        single = model.new_cache(1, 14)
        model(ids[:1, 6:], cache=single)
    for layer, ref in zip(cache.layers, single.layers):
        for key, state in layer.mixers.items():
            for entry in state.spec.sequence_entries:
                got, want = state[entry.name][0], ref.mixers[key][entry.name][0]
                assert _max_error(got.float(), want.float()) <= TOL, (key, entry.name)


@pytest.mark.parametrize("name", ["mamba2", "gated_deltanet", "mamba"])
def test_the_state_does_not_grow_with_the_context(name):
    model = _model(name)
    per_sequence = cache_state_bytes_per_sequence(model, "bfloat16")
    assert per_sequence > 0 and modkit.kv_cache_bytes_per_token(model, "bfloat16") == 0
    assert kv_cache_bytes(model, 1024, 1, "bfloat16") == kv_cache_bytes(model, 32768, 1, "bfloat16") == per_sequence
    mixer = model.layers[0].attention
    state = {e.name: e.shape for e in mixer.cache_spec().entries}
    assert all(e.growth == "sequence" for e in mixer.cache_spec().entries)
    big = "ssm" if "ssm" in state else "recurrent"
    assert mixer.cache_spec().entries[1].dtype == torch.float32 and big in state
    assert model.new_cache(2, 48).nbytes() == 2 * kv_cache_bytes(model, 48, 1, "float32")


@pytest.mark.parametrize("name", ["tiny-mamba2", "tiny-hybrid"])
def test_cost_reports_a_constant_state_per_sequence(name):
    """``modkit cost``'s figures for the shipped recurrent specs: the state bytes are the declared entries' sum
    (mamba2 per layer: ssm 8·32·32 float32 + conv (256 + 2·32)·3 bfloat16 = 34,688 bytes), the same at 1K and 32K;
    only the hybrid's attention layer adds bytes per token; no crossover without attention."""
    from pathlib import Path

    from modkit.analysis.cost import CostModel

    cost = CostModel(Path(__file__).parents[2] / "specs" / f"{name}.json")
    short, long = (cost.report(context=n) for n in (1024, 32768))
    per_seq = short["cache_state_bytes_per_sequence"]
    assert per_seq == long["cache_state_bytes_per_sequence"] > 0
    if name == "tiny-mamba2":  # no attention: nothing quadratic in the training length (measured at chunk multiples)
        assert short["training_memory"]["attention_matrix"] == 0
        assert per_seq == 4 * (8 * 32 * 32 * 4 + (256 + 2 * 32) * 3 * 2) == 138_752
        assert short["kv_cache_bytes"] == long["kv_cache_bytes"] == per_seq
        assert short["attention_overtakes_ffn"]["decode"]["scores"] is None
    else:  # one gqa layer: 2 · 2 kv heads · 32 · 2 bytes per token
        assert long["kv_cache_bytes"] - short["kv_cache_bytes"] == (32768 - 1024) * 2 * 2 * 32 * 2
    part = "mixer.scan" if name == "tiny-mamba2" else "mixer.delta_rule"  # decode FLOPs of the recurrence: flat
    assert short["flops_per_token"]["decode"][part] == long["flops_per_token"]["decode"][part] > 0


def test_a_parallel_hybrid_of_attentions_with_other_head_widths_is_refused_under_rope():
    # one rope per layer, built for the first attention's 8-wide heads: it would turn only the first 8 features of
    # the second attention's 16-wide heads, at the frequencies of an 8-wide head
    par = {
        "type": "parallel",
        "mixers": [{"type": "gqa", "n_heads": 4, "n_kv_heads": 2}, {"type": "mha", "n_heads": 2}],
    }
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(_spec(par))
    assert [p for p, _ in err.value.errors] == ["block.mixer.mixers[1]"], err.value.errors
    msg = err.value.errors[0][1]
    assert "head_dim = 16" in msg and "head_dim = 8" in msg and "'rope'" in msg and "layers 0" in msg, msg
    # the same head width with fewer heads is one rope for both, and a scheme on the embeddings has no geometry
    modkit.load_spec(_spec({**par, "mixers": [par["mixers"][0], {"type": "mha", "n_heads": 2, "head_dim": 8}]}))
    modkit.load_spec(_spec(par, position={"type": "sinusoidal"}))
