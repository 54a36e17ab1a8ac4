"""The contract kit's ``shards`` check: a declared ``tp_plan`` must train like the single process under tp = 2.

The slow tests start gloo processes on the CPU. The built-in entries with a non-empty ``tp_plan``, a per-head
QK-norm, the components whose plans are wrong and a geometry the kit must change to shard all run in ONE session
(one process start). Wrong plans: ``ffn/normed_hidden`` shards a hidden width its forward normalises over (same
shapes, wrong values: the detail carries the value), ``attention/o_colwise`` declares its output projection
``colwise`` instead of ``rowwise`` (the shapes no longer meet: the detail carries the error),
``ffn/gated_hidden`` declares ``replicate`` for a scalar weight that multiplies the sharded hidden activation
(the logits are right; each rank gets half of its gradient and the copies drift apart), and
``ffn/gated_undeclared`` does not declare it at all (refused by ``modkit.parallel`` before any process starts).
"""

from __future__ import annotations

import argparse
import io
import re
import warnings
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig, hookimpl
from modkit.testing import CHECK_NAMES, check_component
from modkit.testing.checks import ComponentChecks, run_many
from modkit.testing.cli import add_subcommands
from tests.testing.test_kit_catches_faults import MiniAttention

pytest_plugins = ["pytester"]

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


class OColwiseConfig(ComponentConfig):
    """Config of ``o_colwise``."""

    type: Literal["o_colwise"] = "o_colwise"
    n_heads: int = Field(4, description="number of heads")


class NormedHiddenConfig(ComponentConfig):
    """Config of ``normed_hidden``."""

    type: Literal["normed_hidden"] = "normed_hidden"
    d_ff: int = Field(64, description="hidden width")


class NormedHiddenFFN(nn.Module):
    """``down(normalize(gelu(up(x))))``: the hidden vector is L2-normalised over all its features."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.down(nn.functional.normalize(nn.functional.gelu(self.up(x)), dim=-1))


class GatedConfig(ComponentConfig):
    """Config of ``gated_hidden`` / ``gated_undeclared``."""

    type: Literal["gated_hidden", "gated_undeclared"]
    d_ff: int = Field(64, description="hidden width")


class GatedHiddenFFN(nn.Module):
    """``down(alpha * gelu(up(x)))``: a learned scalar on the hidden vector (which tp shards)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.alpha = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.down(self.alpha * nn.functional.gelu(self.up(x)))

    def init_weights(self, init) -> None:
        init.constant_(self.alpha, 1.5)


class WrongPlans:
    """Two components with a wrong ``tp_plan`` (everything else about them is right)."""

    @hookimpl
    def register_components(self, register) -> None:
        register(
            Component(
                kind="attention",
                type="o_colwise",
                config=OColwiseConfig,
                factory=lambda cfg, ctx: MiniAttention(ctx.d_model, cfg.n_heads),
                description="FAULTY plan: output projection declared colwise instead of rowwise.",
                capabilities={
                    "causal_safe": True,
                    "tp_plan": {"q": "colwise", "k": "colwise", "v": "colwise", "o": "colwise"},
                },
                example={"type": "o_colwise"},
            )
        )
        register(
            Component(
                kind="ffn",
                type="normed_hidden",
                config=NormedHiddenConfig,
                factory=lambda cfg, ctx: NormedHiddenFFN(ctx.d_model, cfg.d_ff),
                description="FAULTY plan: shards the hidden width its forward normalises over (should be {}).",
                capabilities={"tp_plan": {"up": "colwise", "down": "rowwise"}},
                example={"type": "normed_hidden"},
            )
        )
        register(
            Component(
                kind="ffn",
                type="gated_hidden",
                config=GatedConfig,
                factory=lambda cfg, ctx: GatedHiddenFFN(ctx.d_model, cfg.d_ff),
                description="FAULTY plan: declares replicate for alpha, which multiplies the sharded hidden activation.",
                capabilities={"tp_plan": {"up": "colwise", "down": "rowwise", "alpha": "replicate"}},
                example={"type": "gated_hidden"},
            )
        )
        register(
            Component(
                kind="ffn",
                type="gated_undeclared",
                config=GatedConfig,
                factory=lambda cfg, ctx: GatedHiddenFFN(ctx.d_model, cfg.d_ff),
                description="FAULTY plan: shards up/down and says nothing of alpha.",
                capabilities={"tp_plan": {"up": "colwise", "down": "rowwise"}},
                example={"type": "gated_undeclared"},
            )
        )


def _global() -> modkit.Registry:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.get_registry()


def _planned_builtins() -> list[modkit.Component]:
    return [
        c
        for c in _global().components()
        if c.provider is not None and c.provider.distribution == "modkit-lm" and c.capabilities.get("tp_plan")
    ]


@pytest.fixture(scope="module")
def faulty_registry() -> modkit.Registry:
    reg = modkit.Registry()
    for p in _global().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(WrongPlans(), "wrong-plans")
    return reg


@pytest.fixture(scope="module")
def session(faulty_registry):
    """``{label: CheckResult}`` of ``shards`` for every runner below, all in one process session; and its wall time."""
    import time

    reg = _global()
    runners = {
        f"{e.kind}/{e.type}": ComponentChecks(e, reg, None, "cpu", distributed=True) for e in _planned_builtins()
    }
    for t in ("o_colwise", "normed_hidden", "gated_hidden", "gated_undeclared"):
        kind = "attention" if t == "o_colwise" else "ffn"
        runners[t] = ComponentChecks(faulty_registry.get(kind, t), faulty_registry, None, "cpu", distributed=True)
    # a per-head QK-norm: one [head_dim] weight for all heads, each rank holding half of them (per_head style)
    qk = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm"}, "qk_norm_scope": "head"}
    runners["gqa_qk_norm"] = ComponentChecks(reg.get("attention", "gqa"), reg, qk, "cpu", distributed=True)
    # attention sinks: a per-head parameter ('heads') next to the colwise projections of the same module
    sinks = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sinks": True}
    runners["gqa_sinks"] = ComponentChecks(reg.get("attention", "gqa"), reg, sinks, "cpu", distributed=True)
    # one key/value head in a config that allows more: the kit raises it to 2 to shard
    runners["gqa_kv1"] = ComponentChecks(
        reg.get("attention", "gqa"), reg, {"type": "gqa", "n_heads": 4, "n_kv_heads": 1}, "cpu", distributed=True
    )
    t0 = time.perf_counter()
    results = run_many(list(runners.values()), "shards")
    seconds = time.perf_counter() - t0
    print(f"\nshards session: {len(runners)} components in {seconds:.1f} s")
    for r in results:
        print(f"  {r}")
    return dict(zip(runners, results)), seconds


def _value(detail: str) -> float:
    m = re.search(r"max \|Δ\| = ([0-9.e+-]+|inf|nan)", detail)
    assert m, detail
    return float(m.group(1))


def _part(detail: str, what: str) -> float:
    """One measured difference of the detail (``logits``, ``parameter gradients``, ...)."""
    m = re.search(re.escape(what) + r" ([0-9.e+-]+|inf|nan)", detail)
    assert m, (what, detail)
    return float(m.group(1))


@pytest.mark.slow
@needs_gloo
def test_every_builtin_with_a_plan_shards(session):
    results, seconds = session
    builtins = [f"{e.kind}/{e.type}" for e in _planned_builtins()]
    assert {"attention/gqa", "ffn/swiglu"} <= set(builtins)
    for name in builtins:
        r = results[name]
        assert r.check == "shards" and r.component == name
        assert r.status != "failed", r
        if r.status == "skipped":
            # only a geometry the entry's own config forbids changing (mqa: n_kv_heads is 1 by definition)
            assert "does not shard for tp = 2" in r.detail and "config does not accept" in r.detail, r
            continue
        assert _value(r.detail) <= 1e-5 and "tolerance 1e-05" in r.detail and "2 gloo processes" in r.detail
        for what in ("logits", "parameter gradients", "input-embedding gradient", "parameters after one AdamW step"):
            assert _part(r.detail, what) <= 1e-5, (what, r.detail)
        assert "replicated parameters identical on all ranks" in r.detail, r.detail
    passed = [n for n in builtins if results[n].status == "passed"]
    assert len(passed) >= len(builtins) - 1, {n: results[n].detail for n in builtins}


@pytest.mark.slow
@needs_gloo
def test_wrong_plan_fails_with_the_value(session):
    results, _ = session
    r = results["normed_hidden"]
    assert r.status == "failed" and r.id == "ffn/normed_hidden::shards", r
    assert _value(r.detail) > 1e-3 and "tolerance 1e-05" in r.detail, r.detail
    o = results["o_colwise"]
    assert o.status == "failed" and o.id == "attention/o_colwise::shards", o
    assert "raised RuntimeError" in o.detail and "sharded model" in o.detail, o.detail


@pytest.mark.slow
@needs_gloo
def test_replicated_weight_on_a_sharded_activation_fails_on_its_gradient(session):
    """Declared ``replicate``, the hidden-activation scale passes the forward but not the backward; undeclared,
    ``modkit.parallel`` refuses the plan and the check fails with that reason."""
    results, _ = session
    r = results["gated_hidden"]
    assert r.status == "failed" and r.id == "ffn/gated_hidden::shards", r
    assert _part(r.detail, "logits") <= 1e-5, r.detail  # the forward is right
    assert _part(r.detail, "parameter gradients") > 1e-3 and re.search(r"\(layers\.\d\.ffn\.alpha\)", r.detail), (
        r.detail
    )
    assert re.search(
        r"replicated parameter layers\.[01]\.ffn\.alpha differs between the 2 ranks by [0-9.e-]+", r.detail
    ), r.detail
    u = results["gated_undeclared"]
    assert u.status == "failed" and "layers.0.ffn.alpha (shape []) is left whole" in u.detail, u
    assert "Declare 'alpha' in the tp_plan" in u.detail, u.detail


@pytest.mark.slow
@needs_gloo
def test_per_head_qk_norm_trains_like_the_single_process(session):
    r = session[0]["gqa_qk_norm"]
    assert r.status == "passed", r
    assert _value(r.detail) <= 1e-5 and "replicated parameters identical on all ranks" in r.detail, r.detail


@pytest.mark.slow
@needs_gloo
def test_sinks_shard_with_the_query_heads(session):
    r = session[0]["gqa_sinks"]
    assert r.status == "passed", r
    assert _value(r.detail) <= 1e-5 and "replicated parameters identical on all ranks" in r.detail, r.detail


def test_a_module_with_sharded_projections_and_a_per_head_parameter_is_listed_once():
    """Its head counts are divided by tp once (listed twice, 4 heads became 1 on each of 2 ranks)."""
    from modkit.parallel import model_plan

    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "max_seq_len": 16,
        "position": {"type": "rope"},
        "block": {
            "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sinks": True},
            "ffn": {"type": "swiglu", "d_ff": 64},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    plan = model_plan(modkit.build(spec, device="meta"), 2)
    assert sorted(plan.head_modules) == ["layers.0.attention", "layers.1.attention"]
    assert plan.styles["layers.0.attention.sinks"] == "heads"


def test_a_weight_per_head_under_a_per_head_style_is_refused_by_name():
    from modkit.parallel import ParallelError, model_plan

    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 1,
        "max_seq_len": 16,
        "position": {"type": "rope"},
        "block": {
            "attention": {
                "type": "gqa",
                "n_heads": 4,
                "n_kv_heads": 2,
                "qk_norm": {"type": "layernorm"},
                "qk_norm_scope": "each_head",
            },
            "ffn": {"type": "swiglu", "d_ff": 64},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    with pytest.raises(ParallelError, match=r"layers\.0\.attention\.q_norm\.weight \(shape \[4, 8\]\).*each_head"):
        model_plan(modkit.build(spec, device="meta"), 2)


@pytest.mark.slow
@needs_gloo
def test_unshardable_heads_are_raised_when_the_config_allows(session):
    r = session[0]["gqa_kv1"]
    assert r.status == "passed", r
    assert "geometry changed to shard: n_kv_heads 1 -> 2" in r.detail and _value(r.detail) <= 1e-5


def test_shards_is_opt_in_and_decided_by_capability():
    got = {
        r.component: r
        for r in (
            check_component("attention", "gqa", checks=["shards"])[0],
            check_component("norm", "rmsnorm", checks=["shards"], distributed=True)[0],  # tp_plan {}: starts nothing
            check_component("router", "topk", checks=["shards"], distributed=True)[0],
        )
    }
    assert got["attention/gqa"].status == "skipped" and got["attention/gqa"].detail.startswith(
        "pass --distributed to run"
    )
    for name in ("norm/rmsnorm", "router/topk"):
        assert got[name].status == "skipped" and "declares no non-empty tp_plan" in got[name].detail
    assert CHECK_NAMES[-1] == "shards"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="modkit")
    add_subcommands(parser.add_subparsers(dest="command"))
    return parser


def test_modkit_check_help_names_distributed():
    help_text = _parser()._subparsers._group_actions[0].choices["check"].format_help()
    assert "--distributed" in help_text and "shards" in help_text


@pytest.mark.slow
@needs_gloo
def test_modkit_check_distributed_and_pytest_plugin_batch(pytester, monkeypatch):
    from modkit.testing import shards

    for flag, want in (([], "skip"), (["--distributed"], "passed")):
        args = _parser().parse_args(["check", "--kind", "ffn", "--type", "mlp", "--check", "shards", *flag])
        out = io.StringIO()
        assert args.func(args, out=out) == 0
        assert out.getvalue().splitlines()[1].split()[:2] == ["ffn/mlp", want]

    sessions = []
    real = shards.run_session
    monkeypatch.setattr(shards, "run_session", lambda jobs: sessions.append(len(jobs)) or real(jobs))
    result = pytester.runpytest_inprocess(
        "--modkit-contracts",
        "--modkit-distributed",
        "--modkit-check",
        "shards",
        "--modkit-kind",
        "ffn",
        "-v",
        "-p",
        "no:cacheprovider",
    )
    result.stdout.fnmatch_lines(["*ffn/mlp::shards PASSED*", "*ffn/moe::shards PASSED*", "*ffn/swiglu::shards PASSED*"])
    assert result.parseoutcomes().get("failed", 0) == 0
    assert sessions == [len([e for e in _planned_builtins() if e.kind == "ffn"])]  # one session for all of them
