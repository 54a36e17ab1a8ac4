"""LFM3's two component options against transformers 5.25 (``models/lfm3``): RoPE with ``partial_mode:
proportional`` (``_compute_proportional_rope_parameters`` with ``Lfm3RotaryEmbedding`` and its
``apply_rotary_pos_emb``) and the attention's per-head output gate (``output_gate_scope: head``, ``gate_bias``;
``Lfm3Attention``'s ``g_proj``); the bad combinations are refused by name."""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit
from modkit import BuildContext, Init

transformers = pytest.importorskip("transformers")
from transformers.models.lfm3 import modeling_lfm3  # noqa: E402


@pytest.fixture(scope="module")
def reg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.get_registry()


def _config(**kw):
    base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_hidden_layers=3)
    base.update(layer_types=["conv", "sliding_attention", "full_attention"], vocab_size=97, sliding_window=4)
    return transformers.Lfm3Config(**{**base, **kw})


def _rope(reg, spec, head_dim=16):
    cfg = modkit.load_component("position", spec, registry=reg)
    module = BuildContext(32, 1, 32, 64, reg, head_dim=head_dim).build(cfg)
    module.init_weights(Init(0, 0.02))
    return module


@pytest.mark.parametrize("factor", [None, 2.0])
def test_proportional_rope_rotates_as_transformers(reg, factor):
    """Base 1e6, half of a 16-wide head: pairs 0-3 turn at 1e6^(-2i/16) (divided by a linear factor), pairs 4-7
    (features 4-7 and 12-15) pass through bitwise; q and k equal transformers' rotation to float32 rounding."""
    params = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    scaling = None
    if factor is not None:
        params["factor"], scaling = factor, {"type": "linear", "factor": factor}
    hf_cfg = _config(rope_parameters={"full_attention": params, "sliding_attention": {"rope_type": "default"}})
    spec = {"type": "rope", "theta": 1e6, "partial_rotary": 0.5, "partial_mode": "proportional", "scaling": scaling}
    ours = _rope(reg, spec)
    expected = torch.tensor([1e6 ** (-2 * i / 16) / (factor or 1.0) for i in range(4)] + [0.0] * 4)
    assert torch.allclose(ours.inv_freq, expected, rtol=1e-6, atol=0)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    positions = torch.arange(3, 12).expand(2, 9)
    cos, sin = modeling_lfm3.Lfm3RotaryEmbedding(hf_cfg)(q, positions, "full_attention")
    hq, hk = modeling_lfm3.apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = ours.rotate(q, k, positions)
    assert torch.allclose(oq, hq, atol=1e-6, rtol=0) and torch.allclose(ok, hk, atol=1e-6, rtol=0)
    still = [*range(4, 8), *range(12, 16)]
    assert torch.equal(oq[..., still], q[..., still]) and torch.equal(ok[..., still], k[..., still])
    assert not torch.allclose(oq[..., :4], q[..., :4])


def test_proportional_rope_refusals(reg):
    """Only no scaling or a linear one; an even head; at least one turning pair."""
    bad = {"type": "rope", "partial_mode": "proportional", "scaling": {"type": "yarn", "factor": 4.0}}
    bad["scaling"]["original_max_seq_len"] = 64
    with pytest.raises(Exception, match="partial_mode 'proportional' takes no scaling or a linear one"):
        modkit.load_component("position", bad, registry=reg)
    cfg = modkit.load_component("position", {"type": "rope", "partial_mode": "proportional", "partial_rotary": 0.1})
    ctx = BuildContext(32, 1, 32, 64, reg, head_dim=15)
    assert cfg.check(ctx) == [
        ("partial_mode", "'proportional' pairs the two halves of the head, but head_dim = 15 is odd")
    ]
    ctx = BuildContext(32, 1, 32, 64, reg, head_dim=16)
    ((field, message),) = cfg.check(ctx)
    assert field == "partial_rotary" and "int(16 × 0.1) // 2 = 0 pairs" in message


def _gated(reg, **extra):
    spec = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "qk_norm": {"type": "rmsnorm", "eps": 1e-5}}
    spec.update({"output_gate": True, "output_gate_scope": "head", "gate_bias": False, **extra})
    cfg = modkit.load_component("attention", spec, registry=reg)
    return cfg, BuildContext(32, 1, 32, 64, reg).build(cfg)


def test_head_gate_attention_equals_lfm3_attention(reg):
    """Lfm3Attention (full layer, biases on q/k/v/o, g_proj [4, 32] without bias, QK-RMSNorm, proportional RoPE)
    against gqa with output_gate_scope head: the same weights give the same output; the gate has 4 · 32 weights."""
    from modkit.plugin import AttentionInputs

    torch.manual_seed(0)
    hf_cfg = _config(attention_bias=True, norm_eps=1e-5)
    hf_cfg._attn_implementation = "sdpa"
    hf = modeling_lfm3.Lfm3Attention(hf_cfg, layer_idx=2).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3)
    cfg, ours = _gated(reg, q_bias=True, k_bias=True, v_bias=True, o_bias=True)
    ours.eval()
    names = {"g_proj.weight": "gate_proj.weight", "q_norm.weight": "q_norm.weight", "k_norm.weight": "k_norm.weight"}
    theirs = {names.get(n, n): t for n, t in hf.state_dict().items()}
    ours.load_state_dict(theirs, strict=True)
    assert ours.gate_proj.weight.shape == (4, 32) and ours.gate_proj.bias is None
    rope = _rope(reg, {"type": "rope", "theta": 1e6, "partial_rotary": 0.5, "partial_mode": "proportional"})
    x = torch.randn(2, 7, 32)
    positions = torch.arange(7).expand(2, 7)
    cos, sin = modeling_lfm3.Lfm3RotaryEmbedding(hf_cfg)(x, positions, "full_attention")
    with torch.no_grad():
        expected, _ = hf(x, (cos, sin), None)
        got = ours(x, AttentionInputs(positions=positions, position=rope))
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    n = modkit.get_registry().get("attention", "gqa").param_count(cfg, BuildContext(32, 1, 32, 64, reg))
    assert n == sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())


def test_head_gate_refusals(reg):
    """The scope and the gate's bias need the gate."""
    base = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}
    with pytest.raises(Exception, match="output_gate_scope.*is 'head', but output_gate is false"):
        modkit.load_component("attention", {**base, "output_gate_scope": "head"}, registry=reg)
    with pytest.raises(Exception, match="gate_bias.*is False, but output_gate is false"):
        modkit.load_component("attention", {**base, "gate_bias": False}, registry=reg)
    cfg, _ = _gated(reg, q_bias=True)
    assert cfg.gate_has_bias is False
    cfg, module = _gated(reg, q_bias=True, gate_bias=None)
    assert cfg.gate_has_bias is True and module.gate_proj.bias.shape == (4,)


def test_lfm3_config_reads_and_writes_proportional_rope_and_the_head_gate():
    """``rope_type: proportional`` with a factor reads as ``partial_mode: proportional`` and a linear scaling, the
    sliding layers' default RoPE over the whole head (transformers ignores its partial_rotary_factor), and both are
    written back as transformers wrote them; ``use_attention_gate`` is the per-head gate without bias."""
    from modkit_plugins.hf.lfm3 import LFM3

    full = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5, "factor": 2.0}
    sliding = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    cfg = {"model_type": "lfm3", "num_hidden_layers": 4, "rope_parameters": {"full_attention": full}}
    cfg["rope_parameters"]["sliding_attention"] = sliding
    spec = modkit.from_hf_config(cfg)
    p2, p1 = spec.layer(2).position, spec.layer(0).position
    assert (p2.partial_mode, p2.partial_rotary, p2.scaling.type, p2.scaling.factor) == (
        "proportional",
        0.5,
        "linear",
        2,
    )
    assert p1 == p2  # a convolution layer carries the full layers' RoPE, which acts on nothing
    types = [spec.layer(i).attention.type for i in range(4)]
    assert types == ["short_conv", "short_conv", "gqa", "short_conv"]  # 4 layers: only layer 2 attends
    att = spec.layer(2).attention
    assert (att.output_gate, att.output_gate_scope, att.gate_has_bias) == (True, "head", False)
    written = LFM3.to_config(spec, {})
    assert written["rope_parameters"]["full_attention"] == {**full, "rope_theta": 1e6}
    assert written["use_attention_gate"] is True and written["use_sandwich_norm"] is True
    spec8 = modkit.from_hf_config({**cfg, "num_hidden_layers": 8})
    assert spec8.layer(4).attention.sliding_window == 256
    assert (spec8.layer(4).position.theta, spec8.layer(4).position.partial_rotary) == (1e4, 1.0)
    assert LFM3.to_config(spec8, {})["rope_parameters"]["sliding_attention"] == {
        "rope_type": "default",
        "rope_theta": 1e4,
    }


def test_proportional_rope_type_in_any_config_gives_transformers_logits(tmp_path):
    """transformers' rotary embeddings take ``rope_type: proportional`` in every type (``ROPE_INIT_FUNCTIONS``): a
    tiny Llama with it (a quarter of a 16-wide head's pairs turning, factor 2) loads with transformers' logits, and its
    export loads back in transformers with them too."""
    torch.manual_seed(0)
    rope_parameters = {"rope_type": "proportional", "rope_theta": 1e4, "partial_rotary_factor": 0.25, "factor": 2.0}
    cfg = transformers.LlamaConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        rope_parameters=rope_parameters,
        max_position_embeddings=64,
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = modkit.from_hf(tmp_path).eval()
    position = ours.spec.position
    assert (position.partial_mode, position.partial_rotary, position.scaling.factor) == ("proportional", 0.25, 2.0)
    ids = torch.randint(0, 97, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    got = getattr(got, "logits", got)
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    modkit.to_hf(ours, tmp_path / "back")  # written as rope_type proportional, which transformers reads the same
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert torch.allclose(back(ids).logits, expected, atol=1e-5, rtol=0)
