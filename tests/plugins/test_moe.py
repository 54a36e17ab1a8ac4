"""Tests of the ``moe`` FFN and the ``topk`` router (the router's weights, and the z-loss computed in float32)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit_plugins.ffn import GatedConfig
from modkit_plugins.moe import (
    MoE,
    MoEConfig,
    TopKRouter,
    TopKRouterConfig,
    load_balancing_loss,
    z_loss,
)

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "specs" / "tiny-moe.json"
ATOL = 1e-5


def make_ctx(d_model: int = 16, **extra) -> BuildContext:
    return BuildContext(d_model, 1, 32, 64, modkit.get_registry(), extra=dict(extra))


def moe_cfg(n_experts=4, top_k=2, d_ff=24, renormalize=True, **kw) -> MoEConfig:
    return MoEConfig(
        n_experts=n_experts,
        top_k=top_k,
        expert=GatedConfig(type="swiglu", d_ff=d_ff),
        router=TopKRouterConfig(renormalize=renormalize),
        **kw,
    )


def build_moe(cfg: MoEConfig, d_model: int = 16, seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    m = make_ctx(d_model).build(cfg)
    with torch.no_grad():  # a router with spread-out logits so routing is not degenerate
        m.router.proj.weight.normal_(0.0, 1.0)
    return m


def expert_ref(m: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert ``e`` of a SwiGLU MoE computed from its stacked weights by hand: ``silu(x Wg) * (x Wu) @ Wd``."""
    ex = m.experts
    return (torch.nn.functional.silu(x @ ex.gate[e]) * (x @ ex.up[e])) @ ex.down[e]


def reference_moe(m: MoE, x: torch.Tensor, renormalize: bool, capacity: int | None = None) -> torch.Tensor:
    """Token-by-token reference: independent router math, top-k experts, weighted sum (optionally with capacity)."""
    flat = x.reshape(-1, x.shape[-1])
    w_router = m.router.proj.weight.detach().double()
    logits = flat.double() @ w_router.t()
    probs = torch.softmax(logits, -1)
    top_p, top_i = torch.topk(probs, m.top_k, -1)
    if renormalize:
        top_p = top_p / top_p.sum(-1, keepdim=True)
    keep = torch.ones_like(top_i, dtype=torch.bool)
    if capacity is not None:  # GShard priority: all first choices, then second choices, each in token order
        used = [0] * m.n_experts
        for r in range(m.top_k):
            for t in range(flat.shape[0]):
                e = int(top_i[t, r])
                keep[t, r] = used[e] < capacity
                used[e] += int(keep[t, r])
    out = torch.zeros_like(flat)
    for t in range(flat.shape[0]):
        for r in range(m.top_k):
            if keep[t, r]:
                e = int(top_i[t, r])
                out[t] += float(top_p[t, r]) * expert_ref(m, e, flat[t : t + 1])[0]
    return out.view(x.shape)


# ------------------------------------------------------------------------------------------------ router weights


@pytest.mark.parametrize("renormalize, expected", [(True, [0.731059, 0.268941]), (False, [0.643914, 0.236883])])
def test_c08_router_weights(renormalize, expected):
    router = make_ctx(4, n_experts=4, top_k=2).build(TopKRouterConfig(renormalize=renormalize))
    assert isinstance(router, TopKRouter)
    with torch.no_grad():
        router.proj.weight.copy_(torch.eye(4))
    weights, indices, logits = router(torch.tensor([[2.0, 1.0, 0.0, -1.0]]))
    assert indices.tolist() == [[0, 1]]
    assert indices.dtype == torch.int64
    assert logits.dtype == torch.float32 and logits.shape == (1, 4)
    torch.testing.assert_close(weights, torch.tensor([expected]), atol=ATOL, rtol=0)
    if renormalize:  # softmax-then-top-k-then-renormalise == top-k-then-softmax
        torch.testing.assert_close(weights, torch.softmax(torch.tensor([[2.0, 1.0]]), -1), atol=ATOL, rtol=0)


def test_router_flag_is_required_and_dtypes():
    with pytest.raises(Exception, match="renormalize"):
        TopKRouterConfig()
    router = make_ctx(8, n_experts=4, top_k=3).build(TopKRouterConfig(renormalize=False))
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    w, i, lg = router(x)
    assert w.dtype == torch.bfloat16 and w.shape == (5, 3)
    assert i.shape == (5, 3) and lg.dtype == torch.float32 and lg.shape == (5, 4)


def test_router_needs_sizes_from_moe():
    with pytest.raises(ValueError, match="n_experts and top_k"):
        make_ctx(8).build(TopKRouterConfig(renormalize=True))


# ------------------------------------------------------------------------------------------------ z-loss


def test_c09_z_loss_helper():
    z = z_loss(torch.tensor([[0.0, 0.0], [2.0, 2.0]]))
    assert z.item() == pytest.approx(3.866747, abs=ATOL)
    big = z_loss(torch.tensor([[100.0, 0.0]]))
    assert torch.isfinite(big) and big.item() == pytest.approx(10000.0, rel=1e-6)
    big16 = z_loss(torch.tensor([[100.0, 0.0]], dtype=torch.float16))  # computed in float32: still finite
    assert torch.isfinite(big16) and big16.item() == pytest.approx(10000.0, rel=1e-6)
    masked = z_loss(torch.tensor([[0.0, 0.0], [2.0, 2.0]]), torch.tensor([False, True]))
    assert masked.item() == pytest.approx(2.693147**2, abs=1e-5)


@pytest.mark.parametrize("rows, expected", [([[0.0, 0.0], [2.0, 0.0]], 3.866747), ([[100.0, 0.0]], 10000.0)])
def test_c09_z_loss_through_module(rows, expected):
    cfg = moe_cfg(n_experts=2, top_k=1, d_ff=4, aux_loss_coef=0.0, z_loss_coef=1.0)
    m = make_ctx(2).build(cfg)
    with torch.no_grad():  # logits = W x: [0,0]->[0,0], [2,0]->[2,2], [100,0]->[100,0]
        m.router.proj.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 0.0]]) if len(rows) == 2 else torch.eye(2))
    _, aux = m(torch.tensor([rows]))
    assert aux.dtype == torch.float32 and aux.shape == ()
    assert torch.isfinite(aux)
    assert aux.item() == pytest.approx(expected, rel=1e-6, abs=ATOL)


def test_load_balancing_loss_values():
    probs = torch.tensor([[0.8, 0.2], [0.6, 0.4]])
    idx = torch.tensor([[0], [0]])
    # f = [1, 0], P = [0.7, 0.3] -> 2 * 0.7
    assert load_balancing_loss(probs, idx, 2).item() == pytest.approx(1.4, abs=ATOL)
    # padding token 1 left out: f = [1, 0], P = [0.8, 0.2] -> 2 * 0.8
    assert load_balancing_loss(probs, idx, 2, torch.tensor([True, False])).item() == pytest.approx(1.6, abs=ATOL)
    # perfectly balanced top-2 of 4: f = P = 1/4 -> 1
    uniform = torch.full((4, 4), 0.25)
    idx2 = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3]])
    assert load_balancing_loss(uniform, idx2, 4).item() == pytest.approx(1.0, abs=ATOL)


def test_aux_loss_combines_coefficients():
    m = build_moe(moe_cfg(aux_loss_coef=0.3, z_loss_coef=0.05))
    x = torch.randn(2, 8, 16)
    _, aux = m(x)
    logits = x.reshape(-1, 16) @ m.router.proj.weight.t()
    probs = torch.softmax(logits, -1)
    idx = torch.topk(probs, 2, -1).indices
    f = torch.zeros(4)
    for e in idx.reshape(-1).tolist():
        f[e] += 1
    f /= idx.numel()
    lb = 4 * (f * probs.mean(0)).sum()
    z = (torch.logsumexp(logits, -1) ** 2).mean()
    assert aux.item() == pytest.approx((0.3 * lb + 0.05 * z).item(), rel=1e-5)


# ------------------------------------------------------------------------------------------------ forward


@pytest.mark.parametrize("renormalize", [True, False])
def test_output_equals_reference(renormalize):
    m = build_moe(moe_cfg(renormalize=renormalize))
    x = torch.randn(3, 7, 16)
    y, aux = m(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    with torch.no_grad():
        ref = reference_moe(m, x, renormalize)
    torch.testing.assert_close(y, ref, atol=ATOL, rtol=1e-5)


def test_capacity_without_drops_equals_dropless():
    cfg = moe_cfg(capacity_factor=2.0)  # n_experts / top_k = 2: no assignment can be dropped
    m = build_moe(cfg)
    x = torch.randn(2, 9, 16)
    assert m.capacity(18) == 18
    y, _ = m(x)
    dense = build_moe(moe_cfg())
    dense.load_state_dict(m.state_dict())
    torch.testing.assert_close(y, dense(x)[0], atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.25])
def test_capacity_drops_overflow_like_reference(factor):
    m = build_moe(moe_cfg(capacity_factor=factor), seed=3)
    x = torch.randn(2, 10, 16)
    cap = m.capacity(20)
    assert cap == min(20, math.ceil(factor * 20 * 2 / 4))
    y, _ = m(x)
    with torch.no_grad():
        ref = reference_moe(m, x, True, capacity=cap)
    torch.testing.assert_close(y, ref, atol=ATOL, rtol=1e-5)


def test_bfloat16_forward():
    m = build_moe(moe_cfg()).to(torch.bfloat16)
    y, aux = m(torch.randn(2, 5, 16, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and aux.dtype == torch.float32 and torch.isfinite(aux)


def test_token_mask_excludes_padding_from_aux_loss():
    m = build_moe(moe_cfg(aux_loss_coef=1.0, z_loss_coef=0.1))
    x = torch.randn(1, 6, 16)
    mask = torch.tensor([[False, False, True, True, True, True]])
    y_masked, aux_masked = m(x, token_mask=mask)
    y_real, aux_real = m(x[:, 2:])
    assert aux_masked.item() == pytest.approx(aux_real.item(), rel=1e-6)
    torch.testing.assert_close(y_masked[:, 2:], y_real, atol=ATOL, rtol=1e-5)
    _, aux_all = m(x)
    assert aux_all.item() != pytest.approx(aux_real.item(), rel=1e-6)


def test_token_mask_padding_takes_no_capacity():
    m = build_moe(moe_cfg(capacity_factor=1.0))
    x = torch.randn(1, 8, 16)
    mask = torch.tensor([[False] * 4 + [True] * 4])
    y, _ = m(x, token_mask=mask)
    # the 4 real tokens, capacity computed from all 8 tokens (4 slots per expert) never overflow: equals dropless
    dense = build_moe(moe_cfg())
    dense.load_state_dict(m.state_dict())
    torch.testing.assert_close(y[:, 4:], dense(x[:, 4:])[0], atol=ATOL, rtol=1e-5)
    assert torch.count_nonzero(y[:, :4]) == 0


# ------------------------------------------------------------------------------------------------ gradients


def test_router_gets_gradient_from_aux_loss_alone():
    m = build_moe(moe_cfg(aux_loss_coef=0.01, z_loss_coef=0.001))
    _, aux = m(torch.randn(2, 16, 16))
    aux.backward()
    g = m.router.proj.weight.grad
    assert g is not None and torch.count_nonzero(g) > 0
    assert all(p.grad is None for p in m.experts.parameters())  # the aux loss does not touch the experts


def test_every_expert_gets_gradient_from_main_loss():
    m = build_moe(moe_cfg(n_experts=4, top_k=2))
    x = torch.randn(4, 32, 16)
    y, _ = m(x)
    y.pow(2).sum().backward()
    for name, p in m.experts.named_parameters():
        for i in range(4):
            assert p.grad is not None and torch.count_nonzero(p.grad[i]) > 0, f"experts.{name}[{i}] got no gradient"
    assert torch.count_nonzero(m.router.proj.weight.grad) > 0  # through the combine weights


# ------------------------------------------------------------------------------------------------ model


def test_tiny_moe_spec_builds_and_trains():
    model = modkit.build(TINY, seed=0)
    kinds = [layer.ffn.modkit_type for layer in model.layers]
    assert kinds == ["swiglu", "moe", "swiglu", "moe"]
    ids = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(0))
    out = model(ids)
    assert out.logits.shape == (2, 32, 1024)
    assert out.aux_loss is not None and out.aux_loss.shape == () and torch.isfinite(out.aux_loss)
    assert out.aux_loss.item() > 0
    out.aux_loss.backward()
    for i in (1, 3):
        g = model.layers[i].ffn.router.proj.weight.grad
        assert g is not None and torch.count_nonzero(g) > 0, f"layer {i} router got no gradient from the aux loss"
    # deterministic meta-first build
    again = modkit.build(TINY, seed=0)
    for (n, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), n


def test_tiny_moe_checkpoint_names():
    names = set(modkit.build(TINY, device="meta").state_dict())
    assert "layers.1.ffn.router.proj.weight" in names
    assert {f"layers.1.ffn.experts.{w}" for w in ("gate", "up", "down")} <= names
    shapes = {n: tuple(t.shape) for n, t in modkit.build(TINY, device="meta").state_dict().items()}
    assert shapes["layers.1.ffn.experts.gate"] == (4, 128, 176) and shapes["layers.1.ffn.experts.down"] == (4, 176, 128)
    assert "layers.0.ffn.gate.weight" in names


def test_tiny_moe_param_counts_exact():
    d, v = 128, 1024
    attention = d * d * 2 + d * 64 * 2  # q, o: 128x128; k, v: 128x64 (2 kv heads of 32)
    dense = 3 * d * 352
    expert = 3 * d * 176
    moe = 4 * expert + 4 * d  # experts + router
    expected = {
        "embedding": v * d,
        "position": 0,
        "attention": 4 * attention,
        "ffn": 2 * dense + 2 * moe,
        "norm": (2 * 4 + 1) * d,
        "lm_head": v * d,
    }
    expected["total"] = sum(expected.values())
    assert modkit.breakdown(TINY) == expected
    assert expected["total"] == 1_271_936 and expected["total"] < 10_000_000
    assert modkit.active_params_per_token(TINY) == expected["total"] - 2 * (4 - 2) * expert == 1_001_600


def test_declared_param_count_matches_module():
    reg = modkit.get_registry()
    entry = reg.get("ffn", "moe")
    ctx = make_ctx(16)
    for cfg in (
        moe_cfg(),
        MoEConfig(
            n_experts=3,
            top_k=1,
            expert=GatedConfig(type="geglu", d_ff=8, bias=True),
            router=TopKRouterConfig(renormalize=False, bias=True),
        ),
    ):
        m = ctx.build(cfg)
        assert entry.param_count(cfg, ctx) == sum(p.numel() for p in m.parameters())
    assert dict(entry.capabilities)["aux_loss"] is True
    assert dict(entry.capabilities)["compile_safe"] is True


def test_mixtral_8x7b_active_and_total():
    spec = {
        "schema_version": 1,
        "name": "mixtral-8x7b",
        "vocab_size": 32000,
        "d_model": 4096,
        "n_layers": 32,
        "max_seq_len": 32768,
        "position": {"type": "rope", "theta": 1e6},
        "block": {
            "attention": {"type": "gqa", "n_heads": 32, "n_kv_heads": 8},
            "ffn": {
                "type": "moe",
                "n_experts": 8,
                "top_k": 2,
                "expert": {"type": "swiglu", "d_ff": 14336},
                "router": {"type": "topk", "renormalize": True},
                "aux_loss_coef": 0.02,
            },
            "norm": {"type": "rmsnorm", "eps": 1e-5},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm", "eps": 1e-5},
    }
    model = modkit.build(spec, device="meta")
    params = modkit.breakdown(model)
    assert params["total"] == 46_702_792_704
    assert params["ffn"] == 45_098_205_184
    assert modkit.active_params_per_token(model) == 12_879_925_248


# ------------------------------------------------------------------------------------------------ validation


def _tiny_dict() -> dict:
    return json.loads(TINY.read_text())


def test_top_k_above_n_experts_is_a_spec_error():
    d = _tiny_dict()
    d["block"]["ffn"]["top_k"] = 5
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(d)
    text = str(err.value)
    assert "top_k = 5" in text and "n_experts = 4" in text and "block.ffn" in text


def test_nested_moe_is_rejected():
    d = _tiny_dict()
    inner = dict(d["block"]["ffn"])
    d["block"]["ffn"]["expert"] = inner
    with pytest.raises(modkit.SpecError, match="nested mixtures are not supported"):
        modkit.load_spec(d)


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda f: f.pop("router"), "block.ffn.router"),
        (lambda f: f["router"].pop("renormalize"), "block.ffn.router.renormalize"),
        (lambda f: f.update(aux_loss_coef=-0.1), "block.ffn.aux_loss_coef"),
        (lambda f: f.update(n_experts=0), "block.ffn.n_experts"),
        (lambda f: f.update(capacity_factor=0), "block.ffn.capacity_factor"),
        (lambda f: f["expert"].update(hidden=5), "block.ffn.expert.hidden"),
    ],
)
def test_bad_moe_fields(change, needle):
    d = _tiny_dict()
    change(d["block"]["ffn"])
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(d)
    assert needle in str(err.value)


def test_an_expert_with_activation_sparsity_is_refused_at_validation():
    # the stacked experts have no Gaussian top-k: validation refuses it where the build used to raise
    d = _tiny_dict()
    d["block"]["ffn"]["expert"]["activation_sparsity"] = 0.5
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(d)
    hits = [m for p, m in err.value.errors if p == "block.ffn.expert.activation_sparsity"]
    assert hits and "0.5" in hits[0] and "set it to 0" in hits[0], err.value.errors


def test_spec_round_trip():
    spec = modkit.load_spec(TINY)
    again = modkit.load_spec(spec.to_json())
    assert again == spec
    assert spec.block.ffn.router.renormalize is True


# ------------------------------------------------------------------------------------------------ compile


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_compile_fullgraph_matches_eager(capacity_factor):
    torch._dynamo.reset()
    m = build_moe(moe_cfg(capacity_factor=capacity_factor, z_loss_coef=0.01))
    x = torch.randn(2, 8, 16)
    y_ref, aux_ref = m(x)
    compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
    y, aux = compiled(x)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(aux, aux_ref, atol=ATOL, rtol=1e-5)
    (y.sum() + aux).backward()  # the compiled graph is differentiable too
    assert torch.count_nonzero(m.router.proj.weight.grad) > 0


def test_registry_examples_validate_and_build():
    reg = modkit.get_registry()
    d = _tiny_dict()
    d["block"]["ffn"] = reg.get("ffn", "moe").example_config()
    d["block"]["ffn"]["router"] = reg.get("router", "topk").example_config()
    model = modkit.build(d, seed=0)
    y, aux = model.layers[1].ffn(torch.randn(1, 3, 128))
    assert y.shape == (1, 3, 128) and torch.isfinite(aux)
