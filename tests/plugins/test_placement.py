"""Placements: each builds and runs, one layer equals its formula, norm counts per block are exact."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import modkit
from modkit import AttentionInputs, BuildContext, Init

ATOL = 1e-5
D = 16

#: placement config -> names of the norms the block owns
NORMS = {
    "pre": ["attn_norm", "ffn_norm"],
    "post": ["attn_norm", "ffn_norm"],
    "sandwich": ["attn_norm", "attn_post_norm", "ffn_norm", "ffn_post_norm"],
    "reordered": ["attn_post_norm", "ffn_post_norm"],
    "parallel": ["attn_norm"],
    "parallel-separate": ["attn_norm", "ffn_norm"],
    "pre-no-residual": ["attn_norm", "ffn_norm"],
    "deepnorm": ["attn_norm", "ffn_norm"],
}
CONFIGS = {
    "pre": {"type": "pre"},
    "post": {"type": "post"},
    "sandwich": {"type": "sandwich"},
    "reordered": {"type": "reordered"},
    "parallel": {"type": "parallel"},
    "parallel-separate": {"type": "parallel", "shared_norm": False},
    "pre-no-residual": {"type": "pre-no-residual"},
    "deepnorm": {"type": "deepnorm", "attn_alpha": 2.5, "attn_beta": 0.75, "ffn_alpha": 1.5, "ffn_beta": 1.25},
}


def formula(name: str, b: nn.Module, x: torch.Tensor, inputs: AttentionInputs, ffn=None) -> torch.Tensor:
    """The placement's equation written out with the block's own submodules (``ffn`` replaces ``b.ffn``)."""
    attn = lambda h: b.attention(h, inputs)  # noqa: E731
    ffn = ffn or b.ffn
    if name == "pre":
        x = x + attn(b.attn_norm(x))
        return x + ffn(b.ffn_norm(x))
    if name == "post":
        x = b.attn_norm(x + attn(x))
        return b.ffn_norm(x + ffn(x))
    if name == "sandwich":
        x = x + b.attn_post_norm(attn(b.attn_norm(x)))
        return x + b.ffn_post_norm(ffn(b.ffn_norm(x)))
    if name == "reordered":
        x = x + b.attn_post_norm(attn(x))
        return x + b.ffn_post_norm(ffn(x))
    if name == "parallel":
        return x + attn(b.attn_norm(x)) + ffn(b.attn_norm(x))
    if name == "parallel-separate":
        return x + attn(b.attn_norm(x)) + ffn(b.ffn_norm(x))
    if name == "pre-no-residual":
        x = attn(b.attn_norm(x))
        return ffn(b.ffn_norm(x))
    if name == "deepnorm":  # MiniMax's decoder layer: the residual is the normalised stream
        h = b.attn_norm(x)
        x = 2.5 * h + 0.75 * attn(h)
        h = b.ffn_norm(x)
        return 1.5 * h + 1.25 * ffn(h)
    raise KeyError(name)


@pytest.fixture(scope="module")
def reg():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.get_registry()


def spec(placement: dict, norm: dict | None = None, position: dict | None = None) -> dict:
    return {
        "schema_version": 1,
        "vocab_size": 32,
        "d_model": D,
        "n_layers": 2,
        "max_seq_len": 64,
        "position": position or {"type": "rope"},
        "block": {
            "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
            "ffn": {"type": "swiglu", "d_ff": 32},
            "norm": norm or {"type": "layernorm"},
            "placement": placement,
        },
        "final_norm": {"type": "rmsnorm"},
    }


def randomise_norms(model: nn.Module, seed: int = 0) -> None:
    """Give every norm distinct weights so that using the wrong norm is detected."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if getattr(m, "modkit_kind", None) == "norm":
                for p in m.parameters(recurse=False):
                    p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_entry(reg, name):
    e = reg.get("placement", CONFIGS[name]["type"])
    assert e.kind == "placement" and e.capabilities["compile_safe"] is True
    assert e.description and e.reference


@pytest.mark.parametrize("name", list(CONFIGS))
def test_builds_runs_and_backpropagates(reg, name):
    model = modkit.build(spec(CONFIGS[name]), registry=reg)
    ids = torch.randint(0, 32, (2, 7), generator=torch.Generator().manual_seed(0))
    out = model(ids)
    assert out.logits.shape == (2, 7, 32) and out.logits.isfinite().all()
    assert out.aux_loss is None
    out.logits.float().pow(2).mean().backward()
    for n, p in model.named_parameters():
        if n.startswith("layers."):
            assert p.grad is not None and p.grad.abs().sum() > 0, n
    block = model.layers[0]
    owned = sorted(n for n, m in block.named_children() if getattr(m, "modkit_kind", None) == "norm")
    assert owned == sorted(NORMS[name])
    assert block.attention.modkit_kind == "attention" and block.ffn.modkit_kind == "ffn"


@pytest.mark.parametrize("name", list(CONFIGS))
def test_layer_equals_formula(reg, name):
    model = modkit.build(spec(CONFIGS[name]), registry=reg, seed=1)
    randomise_norms(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 6, D, generator=g)
    positions = torch.arange(6).expand(2, 6)
    with torch.no_grad():
        for i, block in enumerate(model.layers):
            inputs = AttentionInputs(positions=positions, position=model.positions[model.layer_position[i]])
            y, aux = block(x, inputs)
            assert aux is None
            torch.testing.assert_close(y, formula(name, block, x, inputs), atol=ATOL, rtol=0)
        # the whole model is the chain of blocks
        ids = torch.randint(0, 32, (2, 6), generator=g)
        h = model.positions[0].embed(model.embed(ids), positions)
        inputs = AttentionInputs(positions=positions)
        for i, block in enumerate(model.layers):
            h = formula(name, block, h, inputs.for_layer(model.positions[model.layer_position[i]], None))
        logits = model.final_norm(h) @ model.lm_head.weight.T
        torch.testing.assert_close(model(ids).logits, logits, atol=ATOL, rtol=0)


def test_placements_differ(reg):
    """Same weights, different placement: different outputs (the formulas are not accidentally the same)."""
    ids = torch.randint(0, 32, (1, 6), generator=torch.Generator().manual_seed(3))
    outs = {}
    for name in ("pre", "post", "sandwich", "reordered", "parallel", "pre-no-residual", "deepnorm"):
        model = modkit.build(spec(CONFIGS[name]), registry=reg, seed=0)
        with torch.no_grad():
            outs[name] = model(ids).logits
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b], atol=1e-4), (a, b)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(
    "norm, per_norm",
    [({"type": "layernorm"}, 2 * D), ({"type": "rmsnorm"}, D), ({"type": "layernorm", "bias": False}, D)],
)
def test_norm_parameter_count(reg, name, norm, per_norm):
    counts = modkit.breakdown(spec(CONFIGS[name], norm=norm), registry=reg)
    final = D  # rmsnorm final norm
    assert counts["norm"] == 2 * len(NORMS[name]) * per_norm + final
    assert "other" not in counts
    assert counts["total"] == modkit.count_params(spec(CONFIGS[name], norm=norm), registry=reg)


def test_parallel_shared_norm_defaults_true(reg):
    s = modkit.load_spec(spec({"type": "parallel"}), registry=reg)
    assert s.block.placement.shared_norm is True
    model = modkit.build(s, registry=reg)
    assert model.layers[0].ffn_norm is None
    with pytest.raises(modkit.SpecError):
        modkit.load_spec(spec({"type": "parallel", "shared": True}), registry=reg)


class _AuxFFN(nn.Module):
    """An ffn returning (out, aux) like an MoE: out = 2x, aux = sum(x)."""

    def forward(self, x):
        return 2 * x, x.sum()


class _AddAttention(nn.Module):
    """A stand-in attention: x + 1 (checks the placement passes inputs through)."""

    n_heads, n_kv_heads, head_dim = 1, 1, D

    def __init__(self):
        super().__init__()
        self.seen = None

    def forward(self, x, inputs):
        self.seen = inputs
        return x + 1


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ffn_aux_loss_is_returned(reg, name):
    norm_cfg = reg.get("norm", "rmsnorm").config()
    ctx = BuildContext(D, 1, 32, 64, reg, layer_index=0, attention=_AddAttention(), ffn=_AuxFFN(), norm=norm_cfg)
    block = ctx.build(reg.get("placement", CONFIGS[name]["type"]).config(**CONFIGS[name]))
    for m in block.modules():
        if hasattr(type(m), "init_weights"):
            m.init_weights(Init(0, 0.02))
    x = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))
    inputs = AttentionInputs(positions=torch.arange(3).expand(2, 3))
    y, aux = block(x, inputs)
    assert block.attention.seen is inputs
    torch.testing.assert_close(y, formula_aux(name, block, x, inputs)[0], atol=ATOL, rtol=0)
    torch.testing.assert_close(aux, formula_aux(name, block, x, inputs)[1], atol=1e-4, rtol=1e-6)


def formula_aux(name, b, x, inputs):
    """Like :func:`formula` with an ffn returning ``(out, aux)``: the aux is that of the ffn's input."""
    seen = []

    def ffn(h):
        out, aux = b.ffn(h)
        seen.append(aux)
        return out

    y = formula(name, b, x, inputs, ffn=ffn)
    assert len(seen) == 1
    return y, seen[0]


@pytest.mark.parametrize("name", ["pre", "post", "sandwich", "reordered", "parallel", "pre-no-residual", "deepnorm"])
def test_example_config_validates(reg, name):
    e = reg.get("placement", name)
    s = modkit.load_spec(spec(e.example_config()), registry=reg)
    assert s.block.placement.type == name


def test_pre_no_residual_equals_a_hand_computation(reg):
    """``pre-no-residual`` on a 2-token, width-4 input with stand-in sublayers (attention: h + 1, ffn: 2h) and
    LayerNorms of known weights, against the block written out by hand: no residual adds anywhere."""
    d = 4
    norm_cfg = reg.get("norm", "layernorm").config(eps=1e-5)
    ctx = BuildContext(d, 1, 32, 64, reg, layer_index=0, attention=_AddAttention(), ffn=_AuxFFN(), norm=norm_cfg)
    block = ctx.build(reg.get("placement", "pre-no-residual").config())
    with torch.no_grad():
        block.attn_norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
        block.attn_norm.bias.copy_(torch.tensor([0.0, 0.1, -0.2, 0.3]))
        block.ffn_norm.weight.copy_(torch.tensor([0.5, 1.0, 1.5, 2.0]))
        block.ffn_norm.bias.copy_(torch.zeros(d))
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [0.0, -1.0, 1.0, 2.0]]])

    def layernorm(v, w, b):
        mean = sum(v) / len(v)
        var = sum((e - mean) ** 2 for e in v) / len(v)
        return [(e - mean) / (var + 1e-5) ** 0.5 * wi + bi for e, wi, bi in zip(v, w, b)]

    expected = []
    for row in x[0].tolist():
        h = [e + 1 for e in layernorm(row, [1.0, 2.0, 0.5, -1.0], [0.0, 0.1, -0.2, 0.3])]  # attention(attn_norm(x))
        expected.append([2 * e for e in layernorm(h, [0.5, 1.0, 1.5, 2.0], [0.0] * d)])  # ffn(ffn_norm(h))
    inputs = AttentionInputs(positions=torch.arange(2).expand(1, 2))
    y, aux = block(x, inputs)
    torch.testing.assert_close(y, torch.tensor([expected]), atol=1e-5, rtol=0)
    assert float(aux) == pytest.approx(
        float(block.ffn_norm(block.attention(block.attn_norm(x), inputs)).sum()), abs=1e-5
    )
    # the same block as pre-norm differs by exactly the residual adds
    pre = ctx.build(reg.get("placement", "pre").config())
    pre.load_state_dict(block.state_dict())
    h = x + block.attention(block.attn_norm(x), inputs)
    torch.testing.assert_close(pre(x, inputs)[0], h + 2 * block.ffn_norm(h), atol=1e-5, rtol=0)
    assert not torch.allclose(pre(x, inputs)[0], y, atol=1e-3)


def test_pre_no_residual_says_it_is_an_ablation(reg):
    e = reg.get("placement", "pre-no-residual")
    assert e.description.startswith("Ablation, not for real models")
    assert "1512.03385" in e.reference
    doc = type(modkit.build(spec({"type": "pre-no-residual"}), registry=reg).layers[0]).__doc__
    assert "not a placement for real models" in " ".join(doc.split())


# ------------------------------------------------------------------------------------------------ names and aliases


def test_placement_names_follow_the_literature(reg):
    """Peri-LN (Kim et al. 2025) is the norm on both sides of a sublayer (sandwich); OLMo 2's output-only norm is
    ``reordered``; aliases are not second components."""
    assert reg.types("placement") == [
        "deepnorm",
        "parallel",
        "post",
        "pre",
        "pre-no-residual",
        "reordered",
        "sandwich",
        "shortcut-moe",
    ]
    assert reg.aliases("placement") == {"olmo2": "reordered", "peri": "sandwich"}
    assert reg.get("placement", "peri") is reg.get("placement", "sandwich")
    assert reg.get("placement", "olmo2") is reg.get("placement", "reordered")
    assert "2502.02732" in reg.get("placement", "sandwich").reference
    assert "2501.00656" in reg.get("placement", "reordered").reference


def test_alias_validates_as_its_type_and_saves_under_it(reg):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = modkit.load_spec(spec({"type": "olmo2"}), registry=reg)  # a plain alias: no warning
    assert s.block.placement.type == "reordered"
    assert s.to_dict()["block"]["placement"] == {"type": "reordered", "residual_multiplier": 1.0}
    assert modkit.count_params(s, registry=reg) == modkit.count_params(spec({"type": "reordered"}), registry=reg)


def test_peri_means_peri_ln_and_warns_about_the_old_meaning(reg):
    with pytest.warns(modkit.SpecWarning, match="'peri' is read as 'sandwich'.*'reordered'"):
        s = modkit.load_spec(spec({"type": "peri"}), registry=reg)
    assert s.block.placement.type == "sandwich"
    with pytest.warns(modkit.SpecWarning):
        model = modkit.build(spec({"type": "peri"}), registry=reg, seed=0)
    assert sorted(n for n, m in model.layers[0].named_children() if "norm" in n) == sorted(NORMS["sandwich"])
    # an override and a nested load_component resolve the alias the same way
    with pytest.warns(modkit.SpecWarning):
        cfg = modkit.load_component("placement", {"type": "peri"}, registry=reg)
    assert cfg.type == "sandwich"


def test_cli_lists_and_shows_aliases_as_aliases(capsys):
    from modkit.cli import main

    assert main(["list", "placement"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[:2] for line in out.splitlines()[1:]]
    assert [t for _, t in rows if t in ("peri", "olmo2", "reordered", "sandwich")] == [
        "reordered",
        "olmo2",
        "sandwich",
        "peri",
    ]
    assert "alias of sandwich" in out and "alias of reordered" in out
    assert main(["show", "placement", "peri"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("placement/sandwich") and "'peri' is an alias of 'sandwich'" in out
    assert "arXiv:2502.02732" in out and "Peri-LN" in out
    assert main(["show", "placement", "reordered"]) == 0
    out = capsys.readouterr().out
    assert "aliases: olmo2" in out and "arXiv:2501.00656" in out
