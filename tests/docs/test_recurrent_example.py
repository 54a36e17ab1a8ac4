"""The plugin guide's recurrent worked example (``docs/examples/retention.py``): a ``mixer`` whose state lives in the
cache it declares. It passes the contract kit as written; its parallel form equals the recurrence computed token by
token in float64; decoding from its cache equals the full forward; a forward adds nothing to the module; ``modkit
cost`` sees constant FLOPs per decoded token (no crossover) and a fixed state per sequence.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import modkit
from modkit.testing import check_component

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "retention.py"


def _example():
    spec = importlib.util.spec_from_file_location("retention_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an installed plugin's module is
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return _example()


@pytest.fixture(scope="module")
def registry(example):
    reg = modkit.Registry()
    reg.load_entry_points(strict=True)
    reg.register_plugin(example, "retention-example")  # the module is the plugin (its register_components hook)
    return reg


def _spec(ffn: bool = True) -> dict:
    return {
        "schema_version": 1,
        "name": "retention-example",
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "block": {
            "mixer": {"type": "retention", "n_heads": 4, "key_dim": 8, "value_dim": 8},
            "ffn": {"type": "swiglu", "d_ff": 64} if ffn else None,
            "norm": {"type": "rmsnorm", "eps": 1e-5},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm", "eps": 1e-5},
    }


def test_the_example_passes_the_contract_kit(registry):
    results = check_component("mixer", "retention", registry=registry)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n".join(f"{r.check}: {r.detail}" for r in failed)
    passed = {r.check for r in results if r.status == "passed"}
    assert {
        "causality",
        "kv_cache_decode",
        "masked_row",
        "meta_init",
        "param_count",
        "param_roles",
        "flops",
        "precision",
    } <= passed


def test_the_parallel_form_equals_the_recurrence_in_float64(example):
    """``S_t = γ_h S_{t-1} + k_tᵀ v_t``, ``o_t = q_t S_t`` token by token in float64, against the example's parallel
    form run once over 16 steps and run as 5 then 11 steps (the second from the state the first left), with a
    padding step (no decay, no write) at position 7 of row 1: equal to 1e-12."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 16, 4, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 16, 5, generator=g, dtype=torch.float64)
    gamma = torch.exp(example.log_decay(3).double())  # 1 - 2^-5, 1 - 2^-6, 1 - 2^-7 (to float32 precision)
    assert torch.allclose(gamma, torch.tensor([1 - 2**-5, 1 - 2**-6, 1 - 2**-7], dtype=torch.float64), atol=1e-7)
    real = torch.ones(2, 1, 16, dtype=torch.float64)
    real[1, 0, 7] = 0.0
    k = k * real[..., None]
    a = torch.log(gamma)[None, :, None] * real  # [2, 3, 16]

    S = torch.zeros(2, 3, 4, 5, dtype=torch.float64)
    outs = []
    for t in range(16):
        S = torch.exp(a[:, :, t])[..., None, None] * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], S))
    want = torch.stack(outs, 2)

    zero = torch.zeros(2, 3, 4, 5, dtype=torch.float64)
    o, state = example.retention(q, k, v, a, zero)
    assert o.sub(want).abs().max().item() < 1e-12 and state.sub(S).abs().max().item() < 1e-12
    o1, s1 = example.retention(q[:, :, :5], k[:, :, :5], v[:, :, :5], a[:, :, :5], zero)
    o2, s2 = example.retention(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], a[:, :, 5:], s1)
    assert torch.cat([o1, o2], 2).sub(want).abs().max().item() < 1e-12 and s2.sub(S).abs().max().item() < 1e-12


def test_decoding_from_the_cache_equals_the_full_forward_and_the_module_keeps_nothing(registry):
    """A prefill of 6 then 10 single tokens equals the full forward; after ``cache.reset()`` the same again; no
    forward adds or changes a tensor attribute of the module; the cache holds ``4 · 8 · 8`` float32 per layer."""
    model = modkit.build(_spec(), registry=registry, seed=0).eval()
    mixer = model.layers[0].attention
    before = {k: v for k, v in vars(mixer).items() if isinstance(v, torch.Tensor)}
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(2, 16)
        for _ in range(2):
            steps = [model(ids[:, :6], cache=cache).logits]
            steps += [model(ids[:, t : t + 1], cache=cache).logits for t in range(6, 16)]
            assert torch.cat(steps, 1).sub(full).abs().max().item() < 1e-5
            cache.reset()
    assert {k: v for k, v in vars(mixer).items() if isinstance(v, torch.Tensor)} == before
    assert cache.nbytes() == 2 * 2 * 4 * 8 * 8 * 4  # batch 2, 2 layers, [4, 8, 8] float32: nothing per token
    assert modkit.kv_cache_bytes_per_token(_spec(), "float32", registry=registry) == 0


def test_cost_sees_constant_flops_and_a_fixed_state(registry):
    """Declared FLOPs per decoded token do not grow with the context: no ``*``, no crossover; the state is
    ``2 layers · 4 · 8 · 8 · 4`` bytes per sequence at any context."""
    from modkit.analysis.cost import CostModel

    costs = CostModel(_spec(), registry=registry)
    (group,) = costs.mixers()
    assert (group.type, group.growing, group.has_ffn) == ("retention", frozenset(), True)
    assert costs.crossover("decode") is None and costs.crossover("prefill", projections=True) is None
    assert costs.context_parts() == set()
    assert costs.cache_state_bytes_per_sequence("float32") == 2 * 4 * 8 * 8 * 4 == 2048
    decode = [costs.per_token("decode", n)["mixer.state_read"] for n in (2, 1000)]
    assert decode[0] == decode[1] == 2 * (2 * 4 * 8 * 8)  # 2 layers, 2·H·d_k·d_v each, at 2 and 1,000 tokens
