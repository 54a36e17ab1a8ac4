"""The ``kv_share`` check catches attentions that read another layer's keys and values wrongly, and only it does.

Each faulty twin is modkit's own attention with one override, the way a plugin author would reuse it: a reader that
ignores ``read_kv_from`` (keeps its own key/value projections and cache), one that reads only the tokens of the
current forward from its source (right in a prefill, wrong from the first decode step), and one that rotates its
source's keys a second time. Outside a ``kv_sharing`` model each behaves as ``gqa``, so every other check passes:
the fault shows only where a layer reads another's cache, which is what the new check builds.
"""

from __future__ import annotations

from typing import Literal

import pytest

import modkit
from modkit import Component, hookimpl
from modkit.nn.attention import shared_kv
from modkit.testing import CHECK_NAMES, check_component
from modkit_plugins.attention import Attention, AttentionConfig

FAULTS = ("deaf_reader", "short_reader", "rerotating_reader")


class ReaderConfig(AttentionConfig):
    """Config of the faulty readers: ``gqa``'s fields under the fault's type name."""

    type: Literal[FAULTS] = "deaf_reader"  # type: ignore[valid-type, assignment]


class FaultyReader(Attention):
    """modkit's attention with one reader fault, chosen by the config's type."""

    def __init__(self, cfg, ctx):
        super().__init__(cfg, ctx)
        self.fault = cfg.type

    def read_kv_from(self, source: int) -> None:
        # FAULT (deaf_reader): the build's request is ignored; the layer keeps its own projections and cache
        if self.fault != "deaf_reader":
            super().read_kv_from(source)

    def keys_values(self, inputs, k, v):
        if not self.reads_kv:
            return super().keys_values(inputs, k, v)
        k_all, v_all, k_pos, k_valid = shared_kv(inputs, self)
        if self.fault == "short_reader":  # FAULT: only the tokens of this forward, not the source's cached ones
            s = inputs.positions.shape[1]
            k_all, v_all, k_pos = k_all[:, :, -s:], v_all[:, :, -s:], k_pos[:, -s:]
            k_valid = None if k_valid is None else k_valid[:, -s:]
        if self.fault == "rerotating_reader" and inputs.position is not None:  # FAULT: rotated again
            k_all, _ = inputs.position.rotate(k_all, k_all, k_pos)
        return k_all, v_all, k_pos, k_valid


class ReaderPlugin:
    """Registers the three faulty readers with ``gqa``'s capabilities (``kv_share`` among them)."""

    @hookimpl
    def register_components(self, register) -> None:
        gqa = modkit.get_registry().get("attention", "gqa")
        for fault in FAULTS:
            register(
                Component(
                    kind="attention",
                    type=fault,
                    config=ReaderConfig,
                    factory=lambda cfg, ctx: FaultyReader(cfg, ctx),
                    description=f"test attention: {fault}",
                    capabilities=dict(gqa.capabilities),
                    param_count=gqa.param_count,
                    flops=gqa.flops,
                    example={"type": fault, "n_heads": 4, "n_kv_heads": 2},
                )
            )


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    """The built-in plugins plus the faulty readers."""
    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(ReaderPlugin(), "faulty-readers")
    return reg


#: fault -> a fragment of the kv_share check's detail
FRAGMENTS = {
    "deaf_reader": "declares 128 cache bytes per token of its own",  # 2 key/value heads of 8, float32
    "short_reader": "cached decode: the reading layer's logits differ",
    "rerotating_reader": "the forward: the reading layer's logits differ",
}


@pytest.mark.parametrize("fault", FAULTS)
def test_a_faulty_reader_fails_kv_share_and_nothing_else(registry, fault):
    """Every other check passes (they never build a sharing model); ``kv_share`` fails, naming what differs."""
    skip = {"compile", "precision"}  # slow, and they build no sharing model either
    results = {r.check: r for r in check_component("attention", fault, registry=registry)}
    assert list(results) == list(CHECK_NAMES)
    r = results["kv_share"]
    assert r.status == "failed", r.detail
    assert FRAGMENTS[fault] in r.detail, r.detail
    others = {c: (x.status, x.detail) for c, x in results.items() if c not in skip | {"kv_share"}}
    assert all(status in ("passed", "skipped") for status, _ in others.values()), others


def test_the_sound_attention_passes_kv_share(registry):
    """``gqa`` itself passes beside the faulty readers."""
    (r,) = check_component("attention", "gqa", registry=registry, checks=["kv_share"])
    assert r.status == "passed", r.detail
