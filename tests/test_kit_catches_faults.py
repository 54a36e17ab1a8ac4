"""The contract kit catches deliberately faulty components, each by the right check.

A fresh :class:`modkit.Registry` holds copies of the built-in plugins (the known-good neighbours the kit fills
the tiny models with) plus one test plugin registering seven broken components. Each must FAIL exactly the
check that guards its fault, and pass the unrelated ones (the too-wide FFN cannot take part in any forward of a
model, so only the checks that need no forward are required to pass for it).
"""

from __future__ import annotations

import argparse
import io
import math
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig, Init, PositionScheme, hookimpl
from modkit.testing import CHECK_NAMES, check_component
from modkit.testing.cli import add_subcommands

D_FF = 48


# ----------------------------------------------------------------------------------------------- faulty modules


class MiniAttentionConfig(ComponentConfig):
    """Config of the test attentions (``peeking``, ``drifting``)."""

    type: Literal["peeking", "drifting"]
    n_heads: int = Field(4, description="number of heads")


class MiniAttention(nn.Module):
    """Plain causal multi-head attention with the KV-cache protocol; ``peek`` / ``drift`` inject the faults."""

    def __init__(self, d_model: int, n_heads: int, *, peek: bool = False, drift: bool = False):
        super().__init__()
        self.n_heads = self.n_kv_heads = n_heads
        self.head_dim = d_model // n_heads
        self.sliding_window = None
        self.peek, self.drift = peek, drift
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def forward(self, x, inputs):
        b, s, _ = x.shape

        def heads(t):
            return t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if inputs.position is not None:
            q, k = inputs.position.rotate(q, k, inputs.positions)
        q_pos = k_pos = inputs.positions
        valid = inputs.token_mask
        if inputs.cache is not None:
            k, v, k_pos, valid = inputs.cache.update(k, v, q_pos, valid)
        reach = 1 if self.peek else 0  # FAULT (peeking): a query also sees the next token
        allowed = q_pos[:, :, None] + reach >= k_pos[:, None, :]
        if valid is not None:
            allowed = allowed & valid[:, None, :]
        allowed = allowed[:, None]
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(self.head_dim)
        if inputs.position is not None:
            bias = inputs.position.attention_bias(q_pos, k_pos, self.n_heads)
            if bias is not None:
                scores = scores + bias
        live = allowed.any(-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")).masked_fill(~live, 0.0), -1)
        out = weights.masked_fill(~live, 0.0).to(v.dtype) @ v
        if self.drift and inputs.cache is not None and k.shape[2] > s:
            out = out * 1.1  # FAULT (drifting): decoding against cached keys is scaled differently
        return self.o(out.transpose(1, 2).reshape(b, s, -1))


class PlainNormConfig(ComponentConfig):
    """Config of the test norms (``leaky_dtype``, ``miscounted``)."""

    type: Literal["leaky_dtype", "miscounted"]


class PlainRMSNorm(nn.Module):
    """RMSNorm; with ``leak`` it forgets to cast back to the input dtype."""

    def __init__(self, dim: int, leak: bool):
        super().__init__()
        self.leak = leak
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.float()
        return y if self.leak else y.to(x.dtype)  # FAULT (leaky_dtype): float32 out for bfloat16 in

    def init_weights(self, init: Init) -> None:
        init.ones_(self.weight)


class PlainFFNConfig(ComponentConfig):
    """Config of the test FFNs (``widening``, ``idle_param``, ``mixing_groups``)."""

    type: Literal["widening", "idle_param", "mixing_groups"]


class TestFFN(nn.Module):
    """``down(gelu(up(x)))``; ``widen`` makes the output one feature too wide, ``idle`` adds a dead parameter."""

    __test__ = False  # not a pytest test class

    def __init__(self, d_model: int, *, widen: bool = False, idle: bool = False):
        super().__init__()
        self.up = nn.Linear(d_model, D_FF)
        self.down = nn.Linear(D_FF, d_model + (1 if widen else 0))  # FAULT (widening): last dim d_model + 1
        self.unused = nn.Parameter(torch.empty(d_model)) if idle else None  # FAULT (idle_param): never used

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))

    def init_weights(self, init: Init) -> None:
        if self.unused is not None:
            init.zeros_(self.unused)


class MixingGroups(nn.Module):
    """Grouped form of ``mixing_groups``: ``n`` stacked ``down(gelu(up(x)))`` copies, but every row goes through
    copy 0 whatever ``offs`` says (the routing to experts is lost)."""

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


class FaultyPlugin:
    """Registers one broken component per fault the kit must catch."""

    @hookimpl
    def register_components(self, register) -> None:
        attn_count = lambda cfg, ctx: 4 * ctx.d_model * ctx.d_model  # noqa: E731
        register(Component(
            kind="attention", type="peeking", config=MiniAttentionConfig,
            factory=lambda cfg, ctx: MiniAttention(ctx.d_model, cfg.n_heads, peek=True),
            description="FAULTY: attends to the next token too.",
            capabilities={"causal_safe": True}, param_count=attn_count, example={"type": "peeking"},
        ))
        register(Component(
            kind="attention", type="drifting", config=MiniAttentionConfig,
            factory=lambda cfg, ctx: MiniAttention(ctx.d_model, cfg.n_heads, drift=True),
            description="FAULTY: cached decode is scaled by 1.1.",
            capabilities={"causal_safe": True, "kv_cache": True}, param_count=attn_count, example={"type": "drifting"},
        ))
        register(Component(
            kind="norm", type="leaky_dtype", config=PlainNormConfig,
            factory=lambda cfg, ctx: PlainRMSNorm(ctx.dim or ctx.d_model, leak=True),
            description="FAULTY: returns float32 whatever the input dtype.",
            capabilities={}, param_count=lambda cfg, ctx: ctx.dim or ctx.d_model,
        ))
        register(Component(
            kind="norm", type="miscounted", config=PlainNormConfig,
            factory=lambda cfg, ctx: PlainRMSNorm(ctx.dim or ctx.d_model, leak=False),
            description="FAULTY: declares one parameter more than it has.",
            capabilities={"compile_safe": True}, param_count=lambda cfg, ctx: (ctx.dim or ctx.d_model) + 1,
        ))
        register(Component(
            kind="ffn", type="widening", config=PlainFFNConfig,
            factory=lambda cfg, ctx: TestFFN(ctx.d_model, widen=True),
            description="FAULTY: output is d_model + 1 wide.", param_count=_ffn_count,
        ))
        register(Component(
            kind="ffn", type="idle_param", config=PlainFFNConfig,
            factory=lambda cfg, ctx: TestFFN(ctx.d_model, idle=True),
            description="FAULTY: holds a parameter the forward never uses.",
            capabilities={"compile_safe": True}, param_count=_ffn_count,
        ))
        register(Component(
            kind="ffn", type="mixing_groups", config=PlainFFNConfig,
            factory=lambda cfg, ctx: TestFFN(ctx.d_model),
            grouped_factory=lambda cfg, ctx, n: MixingGroups(n, ctx.d_model),
            description="FAULTY: its grouped form sends every row through copy 0.",
            capabilities={"compile_safe": True}, param_count=lambda cfg, ctx: 2 * ctx.d_model * D_FF + D_FF + ctx.d_model,
        ))
        register(Component(
            kind="position", type="stale_table", config=StaleTableConfig,
            factory=lambda cfg, ctx: StaleTable(ctx.max_seq_len, ctx.d_model),
            description="FAULTY: position table computed only in __init__.",
            capabilities={"acts_on": "embedding"}, param_count=lambda cfg, ctx: 0,
        ))


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
def results(registry):
    """``{(kind, type): {check: CheckResult}}``, computed once per component."""
    cache: dict = {}

    def get(kind: str, type_: str) -> dict:
        if (kind, type_) not in cache:
            cache[(kind, type_)] = {r.check: r for r in check_component(kind, type_, registry=registry)}
        return cache[(kind, type_)]

    return get


#: (kind, type, the check that must fail, a fragment its detail must contain)
FAULTS = [
    ("attention", "peeking", "causality", "after changing token"),
    ("norm", "leaky_dtype", "shape_dtype", "dtype torch.float32, expected torch.bfloat16"),
    ("ffn", "widening", "shape_dtype", "shape (2, 5, 33), expected (2, 5, 32)"),
    ("ffn", "idle_param", "gradients", "unused: no gradient"),
    ("attention", "drifting", "kv_cache_decode", "between cached decode and the full forward"),
    ("position", "stale_table", "meta_init", "pe"),
    ("norm", "miscounted", "param_count", "declared 33 parameters, the module holds 32"),
    ("ffn", "mixing_groups", "grouped_form", "copy 0 and copy 2 give identical outputs"),
]


@pytest.mark.parametrize("kind,type_,check,fragment", FAULTS, ids=[f"{k}/{t}::{c}" for k, t, c, _ in FAULTS])
def test_fault_is_caught_by_the_right_check(results, kind, type_, check, fragment):
    got = results(kind, type_)
    assert list(got) == list(CHECK_NAMES)
    r = got[check]
    assert r.status == "failed", f"{r.id} should fail, got {r.status}: {r.detail}"
    assert r.component == f"{kind}/{type_}" and r.id == f"{kind}/{type_}::{check}"
    assert fragment in r.detail, r.detail


@pytest.mark.parametrize("kind,type_,check,fragment", FAULTS, ids=[f"{k}/{t}" for k, t, _, _ in FAULTS])
def test_fault_fails_nothing_else(results, kind, type_, check, fragment):
    got = results(kind, type_)
    failed = {c for c, r in got.items() if r.status == "failed"}
    if type_ == "widening":
        # its output cannot be added to the residual stream, so every check running a model forward errors too;
        # the checks that need no forward must still pass
        assert check in failed
        assert all(got[c].status == "passed" for c in ("spec_roundtrip", "meta_init", "param_count")), got
        assert "raised RuntimeError" in got["causality"].detail
    else:
        assert failed == {check}, {c: got[c].detail for c in failed}
        assert sum(r.status == "passed" for r in got.values()) >= 4


def test_fault_details_carry_values(results):
    peek = results("attention", "peeking")["causality"].detail
    assert peek.startswith("max |Δ| = ") and "at position 0 after changing token 1" in peek
    drift = results("attention", "drifting")["kv_cache_decode"].detail
    assert "at position 3 (fed as tokens [3, 4) after 3 cached" in drift
    stale = results("position", "stale_table")["meta_init"].detail
    assert "buffer positions.0.pe" in stale and "init_weights" in stale


def test_capabilities_decide_what_runs(results):
    peek = results("attention", "peeking")
    assert peek["kv_cache_decode"].status == "skipped" and "kv_cache" in peek["kv_cache_decode"].detail
    assert peek["compile"].status == "skipped" and "compile_safe" in peek["compile"].detail
    assert peek["gqa_equals_mha"].status == "skipped"  # its config has no n_kv_heads field
    assert peek["masked_row"].status == "passed"
    assert results("norm", "miscounted")["compile"].status == "passed"
    assert results("ffn", "idle_param")["compile"].status == "passed"


def test_modkit_check_reports_failures(registry, capsys):
    parser = argparse.ArgumentParser(prog="modkit")
    add_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["check", "--plugin", "faulty-demo", "--kind", "norm"])
    out = io.StringIO()
    rc = args.func(args, out=out, registry=registry)
    text = out.getvalue()
    assert rc == 1
    header = text.splitlines()[0].split()
    assert header[0] == "component" and header[1:] == list(CHECK_NAMES)
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[1:3]}
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
            register(Component(kind="norm", type="needs_args", config=NeedsArgs,
                               factory=lambda cfg, ctx: PlainRMSNorm(ctx.d_model, leak=False), description="x"))

    registry.register_plugin(Plugin(), "no-example-demo")
    try:
        res = check_component("norm", "needs_args", registry=registry)
        assert {r.status for r in res} == {"skipped"}
        assert all(r.detail.startswith("no example config") and "width" in r.detail for r in res)
        # an explicit config makes it testable
        res = check_component("norm", "needs_args", {"type": "needs_args", "width": 3}, registry=registry, checks=["shape_dtype"])
        assert [r.status for r in res] == ["passed"]
    finally:
        registry.unregister_plugin("no-example-demo")
