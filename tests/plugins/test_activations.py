"""The activation components (``relu2``, ``xielu``) against their reference formulas, and in an ``mlp``.

* ``relu2`` equals ``max(x, 0)²`` (Primer, arXiv:2109.08668);
* ``xielu`` equals the piecewise formula of Huang & Schlag 2024 (arXiv:2411.13010) written out here element by
  element in float64, and transformers' ``XIELUActivation`` (its Python path) on the same scalars, bitwise;
* an ``mlp`` with ``activation_unit`` counts the unit's parameters, saves them under ``ffn.act`` and computes
  ``down(unit(up(x)))``; a mixture of such experts refuses a unit with parameters by name.
"""

from __future__ import annotations

import math

import pytest
import torch

import modkit
from modkit_plugins.activations import XIELU, ReLU2, XIELUConfig

X = torch.linspace(-6.0, 6.0, 241, dtype=torch.float32)


def test_relu2_is_the_squared_relu():
    got = ReLU2()(X)
    want = torch.tensor([max(v, 0.0) ** 2 for v in X.tolist()], dtype=torch.float32)
    assert torch.equal(got, want)


def _xielu_reference(x: float, a_p: float, a_n: float, beta: float, eps: float) -> float:
    """Huang & Schlag 2024, eq. for xIELU with alpha_p = softplus(a_p), alpha_n = beta + softplus(a_n)."""
    alpha_p = math.log1p(math.exp(a_p))
    alpha_n = beta + math.log1p(math.exp(a_n))
    if x > 0:
        return alpha_p * x * x + beta * x
    return alpha_n * (math.expm1(min(x, eps)) - x) + beta * x


@pytest.mark.parametrize("cfg", [{}, {"alpha_p_init": 0.3, "alpha_n_init": 1.7, "beta": 0.25, "eps": -0.5}])
def test_xielu_equals_the_formula(cfg):
    unit = XIELU(XIELUConfig(**cfg))
    c = unit.cfg
    assert math.isclose(torch.nn.functional.softplus(unit.alpha_p).item(), c.alpha_p_init, rel_tol=1e-6)
    assert math.isclose(
        unit.beta.item() + torch.nn.functional.softplus(unit.alpha_n).item(), c.alpha_n_init, rel_tol=1e-6
    )
    with torch.no_grad():
        got = unit(X.double().float())
    want = torch.tensor(
        [_xielu_reference(v, unit.alpha_p.item(), unit.alpha_n.item(), c.beta, unit.eps.item()) for v in X.tolist()]
    )
    assert (got.double() - want).abs().max().item() <= 1e-5 * (1 + want.abs().max().item())


def test_xielu_equals_transformers_bitwise():
    activations = pytest.importorskip("transformers.activations")
    ref = activations.XIELUActivation(dtype=torch.float32)
    unit = XIELU(XIELUConfig())
    with torch.no_grad():
        for ours, theirs, value in ((unit.alpha_p, ref.alpha_p, 0.37), (unit.alpha_n, ref.alpha_n, -0.21)):
            ours.fill_(value), theirs.fill_(value)
        assert torch.equal(unit.beta, ref.beta) and torch.equal(unit.eps, ref.eps)
        assert torch.equal(unit(X), ref._xielu_python(X))


def test_xielu_refuses_a_negative_branch_scale_below_beta():
    with pytest.raises(ValueError, match="alpha_n_init = 0.4 must exceed beta = 0.5"):
        XIELUConfig(alpha_n_init=0.4)


def _spec(ffn: dict) -> dict:
    return {
        "schema_version": 1,
        "name": "act",
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 16,
        "position": {"type": "rope"},
        "block": {
            "attention": {"type": "mha", "n_heads": 4},
            "ffn": ffn,
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }


@pytest.mark.parametrize("unit,extra", [("relu2", 0), ("xielu", 2)])
def test_an_mlp_with_an_activation_unit(unit, extra):
    spec = _spec({"type": "mlp", "d_ff": 48, "bias": False, "activation_unit": {"type": unit}})
    model = modkit.build(spec, seed=0)
    assert (
        modkit.count_params(spec)
        == modkit.count_params(model)
        == modkit.count_params(_spec({"type": "mlp", "d_ff": 48, "bias": False})) + 2 * extra
    )
    ffn = model.layers[0].ffn
    names = sorted(k for k in model.state_dict() if k.startswith("layers.0.ffn.act."))
    assert names == (
        [] if unit == "relu2" else [f"layers.0.ffn.act.{n}" for n in ("alpha_n", "alpha_p", "beta", "eps")]
    )
    x = torch.randn(3, 5, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ffn(x), ffn.down(ffn.act(ffn.up(x))))


def test_a_mixture_refuses_experts_whose_activation_has_parameters():
    moe = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "mlp", "d_ff": 16, "bias": False, "activation_unit": {"type": "xielu"}},
        "router": {"type": "topk", "renormalize": True},
    }
    with pytest.raises(Exception, match="activation_unit 'xielu' has learned parameters"):
        modkit.build(_spec(moe), device="meta")
    moe["expert"]["activation_unit"] = {"type": "relu2"}
    experts = modkit.build(_spec(moe), seed=0).layers[0].ffn.experts
    rows = torch.randn(6, 32, generator=torch.Generator().manual_seed(1))
    offs = torch.tensor([1, 3, 3, 6], dtype=torch.int32)
    want = [rows[i] @ experts.up[g] for i, g in enumerate([0, 1, 1, 3, 3, 3])]
    want = torch.stack([torch.relu(h).square() @ experts.down[g] for h, g in zip(want, [0, 1, 1, 3, 3, 3])])
    with torch.no_grad():
        assert torch.allclose(experts(rows, offs), want, atol=1e-6)


def test_the_kit_catches_a_faulty_twin_of_xielu():
    """A third-party xIELU that declares no parameters (its two learned scalars forgotten): the contract kit's
    param_count check fails it, while the real one passes."""
    import dataclasses
    from typing import Literal

    from pydantic import create_model

    from tests.conftest import registry_with
    from modkit.testing import check_component

    config = create_model("XIELUTwinConfig", __base__=XIELUConfig, type=(Literal["xielu_twin"], "xielu_twin"))
    twin = dataclasses.replace(
        modkit.get_registry().get("activation", "xielu"),
        type="xielu_twin",
        config=config,
        param_count=lambda cfg, ctx: 0,
        example={"type": "xielu_twin"},
        provider=None,
    )
    reg = registry_with("third-party", twin)
    (bad,) = check_component("activation", "xielu_twin", registry=reg, checks=["param_count"])
    (good,) = check_component("activation", "xielu", checks=["param_count"])
    assert bad.status == "failed" and "declared 0 parameters, the module holds 2" in bad.detail, bad.detail
    assert good.status == "passed", good.detail
