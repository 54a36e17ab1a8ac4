"""Dropout (spec ``dropout``): GPT-2 / nanoGPT semantics, off in eval, seeded, free when 0, honoured or refused."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from torch import nn

import modkit
from modkit.core.interfaces import dropout

from conftest import registry_with, tiny_spec

DROP = {"embedding": 0.1, "attention": 0.2, "residual": 0.3}


def _model(drop=None, **changes):
    spec = tiny_spec(**changes) if drop is None else tiny_spec(dropout=drop, **changes)
    return modkit.build(spec, seed=0)


def test_default_spec_has_no_dropout_module():
    model = _model()
    assert modkit.load_spec(tiny_spec()).dropout.model_dump() == {"embedding": 0.0, "attention": 0.0, "residual": 0.0}
    assert not any(isinstance(m, nn.Dropout) for m in model.modules())
    assert model.layers[0].attention.attention_dropout == 0.0


def test_modules_get_their_rates():
    model = _model(DROP)
    assert model.embed_dropout.p == 0.1
    assert all(block.drop.p == 0.3 for block in model.layers)
    assert all(block.attention.attention_dropout == 0.2 for block in model.layers)


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "reordered", "parallel"])
def test_eval_equals_the_model_without_dropout(placement):
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    plain = _model(block__placement={"type": placement}).eval()
    dropped = _model(DROP, block__placement={"type": placement}).eval()
    assert torch.equal(plain(ids).logits, dropped(ids).logits)
    dropped.train()
    torch.manual_seed(1)
    a = dropped(ids).logits
    torch.manual_seed(1)
    b = dropped(ids).logits
    assert torch.equal(a, b), "dropout draws from torch's global generator: the same seed gives the same masks"
    c = dropped(ids).logits
    assert not torch.allclose(a, c), "train mode with dropout on must be stochastic"


def test_embedding_dropout_rate_and_scale():
    model = _model({"embedding": 0.25})
    model.train()
    seen = {}
    model.embed_dropout.register_forward_hook(lambda m, i, o: seen.update(x=i[0], y=o))
    torch.manual_seed(0)
    model(torch.randint(0, 64, (8, 64)))
    x, y = seen["x"], seen["y"]
    dropped = (y == 0) & (x != 0)
    frac = dropped.float().mean().item()
    n = x.numel()
    assert abs(frac - 0.25) < 4 * (0.25 * 0.75 / n) ** 0.5  # binomial: 4 standard deviations
    kept = ~dropped
    torch.testing.assert_close(y[kept], x[kept] / 0.75)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_attention_dropout_is_unbiased(backend):
    """E[dropout(P) V] = P V: the mean over many draws approaches the eval output (inverted dropout)."""
    attn_cfg = {"type": "mha", "n_heads": 2, "backend": backend}
    model = _model({"attention": 0.5}, block__attention=attn_cfg)
    attn = model.layers[0].attention
    x = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(0))
    inputs = modkit.AttentionInputs(positions=torch.arange(6)[None])
    attn.eval()
    ref = attn(x, inputs)
    attn.train()
    torch.manual_seed(0)
    draws = torch.stack([attn(x, inputs) for _ in range(4000)])
    assert not torch.allclose(draws[0], ref)
    err = (draws.mean(0) - ref).abs().max().item()
    spread = draws.std(0).max().item() / 4000**0.5
    assert err < 5 * spread, (err, spread)


def test_residual_dropout_applies_to_each_sublayer_output():
    model = _model({"residual": 0.5})
    block = model.layers[0]
    block.train()
    calls = []
    block.drop.register_forward_hook(lambda m, i, o: calls.append((i[0], o)))
    torch.manual_seed(0)
    model(torch.randint(0, 64, (2, 8)))
    assert len(calls) == 2  # attention output and ffn output of the pre-norm block
    for x, y in calls:
        dropped = (y == 0) & (x != 0)
        assert 0.4 < dropped.float().mean().item() < 0.6
        torch.testing.assert_close(y[~dropped], x[~dropped] * 2)


def test_dropout_probabilities_are_validated():
    with pytest.raises(modkit.SpecError) as exc:
        modkit.load_spec(tiny_spec(dropout={"embedding": 1.0, "attention": -0.1, "residal": 0.1}))
    paths = [p for p, _ in exc.value.errors]
    assert "dropout.embedding" in paths and "dropout.attention" in paths and "dropout.residal" in paths
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        dropout(1.5)


def test_a_component_that_ignores_dropout_is_refused():
    """A placement without the residual_dropout capability would silently train without dropout."""

    class PlainConfig(modkit.ComponentConfig):
        type: Literal["plainpre"] = "plainpre"

    class PlainBlock(nn.Module):
        def __init__(self, ctx):
            super().__init__()
            self.attn_norm, self.attention = ctx.build(ctx.norm), ctx.attention
            self.ffn_norm, self.ffn = ctx.build(ctx.norm), ctx.ffn

        def forward(self, x, inputs):
            x = x + self.attention(self.attn_norm(x), inputs)
            h, aux = modkit.run_ffn(self.ffn, self.ffn_norm(x), inputs)
            return x + h, aux

    reg = registry_with(
        "plain",
        modkit.Component(
            kind="placement",
            type="plainpre",
            config=PlainConfig,
            factory=lambda c, ctx: PlainBlock(ctx),
            description="x",
        ),
    )
    spec = tiny_spec(block__placement={"type": "plainpre"})
    modkit.load_spec(spec, registry=reg)  # fine without dropout
    modkit.load_spec({**spec, "dropout": {"attention": 0.1}}, registry=reg)  # the attention applies that one
    with pytest.raises(modkit.SpecError) as exc:
        modkit.load_spec({**spec, "dropout": {"residual": 0.1}}, registry=reg)
    ((path, message),) = exc.value.errors
    assert path == "dropout.residual" and "plainpre" in message and "residual_dropout" in message


def test_hf_configs_carry_their_dropout():
    gpt2 = modkit.from_hf_config(
        {
            "model_type": "gpt2",
            "vocab_size": 64,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "embd_pdrop": 0.05,
            "attn_pdrop": 0.0,
            "resid_pdrop": 0.2,
        }
    )
    assert gpt2.dropout.model_dump() == {"embedding": 0.05, "attention": 0.0, "residual": 0.2}
    # transformers' GPT2Config defaults every probability to 0.1
    default = modkit.from_hf_config(
        {"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64}
    )
    assert default.dropout.model_dump() == {"embedding": 0.1, "attention": 0.1, "residual": 0.1}
    llama = modkit.from_hf_config(
        {
            "model_type": "llama",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "max_position_embeddings": 64,
            "attention_dropout": 0.1,
        }
    )
    assert llama.dropout.model_dump() == {"embedding": 0.0, "attention": 0.1, "residual": 0.0}
    with pytest.raises(modkit.SpecError, match="attn_pdrop"):
        modkit.from_hf_config(
            {
                "model_type": "gpt2",
                "vocab_size": 64,
                "n_embd": 32,
                "n_layer": 2,
                "n_head": 4,
                "n_positions": 64,
                "attn_pdrop": 1.5,
            }
        )


def test_hf_export_writes_dropout_back(tmp_path):
    spec = modkit.from_hf_config(
        {
            "model_type": "gpt2",
            "vocab_size": 64,
            "n_embd": 32,
            "n_layer": 2,
            "n_head": 4,
            "n_positions": 64,
            "embd_pdrop": 0.05,
            "attn_pdrop": 0.0,
            "resid_pdrop": 0.2,
        }
    )
    model = modkit.build(spec, seed=0)
    modkit.to_hf(model, tmp_path / "out")
    import json

    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (cfg["embd_pdrop"], cfg["attn_pdrop"], cfg["resid_pdrop"]) == (0.05, 0.0, 0.2)
    # a Llama config has no residual dropout: exporting one is refused, not silently dropped
    spec = tiny_spec(
        dropout={"residual": 0.1}, metadata={"hf_model_type": "llama"}, block__ffn={"type": "swiglu", "d_ff": 64}
    )
    with pytest.raises(modkit.CheckpointError, match="dropout"):
        modkit.to_hf(modkit.build(spec, seed=0), tmp_path / "llama")
