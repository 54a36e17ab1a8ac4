"""New routing and experts against direct reference computations (fixed inputs, float32).

``sqrtsoftplus_topk`` (DeepSeek-V4 scores), ``renormalize_p`` (DBRX's p-norm), group-limited softmax routing
(DeepSeek-V2's ``group_limited_greedy``), the ``hash`` router (token id -> experts; Roller et al. 2021, DeepSeek-V4)
and the ``moe``'s ``n_zero_experts`` (LongCat-Flash); transformers' modules where they build quickly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit.spec import load_component
from modkit_plugins.hash_router import hash_table

ROOT = Path(__file__).resolve().parents[2]
DEEPSEEK = ROOT / "specs" / "tiny-deepseek-moe.json"
D = 16


def ctx(d_model: int = 4, **extra) -> BuildContext:
    return BuildContext(d_model, 1, 32, 64, modkit.get_registry(), extra=dict(extra))


def router(cfg: dict, n: int = 4, k: int = 2, d: int = 4) -> torch.nn.Module:
    """A router of ``n`` experts; with ``d == n`` its projection is the identity (its logits are its input)."""
    r = ctx(d, n_experts=n, top_k=k).build(load_component("router", cfg))
    if r.proj is not None:
        with torch.no_grad():
            r.proj.weight.copy_(torch.eye(n, d) if d == n else torch.randn(n, d, generator=gen(3)))
    return r


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sqrtsoftplus(z: torch.Tensor) -> torch.Tensor:
    return torch.sqrt(torch.log1p(torch.exp(z)))


# ------------------------------------------------------------------------------------------------ scores, norms


def test_sqrtsoftplus_router_by_hand():
    r = router({"type": "sqrtsoftplus_topk", "renormalize": True, "routed_scaling_factor": 1.5})
    z = torch.tensor([[2.0, 1.0, 0.0, -1.0], [-3.0, 0.5, 4.0, 0.25]])
    w, idx, logits = r(z)
    assert idx.tolist() == [[0, 1], [2, 1]]
    s = sqrtsoftplus(z)
    want = torch.stack([s[0, [0, 1]], s[1, [2, 1]]])
    torch.testing.assert_close(w, 1.5 * want / want.sum(-1, keepdim=True), atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, z)
    torch.testing.assert_close(r.probabilities(z), s / s.sum(-1, keepdim=True))


def test_renormalize_eps_by_hand_and_equal_to_lfm2_moe():
    """LFM2-MoE divides the top-k sigmoid scores by their sum plus 1e-6 (``renormalize_eps``), choosing with a
    selection-only expert bias; at scores near 1e-6 the epsilon halves the weights, and the default 1e-20 does not."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.lfm2_moe.modeling_lfm2_moe import Lfm2MoeTopKRouter

    z = torch.tensor([[-13.0, -14.0, -12.5, -15.0], [1.0, -0.5, 2.0, 0.25]])
    bias = torch.tensor([0.0, 3e-6, -1e-6, 0.5])
    cfg = {"type": "sigmoid_topk", "renormalize": True, "correction_bias": True, "routed_scaling_factor": 1.5}
    r, plain = router({**cfg, "renormalize_eps": 1e-6}, d=4), router(cfg, d=4)
    for m in (r, plain):
        m.correction_bias.copy_(bias)
    w, idx, _ = r(z)
    assert idx.tolist() == [[3, 1], [3, 2]]  # the bias picks expert 1 over 2 in the first row
    s = torch.sigmoid(z).gather(-1, idx)
    torch.testing.assert_close(w, 1.5 * s / (s.sum(-1, keepdim=True) + 1e-6), atol=0, rtol=1e-6)
    assert (plain(z)[0][0] / w[0]).min() > 1.8  # with the default epsilon the tiny weights sum to 1.5
    hf_cfg = transformers.Lfm2MoeConfig(hidden_size=4, num_experts=4, num_experts_per_tok=2, routed_scaling_factor=1.5)
    hf = Lfm2MoeTopKRouter(hf_cfg)
    with torch.no_grad():
        hf.weight.copy_(torch.eye(4))
    _, hf_w, hf_idx = hf(z, bias)
    assert hf_idx.tolist() == idx.tolist()
    torch.testing.assert_close(w, hf_w, atol=0, rtol=1e-6)


def test_sqrtsoftplus_router_equals_deepseek_v4():
    pytest.importorskip("transformers")
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    hf = DeepseekV4TopKRouter(
        DeepseekV4Config(hidden_size=D, num_local_experts=8, num_experts_per_tok=3, routed_scaling_factor=1.5)
    )
    ours = ctx(D, n_experts=8, top_k=3).build(
        load_component(
            "router",
            {"type": "sqrtsoftplus_topk", "renormalize": True, "correction_bias": True, "routed_scaling_factor": 1.5},
        )
    )
    with torch.no_grad():
        hf.weight.copy_(torch.randn(8, D, generator=gen(1)))
        hf.e_score_correction_bias.copy_(torch.randn(8, generator=gen(2)) * 0.3)
        ours.proj.weight.copy_(hf.weight)
        ours.correction_bias.copy_(hf.e_score_correction_bias)
    x = torch.randn(10, D, generator=gen(3))
    logits, w_hf, i_hf = hf(x)
    w, idx, lg = ours(x)
    torch.testing.assert_close(lg, logits, atol=1e-6, rtol=0)
    o_hf, o = i_hf.sort(-1), idx.sort(-1)
    assert torch.equal(o.values, o_hf.values)
    torch.testing.assert_close(w.gather(-1, o.indices), w_hf.gather(-1, o_hf.indices), atol=1e-6, rtol=0)


@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
def test_p_norm_weights_equal_dbrx(p):
    """DBRX: softmax, top-k, weights / ||weights||_p (transformers ``DbrxFFN.route_tokens_to_experts``)."""
    r = router({"type": "topk", "renormalize": True, "renormalize_p": p}, n=6, k=3, d=6)
    z = torch.randn(9, 6, generator=gen(4)) * 2
    w, idx, _ = r(z)
    top, want_idx = torch.softmax(z, -1).topk(3, dim=-1)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, top / (top**p).sum(-1, keepdim=True) ** (1 / p), atol=1e-6, rtol=0)
    transformers = pytest.importorskip("transformers")
    from types import SimpleNamespace

    dbrx = transformers.models.dbrx.modeling_dbrx.DbrxFFN.route_tokens_to_experts
    w_hf, i_hf = dbrx(SimpleNamespace(moe_normalize_expert_weights=p, top_k=3), z)
    assert torch.equal(idx, i_hf)
    torch.testing.assert_close(w, w_hf, atol=1e-6, rtol=0)


def test_group_limited_softmax_equals_deepseek_v2_greedy():
    """DeepSeek-V2 ``group_limited_greedy``: softmax scores, each group scored by its max, the topk_group best groups
    kept, top-k inside them, weights the scores times routed_scaling_factor (no renormalisation)."""
    cfg = {"type": "topk", "renormalize": False, "n_group": 4, "topk_group": 2, "group_score": "max"}
    r = router({**cfg, "routed_scaling_factor": 2.0}, n=8, k=3, d=8)
    z = torch.randn(12, 8, generator=gen(5)) * 2
    w, idx, _ = r(z)
    s = torch.softmax(z, -1)
    best = s.view(12, 4, 2).amax(-1).topk(2, dim=-1).indices
    keep = torch.zeros(12, 4, dtype=torch.bool).scatter(1, best, True).repeat_interleave(2, dim=1)
    want_w, want_idx = s.masked_fill(~keep, 0.0).topk(3, dim=-1)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, 2.0 * want_w, atol=1e-6, rtol=0)
    assert not torch.equal(idx, s.topk(3, dim=-1).indices)  # the group limit changed some token's choice


# ------------------------------------------------------------------------------------------------ hash routing


def test_hash_table_is_fixed_distinct_and_seeded():
    t = hash_table(1000, 8, 3, seed=0)
    assert t.shape == (1000, 3) and t.dtype == torch.int64
    assert torch.equal(t, hash_table(1000, 8, 3, seed=0)) and not torch.equal(t, hash_table(1000, 8, 3, seed=1))
    assert all(len(set(row)) == 3 for row in t.tolist()) and 0 <= int(t.min()) and int(t.max()) < 8
    counts = torch.bincount(t.reshape(-1), minlength=8)
    assert int(counts.sum()) == 3000 and int(counts.min()) > 300  # 375 each on average


def test_hash_router_by_hand():
    r = router({"type": "hash", "renormalize": True, "routed_scaling_factor": 1.5}, n=8, k=2, d=D)
    assert r.table.shape == (32, 2) and torch.equal(r.table, hash_table(32, 8, 2, 0))  # vocabulary 32
    x, ids = torch.randn(6, D, generator=gen(6)), torch.tensor([0, 5, 5, 31, 17, 2])
    w, idx, logits = r(x, token_ids=ids)
    assert torch.equal(idx, r.table[ids])
    z = x @ r.proj.weight.t()
    s = sqrtsoftplus(z).gather(-1, idx)
    torch.testing.assert_close(logits, z, atol=1e-6, rtol=0)
    torch.testing.assert_close(w, 1.5 * s / s.sum(-1, keepdim=True), atol=1e-6, rtol=0)
    assert torch.equal(r.expert_load, torch.bincount(idx.reshape(-1), minlength=8))
    plain = router({"type": "hash", "renormalize": False, "gate": False}, n=8, k=2, d=D)
    w, idx2, logits = plain(x, token_ids=ids)
    assert torch.equal(idx2, idx) and torch.equal(w, torch.ones(6, 2)) and torch.equal(logits, torch.zeros(6, 8))
    assert sum(p.numel() for p in plain.parameters()) == 0
    with pytest.raises(ValueError, match="needs token_ids of shape \\(6,\\), got None"):
        r(x)


def test_hash_router_equals_deepseek_v4():
    pytest.importorskip("transformers")
    from transformers import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter

    hf = DeepseekV4HashRouter(
        DeepseekV4Config(
            hidden_size=D, num_local_experts=8, num_experts_per_tok=2, vocab_size=32, routed_scaling_factor=1.5
        )
    )
    ours = router({"type": "hash", "renormalize": True, "routed_scaling_factor": 1.5}, n=8, k=2, d=D)
    with torch.no_grad():
        hf.weight.copy_(ours.proj.weight)
        hf.tid2eid.copy_(ours.table)
    x, ids = torch.randn(2, 5, D, generator=gen(7)), torch.randint(0, 32, (2, 5), generator=gen(8))
    logits, w_hf, i_hf = hf(x, ids)
    w, idx, lg = ours(x.reshape(-1, D), token_ids=ids.reshape(-1))
    assert torch.equal(idx, i_hf)
    torch.testing.assert_close(w, w_hf, atol=1e-6, rtol=0)
    torch.testing.assert_close(lg, logits, atol=1e-6, rtol=0)


def _spec(router_cfg: dict, **ffn) -> dict:
    d = json.loads(DEEPSEEK.read_text())
    d["block"]["ffn"]["router"] = router_cfg
    d["block"]["ffn"].update(ffn)
    return d


def test_hash_moe_in_a_model_routes_by_input_ids_and_counts_exact():
    """The model's input_ids reach the router (AttentionInputs.token_ids through run_ffn): each MoE layer's loads are
    the bincount of table[input_ids]; the gate counts like the topk router's projection, no gate counts nothing."""
    spec = _spec({"type": "hash", "renormalize": True})
    model = modkit.build(spec, seed=0)
    ids = torch.randint(0, 1024, (2, 9), generator=gen(9))
    model(ids)
    moes = [m for m in model.modules() if type(m).__name__ == "MoE"]
    assert len(moes) == 3
    for m in moes:
        assert torch.equal(m.router.expert_load, torch.bincount(m.router.table[ids].reshape(-1), minlength=8))
    assert modkit.breakdown(spec)["total"] == 1_261_696  # the tiny DeepSeek's count: the gate replaces the router
    no_gate = _spec({"type": "hash", "renormalize": False, "gate": False})
    assert modkit.breakdown(no_gate)["total"] == 1_261_696 - 3 * 8 * 128
    built = modkit.build(no_gate, device="meta")
    assert sum(p.numel() for p in built.parameters()) == 1_261_696 - 3 * 8 * 128


# ------------------------------------------------------------------------------------------------ zero experts


def zero_moe(weight_on: str = "output", renormalize: bool = False) -> torch.nn.Module:
    cfg = {
        "type": "moe",
        "n_experts": 4,
        "n_zero_experts": 2,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 8},
        "router": {"type": "topk", "renormalize": renormalize, "routed_scaling_factor": 1.5},
        "weight_on": weight_on,
        "aux_loss_coef": 0.0,
    }
    m = ctx(D).build(load_component("ffn", cfg))
    g = gen(10)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return m


def zero_reference(m, x: torch.Tensor) -> torch.Tensor:
    """Per token and choice, by hand: a real expert's SwiGLU, or the input itself for a zero expert."""
    flat = x.reshape(-1, D)
    s = torch.softmax(flat @ m.router.proj.weight.t(), -1)
    w, idx = s.topk(2, dim=-1)
    w = 1.5 * w
    out = torch.zeros_like(flat)
    e = m.experts
    for t in range(flat.shape[0]):
        for j in range(2):
            i, h = int(idx[t, j]), flat[t]
            if i >= 4:
                out[t] += w[t, j] * h
            else:
                out[t] += w[t, j] * ((torch.nn.functional.silu(h @ e.gate[i]) * (h @ e.up[i])) @ e.down[i])
    return out.view(x.shape)


@pytest.mark.parametrize("weight_on", ["output", "input"])
def test_zero_experts_by_hand_with_gradient(weight_on):
    m = zero_moe(weight_on)
    x = torch.randn(3, 7, D, generator=gen(11))
    _, idx, _ = m.router(x.reshape(-1, D))
    assert bool((idx >= 4).any()) and bool((idx < 4).any())  # both kinds of expert are used
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, _ = m(xa)
    if weight_on == "output":
        torch.testing.assert_close(y, zero_reference(m, xb), atol=1e-5, rtol=0)
    else:  # a SwiGLU of g * x is not g * SwiGLU(x): compare the zero-expert part only through the gradient check
        assert torch.isfinite(y).all()
    probe = torch.randn(y.shape, generator=gen(12))
    (y * probe).sum().backward()
    assert torch.isfinite(xa.grad).all()
    if weight_on == "output":
        (zero_reference(m, xb) * probe).sum().backward()
        torch.testing.assert_close(xa.grad, xb.grad, atol=1e-5, rtol=0)


def test_all_tokens_to_zero_experts_return_the_weighted_input():
    """Every assignment to a zero expert: y = 1.5 x exactly, dy/dx = 1.5, no gradient reaches the real experts (the
    rows the grouped call leaves uncomputed never reach the output or the gradient)."""
    m = zero_moe(renormalize=True)
    z = torch.zeros(10, 6)
    z[:, 4:] = 50.0

    class Fixed(torch.nn.Module):  # a router whose logits favour the two zero experts
        def forward(self, flat, token_mask=None):
            w, idx = torch.softmax(z, -1).topk(2, dim=-1)
            return 1.5 * w / w.sum(-1, keepdim=True), idx, z

    m.router = Fixed()
    assert torch.equal(m.router(None)[1].sort(-1).values, torch.tensor([[4, 5]] * 10))
    x = torch.randn(2, 5, D, generator=gen(13)).requires_grad_()
    y, _ = m(x)
    torch.testing.assert_close(y, 1.5 * x, atol=1e-6, rtol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 1.5))
    assert all(p.grad is None or not p.grad.any() for p in m.experts.parameters())


def test_zero_experts_equal_longcat_flash():
    pytest.importorskip("transformers")
    from transformers import LongcatFlashConfig
    from transformers.models.longcat_flash.modeling_longcat_flash import LongcatFlashMoE

    hf = LongcatFlashMoE(
        LongcatFlashConfig(
            hidden_size=D,
            n_routed_experts=4,
            zero_expert_num=2,
            num_experts_per_tok=2,
            expert_ffn_hidden_size=8,
            routed_scaling_factor=1.5,
        )
    )
    m = zero_moe()
    with torch.no_grad():
        hf.router.classifier.weight.copy_(m.router.proj.weight)
        hf.experts.gate_up_proj.copy_(torch.cat([m.experts.gate, m.experts.up], dim=2).transpose(1, 2))
        hf.experts.down_proj.copy_(m.experts.down.transpose(1, 2))
    x = torch.randn(3, 7, D, generator=gen(14))
    torch.testing.assert_close(m(x)[0], hf(x), atol=1e-5, rtol=0)


def test_zero_experts_counts_flops_and_errors():
    d, dff = 128, 64
    spec = _spec({"type": "topk", "renormalize": False}, n_zero_experts=4, aux_loss_coef=0.0)
    want = 1_261_696 + 3 * 4 * d  # the router scores 8 + 4 choices; zero experts hold nothing
    assert modkit.breakdown(spec)["total"] == want
    assert sum(p.numel() for p in modkit.build(spec, device="meta").parameters()) == want
    from modkit_plugins.moe import _moe_flops
    from modkit.plugin import Workload

    cfg = load_component("ffn", spec["block"]["ffn"])
    c = BuildContext(d, 1, 1024, 64, modkit.get_registry())
    flops = _moe_flops(cfg, c, Workload(batch=1, new=30))
    rows = 30 * 2  # the static shape of the grouped call (zero-expert rows are in it, uncomputed)
    assert sum(flops.values()) == 2 * rows * 3 * d * dff
    for change, needle in [
        ({"n_zero_experts": 2, "capacity_factor": 1.25}, "n_zero_experts = 2 needs dropless dispatch"),
        ({"n_zero_experts": 1, "top_k": 10}, "top_k = 10 exceeds n_experts = 8 \\+ n_zero_experts = 1 choices"),
    ]:
        bad = _spec({"type": "topk", "renormalize": False}, **change)
        with pytest.raises(modkit.SpecError, match=needle):
            modkit.load_spec(bad)
    with pytest.raises(modkit.SpecError, match="renormalize_p = 2 sets the norm"):
        modkit.load_spec(_spec({"type": "topk", "renormalize": False, "renormalize_p": 2}))


def test_the_kit_passes_an_moe_with_zero_experts_and_a_hash_router():
    from modkit.testing import check_component

    config = {
        "type": "moe",
        "n_experts": 4,
        "n_zero_experts": 2,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 16},
        "router": {"type": "hash", "renormalize": True},
    }
    results = check_component("ffn", "moe", config)
    failed = [f"{r.check}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, failed
    passed = {r.check for r in results if r.status == "passed"}
    assert {"param_count", "flops", "gradients", "per_token", "compile", "meta_init"} <= passed, passed
