"""The contract kit catches deliberately faulty components, each by the right check, by orders of magnitude.

A fresh :class:`modkit.Registry` holds copies of the built-in plugins (the neighbours the kit fills the tiny models
with) plus one test plugin registering one broken component per fault, written the way a plugin author would (the
attentions use modkit's attention helpers, the recurrent mixer modkit's recurrent helpers, then break one thing). Each must FAIL exactly the check that guards its
fault (and, for a token-mixing ffn, the cached decode it also breaks), and pass the unrelated ones (the too-wide
FFN cannot take part in any forward of a model, so only the checks that need no forward are required to pass).
The same code without faults (``SoundPlugin``) passes everything and gets the same verdict whether or not the
faulty plugin is installed beside it: neighbours come from the built-ins only.
"""

from __future__ import annotations

import argparse
import io
import math
import re
from dataclasses import replace
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig, Init, PositionScheme, hookimpl
from modkit.plugin import causal_conv, document_starts, padding_mask, zero_padding
from modkit.testing import CHECK_NAMES, check_component
from modkit.testing.cli import add_subcommands
from modkit_plugins.attention import Attention, AttentionConfig
from tests.kit_results import KitResults

D_FF = 48


# ----------------------------------------------------------------------------------------------- faulty modules


ATTENTION_FAULTS = (
    "peeking",
    "drifting",
    "nan_softmax",
    "late_peek",
    "train_peek",
    "ignores_bias",
    "rope_offset",
    "fake_dropout",
    "overdeclared",
    "doc_leak",
    "undeclared_matrix",
)


class MiniAttentionConfig(ComponentConfig):
    """Config of the test attentions (one type per fault, and ``sound``, which has none)."""

    type: Literal[ATTENTION_FAULTS + ("sound",)]  # type: ignore[valid-type]
    n_heads: int = Field(4, description="number of heads")


class MiniAttention(nn.Module):
    """Causal multi-head attention written as a plugin author would: the projections and the score function, the
    rest from modkit's attention helpers. ``fault`` injects one realistic mistake (``None``: none)."""

    def __init__(self, d_model: int, n_heads: int, fault: str | None = None, dropout: float = 0.0):
        super().__init__()
        self.n_heads = self.n_kv_heads = n_heads
        self.head_dim = d_model // n_heads
        self.sliding_window = None
        self.fault, self.dropout = fault, dropout
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x, inputs):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        pos = inputs.positions
        if inputs.position is not None:
            # FAULT (rope_offset): decode steps rotated one position ahead (an off-by-one in the cached path)
            rot = pos + 1 if self.fault == "rope_offset" and inputs.cache is not None and s == 1 else pos
            q, k = inputs.position.rotate(q, k, rot)
        k, v, k_pos, k_valid = modkit.update_cache(inputs, k, v)
        docs = None if self.fault == "doc_leak" else inputs.documents  # FAULT (doc_leak): documents ignored
        allowed = modkit.attention_mask(pos, k_pos, k_valid, q_doc=docs, k_doc=docs)
        next_token = (pos[:, :, None] + 1 == k_pos[:, None, :])[:, None]
        if self.fault == "peeking":  # FAULT: a query also sees the next token
            allowed = allowed | next_token
        if self.fault == "late_peek":  # FAULT: ... but only from position 8 on
            allowed = allowed | (next_token & (pos[:, None, :, None] >= 8))
        if self.fault == "train_peek" and self.training:  # FAULT: ... but only in training mode
            allowed = allowed | next_token
        scores = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.head_dim)
        bias = modkit.position_bias(inputs, k_pos, self.n_heads)
        if bias is not None and self.fault != "ignores_bias":  # FAULT (ignores_bias): ALiBi never added
            scores = scores + bias
        p = (
            self.dropout if self.training and self.fault != "fake_dropout" else 0.0
        )  # FAULT (fake_dropout): never applied
        if self.fault == "nan_softmax":  # FAULT: a plain softmax, no guard for a query that sees no key
            probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        else:
            probs = modkit.masked_softmax(scores, modkit.PreparedMask.of(allowed, q.dtype), p)
        out = probs.to(v.dtype) @ v
        if self.fault == "drifting" and inputs.cache is not None and k.shape[2] > s:
            out = out * 1.1  # FAULT (drifting): decoding against cached keys is scaled differently
        merged = out.transpose(1, 2).reshape(b, s, -1)
        if self.fault == "undeclared_matrix":  # FAULT: reads o's weight itself without declaring matrix_weights
            return nn.functional.linear(merged, self.o.weight)
        return self.o(merged)


class OverdeclaredAttention(MiniAttention):
    """FAULT (overdeclared): declares a per-token cache entry it never writes (the cache-bytes analogue of the old
    ``kv_cache_elements_per_token`` override that disagreed with what was allocated): ``modkit build`` / ``cost``
    count bytes the attention never uses."""

    def cache_spec(self):
        kv = modkit.CacheSpec.kv(self.n_kv_heads, self.head_dim)
        return modkit.CacheSpec(kv.entries + (modkit.CacheEntry("spare", (self.n_heads, self.head_dim), slot_axis=2),))


NORM_FAULTS = ("leaky_dtype", "miscounted", "plain_attr", "no_upcast", "fixed_width", "roleless")


class RecurrenceConfig(ComponentConfig):
    """Config of the test recurrent mixers (``state_leak``, and ``sound_recurrence``, which has no fault)."""

    type: Literal["state_leak", "sound_recurrence"]

    def position_geometry(self, ctx):
        """No queries or keys: a rotary or bias position scheme does not act here."""
        return None


class Recurrence(nn.Module):
    """A gated linear recurrence written as a plugin author would, with modkit's recurrent helpers: ``u =
    silu(conv(W_in x))`` (a causal depthwise convolution of 3), then per channel ``h_t = a ⊙ h_{t-1} + (1 - a) ⊙ u_t``
    with ``a = sigmoid(decay)``, ``y = W_out h``; the cache keeps the window and ``h``. Padding tokens change nothing
    (``u = 0``, ``a = 1``); a document start sets ``a = 0`` (the state entering a document is zero) and the
    convolution restarts. FAULT (state_leak): the convolution restarts at a document start, the state does not."""

    param_roles = {"decay": "vector", "conv.weight": "vector", "conv.bias": "bias"}

    def __init__(self, d_model: int, fault: str | None = None):
        super().__init__()
        self.fault, self.d_model = fault, d_model
        self.inp, self.out = nn.Linear(d_model, d_model, bias=False), nn.Linear(d_model, d_model, bias=False)
        self.conv = nn.Conv1d(d_model, d_model, 3, groups=d_model)
        self.decay = nn.Parameter(torch.empty(d_model))

    def cache_spec(self):
        return modkit.CacheSpec(
            (
                modkit.CacheEntry("conv", (self.d_model, 2), growth="sequence"),
                modkit.CacheEntry("h", (self.d_model,), growth="sequence", dtype=torch.float32),
            )
        )

    def init_weights(self, init: Init) -> None:
        init.uniform_(self.decay, 1.0, 3.0)  # a in (0.73, 0.95): a long memory
        init.uniform_(self.conv.weight, -0.5, 0.5)
        init.zeros_(self.conv.bias)

    def forward(self, x, inputs):
        state = inputs.cache_for(self)
        mask = padding_mask(inputs.token_mask, torch.float32)
        starts = document_starts(inputs.documents)
        u = zero_padding(self.inp(x), mask)
        u = zero_padding(nn.functional.silu(causal_conv(u, self.conv, state, starts=starts)), mask)
        work = torch.promote_types(x.dtype, torch.float32)
        a = torch.sigmoid(self.decay.to(work)).expand(x.shape[0], x.shape[1], -1)
        if mask is not None:
            a = torch.where(mask.bool(), a, torch.ones_like(a))  # padding: no decay
        if starts is not None and self.fault != "state_leak":  # FAULT (state_leak): the state runs on
            a = a * (~starts)[..., None].to(work)
        h = state["h"].to(work) if state is not None else x.new_zeros(x.shape[0], self.d_model, dtype=work)
        u, hs = u.to(work), []
        for t in range(x.shape[1]):
            h = a[:, t] * h + (1 - torch.sigmoid(self.decay.to(work))) * u[:, t]
            hs.append(h)
        if state is not None:
            state.write("h", h)
        return self.out(torch.stack(hs, 1).to(x.dtype))


class PlainNormConfig(ComponentConfig):
    """Config of the test norms (one type per fault, and ``sound``)."""

    type: Literal[NORM_FAULTS + ("sound",)]  # type: ignore[valid-type]


class PlainRMSNorm(nn.Module):
    """RMSNorm over ``dim`` features, statistics in float32; ``fault`` injects one mistake."""

    param_roles = {"weight": "norm_gain"}

    def __init__(self, dim: int, fault: str | None = None):
        super().__init__()
        self.fault = fault
        self.weight = nn.Parameter(torch.empty(dim))
        if fault == "plain_attr":  # FAULT: a tensor kept as a plain attribute, not a buffer (to_empty never moves it)
            self.gain = torch.ones(dim)

    def forward(self, x):
        if self.fault == "no_upcast":  # FAULT: statistics in the input dtype (x² overflows float16 at 300)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.to(x.dtype)
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.float()
        if self.fault == "plain_attr":
            y = y * self.gain
        return y if self.fault == "leaky_dtype" else y.to(x.dtype)  # FAULT (leaky_dtype): float32 out for bfloat16 in

    def init_weights(self, init: Init) -> None:
        init.ones_(self.weight)


class RolelessRMSNorm(PlainRMSNorm):
    """The same norm with no role for its gain: FAULT (roleless): optimizers, weight decay and muP cannot place it."""

    param_roles = None


def _norm_width(cfg, ctx) -> int:
    # FAULT (fixed_width): always d_model wide, ignoring ctx.dim (a per-head QK-norm is head_dim wide)
    return ctx.d_model if cfg.type == "fixed_width" else (ctx.dim or ctx.d_model)


class PlainFFNConfig(ComponentConfig):
    """Config of the test FFNs (``widening``, ``idle_param``, ``mixing_groups``, ``token_mixing``, ``sound``)."""

    type: Literal["widening", "idle_param", "mixing_groups", "token_mixing", "sound"]


class TestFFN(nn.Module):
    """``down(gelu(up(x)))``; ``widen`` makes the output one feature too wide, ``idle`` adds a dead parameter,
    ``mix`` averages each token's output with those of the tokens before it."""

    __test__ = False  # not a pytest test class
    param_roles = {"unused": "vector"}

    def __init__(self, d_model: int, *, widen: bool = False, idle: bool = False, mix: bool = False):
        super().__init__()
        self.mix = mix
        self.up = nn.Linear(d_model, D_FF)
        self.down = nn.Linear(D_FF, d_model + (1 if widen else 0))  # FAULT (widening): last dim d_model + 1
        self.unused = nn.Parameter(torch.empty(d_model)) if idle else None  # FAULT (idle_param): never used

    def forward(self, x):
        y = self.down(nn.functional.gelu(self.up(x)))
        if self.mix:  # FAULT (token_mixing): a running mean over the previous tokens (causal, but not per token)
            count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=torch.float32)[:, None]
            y = (y.float().cumsum(1) / count).to(y.dtype)
        return y

    def init_weights(self, init: Init) -> None:
        if self.unused is not None:
            init.zeros_(self.unused)


class MixingGroups(nn.Module):
    """Grouped form of ``mixing_groups``: ``n`` stacked ``down(gelu(up(x)))`` copies, but every row goes through
    copy 0 whatever ``offs`` says (the routing to experts is lost)."""

    param_roles = {"up": "expert", "up_bias": "bias", "down": "expert", "down_bias": "bias"}

    def __init__(self, n: int, d_model: int):
        super().__init__()
        self.up = nn.Parameter(torch.empty(n, d_model, D_FF))
        self.up_bias = nn.Parameter(torch.empty(n, D_FF))
        self.down = nn.Parameter(torch.empty(n, D_FF, d_model))
        self.down_bias = nn.Parameter(torch.empty(n, d_model))

    def forward(self, x, offs):
        h = nn.functional.gelu(x @ self.up[0] + self.up_bias[0])  # FAULT (mixing_groups): offs ignored, copy 0
        others = sum(p[1:].sum() for p in self.parameters())  # the other copies take part in the graph only
        return h @ self.down[0] + self.down_bias[0] + 0.0 * others

    def init_weights(self, init: Init) -> None:
        for p in self.parameters():
            init.normal_(p)


class RouterConfig(ComponentConfig):
    """Config of ``detached_router``."""

    type: Literal["detached_router"] = "detached_router"


class DetachedRouter(nn.Module):
    """Top-k softmax router (the built-in mixture's contract: ``(weights, indices, logits)``) whose logits come back
    detached, so the aux loss computed from them trains nothing."""

    matrix_weights = ("proj.weight",)  # read in float32, as the built-in routers declare

    def __init__(self, d_model: int, n_experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.proj = nn.Linear(d_model, n_experts, bias=False)

    def forward(self, x):
        logits = nn.functional.linear(x.float(), self.proj.weight.float())
        weights, indices = torch.topk(torch.softmax(logits, -1), self.top_k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), indices, logits.detach()  # FAULT (detached_router): aux loss gets no gradient


def _ffn_count(cfg, ctx) -> int:
    d = ctx.d_model
    out = d + (1 if cfg.type == "widening" else 0)
    return d * D_FF + D_FF + D_FF * out + out + (d if cfg.type == "idle_param" else 0)


class StaleTableConfig(ComponentConfig):
    """Config of ``stale_table``: sinusoidal positions whose table is computed only in ``__init__``."""

    type: Literal["stale_table"] = "stale_table"


class StaleTable(PositionScheme):
    """Sinusoidal absolute positions; ``init_weights`` 'initialises' the table from itself instead of recomputing it.

    A direct build is right (``__init__`` computed the table); after a meta build ``to_empty`` leaves garbage and
    ``init_weights`` copies the garbage onto itself (transformers #45902).
    """

    def __init__(self, max_seq_len: int, d_model: int):
        super().__init__()
        pos = torch.arange(max_seq_len, dtype=torch.float32)[:, None]
        inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        table = torch.zeros(max_seq_len, d_model)
        table[:, 0::2] = torch.sin(pos * inv)
        table[:, 1::2] = torch.cos(pos * inv)
        self.register_buffer("pe", table, persistent=False)

    def init_weights(self, init: Init) -> None:
        init.copy_(self.pe, self.pe.clone())  # FAULT (stale_table): not recomputed

    def embed(self, x, positions):
        return x + self.pe[positions].to(x.dtype)


def _attention(fault: str, **caps) -> Component:
    cls = OverdeclaredAttention if fault == "overdeclared" else MiniAttention
    return Component(
        kind="attention",
        type=fault,
        config=MiniAttentionConfig,
        factory=lambda cfg, ctx: cls(
            ctx.d_model, cfg.n_heads, None if fault == "sound" else fault, ctx.attention_dropout
        ),
        description=f"FAULTY ({fault}) causal attention.",
        capabilities={"causal_safe": True, **caps},
        param_count=lambda cfg, ctx: 4 * ctx.d_model * ctx.d_model,
        example={"type": fault},
    )


def _norm(fault: str, **caps) -> Component:
    return Component(
        kind="norm",
        type=fault,
        config=PlainNormConfig,
        factory=lambda cfg, ctx: (RolelessRMSNorm if fault == "roleless" else PlainRMSNorm)(
            _norm_width(cfg, ctx), None if fault == "sound" else fault
        ),
        description=f"FAULTY ({fault}) RMSNorm.",
        capabilities=caps,
        param_count=lambda cfg, ctx: _norm_width(cfg, ctx) + (1 if fault == "miscounted" else 0),  # FAULT (miscounted)
    )


def _recurrence(fault: str) -> Component:
    return Component(
        kind="mixer",
        type=fault,
        config=RecurrenceConfig,
        factory=lambda cfg, ctx: Recurrence(ctx.d_model, None if fault == "sound_recurrence" else fault),
        description=f"FAULTY ({fault}) gated linear recurrence.",
        capabilities={"causal_safe": True, "kv_cache": True, "document_mask": True},
        param_count=lambda cfg, ctx: 2 * ctx.d_model * ctx.d_model + 5 * ctx.d_model,
        example={"type": fault},
    )


class FaultyPlugin:
    """Registers one broken component per fault the kit must catch."""

    @hookimpl
    def register_components(self, register) -> None:
        register(_attention("peeking"))
        register(_attention("drifting", kv_cache=True))
        register(_attention("nan_softmax", kv_cache=True))
        register(_attention("late_peek"))
        register(_attention("train_peek", kv_cache=True))
        register(_attention("ignores_bias", kv_cache=True))
        register(_attention("rope_offset", kv_cache=True))
        register(_attention("fake_dropout", kv_cache=True, attention_dropout=True))
        register(_attention("overdeclared", kv_cache=True))
        register(_attention("doc_leak", kv_cache=True, document_mask=True))
        register(_attention("undeclared_matrix", kv_cache=True))
        register(_recurrence("state_leak"))
        register(_blind_input())
        register(_norm("leaky_dtype"))
        register(_norm("miscounted", compile_safe=True))
        register(_norm("plain_attr"))
        register(_norm("no_upcast"))
        register(_norm("fixed_width"))
        register(_norm("roleless"))
        register(
            Component(
                kind="ffn",
                type="widening",
                config=PlainFFNConfig,
                factory=lambda cfg, ctx: TestFFN(ctx.d_model, widen=True),
                description="FAULTY: output is d_model + 1 wide.",
                param_count=_ffn_count,
            )
        )
        register(
            Component(
                kind="ffn",
                type="idle_param",
                config=PlainFFNConfig,
                factory=lambda cfg, ctx: TestFFN(ctx.d_model, idle=True),
                description="FAULTY: holds a parameter the forward never uses.",
                capabilities={"compile_safe": True},
                param_count=_ffn_count,
            )
        )
        register(
            Component(
                kind="ffn",
                type="mixing_groups",
                config=PlainFFNConfig,
                factory=lambda cfg, ctx: TestFFN(ctx.d_model),
                grouped_factory=lambda cfg, ctx, n: MixingGroups(n, ctx.d_model),
                description="FAULTY: its grouped form sends every row through copy 0.",
                capabilities={"compile_safe": True},
                param_count=lambda cfg, ctx: 2 * ctx.d_model * D_FF + D_FF + ctx.d_model,
            )
        )
        register(
            Component(
                kind="ffn",
                type="token_mixing",
                config=PlainFFNConfig,
                factory=lambda cfg, ctx: TestFFN(ctx.d_model, mix=True),
                description="FAULTY: averages each token's output with the previous tokens'.",
                param_count=_ffn_count,
            )
        )
        register(
            Component(
                kind="router",
                type="detached_router",
                config=RouterConfig,
                factory=lambda cfg, ctx: DetachedRouter(
                    ctx.dim or ctx.d_model, ctx.extra["n_experts"], ctx.extra["top_k"]
                ),
                description="FAULTY: returns detached logits, so the aux loss never reaches it.",
                param_count=lambda cfg, ctx: ctx.extra["n_experts"] * (ctx.dim or ctx.d_model),
            )
        )
        register(
            Component(
                kind="position",
                type="stale_table",
                config=StaleTableConfig,
                factory=lambda cfg, ctx: StaleTable(ctx.max_seq_len, ctx.d_model),
                description="FAULTY: position table computed only in __init__.",
                capabilities={"acts_on": "embedding"},
                param_count=lambda cfg, ctx: 0,
            )
        )


class BlindInputConfig(AttentionConfig):
    """Config of ``blind_input``: the built-in attention's fields."""

    type: Literal["blind_input"] = "blind_input"


def _blind_input() -> Component:
    """FAULT (blind_input): the built-in attention declaring ``d_in`` but built as if ``BuildContext.d_in`` were
    unset, so its projections read ``d_model`` features whatever the side block hands them."""
    gqa = modkit.get_registry().get("attention", "gqa")
    return Component(
        kind="attention",
        type="blind_input",
        config=BlindInputConfig,
        factory=lambda cfg, ctx: Attention(cfg, replace(ctx, d_in=None)),
        description="FAULTY: declares d_in, ignores it.",
        capabilities=dict(gqa.capabilities),
        param_count=gqa.param_count,
        flops=gqa.flops,
        example={"type": "blind_input", "n_heads": 4, "n_kv_heads": 4},
    )


class SoundPlugin:
    """The same code without the faults: an attention, a norm and an ffn that pass every check."""

    @hookimpl
    def register_components(self, register) -> None:
        register(_attention("sound", kv_cache=True, attention_dropout=True, document_mask=True))
        register(_norm("sound"))
        register(
            Component(
                kind="ffn",
                type="sound",
                config=PlainFFNConfig,
                factory=lambda cfg, ctx: TestFFN(ctx.d_model),
                description="A two-layer GELU MLP.",
                param_count=_ffn_count,
            )
        )


# ----------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def registry() -> modkit.Registry:
    """Built-in plugins (copied from the process-wide registry) plus the faulty test plugin."""
    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(FaultyPlugin(), "faulty-demo")
    return reg


@pytest.fixture(scope="module")
def results(registry) -> KitResults:
    """``results(kind, type)``: ``{check: CheckResult}``, computed once per component; ``results.one(kind, type,
    check)``: one check's result (alone where the whole kit has not run on the component in this process)."""
    return KitResults(registry)


#: (kind, type, the check that must fail, a fragment its detail must contain)
FAULTS = [
    ("attention", "peeking", "causality", "after changing the tokens from position 1 on"),
    ("norm", "leaky_dtype", "shape_dtype", "dtype torch.float32, expected torch.bfloat16"),
    ("ffn", "widening", "shape_dtype", "shape (2, 5, 33), expected (2, 5, 32)"),
    ("ffn", "idle_param", "gradients", "unused: no gradient"),
    ("attention", "drifting", "kv_cache_decode", "between cached decode and the full forward"),
    ("position", "stale_table", "meta_init", "pe"),
    ("norm", "miscounted", "param_count", "declared 33 parameters, the module holds 32"),
    ("ffn", "mixing_groups", "grouped_form", "copy 0 and copy 2 give identical outputs"),
    # the faults found by running third-party plugins, written as real authors would, through the kit
    ("attention", "nan_softmax", "masked_row", "padding queries that see only padding keys (explicit positions): "),
    ("attention", "late_peek", "causality", "eval: max |Δ| = "),
    ("attention", "train_peek", "causality", "train mode with dropout (embedding 0.1, residual 0.1)"),
    ("attention", "ignores_bias", "position_sensitivity", "alibi (acts_on bias): max |Δ| = 0 against position none"),
    ("attention", "rope_offset", "kv_cache_decode", "with position rope: max |Δ| = "),
    ("attention", "fake_dropout", "dropout", "the declared dropout is not applied"),
    (
        "attention",
        "overdeclared",
        "kv_cache_decode",
        "declares cache entry 'spare' (4, 8) (token) but the forward never wrote it",
    ),
    ("attention", "doc_leak", "document_mask", "gives other logits packed than alone"),
    ("attention", "undeclared_matrix", "weight_formats", "'Int8Linear' object has no attribute 'weight'"),
    ("mixer", "state_leak", "document_mask", "a recurrent state or convolution window not restarted"),
    ("norm", "plain_attr", "meta_init", "Tensor on device meta"),
    ("norm", "no_upcast", "precision", "float16: norm(x) with rows of magnitude 0.01, 1, 300"),
    ("norm", "fixed_width", "shape_dtype", "a norm built at dim = 8, 40 raised RuntimeError"),
    ("ffn", "token_mixing", "per_token", "a token's output depends on the other tokens of its sequence"),
    ("router", "detached_router", "aux_loss_grad", "carries no gradient"),
    ("norm", "roleless", "param_roles", "layers.0.attn_norm.weight' [32] of norm/roleless"),
    ("attention", "blind_input", "shape_dtype", "declares d_in, but built with BuildContext.d_in = 64 it raised"),
]

#: failures that follow from the same fault: a token-mixing ffn cannot be decoded token by token either; a decode
#: that differs from the full forward differs over 1,024 single-token steps too
CONSEQUENCES = {"token_mixing": {"kv_cache_decode"}, "drifting": {"long_decode"}, "rope_offset": {"long_decode"}}


@pytest.mark.parametrize("kind,type_,check,fragment", FAULTS, ids=[f"{k}/{t}::{c}" for k, t, c, _ in FAULTS])
def test_fault_is_caught_by_the_right_check(results, kind, type_, check, fragment):
    r = results.one(kind, type_, check)
    assert r.status == "failed", f"{r.id} should fail, got {r.status}: {r.detail}"
    assert r.component == f"{kind}/{type_}" and r.id == f"{kind}/{type_}::{check}"
    assert fragment in r.detail, r.detail


@pytest.mark.parametrize("kind,type_,check,fragment", FAULTS, ids=[f"{k}/{t}" for k, t, _, _ in FAULTS])
def test_fault_fails_nothing_else(results, kind, type_, check, fragment):
    got = results(kind, type_)
    assert list(got) == list(CHECK_NAMES)
    failed = {c for c, r in got.items() if r.status == "failed"}
    if type_ == "widening":
        # its output cannot be added to the residual stream, so every check running a model forward errors too;
        # the checks that need no forward must still pass
        assert check in failed
        assert all(got[c].status == "passed" for c in ("spec_roundtrip", "param_count")), got
        assert "raised RuntimeError" in got["causality"].detail
    else:
        assert failed == {check} | CONSEQUENCES.get(type_, set()), {c: got[c].detail for c in failed}
        assert sum(r.status == "passed" for r in got.values()) >= 4


def _ratio(detail: str) -> float:
    """``max |Δ|`` over the tolerance, read from a failure detail."""
    worst = float(re.search(r"max \|Δ\| = ([0-9.e+-]+)", detail).group(1))
    tol = float(re.search(r"tolerance (?:[0-9.]+ ulps = )?([0-9.e+-]+)", detail).group(1))
    return worst / tol


@pytest.mark.parametrize(
    "kind,type_,check,at_least",
    [
        ("attention", "rope_offset", "kv_cache_decode", 1000),
        ("attention", "late_peek", "causality", 1000),
        ("attention", "train_peek", "causality", 1000),
        ("attention", "drifting", "kv_cache_decode", 1000),
        ("norm", "no_upcast", "precision", 100),
        ("ffn", "token_mixing", "per_token", 1000),
        ("mixer", "state_leak", "document_mask", 1000),
    ],
)
def test_faults_fail_by_orders_of_magnitude(results, kind, type_, check, at_least):
    """A real fault fails by orders of magnitude, not by 7x (the RoPE offset once failed by 6.8e-4 against 1e-4)."""
    assert _ratio(results.one(kind, type_, check).detail) >= at_least


def test_stale_buffer_is_caught_even_when_to_empty_memory_holds_the_right_values(registry, monkeypatch):
    """CI once passed ``stale_table`` because the allocator handed ``to_empty`` the freed memory of a table with the
    right values in it. The check must not depend on what uninitialised memory happens to hold: here every
    ``to_empty`` returns tensors that already hold the direct build's values, and the fault is still caught."""
    real = torch.nn.Module.to_empty

    def lucky_to_empty(self, *, device, recurse=True):
        out = real(self, device=device, recurse=recurse)
        for b in out.buffers():
            if b.dim() == 2 and b.shape[1] % 2 == 0:  # the sinusoidal table: what freed memory might still hold
                pos = torch.arange(b.shape[0], dtype=torch.float32)[:, None]
                inv = 10000.0 ** (-torch.arange(0, b.shape[1], 2, dtype=torch.float32) / b.shape[1])
                b[:, 0::2], b[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
        return out

    monkeypatch.setattr(torch.nn.Module, "to_empty", lucky_to_empty)
    got = {r.check: r for r in check_component("position", "stale_table", registry=registry)}
    assert got["meta_init"].status == "failed", got["meta_init"].detail
    assert "buffer positions.0.pe" in got["meta_init"].detail


def test_fault_details_carry_values(results):
    peek = results.one("attention", "peeking", "causality").detail
    assert peek.startswith("eval: max |Δ| = ") and "at position 0 after changing the tokens from position 1 on" in peek
    late = results.one("attention", "late_peek", "causality").detail
    assert "at position 8 after changing the tokens from position 9 on" in late
    drift = results.one("attention", "drifting", "kv_cache_decode").detail
    assert "first at position 5 (fed as tokens [5, 6) after 5 cached" in drift
    offset = results.one("attention", "rope_offset", "kv_cache_decode").detail
    assert offset.startswith("with position rope: ") and "first at position 5 (fed as tokens [5, 6)" in offset
    nan = results.one("attention", "nan_softmax", "masked_row").detail
    assert "non-finite logits at (batch, position) [(0, 0)" in nan
    plain = results.one("norm", "plain_attr", "meta_init").detail
    assert "layers.0.attn_norm.gain" in plain and "register_buffer" in plain
    stale = results.one("position", "stale_table", "meta_init").detail
    assert "buffer positions.0.pe" in stale and "init_weights" in stale


def test_capabilities_decide_what_runs(results):
    peek = {
        c: results.one("attention", "peeking", c)
        for c in ("kv_cache_decode", "compile", "gqa_equals_mha", "masked_row")
    }
    assert peek["kv_cache_decode"].status == "skipped" and "kv_cache" in peek["kv_cache_decode"].detail
    assert peek["compile"].status == "skipped" and "compile_safe" in peek["compile"].detail
    assert peek["gqa_equals_mha"].status == "skipped"  # its config has no n_kv_heads field
    assert peek["masked_row"].status == "passed"
    assert results.one("norm", "miscounted", "compile").status == "passed"
    assert results.one("ffn", "idle_param", "compile").status == "passed"


def test_modkit_check_reports_failures(registry, capsys):
    parser = argparse.ArgumentParser(prog="modkit")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["check", "--plugin", "faulty-demo", "--kind", "norm", "--type", "leaky_dtype", "--type", "miscounted"]
    )
    out = io.StringIO()
    rc = args.func(args, out=out, registry=registry)
    text = out.getvalue()
    assert rc == 1
    header = text.splitlines()[0].split()
    assert header[0] == "component" and header[1:-1] == list(CHECK_NAMES) and header[-1] == "neighbours"
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[1:3]}
    assert text.splitlines()[1].endswith("attention gqa, ffn geglu, placement pre, position rope")
    assert rows["norm/leaky_dtype"][CHECK_NAMES.index("shape_dtype")] == "FAILED"
    assert rows["norm/miscounted"][CHECK_NAMES.index("param_count")] == "FAILED"
    assert rows["norm/miscounted"][CHECK_NAMES.index("shape_dtype")] == "passed"
    assert "FAILED norm/leaky_dtype::shape_dtype: bfloat16" in text
    assert "FAILED norm/miscounted::param_count: declared 33 parameters" in text
    assert "2 check(s) failed: norm/leaky_dtype::shape_dtype, norm/miscounted::param_count" in capsys.readouterr().err


def test_entry_without_example_is_skipped(registry):
    class NeedsArgs(ComponentConfig):
        type: Literal["needs_args"] = "needs_args"
        width: int = Field(..., description="required, and no example is declared")

    class Plugin:
        @hookimpl
        def register_components(self, register):
            register(
                Component(
                    kind="norm",
                    type="needs_args",
                    config=NeedsArgs,
                    factory=lambda cfg, ctx: PlainRMSNorm(ctx.dim or ctx.d_model),
                    description="x",
                )
            )

    registry.register_plugin(Plugin(), "no-example-demo")
    try:
        res = check_component("norm", "needs_args", registry=registry)
        assert {r.status for r in res} == {"skipped"}
        assert all(r.detail.startswith("no example config") and "width" in r.detail for r in res)
        # an explicit config makes it testable
        res = check_component(
            "norm", "needs_args", {"type": "needs_args", "width": 3}, registry=registry, checks=["shape_dtype"]
        )
        assert [r.status for r in res] == ["passed"]
    finally:
        registry.unregister_plugin("no-example-demo")


# ----------------------------------------------------------------------------------------------- neighbours


def _verdicts(results: list) -> list[tuple[str, str, str, str]]:
    return [(r.id, r.status, r.detail, r.neighbours) for r in results]


@pytest.mark.parametrize("kind,type_", [("attention", "sound"), ("norm", "sound"), ("ffn", "sound")])
def test_a_plugin_gets_the_same_verdict_with_a_faulty_plugin_installed_beside_it(kind, type_):
    """The faulty plugin offers an attention, norms, ffns and a position scheme that the old ranking (another
    plugin's components before the built-ins, then by name) chose as the sound plugin's neighbours."""
    alone = modkit.Registry()
    for p in modkit.get_registry().plugins():
        alone.register_plugin(p.obj, p.name)
    alone.register_plugin(SoundPlugin(), "sound-demo")
    beside = modkit.Registry()
    for p in modkit.get_registry().plugins():
        beside.register_plugin(p.obj, p.name)
    beside.register_plugin(FaultyPlugin(), "faulty-demo")
    beside.register_plugin(SoundPlugin(), "sound-demo")
    a = check_component(kind, type_, registry=alone)
    b = check_component(kind, type_, registry=beside)
    assert _verdicts(a) == _verdicts(b)
    assert not [r.id for r in a if r.failed], [str(r) for r in a if r.failed]
    assert sum(r.status == "passed" for r in a) >= 8
    used = a[0].neighbours
    assert used and all(t not in used for t in ("drifting", "peeking", "leaky_dtype", "widening", "stale_table"))


def test_named_neighbours_replace_the_builtins(registry):
    res = {
        r.check: r
        for r in check_component(
            "norm",
            "rmsnorm",
            registry=registry,
            neighbours={"attention": "drifting"},
            checks=["kv_cache_decode", "masked_row"],
        )
    }
    assert res["kv_cache_decode"].neighbours.startswith("attention drifting (named), ffn ")
    assert res["kv_cache_decode"].status == "failed"  # the named neighbour's fault shows up, as asked
    assert "between cached decode and the full forward" in res["kv_cache_decode"].detail
    with pytest.raises(modkit.RegistryError, match="unknown attention type 'nope'"):
        check_component("norm", "rmsnorm", registry=registry, neighbours={"attention": "nope"})


def test_a_kind_without_a_builtin_must_be_named():
    reg = modkit.Registry()
    reg.register_plugin(SoundPlugin(), "sound-demo")  # no built-ins at all
    res = check_component("norm", "sound", registry=reg)
    assert {r.status for r in res} == {"skipped"}
    assert (
        "no built-in mixer" in res[0].detail and "neighbours={'mixer': TYPE}" in res[0].detail
    )  # the token-mixer slot


class SoundRecurrencePlugin:
    """The recurrent mixer of ``state_leak`` without its fault."""

    @hookimpl
    def register_components(self, register) -> None:
        register(_recurrence("sound_recurrence"))


def test_the_same_recurrence_without_the_fault_keeps_its_documents_apart():
    """``state_leak`` fails ``document_mask`` because of its fault alone: the same code restarting its state passes."""
    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(SoundRecurrencePlugin(), "sound-recurrence-demo")
    (res,) = check_component("mixer", "sound_recurrence", registry=reg, checks=["document_mask"])
    assert res.status == "passed", res.detail
