"""resize_vocab: old rows kept bitwise, new rows initialised as documented, tying kept, the spec follows, and the
resized model saves, loads and exports (transformers reads the export)."""

from __future__ import annotations

import warnings

import pytest
import torch

import modkit


def spec(tie: bool, head_bias: bool = False) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 40,
        "d_model": 16,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": {"type": "rope"},
        "block": {
            "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
        "tie_embeddings": tie,
        "lm_head_bias": head_bias,
    }


@pytest.mark.parametrize("tie,bias", [(True, False), (False, False), (False, True), (True, True)])
def test_grow_keeps_rows_ties_and_logits_of_old_tokens(tie, bias):
    model = modkit.build(spec(tie, bias), seed=0).eval()
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    logits = model(ids).logits
    assert modkit.resize_vocab(model, 48) is model
    assert model.spec.vocab_size == 48 and model.embed.weight.shape == (48, 16) and model.embed.num_embeddings == 48
    emb = model.embed.weight
    assert torch.equal(emb[:40], before["embed.weight"])
    torch.testing.assert_close(emb[40:], before["embed.weight"].mean(0).expand(8, 16), atol=0, rtol=0)
    if tie:
        assert model.lm_head_weight is model.embed.weight and "lm_head.weight" not in model.state_dict()
    else:
        assert torch.equal(model.lm_head.weight[:40], before["lm_head.weight"])
        torch.testing.assert_close(
            model.lm_head.weight[40:], before["lm_head.weight"].mean(0).expand(8, 16), atol=0, rtol=0
        )
        assert model.lm_head.out_features == 48
    bias_name = ("lm_head_bias" if tie else "lm_head.bias") if bias else None
    if bias_name:
        b = model.state_dict()[bias_name]
        assert b.shape == (48,) and torch.equal(b[:40], before[bias_name])
        torch.testing.assert_close(b[40:], before[bias_name].mean().expand(8), atol=0, rtol=0)
    with torch.no_grad():
        new = model(ids).logits
    assert new.shape == (2, 7, 48)
    torch.testing.assert_close(new[..., :40], logits, atol=1e-6, rtol=0)
    # every new token has one and the same logit: the mean row's
    assert torch.allclose(new[..., 40:], new[..., 40:41].expand(2, 7, 8))
    model(torch.tensor([[47, 3]]))  # new ids are accepted
    with pytest.raises(ValueError, match=r"\[0, 48\)"):
        model(torch.tensor([[48]]))


def test_normal_init_is_seeded_and_shrink_truncates():
    a = modkit.build(spec(False), seed=0).resize_vocab(50, init="normal", seed=3)
    b = modkit.build(spec(False), seed=0).resize_vocab(50, init="normal", seed=3)
    assert torch.equal(a.embed.weight, b.embed.weight) and torch.equal(a.lm_head.weight, b.lm_head.weight)
    assert abs(a.embed.weight[40:].std().item() - 0.02) < 0.01
    model = modkit.build(spec(True), seed=0)
    old = model.embed.weight.detach().clone()
    model.resize_vocab(30)
    assert torch.equal(model.embed.weight, old[:30]) and model.spec.vocab_size == 30
    assert model.lm_head_weight is model.embed.weight
    with pytest.raises(ValueError, match="positive integer"):
        model.resize_vocab(0)
    with pytest.raises(ValueError, match="'mean' or 'normal'"):
        model.resize_vocab(31, init="zeros")


def test_resized_model_trains_saves_and_loads(tmp_path):
    model = modkit.build(spec(True), seed=0)
    model.resize_vocab(44)
    loss = model(torch.tensor([[1, 43, 2]])).logits.logsumexp(-1).sum()
    loss.backward()
    assert model.embed.weight.grad.shape == (44, 16) and model.embed.weight.grad[43].abs().sum() > 0
    modkit.save(model, tmp_path / "ckpt")
    again = modkit.load(tmp_path / "ckpt")
    assert again.spec.vocab_size == 44 and again.spec.tie_embeddings
    for k, v in model.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("tie", [True, False])
def test_resized_hf_model_exports_and_transformers_agrees(tie, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.logging.set_verbosity_error()
        cfg = transformers.LlamaConfig(
            hidden_size=32,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            vocab_size=60,
            max_position_embeddings=64,
            tie_word_embeddings=tie,
        )
        torch.manual_seed(0)
        hf = transformers.AutoModelForCausalLM.from_config(cfg).eval()
        hf.save_pretrained(tmp_path / "hf")
    model = modkit.from_hf(tmp_path / "hf")
    model.resize_vocab(70)
    modkit.to_hf(model, tmp_path / "out")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert back.config.vocab_size == 70 and back.config.tie_word_embeddings == tie
    ids = torch.tensor([[1, 69, 5, 60, 2]])
    with torch.no_grad():
        torch.testing.assert_close(back(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
