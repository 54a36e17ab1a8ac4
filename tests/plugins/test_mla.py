"""Multi-head latent attention (``mla``) against transformers' ``DeepseekV3Attention`` on the same weights, and its
cache: latent-only, absorbed decoding equal to the expanded form, bytes as declared everywhere.

References: transformers ``DeepseekV3Attention`` / ``DeepseekV3RotaryEmbedding`` (test-only dependency), in float32
with the eager attention; DeepSeek-V3's published sizes (``/work/shared/real-models/frontier/deepseek-v3``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import modkit
from modkit import AttentionInputs
from modkit.cli import main
from modkit.analysis.cost import CostModel
from modkit.testing import check_component

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY_MLA = ROOT / "specs" / "tiny-mla.json"
D, H, R_Q, R_KV, NOPE, ROPE, V = 32, 4, 24, 16, 8, 4, 6
YARN = {
    "factor": 40.0,
    "original_max_position_embeddings": 16,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}


def _pair(q_lora: bool, yarn: bool, interleave: bool, bias: bool = False):
    """``(modkit model, HF attention, HF rotary)`` with the same weights: a 1-layer modkit model holding ``mla``."""
    theta = 10000.0
    rope_parameters = (
        {"rope_type": "yarn", "rope_theta": theta, **YARN} if yarn else {"rope_type": "default", "rope_theta": theta}
    )
    hf_cfg = DeepseekV3Config(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        q_lora_rank=R_Q if q_lora else None,
        kv_lora_rank=R_KV,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        v_head_dim=V,
        rope_interleave=interleave,
        rope_parameters=rope_parameters,
        attention_bias=bias,
        max_position_embeddings=640,
        rms_norm_eps=1e-6,
        num_hidden_layers=1,
        vocab_size=64,
    )
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.3) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    rotary = DeepseekV3RotaryEmbedding(hf_cfg)
    attention = {
        "type": "mla",
        "n_heads": H,
        "q_lora_rank": R_Q if q_lora else None,
        "kv_lora_rank": R_KV,
        "qk_nope_head_dim": NOPE,
        "qk_rope_head_dim": ROPE,
        "v_head_dim": V,
        "bias": bias,
        "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
    }
    if yarn:
        attention["yarn_mscale"] = {"factor": YARN["factor"], "mscale_all_dim": YARN["mscale_all_dim"]}
    scaling = None
    if yarn:
        scaling = {
            "type": "yarn",
            "factor": YARN["factor"],
            "original_max_seq_len": YARN["original_max_position_embeddings"],
            "beta_fast": YARN["beta_fast"],
            "beta_slow": YARN["beta_slow"],
            "mscale": YARN["mscale"],
            "mscale_all_dim": YARN["mscale_all_dim"],
        }
    spec = {
        "schema_version": 1,
        "vocab_size": 64,
        "d_model": D,
        "n_layers": 1,
        "max_seq_len": 640,
        "position": {
            "type": "rope",
            "theta": theta,
            "layout": "interleaved" if interleave else "half_split",
            "scaling": scaling,
        },
        "block": {
            "attention": attention,
            "ffn": {"type": "swiglu", "d_ff": 48},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
    }
    model = modkit.build(spec, seed=0).eval()
    mla = model.layers[0].attention
    loaded = mla.load_state_dict(hf.state_dict(), strict=True)  # the same parameter names as transformers'
    assert not loaded.missing_keys and not loaded.unexpected_keys
    return model, hf, rotary


def _hf_mask(token_mask: torch.Tensor, q_len: int, past: int) -> torch.Tensor:
    """Additive ``[b, 1, q_len, past + q_len]`` causal mask over keys, padding keys hidden (eager attention)."""
    kv = past + q_len
    causal = torch.ones(q_len, kv, dtype=torch.bool).tril(past)
    allowed = causal[None] & token_mask[:, None, :kv]
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]


def _ours(model, x, positions, token_mask=None, cache=None):
    mla = model.layers[0].attention
    if cache is not None:
        positions, token_mask = cache.prepare(x.shape[0], x.shape[1], token_mask, positions)
    inputs = AttentionInputs(
        positions=positions,
        token_mask=token_mask,
        position=model.positions[model.layer_position[0]],
        cache=cache.layers[0] if cache is not None else None,
    )
    return mla(x, inputs)


CASES = [
    pytest.param(
        q, y, i, id=f"{'q_lora' if q else 'full_q'}-{'yarn' if y else 'plain'}-{'interleaved' if i else 'half_split'}"
    )
    for q, y, i in (
        (True, False, True),
        (False, False, True),
        (True, True, True),
        (False, True, False),
        (True, False, False),
    )
]


@pytest.mark.parametrize("q_lora,yarn,interleave", CASES)
def test_equals_transformers_forward_and_cached_with_left_padding(q_lora, yarn, interleave):
    model, hf, rotary = _pair(q_lora, yarn, interleave, bias=q_lora)
    b, s = 2, 9
    x = torch.randn(b, s, D, generator=torch.Generator().manual_seed(1))
    mask = torch.ones(b, s, dtype=torch.bool)
    mask[0, :3] = False  # row 0 left-padded by 3
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref, _ = hf(x, rotary(x, pos), _hf_mask(mask, s, 0))
        got = _ours(model, x, pos, mask)
        torch.testing.assert_close(got[0, 3:], ref[0, 3:], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)

        # with the cache: a prefill of 5, then token by token (the absorbed path), against transformers' cache
        cache, hf_cache = model.new_cache(b, s), DynamicCache(config=hf.config)
        outs, refs = [], []
        for a, e in ((0, 5), (5, 6), (6, 7), (7, 8), (8, 9)):
            outs.append(_ours(model, x[:, a:e], None, mask[:, a:e], cache))
            r, _ = hf(x[:, a:e], rotary(x, pos[:, a:e]), _hf_mask(mask, e - a, a), cache=hf_cache)
            refs.append(r)
        got, ref = torch.cat(outs, 1), torch.cat(refs, 1)
    torch.testing.assert_close(got[0, 3:], ref[0, 3:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)
    state = cache.layers[0].state()
    assert {n: tuple(t.shape) for n, t in state.tensors.items()} == {"latent": (b, s, R_KV + ROPE)}


def test_yarn_mscale_is_deepseeks_softmax_scale():
    model, hf, _ = _pair(True, True, True)
    m = 0.1 * YARN["mscale_all_dim"] * math.log(YARN["factor"]) + 1
    assert (
        model.layers[0].attention.scale
        == pytest.approx((NOPE + ROPE) ** -0.5 * m * m, rel=1e-12)
        == pytest.approx(hf.scaling)
    )


def test_absorbed_decoding_equals_the_expanded_form_and_the_full_forward():
    """The same cached steps through the absorbed path and the expanded one (``absorb = False``), and the full
    forward: the same numbers, chunks, left padding and bfloat16 cache included."""
    model = modkit.build(TINY_MLA, seed=0).eval()
    ids = torch.randint(0, 1024, (2, 20), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :6] = False
    schedule = ((0, 6), (6, 7), (7, 11), (11, 12), (12, 13), (13, 20))

    def decode(absorb: bool, dtype=None):
        for layer in model.layers:
            layer.attention.absorb = absorb
        cache = model.new_cache(2, 20, dtype)
        with torch.no_grad():
            return torch.cat(
                [model(ids[:, a:e], attention_mask=mask[:, :e], cache=cache).logits for a, e in schedule], 1
            )

    absorbed, expanded = decode(True), decode(False)
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
    torch.testing.assert_close(absorbed, expanded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(absorbed[0], full[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(absorbed[1, 6:], full[1, 6:], atol=1e-5, rtol=1e-5)
    bf16 = decode(True, torch.bfloat16)  # a bfloat16 latent cache: close, not equal
    assert (bf16[0] - full[0]).abs().max() < 0.05 * full.abs().max()


def test_single_sequence_float32_decode_equals_the_expanded_form():
    """Batch 1 in float32 on the CPU: the absorbed products (oneDNN's where this torch has it, else ``baddbmm`` /
    ``bmm``) give the expanded form's logits to 1e-5, chunks and single steps; and the two latent products, one
    sequence and two (oneDNN's scores take them one at a time), equal plain float64 matrix products to float32
    rounding, mask added, on the 40-wide cache layout (latent, then key)."""
    from modkit.plugin import latent_scores, latent_sum

    model = modkit.build(TINY_MLA, seed=0).eval()
    ids = torch.randint(0, 1024, (1, 16), generator=torch.Generator().manual_seed(5))

    def decode(absorb: bool):
        for layer in model.layers:
            layer.attention.absorb = absorb
        cache = model.new_cache(1, 16)
        with torch.no_grad():
            return torch.cat([model(ids[:, a:e], cache=cache).logits for a, e in ((0, 5), (5, 6), (6, 9), (9, 16))], 1)

    torch.testing.assert_close(decode(True), decode(False), atol=1e-5, rtol=1e-5)
    g = torch.Generator().manual_seed(6)
    for b in (1, 2):
        q, ckv, p = (
            torch.randn(b, 8, 40, generator=g),
            torch.randn(b, 33, 40, generator=g),
            torch.rand(b, 8, 33, generator=g),
        )
        base = torch.zeros(b, 1, 33).masked_fill_(torch.arange(33) > 30 - b, float("-inf"))
        with torch.no_grad():
            scores, summed = latent_scores(q, ckv, base), latent_sum(p, ckv, 32)
        ref = base.double() + q.double() @ ckv.double().transpose(1, 2)
        assert scores.shape == (b, 8, 33) and torch.equal(scores.isinf(), ref.isinf())
        torch.testing.assert_close(scores, ref.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(summed, (p.double() @ ckv.double()[..., :32]).float(), atol=1e-5, rtol=1e-5)


def test_absorbed_decoding_in_float64_equals_the_full_forward_to_1e_12():
    """In float64 the absorbed decode (W_UK folded into the query, W_UV after the weighted sum of latents, the scale
    folded into the query, the mask added by the score product) and the full forward agree to float64 rounding:
    the absorption is exact algebra, not an approximation. Chunks of several tokens, single steps and left
    padding, as above; the attention weights of a step too (``forward_with_weights``, dead rows 0)."""
    model = modkit.build(TINY_MLA, seed=0).eval().double()
    ids = torch.randint(0, 1024, (2, 20), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :6] = False
    cache = model.new_cache(2, 20, torch.float64)
    with torch.no_grad():
        absorbed = torch.cat(
            [model(ids[:, a:e], attention_mask=mask[:, :e], cache=cache).logits for a, e in ((0, 6), (6, 7), (7, 20))],
            1,
        )
        full = model(ids, attention_mask=mask).logits
    assert absorbed.dtype == torch.float64
    assert (absorbed[0] - full[0]).abs().max() < 1e-12
    assert (absorbed[1, 6:] - full[1, 6:]).abs().max() < 1e-12
    # one decode step after a prefill of 3, a fully padded row included: the absorbed output equals the expanded
    # one; its weights sum to 1 (0 on the dead row) and match the expanded path's (whose softmax is float32)
    attn, rope = model.layers[0].attention, model.positions[model.layer_position[0]]
    x = torch.randn(2, 4, 128, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    token_mask = torch.tensor([[True] * 4, [False] * 4])

    def step(absorb: bool, weights: bool):
        attn.absorb = absorb
        cache = model.new_cache(2, 4, torch.float64)
        for a, e in ((0, 3), (3, 4)):
            p, m = cache.prepare(2, e - a, token_mask[:, a:e], torch.arange(a, e).expand(2, e - a))
            inputs = AttentionInputs(positions=p, token_mask=m, position=rope, cache=cache.layers[0])
            got = attn.forward_with_weights(x[:, a:e], inputs) if weights and e == 4 else attn(x[:, a:e], inputs)
        attn.absorb = True
        return got

    (out, weights), ref_out, (_, ref_weights) = step(True, True), step(False, False), step(False, True)
    assert torch.equal(out, step(True, False))
    assert (out - ref_out).abs().max() < 1e-12 and out[1].abs().max() == 0
    assert weights.dtype == torch.float64 and weights[1].abs().max() == 0
    assert (weights[0].sum(-1) - 1).abs().max() < 1e-12
    torch.testing.assert_close(weights, ref_weights.to(weights.dtype), atol=1e-6, rtol=0)


def _v3_spec() -> dict:
    """DeepSeek-V3's attention sizes (61 layers, 128 heads, q_lora 1536, kv_lora 512, rope 64, nope 128, v 128) with
    a dense FFN (the cache does not depend on it), from its published config."""
    cfg = json.loads((Path("/work/shared/real-models/frontier/deepseek-v3/config.json")).read_text())
    return {
        "schema_version": 1,
        "name": "deepseek-v3-attention",
        "vocab_size": cfg["vocab_size"],
        "d_model": cfg["hidden_size"],
        "n_layers": cfg["num_hidden_layers"],
        "max_seq_len": 4096,
        "position": {"type": "rope", "theta": 10000.0, "layout": "interleaved"},
        "block": {
            "attention": {
                "type": "mla",
                "n_heads": cfg["num_attention_heads"],
                "q_lora_rank": cfg["q_lora_rank"],
                "kv_lora_rank": cfg["kv_lora_rank"],
                "qk_nope_head_dim": cfg["qk_nope_head_dim"],
                "qk_rope_head_dim": cfg["qk_rope_head_dim"],
                "v_head_dim": cfg["v_head_dim"],
                "latent_norm": {"type": "rmsnorm", "eps": 1e-6},
            },
            "ffn": {"type": "swiglu", "d_ff": cfg["intermediate_size"]},
            "norm": {"type": "rmsnorm", "eps": 1e-6},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm", "eps": 1e-6},
    }


@pytest.mark.skipif(
    not Path("/work/shared/real-models/frontier/deepseek-v3/config.json").exists(), reason="no DeepSeek-V3 config"
)
def test_deepseek_v3_cache_bytes_and_attention_parameters(tmp_path, capsys):
    """576 numbers per token and layer: 576 · 61 · 2 = 70,272 bytes per token in bfloat16, in modkit build --json
    and modkit cost; the attention's parameters equal transformers' module's (built on meta)."""
    spec = _v3_spec()
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(spec))
    assert main(["build", str(path), "--device", "meta", "--dtype", "bfloat16", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["kv_cache_bytes_per_token"] == (512 + 64) * 61 * 2 == 70_272
    assert card["kv_cache_bytes_per_sequence"] == 70_272 * 4096 and card["cache_state_bytes_per_sequence"] == 0
    assert main(["cost", str(path), "--context", "4096", "--json"]) == 0
    cost = json.loads(capsys.readouterr().out)
    assert cost["kv_cache_bytes_per_token"] == 70_272 and cost["kv_cache_bytes"] == 70_272 * 4096
    with torch.device("meta"):
        hf = DeepseekV3Attention(
            DeepseekV3Config(
                **{
                    k: v
                    for k, v in json.loads(
                        Path("/work/shared/real-models/frontier/deepseek-v3/config.json").read_text()
                    ).items()
                    if k != "model_type"
                }
            ),
            0,
        )
    per_layer = modkit.breakdown(spec)["attention"] // 61
    assert per_layer == sum(p.numel() for p in hf.parameters()) == 187_107_328


def test_tiny_mla_bytes_in_build_and_cost(capsys):
    """(kv_lora_rank + qk_rope_head_dim) · n_layers · bytes: (32 + 8) · 4 · 4 = 640 in float32, 320 in bfloat16."""
    assert main(["build", str(TINY_MLA), "--device", "meta", "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert (
        card["kv_cache_bytes_per_token"] == (32 + 8) * 4 * 4 == 640 and card["kv_cache_bytes_per_sequence"] == 640 * 512
    )
    costs = CostModel(TINY_MLA)
    assert (
        costs.kv_cache_bytes_per_token("bfloat16") == 320 and costs.kv_cache_bytes(100, 3, "bfloat16") == 320 * 100 * 3
    )
    model = modkit.build(TINY_MLA, dtype="bfloat16")
    assert model.new_cache(3, 100).nbytes() == 320 * 100 * 3  # allocated = declared, no padding


def test_decode_flops_do_not_rebuild_keys():
    """The decode declaration has no kv_b_proj term (keys are never rebuilt for the context); its context-dependent
    parts are the scores and the weighted sum over the latent: 2·h·(r_kv + d_rope) and 2·h·r_kv per key."""
    costs = CostModel(TINY_MLA)
    decode, prefill = costs.flops(costs.workload("decode", 101)), costs.flops(costs.workload("prefill", 8))
    assert "attention.kv_b_proj" in prefill and "attention.kv_b_proj" not in decode
    assert (
        decode["attention.scores"] == 4 * 2 * 4 * (32 + 8) * 101
        and decode["attention.weighted_sum"] == 4 * 2 * 4 * 32 * 101
    )
    assert costs.context_parts() == {"attention.scores", "attention.weighted_sum"}


def test_the_contract_kit_passes_on_mla_and_its_full_query_form():
    for config in (
        None,
        {
            "type": "mla",
            "n_heads": 4,
            "q_lora_rank": None,
            "kv_lora_rank": 16,
            "qk_nope_head_dim": 8,
            "qk_rope_head_dim": 4,
            "v_head_dim": 8,
            "latent_norm": {"type": "rmsnorm"},
            "bias": True,
        },
    ):
        results = check_component("attention", "mla", config)
        bad = {r.check: r.detail for r in results if r.status == "failed"}
        assert not bad, bad
        passed = {r.check for r in results if r.status == "passed"}
        assert {
            "kv_cache_decode",
            "masked_row",
            "causality",
            "flops",
            "param_count",
            "compile",
            "meta_init",
            "dropout",
            "position_sensitivity",
            "precision",
            "gradients",
        } <= passed, {r.check: r.detail for r in results}


def test_modkit_check_takes_a_config(tmp_path, capsys):
    cfg = {
        "n_heads": 2,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 4,
        "qk_rope_head_dim": 2,
        "v_head_dim": 4,
        "latent_norm": {"type": "rmsnorm"},
    }
    assert (
        main(
            [
                "check",
                "--kind",
                "attention",
                "--type",
                "mla",
                "--config",
                json.dumps(cfg),
                "--check",
                "kv_cache_decode",
                "--check",
                "param_count",
                "-v",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "attention/mla" in out and "2 passed" in out
    path = tmp_path / "mla.json"
    path.write_text(json.dumps({**cfg, "kv_lora_rank": 0}))  # from a file; an invalid config is named
    assert (
        main(["check", "--kind", "attention", "--type", "mla", "--config", str(path), "--check", "kv_cache_decode"])
        == 1
    )
    err = capsys.readouterr().err  # named as the component's config, not as a spec
    assert err.splitlines()[0] == "modkit: error: invalid component config attention/mla", err
    assert "attention/mla: kv_lora_rank: " in err
    assert main(["check", "--kind", "attention", "--config", json.dumps(cfg)]) == 1  # several attentions match
    assert "--config checks one component" in capsys.readouterr().err


def test_trace_labels_mla_projections_from_their_declarations():
    from modkit.analysis.trace import trace

    model = modkit.build(TINY_MLA, device="meta")
    t = trace(model, [1, 2, 3, 4, 5])
    notes = {s.name: s.note for g in t.groups for s in g.stages}
    assert notes["layers.0.attention.q_b_proj:output"] == "per head: [1, 4, 5, 40]"  # 32 + 8 per head
    assert notes["layers.0.attention.kv_b_proj:output"] == "per head: [1, 4, 5, 64]"  # 32 + 32 per head
    assert notes["layers.0.attention.kv_a_proj_with_mqa:output"] == ""  # the latent and the shared key: no heads
    assert notes["layers.0.attention.q_a_proj:output"] == ""
