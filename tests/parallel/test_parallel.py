"""modkit.parallel: plans composed from registry data, validation, and proof on CPU with gloo.

The in-process tests need no process group (plans are shape arithmetic on ``meta`` models). The ``slow`` tests
launch ``tests/dist_scripts/*.py`` with ``torchrun --standalone`` (2 and 4 ranks, gloo) or play 8 ranks with the
fake process group, and compare against the single-process model: logits, gradients, one optimiser step,
checkpoints, per-rank parameter bytes. Figures are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Literal

import pytest
import torch
from pydantic import Field
from torch import nn

import modkit
from modkit import Component, ComponentConfig
from modkit.parallel import ParallelError, PlanWarning, model_plan

from tests.conftest import HANG_TIMEOUT, REPO, SPECS, registry_with, tiny_spec

SCRIPTS = Path(__file__).resolve().parents[1] / "dist_scripts"
TOL = 1e-5

needs_gloo = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with gloo is not available",
)


# ---------------------------------------------------------------------------------------------- plans as data


def test_plan_is_composed_from_registry_capabilities():
    model = modkit.build(SPECS / "tiny-llama.json", device="meta")
    plan = model_plan(model, 2)
    reg = modkit.get_registry()
    for i in range(model.spec.n_layers):
        for kind in ("attention", "ffn"):
            module = getattr(model.layers[i], kind)
            declared = reg.get(module.modkit_kind, module.modkit_type).capabilities["tp_plan"]
            for sub, style in declared.items():
                if getattr(module, sub) is None:  # optional submodule absent here (tiny-llama has no QK-norm)
                    assert f"layers.{i}.{kind}.{sub}" not in plan.styles
                    continue
                assert plan.styles[f"layers.{i}.{kind}.{sub}"] == style
                assert plan.sources[f"layers.{i}.{kind}.{sub}"] == f"{kind}/{module.modkit_type}"
    # vocab-parallel embedding and head, norms replicated (not in the plan), local head counts adjusted later
    assert plan.styles["embed"] == "rowwise" and plan.styles["lm_head"] == "colwise_gather"
    assert plan.embeddings == ["embed"]
    assert not any("norm" in p for p in plan.styles)
    assert plan.head_modules == [f"layers.{i}.attention" for i in range(model.spec.n_layers)]
    assert model_plan(model, 1).styles == {}


def test_tp_degree_that_does_not_divide_kv_heads_is_rejected_with_path_and_values():
    model = modkit.build(tiny_spec(), device="meta")  # gqa 4 / 2
    with pytest.raises(ParallelError) as err:
        model_plan(model, 4)
    msg = str(err.value)
    assert "layers.0.attention" in msg and "tp = 4" in msg
    assert "n_heads = 4" in msg and "n_kv_heads = 2" in msg and "does not divide n_kv_heads" in msg
    with pytest.raises(ParallelError, match=r"does not divide n_heads and n_kv_heads \(n_heads = 4, n_kv_heads = 2\)"):
        model_plan(model, 3)


def test_tp_degree_that_does_not_divide_a_sharded_width_is_rejected():
    model = modkit.build(tiny_spec(block__ffn={"type": "swiglu", "d_ff": 66}), device="meta")
    with pytest.raises(ParallelError, match=r"layers\.0\.ffn\.gate: .*tp = 4 does not divide out_features = 66"):
        model_plan(
            modkit.build(
                tiny_spec(block__ffn={"type": "swiglu", "d_ff": 66}, block__attention={"type": "mha", "n_heads": 4}),
                device="meta",
            ),
            4,
        )
    model_plan(model, 2)  # 66 / 2 is fine


def test_full_width_qk_norm_is_rejected_under_tp():
    attn = {"type": "mha", "n_heads": 4, "qk_norm": {"type": "rmsnorm"}, "qk_norm_scope": "full"}
    model = modkit.build(tiny_spec(block__attention=attn), device="meta")
    with pytest.raises(ParallelError, match=r"layers\.0\.attention\.q_norm\.weight .*1/2 shard"):
        model_plan(model, 2)
    per_head = modkit.build(tiny_spec(block__attention={**attn, "qk_norm_scope": "head"}), device="meta")
    assert "layers.0.attention.q_proj" in model_plan(per_head, 2).styles


def test_tied_embeddings_and_odd_vocab_stay_replicated():
    tied = modkit.build(tiny_spec(tie_embeddings=True), device="meta")
    plan = model_plan(tied, 2)
    assert "embed" not in plan.styles and "tied" in plan.replicated["embed"]
    odd = modkit.build(tiny_spec(vocab_size=65), device="meta")
    with pytest.warns(PlanWarning, match=r"vocab_size = 65 is not divisible by tp = 2"):
        plan = model_plan(odd, 2)
    assert "embed" not in plan.styles and "lm_head" not in plan.styles


def test_moe_experts_are_tensor_parallel_and_router_replicated():
    model = modkit.build(SPECS / "tiny-moe.json", device="meta")
    plan = model_plan(model, 2)
    assert plan.styles["layers.1.ffn.experts"] == "grouped" and plan.styles["layers.3.ffn.experts"] == "grouped"
    assert model.layers[1].ffn.experts.tp_shard_dims == {"gate": 2, "up": 2, "down": 1}
    assert not any("router" in p for p in plan.styles)
    odd = modkit.load_spec(SPECS / "tiny-moe.json").model_dump(mode="json")
    odd["block"]["ffn"]["expert"]["d_ff"] = 175
    with pytest.raises(
        ParallelError,
        match=r"layers\.1\.ffn\.experts\.gate: tensor-parallel degree tp = 2 does not divide its dim 2 \(size 175\)",
    ):
        model_plan(modkit.build(odd, device="meta"), 2)


class _PlainMLPConfig(ComponentConfig):
    type: Literal["plainmlp"] = "plainmlp"
    d_ff: int = Field(64, description="hidden width")


class _PlainMLP(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_third_party_component_without_plan_is_replicated_with_a_warning_naming_it():
    reg = registry_with(
        "thirdparty-mlp",
        Component(
            kind="ffn",
            type="plainmlp",
            config=_PlainMLPConfig,
            factory=lambda cfg, ctx: _PlainMLP(ctx.d_model, cfg.d_ff),
            description="a third-party MLP that declares no tp_plan",
        ),
    )
    model = modkit.build(tiny_spec(block__ffn={"type": "plainmlp", "d_ff": 64}), device="meta", registry=reg)
    with pytest.warns(
        PlanWarning, match=r"ffn/plainmlp \(plugin thirdparty-mlp\) declares no tp_plan.*layers\.0\.ffn, layers\.1\.ffn"
    ):
        plan = model_plan(model, 2, registry=reg)
    assert not any(".ffn." in p for p in plan.styles)
    assert "plainmlp declares no tp_plan" in plan.replicated["layers.0.ffn"]
    assert "layers.0.attention.q_proj" in plan.styles


def test_bad_plan_data_is_reported_with_the_entry():
    reg = registry_with(
        "bad-plan",
        Component(
            kind="ffn",
            type="plainmlp",
            config=_PlainMLPConfig,
            factory=lambda cfg, ctx: _PlainMLP(ctx.d_model, cfg.d_ff),
            description="a plan naming a missing submodule and a style that does not exist",
            capabilities={"tp_plan": {"fc1": "colwise", "fc3": "rowwise"}},
        ),
    )
    model = modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=reg)
    with pytest.raises(ParallelError, match=r"ffn/plainmlp .*names 'fc3' but layers\.0\.ffn has no submodule"):
        model_plan(model, 2, registry=reg)


class _GatedHidden(_PlainMLP):
    """``fc2(alpha * relu(fc1(x)))``: a scalar weight on the hidden activation, which tp shards."""

    def __init__(self, d: int, d_ff: int):
        super().__init__(d, d_ff)
        self.alpha = nn.Parameter(torch.ones(()))

    def forward(self, x):
        return self.fc2(self.alpha * torch.relu(self.fc1(x)))

    def init_weights(self, init):
        init.constant_(self.alpha, 1.5)


def _gated_registry(plan: dict) -> modkit.Registry:
    return registry_with(
        "gated-hidden",
        Component(
            kind="ffn",
            type="plainmlp",
            config=_PlainMLPConfig,
            factory=lambda cfg, ctx: _GatedHidden(ctx.d_model, cfg.d_ff),
            description="an MLP with a scalar gate on its hidden activation",
            capabilities={"tp_plan": plan},
        ),
    )


def test_replicated_parameter_of_a_sharding_component_must_be_declared():
    """Left whole on every rank next to a sharded activation, a weight would get a partial gradient: refused,
    naming it, unless the plan says what it reads."""
    plan = {"fc1": "colwise", "fc2": "rowwise"}
    reg = _gated_registry(plan)
    model = modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=reg)
    with pytest.raises(
        ParallelError,
        match=r"layers\.0\.ffn\.alpha \(shape \[\]\) is left whole .*plan of ffn/plainmlp, "
        r"which shards layers\.0\.ffn\.fc1, layers\.0\.ffn\.fc2.*Declare 'alpha' in the tp_plan",
    ):
        model_plan(model, 2, registry=reg)
    # a parameter may be named directly, but only as replicated (a claim the kit's shards check verifies)
    reg = _gated_registry({**plan, "alpha": "replicate"})
    assert set(
        model_plan(
            modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=reg), 2, registry=reg
        ).styles
    ) >= {"layers.0.ffn.fc1"}
    reg = _gated_registry({**plan, "alpha": "per_head"})
    with pytest.raises(
        ParallelError,
        match=r"names 'alpha' but layers\.0\.ffn has no submodule of that name \(a parameter can only be declared replicate\)",
    ):
        model_plan(
            modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=reg), 2, registry=reg
        )
    # per_head in a component that shards nothing: its input holds every head, a summed gradient would be tp times too big
    reg = _gated_registry({"alpha": "replicate", "fc1": "per_head"})
    with pytest.raises(ParallelError, match=r"declares layers\.0\.ffn\.fc1 'per_head' but shards nothing"):
        model_plan(
            modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=reg), 2, registry=reg
        )
    # tp = 1 needs no plan
    assert (
        model_plan(
            modkit.build(tiny_spec(block__ffn={"type": "plainmlp"}), device="meta", registry=_gated_registry(plan)), 1
        ).styles
        == {}
    )


def test_per_head_qk_norm_and_moe_router_are_declared_by_their_components():
    attn = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm"}, "qk_norm_scope": "head"}
    plan = model_plan(modkit.build(tiny_spec(block__attention=attn), device="meta"), 2)
    assert plan.styles["layers.0.attention.q_norm"] == plan.styles["layers.1.attention.k_norm"] == "per_head"
    assert plan.sources["layers.0.attention.q_norm"] == "attention/gqa"
    moe = model_plan(modkit.build(SPECS / "tiny-moe.json", device="meta"), 2)
    assert moe.styles["layers.1.ffn.experts"] == "grouped" and "layers.1.ffn.router" not in moe.styles  # replicate


class _LearnedRotateConfig(ComponentConfig):
    type: Literal["learned_rotate"] = "learned_rotate"


class _LearnedRotate(modkit.PositionScheme):
    """Scales q and k by a learned per-feature factor (a q/k-acting scheme with parameters)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(head_dim))

    def rotate(self, q, k, positions):
        return q * self.scale, k * self.scale

    def init_weights(self, init):
        init.ones_(self.scale)


def test_position_with_parameters_acting_on_local_heads_is_refused():
    reg = registry_with(
        "learned-rotate",
        Component(
            kind="position",
            type="learned_rotate",
            config=_LearnedRotateConfig,
            factory=lambda cfg, ctx: _LearnedRotate(ctx.head_dim),
            description="q/k scaled by learned factors",
            capabilities={"acts_on": "qk", "tp_plan": {}},
        ),
    )
    model = modkit.build(tiny_spec(position={"type": "learned_rotate"}), device="meta", registry=reg)
    with pytest.raises(
        ParallelError,
        match=r"positions\.0 \(position/learned_rotate, .*acts on queries and keys and has parameters \['scale'\].*partial gradient",
    ):
        model_plan(model, 2, registry=reg)


@pytest.mark.parametrize("path", sorted(SPECS.glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_spec_has_a_plan_for_all_its_weights(path):
    """No built-in component with weights lacks a plan: tp = 2 either composes without a PlanWarning about a
    missing plan or fails validation for a stated reason (heads, full-width QK-norm)."""
    model = modkit.build(path, device="meta")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            plan = model_plan(model, 2)
        except ParallelError as exc:
            assert "does not divide" in str(exc) or "as wide as the full output" in str(exc)
            return
    # stated exceptions, not sharded yet: they stay whole on every rank (the same numbers, no memory saved) and the
    # plan says why: grouped experts with an output bias (gpt-oss) and the recurrent mixers (no tp_plan declared)
    unsharded_mixers = (
        "mixer/mamba2 ",
        "mixer/gated_deltanet ",
        "mixer/kimi_delta ",
        "mixer/lightning_attention ",
        "mixer/mamba ",
        "mixer/short_conv ",
        "attention/compressed_attention ",  # DeepSeek-V4's: its single key/value head and compressor stay whole
    )
    if model.spec.stream is not None:  # training refuses tensor parallelism with a stream; its connections stay whole
        unsharded_mixers += ("stream/", "placement/")
    assert not [
        w
        for w in caught
        if "declares no tp_plan" in str(w.message)
        and not str(w.message).startswith(tuple(f"component {m}" for m in unsharded_mixers))
    ]
    kept = {name: why for name, why in plan.replicated.items() if name not in {"embed", "lm_head"}}
    assert all(
        (name.endswith(".ffn.experts") and why.endswith("declares no tp_shard_dims (output bias)"))
        or (why.startswith(tuple(unsharded_mixers)) and "declares no tp_plan" in why)
        for name, why in kept.items()
    ), kept


# ---------------------------------------------------------------------------------------------- distributed


def _torchrun(script: str, nproc: int, out: Path, timeout: int = HANG_TIMEOUT) -> dict[int, dict]:
    env = {**os.environ, "MODKIT_DIST_OUT": str(out), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(SCRIPTS / script),
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-60:])
        pytest.fail(f"{script} on {nproc} ranks failed (rc {proc.returncode}):\n{tail}")
    return {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)}


def _show(title: str, data) -> None:
    print(f"\n== {title}\n{json.dumps(data, indent=1, sort_keys=True)}")


@pytest.mark.slow
@needs_gloo
def test_two_ranks_tp_and_fsdp_match_single_process(tmp_path):
    ranks = _torchrun("two_ranks.py", 2, tmp_path)
    for r, res in ranks.items():
        # tensor parallel: same init, logits, gradients and one AdamW step as the single-process model
        assert res["tp_init_max_abs_diff"] == 0.0
        assert res["tp_local_heads"] == [2, 1]  # gqa 4 / 2 over tp = 2
        for key in ("logits_max_abs_diff", "grad_max_abs_diff", "step_param_max_abs_diff"):
            assert res["tp"][key] < TOL, (r, "tp", key, res["tp"])
            assert res["fsdp"][key] < TOL, (r, "fsdp", key, res["fsdp"])
        assert res["fsdp_init_max_abs_diff"] == 0.0
        assert res["moe_tp"]["logits_max_abs_diff"] < TOL and res["moe_tp"]["aux_abs_diff"] < TOL
        experts_half = 4 * 3 * 128 * 176 // 2  # layer 1's stacked experts, sharded on d_ff over tp = 2
        st = res["moe_tp"]["stats"]
        assert st["sharded_local_params"] >= experts_half and st["local_params"] <= st["global_params"] - experts_half
        assert res["alibi_tp"]["logits_max_abs_diff"] < TOL
        # bf16 compute, fp32 reduce: bf16 logits near the fp32 ones, fp32 sharded gradients
        assert res["mixed"]["logits_dtype"] == "torch.bfloat16" and res["mixed"]["grad_dtype"] == "torch.float32"
        assert res["mixed"]["logits_max_abs_diff"] < 0.1
        # checkpoints: DCP round trip (also FSDP -> TP resharding), consolidated safetensors both ways
        ck = res["ckpt"]
        assert ck["dcp_before_load_diff"] > 0.01
        assert ck["dcp_after_load_diff"] == 0.0 and ck["dcp_fsdp_to_tp_diff"] == 0.0
        assert ck["tp_from_consolidated_diff"] == 0.0
        assert ck["dcp_optimizer_moment_diff"] == 0.0 and ck["dcp_optimizer_param_diff"] == 0.0
        # per-rank bytes: FSDP holds exactly half; TP half plus the replicated norms
        fs, ts = res["fsdp_stats"], res["tp_stats"]
        assert fs["local_params"] * 2 == fs["global_params"] and fs["replicated_params"] == 0
        assert ts["sharded_local_params"] * 2 + ts["replicated_params"] == ts["global_params"]
        assert ts["local_params"] < 0.51 * ts["global_params"]
    assert ranks[0]["ckpt"]["consolidated_vs_sharded_diff"] == 0.0
    assert sum(res["fsdp_stats"]["owned_params"] for res in ranks.values()) == ranks[0]["fsdp_stats"]["global_params"]
    assert sum(res["tp_stats"]["owned_params"] for res in ranks.values()) == ranks[0]["tp_stats"]["global_params"]
    _show("two ranks (rank 0)", ranks[0])


@pytest.mark.slow
@needs_gloo
def test_training_under_tp_gives_single_process_gradients_and_steps(tmp_path):
    """A replicated tensor next to a sharded activation: the input of the stacked MoE experts (its gradient is a
    partial sum on each rank) and a per-head QK-norm weight (each rank sees only its heads). Every gradient, the
    input-embedding gradient and one AdamW step equal the single process's; replicated copies stay identical."""
    ranks = _torchrun("tp_grads.py", 2, tmp_path)
    for r, res in ranks.items():
        for model in ("moe", "qk_norm", "learned_bias"):
            got = res[model]
            for key in (
                "logits_max_abs_diff",
                "grad_max_abs_diff",
                "embed_grad_max_abs_diff",
                "step_param_max_abs_diff",
            ):
                assert got[key] < TOL, (r, model, key, got)
            assert got["replica_spread"] == 0.0, (r, model, got)
            assert got["grad_layout_mismatches"] == [], (r, model, got)  # p.grad has p's layout (no Partial left)
            assert got["grad_norm"] > 0.5 and got["grad_norm_abs_diff"] < TOL * got["grad_norm"], (r, model, got)
            assert got["clipped_grad_max_abs_diff"] < TOL, (r, model, got)
            assert got["mean_loss_across_ranks"] == 0.5
    _show("training under tp = 2 (rank 0)", ranks[0])


@pytest.mark.slow
@needs_gloo
def test_four_ranks_2d_mesh_fsdp_by_tp(tmp_path):
    ranks = _torchrun("mesh_2d.py", 4, tmp_path)
    for r, res in ranks.items():
        assert res["init_max_abs_diff"] == 0.0
        for key in ("logits_max_abs_diff", "grad_max_abs_diff", "step_param_max_abs_diff"):
            assert res[key] < TOL, (r, key, res)
        st = res["stats"]
        assert st["local_params"] < 0.26 * st["global_params"]  # about 1/4 each
        assert "StridedShard" in res["placements"]["layers.0.attention.q_proj.weight"]
        for model in ("moe", "qk_norm", "learned_bias"):  # the fixes compose with FSDP2
            for key in ("logits_max_abs_diff", "grad_max_abs_diff", "step_param_max_abs_diff", "grad_norm_rel_diff"):
                assert res[model][key] < TOL, (r, model, key, res[model])
    assert sum(res["stats"]["owned_params"] for res in ranks.values()) == ranks[0]["stats"]["global_params"]
    assert ranks[0]["consolidated_vs_reference_diff"] < TOL  # after one identical AdamW step
    _show("2-D mesh dp 2 x tp 2 (rank 0)", ranks[0])


@pytest.mark.slow
@needs_gloo
def test_llama_3_1_8b_shards_on_meta_across_8_fake_ranks(tmp_path):
    out = tmp_path / "fake8.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "fake_8b.py"), str(out)],
        cwd=REPO,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=HANG_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(proc.stdout)
    data = json.loads(out.read_text())
    total = data["total_params"]
    assert total == 8_030_261_248
    for name, lay in data["layouts"].items():
        assert lay["sum_owned_params"] == total, (name, lay["sum_owned_params"])
        for st in lay["ranks"]:
            assert st["global_params"] == total
            assert st["local_params"] < 0.126 * total, (name, st)  # about 1/8 each
    assert data["layouts"]["fsdp8"]["sum_local_params"] == total


@pytest.mark.slow
@needs_gloo
def test_moe_loads_are_all_reduced_and_shared_experts_shard(tmp_path):
    """FSDP2 over 2 ranks, each on half the batch: the loads summed over the data-parallel group equal the single
    process's on the whole batch, and so does the bias after the update; under TP the shared expert is sharded
    (colwise / rowwise), its gate and the router replicated, and the logits match."""
    ranks = _torchrun("moe_balance.py", 2, tmp_path)
    for r, res in ranks.items():
        fs, tp = res["fsdp"], res["tp"]
        assert fs["global_loads_equal_reference"] and fs["bias_equal_reference"], (r, fs)
        assert all(v == 2 * 32 * 2 for v in fs["local_load_total"].values())  # this rank's 2 x 32 tokens, top-2
        assert fs["bias_nonzero"] > 0 and fs["imbalance"] == pytest.approx(fs["reference_imbalance"])
        assert tp["logits_max_abs_diff"] < TOL and tp["aux_abs_diff"] < TOL, (r, tp)
        assert tp["loads_equal_reference"] and tp["bias_equal_reference"], (r, tp)
        assert tp["shared_styles"] == ["colwise", "colwise", "rowwise"]
        assert tp["shared_gate_local_numel"] == 128 and tp["shared_up_local_rows"] == 64 // 2
    _show("moe balance (rank 0)", ranks[0])
