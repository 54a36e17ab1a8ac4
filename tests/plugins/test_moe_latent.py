"""The latent mixture (``moe`` with ``latent_dim``) equals transformers' ``NemotronHMoE`` with ``moe_latent_size``.

Nemotron 3's form: the routed ReLU² experts work between ``fc1_latent_proj`` (``d_model -> latent``) and
``fc2_latent_proj`` (back), both with ``mlp_bias``; the router and the shared expert read the full-width input.
The transformers module is built from a small config, filled with seeded random weights (the correction bias too,
so that it changes the selection), and copied into the modkit module: float32, 1e-5. Also: the declared count,
the active parameters, the declared FLOPs against FlopCounterMode, the contract kit on the latent config, the
tensor-parallel and expert-parallel plans, and the errors of the fields.
"""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit.spec import load_component

transformers = pytest.importorskip("transformers")

D, LATENT, N, K, FF, SHARED = 16, 8, 8, 3, 12, 20

SPEC = {
    "type": "moe",
    "n_experts": N,
    "top_k": K,
    "expert": {"type": "mlp", "d_ff": FF, "activation_unit": {"type": "relu2"}, "bias": False},
    "router": {
        "type": "sigmoid_topk",
        "renormalize": True,
        "routed_scaling_factor": 1.5,
        "n_group": 4,
        "topk_group": 2,
        "correction_bias": True,
    },
    "shared": {"type": "mlp", "d_ff": SHARED, "activation_unit": {"type": "relu2"}, "bias": True},
    "latent_dim": LATENT,
    "latent_bias": True,
    "aux_loss_coef": 0.0,
}


def _ctx(d_model: int = D) -> BuildContext:
    return BuildContext(d_model, 1, 32, 64, modkit.get_registry())


def build(cfg: dict = SPEC, d_model: int = D) -> torch.nn.Module:
    """The modkit ``moe`` of ``cfg`` built alone."""
    return _ctx(d_model).build(load_component("ffn", cfg))


def _set(param: torch.Tensor, value: torch.Tensor) -> None:
    with torch.no_grad():
        assert param.shape == value.shape, (param.shape, value.shape)
        param.copy_(value)


def nemotron_pair():
    """transformers' ``NemotronHMoE`` (seeded weights, a perturbed correction bias) and the modkit module holding the
    same weights."""
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMoE

    cfg = NemotronHConfig(
        hidden_size=D,
        n_routed_experts=N,
        num_experts_per_tok=K,
        moe_intermediate_size=FF,
        moe_shared_expert_intermediate_size=SHARED,
        moe_latent_size=LATENT,
        mlp_bias=True,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=1.5,
        norm_topk_prob=True,
    )
    torch.manual_seed(0)
    hf = NemotronHMoE(cfg).float()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        hf.gate.e_score_correction_bias.copy_(torch.randn(N, generator=g) * 0.3)
    ours = build()
    _set(ours.router.proj.weight, hf.gate.weight)
    _set(ours.router.correction_bias, hf.gate.e_score_correction_bias)
    _set(ours.experts.up, hf.experts.up_proj.transpose(1, 2))
    _set(ours.experts.down, hf.experts.down_proj.transpose(1, 2))
    for x in ("up", "down"):
        _set(getattr(ours.shared, x).weight, getattr(hf.shared_experts, f"{x}_proj").weight)
        _set(getattr(ours.shared, x).bias, getattr(hf.shared_experts, f"{x}_proj").bias)
    for ours_name, theirs in (("latent_down", hf.fc1_latent_proj), ("latent_up", hf.fc2_latent_proj)):
        _set(getattr(ours, ours_name).weight, theirs.weight)
        _set(getattr(ours, ours_name).bias, theirs.bias)
    return hf, ours


def test_latent_mixture_equals_transformers_nemotron_h_moe():
    hf, ours = nemotron_pair()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    x = torch.randn(3, 7, D, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = hf(x)
        got, aux = ours(x)
    assert got.shape == x.shape and aux.item() == 0.0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    # the case is strong enough: the correction bias changes selections, and the latent bias matters
    with torch.no_grad():
        logits = x.reshape(-1, D) @ ours.router.proj.weight.T
        plain = torch.topk(torch.sigmoid(logits), K, dim=-1).indices.sort(-1).values
        biased = torch.topk(torch.sigmoid(logits) + ours.router.correction_bias, K, dim=-1).indices.sort(-1).values
        assert (plain != biased).any(dim=-1).any()
        ours.latent_up.bias.zero_()
        assert (ours(x)[0] - want).abs().max() > 0.1


def test_latent_capacity_dispatch_equals_dropless_when_nothing_drops():
    """The capacity form runs the same latent rows: with ``capacity_factor = n_experts / top_k`` nothing drops."""
    _, ours = nemotron_pair()
    cap = build({**SPEC, "capacity_factor": N / K})
    cap.load_state_dict(ours.state_dict())
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(cap(x)[0], ours(x)[0], atol=1e-5, rtol=1e-5)


def test_latent_count_active_parameters_and_flops_are_declared():
    from modkit.plugin import Workload
    from modkit_plugins.moe import _moe_count, _moe_flops

    cfg, ctx = load_component("ffn", SPEC), _ctx()
    ours = build()
    expert = 2 * LATENT * FF  # up [latent, ff] + down [ff, latent], no biases
    router = N * D
    shared = 2 * D * SHARED + SHARED + D
    latent = 2 * D * LATENT + LATENT + D
    assert _moe_count(cfg, ctx) == N * expert + router + shared + latent == sum(p.numel() for p in ours.parameters())
    assert ours.inactive_params_per_token() == (N - K) * expert  # the latent projections serve every token
    flops = _moe_flops(cfg, ctx, Workload(batch=2, new=5))
    tokens = 10
    assert flops == {
        "experts.up": 2 * tokens * K * LATENT * FF,
        "experts.down": 2 * tokens * K * FF * LATENT,
        "latent_down": 2 * tokens * D * LATENT,
        "latent_up": 2 * tokens * LATENT * D,
    }


def test_contract_kit_passes_on_the_latent_mixture():
    """Every kit check that applies (flops against FlopCounterMode, param_count, the tensor-parallel plan ...) on
    the latent config in the kit's tiny models."""
    from modkit.testing import check_component

    results = check_component("ffn", "moe", {**SPEC, "aux_loss_coef": 0.01})
    failed = [(r.check, r.detail) for r in results if r.status == "failed"]
    assert not failed, failed
    assert {r.check for r in results if r.status == "passed"} >= {"flops", "param_count"}


def test_latent_projections_stay_whole_under_tensor_and_expert_parallelism():
    from modkit.parallel import model_plan
    from modkit.parallel.expert import expert_plan

    from tests.conftest import tiny_spec

    model = modkit.build(tiny_spec(block__ffn=SPEC), device="meta")
    plan = model_plan(model, 2)
    assert plan.styles["layers.0.ffn.experts"] == "grouped"
    assert not any("latent" in p for p in plan.styles) and not any("latent" in p for p in plan.replicated)
    n = model.spec.n_layers
    assert list(expert_plan(model, 2).experts) == [f"layers.{i}.ffn.experts" for i in range(n)]


@pytest.mark.parametrize(
    "change,words",
    [
        ({"latent_dim": None, "latent_bias": True}, "latent_bias = true"),
        ({"n_zero_experts": 2}, "latent_dim = 8 with n_zero_experts = 2"),
        ({"latent_dim": 0}, "latent_dim"),
    ],
)
def test_latent_fields_are_checked(change, words):
    with pytest.raises(modkit.SpecError) as info:
        load_component("ffn", {**SPEC, **change})
    assert words in str(info.value)


@pytest.mark.slow
def test_latent_mixture_trains_the_same_under_tensor_parallelism():
    """The kit's ``shards`` check (2 gloo processes, tp = 2, about 10 s): one training step equals the single
    process's, the latent projections replicated and identical on both ranks."""
    from modkit.testing import check_component

    (result,) = check_component("ffn", "moe", {**SPEC, "aux_loss_coef": 0.01}, checks=["shards"], distributed=True)
    assert result.status == "passed", result.detail


@pytest.mark.parametrize("capacity_factor", [None, 2.0])
def test_latent_mixture_runs_under_bfloat16_autocast(capacity_factor):
    # modkit train's bfloat16 autocast: latent_down's rows came out in bfloat16 and the float32 stacked experts
    # refused them ("grouped_mm needs x and w in one dtype"); the rows stay in the input's dtype, as without latent_dim
    m = build({**SPEC, "capacity_factor": capacity_factor, "router": {"type": "topk", "renormalize": True}})
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(0), requires_grad=True)
    want = m(x)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, aux = m(x)
    assert got.dtype == torch.float32 and got.shape == (2, 5, D)
    assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max())
    (got.sum() + aux).backward()
    assert x.grad is not None and bool(torch.isfinite(x.grad).all())
