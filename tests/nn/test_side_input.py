"""The ``side_input`` mixer and the sharing options it needs (Zamba2's hybrid layer): exact parameter counts with a
shared part (``share[].part``) and fused adapters (``adapter.fuse``), the layer equal to its formula over its own
parts, only the part tied, the fused A one tensor through materialising and reloading, cache bytes and declared
FLOPs of both mixers, and the errors naming the field."""

from __future__ import annotations

import copy

import pytest
import torch

import modkit
from modkit.analysis.cost import CostModel
from modkit.nn.build import cache_state_bytes_per_sequence, kv_cache_bytes_per_token

D, HEADS, HD, D_FF, RANK = 32, 4, 16, 48, 4
MAMBA = {"type": "mamba2", "d_state": 8, "head_dim": 8, "chunk_size": 4}
SIDE = {
    "type": "side_input",
    "mixer": MAMBA,
    "side_mixer": {"type": "mha", "n_heads": HEADS, "head_dim": HD},
    "side_ffn": {"type": "geglu", "d_ff": D_FF, "activation": "gelu"},
    "norm": {"type": "rmsnorm"},
}
ADAPTER = {"rank": RANK, "targets": ["q_proj", "gate", "up"], "fuse": [["gate", "up"]]}


def spec(share=None, **side) -> dict:
    """Four layers: Mamba-2 on 0 and 2, side_input on 1 and 3 (sharing their side block when ``share``)."""
    s = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 4,
        "max_seq_len": 64,
        "position": {"type": "rope"},
        "block": {"mixer": MAMBA, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
        "overrides": [{"layers": [1, 3], "mixer": {**SIDE, **side}}],
    }
    if share is not None:
        s["share"] = share
    return s


SHARED = [{"layers": [1, 3], "part": "attention.side", "adapter": ADAPTER}]


def built(s: dict, seed: int = 0) -> modkit.Model:
    return modkit.build(s, dtype=torch.float64, seed=seed).eval()


def ids(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(seed))


def _mamba_params() -> int:
    inner, heads, conv = 2 * D, 2 * D // 8, 2 * D + 2 * 8
    return D * (2 * inner + 2 * 8 + heads) + conv * 4 + conv + 3 * heads + inner + inner * D


def test_parameters_count_the_shared_side_block_once_and_every_use_its_adapters_and_projection():
    # mixer_norm (2d) + q, k, v [64, 64] + o [32, 64] + ffn_norm + gate, up, down
    side_block = 2 * D + 3 * (2 * D) * (HEADS * HD) + HEADS * HD * D + D + 3 * D * D_FF
    own = _mamba_params() + D + D * D  # the layer's mamba2, its input norm, the projection
    mamba_layer = _mamba_params() + D  # attn_norm + mamba2
    base = 2 * mamba_layer + 2 * (side_block + own) + 2 * 64 * D  # embedding, head (no final norm)
    assert modkit.count_params(spec()) == base
    # q's adapter (64 in, 64 out), and one A for gate and up (32 in) with their two Bs (48 out each)
    lora = RANK * (2 * D + HEADS * HD) + RANK * D + 2 * RANK * D_FF
    assert modkit.count_params(spec(SHARED)) == base - side_block + 2 * lora
    assert sum(p.numel() for p in built(spec(SHARED)).parameters()) == base - side_block + 2 * lora


def test_the_layer_computes_x_plus_mixer_of_norm_of_x_plus_the_projected_side_output():
    model = built(spec(SHARED))
    with torch.no_grad():  # B starts at 0: make the adapters act
        for m in model.modules():
            if hasattr(m, "lora_b"):
                m.lora_b.normal_(0, 0.1, generator=torch.Generator().manual_seed(4))
    x = ids()
    seen = {}
    hooks = [model.layers[i].register_forward_hook(lambda m, a, o, i=i: seen.update({i: (a, o)})) for i in (1, 3)]
    emb = {}
    hooks.append(model.layers[0].register_forward_pre_hook(lambda m, a: emb.update(e=a[0])))
    with torch.no_grad():
        model(x)
        for i in (1, 3):
            (h, inputs), (out, _) = seen[i]
            mix = model.layers[i].attention
            t = mix.side.mixer(mix.side.mixer_norm(torch.cat([h, emb["e"]], -1)), inputs)
            t = mix.side.ffn(mix.side.ffn_norm(t))
            want = h + mix.mixer(mix.input_norm(h + mix.proj(t)), inputs)
            assert torch.equal(out, want), i
    for hook in hooks:
        hook.remove()


def test_only_the_part_is_tied_and_the_fused_adapter_holds_one_a_after_reloading():
    model = built(spec(SHARED))
    one, three = model.layers[1].attention, model.layers[3].attention
    assert one.side.mixer.q_proj.weight is three.side.mixer.q_proj.weight
    assert one.side.ffn.down.weight is three.side.ffn.down.weight
    assert one.mixer.in_proj.weight is not three.mixer.in_proj.weight and one.proj.weight is not three.proj.weight
    assert (
        one.side.ffn.gate.lora_a is one.side.ffn.up.lora_a
        and one.side.ffn.gate.lora_a is not three.side.ffn.gate.lora_a
    )
    state = model.state_dict()
    assert "layers.1.attention.side.mixer.q_proj.weight" in state
    assert "layers.3.attention.side.mixer.q_proj.weight" not in state and "layers.3.attention.proj.weight" in state
    other = built(spec(SHARED), seed=7)
    other.load_state_dict(state, strict=True)
    x = ids()
    with torch.no_grad():
        assert torch.equal(other(x).logits, model(x).logits)
    o1 = other.layers[1].attention
    assert o1.side.ffn.gate.lora_a is o1.side.ffn.up.lora_a
    assert o1.side.mixer.q_proj.weight is other.layers[3].attention.side.mixer.q_proj.weight


def test_cached_decode_equals_the_full_forward():
    model = built(spec(SHARED))
    x = ids()
    with torch.no_grad():
        full = model(x).logits
        cache = model.new_cache(2, 16, dtype=torch.float64)
        steps = [model(x[:, :6], cache=cache).logits] + [
            model(x[:, t : t + 1], cache=cache).logits for t in range(6, 11)
        ]
    # the chunked scan and the decode step round differently in their exponentials (as without a side block);
    # a side attention missing its cached keys would be off by about 1e-2
    assert torch.allclose(torch.cat(steps, 1), full, rtol=0, atol=1e-7)


def test_cache_bytes_count_the_side_attention_of_every_use_and_the_mamba_state_of_every_layer():
    s = spec(SHARED)
    # keys and values of 4 heads of 16 per hybrid layer, float32
    assert kv_cache_bytes_per_token(s, "float32") == 2 * (2 * HEADS * HD * 4)
    model = built(s)
    layout = model.cache_layout()
    assert list(layout[1]) == ["attention.side.mixer", "attention.mixer"] and list(layout[0]) == ["attention"]
    per_mamba = layout[0]["attention"].bytes_per_sequence(torch.float32)
    assert cache_state_bytes_per_sequence(s, "float32") == 4 * per_mamba


def test_declared_flops_hold_the_projection_and_the_wider_attention_input():
    cost = CostModel(spec(SHARED))
    work = cost.workload("prefill", 10)
    layer = cost.flops_by_layer(work)[1]
    assert layer["mixer.proj"] == 2 * 10 * D * D
    assert layer["attention.q_proj"] == 2 * 10 * (2 * D) * (HEADS * HD)
    assert layer["attention.o_proj"] == 2 * 10 * (HEADS * HD) * D
    # q's adapter, and gate and up each computing A x (one A, counted per adapted layer as it runs)
    assert layer["adapter.lora"] == 2 * 10 * RANK * (4 * D) + 2 * (2 * 10 * RANK * (D + D_FF))


@pytest.mark.parametrize(
    "change, field, says",
    [
        ({"side_mixer": MAMBA}, "side_mixer", "'d_in' capability"),
        (
            {
                "side_ffn": {
                    "type": "moe",
                    "n_experts": 4,
                    "top_k": 2,
                    "router": {"type": "topk", "renormalize": True},
                    "expert": {"type": "swiglu", "d_ff": 8},
                }
            },
            "side_ffn",
            "auxiliary loss",
        ),
    ],
)
def test_a_side_block_that_cannot_be_built_is_refused_naming_the_field(change, field, says):
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(spec(**change))
    assert any(path.endswith(field) and says in msg for path, msg in err.value.errors), err.value.errors


def test_a_mixer_whose_rotated_width_differs_from_the_side_attentions_is_refused():
    # the layer's one rope is built for the side attention's 16-wide heads; MLA rotates 4 features per head (a shape
    # error in the first forward before) and a gqa of 8-wide heads would be turned at a 16-wide head's frequencies
    mla = {"type": "mla", "n_heads": 4, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4}
    mla.update(v_head_dim=8, latent_norm={"type": "rmsnorm"})
    for mixer, width in ((mla, 4), ({"type": "gqa", "n_heads": 4, "n_kv_heads": 2}, 8)):
        with pytest.raises(modkit.SpecError) as err:
            modkit.load_spec(spec(mixer=mixer))
        assert [p for p, _ in err.value.errors] == ["overrides[0].mixer.mixer"], err.value.errors
        msg = err.value.errors[0][1]
        assert f"head_dim = {width}" in msg and "head_dim = 16" in msg and "layers 1, 3" in msg, msg


def test_sharing_errors_name_the_part_and_the_fused_layers():
    bad_part = copy.deepcopy(SHARED)
    bad_part[0]["part"] = "attention.nothing"
    with pytest.raises(ValueError, match=r"share\[0\]\.part: 'attention.nothing' names no module of layer 1"):
        modkit.build(spec(bad_part), device="meta")
    bad_fuse = copy.deepcopy(SHARED)
    bad_fuse[0]["adapter"]["fuse"] = [["gate", "down"]]
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(spec(bad_fuse))
    assert any("fuse[0]" in path and "['down']" in msg for path, msg in err.value.errors), err.value.errors


def test_the_compose_guide_zamba2_fragment_validates_and_counts_the_block_once():
    import json
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "guides" / "compose.md").read_text()
    fragment = next(b for b in re.findall(r"```json\n(.*?)```", text, re.S) if "side_input" in b)
    s = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": 2560,
        "n_layers": 20,
        "max_seq_len": 64,
        "position": {"type": "none"},
        "block": {"mixer": {"type": "mamba2"}, "ffn": None, "norm": {"type": "rmsnorm"}, "placement": {"type": "pre"}},
        **json.loads("{" + fragment + "}"),
    }
    unshared = {k: v for k, v in s.items() if k != "share"}
    block = 5120 + 2560 + 3 * 5120 * 5120 + 5120 * 2560 + 3 * 2560 * 10240  # 2 norms, q k v (2d in), o, gate up down
    lora = 128 * 2560 + 2 * 128 * 10240  # one A for gate and up, a B each
    assert modkit.count_params(s) == modkit.count_params(unshared) - 2 * block + 3 * lora


# ------------------------------------------------------------------- own_norm under every placement


def _stream_seen_by_the_mixer(s: dict) -> dict:
    """Run ``s`` and keep layer 1's block input and output and its mixer's input and output (``"block"``,
    ``"out"``, ``"mixer"``, ``"mixed"``)."""
    model = built(s)
    seen = {"model": model}
    block = model.layers[1]
    block.register_forward_pre_hook(lambda m, a: seen.__setitem__("block", a[0]))
    block.register_forward_hook(lambda m, a, out: seen.__setitem__("out", out[0]))
    block.attention.register_forward_pre_hook(lambda m, a: seen.__setitem__("mixer", a[0]))
    block.attention.register_forward_hook(lambda m, a, out: seen.__setitem__("mixed", out))
    with torch.no_grad():
        model(ids())
    return seen


@pytest.mark.parametrize(
    "placement", [{"type": "pre"}, {"type": "parallel"}, {"type": "parallel", "shared_norm": False}]
)
def test_an_own_norm_mixer_reads_the_residual_stream_itself_under_pre_and_parallel(placement):
    # parallel's shared norm still feeds the ffn; the mixer that holds its own norm reads the stream unnormalised
    s = spec()
    s["block"]["ffn"] = s["overrides"][0]["ffn"] = {"type": "swiglu", "d_ff": D_FF}
    s["overrides"][0]["placement"] = placement
    seen = _stream_seen_by_the_mixer(s)
    assert torch.equal(seen["mixer"], seen["block"])


def test_post_keeps_its_norm_after_the_addition_with_an_own_norm_mixer():
    # post's attn_norm normalises x + mixer(x) (after the sublayer), not the mixer's input: it must stay a norm
    s = spec()
    s["overrides"][0]["placement"] = {"type": "post"}
    seen = _stream_seen_by_the_mixer(s)
    norm = seen["model"].layers[1].attn_norm
    assert torch.equal(seen["mixer"], seen["block"])
    assert sum(p.numel() for p in norm.parameters()) == D
    with torch.no_grad():
        want = norm(seen["block"] + seen["mixed"])
    assert torch.equal(seen["out"], want)
    assert not torch.allclose(seen["out"], seen["block"] + seen["mixed"])


def test_deepnorm_refuses_an_own_norm_mixer_naming_the_placement():
    s = spec()
    s["overrides"][0]["placement"] = {"type": "deepnorm"}
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(s)
    hits = [(p, m) for p, m in err.value.errors if "own_norm" in m]
    assert hits and hits[0][0] == "overrides[0].placement", err.value.errors
    assert "side_input" in hits[0][1] and "'pre'" in hits[0][1]


def test_shortcut_moe_hands_an_own_norm_mixer_the_stream_itself():
    s = spec()
    s["overrides"][0]["ffn"] = {"type": "swiglu", "d_ff": D_FF}
    s["overrides"][0]["placement"] = {"type": "shortcut-moe", "mixer": SIDE, "dense": {"type": "swiglu", "d_ff": 16}}
    model = built(s)
    block = model.layers[1]
    assert isinstance(block.attn_norm, torch.nn.Identity) and isinstance(block.attn_2_norm, torch.nn.Identity)
    seen = {}
    block.register_forward_pre_hook(lambda m, a: seen.__setitem__("block", a[0]))
    block.attention.register_forward_pre_hook(lambda m, a: seen.__setitem__("mixer", a[0]))
    with torch.no_grad():
        model(ids())
    assert torch.equal(seen["mixer"], seen["block"])


def test_a_parallel_hybrid_refuses_a_mixer_that_holds_its_own_norm():
    # the placement's norm reaches every mixer of a parallel hybrid: side_input would read a normalised stream
    s = spec()
    s["overrides"][0]["mixer"] = {"type": "parallel", "mixers": [MAMBA, SIDE]}
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(s)
    hits = [m for p, m in err.value.errors if p.endswith("mixers[1]")]
    assert hits and "'side_input'" in hits[0] and "own input" in hits[0], err.value.errors
