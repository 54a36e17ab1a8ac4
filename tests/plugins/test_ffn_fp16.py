"""Gated FFNs in float16: a gated product above 65504 (float16's largest value) no longer turns into inf when the
FFN's output is representable; other dtypes keep the plain formula bitwise."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modkit
from modkit_plugins.ffn import ACTIVATIONS, FP16_ROW_LIMIT, GatedMLP, GroupedGatedMLP


def overflowing(act: str, bias: bool = False) -> GatedMLP:
    """A 4 -> 4 -> 4 gated MLP whose product reaches silu(300)·300 = 90000 > 65504 for x = e_0 (the issue's case:
    float32 gives 90.0 for a down weight of 0.001)."""
    m = GatedMLP(4, 4, act, bias)
    with torch.no_grad():
        m.gate.weight.copy_(torch.eye(4) * 300)
        m.up.weight.copy_(torch.eye(4) * 300)
        m.down.weight.fill_(0.001)
        if bias:
            for b in (m.gate.bias, m.up.bias):
                b.zero_()
            m.down.bias.copy_(torch.tensor([0.5, -0.5, 1.0, 0.0]))
    return m


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("bias", [False, True])
def test_float16_product_above_the_range_stays_finite(act, bias):
    m = overflowing(act, bias)
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 0.5, -1.0, 0.2], [0.01, 0.02, 0.0, -0.03]])
    ref = m(x)  # float32
    assert ref[0, 0].item() == pytest.approx(90.0 + (0.5 if bias else 0.0), abs=1e-3)
    m16 = m.half()
    with torch.no_grad():
        plain = m16.down(ACTIVATIONS[act](m16.gate(x.half())) * m16.up(x.half()))
        got = m16(x.half())
    assert torch.isinf(plain[:2]).all(), "the case must overflow the plain float16 formula"
    assert got.dtype == torch.float16 and torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=1e-3)


def test_unscaled_rows_are_the_float16_rounding_of_the_float32_product():
    torch.manual_seed(0)
    m = GatedMLP(32, 64, "silu", False).half()
    x = torch.randn(5, 32).half()
    with torch.no_grad():
        h = nn.functional.silu(m.gate(x).float()) * m.up(x).float()
        assert h.abs().max() < FP16_ROW_LIMIT
        expected = m.down(h.half())
        assert torch.equal(m(x), expected)


def test_other_dtypes_keep_the_plain_formula_bitwise():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        m = GatedMLP(32, 64, "silu", True).to(dtype)
        x = torch.randn(5, 32).to(dtype)
        with torch.no_grad():
            assert torch.equal(m(x), m.down(nn.functional.silu(m.gate(x)) * m.up(x)))


def test_grouped_experts_stay_finite_in_float16():
    g = GroupedGatedMLP(2, 4, 4, "silu", False)
    with torch.no_grad():
        g.gate.copy_(torch.eye(4).expand(2, 4, 4) * 300)
        g.up.copy_(torch.eye(4).expand(2, 4, 4) * 300)
        g.down.fill_(0.001)
    x = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0.1, 0.2, 0.3, 0.4]])
    offs = torch.tensor([2, 3], dtype=torch.int32)
    ref = g(x, offs)
    got = g.half()(x.half(), offs)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), ref, rtol=2e-3, atol=1e-3)


def test_a_float16_model_with_an_overflowing_ffn_gives_finite_logits():
    spec = {
        "schema_version": 1,
        "vocab_size": 16,
        "d_model": 8,
        "n_layers": 1,
        "max_seq_len": 16,
        "position": {"type": "rope"},
        "block": {
            "attention": {"type": "mha", "n_heads": 2},
            "ffn": {"type": "swiglu", "d_ff": 8},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }
    model = modkit.build(spec, dtype="float16", seed=0).eval()
    with torch.no_grad():
        ffn = model.layers[0].ffn
        ffn.gate.weight.copy_(torch.eye(8) * 200)
        ffn.up.weight.copy_(torch.eye(8) * 200)
        ffn.down.weight.fill_(0.0005)
        seen = []
        handle = ffn.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
        handle.remove()
        plain = ffn.down(nn.functional.silu(ffn.gate(seen[0])) * ffn.up(seen[0]))
    assert torch.isinf(plain).any(), "the case must overflow the plain float16 formula"
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
@pytest.mark.parametrize("bias", [False, True])
def test_a_weight_only_converted_down_keeps_the_float16_product_finite(weights, bias):
    # generate --dtype float16 --weights int8|bfloat16: the scaled path multiplied by down.weight itself, which a
    # converted layer has not (int8: AttributeError) or in bfloat16 (a dtype mismatch), at the first forward
    from modkit.inference.weights import quantize_linears

    m = overflowing("silu", bias).half()
    quantize_linears(m, weights)
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.01, 0.02, 0.0, -0.03]]).half()
    with torch.no_grad():
        got = m(x)
    assert got.dtype == torch.float16
    # silu(300)·300 = 90000 per row 0 feature, times the down weights 0.001 (exact in bfloat16 and int8 alike)
    assert got[0].float().tolist() == pytest.approx(
        [90.0 + b for b in ([0.5, -0.5, 1.0, 0.0] if bias else [0] * 4)], rel=1e-2
    )
