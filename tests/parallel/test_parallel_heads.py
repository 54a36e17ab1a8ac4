"""A ``tp_plan`` can describe a per-head parameter (style ``heads``): sharded on its head dim with the heads.

An attention with a learned per-head gain on the queries (``head_gain [n_heads]``, as a per-head temperature or a
QK-norm weight of shape ``[n_heads]`` would be). Declared ``{"head_gain": "heads"}`` next to its colwise/rowwise
projections, the sharded model (tp = 2, two gloo processes, through the contract kit's ``shards`` check) gives the
single-process logits; without that item each rank multiplies its half of the heads by all of the gains, which
fails. The plan is validated on ``meta`` first: a parameter whose dim 0 is not a head count, or a name that is not
a parameter, is a :class:`~modkit.parallel.ParallelError` naming it.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig, Init
from modkit.parallel import ParallelError, model_plan
from modkit.testing import check_component
from tests.conftest import registry_with, tiny_spec

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)

PROJECTIONS = {"q": "colwise", "k": "colwise", "v": "colwise", "o": "rowwise"}


class GainConfig(ComponentConfig):
    """Config of the per-head-gain attentions."""

    type: Literal["head_gain", "head_gain_unplanned", "head_gain_wrong"]
    n_heads: int = Field(4, description="number of heads")


class HeadGainAttention(nn.Module):
    """Causal MHA whose queries are scaled per head by ``head_gain [n_heads]`` (``wide``: ``[n_heads + 1]``)."""

    def __init__(self, d_model: int, n_heads: int, wide: bool = False):
        super().__init__()
        self.n_heads = self.n_kv_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.head_gain = nn.Parameter(torch.empty(n_heads + (1 if wide else 0)))

    def forward(self, x, inputs):
        b, s, _ = x.shape

        def heads(t):  # [b, s, local heads * head_dim] -> [b, local heads, s, head_dim]
            return t.view(b, s, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        q = q * self.head_gain[: q.shape[1], None, None]
        if inputs.position is not None:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v)
        mask = modkit.prepare_mask(inputs, k_pos, k_valid, q.dtype)
        out, _ = modkit.masked_attention(
            q, k, v, mask, modkit.position_bias(inputs, k_pos, self.n_heads), 1 / math.sqrt(self.head_dim)
        )
        return self.o(out.transpose(1, 2).reshape(b, s, -1))

    def init_weights(self, init: Init) -> None:
        init.uniform_(self.head_gain, 0.25, 4.0)


def _component(type_: str, plan: dict) -> Component:
    return Component(
        kind="attention",
        type=type_,
        config=GainConfig,
        factory=lambda cfg, ctx: HeadGainAttention(ctx.d_model, cfg.n_heads, wide=type_ == "head_gain_wrong"),
        description="Causal attention with a per-head query gain.",
        capabilities={"causal_safe": True, "kv_cache": True, "tp_plan": plan},
        example={"type": type_},
    )


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    return registry_with(
        "head-gain-demo",
        _component("head_gain", {**PROJECTIONS, "head_gain": "heads"}),
        _component("head_gain_unplanned", PROJECTIONS),
        _component("head_gain_wrong", {**PROJECTIONS, "head_gain": "heads"}),
    )


def _meta(registry, type_: str):
    return modkit.build(tiny_spec(block__attention={"type": type_}), device="meta", registry=registry)


def test_plan_names_the_per_head_parameter(registry):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = model_plan(_meta(registry, "head_gain"), 2, registry=registry)
    assert plan.styles["layers.0.attention.head_gain"] == "heads"
    assert plan.sources["layers.1.attention.head_gain"] == "attention/head_gain"
    assert "layers.0.attention" in plan.head_modules and plan.styles["layers.0.attention.q"] == "colwise"
    assert "layers.0.attention.head_gain: heads (from attention/head_gain)" in plan.describe()


def test_plan_rejects_a_parameter_that_is_not_per_head(registry):
    with pytest.raises(
        ParallelError, match=r"head_gain \(shape \[5\]\).*not the module's n_heads or n_kv_heads \(\[4\]\)"
    ):
        model_plan(_meta(registry, "head_gain_wrong"), 2, registry=registry)
    bad = registry_with("head-gain-typo", _component("head_gain", {**PROJECTIONS, "head_gian": "heads"}))
    with pytest.raises(ParallelError, match="'head_gian', which is not a parameter of the module"):
        model_plan(_meta(bad, "head_gain"), 2, registry=bad)
    with pytest.raises(ParallelError, match="does not divide"):
        model_plan(_meta(registry, "head_gain"), 3, registry=registry)


@pytest.mark.slow
@needs_gloo
def test_sharded_per_head_parameter_gives_the_single_process_logits(registry):
    got = {
        t: check_component("attention", t, registry=registry, checks=["shards"], distributed=True)[0]
        for t in ("head_gain", "head_gain_unplanned")
    }
    assert got["head_gain"].status == "passed", got["head_gain"].detail
    assert "10 module(s) of the component sharded" in got["head_gain"].detail  # q, k, v, o and head_gain, 2 layers
    assert got["head_gain_unplanned"].status == "failed", got["head_gain_unplanned"].detail
