"""Assembly: meta-first build, deterministic init, tying (one tensor for embedding and head), forward
contract, input errors."""

import math

import pytest
import torch

import modkit
from modkit import CheckpointError
from tests.conftest import SPECS, tiny_spec


def test_meta_then_materialise_equals_direct_build():
    spec = tiny_spec()
    direct = modkit.build(spec, seed=3)
    meta = modkit.build(spec, device="meta")
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")
    meta.init_weights(3)
    a, b = direct.state_dict(), meta.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    bufs = dict(meta.named_buffers())
    assert bufs and all(torch.isfinite(t).all() for t in bufs.values())  # RoPE inv_freq recomputed
    assert not torch.equal(modkit.build(spec, seed=4).embed.weight, direct.embed.weight)


def test_tiny_forward_shapes_and_initial_loss():
    model = modkit.build(SPECS / "tiny-llama.json")
    ids = torch.randint(0, model.spec.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    out = model(ids)
    assert out.logits.shape == (2, 32, model.spec.vocab_size)
    assert out.aux_loss is None
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids.flatten())
    assert abs(loss.item() - math.log(model.spec.vocab_size)) < 0.1


def test_bfloat16_build_keeps_rope_tables_float32():
    model = modkit.build(tiny_spec(), dtype="bfloat16")
    assert model.embed.weight.dtype == torch.bfloat16
    assert model.positions[0].inv_freq.dtype == torch.float32
    out = model(torch.tensor([[1, 2, 3]]))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()


def test_c10_tying_survives_meta_init_load_cast_and_step():
    spec = tiny_spec(vocab_size=16, d_model=8, block__attention={"type": "mha", "n_heads": 2}, tie_embeddings=True)
    model = modkit.build(spec, device="meta")
    model.to_empty(device="cpu")
    model.init_weights(0)
    assert model.lm_head_weight is model.embed.weight
    emb_only = {k: v.clone() for k, v in model.state_dict().items()}
    assert "lm_head.weight" not in emb_only
    emb_only["embed.weight"] = torch.randn(16, 8)
    model.load_state_dict(emb_only)
    assert model.lm_head_weight is model.embed.weight
    assert torch.equal(model.lm_head_weight, emb_only["embed.weight"])
    model.to(torch.float64)
    assert model.lm_head_weight is model.embed.weight
    counted = modkit.breakdown(model)
    assert counted["lm_head"] == 0 and counted["embedding"] == 16 * 8
    assert counted["total"] == sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.tensor([[1, 2, 3, 4]])
    model(ids).logits.sum().backward()
    opt.step()
    assert model.lm_head_weight is model.embed.weight
    # a checkpoint holding the same head is accepted; a different head is an error, not an overwrite
    same = dict(model.state_dict(), **{"lm_head.weight": model.embed.weight.detach().clone()})
    model.load_state_dict(same)
    different = dict(model.state_dict(), **{"lm_head.weight": torch.zeros(16, 8, dtype=torch.float64)})
    with pytest.raises(CheckpointError, match="differs from 'embed.weight'"):
        model.load_state_dict(different)


def test_untied_head_is_separate_and_counted():
    model = modkit.build(tiny_spec(lm_head_bias=True), device="meta")
    b = modkit.breakdown(model)
    assert b["lm_head"] == 64 * 32 + 64
    assert b["embedding"] == 64 * 32


def test_cached_decode_equals_full_forward_with_left_padding():
    model = modkit.build(tiny_spec(), seed=5)
    ids = torch.randint(1, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0
    full = model(ids, attention_mask=mask).logits
    cache = model.new_cache(2, 9)
    prefill = model(ids[:, :4], attention_mask=mask[:, :4], cache=cache).logits
    steps = [model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=cache).logits for t in range(4, 9)]
    got = torch.cat([prefill] + steps, 1)
    assert torch.allclose(got[0], full[0], atol=1e-5)
    assert torch.allclose(got[1, 3:], full[1, 3:], atol=1e-5)
    assert cache.layers[0].only.k.shape == (2, 2, 9, 8)  # n_kv_heads = 2, never n_heads; static: max_len slots


def test_bad_inputs_give_clear_errors():
    model = modkit.build(tiny_spec())
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 64\); got min 0, max 64"):
        model(torch.tensor([[0, 64]]))
    with pytest.raises(ValueError, match="must be \\[batch, seq\\]"):
        model(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="attention_mask must be"):
        model(torch.tensor([[1, 2]]), attention_mask=torch.ones(1, 5))
    with pytest.raises(ValueError, match="unknown dtype"):
        modkit.build(tiny_spec(), dtype="float33")


def test_init_weights_reports_uninitialised_tensors():
    model = modkit.build(tiny_spec(), device="meta")
    model.to_empty(device="cpu")
    model.layers[0].register_buffer("stray", torch.empty(3))
    with pytest.raises(RuntimeError, match="layers.0.stray"):
        model.init_weights(0)


def test_count_params_matches_module_and_formula():
    spec = modkit.load_spec(tiny_spec())
    n = modkit.count_params(spec)
    model = modkit.build(spec, device="meta")
    assert n == sum(p.numel() for p in model.parameters())
    reg = modkit.get_registry()
    ctx = modkit.BuildContext(32, 2, 64, 64, reg)
    attn = reg.get("attention", "gqa").param_count(spec.block.attention, ctx)
    assert modkit.breakdown(spec)["attention"] == 2 * attn == 2 * (32 * 32 * 2 + 32 * 16 * 2)


def test_meta_build_of_large_spec_allocates_nothing():
    """A 70B spec builds on meta: every parameter and buffer is a meta tensor, and the count is exact (how fast
    that is belongs to benchmarks, not to a test's outcome)."""
    spec = modkit.load_spec(
        tiny_spec(
            vocab_size=128256,
            d_model=8192,
            n_layers=80,
            max_seq_len=8192,
            block__attention={"type": "gqa", "n_heads": 64, "n_kv_heads": 8},
            block__ffn={"type": "swiglu", "d_ff": 28672},
        )
    )
    model = modkit.build(spec, device="meta")
    assert all(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert modkit.count_params(model) == modkit.count_params(spec) == 70_553_706_496  # Llama-3-70B geometry, untied


def test_padding_stays_out_of_moe_aux_loss():
    import json

    spec = json.loads((SPECS / "tiny-moe.json").read_text())
    model = modkit.build(spec, seed=0)
    real = torch.randint(1, spec["vocab_size"], (1, 6), generator=torch.Generator().manual_seed(0))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), real], 1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 6)], 1)
    alone = model(real)
    both = model(padded, attention_mask=mask)
    assert torch.allclose(both.logits[:, 3:], alone.logits, atol=1e-5)
    assert torch.allclose(both.aux_loss, alone.aux_loss, atol=1e-6)


def test_embedding_position_is_built_once_whatever_the_overrides():
    spec = tiny_spec(
        position={"type": "learned"},
        overrides=[{"layers": [1], "attention": {"type": "mha", "n_heads": 2}}],
    )
    model = modkit.build(spec, device="meta")
    assert len(model.positions) == 1
    assert modkit.breakdown(model)["position"] == 64 * 32
