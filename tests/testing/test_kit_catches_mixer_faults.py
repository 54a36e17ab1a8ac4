"""The contract kit holds any token mixer to what it holds attention to, whatever its kind.

A fresh :class:`modkit.Registry` holds copies of the built-in plugins plus one test plugin with mixers written the
way a plugin author would (from the docs, with modkit's helpers): a RetNet-like retention (kind ``mixer``), a softmax
mixer of kind ``mixer`` that declares a position geometry, and a Differential attention whose cache entry ``k``
holds ``2 * n_kv_heads`` key maps, and a block-compressed attention whose per-block cache entries declare more
slots than it fills. Each fault is one realistic mistake the kit used to pass; each must FAIL exactly
the check that guards it and nothing else, and the sound versions (and the Differential attention, once refused by
an unwritten cache rule) must pass everything.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import replace
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig, hookimpl
from modkit.plugin import CacheEntry, CacheSpec, PositionGeometry
from modkit.testing import CHECK_NAMES
from modkit.testing.checks.state import check_cache_state, check_long_decode
from modkit_plugins.compressed_attention import CompressedAttention, CompressedAttentionConfig
from modkit_plugins.compressed_attention import _flops as _compressed_flops
from tests.kit_results import KitResults

# ----------------------------------------------------------------------------------------------- retention


class RetentionConfig(ComponentConfig):
    """Config of the test retention mixers (``retention`` is sound; the others carry one fault each)."""

    type: Literal["retention", "half_state", "slow_decay"]
    n_heads: int = Field(4, description="number of heads")

    def position_geometry(self, ctx):
        """No rotary or bias scheme acts here: the per-head decays carry the order."""
        return None


class Retention(nn.Module):
    """Multi-scale retention (Sun et al. 2023, RetNet, arXiv:2307.08621, §2.1-2.2) without the group norm and gate.

    Per head with decay ``γ_h = 1 - 2^(-5-h)``: ``o_n = Σ_{m<=n} γ^(n-m) (q_n · k_m) v_m``; with a state ``S`` carried
    in the cache, a call of ``s`` tokens adds ``γ^(i+1) q_i S`` to token ``i`` and leaves ``γ^s S + Σ_j γ^(s-1-j)
    k_jᵀ v_j``. Computed in at least float32. ``fault`` injects one mistake.
    """

    def __init__(self, d_model: int, n_heads: int, fault: str | None = None):
        super().__init__()
        self.n_heads, self.head_dim, self.fault = n_heads, d_model // n_heads, fault
        self.gammas = tuple(1 - 2.0 ** (-5 - h) for h in range(n_heads))
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))
        self.kept = n_heads // 2 if fault == "half_state" else n_heads  # FAULT (half_state): half declared...
        self.hidden = None  # ... and the other half kept here, on the module

    def cache_spec(self) -> CacheSpec:
        d = self.head_dim
        return CacheSpec((CacheEntry("state", (self.kept, d, d), growth="sequence"),))

    def _read(self, state, b: int, dtype: torch.dtype) -> torch.Tensor:
        kept = state["state"].to(dtype)
        if self.fault != "half_state":
            return kept
        if self.hidden is None or self.hidden.shape[0] != b:
            self.hidden = kept.new_zeros(b, self.n_heads - self.kept, self.head_dim, self.head_dim)
        return torch.cat([kept, self.hidden], dim=1)

    def _write(self, state, new: torch.Tensor) -> None:
        state.write("state", new[:, : self.kept])
        if self.fault == "half_state":
            self.hidden = new[:, self.kept :]

    def forward(self, x, inputs):
        b, s, _ = x.shape
        dt = torch.promote_types(x.dtype, torch.float32)

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2).to(dt)

        q, k, v = heads(self.q(x)), heads(self.k(x)) * self.head_dim**-0.5, heads(self.v(x))
        if inputs.token_mask is not None:  # padding writes nothing
            m = inputs.token_mask[:, None, :, None].to(dt)
            k, v = k * m, v * m
        gamma = torch.tensor(self.gammas, dtype=torch.float64, device=x.device)[:, None]  # [h, 1]
        n = torch.arange(s, device=x.device, dtype=torch.float64)
        gap = n[:, None] - n[None, :]
        decay = torch.where(gap >= 0, gamma[..., None] ** gap.clamp(min=0), 0.0).to(dt)  # [h, s, s]
        out = ((q @ k.transpose(-1, -2)) * decay) @ v
        state = inputs.cache_for(self)
        if state is not None:
            prev = self._read(state, b, dt)  # [b, h, d, d]
            if self.fault == "slow_decay" and s == 1:  # FAULT: the decode step decays the state a little more
                prev = prev * (1 - 1e-5)
            into = (gamma ** (n + 1)).to(dt)[:, :, None]  # [h, s, 1]
            out = out + (q * into) @ prev
            left = (gamma ** (s - 1 - n)).to(dt)[:, :, None]
            self._write(state, (gamma**s).to(dt)[..., None] * prev + (k * left).transpose(-1, -2) @ v)
        return self.o(out.to(x.dtype).transpose(1, 2).reshape(b, s, -1))


# ----------------------------------------------------------------------------------------------- softmax mixers


class SoftmaxMixerConfig(ComponentConfig):
    """Config of the test softmax mixers of kind ``mixer`` (``softmax_mixer`` is sound)."""

    type: Literal["softmax_mixer", "ignores_position", "float_flops"]
    n_heads: int = Field(4, description="number of heads")

    def position_geometry(self, ctx) -> PositionGeometry:
        """Queries and keys of ``n_heads`` heads at ``d_model / n_heads``: a rotary or bias scheme acts on them."""
        return PositionGeometry(self.n_heads, ctx.d_model // self.n_heads, self.n_heads)


class SoftmaxMixer(nn.Module):
    """Causal softmax attention registered as a ``mixer``; ``ignores_position`` never applies the scheme it is given."""

    def __init__(self, d_model: int, n_heads: int, fault: str | None = None):
        super().__init__()
        self.n_heads, self.head_dim, self.fault = n_heads, d_model // n_heads, fault
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def cache_spec(self) -> CacheSpec:
        return CacheSpec.kv(self.n_heads, self.head_dim)

    def forward(self, x, inputs):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        applies = inputs.position is not None and self.fault != "ignores_position"  # FAULT (ignores_position)
        if applies:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v, mixer=self)
        allowed = modkit.attention_mask(inputs.positions, k_pos, k_valid)
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        bias = modkit.position_bias(inputs, k_pos, self.n_heads) if applies else None
        if bias is not None:
            scores = scores + bias
        probs = modkit.masked_softmax(scores, modkit.PreparedMask.of(allowed, q.dtype))
        return self.o((probs.to(v.dtype) @ v).transpose(1, 2).reshape(b, s, -1))


def _softmax_flops(cfg, ctx, work) -> dict:
    """q, k, v, o projections and the two score products over the pairs the mask lets through."""
    d, pairs = ctx.d_model, work.pairs()
    if cfg.type == "float_flops" and not work.dense:  # FAULT: (new + 1) / 2 keys per query on average: a float
        pairs = work.batch * work.new * (work.past + (work.new + 1) / 2)
    return {"proj": 8 * work.tokens * d * d, "scores": 4 * pairs * d}


# ----------------------------------------------------------------------------------------------- differential


class DiffAttentionConfig(ComponentConfig):
    """Config of ``diff_attention``."""

    type: Literal["diff_attention"] = "diff_attention"
    n_heads: int = Field(4, description="number of heads (each with two query maps)")

    def position_geometry(self, ctx) -> PositionGeometry:
        """The scheme rotates ``2 · n_heads`` query maps and the 2 key maps, ``d_model / (2 · n_heads)`` wide."""
        return PositionGeometry(2 * self.n_heads, ctx.d_model // (2 * self.n_heads), 2)


class DiffAttention(nn.Module):
    """Differential attention (Ye et al. 2024, arXiv:2410.05258): each head's weights are the difference of two
    softmax maps, ``softmax(q1 k1ᵀ) - λ softmax(q2 k2ᵀ)`` (λ = 0.5), over one value head shared by every query head
    (``n_kv_heads = 1``): the cache keeps the two key maps of that group under ``"k"`` (``2 · n_kv_heads`` heads)."""

    LAMBDA = 0.5

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, 1
        self.head_dim = d_model // (2 * n_heads)
        self.q, self.o = nn.Linear(d_model, d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.k, self.v = (nn.Linear(d_model, 2 * self.head_dim, bias=False) for _ in range(2))

    def cache_spec(self) -> CacheSpec:
        return CacheSpec(
            (
                CacheEntry("k", (2 * self.n_kv_heads, self.head_dim), slot_axis=2),
                CacheEntry("v", (self.n_kv_heads, 2 * self.head_dim), slot_axis=2),
            )
        )

    def forward(self, x, inputs):
        b, s, _ = x.shape
        h, hd = self.n_heads, self.head_dim
        q = self.q(x).view(b, s, 2 * h, hd).transpose(1, 2)
        k = self.k(x).view(b, s, 2, hd).transpose(1, 2)
        v = self.v(x).view(b, s, 1, 2 * hd).transpose(1, 2)
        if inputs.position is not None:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v, mixer=self)
        allowed = modkit.attention_mask(inputs.positions, k_pos, k_valid)
        scores = q.float().view(b, 2, h, s, hd) @ k.float()[:, :, None].transpose(-1, -2)
        scores = scores.reshape(b, 2 * h, s, -1) / math.sqrt(hd)
        bias = modkit.position_bias(inputs, k_pos, 2 * h)
        if bias is not None:
            scores = scores + bias
        probs = modkit.masked_softmax(scores, modkit.PreparedMask.of(allowed, q.dtype))
        weights = probs[:, :h] - self.LAMBDA * probs[:, h:]
        return self.o((weights.to(v.dtype) @ v).transpose(1, 2).reshape(b, s, -1))


# ----------------------------------------------------------------------------------------------- block growth


class OvergrownConfig(CompressedAttentionConfig):
    """``compressed_attention`` whose per-block cache entries declare half its compression ratio."""

    type: Literal["overgrown_blocks"] = "overgrown_blocks"  # type: ignore[assignment]


class OvergrownBlocks(CompressedAttention):
    """FAULT (overgrown_blocks): compresses blocks of m but declares one cache slot per m / 2 tokens; it reads and
    writes consistently (cached decode stays exact), but half the slots it declares, reports and allocates stay
    empty."""

    def cache_spec(self) -> CacheSpec:
        spec = super().cache_spec()
        half = [replace(e, block=e.block // 2) if e.per_block else e for e in spec.entries]
        return CacheSpec(tuple(half), window=spec.window)


def _overgrown_flops(cfg, ctx, work) -> dict:
    """``compressed_attention``'s FLOPs, with the twice-as-many cached entries a cached decode scores."""
    out = _compressed_flops(cfg, ctx, work)
    if work.dense and work.past:
        total, m = work.past + work.new, cfg.compress_ratio
        extra = work.batch * work.new * (total // (m // 2) - total // m)
        for part, width in (("scores", cfg.n_heads * cfg.head_dim), ("values", cfg.n_heads * cfg.head_dim)):
            out[part] += 2 * width * extra
        out["index_scores"] += 2 * cfg.index_n_heads * cfg.index_head_dim * extra
    return out


# ----------------------------------------------------------------------------------------------- the plugin


def _mixer(type_: str, config, make, **extra) -> Component:
    return Component(
        kind=extra.pop("kind", "mixer"),
        type=type_,
        config=config,
        factory=make,
        description=f"test token mixer ({type_})",
        capabilities={"causal_safe": True, "kv_cache": True},
        example={"type": type_},
        **extra,
    )


class MixerPlugin:
    """Registers the sound mixers and one faulty mixer per fault."""

    @hookimpl
    def register_components(self, register) -> None:
        square = {"param_count": lambda cfg, ctx: 4 * ctx.d_model * ctx.d_model}
        for t in ("retention", "half_state", "slow_decay"):
            fault = None if t == "retention" else t
            register(_mixer(t, RetentionConfig, lambda c, x, f=fault: Retention(x.d_model, c.n_heads, f), **square))
        for t in ("softmax_mixer", "ignores_position", "float_flops"):
            fault = None if t == "softmax_mixer" else t
            make = lambda c, x, f=fault: SoftmaxMixer(x.d_model, c.n_heads, f)  # noqa: E731
            register(_mixer(t, SoftmaxMixerConfig, make, flops=_softmax_flops, **square))
        sound = modkit.get_registry().get("attention", "compressed_attention")
        register(
            replace(
                sound,
                type="overgrown_blocks",
                config=OvergrownConfig,
                factory=lambda c, x: OvergrownBlocks(c, x),
                flops=_overgrown_flops,
                example={**sound.example_config(), "type": "overgrown_blocks"},
                provider=None,
            )
        )
        register(
            _mixer(
                "diff_attention",
                DiffAttentionConfig,
                lambda c, x: DiffAttention(x.d_model, c.n_heads),
                kind="attention",
                param_count=lambda cfg, ctx: (
                    2 * ctx.d_model * ctx.d_model + 2 * ctx.d_model * ctx.d_model // cfg.n_heads
                ),
            )
        )


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    """Built-in plugins (copied from the process-wide registry) plus the test mixers."""
    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(MixerPlugin(), "mixer-demo")
    return reg


@pytest.fixture(scope="module")
def results(registry) -> KitResults:
    """``results(kind, type)``: ``{check: CheckResult}``, computed once per component; ``results.one(kind, type,
    check)``: one check's result (alone where the whole kit has not run on the component in this process)."""
    return KitResults(registry)


# ----------------------------------------------------------------------------------------------- the tests

#: (kind, type, the check that must fail, a fragment its detail must contain)
FAULTS = [
    ("mixer", "half_state", "cache_state", "after cache.reset(), decoding another sequence: max |Δ| = "),
    ("mixer", "slow_decay", "long_decode", "decoding 1024 tokens one at a time drifts from the full forward"),
    ("mixer", "ignores_position", "position_sensitivity", "alibi (acts_on bias): max |Δ| = 0 against position none"),
    ("mixer", "float_flops", "flops", "flops() returned 'scores': "),
    ("attention", "overgrown_blocks", "kv_cache_decode", "declares one slot per 1 tokens, so 64 slots after 64"),
]


@pytest.mark.parametrize("kind,type_,check,fragment", FAULTS, ids=[f"{k}/{t}::{c}" for k, t, c, _ in FAULTS])
def test_mixer_fault_is_caught_by_its_check_alone(results, kind, type_, check, fragment):
    got = results(kind, type_)
    assert list(got) == list(CHECK_NAMES)
    r = got[check]
    assert r.status == "failed", f"{r.id} should fail, got {r.status}: {r.detail}"
    assert fragment in r.detail, r.detail
    failed = {c: got[c].detail for c, res in got.items() if res.status == "failed"}
    assert set(failed) == {check}, failed
    assert sum(res.status == "passed" for res in got.values()) >= 8


@pytest.mark.parametrize(
    "kind,type_", [("mixer", "retention"), ("mixer", "softmax_mixer"), ("attention", "diff_attention")]
)
def test_sound_mixers_pass_every_check(results, kind, type_):
    got = results(kind, type_)
    failed = {c: r.detail for c, r in got.items() if r.status == "failed"}
    assert not failed, failed
    for check in ("kv_cache_decode", "cache_state", "long_decode", "masked_row", "causality"):
        assert got[check].status == "passed", (check, got[check].detail)


def test_a_k_entry_of_two_key_maps_per_group_is_accepted(results):
    """Differential attention keeps ``2 * n_kv_heads`` key maps under ``"k"`` (its module says ``n_kv_heads = 1``):
    the kit once refused it with "holds 2 key heads but n_kv_heads = 1", a rule written nowhere."""
    got = {c: results.one("attention", "diff_attention", c) for c in ("kv_cache_decode", "position_sensitivity")}
    assert got["kv_cache_decode"].status == "passed", got["kv_cache_decode"].detail
    assert "with position alibi, learned, none, rope, sinusoidal" in got["kv_cache_decode"].detail
    assert got["position_sensitivity"].status == "passed", got["position_sensitivity"].detail


def test_state_kept_on_the_module_is_measured(results):
    """``half_state`` keeps 2 of its 4 heads' state on ``self``: after ``reset`` its logits are off by O(1), and the
    bytes it holds outside the cache equal the bytes the cache holds."""
    detail = results.one("mixer", "half_state", "cache_state").detail
    worst = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", detail).group(1))
    tol = float(re.search(r"tolerance ([0-9.e+-]+)", detail).group(1))
    assert worst > 0.05 and worst / tol > 1e3, detail
    assert results.one("mixer", "retention", "cache_state").status == "passed"


def test_the_bytes_held_outside_the_cache_are_named(registry):
    """The third part of ``cache_state``, alone: a retention that decodes right (reset and copies agree) but keeps a
    copy of its last state on ``self`` (a debugging leftover) holds memory ``cache.nbytes()`` does not count; the
    tensor is named, with its bytes."""
    from modkit.testing.checks import ComponentChecks

    bench = ComponentChecks(registry.get("mixer", "retention"), registry)._bench()[1]
    real = Retention._write

    def keeps_a_copy(self, state, new):
        real(self, state, new)
        self.last_state = new.detach()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Retention, "_write", keeps_a_copy)
        with pytest.raises(AssertionError) as info:
            check_cache_state(bench)
    msg = str(info.value)
    # 2 layers x batch 2 x 4 heads x 8 x 8 float32: the cache's 4,096 bytes, and as many again on the modules
    assert msg.startswith("cache.nbytes() reports 4,096 bytes but decoding holds 4,096 more outside the declared"), msg
    assert "layers.0.attention.last_state [2, 4, 8, 8] float32 (added, 2,048 bytes)" in msg, msg


def test_long_decode_margins(registry, results):
    """The slow decay fails by orders of magnitude in float64; the sound retention passes by as many."""
    from modkit.testing.checks import ComponentChecks

    detail = results.one("mixer", "slow_decay", "long_decode").detail
    worst = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", detail).group(1))
    tol = float(re.search(r"tolerance ([0-9.e+-]+)", detail).group(1))
    assert "ulps of float64" in detail and worst / tol > 1e6, detail
    assert results.one("mixer", "slow_decay", "kv_cache_decode").status == "passed"  # 64 tokens in chunks: unseen
    ok = check_long_decode(ComponentChecks(registry.get("mixer", "retention"), registry)._bench()[1])
    assert "the component computes in float64" in ok, ok


class UndeclaredRetentionConfig(ComponentConfig):
    """A retention config written before mixers declared their position geometry: ``n_heads``, no declaration."""

    type: Literal["undeclared_retention"] = "undeclared_retention"
    n_heads: int = Field(4, description="number of heads")


def _validation_spec(mixer: dict, position: str) -> dict:
    return {
        "schema_version": 1,
        "name": "validate-demo",
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": {"type": position},
        "block": {
            "mixer": mixer,
            "ffn": {"type": "mlp", "d_ff": 64},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
    }


def test_validate_names_a_mixer_that_declares_no_position_geometry(registry):
    """An ALiBi spec whose mixer declares ``position_geometry() -> None`` is refused, naming the layer and the fix;
    one whose mixer declares nothing at all validates (its fields give n_heads) with a warning naming its layers, the
    mixer and the declaration to add, instead of a silent ``ok``."""

    class Plugin:
        @hookimpl
        def register_components(self, register):
            register(
                _mixer(
                    "undeclared_retention",
                    UndeclaredRetentionConfig,
                    lambda c, x: Retention(x.d_model, c.n_heads),
                )
            )

    registry.register_plugin(Plugin(), "undeclared-demo")
    try:
        with pytest.raises(modkit.SpecError) as info:
            modkit.load_spec(_validation_spec({"type": "retention"}, "alibi"), registry=registry)
        assert info.value.errors == [
            (
                "position",
                "position type 'alibi' acts on the attention scores, but no layer using it has a mixer that declares "
                "a n_heads for it (layer 0's 'retention' declares no n_heads: its position_geometry() gives None); "
                "use position type 'none', or give such layers an attention",
            )
        ]
        with pytest.warns(modkit.SpecWarning) as caught:
            modkit.load_spec(_validation_spec({"type": "undeclared_retention"}, "alibi"), registry=registry)
        messages = [str(w.message) for w in caught]
        assert len(messages) == 1, messages
        assert messages[0].startswith(
            "layers 0, 1: mixer 'undeclared_retention' (UndeclaredRetentionConfig) declares no "
            "position_geometry(ctx), and position 'alibi' acts on the attention scores: its fields give n_heads = 4"
        ), messages
        assert "declare position_geometry(ctx) on its config" in messages[0]
        with warnings.catch_warnings():  # a scheme acting on the embeddings asks nothing of the mixer
            warnings.simplefilter("error")
            modkit.load_spec(_validation_spec({"type": "undeclared_retention"}, "sinusoidal"), registry=registry)
    finally:
        registry.unregister_plugin("undeclared-demo")
