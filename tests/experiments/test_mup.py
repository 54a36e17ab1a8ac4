"""μP as a parametrization of any spec (modkit.core.parametrization): equal to standard at the base width, the documented
init, output and attention factors away from it, and the coordinate check: flat across widths under μP, growing under
standard parametrization."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import modkit
from modkit.experiments.coordcheck import coord_check, write_report
from modkit.core.parametrization import attention_scale, width_multiplier
from modkit.experiments.scaling import resize

from conftest import tiny_spec

BASE = tiny_spec(d_model=32, block__ffn={"type": "swiglu", "d_ff": 64}, tie_embeddings=False)


def test_mup_at_the_base_width_equals_standard_parametrization():
    sp = modkit.build(BASE, seed=3)
    mup = modkit.build({**BASE, "parametrization": {"type": "mup", "base_d_model": 32}}, seed=3)
    for (n, a), (_, b) in zip(sp.state_dict().items(), mup.state_dict().items()):
        assert torch.equal(a, b), n
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    assert torch.equal(sp(ids).logits, mup(ids).logits)
    assert "parametrization" not in modkit.load_spec(BASE).to_dict()  # standard specs serialise as before


def test_mup_factors_away_from_the_base_width():
    wide = {**resize(BASE, d_model=128), "parametrization": {"type": "mup", "base_d_model": 32}}  # m = 4
    spec = modkit.load_spec(wide)
    assert width_multiplier(spec) == 4.0
    sp = modkit.build({**wide, "parametrization": None}, seed=0)
    mup = modkit.build(wide, seed=0)
    # the same draws, scaled: hidden matrices by m^-1/2, the rest as in SP
    assert torch.equal(mup.layers[0].attention.q_proj.weight, (sp.layers[0].attention.q_proj.weight * 0.5))
    assert torch.equal(mup.layers[1].ffn.down.weight, sp.layers[1].ffn.down.weight * 0.5)
    assert torch.equal(mup.embed.weight, sp.embed.weight) and torch.equal(mup.lm_head.weight, sp.lm_head.weight)
    assert torch.equal(mup.layers[0].attn_norm.weight, sp.layers[0].attn_norm.weight)
    # head_dim 32 at m = 4, 8 at the base: sqrt(8) / 32 instead of 1 / sqrt(32)
    assert mup.layers[0].attention.scale == pytest.approx(math.sqrt(8) / 32)
    assert sp.layers[0].attention.scale == 1 / math.sqrt(32)
    assert attention_scale(spec.parametrization, 128, 32) == pytest.approx(math.sqrt(8) / 32)
    # logits: the head's output times output_multiplier / m
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    out = mup(ids)
    assert torch.allclose(out.logits, mup.lm_head(out.hidden) / 4, rtol=0, atol=1e-7)
    doubled = modkit.build(
        {**wide, "parametrization": {"type": "mup", "base_d_model": 32, "output_multiplier": 2.0}}, seed=0
    )
    assert torch.allclose(doubled(ids).logits, 2 * out.logits, rtol=1e-6, atol=1e-7)


def test_latent_attention_takes_the_mup_scale_and_keeps_its_own_standard_one():
    mla = {
        "type": "mla",
        "n_heads": 4,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "latent_norm": {"type": "rmsnorm"},
    }
    base = {**BASE, "block": {**BASE["block"], "attention": mla}}
    sp = modkit.build(base, device="meta")
    assert sp.layers[0].attention.scale == 12**-0.5  # transformers' qk_head_dim ** -0.5, to the last bit
    wide = resize(base, d_model=128)  # every latent and head width x 4: qk_head_dim 48
    assert wide["block"]["attention"]["kv_lora_rank"] == 64 and wide["block"]["attention"]["qk_rope_head_dim"] == 16
    mup = modkit.build({**wide, "parametrization": {"type": "mup", "base_d_model": 32}}, device="meta")
    assert mup.layers[0].attention.scale == pytest.approx(math.sqrt(12) / 48, rel=1e-12)
    at_base = modkit.build({**base, "parametrization": {"type": "mup", "base_d_model": 32}}, device="meta")
    assert at_base.layers[0].attention.scale == pytest.approx(12**-0.5, rel=1e-15)


def test_resize_scales_every_width_field():
    big = resize(BASE, d_model=96, n_layers=3)
    assert (big["d_model"], big["n_layers"], big["block"]["ffn"]["d_ff"], big["name"]) == (
        96,
        3,
        192,
        "test-tiny-d96-l3",
    )
    assert big["block"]["attention"]["n_heads"] == 4  # heads stay: head_dim grows with d_model
    moe = resize(
        {
            **BASE,
            "block": {
                **BASE["block"],
                "ffn": {
                    "type": "moe",
                    "n_experts": 4,
                    "top_k": 2,
                    "expert": {"type": "swiglu", "d_ff": 48},
                    "router": {"type": "topk", "renormalize": True},
                },
            },
        },
        d_model=64,
    )
    assert moe["block"]["ffn"]["expert"]["d_ff"] == 96
    modkit.load_spec(moe)


MLA = {
    "type": "mla",
    "n_heads": 4,
    "kv_lora_rank": 64,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "latent_norm": {"type": "rmsnorm"},
}


@pytest.mark.parametrize("width", range(8, 201, 4))
def test_widths_keep_every_even_width_even_so_latent_attention_stays_valid(width):
    """MLA at d_model 128 (rope width 16) resized to every multiple of 4 from 8 to 200: each width field that was even
    stays even (RoPE rotates pairs of qk_rope_head_dim), within 1 of the exact ratio, and the spec validates."""
    base = {
        **BASE,
        "d_model": 128,
        "block": {**BASE["block"], "attention": MLA, "ffn": {"type": "swiglu", "d_ff": 341}},
    }
    wide = resize(base, d_model=width)
    ratio = width / 128
    got = {**wide["block"]["attention"], "d_ff": wide["block"]["ffn"]["d_ff"]}
    for name, value in {**MLA, "d_ff": 341}.items():
        if name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            assert got[name] % 2 == 0 and abs(got[name] - value * ratio) <= 1, (name, got[name], value * ratio)
    assert got["d_ff"] == max(1, round(341 * ratio))  # an odd width is rounded to the nearest integer, as before
    modkit.load_spec(wide)


def test_a_width_that_cannot_fit_is_refused_naming_the_field_the_value_and_the_fix():
    """A derived width the ladder cannot keep valid: head_dim = d_model / n_heads = 36 / 4 = 9 is odd under RoPE;
    Mamba-2's scaled head_dim no longer divides d_inner. Refused with the size, the field, the value and the widths
    nearby that fit."""
    from modkit.experiments.scaling import ScalingError, resize_checked

    assert resize_checked(BASE, d_model=40)["d_model"] == 40
    with pytest.raises(ScalingError) as info:
        resize_checked(BASE, d_model=36)
    text = str(info.value)
    assert text.startswith("test-tiny at d_model = 36 (scaled from 32) is not a valid spec:")
    assert "head_dim = 9 gives a rotary width of 9, which is odd" in text
    assert text.endswith("widths near 36 that give a valid spec: 32, 40 (or set the field in the spec so it fits)")
    mamba = tiny_spec(
        d_model=64, position={"type": "none"}, block__attention={"type": "mamba2", "head_dim": 16, "d_state": 16}
    )
    modkit.load_spec(mamba)
    with pytest.raises(ScalingError) as info:
        resize_checked(mamba, d_model=50)  # head_dim 16 -> 12 (kept even), d_inner 100 = 2 x 50: not a multiple of 12
    text = str(info.value)
    assert "block.attention.expand: d_inner = 100 is not a multiple of head_dim = 12" in text
    assert "widths near 50 that give a valid spec: 48, 52" in text
    # at 52 the even rounding (head_dim 14) does not divide d_inner 104; the nearest integer (13) does, and is taken
    assert resize_checked(mamba, d_model=52)["block"]["attention"]["head_dim"] == 13
    assert resize(mamba, d_model=52)["block"]["attention"]["head_dim"] == 14
    with pytest.raises(ScalingError, match=r"n_layers = 0: give a positive integer"):
        resize_checked(BASE, n_layers=0)


#: the stated factor: under μP every activation's change after 3 steps on random ids stays within this factor from
#: d_model 32 to 256 at 2 layers
FLAT = 2.5


@pytest.fixture
def one_thread():
    """One torch thread while a coordinate check trains (the machine's cores are shared by the suite's processes)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mla", "tiny-moe"])
def test_coordinate_check_on_text_is_flat_under_mup_for_dense_latent_and_mixture_specs(name, one_thread):
    """The shipped 4-layer specs (dense llama-like, multi-head latent attention, mixture of experts) on the default
    data (tiny shakespeare, its 65-character vocabulary), 5 AdamW steps at lr 1e-2, d_model 32 to 512 (16x), one
    seed, batches of 4 x 32 tokens: under μP the change of every activation (embedding, token mixer, ffn, residual
    stream, logits) after the last step is within [0.5, 2] of the smallest width's at the largest; under standard
    parametrization the hidden activations' change grows more than 3x (measured: 100x to 4,000x)."""
    from conftest import SPECS

    result = coord_check(SPECS / f"{name}.json", [32, 128, 512], steps=5, lr=1e-2, seeds=1, batch=4, seq_len=32)
    assert result.vocab_size == 65 and result.data.endswith("tinyshakespeare-char")
    assert set(result.change["mup"]) == {"embedding", "mixer", "ffn", "residual", "logits"}
    for q in result.change["mup"]:
        assert 0.5 <= result.growth("mup", q) <= 2.0, (q, result.growth("mup", q))
    for q in ("mixer", "ffn", "residual"):
        assert result.growth("sp", q) > 3, (q, result.growth("sp", q))


def test_text_and_random_tokens_are_two_sources_and_not_both(one_thread):
    """The random-id mode keeps the spec's vocabulary and records its source; asking for both is refused."""
    from modkit.experiments.coordcheck import RANDOM_TOKENS, CoordCheckError

    spec = {**BASE, "n_layers": 1}
    rand = coord_check(spec, [16, 32], steps=1, seeds=1, batch=2, seq_len=8, random_tokens=True)
    text = coord_check(spec, [16, 32], steps=1, seeds=1, batch=2, seq_len=8)
    assert (rand.data, rand.vocab_size, text.vocab_size) == (RANDOM_TOKENS, 64, 65)
    assert rand.to_json()["data"] == RANDOM_TOKENS
    assert not np.allclose(rand.change["mup"]["residual"], text.change["mup"]["residual"])
    with pytest.raises(CoordCheckError, match="give one"):
        coord_check(spec, [16, 32], data="somewhere", random_tokens=True)


def test_coordinate_check_on_random_ids_is_flat_under_mup_and_grows_under_standard(tmp_path, one_thread):
    """The random-id mode (``random_tokens``), widths 32 to 256 (8x), 2 layers, 3 Adam steps at lr 1e-2, 2 seeds:
    under μP the mean |h_t - h_0| of the mixer and ffn outputs, the residual stream and the logits changes by less
    than FLAT from the smallest to the largest width; under standard parametrization the hidden activations' change
    grows more than 8x (about linearly or faster)."""
    torch.manual_seed(0)
    spec = {**BASE, "n_layers": 2}
    result = coord_check(spec, [32, 64, 128, 256], steps=3, lr=1e-2, seeds=2, batch=4, seq_len=16, random_tokens=True)
    for q in ("mixer", "ffn", "residual", "logits"):
        g = result.growth("mup", q)
        assert 1 / FLAT < g < FLAT, (q, g)
    for q in ("mixer", "ffn", "residual"):
        assert result.growth("sp", q) > 8, (q, result.growth("sp", q))
    report = write_report(result, tmp_path / "cc", command="modkit coordcheck x.json --widths 32,64,128,256")
    text = report.read_text()
    assert (
        "| mup |" in text and "| sp |" in text and (tmp_path / "cc" / "coordcheck.png").read_bytes()[:4] == b"\x89PNG"
    )
    saved = json.loads((tmp_path / "cc" / "coordcheck.json").read_text())
    assert saved["growth"]["mup"]["residual"] == pytest.approx(result.growth("mup", "residual"))


def test_coordcheck_command(tmp_path, capsys):
    from modkit.cli import main

    spec = tmp_path / "s.json"
    spec.write_text(
        json.dumps(
            {**BASE, "d_model": 16, "n_layers": 1, "block": {**BASE["block"], "ffn": {"type": "swiglu", "d_ff": 32}}}
        )
    )
    out = tmp_path / "cc"
    assert (
        main(
            [
                "coordcheck",
                str(spec),
                "--widths",
                "16,32",
                "--steps",
                "1",
                "--seeds",
                "1",
                "--batch",
                "2",
                "--seq-len",
                "8",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    assert (
        "mup: growth of mean |h_t - h_0| from d_model 16 to 32:" in stdout and f"report: {out / 'report.md'}" in stdout
    )
    text = (out / "report.md").read_text()
    assert (
        f"modkit coordcheck {spec} --widths 16,32 --steps 1 --lr 0.01 --seeds 1 --batch 2 --seq-len 8 -o {out}" in text
    )
    assert "on text (tinyshakespeare-char, vocabulary 65)" in text and "data: " in stdout
    args = ["coordcheck", str(spec), "--widths", "16,32", "--steps", "1", "--seeds", "1", "--batch", "2"]
    assert main(args + ["--seq-len", "8", "--random-tokens", "-o", str(tmp_path / "r")]) == 0
    text = (tmp_path / "r" / "report.md").read_text()
    assert "--seq-len 8 --random-tokens -o" in text and "on uniform random token ids" in text
    assert "shrink like 1/sqrt(width)" in text
    capsys.readouterr()
    assert main(args + ["--data", str(tmp_path), "-o", str(tmp_path / "x")]) == 1
    assert f"--data {tmp_path}: not a prepared data folder (no meta.json)" in capsys.readouterr().err
    assert main(["coordcheck", str(spec), "--widths", "32,16", "-o", str(out)]) == 1
    assert "increasing widths" in capsys.readouterr().err


def test_the_training_schema_lists_the_optimizers():
    from modkit.train.config import json_schema

    schema = json_schema()
    assert set(schema["properties"]["optimizer"]["discriminator"]["mapping"]) >= {"adamw", "muon", "lion", "sgd"}
    assert schema["$defs"]["MuonConfig"]["properties"]["momentum"]["default"] == 0.95
