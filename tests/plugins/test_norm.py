"""Norm components: float32 statistics (even for half-precision inputs), formulas, init."""

import torch

import modkit
from modkit.core.interfaces import BuildContext


def _norm(cfg: dict, dim: int):
    reg = modkit.get_registry()
    ctx = BuildContext(d_model=dim, n_layers=1, vocab_size=8, max_seq_len=8, registry=reg)
    module = ctx.build(modkit.load_component("norm", cfg))
    module.init_weights(modkit.Init(0, 0.02))
    return module


def test_c07_rmsnorm_fp16_statistics_in_float32():
    norm = _norm({"type": "rmsnorm", "eps": 1e-6}, 8).half()
    x = torch.full((1, 8), 300.0, dtype=torch.float16)
    y = norm(x)
    assert y.dtype == torch.float16
    assert torch.equal(y, torch.ones_like(y))
    # the fault this guards against: squaring 300 in fp16 overflows to inf and the result collapses to 0
    assert torch.isinf(x.pow(2).mean(-1)).all()


def test_c07_layernorm_fp16():
    norm = _norm({"type": "layernorm", "eps": 1e-5}, 8).half()
    x = torch.tensor([[300.0, -300.0] * 4], dtype=torch.float16)
    y = norm(x)
    assert y.dtype == torch.float16
    assert torch.allclose(y.float(), torch.tensor([[1.0, -1.0] * 4]), atol=1e-3)


def test_rmsnorm_formula_and_unit_offset():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16)
    plain = _norm({"type": "rmsnorm", "eps": 1e-6}, 16)
    with torch.no_grad():
        plain.weight.copy_(torch.linspace(0.5, 1.5, 16))
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * plain.weight
    assert torch.allclose(plain(x), ref, atol=1e-6)
    gemma = _norm({"type": "rmsnorm", "eps": 1e-6, "unit_offset": True}, 16)
    assert torch.equal(gemma.weight, torch.zeros(16))  # (1 + 0) = identity scale at init
    with torch.no_grad():
        gemma.weight.copy_(torch.linspace(-0.5, 0.5, 16))
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + gemma.weight)
    assert torch.allclose(gemma(x), ref, atol=1e-6)


def test_layernorm_matches_torch_and_bias_flag():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16)
    ln = _norm({"type": "layernorm", "eps": 1e-5}, 16)
    assert torch.allclose(ln(x), torch.nn.functional.layer_norm(x, (16,), eps=1e-5), atol=1e-6)
    assert sum(p.numel() for p in ln.parameters()) == 32
    no_bias = _norm({"type": "layernorm", "eps": 1e-5, "bias": False}, 16)
    assert sum(p.numel() for p in no_bias.parameters()) == 16
