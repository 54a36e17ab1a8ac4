"""Weight-only bfloat16 and int8 decoding (``generate(weights=...)``, ``modkit generate --weights``): the stored
bytes, agreement with float32 decoding on a tiny model, and the refusal of unknown formats."""

import pytest
import torch

import modkit
from modkit.core.errors import ArgumentError
from modkit.inference.generate import GenerationRequest, generate
from modkit.inference.weights import (
    BFloat16Linear,
    Int8Linear,
    linear_weight_bytes,
    quantize_int8,
    quantize_linears,
    weight_format,
)

from conftest import tiny_spec

#: greedy tokens that must agree with float32 on the tiny model (fixed seed, deterministic kernels; random weights
#: give near-tied logits, so bfloat16 with an untied head departs after 17 new tokens: not a bound of the scheme)
AGREE = 16


def _model(**overrides):
    return modkit.build(tiny_spec(**overrides), seed=0).eval()


def _prompt():
    return torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(3))


def test_int8_rounds_each_row_to_its_absmax_scale():
    w = torch.tensor([[0.5, -1.27, 0.0], [0.0, 0.0, 0.0], [2.54, 1.0, -0.01]])
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert torch.allclose(scale, torch.tensor([0.01, 1.0, 0.02]))
    assert q.tolist() == [[50, -127, 0], [0, 0, 0], [127, 50, 0]]
    w = torch.randn(32, 48, generator=torch.Generator().manual_seed(0))
    q, scale = quantize_int8(w)
    assert bool(((q.float() * scale[:, None] - w).abs() <= scale[:, None] / 2 + 1e-7).all())


def test_int8_linear_matches_its_dequantized_product():
    lin = torch.nn.Linear(64, 40, bias=True)
    torch.nn.init.normal_(lin.weight, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2))
    layer = Int8Linear.from_linear(lin)
    with torch.no_grad():
        ref = x @ (layer.weight_int8.float() * layer.scale[:, None]).t() + lin.bias
        y = layer(x)
    assert y.shape == (3, 5, 40) and y.dtype == torch.float32
    # bfloat16 input and output: relative error of a few bfloat16 ulps (2**-8) of the output's scale
    assert float((y - ref).abs().max()) <= 2**-6 * float(ref.abs().max())


@pytest.mark.parametrize("in_features, rows", [(24, 10), (8, 10), (12, 1), (100, 3), (33, 1)])
def test_int8_linear_with_a_width_the_packed_kernel_cannot_take_matches_its_dequantized_product(in_features, rows):
    """torch's CPU int8 kernel reads input widths in blocks of 16: for other widths it crashes the process or
    returns wrong numbers (24 inputs, 10 rows: a segmentation fault; 12 inputs, 1 row: wrong values), so those
    layers dequantize."""
    lin = torch.nn.Linear(in_features, 16, bias=False)
    torch.nn.init.normal_(lin.weight, generator=torch.Generator().manual_seed(1))
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(2))
    layer = Int8Linear.from_linear(lin)
    with torch.no_grad():
        ref = x @ (layer.weight_int8.float() * layer.scale[:, None]).t()
        y = layer(x)
    assert float((y - ref).abs().max()) <= 2**-6 * float(ref.abs().max())


def test_int8_weight_bytes_are_a_quarter_of_float32():
    model = _model(tie_embeddings=False)
    before = linear_weight_bytes(model)
    n_linear = sum(m.weight.nelement() for m in model.modules() if isinstance(m, torch.nn.Linear))
    rows = sum(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert before == {"weights": 4 * n_linear, "scales": 0}
    assert quantize_linears(model, "int8") == sum(isinstance(m, Int8Linear) for m in model.modules()) > 0
    after = linear_weight_bytes(model)
    assert after == {"weights": n_linear, "scales": 4 * rows}
    assert 4 * after["weights"] == before["weights"]
    assert isinstance(model.lm_head, Int8Linear)  # the untied head is quantized; the embedding is not
    assert model.embed.weight.dtype == torch.float32
    assert quantize_linears(model, "int8") == 0  # idempotent


def test_bfloat16_weight_bytes_are_half_of_float32():
    model = _model()
    before = linear_weight_bytes(model)["weights"]
    quantize_linears(model, "bfloat16")
    assert linear_weight_bytes(model) == {"weights": before // 2, "scales": 0}
    assert weight_format(model) == "bfloat16"
    assert all(type(m) is not torch.nn.Linear for m in model.modules())
    assert any(isinstance(m, BFloat16Linear) for m in model.modules())


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
@pytest.mark.parametrize("tie", [True, False])
def test_greedy_tokens_agree_with_float32(weights, tie):
    prompt = _prompt()
    ref_model = _model(tie_embeddings=tie)
    ref = generate(ref_model, prompt, max_new_tokens=AGREE, temperature=0)
    model = _model(tie_embeddings=tie)
    with torch.no_grad():
        ref_logits = model(prompt).logits
    out = generate(model, prompt, GenerationRequest(AGREE, temperature=0, weights=weights))
    assert weight_format(model) == weights
    assert out.tolist() == ref.tolist()
    with torch.no_grad():
        logits = model(prompt).logits
    # prefill logits: bfloat16 rounding of weights and products (2**-8 relative) through 2 layers
    assert float((logits - ref_logits).abs().max()) <= 0.05 * float(ref_logits.abs().max())


@pytest.mark.parametrize("value", ["int4", "fp8", "", 8, True])
def test_unknown_formats_are_refused_naming_the_argument(value):
    model = _model()
    with pytest.raises(ArgumentError, match=r"weights must be one of float32, bfloat16, int8 .*got") as err:
        generate(model, [[1, 2]], max_new_tokens=2, weights=value)
    assert err.value.name == "weights"
    assert weight_format(model) == "float32"  # refused before anything was converted


def test_a_converted_model_refuses_another_format():
    model = _model()
    generate(model, [[1, 2]], max_new_tokens=1, weights="int8")
    for other in ("bfloat16", "float32"):
        with pytest.raises(ArgumentError, match="already stored as int8.*load the model again"):
            generate(model, [[1, 2]], max_new_tokens=1, weights=other)
    assert generate(model, [[1, 2]], max_new_tokens=1).shape == (1, 3)  # None: as it is


def test_cli_generate_weights_flag(capsys):
    from pathlib import Path

    from modkit.cli import main

    spec = Path(__file__).resolve().parents[2] / "specs" / "tiny-llama.json"
    argv = ["generate", str(spec), "--prompt", "1 2 3", "--max-new-tokens", "2"]
    assert main(argv + ["--weights", "int4"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "--weights must be one of float32, bfloat16, int8" in err and "'int4'" in err
    assert "internal error" not in err
    assert main(argv + ["--weights", "int8"]) == 0
    out, err = capsys.readouterr()
    assert len(out.split()) == 2 and "linear weights int8" in err


def test_bfloat16_linear_matches_a_bfloat16_product_and_follows_weight_changes():
    lin = torch.nn.Linear(96, 80, bias=False)
    torch.nn.init.normal_(lin.weight, generator=torch.Generator().manual_seed(4))
    layer = BFloat16Linear.from_linear(lin)
    x = torch.randn(2, 3, 96, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = (x.bfloat16().float() @ layer.weight.float().t()).bfloat16().float()
        y = layer(x)
        assert y.dtype == torch.float32 and y.shape == (2, 3, 80)
        assert float((y - ref).abs().max()) <= 2**-7 * float(ref.abs().max())  # one bfloat16 rounding apart at most
        layer.weight.mul_(2)  # an in-place change is seen (a packed copy is remade)
        assert float((layer(x) - 2 * y).abs().max()) <= 2**-6 * float(ref.abs().max())


def test_the_generate_guide_example_runs():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "generate.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    mine = [b for b in blocks if 'weights="int8"' in b]
    assert len(mine) == 1
    namespace: dict = {}
    exec(blocks[0], namespace)  # noqa: S102 - the guide's model and prompt
    exec(mine[0], namespace)  # noqa: S102 - the weights example
    assert namespace["out"].shape == (1, 8 + 16)
    assert weight_format(namespace["model"]) == "int8"


def test_an_int8_state_dict_loads_into_an_int8_model():
    saved, other = _model(), modkit.build(tiny_spec(), seed=1).eval()
    quantize_linears(saved, "int8")
    quantize_linears(other, "int8")
    assert set(saved.state_dict()) == set(other.state_dict())
    other.load_state_dict(saved.state_dict())  # the scales' bfloat16 copy follows the loaded scales
    prompt = _prompt()
    with torch.no_grad():
        assert torch.equal(other(prompt).logits, saved(prompt).logits)


MLA_MOE_SPEC = {
    "schema_version": 1,
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 32,
    "position": {"type": "rope", "theta": 10000.0},
    "block": {
        "attention": {
            "type": "mla",
            "n_heads": 2,
            "q_lora_rank": 16,
            "kv_lora_rank": 8,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4,
            "v_head_dim": 8,
            "latent_norm": {"type": "rmsnorm"},
        },
        "ffn": {
            "type": "moe",
            "n_experts": 4,
            "top_k": 2,
            "expert": {"type": "swiglu", "d_ff": 16},
            "router": {"type": "topk", "renormalize": True},
        },
        "norm": {"type": "rmsnorm"},
        "placement": {"type": "pre"},
    },
}


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
def test_weights_a_module_reads_as_matrices_stay_float32_and_decoding_runs(weights):
    """mla reads kv_b_proj as W_UK / W_UV and a router reads its proj in float32: each declares them
    (``matrix_weights``), so the conversion leaves them as built, and decoding agrees with float32."""
    from modkit.inference.weights import matrix_weights

    ref = modkit.build(MLA_MOE_SPEC, seed=0).eval()
    model = modkit.build(MLA_MOE_SPEC, seed=0).eval()
    kept = matrix_weights(model)
    attn, router = model.layers[0].attention, model.layers[0].ffn.router
    assert kept == {id(m.weight) for layer in model.layers for m in (layer.attention.kv_b_proj, layer.ffn.router.proj)}
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert quantize_linears(model, weights) == n_linear - len(kept)
    assert type(attn.kv_b_proj) is torch.nn.Linear and type(router.proj) is torch.nn.Linear
    assert type(attn.q_b_proj) is (BFloat16Linear if weights == "bfloat16" else Int8Linear)
    ids = _prompt()
    got = generate(model, ids, max_new_tokens=6, temperature=0)
    want = generate(ref, ids, max_new_tokens=6, temperature=0)
    assert torch.equal(got, want)
