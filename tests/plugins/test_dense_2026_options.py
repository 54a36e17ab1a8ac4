"""Two options the 2026 dense models need, against their reference formulas.

* ``rope`` scaling ``ntk_alpha`` (Tencent Hunyuan): inverse frequencies ``1 / (theta · alpha^(d / (d - 2)))^(2i / d)``,
  written out here (the hunyuan_v1_moe fixture of tests/plugins/hf/test_hf_types.py checks it against transformers
  end to end);
* attention ``qk_norm_after_position``: the QK-norm applied to the rotated queries and keys, computed here step by
  step (projections, RoPE, RMSNorm, softmax attention), and refused without a per-head ``qk_norm``.
"""

from __future__ import annotations

import pytest
import torch

import modkit
from modkit_plugins.rope import RopeConfig, rope_inv_freq


def test_ntk_alpha_frequencies_equal_the_formula():
    d, theta, alpha = 16, 10000.0, 1000.0
    cfg = RopeConfig(theta=theta, scaling={"type": "ntk_alpha", "alpha": alpha})
    got = rope_inv_freq(d, cfg.theta, cfg.scaling).double()
    base = theta * alpha ** (d / (d - 2))
    want = torch.tensor([1.0 / base ** (2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-6, atol=0)
    plain = rope_inv_freq(d, theta * alpha ** (d / (d - 2)), None)
    assert torch.equal(rope_inv_freq(d, theta, cfg.scaling), plain)


def _spec(attention: dict) -> dict:
    return {
        "schema_version": 1,
        "name": "after",
        "vocab_size": 50,
        "d_model": 32,
        "n_layers": 1,
        "max_seq_len": 16,
        "position": {"type": "rope", "theta": 100.0},
        "block": {
            "attention": attention,
            "ffn": {"type": "swiglu", "d_ff": 48},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Half-split RoPE of ``x [b, h, s, d]`` at positions 0..s-1 (Su et al. 2021)."""
    d, s = x.shape[-1], x.shape[-2]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(s, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


@pytest.mark.parametrize("after", [False, True])
def test_qk_norm_after_position_normalises_the_rotated_heads(after):
    att = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"type": "rmsnorm"}}
    if after:
        att["qk_norm_after_position"] = True
    model = modkit.build(_spec(att), seed=0)
    layer = model.layers[0].attention
    with torch.no_grad():
        for norm in (layer.q_norm, layer.k_norm):  # a weight off its init, so the order shows
            norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0))
    q = layer.q_proj(x).view(1, 6, 4, 8).transpose(1, 2)
    k = layer.k_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    v = layer.v_proj(x).view(1, 6, 2, 8).transpose(1, 2)
    wq, wk = layer.q_norm.weight, layer.k_norm.weight
    if after:
        q, k = _rms(_rotate(q, 100.0), wq), _rms(_rotate(k, 100.0), wk)
    else:
        q, k = _rotate(_rms(q, wq), 100.0), _rotate(_rms(k, wk), 100.0)
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ k.transpose(-1, -2)) / 8**0.5 + torch.full((6, 6), float("-inf")).triu(1)
    want = layer.o_proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(1, 6, 32))
    inputs = modkit.AttentionInputs(positions=torch.arange(6)[None], position=model.positions[model.layer_position[0]])
    with torch.no_grad():
        got = layer(x, inputs)
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize(
    "extra,says",
    [
        ({}, "qk_norm is null"),
        ({"qk_norm": {"type": "rmsnorm"}, "qk_norm_scope": "full"}, "needs qk_norm_scope 'head'"),
    ],
)
def test_qk_norm_after_position_needs_a_per_head_norm(extra, says):
    att = {"type": "mha", "n_heads": 4, "qk_norm_after_position": True, **extra}
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(_spec(att))
    assert any("qk_norm_after_position" in p and says in m for p, m in info.value.errors), info.value.errors
