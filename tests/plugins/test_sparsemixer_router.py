"""The ``sparsemixer`` router (Phi-3.5-MoE's SparseMixer top-2 routing) against a hand computation and against
transformers' ``phimoe`` ``sparsemixer`` function (its evaluation branch), fixed inputs, float32."""

from __future__ import annotations

import math

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit.spec import load_component


def router(n: int = 4, k: int = 2, eps: float = 0.01) -> torch.nn.Module:
    """A sparsemixer router over ``n`` experts of a ``d_model = n`` input whose projection is the identity."""
    ctx = BuildContext(n, 1, 32, 64, modkit.get_registry(), extra={"n_experts": n, "top_k": k})
    r = ctx.build(load_component("router", {"type": "sparsemixer", "jitter_eps": eps}))
    with torch.no_grad():
        r.proj.weight.copy_(torch.eye(n))
    return r


def test_sparsemixer_by_hand():
    """Logits ``[2, 1.99, 0, -1]``, ε 0.01: the first pick (expert 0) keeps experts within a relative 0.02 of 2
    (0 and 1) in its softmax; the second (expert 1, best 1.99) keeps only itself (expert 2 is far behind)."""
    w, idx, logits = router()(torch.tensor([[2.0, 1.99, 0.0, -1.0], [0.0, 0.0, 3.0, -2.0]]))
    assert idx.tolist() == [[0, 1], [2, 0]]
    e = math.exp(-0.01)
    torch.testing.assert_close(w[0], torch.tensor([1 / (1 + e), 1.0]), atol=1e-6, rtol=0)
    # row 2: expert 2 wins alone; then experts 0 and 1 tie at 0 (|z| clamps to the best, 0: 0 / 0 is not > 2ε)
    torch.testing.assert_close(w[1], torch.tensor([1.0, 0.5]), atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, torch.tensor([[2.0, 1.99, 0.0, -1.0], [0.0, 0.0, 3.0, -2.0]]))


@pytest.mark.parametrize("eps", [0.01, 0.3])
def test_sparsemixer_equals_transformers_phimoe(eps):
    pytest.importorskip("transformers")
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    g = torch.Generator().manual_seed(0)
    z = torch.randn(64, 8, generator=g) * 0.3
    z[:8, 3] = z[:8, 5]  # exact ties
    w, idx, _ = router(n=8, eps=eps)(z)
    want_w, want_idx = sparsemixer(z, jitter_eps=eps, training=False, top_k=2)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, atol=1e-7, rtol=0)


def test_sparsemixer_gradient_reaches_the_router():
    r = router(eps=0.3)  # wide thresholds: several experts share each softmax
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    w, _, _ = r(x)
    (w * torch.randn(5, 2, generator=torch.Generator().manual_seed(2))).sum().backward()
    assert r.proj.weight.grad is not None and r.proj.weight.grad.abs().sum() > 0


def test_sparsemixer_refuses_another_top_k():
    with pytest.raises(ValueError, match="always picks 2 experts, but the moe asks for top_k = 3"):
        router(k=3)


def test_the_kit_passes_an_moe_with_a_sparsemixer_router():
    from modkit.testing import check_component

    config = {
        "type": "moe",
        "n_experts": 4,
        "top_k": 2,
        "expert": {"type": "swiglu", "d_ff": 16},
        "router": {"type": "sparsemixer"},
    }
    results = check_component("ffn", "moe", config)
    failed = [f"{r.check}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, failed
    passed = {r.check for r in results if r.status == "passed"}
    assert {"param_count", "flops", "gradients", "per_token", "meta_init"} <= passed, passed
