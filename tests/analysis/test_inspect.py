"""modkit.inspect: named intermediate tensors through forward hooks on registry-tagged modules.

Shapes are exact, recorded values equal independent computations, the model's output is bitwise unchanged while
recording (and after), and nothing is left on the model once the ``with`` block is over.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import modkit
from modkit import AttentionInputs, Component, ComponentConfig
from modkit.analysis.inspection import POSITION_METHODS
from tests.conftest import SPECS, registry_with, tiny_spec

HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def left_behind(model: nn.Module) -> list[str]:
    """Every hook or wrapped method still attached to ``model`` or a submodule."""
    out = []
    for name, m in model.named_modules():
        out += [f"{name}.{d}" for d in HOOK_DICTS if getattr(m, d, None)]
        out += [f"{name}.{meth}" for meth in POSITION_METHODS if meth in vars(m)]
    return out


def build(spec, **kw):
    return modkit.build(spec, seed=0, **kw).eval()


def ids_for(model, batch=2, seq=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.spec.vocab_size, (batch, seq), generator=g)


VARIANTS = {
    "llama-like": tiny_spec(),
    "gpt2-like relu": tiny_spec(
        position={"type": "learned"},
        block__attention={"type": "mha", "n_heads": 4, "q_bias": True, "k_bias": True, "v_bias": True, "o_bias": True},
        block__ffn={"type": "mlp", "d_ff": 128, "activation": "relu"},
        block__norm={"type": "layernorm", "eps": 1e-5},
        final_norm={"type": "layernorm", "eps": 1e-5},
        tie_embeddings=True,
    ),
    "post alibi": tiny_spec(position={"type": "alibi"}, block__placement={"type": "post"}),
    "parallel sinusoidal": tiny_spec(position={"type": "sinusoidal"}, block__placement={"type": "parallel"}),
    "tiny-gemma": str(SPECS / "tiny-gemma.json"),
    "tiny-moe": str(SPECS / "tiny-moe.json"),
}


def test_every_stage_of_a_tiny_model_with_exact_shapes():
    model = build(tiny_spec())  # d_model 32, GQA 4 heads / 2 kv heads, head_dim 8, SwiGLU d_ff 64, RoPE, pre-norm
    with modkit.inspect(model) as rec:
        out = model(ids_for(model))
    layer0 = {
        "layers.0:input": (2, 6, 32),
        "layers.0.attn_norm:output": (2, 6, 32),
        "layers.0.attention.q_proj:output": (2, 6, 32),
        "layers.0.attention.k_proj:output": (2, 6, 16),
        "layers.0.attention.v_proj:output": (2, 6, 16),
        "layers.0.attention:q": (2, 4, 6, 8),
        "layers.0.attention:k": (2, 2, 6, 8),
        "layers.0.attention.o_proj:output": (2, 6, 32),
        "layers.0.attention:weights": (2, 4, 6, 6),
        "layers.0.attention:output": (2, 6, 32),
        "layers.0.ffn_norm:output": (2, 6, 32),
        "layers.0.ffn.gate:output": (2, 6, 64),
        "layers.0.ffn.up:output": (2, 6, 64),
        "layers.0.ffn:hidden": (2, 6, 64),
        "layers.0.ffn.down:output": (2, 6, 32),
        "layers.0.ffn:output": (2, 6, 32),
        "layers.0:output": (2, 6, 32),
        "layers.0:update": (2, 6, 32),
    }
    expected = {"embed:output": (2, 6, 32), **layer0}
    expected.update({k.replace("layers.0", "layers.1"): v for k, v in layer0.items()})
    expected.update({"final_norm:output": (2, 6, 32), "lm_head:output": (2, 6, 64)})
    assert rec.names() == list(expected)  # execution order; rope's embed is the identity, so no positions.0:embed
    assert {n: tuple(rec[n].shape) for n in rec} == expected
    assert rec.calls == 1 and rec.unavailable == {}
    assert torch.equal(rec["lm_head:output"], out.logits)
    assert set(rec.layer(1)) == {k[len("layers.0") :].lstrip(".") for k in layer0}
    assert rec.entry("layers.1.attention:q").kind == "position" and rec.entry("layers.1.attention:q").type == "rope"
    assert rec.entry("layers.1.attention:weights").layer == 1


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_bitwise_unchanged_and_nothing_left_behind(variant):
    model = build(VARIANTS[variant])
    ids = ids_for(model)
    before = model(ids).logits
    assert left_behind(model) == []
    with modkit.inspect(model) as rec:
        during = model(ids).logits
        assert left_behind(model) != []
    after = model(ids).logits
    assert torch.equal(before, during) and torch.equal(before, after)
    assert left_behind(model) == []
    assert all(f"layers.{i}:update" in rec for i in range(model.spec.n_layers))


def test_hooks_are_removed_when_the_forward_raises():
    model = build(tiny_spec())
    with pytest.raises(ValueError, match="input_ids must lie in"):
        with modkit.inspect(model):
            model(torch.tensor([[1, 2, 999]]))
    assert left_behind(model) == []


def test_sublayer_outputs_add_up_to_the_block_output():
    """Pre-norm: out = (x + attention) + ffn, computed from the recorded parts in the block's own order."""
    model = build(tiny_spec())
    with modkit.inspect(model) as rec:
        model(ids_for(model))
    for i in range(2):
        x = rec[f"layers.{i}:input"]
        out = (x + rec[f"layers.{i}.attention:output"]) + rec[f"layers.{i}.ffn:output"]
        assert torch.equal(rec[f"layers.{i}:output"], out)
        assert torch.equal(rec[f"layers.{i}:update"], rec[f"layers.{i}:output"] - x)
    assert torch.equal(rec["layers.1:input"], rec["layers.0:output"])


def test_embedding_and_position_equal_the_tables():
    model = build(VARIANTS["gpt2-like relu"])  # learned positions added to the embeddings
    ids = ids_for(model)
    with modkit.inspect(model) as rec:
        model(ids)
    emb = model.embed.weight[ids]
    assert torch.equal(rec["embed:output"], emb)
    assert torch.equal(rec["positions.0:embed"], emb + model.positions[0].weight[torch.arange(6)])
    assert torch.equal(rec["layers.0:input"], rec["positions.0:embed"])


def test_relu_ffn_hidden_is_the_activation_of_the_up_projection():
    model = build(VARIANTS["gpt2-like relu"])
    with modkit.inspect(model) as rec:
        model(ids_for(model))
    ffn = model.layers[0].ffn
    by_hand = torch.relu(ffn.up(rec["layers.0.ffn_norm:output"]))
    assert torch.equal(rec["layers.0.ffn:hidden"], by_hand)
    zeros = (by_hand == 0).float().mean().item()
    assert 0.3 < zeros < 0.7  # a random-init ReLU MLP zeroes about half its pre-activations


def test_attention_weights_equal_softmax_of_the_recorded_queries_and_keys():
    model = build(tiny_spec())  # GQA: 2 query heads share each key head
    with modkit.inspect(model) as rec:
        model(ids_for(model))
    q, k = rec["layers.0.attention:q"], rec["layers.0.attention:k"]
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 8**0.5
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    by_hand = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    torch.testing.assert_close(rec["layers.0.attention:weights"], by_hand, rtol=0, atol=1e-6)
    # and exactly what the attention's own eager path returns for the recorded input
    attn = model.layers[0].attention
    inputs = AttentionInputs(positions=torch.arange(6).expand(2, 6), position=model.positions[0])
    _, weights = attn.forward_with_weights(rec["layers.0.attn_norm:output"], inputs)
    assert torch.equal(rec["layers.0.attention:weights"], weights)
    # the rotated queries are the position scheme's rotation of the projected ones
    proj = rec["layers.0.attention.q_proj:output"].view(2, 6, 4, 8).transpose(1, 2)
    rotated, _ = model.positions[0].rotate(proj, proj[:, :2], torch.arange(6).expand(2, 6))
    assert torch.equal(q, rotated)


def test_alibi_bias_is_recorded_per_attention():
    model = build(VARIANTS["post alibi"])
    with modkit.inspect(model) as rec:
        model(ids_for(model, batch=1, seq=5))
    bias = rec["layers.1.attention:position_bias"]
    assert bias.shape == (1, 4, 5, 5)
    dist = (torch.arange(5)[:, None] - torch.arange(5)[None]).abs().float()
    slopes = torch.tensor([2 ** (-8 * (h + 1) / 4) for h in range(4)])
    torch.testing.assert_close(bias[0], -slopes[:, None, None] * dist, rtol=0, atol=0)


def test_include_selects_names_and_skips_the_weights_call(monkeypatch):
    model = build(tiny_spec())
    calls = []
    attn_cls = type(model.layers[0].attention)
    original = attn_cls.forward_with_weights
    monkeypatch.setattr(
        attn_cls, "forward_with_weights", lambda self, *a, **k: calls.append(1) or original(self, *a, **k)
    )
    with modkit.inspect(model, include=["layers.*:update", "final_norm:*"]) as rec:
        model(ids_for(model))
    assert rec.names() == ["layers.0:update", "layers.1:update", "final_norm:output"]
    assert calls == []
    with modkit.inspect(model, include=["layers.1.attention:weights"]) as rec:
        model(ids_for(model))
    assert rec.names() == ["layers.1.attention:weights"] and len(calls) == 1


def test_several_forwards_are_kept_in_order():
    model = build(tiny_spec())
    a, b = ids_for(model, seed=1), ids_for(model, seed=2)
    with modkit.inspect(model) as rec:
        model(a)
        model(b)
    assert rec.calls == 2
    assert [e.call for e in rec.entries if e.name == "embed:output"] == [0, 1]
    first, last = rec.all("embed:output")
    assert torch.equal(first, model.embed.weight[a]) and torch.equal(last, model.embed.weight[b])
    assert torch.equal(rec["embed:output"], last)


def test_dropout_draws_are_unchanged_by_the_weights_call():
    """In training mode the extra eager attention call runs on a forked RNG: the same seed gives the same output."""
    model = modkit.build(tiny_spec(dropout={"embedding": 0.1, "attention": 0.2, "residual": 0.1}), seed=0).train()
    ids = ids_for(model)
    torch.manual_seed(5)
    plain = model(ids).logits
    torch.manual_seed(5)
    with modkit.inspect(model) as rec:
        recorded = model(ids).logits
    assert torch.equal(plain, recorded) and "layers.0.attention:weights" in rec
    assert rec["layers.0.attention:weights"].requires_grad is False


def test_kv_cache_decoding_is_unchanged_and_weights_are_reported_missing():
    model = build(tiny_spec())
    ids = ids_for(model, batch=1, seq=5)

    def decode():
        cache = model.new_cache(1, 8)
        logits = [model(ids[:, :4], cache=cache).logits]
        logits.append(model(ids[:, 4:], cache=cache).logits)
        return logits

    plain = decode()
    with modkit.inspect(model) as rec:
        recorded = decode()
    assert all(torch.equal(a, b) for a, b in zip(plain, recorded))
    assert "KV cache" in rec.unavailable["layers.0.attention:weights"]
    assert [t.shape for t in rec.all("layers.0.attention:k")] == [(1, 2, 4, 8), (1, 2, 1, 8)]
    with pytest.raises(KeyError, match="not recorded: not recorded under a KV cache"):
        rec["layers.0.attention:weights"]


def test_meta_model_records_shapes_only():
    model = modkit.build(str(SPECS / "llama-3.1-8b.json"), device="meta")
    with modkit.inspect(model, include=["layers.0*", "embed:*"]) as rec:
        model(torch.zeros(1, 3, dtype=torch.long, device="meta"))
    assert rec["layers.0.attention:weights"].shape == (1, 32, 3, 3)
    assert rec["layers.0.attention:k"].shape == (1, 8, 3, 128)
    assert rec["layers.0.ffn:hidden"].shape == (1, 3, 14336)
    assert rec["embed:output"].is_meta


def test_unknown_name_suggests_close_matches():
    model = build(tiny_spec())
    with modkit.inspect(model) as rec:
        model(ids_for(model))
    with pytest.raises(KeyError, match="did you mean 'layers.0:update'"):
        rec["layers.0:updat"]
    with pytest.raises(TypeError, match="needs an nn.Module"):
        with modkit.inspect("model"):
            pass


# ------------------------------------------------------------------------------------------------ third-party


class FusedConfig(ComponentConfig):
    """A third-party attention: one fused qkv projection, no forward_with_weights."""

    type: str = "fused-test"
    n_heads: int = 4


class FusedAttention(nn.Module):
    def __init__(self, cfg, ctx):
        super().__init__()
        self.n_heads = self.n_kv_heads = cfg.n_heads
        self.head_dim = ctx.d_model // cfg.n_heads
        self.qkv = nn.Linear(ctx.d_model, 3 * ctx.d_model, bias=False)
        self.out = nn.Linear(ctx.d_model, ctx.d_model, bias=False)

    def forward(self, x, inputs):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = inputs.position.rotate(q, k, inputs.positions)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class StackedConfig(ComponentConfig):
    """A third-party FFN with its weights as bare parameters (no nn.Linear back to d_model)."""

    type: str = "stacked-test"
    d_ff: int = 48


class StackedFFN(nn.Module):
    def __init__(self, cfg, ctx):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(ctx.d_model, cfg.d_ff))
        self.w_out = nn.Parameter(torch.empty(cfg.d_ff, ctx.d_model))

    def init_weights(self, init):
        init.normal_(self.w_in)
        init.normal_(self.w_out)

    def forward(self, x):
        return torch.relu(x @ self.w_in) @ self.w_out


def test_third_party_components_record_what_exists_and_say_what_does_not():
    from typing import Literal

    attn_cfg = type(
        "FusedCfg", (FusedConfig,), {"__annotations__": {"type": Literal["fused-test"]}, "type": "fused-test"}
    )
    ffn_cfg = type(
        "StackedCfg", (StackedConfig,), {"__annotations__": {"type": Literal["stacked-test"]}, "type": "stacked-test"}
    )
    reg = registry_with(
        "inspect-test",
        Component(
            kind="attention",
            type="fused-test",
            config=attn_cfg,
            factory=FusedAttention,
            description="fused qkv",
            capabilities={"causal_safe": True},
        ),
        Component(kind="ffn", type="stacked-test", config=ffn_cfg, factory=StackedFFN, description="bare parameters"),
    )
    spec = tiny_spec(
        block__attention={"type": "fused-test", "n_heads": 4}, block__ffn={"type": "stacked-test", "d_ff": 48}
    )
    model = modkit.build(spec, registry=reg, seed=0).eval()
    ids = ids_for(model)
    plain = model(ids).logits
    with modkit.inspect(model, registry=reg) as rec:
        logits = model(ids).logits
    assert torch.equal(plain, logits) and left_behind(model) == []
    assert rec["layers.0.attention.qkv:output"].shape == (2, 6, 96)
    assert rec["layers.0.attention:q"].shape == (2, 4, 6, 8)  # through the position scheme's rotate
    assert rec["layers.0.ffn:output"].shape == (2, 6, 32)
    assert "returns_weights" in rec.unavailable["layers.0.attention:weights"]
    assert "no nn.Linear projecting back to d_model = 32" in rec.unavailable["layers.1.ffn:hidden"]
    assert "layers.0.attention:weights" not in rec and "layers.0.ffn:hidden" not in rec


def test_the_guide_example_runs():
    import re

    text = (SPECS.parent / "docs" / "guides" / "inspect.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the guide's own example, with its shape comments checked below
    assert namespace["update"].shape == (1, 12, 128)
    assert namespace["weights"].shape == (1, 4, 12, 12)
    assert namespace["q"].shape == (1, 4, 12, 32)
    assert namespace["hidden"].shape == (1, 12, 352)
    assert namespace["names"][0] == "embed:output"
