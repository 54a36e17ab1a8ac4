"""LongCat-Flash's parts: the ``shortcut-moe`` placement wired as its formula says, active parameters that count
zero-computation experts as holding nothing, ``mla``'s ``lora_scale`` and the ``longcat_flash`` converter's refusals.

The layer against transformers (logits, greedy decoding, export) is the ``longcat_flash`` fixture of
tests/plugins/hf/test_hf_types.py; the contract kit runs over ``placement/shortcut-moe`` in tests/testing.
"""

from __future__ import annotations

import pytest
import torch

import modkit

#: a tiny LongCat-Flash config (the harness fixture's sizes): 2 layers, 4 experts of 16 and 2 zero experts, top-3
TINY = dict(
    model_type="longcat_flash",
    vocab_size=97,
    hidden_size=32,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=48,
    q_lora_rank=24,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    head_dim=8,
    v_head_dim=12,
    n_routed_experts=4,
    zero_expert_num=2,
    moe_topk=3,
    expert_ffn_hidden_size=16,
    routed_scaling_factor=1.5,
    max_position_embeddings=64,
)
#: parameters of one routed expert: SwiGLU gate, up [32, 16] and down [16, 32]
PER_EXPERT = 3 * 32 * 16


def tiny(**changes):
    return modkit.from_hf_config({**TINY, **changes})


def _record(block: torch.nn.Module) -> dict:
    """Forward hooks on ``block`` and its parts: ``{name: (first input, output)}`` of the latest call."""
    seen: dict = {}
    names = ["", "attn_norm", "attention", "ffn_norm", "dense", "ffn", "attn_2_norm", "attention_2", "ffn_2_norm"]
    for name in names + ["dense_2"]:
        module = block.get_submodule(name)

        def hook(mod, args, out, name=name):
            seen[name] = (args[0], out[0] if isinstance(out, tuple) else out)

        module.register_forward_hook(hook)
    return seen


def test_block_is_wired_as_its_formula():
    """h1 = x + A1(N1 x); u = N2 h1; h2 = h1 + D1(u); h3 = h2 + A2(N3 h2); y = h3 + D2(N4 h3) + S(u), bit for bit."""
    model = modkit.build(tiny(), seed=3).eval()
    seen = _record(model.layers[1])
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        model(ids)
    x, y = seen[""]
    assert torch.equal(seen["attn_norm"][0], x)
    h1 = x + seen["attention"][1]
    assert torch.equal(seen["ffn_norm"][0], h1)
    u = seen["ffn_norm"][1]
    assert torch.equal(seen["ffn"][0], u) and torch.equal(seen["dense"][0], u)  # the shortcut reads D1's input
    h2 = h1 + seen["dense"][1]
    assert torch.equal(seen["attn_2_norm"][0], h2)
    h3 = h2 + seen["attention_2"][1]
    assert torch.equal(seen["ffn_2_norm"][0], h3)
    assert torch.equal(y, h3 + seen["dense_2"][1] + seen["ffn"][1])
    # the second attention keeps its own latent in the cache, beside the first's
    assert [sorted(layer) for layer in model.cache_layout()] == [["attention", "attention_2"]] * 2


def test_active_parameters_count_zero_experts_as_holding_nothing():
    """Active = total - per layer (n_experts - top_k) routed experts: a token's top_k choices hold at most top_k
    real experts, and a zero expert holds no parameter. By hand on the tiny model, at top_k above n_experts, and at
    LongcatFlashConfig's defaults (28 layers, 512 experts of 3 · 6144 · 2048, 256 zero experts, top-12)."""
    spec = tiny()
    total = modkit.count_params(spec)
    assert modkit.active_params_per_token(spec) == total - 2 * (4 - 3) * PER_EXPERT
    # top-5 of 4 experts + 2 zero experts: at most 4 real experts, so every parameter may serve a token
    assert modkit.active_params_per_token(tiny(moe_topk=5)) == modkit.count_params(tiny(moe_topk=5))
    big = modkit.from_hf_config({"model_type": "longcat_flash"})
    per_expert = 3 * 6144 * 2048
    assert modkit.count_params(big) == 560_664_958_976
    base = 560_664_958_976 - 28 * 512 * per_expert  # everything but the routed experts
    assert modkit.active_params_per_token(big) == base + 28 * 12 * per_expert == 32_182_654_976


def test_tokens_routed_to_zero_experts_use_fewer_parameters_than_the_bound():
    """Per token, by hand from the routing: the parameters outside the routed experts plus one expert per real choice
    in each layer; never above active_params_per_token, below it for a token that picked a zero expert."""
    model = modkit.build(tiny(), seed=5).eval()
    picks = []
    for block in model.layers:
        block.ffn.router.register_forward_hook(lambda mod, args, out: picks.append(out[1]))
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        model(ids)
    real = sum((p < 4).sum(-1) for p in picks)  # [tokens]: real experts chosen over both layers
    base = modkit.count_params(model) - 2 * 4 * PER_EXPERT
    per_token = base + real * PER_EXPERT
    bound = modkit.active_params_per_token(model)
    assert int(per_token.max()) <= bound == base + 2 * 3 * PER_EXPERT
    assert bool((real < 6).any())  # some token chose a zero expert, so it used less than the bound
    assert all(bool((p >= 4).any()) and bool((p < 4).any()) for p in picks)  # both kinds chosen in each layer


def test_lora_scale_needs_low_rank_queries():
    attention = {
        "type": "mla",
        "n_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 12,
        "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
        "lora_scale": True,
    }
    with pytest.raises(modkit.SpecError, match="lora_scale = true multiplies the queries .* q_lora_rank is null"):
        modkit.load_component("attention", attention)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"head_dim": 16}, "head_dim"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"qk_head_dim": 12}, "qk_head_dim"),
    ],
)
def test_converter_refuses_head_sizes_transformers_cannot_run(change, key):
    with pytest.raises(modkit.SpecError) as info:
        tiny(**change)
    assert any(path == key for path, _ in info.value.errors), info.value.errors


def test_num_hidden_layers_alone_counts_attention_sublayers():
    """transformers' num_hidden_layers is 2 · num_layers (one per attention sublayer): alone, it gives half as many
    blocks; export writes num_layers and the derived head sizes."""
    cfg = {k: v for k, v in TINY.items() if k != "num_layers"}
    spec = modkit.from_hf_config({**cfg, "num_hidden_layers": 6})
    assert spec.n_layers == 3
    weights = modkit.get_registry().hf_converter("longcat_flash").declaration.weights
    written = weights.hf_config(tiny(), {})
    assert (written["num_layers"], written["ffn_hidden_size"], written["expert_ffn_hidden_size"]) == (2, 48, 16)
    assert (written["head_dim"], written["qk_head_dim"], written["zero_expert_num"]) == (8, 16, 2)


def test_spec_refuses_a_second_mixer_the_position_scheme_cannot_rotate():
    """The layer's one position scheme rotates both mixers: a second mixer of another rotated width, or a block
    without a mixer, is refused at the placement, naming the layers (check_layer)."""
    data = tiny().to_dict()
    data["block"]["placement"]["mixer"]["qk_rope_head_dim"] = 4
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(data)
    [(path, msg)] = [e for e in info.value.errors if "position geometry" in e[1]]
    assert path == "block.placement.mixer" and msg.startswith("layers 0-1: ") and "(4, 4)" in msg, msg
    data = tiny().to_dict()
    data["overrides"] = [{"layers": [1], "attention": {"type": "none"}}]
    with pytest.raises(modkit.SpecError) as info:
        modkit.load_spec(data)
    assert any(p == "block.placement" and m.startswith("layers 1: ") for p, m in info.value.errors), info.value.errors


def test_cost_puts_the_placements_sublayers_in_the_layer_slots():
    """The cost model's mixer/FFN comparison sees both attentions as the layer's mixer and both dense FFNs beside the
    shortcut mixture as its FFN (the placement's Slot fields)."""
    from modkit.analysis.cost import _Recorder
    from modkit.analysis.layer_slots import layer_slots

    recorder = _Recorder(modkit.get_registry())
    model = modkit.build(tiny(), device="meta", registry=recorder)
    slots = layer_slots(model, recorder.records)
    for block in model.layers:
        assert [slots.get(id(getattr(block, n))) for n in ("attention", "attention_2")] == ["mixer", "mixer"]
        assert [slots.get(id(getattr(block, n))) for n in ("ffn", "dense", "dense_2")] == ["ffn"] * 3
        assert slots.get(id(block.attn_2_norm)) is None  # norms belong to no slot


def test_a_block_scope_stream_wraps_the_layer_and_decodes_as_the_full_forward():
    # Gemma 3n's AltUp around LongCat-Flash's layer: refused before ("does not declare the 'block_streams'
    # capability"), though every built-in placement is documented to declare it
    from modkit_plugins.altup import AltUpLink

    spec = tiny(num_layers=1).to_dict()
    spec["stream"] = {"type": "altup", "n_streams": 2, "layer_input_width": 8, "output_scale_init": 1.0}
    m = modkit.build(spec, seed=0).eval()
    assert isinstance(m.layers[0].stream_link, AltUpLink)
    ids = torch.randint(0, 97, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = m(ids).logits
        cache = m.new_cache(2, 5)
        steps = [m(ids[:, :3], cache=cache).logits] + [m(ids[:, i : i + 1], cache=cache).logits for i in (3, 4)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)
