"""``compressed_attention`` against transformers' ``DeepseekV4Attention`` (float32, 1e-5): a prefill, a
token-by-token decode and a chunked prefill over sequences longer than the window, the blocks and the indexer's
top-k, for the three layer types of DeepSeek-V4 (sliding, compressed-sparse, heavily compressed), with plain RoPE
and with YaRN (positions past its original length); and the block growth of the cache declaration (exact bytes)."""

from __future__ import annotations

import pytest
import modkit
import torch

from modkit.core.interfaces import AttentionInputs, BuildContext
from modkit.nn.cache import CacheEntry, CacheSpec, KVCache
from modkit_plugins.compressed_attention import CompressedAttention, CompressedAttentionConfig
from modkit_plugins.rope import YarnScaling

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v4 import modeling_deepseek_v4 as hf_v4  # noqa: E402

D_MODEL, WINDOW, TOL = 32, 4, 1e-5
LAYERS = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
#: YaRN per rope label, trained on 8 positions (the tests run 13): the betas put the ramp inside the 4 rotated pairs
#: (dims 0..3 of main's, 0..2 of compress's); main's attention factor given, compress's from its mscales
YARN = {
    "main": {
        "factor": 4.0,
        "original_max_position_embeddings": 8,
        "beta_fast": 0.25,
        "beta_slow": 0.01,
        "attention_factor": 1.3,
    },
    "compress": {
        "factor": 16.0,
        "original_max_position_embeddings": 8,
        "beta_fast": 0.25,
        "beta_slow": 0.01,
        "mscale": 1.0,
        "mscale_all_dim": 0.5,
    },
}


def _hf_rope(yarn: bool):
    """transformers' nested ``rope_parameters`` (``None``: its default RoPE, bases 10000 and 160000)."""
    if not yarn:
        return None
    return {
        label: {"rope_type": "yarn", "rope_theta": theta, "partial_rotary_factor": 0.5, **YARN[label]}
        for label, theta in (("main", 10000.0), ("compress", 160000.0))
    }


def _hf_config(yarn: bool = False):
    return transformers.DeepseekV4Config(
        rope_parameters=_hf_rope(yarn),
        hidden_size=D_MODEL,
        num_attention_heads=4,
        head_dim=16,
        q_lora_rank=12,
        qk_rope_head_dim=8,
        sliding_window=WINDOW,
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
        num_hidden_layers=3,
        layer_types=LAYERS,
        o_groups=2,
        o_lora_rank=8,
        index_n_heads=8,
        index_head_dim=8,
        index_topk=3,
        vocab_size=97,
    )


def _yarn(cfg, label: str):
    """Our ``rope_scaling`` of the rope label's parameters in ``cfg`` (None for transformers' default RoPE)."""
    p = cfg.rope_parameters[label]
    if p["rope_type"] != "yarn":
        return None
    extra = {k: p[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor") if k in p}
    return YarnScaling(
        type="yarn", factor=p["factor"], original_max_seq_len=p["original_max_position_embeddings"], **extra
    )


def _ours_config(cfg, layer_type: str) -> CompressedAttentionConfig:
    sliding = layer_type == "sliding_attention"
    csa = layer_type == "compressed_sparse_attention"
    return CompressedAttentionConfig(
        rope_scaling=_yarn(cfg, "main" if sliding else "compress"),
        n_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        q_lora_rank=cfg.q_lora_rank,
        rope_dim=cfg.qk_rope_head_dim,
        rope_theta=cfg.rope_theta if sliding else cfg.compress_rope_theta,
        window=cfg.sliding_window,
        compress_ratio=None if sliding else cfg.compress_rates[layer_type],
        overlap=csa,
        index_n_heads=cfg.index_n_heads if csa else None,
        index_head_dim=cfg.index_head_dim,
        index_topk=cfg.index_topk,
        o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank,
        eps=cfg.rms_norm_eps,
    )


def _hf_name(name: str) -> str:
    """transformers' parameter name of one of ours."""
    name = name.replace("indexer.compressor.", "compressor.indexer.").replace(
        "indexer.weights_proj", "indexer.scorer.weights_proj"
    )
    if name.startswith("indexer."):
        name = "compressor." + name
    for norm in ("q_a_norm", "kv_norm"):
        if name.endswith(norm):
            name += ".weight"
    return name


def _pair(layer: int, yarn: bool = False):
    cfg = _hf_config(yarn)
    cfg._attn_implementation = "eager"
    torch.manual_seed(layer)
    theirs = hf_v4.DeepseekV4Attention(cfg, layer).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(
                torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 and p.shape[0] != cfg.num_attention_heads else 0.0)
            )
    ours = CompressedAttention(
        _ours_config(cfg, LAYERS[layer]),
        BuildContext(d_model=D_MODEL, n_layers=1, vocab_size=97, max_seq_len=64, registry=modkit.get_registry()),
    ).eval()
    params = dict(theirs.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(params[_hf_name(name)])
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    return cfg, theirs, ours


def _theirs(cfg, theirs, x, start: int, cache):
    """transformers' attention on ``x`` at positions ``start..``, with its sliding mask over the keys it returns."""
    b, s, _ = x.shape
    pos = torch.arange(start, start + s)[None].expand(b, -1)
    kind = "main" if theirs.layer_type == "sliding_attention" else "compress"
    rotary = hf_v4.DeepseekV4RotaryEmbedding(cfg)
    emb = {kind: rotary(x, pos, layer_type=kind)}
    n_old = min(start, WINDOW - 1) if cache is not None else 0
    k_pos = torch.arange(start - n_old, start + s)
    q_pos = torch.arange(start, start + s)
    ok = (k_pos[None] <= q_pos[:, None]) & (q_pos[:, None] - k_pos[None] < WINDOW)
    mask = torch.zeros(ok.shape).masked_fill(~ok, float("-inf"))[None, None].expand(b, 1, -1, -1)
    with torch.no_grad():
        return theirs(x, emb, pos, mask, cache=cache)[0]


def _ours(ours, x, cache):
    b, s, _ = x.shape
    if cache is None:
        inputs = AttentionInputs(torch.arange(s)[None].expand(b, -1))
    else:
        positions, _ = cache.prepare(b, s)
        inputs = AttentionInputs(positions, cache=cache.layers[0])
    with torch.no_grad():
        return ours(x, inputs)


@pytest.mark.parametrize("yarn", [False, True], ids=["rope", "yarn"])
@pytest.mark.parametrize("layer", [0, 1, 2], ids=LAYERS)
def test_prefill_decode_and_chunks_equal_transformers(layer, yarn):
    cfg, theirs, ours = _pair(layer, yarn)
    x = torch.randn(2, 13, D_MODEL, generator=torch.Generator().manual_seed(7))
    want = _theirs(cfg, theirs, x, 0, None)
    assert (_ours(ours, x, None) - want).abs().max().item() <= TOL
    for chunks in ([13], [5, 3, 5], [6] + [1] * 7):
        hf_cache = transformers.DynamicCache(config=cfg)
        cache = KVCache([ours.cache_spec()], max_len=16, batch_size=2)
        start = 0
        for n in chunks:
            part = x[:, start : start + n]
            got, ref = _ours(ours, part, cache), _theirs(cfg, theirs, part, start, hf_cache)
            assert (got - ref).abs().max().item() <= TOL, (chunks, start)
            assert (got - want[:, start : start + n]).abs().max().item() <= TOL, (chunks, start)
            start += n


def test_left_padding_compresses_blocks_from_each_rows_first_token():
    """A left-padded row gives its unpadded logits, in one forward and through the cache."""
    _, _, ours = _pair(1)
    x = torch.randn(1, 11, D_MODEL, generator=torch.Generator().manual_seed(3))
    alone = _ours(ours, x, None)
    padded = torch.cat([torch.zeros(1, 3, D_MODEL), x], dim=1).expand(2, -1, -1).clone()
    padded[1, 3:] = torch.randn(11, D_MODEL)
    mask = torch.ones(2, 14, dtype=torch.bool)
    mask[0, :3] = False
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        got = ours(padded, AttentionInputs(positions, token_mask=mask))
    assert (got[0, 3:] - alone[0]).abs().max().item() <= TOL
    cache = KVCache([ours.cache_spec()], max_len=16, batch_size=2)
    outs = []
    for part, m in ((padded[:, :8], mask[:, :8]), (padded[:, 8:], mask[:, 8:])):
        pos, _ = cache.prepare(2, part.shape[1], m)
        with torch.no_grad():
            outs.append(ours(part, AttentionInputs(pos, token_mask=m, cache=cache.layers[0])))
    assert (torch.cat(outs, dim=1)[0, 3:] - alone[0]).abs().max().item() <= TOL


def test_block_growth_bytes_by_hand():
    """D = 16, window 4, m = 2 with overlap, indexer keys of 8, float32, max_len 16."""
    _, _, ours = _pair(1)
    spec = ours.cache_spec()
    assert [e.growth for e in spec.entries] == ["token", "block", "sequence", "block", "sequence"]
    # window: 4 slots x 16; entries: 16 // 2 = 8 slots x (16 + 8); tails: 4 x 64 and 4 x 32; x 4 bytes
    want = (4 * 16 + 8 * (16 + 8) + 4 * 64 + 4 * 32) * 4
    assert spec.nbytes(16, 1, torch.float32) == want == 2560
    assert spec.bytes_per_token(torch.float32) == (16 + (16 + 8) // 2) * 4 == 112
    cache = KVCache([spec], max_len=16, batch_size=3)
    assert cache.nbytes() == cache.declared_nbytes() == 3 * want
    with pytest.raises(ValueError, match="block"):
        CacheEntry("c", (4,), growth="block")
    with pytest.raises(ValueError, match="block"):
        CacheEntry("c", (4,), growth="token", block=2)
    assert CacheSpec((CacheEntry("c", (3,), growth="block", block=2),)).bytes_per_token(torch.float32) == 6


def _small_spec() -> dict:
    """3 layers of d_model 64: sliding (window 8), compressed-sparse (m 4, overlap, indexer 2 x 8 keeping 4) and
    heavily compressed (m 128), heads 4 x 16."""
    attn = dict(
        type="compressed_attention",
        n_heads=4,
        head_dim=16,
        q_lora_rank=12,
        rope_dim=8,
        window=8,
        o_groups=2,
        o_lora_rank=8,
    )
    csa = dict(attn, compress_ratio=4, overlap=True, index_n_heads=2, index_head_dim=8, index_topk=4)
    return {
        "schema_version": 1,
        "name": "tiny-compressed",
        "vocab_size": 97,
        "d_model": 64,
        "n_layers": 3,
        "max_seq_len": 131072,
        "position": {"type": "none"},
        "block": {
            "attention": attn,
            "ffn": {"type": "swiglu", "d_ff": 96},
            "norm": {"type": "rmsnorm"},
            "placement": {"type": "pre"},
        },
        "final_norm": {"type": "rmsnorm"},
        "overrides": [
            {"layers": [1], "attention": csa},
            {"layers": [2], "attention": dict(attn, compress_ratio=128)},
        ],
    }


def test_cost_shows_the_saving_against_dense_attention_at_128k(tmp_path):
    """bfloat16, one row of 131,072 tokens, by hand: every layer keeps its window (8 x 16 x 2 = 256 bytes); the CSA
    layer 32,768 entries of 16 and as many indexer keys of 8, and tails of 8 x 64 and 8 x 32; the HCA layer 1,024
    entries of 16 and a tail of 128 x 32. The dense twin keeps 16 numbers per token and layer."""
    import io
    import json
    from contextlib import redirect_stdout

    from modkit.analysis.cost import CostModel
    from modkit.analysis.dense_twin import against_dense
    from modkit.cli import main
    from modkit.nn.build import kv_cache_bytes

    n = 131072
    csa = 256 + 32768 * 16 * 2 + 8 * 64 * 2 + 32768 * 8 * 2 + 8 * 32 * 2
    hca = 256 + 1024 * 16 * 2 + 128 * 32 * 2
    assert (csa, hca) == (1_574_656, 41_216)
    spec = modkit.load_spec(_small_spec())
    assert kv_cache_bytes(spec, n, 1, "bfloat16") == 256 + csa + hca == 1_616_128
    # per token: 32 for each window's key, 32 / 4 + 16 / 4 for the CSA's entries, ceil(32 / 128) for the HCA's
    assert modkit.kv_cache_bytes_per_token(spec, "bfloat16") == 3 * 32 + 8 + 4 + 1 == 109
    cmp = against_dense(CostModel(spec), n, "bfloat16")
    assert cmp["replaced"] == {"compressed_attention": "compressed_attention"}
    assert cmp["kv_cache_bytes"] == {"sparse": 1_616_128, "dense": 3 * n * 16 * 2}
    assert cmp["kv_cache_bytes_per_token"] == {"sparse": 109, "dense": 96}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(_small_spec()))
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["cost", str(path), "--context", str(n)]) == 0
    text = out.getvalue()
    section = text[text.index("against dense") :].split("\n\n")[0]
    print("\n" + section)
    assert "KV cache held: 1,616,128 bytes per row at context 131,072 vs 12,582,912 (7.79x less)" in section


def test_flagship_attention_parameters_and_cache_at_128k():
    """DeepseekV4Config's defaults (43 layers: 23 HCA, 20 CSA): the attention parameters equal transformers' count
    on meta, and one row's cache at 131,072 tokens in bfloat16, by hand, against one shared key/value head of 512
    per token and layer."""
    from modkit_plugins.compressed_attention import _param_count

    cfg = transformers.DeepseekV4Config()
    ctx = BuildContext(
        d_model=cfg.hidden_size, n_layers=43, vocab_size=97, max_seq_len=64, registry=modkit.get_registry()
    )
    configs = [_ours_config(cfg, t) for t in cfg.layer_types]
    assert sum(_param_count(c, ctx) for c in configs) == 5_079_956_672
    with torch.device("meta"):
        theirs = hf_v4.DeepseekV4Attention(cfg, 3)  # a CSA layer
        ours = CompressedAttention(configs[3], ctx)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in theirs.parameters())
    n, window = 131072, 128 * 512 * 2
    hca = window + 1024 * 512 * 2 + 128 * 1024 * 2
    csa = window + 32768 * 512 * 2 + 32768 * 128 * 2 + 8 * 2048 * 2 + 8 * 512 * 2
    got = 0
    for c in configs:
        with torch.device("meta"):
            got += CompressedAttention(c, ctx).cache_spec().nbytes(n, 1, torch.bfloat16)
    assert got == 23 * hca + 20 * csa == 875_462_656
    # the dense twin (modkit cost's comparison: no window, no compression, no indexer) holds every position's key
    twin = modkit.get_registry().get("attention", "compressed_attention").capabilities["dense_twin"]
    dense = 0
    for c in configs:
        with torch.device("meta"):
            dense += CompressedAttention(c.model_copy(update=twin), ctx).cache_spec().nbytes(n, 1, torch.bfloat16)
    assert dense == 43 * n * 512 * 2 == 5_771_362_304  # 6.59 times as many bytes


@pytest.mark.parametrize("layer", [1, 2], ids=LAYERS[1:])
def test_packed_documents_equal_each_document_alone(layer):
    """Two documents of 5 and 8 tokens packed in one row: each document's outputs are its own, run alone (its
    blocks cut from its first token, no entry of the other document seen)."""
    _, _, ours = _pair(layer)
    x = torch.randn(1, 13, D_MODEL, generator=torch.Generator().manual_seed(9))
    docs = torch.tensor([[0] * 5 + [1] * 8])
    positions = torch.tensor([list(range(5)) + list(range(8))])
    with torch.no_grad():
        packed = ours(x, AttentionInputs(positions, documents=docs))
    for a, e in ((0, 5), (5, 13)):
        alone = _ours(ours, x[:, a:e], None)
        assert (packed[:, a:e] - alone).abs().max().item() <= TOL, (a, e)


def test_yarn_frequencies_and_attention_factor_are_transformers_per_rope_label():
    """The layer's buffer and factor equal ``DeepseekV4RotaryEmbedding``'s for its label (main: the given 1.3;
    compress: (0.1·1·ln 16 + 1) / (0.1·0.5·ln 16 + 1)), the frequencies differ from plain RoPE's, and a meta build
    gets them back from ``init_weights``."""
    import math

    from modkit.core.interfaces import Init

    for layer, label in ((0, "main"), (2, "compress")):
        cfg, _, ours = _pair(layer, yarn=True)
        rotary = hf_v4.DeepseekV4RotaryEmbedding(cfg)
        theirs = getattr(rotary, f"{label}_inv_freq")
        assert ours.inv_freq.shape == theirs.shape == (4,)
        assert (ours.inv_freq - theirs).abs().max().item() <= 1e-7 * theirs.abs().max().item()
        assert ours.rope_scale == pytest.approx(getattr(rotary, f"{label}_attention_scaling"), rel=1e-12)
        plain = _pair(layer)[2].inv_freq
        assert ours.inv_freq[0] == plain[0] and (ours.inv_freq[1:] < plain[1:]).all()  # kept, then interpolated
    assert ours.rope_scale == pytest.approx((0.1 * math.log(16) + 1) / (0.05 * math.log(16) + 1), rel=1e-12)
    ctx = BuildContext(d_model=D_MODEL, n_layers=1, vocab_size=97, max_seq_len=64, registry=modkit.get_registry())
    with torch.device("meta"):
        empty = CompressedAttention(ours.cfg, ctx)
    empty.to_empty(device="cpu")
    empty.init_weights(Init(seed=0, std=0.02))
    assert torch.equal(empty.inv_freq, ours.inv_freq)


def test_a_training_forward_saves_the_same_bytes_for_every_row():
    """The one key/value head is read by every query head: a broadcast product over the heads copied the keys once
    per head and row for the backward at 2 rows or more (not at 1, where torch folds the heads into the rows), so
    the saved bytes were not affine in the rows and modkit plan's activations went negative (DeepSeek-V4, tp 8)."""
    from modkit.analysis.step_activations import fake_model, measure_step

    spec = _small_spec()
    spec.update(n_layers=2, max_seq_len=64, overrides=spec["overrides"][:1])  # sliding, and CSA with its indexer
    with fake_model(spec) as (model, mode), mode:
        saved = [measure_step(model, torch.zeros(r, 32, dtype=torch.long)).saved for r in (1, 2, 3)]
    for layer in (0, 1):
        one, two, three = (s[layer] for s in saved)
        assert two - one == three - two, (layer, one, two, three)
