"""``mla``'s ``head_gate`` (Ling 3's gated latent attention) against transformers' ``BailingHybridAttention`` on the
same weights, float32: a left-padded forward and a cached prefill then decode (the absorbed path); the gate's
parameters and FLOPs; the contract kit on the gated form.

References: transformers ``BailingHybridAttention`` / ``BailingHybridRotaryEmbedding`` (test-only dependency).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import modkit
from modkit.analysis.cost import Workload
from modkit.testing import check_component
from modkit_plugins.mla import _flops

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402
from transformers.models.bailing_hybrid.modeling_bailing_hybrid import (  # noqa: E402
    BailingHybridAttention,
    BailingHybridRotaryEmbedding,
)

from test_mla import _hf_mask, _ours  # noqa: E402

D, H, R_Q, R_KV, NOPE, ROPE, V = 32, 4, 24, 16, 8, 4, 6
GATED = {
    "type": "mla",
    "n_heads": H,
    "q_lora_rank": R_Q,
    "kv_lora_rank": R_KV,
    "qk_nope_head_dim": NOPE,
    "qk_rope_head_dim": ROPE,
    "v_head_dim": V,
    "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
    "head_gate": True,
}


def _pair():
    """``(modkit model, transformers attention, rotary)`` with the same (perturbed) weights, interleaved RoPE."""
    cfg = transformers.BailingHybridConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=R_Q,
        kv_lora_rank=R_KV,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        rope_theta=10000.0,
        vocab_size=64,
    )
    cfg._attn_implementation = "eager"
    hf = BailingHybridAttention(cfg, layer_idx=0).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(
                torch.randn(p.shape, generator=gen) * 0.3 if p.dim() > 1 else 0.5 + torch.rand(p.shape, generator=gen)
            )
    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 1,
        "max_seq_len": 64,
        "position": {"type": "rope", "theta": 10000.0, "layout": "interleaved"},
        "block": {"attention": GATED, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
    }
    model = modkit.build(spec, seed=0).eval()
    loaded = model.layers[0].attention.load_state_dict(hf.state_dict(), strict=True)
    assert not loaded.missing_keys and not loaded.unexpected_keys
    return model, hf, BailingHybridRotaryEmbedding(cfg)


def test_head_gate_equals_transformers_bailing_hybrid_attention():
    model, hf, rotary = _pair()
    b, s = 2, 9
    x = torch.randn(b, s, D, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, :3] = False
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref, _ = hf(x, rotary(x, pos), _hf_mask(mask, s, 0))
        got = _ours(model, x, pos, mask)
        cache, hf_cache = model.new_cache(b, s), DynamicCache(config=hf.config)
        outs, refs = [], []
        for a, e in ((0, 5), (5, 6), (6, 7), (7, 8), (8, 9)):
            outs.append(_ours(model, x[:, a:e], None, mask[:, a:e], cache))
            refs.append(hf(x[:, a:e], rotary(x, pos[:, a:e]), _hf_mask(mask, e - a, a), cache=hf_cache)[0])
        steps, step_ref = torch.cat(outs, 1), torch.cat(refs, 1)
    for mine, theirs in ((got, ref), (steps, step_ref)):
        torch.testing.assert_close(mine[0, 3:], theirs[0, 3:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(mine[1], theirs[1], atol=1e-5, rtol=1e-5)
    model.layers[0].attention.g_proj = None  # without its gate, the output differs
    with torch.no_grad():
        assert (_ours(model, x, pos, mask)[1] - ref[1]).abs().max().item() > 1e-2


def test_head_gate_counts_its_projection():
    model, hf, _ = _pair()
    mla = model.layers[0].attention
    assert tuple(mla.g_proj.weight.shape) == (H, D) and mla.head_layout()["g_proj"] == (H, 1)
    assert sum(p.numel() for p in mla.parameters()) == sum(p.numel() for p in hf.parameters())
    cfg = model.spec.layer(0).attention
    assert modkit.count_params(model.spec) == sum(p.numel() for p in model.parameters())
    plain = cfg.model_copy(update={"head_gate": False})
    work = Workload(batch=2, new=3)
    assert _flops(cfg, SimpleNamespace(d_model=D), work)["g_proj"] == 2 * 6 * D * H
    assert "g_proj" not in _flops(plain, SimpleNamespace(d_model=D), work)


def test_the_contract_kit_passes_on_the_gated_form():
    results = check_component("attention", "mla", GATED)
    bad = {r.check: r.detail for r in results if r.status == "failed"}
    assert not bad, bad
    passed = {r.check for r in results if r.status == "passed"}
    assert {"kv_cache_decode", "causality", "flops", "param_count", "gradients"} <= passed
