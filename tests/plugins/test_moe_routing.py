"""Routers as registered components and what the rest of modkit does with them (cases by hand, exact values).

``topk`` (softmax) and ``sigmoid_topk``: selection-only correction bias, group-limited selection, routed scaling,
renormalisation; the loads a router reports (:mod:`modkit.nn.balance`) and the bias update that reads them; shared
experts, input-side weighting and the sequence-wise balance loss of ``moe``; compile, the contract kit, parameter and
FLOPs declarations, TP plans, ``modkit trace`` and ``modkit cost`` on the new parts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit.nn import balance
from modkit.spec import load_component
from modkit.testing import check_component

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK = ROOT / "specs" / "tiny-deepseek-moe.json"


def ctx(d_model: int = 4, **extra) -> BuildContext:
    return BuildContext(d_model, 1, 32, 64, modkit.get_registry(), extra=dict(extra))


def router(cfg: dict, n: int = 4, k: int = 2, d: int = 4) -> torch.nn.Module:
    """A router of ``n`` experts with an identity projection (``d == n``): its logits are its input."""
    r = ctx(d, n_experts=n, top_k=k).build(load_component("router", cfg))
    with torch.no_grad():
        r.proj.weight.copy_(torch.eye(n, d))
    return r


def moe(cfg: dict, d: int = 16, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    m = ctx(d).build(load_component("ffn", cfg))
    with torch.no_grad():
        m.router.proj.weight.normal_(0.0, 1.0)
    return m


# ------------------------------------------------------------------------------------------------ routers


def test_sigmoid_router_by_hand():
    r = router({"type": "sigmoid_topk", "renormalize": False})
    w, idx, logits = r(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))
    assert idx.tolist() == [[0, 1]]
    torch.testing.assert_close(w, torch.sigmoid(torch.tensor([[2.0, 1.0]])), atol=1e-7, rtol=0)  # 0.880797, 0.731059
    r = router({"type": "sigmoid_topk", "renormalize": True, "routed_scaling_factor": 2.5})
    w, _, _ = r(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))
    s = torch.sigmoid(torch.tensor([2.0, 1.0]))
    torch.testing.assert_close(w[0], 2.5 * s / s.sum(), atol=1e-6, rtol=0)  # [1.366089, 1.133911]


def test_softmax_router_equals_gpt_oss_softmax_over_the_top_logits():
    r = router({"type": "topk", "renormalize": True, "routed_scaling_factor": 1.0})
    x = torch.tensor([[0.3, -1.2, 2.2, 0.9], [1.0, 1.5, -0.5, 0.0]])
    w, idx, _ = r(x)
    top, want_idx = torch.topk(x, 2, dim=-1)
    assert idx.tolist() == want_idx.tolist()
    torch.testing.assert_close(w, torch.softmax(top, dim=-1), atol=1e-7, rtol=0)


def test_correction_bias_changes_the_choice_not_the_weights():
    r = router({"type": "sigmoid_topk", "renormalize": False, "correction_bias": True})
    with torch.no_grad():
        r.correction_bias.copy_(torch.tensor([0.0, 0.0, 0.5, 0.0]))
    w, idx, _ = r(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))
    # biased scores: sigmoid + b = 0.881, 0.731, 1.0, 0.269 -> experts 2 and 0; weights are the unbiased scores
    assert sorted(idx[0].tolist()) == [0, 2]
    by_expert = dict(zip(idx[0].tolist(), w[0].tolist()))
    assert by_expert[2] == pytest.approx(0.5, abs=1e-7) and by_expert[0] == pytest.approx(0.880797, abs=1e-6)


@pytest.mark.parametrize("group_score, want", [("top2_sum", [2, 3]), ("max", [0, 1])])
def test_group_limited_selection_by_hand(group_score, want):
    """Groups {0, 1} and {2, 3}; one group allowed. Scores 0.9, 0.1 | 0.8, 0.7: by top-2 sum group 1 wins (1.5 >
    1.0), by max group 0 (0.9 > 0.8); the plain top-2 would be experts 0 and 2, across both groups."""
    r = router(
        {"type": "sigmoid_topk", "renormalize": False, "n_group": 2, "topk_group": 1, "group_score": group_score}
    )
    logit = lambda p: torch.log(torch.tensor(p) / (1 - torch.tensor(p)))  # noqa: E731
    x = torch.stack([logit(0.9), logit(0.1), logit(0.8), logit(0.7)])[None]
    w, idx, _ = r(x)
    assert sorted(idx[0].tolist()) == want
    plain = router({"type": "sigmoid_topk", "renormalize": False})
    assert sorted(plain(x)[1][0].tolist()) == [0, 2]


def test_router_config_errors_name_the_field_and_the_fix():
    spec = json.loads(DEEPSEEK.read_text())
    cases = [
        ({"n_group": 4, "topk_group": None}, "n_group is set but topk_group is not"),
        ({"n_group": 2, "topk_group": 3}, "topk_group = 3 exceeds n_group = 2"),
        ({"n_group": 3, "topk_group": 1}, "n_group = 3 does not divide n_experts = 8"),
        ({"n_group": 8, "topk_group": 2}, "group_score 'top2_sum' needs 2 or more experts per group"),
        ({"n_group": 4, "topk_group": 1, "group_score": "max"}, "top_k = 2 exceeds the 2 experts"),
        ({"routed_scaling_factor": 0}, "routed_scaling_factor"),
        ({"bias_update_speed": -0.1}, "bias_update_speed"),
    ]
    for change, needle in cases:
        d = json.loads(json.dumps(spec))
        d["block"]["ffn"]["router"].update(change)
        d["block"]["ffn"]["router"] = {k: v for k, v in d["block"]["ffn"]["router"].items() if v is not None}
        if needle.startswith("top_k = 2"):
            d["block"]["ffn"]["top_k"] = 3
            needle = "top_k = 3 exceeds the 2 experts of topk_group = 1 groups of 2"
        with pytest.raises(modkit.SpecError) as err:
            modkit.load_spec(d)
        assert "block.ffn" in str(err.value) and needle in str(err.value), (change, str(err.value))


def test_moe_config_errors():
    spec = json.loads(DEEPSEEK.read_text())
    d = json.loads(json.dumps(spec))
    d["block"]["ffn"]["shared"] = None
    d["block"]["ffn"]["shared_gate"] = True
    with pytest.raises(modkit.SpecError, match="shared_gate = true gates a shared expert, but shared is null"):
        modkit.load_spec(d)
    d = json.loads(json.dumps(spec))
    d["block"]["ffn"]["shared"] = json.loads(json.dumps(spec["block"]["ffn"]))
    with pytest.raises(modkit.SpecError, match="shared is itself an 'moe'"):
        modkit.load_spec(d)
    d = json.loads(json.dumps(spec))
    d["block"]["ffn"]["weight_on"] = "middle"
    with pytest.raises(modkit.SpecError, match="block.ffn.weight_on"):
        modkit.load_spec(d)


# ------------------------------------------------------------------------------------------------ loads


def test_loads_count_real_tokens_accumulate_and_reset():
    r = router({"type": "topk", "renormalize": True})
    x = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 1.0], [5.0, 0.0, 0.0, 4.0]])
    r(x, token_mask=torch.tensor([True, True, False]))  # token 2 is padding
    assert r.expert_load.tolist() == [1, 1, 1, 1] and r.expert_load.dtype == torch.int64
    r(x)  # experts {0, 1}, {2, 3}, {0, 3}
    assert r.expert_load.tolist() == [3, 2, 2, 3]
    model = torch.nn.ModuleDict({"a": r})
    assert list(balance.load_reporters(model)) == ["a"]
    assert balance.read_loads(model)["a"].tolist() == [3, 2, 2, 3]
    balance.reset_loads(model)
    assert r.expert_load.tolist() == [0, 0, 0, 0]
    assert "expert_load" not in r.state_dict()  # counts are not model state


def test_bias_update_rule_exact():
    r = router({"type": "sigmoid_topk", "renormalize": True, "correction_bias": True, "bias_update_speed": 0.25})
    r.update_balance(torch.tensor([6, 2, 4, 4]))  # mean 4: over, under, at, at
    assert r.correction_bias.tolist() == [-0.25, 0.25, 0.0, 0.0]
    r.update_balance(torch.tensor([1, 9, 5, 1]))  # mean 4
    assert r.correction_bias.tolist() == [0.0, 0.0, -0.25, 0.25]
    assert r.correction_bias.dtype == torch.float32 and not r.correction_bias.requires_grad
    assert "correction_bias" in r.state_dict()
    frozen = router({"type": "sigmoid_topk", "renormalize": True, "correction_bias": True, "bias_update_speed": 0.0})
    frozen.update_balance(torch.tensor([6, 2, 4, 4]))
    assert frozen.correction_bias.tolist() == [0.0] * 4
    plain = router({"type": "topk", "renormalize": True})
    plain.update_balance(torch.tensor([6, 2, 4, 4]))  # no bias: nothing to move
    assert plain.correction_bias is None


def test_imbalance_summary():
    assert balance.imbalance(torch.tensor([2, 2, 2, 2])) == 1.0
    assert balance.imbalance(torch.tensor([8, 0, 0, 0])) == 4.0
    assert balance.imbalance(torch.tensor([0, 0])) is None
    assert balance.layer_of("layers.12.ffn.router") == 12 and balance.layer_of("embed") is None


def test_moe_passes_the_padding_mask_to_the_router():
    m = moe(
        {
            "type": "moe",
            "n_experts": 4,
            "top_k": 2,
            "expert": {"type": "swiglu", "d_ff": 8},
            "router": {"type": "topk", "renormalize": True},
        }
    )
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[False, False, True, True, True], [True] * 5])
    m(x, token_mask=mask)
    assert int(m.router.expert_load.sum()) == 8 * 2
    balance.reset_loads(m)
    m(x)
    assert int(m.router.expert_load.sum()) == 10 * 2


# ------------------------------------------------------------------------------------------------ moe options


def test_sequence_wise_balance_loss_equals_deepseek_formula():
    """DeepSeek-V3 eqs. 17-20 per sequence: f_i = N / (K T) * count_i, P_i = mean_t s'_{i,t}, s' = s / sum(s);
    the loss is alpha * sum_i f_i P_i averaged over the sequences."""
    cfg = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 8},
        "aux_loss_coef": 0.5,
        "aux_loss_scope": "sequence",
        "router": {"type": "sigmoid_topk", "renormalize": True, "correction_bias": True},
    }
    m = moe(cfg)
    with torch.no_grad():
        m.router.correction_bias.copy_(torch.tensor([0.3, -0.2, 0.0, 0.1]))
    x = torch.randn(3, 6, 16, generator=torch.Generator().manual_seed(1))
    _, aux = m(x)
    n, k, t = 4, 2, 6
    want = []
    for b in range(3):
        logits = x[b] @ m.router.proj.weight.t()
        s = torch.sigmoid(logits)
        idx = torch.topk(s + m.router.correction_bias, k, dim=-1).indices
        count = torch.zeros(n)
        for e in idx.reshape(-1).tolist():
            count[e] += 1
        f = n / (k * t) * count
        p = (s / s.sum(-1, keepdim=True)).mean(0)
        want.append((f * p).sum())
    assert aux.item() == pytest.approx(0.5 * torch.stack(want).mean().item(), rel=1e-6)
    batch = moe({**cfg, "aux_loss_scope": "batch"})
    batch.load_state_dict(m.state_dict())
    assert batch(x)[1].item() != pytest.approx(aux.item(), rel=1e-4)  # the two scopes differ on this batch


def test_sequence_loss_skips_all_padding_sequences():
    cfg = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 8},
        "aux_loss_coef": 1.0,
        "aux_loss_scope": "sequence",
        "router": {"type": "topk", "renormalize": True},
    }
    m = moe(cfg)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[False] * 5, [True] * 5])
    _, masked = m(x, token_mask=mask)
    _, alone = m(x[1:])
    assert masked.item() == pytest.approx(alone.item(), rel=1e-6)


def test_shared_expert_and_its_gate_by_hand():
    cfg = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 8},
        "shared": {"type": "mlp", "d_ff": 12, "activation": "relu"},
        "shared_gate": True,
        "router": {"type": "topk", "renormalize": True},
    }
    m = moe(cfg)
    plain = moe({k: v for k, v in cfg.items() if k not in ("shared", "shared_gate")})
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("shared")})
    x = torch.randn(2, 3, 16)
    with torch.no_grad():
        want = plain(x)[0] + torch.sigmoid(x @ m.shared_gate.weight.t()) * m.shared(x)
        torch.testing.assert_close(m(x)[0], want, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------ compile


def test_compile_fullgraph_with_every_option():
    torch._dynamo.reset()
    cfg = {
        "type": "moe",
        "n_experts": 8,
        "top_k": 3,
        "expert": {"type": "swiglu_clamped", "d_ff": 8, "bias": True},
        "shared": {"type": "swiglu", "d_ff": 16},
        "shared_gate": True,
        "weight_on": "input",
        "aux_loss_scope": "sequence",
        "router": {
            "type": "sigmoid_topk",
            "renormalize": True,
            "correction_bias": True,
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 2.5,
        },
    }
    m = moe(cfg)
    with torch.no_grad():
        m.router.correction_bias.copy_(torch.linspace(-0.2, 0.2, 8))
    x = torch.randn(2, 8, 16)
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    y_ref, aux_ref = m(x, token_mask=mask)
    eager_load = m.router.expert_load.clone()
    balance.reset_loads(m)
    y, aux = torch.compile(m, fullgraph=True, backend="aot_eager")(x, token_mask=mask)
    torch.testing.assert_close(y[mask], y_ref[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(aux, aux_ref, atol=1e-6, rtol=1e-5)
    assert torch.equal(m.router.expert_load, eager_load) and int(eager_load.sum()) == 13 * 3
    (y[mask].sum() + aux).backward()
    assert torch.count_nonzero(m.router.proj.weight.grad) > 0 and torch.count_nonzero(m.shared_gate.weight.grad) > 0
    torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------ the kit


KIT_CONFIGS = [
    (
        "ffn",
        "moe",
        {
            "type": "moe",
            "n_experts": 8,
            "top_k": 2,
            "expert": {"type": "swiglu", "d_ff": 16},
            "shared": {"type": "swiglu", "d_ff": 32},
            "shared_gate": True,
            "aux_loss_scope": "sequence",
            "router": {
                "type": "sigmoid_topk",
                "renormalize": True,
                "correction_bias": True,
                "n_group": 4,
                "topk_group": 2,
                "routed_scaling_factor": 2.5,
            },
        },
    ),
    (
        "ffn",
        "moe",
        {
            "type": "moe",
            "n_experts": 4,
            "top_k": 1,
            "expert": {"type": "swiglu", "d_ff": 16},
            "shared": {"type": "swiglu", "d_ff": 16},
            "weight_on": "input",
            "router": {"type": "sigmoid_topk", "renormalize": False},
        },
    ),
    (
        "ffn",
        "moe",
        {
            "type": "moe",
            "n_experts": 4,
            "top_k": 2,
            "expert": {"type": "swiglu_clamped", "d_ff": 16, "bias": True},
            "router": {"type": "topk", "renormalize": True, "bias": True},
        },
    ),
    (
        "router",
        "topk",
        {
            "type": "topk",
            "renormalize": True,
            "n_group": 2,
            "topk_group": 1,
            "group_score": "max",
            "routed_scaling_factor": 16.0,
        },
    ),
]


@pytest.mark.parametrize(
    "kind, type_, config", KIT_CONFIGS, ids=["deepseek", "llama4", "gpt-oss", "deepseek-v2-router"]
)
def test_the_kit_passes_on_todays_configurations(kind, type_, config):
    results = check_component(kind, type_, config)
    failed = [f"{r.check}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, failed
    passed = {r.check for r in results if r.status == "passed"}
    assert {"param_count", "flops", "gradients", "aux_loss_grad", "compile", "meta_init"} <= passed, passed


# ------------------------------------------------------------------------------------------------ declarations


def test_tiny_deepseek_counts_exact():
    d, v = 128, 1024
    attention = 2 * d * d + 2 * d * 64
    dense = 3 * d * 352
    expert = 3 * d * 64
    moe_layer = 8 * expert + 8 * d + 3 * d * 64  # routed experts, router, shared expert
    want = {
        "embedding": v * d,
        "position": 0,
        "attention": 4 * attention,
        "ffn": dense + 3 * moe_layer,
        "norm": 9 * d,
        "lm_head": v * d,
    }
    want["total"] = sum(want.values())
    assert modkit.breakdown(DEEPSEEK) == want and want["total"] == 1_261_696
    active = want["total"] - 3 * (8 - 2) * expert  # the shared expert is always active
    assert modkit.active_params_per_token(DEEPSEEK) == active == 819_328
    assert modkit.get_registry().get("ffn", "moe").param_count is not None
    model = modkit.build(DEEPSEEK, device="meta")
    assert model.layers[1].ffn.router.correction_bias.dtype == torch.float32
    assert {n for n, _ in model.named_buffers() if "correction_bias" in n} == {
        f"layers.{i}.ffn.router.correction_bias" for i in (1, 2, 3)
    }


def test_cost_reports_active_parameters_and_declared_flops(capsys):
    from modkit.cli import main
    from modkit.analysis.cost import CostModel, Workload

    assert main(["cost", str(DEEPSEEK), "--context", "64", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["active_params_per_token"] == 819_328
    flops = CostModel(DEEPSEEK).flops(Workload(1, 1))  # one token, summed over layers by kind and part
    d = 128
    assert flops["ffn.experts.gate"] == 3 * 2 * (2 * d * 64)  # 3 MoE layers x top_k = 2 rows of the expert width
    assert flops["ffn.gate"] == 2 * d * 352 + 3 * 2 * d * 64  # the dense layer 0 and the 3 shared experts
    assert flops["router.proj"] == 3 * 2 * d * 8


def test_tp_plan_shards_the_shared_expert_and_replicates_router_and_gate():
    from modkit.parallel import model_plan

    spec = json.loads(DEEPSEEK.read_text())
    spec["block"]["ffn"]["shared_gate"] = True
    plan = model_plan(modkit.build(spec, device="meta"), 2)
    for i in (1, 2, 3):
        p = f"layers.{i}.ffn"
        assert plan.styles[f"{p}.experts"] == "grouped"
        assert (plan.styles[f"{p}.shared.gate"], plan.styles[f"{p}.shared.up"], plan.styles[f"{p}.shared.down"]) == (
            "colwise",
            "colwise",
            "rowwise",
        )
        assert f"{p}.router" not in plan.styles and f"{p}.shared_gate" not in plan.styles


def test_bfloat16_checkpoint_keeps_the_bias_in_float32(tmp_path):
    model = modkit.build(DEEPSEEK, dtype="bfloat16", seed=0)
    r = model.layers[1].ffn.router
    assert r.correction_bias.dtype == torch.float32 and r.proj.weight.dtype == torch.bfloat16
    with torch.no_grad():
        r.correction_bias.copy_(torch.linspace(-0.01, 0.01, 8) + 0.001)  # values bfloat16 would round
    modkit.save(model, tmp_path / "ck")
    back = modkit.load(tmp_path / "ck")
    assert back.layers[1].ffn.router.correction_bias.dtype == torch.float32
    assert torch.equal(back.layers[1].ffn.router.correction_bias, r.correction_bias)


# ------------------------------------------------------------------------------------------------ trace


def test_trace_shows_expert_load_per_layer():
    from modkit.analysis.trace import trace
    from modkit.analysis.trace_report import load_text, print_trace

    model = modkit.build(DEEPSEEK, seed=0)
    ids = list(range(1, 25))
    t = trace(model, ids)
    assert t.layers[0].expert_load is None and t.layers[0].load_imbalance is None  # the dense first layer
    for i in (1, 2, 3):
        load = t.layers[i].expert_load
        assert len(load) == 8 and sum(load) == 24 * 2
        assert t.layers[i].load_imbalance == pytest.approx(max(load) / (48 / 8))
    again = trace(model, ids)  # loads are reset before each trace: the same counts again
    assert [s.expert_load for s in again.layers] == [s.expert_load for s in t.layers]
    from rich.console import Console

    console = Console(record=True, width=400)
    print_trace(t, console=console)
    text = console.export_text()
    assert "expert load max/mean" in text and load_text(t.layers[1]) in text
