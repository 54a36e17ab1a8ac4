"""The cache holds what a token mixer declares (``cache_spec()``), and the position scheme acts on the width the
attention declares (``position_geometry``).

* a toy recurrent mixer (a causal cumulative sum, test-only) declares a fixed-size float32 state per sequence:
  its cached decode equals its full forward, with left padding and chunks; reset zeroes the state; the kit's
  cache, compile and FLOPs checks pass on it;
* a hybrid block holds the built-in attention and that recurrent mixer side by side: each finds its own state;
* per-token entries of any shape and slot axis, windows, declared bytes equal allocated bytes, clear errors;
* a third-party attention whose rotary width differs from its head width builds the scheme it declares and runs
  (before the declaration it validated, then died in ``Rope._rotate``), and is validated at that width.
"""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import CacheEntry, CacheSpec, Component, ComponentConfig, PositionGeometry, Slot, hookimpl
from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes
from modkit.nn.cache import KVCache, LayerGeometry
from modkit.analysis.cost import Workload
from modkit.spec import position_geometry
from modkit.testing import check_component

D = 32


# ------------------------------------------------------------------------------------ a toy recurrent mixer


class CumSumConfig(ComponentConfig):
    """A causal running sum: ``y_t = W_o Σ_{s <= t, real} W_i x_s`` (test-only recurrent mixer)."""

    type: Literal["cumsum"] = "cumsum"
    d_inner: int = Field(16, description="width of the running sum")

    def position_geometry(self, ctx):
        return None  # no queries or keys: a rotary or bias position scheme cannot act here


class CumSum(nn.Module):
    """``forward(x [batch, seq, d_model], inputs)``; its state ``[batch, d_inner]`` float32 is the running sum."""

    def __init__(self, d_model: int, d_inner: int):
        super().__init__()
        self.d_inner = d_inner
        self.w_in = nn.Linear(d_model, d_inner, bias=False)
        self.w_out = nn.Linear(d_inner, d_model, bias=False)

    def cache_spec(self) -> CacheSpec:
        return CacheSpec((CacheEntry("sum", (self.d_inner,), growth="sequence", dtype=torch.float32),))

    def forward(self, x, inputs):
        u = self.w_in(x).float()
        if inputs.token_mask is not None:  # padding adds nothing to the state
            u = u * inputs.token_mask[..., None]
        state = inputs.cache_for(self)
        y = u.cumsum(1)
        if state is not None:
            y = y + state["sum"][:, None]
            state.write("sum", y[:, -1])
        return self.w_out(y.to(x.dtype))


def _cumsum_flops(cfg, ctx, work: Workload) -> dict:
    return {"w_in": 2 * work.tokens * ctx.d_model * cfg.d_inner, "w_out": 2 * work.tokens * cfg.d_inner * ctx.d_model}


class HybridConfig(ComponentConfig):
    """An attention and a running sum side by side in one block (Falcon-H1's layout, test-only)."""

    type: Literal["hybrid"] = "hybrid"
    attention: ComponentConfig = Slot("attention", description="the attention beside the running sum")
    d_inner: int = Field(16, description="width of the running sum")

    def position_geometry(self, ctx) -> PositionGeometry:
        return position_geometry(self.attention, ctx)


class Hybrid(nn.Module):
    def __init__(self, cfg: HybridConfig, ctx):
        super().__init__()
        self.attn = ctx.build(cfg.attention)
        self.rec = CumSum(ctx.d_model, cfg.d_inner)

    def forward(self, x, inputs):
        return self.attn(x, inputs) + self.rec(x, inputs)


class Plugin:
    @hookimpl
    def register_components(self, register) -> None:
        register(
            Component(
                kind="attention",
                type="cumsum",
                config=CumSumConfig,
                factory=lambda cfg, ctx: CumSum(ctx.d_model, cfg.d_inner),
                description="test-only causal running sum with a per-sequence state",
                capabilities={"causal_safe": True, "kv_cache": True, "compile_safe": True},
                param_count=lambda cfg, ctx: 2 * ctx.d_model * cfg.d_inner,
                flops=_cumsum_flops,
            )
        )
        register(
            Component(
                kind="attention",
                type="hybrid",
                config=HybridConfig,
                factory=lambda cfg, ctx: Hybrid(cfg, ctx),
                description="test-only attention + running sum",
                capabilities={"causal_safe": True, "kv_cache": True},
                example={"type": "hybrid", "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}},
            )
        )


def _builtins() -> modkit.Registry:
    """A registry with the installed plugins (copied from the process-wide one)."""
    r = modkit.Registry()
    for p in modkit.get_registry().plugins():
        r.register_plugin(p.obj, p.name)
    return r


@pytest.fixture(scope="module")
def reg() -> modkit.Registry:
    r = _builtins()
    r.register_plugin(Plugin(), "cache-contract-test")
    return r


def _spec(attention: dict, **top) -> dict:
    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 2,
        "max_seq_len": 32,
        "position": {"type": "none" if attention["type"] == "cumsum" else "rope"},
        "block": {
            "attention": attention,
            "ffn": {"type": "swiglu", "d_ff": 48},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }
    spec.update(top)
    return spec


def _decode(model, ids, mask, schedule, cache=None):
    cache = cache if cache is not None else model.new_cache(ids.shape[0], schedule[-1][1])
    out = [
        model(ids[:, a:b], attention_mask=None if mask is None else mask[:, :b], cache=cache).logits
        for a, b in schedule
    ]
    return torch.cat(out, 1), cache


SCHEDULE = ((0, 5), (5, 6), (6, 9), (9, 10), (10, 14))


@pytest.mark.parametrize(
    "attention",
    [{"type": "cumsum"}, {"type": "hybrid", "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}}],
    ids=["recurrent", "hybrid"],
)
def test_declared_state_decodes_like_the_full_forward_with_left_padding(reg, attention):
    model = modkit.build(_spec(attention), seed=0, registry=reg).eval()
    ids = torch.randint(1, 64, (2, 14), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[0, :4] = False  # row 0 left-padded by 4
    with torch.no_grad():
        full = model(ids).logits
        got, cache = _decode(model, ids, None, SCHEDULE)
        torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-4)
        padded = model(ids, attention_mask=mask).logits
        got, _ = _decode(model, ids, mask, SCHEDULE)
        torch.testing.assert_close(got[0, 4:], padded[0, 4:], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(got[1], padded[1], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(
            padded[0, 4:], model(ids[:1, 4:]).logits[0], atol=1e-5, rtol=1e-4
        )  # padding adds nothing

    layer = cache.layers[0]
    if attention["type"] == "cumsum":
        state = layer.state()
        assert list(layer.mixers) == ["attention"] and state.group is None and state.slots == 0
        assert (
            state["sum"].shape == (2, 16) and state["sum"].dtype == torch.float32
        )  # float32 state, whatever the model
        # exactly the declared bytes: 16 float32 per row and layer, nothing per token
        assert cache.nbytes() == 2 * 2 * 16 * 4 == cache.declared_nbytes() == kv_cache_bytes(model, 14, 2, "float32")
        assert modkit.kv_cache_bytes_per_token(model, "bfloat16") == 0
        assert cache_state_bytes_per_sequence(model, "bfloat16") == 2 * 16 * 4
        cache.reset()
        assert torch.equal(state["sum"], torch.zeros(2, 16))  # reset zeroes a fixed-size state
        with torch.no_grad():
            again, _ = _decode(model, ids, None, SCHEDULE, cache=cache)
        torch.testing.assert_close(again, full, atol=1e-5, rtol=1e-4)
    else:
        assert list(layer.mixers) == ["attention.attn", "attention.rec"]  # one state each, keyed by path in the block
        attn, rec = (model.layers[0].attention.attn, model.layers[0].attention.rec)
        assert layer.state(attn).k.shape == (2, 2, 14, 8) and layer.state(rec)["sum"].shape == (2, 16)
        assert cache.nbytes() == cache.declared_nbytes() == 2 * 2 * (2 * 2 * 8 * 14 * 4 + 16 * 4)
        with pytest.raises(KeyError, match="holds 2 mixers"):
            layer.only  # noqa: B018 - the single-mixer shortcut refuses an ambiguous layer


def test_the_kit_checks_a_declared_state_generically(reg):
    """Cached decode (and declared = allocated bytes), a compiled cached decode step, padding and FLOPs on a
    recurrent mixer the core knows nothing about."""
    results = {
        r.check: r
        for r in check_component(
            "attention",
            "cumsum",
            registry=reg,
            checks=["kv_cache_decode", "masked_row", "compile", "flops", "param_count"],
        )
    }
    assert {c: r.status for c, r in results.items()} == dict.fromkeys(results, "passed"), {
        c: r.detail for c, r in results.items()
    }
    assert "declared bytes = allocated bytes" in results["kv_cache_decode"].detail
    assert "a cached decode step too" in results["compile"].detail


# ------------------------------------------------------------------------------------ entries and bytes


def test_entries_of_any_shape_and_slot_axis_with_a_ring():
    spec = CacheSpec(
        (CacheEntry("latent", (6,)), CacheEntry("rope", (1, 4), slot_axis=2), CacheEntry("s", (3,), growth="sequence")),
        window=4,
    )
    assert spec.bytes_per_token("float32") == (6 + 4) * 4 and spec.bytes_per_sequence("bfloat16") == 3 * 2
    cache = KVCache([spec, LayerGeometry(2, 8)], max_len=10, batch_size=2, dtype="bfloat16")
    lat = cache.layers[0].state()
    assert lat["latent"].shape == (2, 4, 6) and lat["rope"].shape == (2, 1, 4, 4) and lat["s"].shape == (2, 3)
    assert lat.group.ring and lat.group.size == 4 and cache.layers[1].only.k.shape == (2, 2, 10, 8)
    assert cache.nbytes() == cache.declared_nbytes() == 2 * ((6 + 4) * 4 * 2 + 3 * 2) + 2 * (2 * 2 * 8 * 10 * 2)
    # a chunk longer than the window: old ring + the chunk come back ("concat"), then one token: the ring itself
    x = torch.randn(2, 3, 6)
    pos, _ = cache.prepare(2, 3)
    seen, p, valid = lat.append({"latent": x}, pos)
    assert seen["latent"] is not None and seen["latent"].shape == (2, 3, 6) and valid is None  # fresh cache
    pos, _ = cache.prepare(2, 5)
    seen, p, valid = lat.append({"latent": torch.randn(2, 5, 6)}, pos)
    assert seen["latent"].shape == (2, 9, 6) and p[0].tolist() == [0, 1, 2, 0, 3, 4, 5, 6, 7]
    pos, _ = cache.prepare(2, 1)
    seen, p, valid = lat.append({"latent": torch.randn(2, 1, 6)}, pos)
    assert seen["latent"] is lat["latent"] and sorted(p[0].tolist()) == [5, 6, 7, 8]
    with pytest.raises(KeyError, match="not declared per-token entries"):
        lat.append({"s": torch.randn(2, 1, 3)}, pos)
    with pytest.raises(KeyError, match="needs per-token entries 'k' and 'v'"):
        lat.update(x, x, pos)
    with pytest.raises(KeyError, match="needs a declared per-sequence entry"):
        lat.write("latent", x)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: CacheEntry("1k", (2,)), "identifier"),
        (lambda: CacheEntry("k", (0, 2)), "positive integers"),
        (lambda: CacheEntry("k", (2, 4), slot_axis=4), "slot_axis = 4 is outside"),
        (lambda: CacheEntry("k", (2,), growth="forever"), "growth"),
        (lambda: CacheEntry("k", (2,), dtype=torch.int8), "unknown cache dtype"),
        (lambda: CacheSpec((CacheEntry("k", (2,)), CacheEntry("k", (3,)))), "repeated"),
        (lambda: CacheSpec((CacheEntry("k", (2,)),), window=0), "window"),
    ],
)
def test_bad_declarations_are_refused_with_the_value(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_a_mixer_without_queries_refuses_a_rotary_scheme_at_spec_time(reg):
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(_spec({"type": "cumsum"}, position={"type": "rope"}), registry=reg)
    ((path, msg),) = err.value.errors
    assert path == "position" and "layer 0's 'cumsum' declares no head_dim" in msg and "'none'" in msg


def test_a_cache_spec_that_returns_something_else_is_named(reg):
    model = modkit.build(_spec({"type": "cumsum"}), device="meta", registry=reg)
    model.layers[1].attention.cache_spec = lambda: {"sum": (16,)}
    with pytest.raises(ValueError, match=r"layers.1.attention: cache_spec\(\) returned dict, not a modkit.CacheSpec"):
        model.new_cache(1, 4)


# ------------------------------------------------------------------------------------ the rotary width


class HalfRopeConfig(ComponentConfig):
    """Heads of ``head_dim`` features of which only the first ``rope_dim`` are rotated (test-only)."""

    type: Literal["half_rope"] = "half_rope"
    n_heads: int = Field(2, description="heads")
    head_dim: int = Field(16, description="width of a head")
    rope_dim: int = Field(8, description="features of each head the position scheme rotates")
    declare: bool = Field(True, description="declare the rotary width (false: the old, undeclared behaviour)")

    def position_geometry(self, ctx):
        if not self.declare:
            return PositionGeometry(self.n_heads, self.head_dim)  # what build assumed before: the head width
        return PositionGeometry(self.n_heads, self.rope_dim)


class HalfRope(nn.Module):
    def __init__(self, cfg: HalfRopeConfig, d_model: int):
        super().__init__()
        self.n_heads = self.n_kv_heads = cfg.n_heads
        self.head_dim, self.rope_dim = cfg.head_dim, cfg.rope_dim
        self.qkv = nn.Linear(d_model, 3 * cfg.n_heads * cfg.head_dim, bias=False)
        self.o = nn.Linear(cfg.n_heads * cfg.head_dim, d_model, bias=False)

    def forward(self, x, inputs):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        r = self.rope_dim
        if inputs.position is not None:  # rotate the first rope_dim features only
            qr, kr = inputs.position.rotate(q[..., :r], k[..., :r], inputs.positions)
            q, k = torch.cat([qr, q[..., r:]], -1), torch.cat([kr, k[..., r:]], -1)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v, mixer=self)
        mask = modkit.prepare_mask(inputs, k_pos, k_valid, q.dtype)
        out, _ = modkit.masked_attention(q, k, v, mask)
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class RopePlugin:
    @hookimpl
    def register_components(self, register) -> None:
        register(
            Component(
                kind="attention",
                type="half_rope",
                config=HalfRopeConfig,
                factory=lambda cfg, ctx: HalfRope(cfg, ctx.d_model),
                description="test-only partial rope",
                capabilities={"causal_safe": True, "kv_cache": True},
            )
        )


@pytest.fixture(scope="module")
def rope_reg() -> modkit.Registry:
    r = _builtins()
    r.register_plugin(RopePlugin(), "rope-width-test")
    return r


def test_a_declared_rotary_width_builds_that_scheme_and_runs(rope_reg):
    """A spec that validates runs: the rope is built at the 8 features the attention rotates, not its 16-wide heads."""
    model = modkit.build(_spec({"type": "half_rope"}), seed=0, registry=rope_reg).eval()
    assert model.positions[0].rotary_dim == 8
    ids = torch.randint(1, 64, (2, 14), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(ids).logits
        got, _ = _decode(model, ids, None, SCHEDULE)
    torch.testing.assert_close(got, full, atol=1e-5, rtol=1e-4)
    # the head width alone (no declaration of the rotated part) builds a 16-wide rope that cannot rotate 8 features
    wrong = modkit.build(_spec({"type": "half_rope", "declare": False}), seed=0, registry=rope_reg)
    with pytest.raises(RuntimeError, match="must match the size of tensor"):
        wrong(ids)


def test_the_rotary_width_is_validated_as_declared(rope_reg):
    """Spec time sees the declared 8 features: partial_rotary 0.25 rotates 2 of them (valid), 0.125 rotates 1
    (refused, naming the declared width), although 0.125 of the 16-wide heads would be a valid 2."""
    modkit.load_spec(_spec({"type": "half_rope"}, position={"type": "rope", "partial_rotary": 0.25}), registry=rope_reg)
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(
            _spec({"type": "half_rope"}, position={"type": "rope", "partial_rotary": 0.125}), registry=rope_reg
        )
    ((path, msg),) = err.value.errors
    assert path == "position.partial_rotary" and "int(8 × 0.125)" in msg and "rotary width of 1" in msg


def test_the_builtin_attention_keeps_its_layout_and_declares_it():
    spec = _spec({"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sliding_window": 6})
    model = modkit.build(spec, seed=0)
    attn = model.layers[0].attention
    assert attn.cache_spec() == CacheSpec.kv(2, 8, 6) and model.mixer_paths == [["attention"], ["attention"]]
    cache = model.new_cache(3, 20, "bfloat16")
    assert (
        cache.layers[0].only.k.shape == (3, 2, 6, 8) and cache.layers[0].only.group.ring
    )  # [batch, n_kv_heads, slots, head_dim]
    assert cache.nbytes() == cache.declared_nbytes() == 2 * 3 * 2 * (2 * 8) * 6 * 2
    geo = position_geometry(model.spec.block.attention, model.spec)
    assert geo == PositionGeometry(4, 8, 2)


# ------------------------------------------------------------------------------------ the plugin guide's example


def _guide_example():
    """The plugin guide's latent-attention example (``docs/examples/latent_attention.py``, shown verbatim by the
    guide: ``tests/testing/test_example_plugin.py``), imported from its file."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "latent_attention.py"
    spec = importlib.util.spec_from_file_location("latent_attention_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an installed plugin's module is (torch.compile resolves it by name)
    spec.loader.exec_module(module)
    return module


def test_the_guides_latent_only_attention_works_without_a_core_edit():
    r = _builtins()
    r.register_plugin(_guide_example(), "guide-latent")  # the module is the plugin (its register_components hook)
    spec = _spec({"type": "latent-attention"})
    model = modkit.build(spec, registry=r, seed=0)
    summary = modkit.summarize(model, "float32", registry=r).to_json()
    assert summary["kv_cache_bytes_per_token"] == (16 + 4) * 2 * 4 == 160  # latent + shared key, no padding
    assert summary["kv_cache_bytes_per_sequence"] == 160 * spec["max_seq_len"]
    cache = model.new_cache(1, 32)
    assert {n: tuple(t.shape) for n, t in cache.layers[0].state().tensors.items()} == {
        "latent": (1, 32, 16),
        "k_rope": (1, 32, 4),
    }
    results = {
        x.check: x
        for x in check_component(
            "attention",
            "latent-attention",
            registry=r,
            checks=["kv_cache_decode", "masked_row", "causality", "compile", "param_count"],
        )
    }
    assert all(x.status == "passed" for x in results.values()), {c: x.detail for c, x in results.items()}
