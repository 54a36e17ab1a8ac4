"""The attention's ``clip_qkv`` (DBRX): the q, k and v projections clamped before the heads are formed, against a
direct computation (fixed weights, float32), and the contract kit on a clipped attention. The converted DBRX model's
parity with transformers runs in ``tests/plugins/hf/test_hf_types.py``."""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit import BuildContext
from modkit.spec import load_component


def _attention(clip):
    cfg = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "clip_qkv": clip}
    a = BuildContext(32, 1, 64, 64, modkit.get_registry()).build(load_component("attention", cfg))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return a


def test_clip_qkv_equals_a_direct_computation():
    a = _attention(0.5)
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(1))
    q, k, v = (p(x).clamp(-0.5, 0.5) for p in (a.q_proj, a.k_proj, a.v_proj))
    assert (a.q_proj(x).abs() > 0.5).float().mean() > 0.3  # the clamp binds on most features

    def heads(t, n):
        return t.view(2, 6, n, 8).transpose(1, 2)

    q, k, v = heads(q, 4), heads(k, 2).repeat_interleave(2, dim=1), heads(v, 2).repeat_interleave(2, dim=1)
    scores = (q @ k.transpose(-1, -2)) / 8**0.5
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    want = a.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 6, 32))
    got = a(x, modkit.AttentionInputs(positions=torch.arange(6).expand(2, 6)))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_clip_qkv_must_be_positive():
    with pytest.raises(modkit.SpecError, match="clip_qkv"):
        load_component("attention", {"type": "mha", "n_heads": 4, "clip_qkv": 0})


def test_the_kit_passes_a_clipped_attention():
    from modkit.testing import check_component

    results = check_component("attention", "gqa", {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "clip_qkv": 0.5})
    failed = [f"{r.check}: {r.detail}" for r in results if r.status == "failed"]
    assert not failed, failed
