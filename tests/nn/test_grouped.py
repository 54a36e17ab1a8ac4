"""Tests of :func:`modkit.nn.grouped.grouped_mm` and of the grouped (stacked) forms of the built-in FFNs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import BuildContext, Component, ComponentConfig
from modkit.nn.grouped import grouped_mm
from modkit_plugins.ffn import GatedConfig, MLPConfig
from tests.conftest import registry_with

ROOT = Path(__file__).resolve().parents[2]
ENDS = [3, 3, 9, 14]  # group 1 empty


def reference(x: torch.Tensor, w: torch.Tensor, ends: list[int]) -> torch.Tensor:
    starts = [0] + ends[:-1]
    return torch.cat([x[a:b] @ w[g] for g, (a, b) in enumerate(zip(starts, ends))])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_values_and_gradients_equal_per_group_matmuls(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(14, 6, generator=g).to(dtype).requires_grad_()
    w = torch.randn(4, 6, 5, generator=g).to(dtype).requires_grad_()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = grouped_mm(x, w, torch.tensor(ENDS))
    ref = reference(xr, wr, ENDS)
    assert y.dtype == dtype and torch.equal(y, ref)
    dy = torch.randn(14, 5, generator=g).to(dtype)
    y.backward(dy)
    ref.backward(dy)
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)
    assert torch.count_nonzero(w.grad[1]) == 0  # the empty group's weight gets no gradient


@pytest.mark.slow  # end to end (processes, compile or a browser): left out of make test-fast
def test_compiles_fullgraph_in_float32_with_gradients():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(14, 6, generator=g, requires_grad=True)
    w = torch.randn(4, 6, 5, generator=g, requires_grad=True)
    offs = torch.tensor(ENDS, dtype=torch.int32)
    fn = torch.compile(lambda a, b, o: grouped_mm(a, b, o).sin().sum(), fullgraph=True)
    fn(x, w, offs).backward()
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    reference(xr, wr, ENDS).sin().sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(w.grad, wr.grad)


def test_bad_shapes_and_dtypes_name_the_problem():
    x, w, offs = torch.randn(4, 6), torch.randn(2, 6, 5), torch.tensor([2, 4])
    with pytest.raises(ValueError, match=r"w \[groups, in, out\].*w \[2, 7, 5\]"):
        grouped_mm(x, torch.randn(2, 7, 5), offs)
    with pytest.raises(ValueError, match=r"offs \[3\]"):
        grouped_mm(x, w, torch.tensor([1, 2, 4]))
    with pytest.raises(ValueError, match="one dtype"):
        grouped_mm(x, w.double(), offs)


@pytest.mark.parametrize(
    "cfg",
    [
        GatedConfig(type="swiglu", d_ff=12),
        GatedConfig(type="geglu", d_ff=12, bias=True),
        GatedConfig(type="swiglu", d_ff=12, gate_multiplier=1.5, output_multiplier=0.25),
        MLPConfig(d_ff=12, activation="relu"),
        MLPConfig(d_ff=12, bias=False),
    ],
    ids=["swiglu", "geglu-bias", "swiglu-multipliers", "mlp-relu-bias", "mlp-nobias"],
)
def test_grouped_form_equals_independent_single_ffns(cfg):
    """Copy g of the grouped form, with its weights transposed into an nn.Linear FFN, computes the same rows."""
    ctx = BuildContext(8, 1, 32, 64, modkit.get_registry())
    torch.manual_seed(0)
    bank = ctx.build_grouped(cfg, 3)
    x = torch.randn(14, 8)
    offs = torch.tensor([5, 5, 14])
    y = bank(x, offs)
    starts, ends = [0, 5, 5], [5, 5, 14]
    for g in range(3):
        single = ctx.build(cfg)
        with torch.no_grad():
            for name, p in single.named_parameters():  # gate.weight <- gate[g].T, gate.bias <- gate_bias[g]
                proj, kind = name.split(".")
                src = getattr(bank, proj)[g].t() if kind == "weight" else getattr(bank, f"{proj}_bias")[g]
                p.copy_(src)
        torch.testing.assert_close(y[starts[g] : ends[g]], single(x[starts[g] : ends[g]]), atol=1e-6, rtol=1e-5)


class _PlainConfig(ComponentConfig):
    type: Literal["plain"] = "plain"
    d_ff: int = Field(8, description="hidden width")


def test_moe_refuses_an_expert_type_without_a_grouped_form():
    reg = registry_with(
        "thirdparty-plain",
        Component(
            kind="ffn",
            type="plain",
            config=_PlainConfig,
            description="a third-party MLP",
            factory=lambda cfg, ctx: nn.Sequential(nn.Linear(ctx.d_model, cfg.d_ff), nn.Linear(cfg.d_ff, ctx.d_model)),
        ),
    )
    spec = modkit.load_spec(ROOT / "specs" / "tiny-moe.json").model_dump(mode="json")
    spec["block"]["ffn"]["expert"] = {"type": "plain", "d_ff": 8}
    with pytest.raises(
        modkit.SpecError,
        match=r"block\.ffn\.expert.*'plain'.*has no grouped form.*use one that has: geglu, mlp, swiglu, swiglu_clamped,",
    ):
        modkit.load_spec(spec, registry=reg)
