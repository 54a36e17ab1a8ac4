"""``modkit cost`` decides where a token mixer overtakes the FFN by what the mixer declares, never by its kind.

A retention written in its parallel form (a ``mixer`` whose declared FLOPs per token grow with the context, as a
plugin author's RetNet did) must get its ``*`` and its crossover context, computed here by hand from the declaration;
a recurrent mixer (constant FLOPs per decoded token) never overtakes; a block without an FFN has nothing to compare.
"""

from __future__ import annotations

import json
from typing import Literal

import pytest
from pydantic import Field
from torch import nn

import modkit
from modkit.analysis.cost import CostModel, Workload
from modkit.analysis.workload import declared_growth
from tests.conftest import SPECS, registry_with

D, HEADS, HEAD_DIM, D_FF = 64, 4, 16, 128


class ParallelRetentionConfig(modkit.ComponentConfig):
    """A retention computed in its parallel form over the whole context (keys and values cached per token)."""

    type: Literal["retention-parallel"] = "retention-parallel"
    n_heads: int = Field(HEADS, description="heads")
    head_dim: int = Field(HEAD_DIM, description="query/key/value width per head")

    def position_geometry(self, ctx):
        """No rotated queries and keys."""
        return None


class ParallelRetention(nn.Module):
    """Projections only (``cost`` builds and runs it on ``meta``; only its declaration is under test)."""

    def __init__(self, cfg: ParallelRetentionConfig, d_model: int):
        super().__init__()
        self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model, bias=False) for _ in range(4))

    def cache_spec(self):
        """Keys and values per token, as the parallel form over the context needs."""
        return modkit.CacheSpec.kv(self.n_kv_heads, self.head_dim)

    def forward(self, x, inputs):
        """``o(q(x) + k(x) + v(x))``: shapes only."""
        return self.o(self.q(x) + self.k(x) + self.v(x))


def _parallel_flops(cfg, ctx, work: Workload) -> dict[str, int]:
    """Four ``d x d`` projections per token; ``q·kᵀ`` and the decayed weighted sum over every causal pair, as a
    retention in its parallel form computes them (RetNet, arXiv:2307.08621 §2.1): grows with the context."""
    inner = cfg.n_heads * cfg.head_dim
    pairs = work.pairs(causal=True)
    proj = {p: 2 * work.tokens * ctx.d_model * inner for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
    return {**proj, "retention": 2 * 2 * cfg.n_heads * cfg.head_dim * pairs}


RETENTION = modkit.Component(
    kind="mixer",
    type="retention-parallel",
    config=ParallelRetentionConfig,
    factory=lambda cfg, ctx: ParallelRetention(cfg, ctx.d_model),
    description="Test mixer: retention in its parallel form, FLOPs growing with the context.",
    reference="Sun et al. 2023, arXiv:2307.08621",
    capabilities={"causal_safe": True},
    flops=_parallel_flops,
    example={"type": "retention-parallel"},
)


def _spec(mixer: dict, overrides=(), ffn=True) -> dict:
    return {
        "schema_version": 1,
        "name": "retention-probe",
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 2,
        "max_seq_len": 512,
        "position": {"type": "none"},
        "block": {
            "mixer": mixer,
            "ffn": {"type": "swiglu", "d_ff": D_FF} if ffn else None,
            "norm": {"type": "rmsnorm", "eps": 1e-5},
            "placement": {"type": "pre"},
        },
        "overrides": list(overrides),
        "final_norm": {"type": "rmsnorm", "eps": 1e-5},
    }


@pytest.fixture(scope="module")
def registry():
    return registry_with("retention-probe", RETENTION)


# per layer and token: FFN 3 matrices of d x d_ff; the retention's growing part 4·H·hd per key (256 per key)
FFN = 3 * 2 * D * D_FF  # 49,152
PER_KEY = 2 * 2 * HEADS * HEAD_DIM  # 256
PROJ = 4 * 2 * D * D  # 32,768


def test_a_mixer_whose_declared_flops_grow_gets_its_crossover(registry):
    """decode: 256·N >= 49,152 -> N = 192; prefill (keys (N + 1) / 2 on average): 128·(N + 1) >= 49,152 -> 383;
    with the projections, 32,768 + 256·N -> 64 and 32,768 + 128·(N + 1) -> 127."""
    costs = CostModel(_spec({"type": "retention-parallel"}), registry=registry)
    entry = registry.get("mixer", "retention-parallel")
    assert declared_growth(entry, costs.spec.block.attention, costs._uses[0].ctx) == {"retention"}
    (group,) = costs.mixers()
    assert (group.type, group.layers, group.growing, group.has_ffn) == (
        "retention-parallel",
        (0, 1),
        frozenset({"mixer.retention"}),
        True,
    )
    assert costs.crossover("decode") == FFN // PER_KEY == 192
    assert costs.crossover("prefill") == 2 * FFN // PER_KEY - 1 == 383
    assert costs.crossover("decode", projections=True) == (FFN - PROJ) // PER_KEY == 64
    assert costs.crossover("prefill", projections=True) == 2 * (FFN - PROJ) // PER_KEY - 1 == 127
    data = costs.report(context=64)
    assert data["attention_overtakes_ffn"]["decode"] == {"scores": 192, "with_projections": 64}  # the old key
    (row,) = data["mixer_overtakes_ffn"]
    assert row == {
        "mixer": "retention-parallel",
        "layers": [0, 1],
        "grows": True,
        "growing_parts": ["mixer.retention"],
        "has_ffn": True,
        "decode": {"growing_parts": 192, "whole_mixer": 64},
        "prefill": {"growing_parts": 383, "whole_mixer": 127},
    }


def test_cost_prints_the_mixer_its_star_and_its_crossover(registry, tmp_path, capsys, monkeypatch):
    """The table names the mixer with a ``*`` and its four contexts; nothing says 'no attention layer'."""
    from modkit.cli import main

    monkeypatch.setattr("modkit.cli._registry", lambda: registry)
    path = tmp_path / "retention.json"
    path.write_text(json.dumps(_spec({"type": "retention-parallel"})))
    assert main(["cost", str(path), "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "mixer.retention *" in out  # the FLOPs table marks the part that grows
    section = out[out.index("a mixer overtakes the FFN") :].split("\n\n")[0].splitlines()
    row = next(line for line in section if line.lstrip().startswith("retention-parallel"))
    assert row.split() == ["retention-parallel", "*", "0-1", "192", "383", "64", "127"]
    assert "no attention layer" not in out and "\u2020" not in out


def test_a_hybrid_gives_each_mixer_its_own_row(registry):
    """Layer 0 Mamba-2 (a recurrent scan: constant FLOPs per decoded token, never), layer 1 the retention: its
    crossover against its own layer's FFN is the same as above; over both layers twice as late (two FFNs)."""
    mamba = {"type": "mamba2", "d_state": 16, "head_dim": 16, "expand": 2, "chunk_size": 8}
    spec = _spec(mamba, overrides=[{"layers": [1], "mixer": {"type": "retention-parallel"}}])
    costs = CostModel(spec, registry=registry)
    rows = {r["mixer"]: r for r in costs.mixer_crossovers()}
    assert list(rows) == ["mamba2", "retention-parallel", "all"]
    assert rows["mamba2"]["grows"] is False and rows["mamba2"]["decode"] == {"growing_parts": None, "whole_mixer": None}
    assert rows["retention-parallel"]["layers"] == [1]
    assert rows["retention-parallel"]["decode"]["growing_parts"] == 192
    assert rows["all"]["decode"]["growing_parts"] == costs.crossover("decode") == 2 * FFN // PER_KEY == 384


def test_shipped_recurrent_specs_never_overtake_and_attention_still_does(capsys):
    """tiny-mamba2 has no FFN; in tiny-hybrid only the gqa layer grows (``*``), Gated DeltaNet never does."""
    from modkit.cli import main

    mamba = CostModel(SPECS / "tiny-mamba2.json")
    (group,) = mamba.mixers()
    assert (group.type, group.growing, group.has_ffn) == ("mamba2", frozenset(), False)
    assert mamba.crossover("decode") is None
    hybrid = CostModel(SPECS / "tiny-hybrid.json")
    groups = {g.type: g for g in hybrid.mixers()}
    assert groups["gated_deltanet"].growing == frozenset() and groups["gated_deltanet"].layers == (0, 1, 2)
    assert groups["gqa"].growing == {"attention.scores", "attention.weighted_sum"} and groups["gqa"].layers == (3,)
    # one gqa layer (4 heads of 32) against its own SwiGLU (d_ff 352): 4·4·32·N >= 6·128·352
    assert hybrid.crossover("decode", layers=[3]) == -(-6 * 128 * 352 // (4 * 4 * 32)) == 528
    assert main(["cost", str(SPECS / "tiny-hybrid.json")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert next(x for x in lines if x.lstrip().startswith("gated_deltanet")).split()[2:] == ["never"] * 4
    assert next(x for x in lines if x.lstrip().startswith("gqa")).split()[:4] == ["gqa", "*", "3", "528\u2020"]


def test_a_recurrent_mixer_s_flops_do_not_grow():
    """The built-in recurrent mixers declare a constant scan per decoded token: no part grows."""
    for name in ("tiny-mamba2", "tiny-hybrid"):
        costs = CostModel(SPECS / f"{name}.json")
        recurrent = [g for g in costs.mixers() if g.type in ("mamba2", "gated_deltanet")]
        assert recurrent and all(not g.growing for g in recurrent)
