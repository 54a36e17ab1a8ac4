"""``nn.Linear`` through oneDNN (modkit.nn.onednn): the same values and gradients as ``nn.Linear`` up to float32
rounding, against a float64 reference; the switch is in place and reversible and leaves parameters untouched."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from modkit.nn.onednn import OneDNNLinear, onednn_available, restore_linears, use_onednn_linears

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this torch build has no oneDNN linear operator")


def _reference(layer: nn.Linear, x: torch.Tensor, grad: torch.Tensor) -> tuple:
    """Output and gradients of ``layer`` on ``x`` computed in float64 (``y = x Wᵀ + b``)."""
    ref = copy.deepcopy(layer).double()
    x64 = x.detach().double().requires_grad_()
    y = ref(x64)
    y.backward(grad.double())
    return y, x64.grad, ref.weight.grad, None if ref.bias is None else ref.bias.grad


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", ["rows", "batch", "strided"])
@pytest.mark.parametrize("width", [(16, 48), (48, 16)])  # wider output (dW from xᵀ dy) and narrower
def test_values_and_gradients_match_float64(bias, shape, width):
    torch.manual_seed(0)
    d_in, d_out = width
    layer = nn.Linear(d_in, d_out, bias=bias)
    x = {
        "rows": torch.randn(10, d_in),
        "batch": torch.randn(3, 5, d_in),
        "strided": torch.randn(5, 3, d_in).transpose(0, 1),
    }[shape].requires_grad_()
    fast = copy.deepcopy(layer)
    assert use_onednn_linears(fast) == 1 and type(fast) is OneDNNLinear
    y = fast(x)
    grad = torch.randn_like(y)
    y.backward(grad)
    want = _reference(layer, x, grad)
    assert y.shape == want[0].shape and y.dtype == torch.float32
    torch.testing.assert_close(y.double(), want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), want[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast.weight.grad.double(), want[2], rtol=1e-5, atol=1e-5)
    assert fast.weight.grad.is_contiguous() and fast.weight.grad.shape == fast.weight.shape
    if bias:
        torch.testing.assert_close(fast.bias.grad.double(), want[3], rtol=1e-5, atol=1e-5)


def test_frozen_weight_gets_no_gradient_and_input_gradient_is_right():
    torch.manual_seed(1)
    layer = nn.Linear(8, 4)
    layer.weight.requires_grad_(False)
    use_onednn_linears(layer)
    x = torch.randn(6, 8, requires_grad=True)
    layer(x).sum().backward()
    assert layer.weight.grad is None
    torch.testing.assert_close(x.grad, layer.weight.detach().sum(0).expand(6, 8), rtol=1e-6, atol=1e-6)
    assert torch.equal(layer.bias.grad, torch.full((4,), 6.0))


def test_other_dtypes_and_autocast_take_nn_linear_path_exactly():
    torch.manual_seed(2)
    layer = nn.Linear(8, 4).to(torch.float64)
    fast = copy.deepcopy(layer)
    use_onednn_linears(fast)
    x = torch.randn(3, 8, dtype=torch.float64)
    assert torch.equal(fast(x), layer(x))  # float64: nn.Linear's own kernel
    layer32, fast32 = layer.float(), fast.float()
    x32 = x.float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(fast32(x32), layer32(x32))


def test_switch_is_in_place_reversible_and_keeps_parameters():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2, bias=False), nn.LayerNorm(2))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    assert use_onednn_linears(model) == 2
    assert [type(m) for m in model] == [OneDNNLinear, nn.GELU, OneDNNLinear, nn.LayerNorm]
    assert all(isinstance(m, nn.Linear) for m in (model[0], model[2]))
    assert [id(p) for p in model.parameters()] == params
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert use_onednn_linears(model) == 0  # already switched
    assert restore_linears(model) == 2 and type(model[0]) is nn.Linear and type(model[2]) is nn.Linear
