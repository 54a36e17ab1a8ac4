"""The contract kit holds a residual stream (kind ``stream``) to its contract.

A test plugin registers a copy of ``mhc`` with one realistic mistake: a head whose mixing weights take their RMS
statistics over the batch as well as the features (every row of a batch changes together, so causality and cached
decode cannot see it). It must fail the ``stream`` check and nothing else; the built-in ``mhc`` passes every check
that applies. Likewise a copy of the block-scope ``altup`` whose per-layer inputs are normalised over the batch
(the ``layer_inputs`` part of the same check).
"""

from __future__ import annotations

from typing import Literal

import pytest
import torch

import modkit
from modkit import Component, hookimpl
from modkit.testing import CHECK_NAMES, check_component
from modkit_plugins.altup import AltUpConfig, AltUpStream
from modkit_plugins.hyper_connections import ManifoldHyperConnections, MHCConfig


class FaultyConfig(MHCConfig):
    """``mhc``'s fields under the twins' names."""

    type: Literal["batch_stats_mhc"] = "batch_stats_mhc"


class BatchStatsHead(ManifoldHyperConnections):
    """FAULT: the head normalises the flat streams by their mean square over the batch and the features."""

    def exit(self, s: torch.Tensor) -> torch.Tensor:
        flat = s.flatten(2).float()
        normed = flat * torch.rsqrt(flat.square().mean(dim=(0, -1), keepdim=True) + self.cfg.norm_eps)
        pre = torch.sigmoid(torch.nn.functional.linear(normed, self.hc_fn.float()) * self.hc_scale + self.hc_base)
        return ((pre + self.cfg.eps).unsqueeze(-1) * s).sum(dim=2).to(s.dtype)


class FaultyAltUpConfig(AltUpConfig):
    """``altup``'s fields under the twin's name."""

    type: Literal["batch_stats_altup"] = "batch_stats_altup"


class UndeclaredScopeConfig(AltUpConfig):
    """``altup``'s fields under the twin's name."""

    type: Literal["undeclared_scope_altup"] = "undeclared_scope_altup"


class BatchStatsLayerInputs(AltUpStream):
    """FAULT: the per-layer inputs are scaled by their mean square over the batch and the features."""

    def layer_inputs(self, input_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        e = super().layer_inputs(input_ids, x)
        return e * torch.rsqrt(e.float().square().mean(dim=(0, -1), keepdim=True) + 1e-6).to(e.dtype)


class StreamFaults:
    @hookimpl
    def register_components(self, register):
        register(
            Component(
                kind="stream",
                type="batch_stats_mhc",
                config=FaultyConfig,
                factory=lambda cfg, ctx: BatchStatsHead(cfg, ctx),
                description="mhc whose head takes statistics over the batch (a fault)",
                capabilities={"compile_safe": True},
                param_count=lambda cfg, ctx: cfg.n_streams**2 * ctx.d_model + cfg.n_streams + 1,
                flops=lambda cfg, ctx, work: {"exit": work.tokens * 2 * cfg.n_streams**2 * ctx.d_model},
            )
        )
        altup = modkit.get_registry().get("stream", "altup")
        register(  # FAULT: a block-scope module whose entry forgets to declare the scope validation reads
            Component(
                kind="stream",
                type="undeclared_scope_altup",
                config=UndeclaredScopeConfig,
                factory=lambda cfg, ctx: AltUpStream(cfg, ctx),
                description="altup whose entry does not declare scope 'block' (a fault)",
                capabilities={k: v for k, v in altup.capabilities.items() if k != "scope"},
                param_count=altup.param_count,
                flops=altup.flops,
                example={**altup.example, "type": "undeclared_scope_altup"},
            )
        )
        register(
            Component(
                kind="stream",
                type="batch_stats_altup",
                config=FaultyAltUpConfig,
                factory=lambda cfg, ctx: BatchStatsLayerInputs(cfg, ctx),
                description="altup whose per-layer inputs take statistics over the batch (a fault)",
                capabilities=dict(altup.capabilities),
                param_count=altup.param_count,
                flops=altup.flops,
                example={**altup.example, "type": "batch_stats_altup"},
            )
        )


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(StreamFaults(), "stream-faults")
    return reg


def results(registry, type_: str) -> dict:
    return {r.check: r for r in check_component("stream", type_, registry=registry)}


def test_a_head_with_batch_statistics_fails_the_stream_check_alone(registry):
    got = results(registry, "batch_stats_mhc")
    assert list(got) == list(CHECK_NAMES)
    failed = {c: r.detail for c, r in got.items() if r.status == "failed"}
    assert set(failed) == {"stream"}, failed
    assert "exit of a token depends on the other tokens (torch.float32)" in failed["stream"]
    for check in ("causality", "kv_cache_decode", "meta_init", "gradients"):  # what it slips past
        assert got[check].status == "passed", (check, got[check].detail)


def test_the_built_in_mhc_passes_every_check_that_applies(registry):
    got = results(registry, "mhc")
    failed = {c: r.detail for c, r in got.items() if r.status == "failed"}
    assert not failed, failed
    for check in ("stream", "causality", "kv_cache_decode", "param_count", "flops", "compile"):
        assert got[check].status == "passed", (check, got[check].detail)


def test_block_stream_layer_inputs_with_batch_statistics_fail_the_stream_check_alone(registry):
    got = results(registry, "batch_stats_altup")
    failed = {c: r.detail for c, r in got.items() if r.status == "failed"}
    assert set(failed) == {"stream"}, failed
    assert "layer_inputs of a token depends on the other tokens (torch.float32)" in failed["stream"]
    for check in ("causality", "kv_cache_decode", "meta_init", "gradients", "param_count", "flops"):
        assert got[check].status == "passed", (check, got[check].detail)


def test_the_built_in_altup_passes_every_check_that_applies(registry):
    got = results(registry, "altup")
    failed = {c: r.detail for c, r in got.items() if r.status == "failed"}
    assert not failed, failed
    for check in ("stream", "causality", "kv_cache_decode", "gradients", "param_count", "flops", "compile"):
        assert got[check].status == "passed", (check, got[check].detail)
    assert "block scope" in got["stream"].detail


def test_a_scope_the_entry_does_not_declare_fails_the_stream_check(registry):
    """The module is block-scope, its entry declares no scope (validation then reads "sublayer")."""
    (r,) = check_component("stream", "undeclared_scope_altup", registry=registry, checks=["stream"])
    assert r.status == "failed"
    assert "the entry declares scope 'sublayer' (capabilities), the module says 'block'" in r.detail, r.detail
