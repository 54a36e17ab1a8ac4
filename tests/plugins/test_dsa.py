"""DeepSeek Sparse Attention (``dsa``): prefill, decode and chunked prefill select the same keys and give the same
logits; below ``index_topk`` keys it is MLA exactly; each query keeps ``min(p + 1, index_topk)`` keys; what it
declares (cache bytes, FLOPs, geometry) and what ``modkit cost`` shows against dense attention at 128K.

transformers' ``deepseek_v32`` (logits, greedy tokens with the cache, export) is checked by the type harness,
``tests/plugins/hf/test_hf_types.py``.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch

import modkit
from modkit.analysis.cost import CostModel
from modkit.cli import main
from modkit_plugins.dsa import LightningIndexer, _relayout

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "specs"
TOL = 1e-5


def _tiny(topk: int = 16, n_layers: int = 2, **attention) -> dict:
    spec = json.loads((SPECS / "tiny-dsa.json").read_text())
    spec["n_layers"] = n_layers
    spec["block"]["attention"].update(index_topk=topk, **attention)
    return spec


def _model(spec: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return modkit.build(modkit.load_spec(spec)).eval()


def _ids(n: int, batch: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 1024, (batch, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def _chunked(model, ids: torch.Tensor, bounds: list[int]) -> torch.Tensor:
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    return torch.cat([model(ids[:, a:e], cache=cache).logits for a, e in zip(bounds, bounds[1:])], dim=1)


def test_decode_and_chunked_prefill_equal_the_full_forward():
    model = _model(_tiny(8))
    ids = _ids(28)
    with torch.no_grad():
        full = model(ids).logits
    decode = _chunked(model, ids, [0, 5, *range(6, 29)])  # a prefill of 5, then one token at a time
    chunks = _chunked(model, ids, [0, 7, 14, 20, 21, 28])
    d_decode, d_chunks = ((x - full).abs().max().item() for x in (decode, chunks))
    print(f"\n[dsa] max |decode - full| = {d_decode:.2e}, max |chunked - full| = {d_chunks:.2e}")
    assert d_decode <= TOL and d_chunks <= TOL


def test_below_index_topk_keys_it_is_mla_and_beyond_it_selects():
    """Same weights in ``mla`` (the dense twin): positions that see at most ``index_topk`` keys give MLA's logits;
    later ones differ (keys were dropped)."""
    k = 16
    spec = _tiny(k)
    sparse = _model(spec)
    dense_spec = json.loads(json.dumps(spec))
    att = dense_spec["block"]["attention"]
    for key in [x for x in att if x.startswith("index_")]:
        del att[key]
    att["type"] = "mla"
    dense = modkit.build(modkit.load_spec(dense_spec)).eval()
    missing = dense.load_state_dict({n: t for n, t in sparse.state_dict().items() if ".indexer." not in n}, strict=True)
    assert not missing.missing_keys
    ids = _ids(40)
    with torch.no_grad():
        a, b = sparse(ids).logits, dense(ids).logits
    assert (a[:, :k] - b[:, :k]).abs().max().item() <= TOL
    assert (a[:, k:] - b[:, k:]).abs().amax(dim=(0, 2)).min().item() > 1e-3


def test_index_topk_at_least_the_context_is_mla():
    spec = _tiny(512)
    sparse = _model(spec)
    ids = _ids(24)
    decode = _chunked(sparse, ids, [0, 16, *range(17, 25)])
    with torch.no_grad():
        full = sparse(ids).logits
    assert (decode - full).abs().max().item() <= TOL


def _indexer(topk: int) -> LightningIndexer:
    """The first layer's indexer of the tiny spec with ``index_topk = topk`` (4 heads of 16, d_model 128)."""
    return _model(_tiny(topk)).layers[0].attention.indexer


def test_each_query_keeps_min_position_plus_one_and_topk_keys():
    k, s = 5, 12
    indexer = _indexer(k)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, s, 128, generator=g)
    q = torch.randn(2, indexer.n_heads, s, indexer.head_dim, generator=g)
    keys = torch.randn(2, s, indexer.head_dim, generator=g)
    causal = torch.ones(s, s, dtype=torch.bool).tril()[None, None].expand(2, 1, s, s)
    kept = indexer.select(x, q, keys, causal)
    assert kept.sum(-1)[:, 0].tolist() == [[min(p + 1, k) for p in range(s)]] * 2  # both rows
    assert not (kept & ~causal).any()


def test_ties_go_to_the_earlier_keys():
    """All index scores 0 (ReLU of q·k = 0): the earliest ``index_topk`` keys are kept."""
    k, s = 3, 8
    indexer = _indexer(k)
    x = torch.randn(1, s, 128)
    q = torch.zeros(1, indexer.n_heads, s, indexer.head_dim)
    causal = torch.ones(s, s, dtype=torch.bool).tril()[None, None]
    kept = indexer.select(x, q, torch.randn(1, s, indexer.head_dim), causal)[0, 0]
    assert kept[-1].nonzero().flatten().tolist() == [0, 1, 2]


def test_the_indexers_half_split_rope_through_an_interleaved_scheme():
    """The indexer rotates half-split pairs whatever the attention's layout: moved into the scheme's interleaved
    layout, rotated and moved back, the features equal a half-split scheme's rotation bitwise."""
    from modkit_plugins.rope import Rope, RopeConfig
    from modkit.core.interfaces import Init

    x = torch.randn(2, 3, 10, 8)
    assert torch.equal(_relayout(_relayout(x, "half_split", "interleaved"), "interleaved", "half_split"), x)
    pos = torch.arange(10).expand(2, 10)
    out = {}
    for layout in ("half_split", "interleaved"):
        rope = Rope(RopeConfig(theta=10000.0, layout=layout), 8)
        rope.init_weights(Init(seed=0, std=0.02))
        out[layout] = rope
    k = torch.randn(2, 1, 10, 8)
    want = out["half_split"].rotate(x, k, pos)
    moved = out["interleaved"].rotate(
        _relayout(x, "half_split", "interleaved"), _relayout(k, "half_split", "interleaved"), pos
    )
    got = tuple(_relayout(t, "interleaved", "half_split") for t in moved)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cache_bytes_per_token_are_declared():
    """latent + rotated key in the cache dtype, the index key in float32 (4 bytes) per layer."""
    assert modkit.kv_cache_bytes_per_token(modkit.load_spec(SPECS / "tiny-dsa.json"), "bfloat16") == 4 * (
        (32 + 8) * 2 + 16 * 4
    )
    flagship = modkit.load_spec(SPECS / "deepseek-v3.2.json")
    assert modkit.kv_cache_bytes_per_token(flagship, "bfloat16") == 61 * ((512 + 64) * 2 + 128 * 4) == 101_504


N, K = 131_072, 2048  # 128K context, DeepSeek-V3.2's index_topk
#: DeepSeek-V3.2's sizes: heads, latent, rotated key, nope/value widths, query rank, indexer heads and width
H, R, RD, NOPE, V, RQ, HI, DI = 128, 512, 64, 128, 128, 1536, 64, 128


def test_flagship_decode_flops_at_128k_follow_the_selection():
    """A token decoded after 131,071 cached ones: MLA's absorbed scores and sum over 2,048 keys, the indexer over
    all 131,072 (per layer, times 61)."""
    per = CostModel(SPECS / "deepseek-v3.2.json").per_token("decode", N)
    assert per["attention.scores"] == 61 * 2 * H * (R + RD) * K
    assert per["attention.weighted_sum"] == 61 * 2 * H * R * K
    assert per["attention.index_scores"] == 61 * 2 * HI * DI * N
    assert per["attention.index_sum"] == 61 * 2 * HI * N
    assert per["attention.index_q"] == 61 * 2 * RQ * HI * DI


def test_cost_shows_the_saving_against_dense_attention_at_128k():
    from modkit.analysis.dense_twin import against_dense

    cmp = against_dense(CostModel(SPECS / "deepseek-v3.2.json"), N, "bfloat16")
    assert cmp["replaced"] == {"dsa": "mla"}
    mixers = cmp["mixer_flops_per_token"]["decode"]
    # the dense twin scores every key with MLA; the sparse one 2,048 of them, plus the indexer over every key
    dropped = 61 * (2 * H * (R + RD) + 2 * H * R) * (N - K)
    indexer = 61 * (2 * RQ * HI * DI + 2 * 7168 * DI + 2 * 7168 * HI + 2 * HI * DI * N + 2 * HI * N)
    assert mixers["dense"] - mixers["sparse"] == dropped - indexer
    assert cmp["kv_cache_bytes_per_token"] == {"sparse": 101_504, "dense": 61 * (512 + 64) * 2}
    print(f"\n[dsa] DeepSeek-V3.2 at 128K, token mixers' FLOPs per decoded token: {mixers}")


def test_cost_prints_the_comparison():
    """tiny-dsa at its 512 tokens: the mixers decode 16 keys with MLA and 512 with the indexer (4 layers)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["cost", str(SPECS / "tiny-dsa.json"), "--context", "512"]) == 0
    text = out.getvalue()
    section = text[text.index("against dense") :].split("\n\n")[0]
    print("\n" + section)
    assert section.startswith("against dense attention (mla in place of dsa; everything else equal) at context 512")
    assert "KV cache:      576 bytes per token vs 320 (as the mixers declare)" in section
    sparse = CostModel(SPECS / "tiny-dsa.json").per_token("decode", 512)
    assert sparse["attention.scores"] == 4 * 2 * 4 * (32 + 8) * 16


def test_a_dense_spec_has_no_comparison():
    from modkit.analysis.dense_twin import against_dense

    assert against_dense(CostModel(SPECS / "tiny-mla.json"), 64, "bfloat16") is None


@pytest.mark.parametrize(
    "change,field,says",
    [
        ({"index_head_dim": 4}, "block.attention.index_head_dim", "narrower than qk_rope_head_dim = 8"),
        ({"q_lora_rank": None}, "block.attention.q_lora_rank", "valid integer, not null"),
    ],
)
def test_bad_configs_name_the_field(change, field, says):
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(_tiny(**change))
    paths = [p for p, _ in err.value.errors]
    assert field in paths, err.value.errors
    assert says in " ".join(m for _, m in err.value.errors)


def test_a_score_bias_is_refused():
    """ALiBi acts on the scores, which the indexer does not see: the spec is refused, naming the position."""
    spec = _tiny()
    spec["position"] = {"type": "alibi"}
    with pytest.raises(modkit.SpecError) as err:
        modkit.load_spec(spec)
    assert any(p == "position" and "'alibi' acts on the attention scores" in m for p, m in err.value.errors)


def _v32(**changes) -> dict:
    config = json.loads((ROOT / "tests/data/real-models/frontier/deepseek-v3.2/config.json").read_text())
    config.update(num_hidden_layers=4, first_k_dense_replace=1, **changes)
    return config


def test_deepseek_v32_mlp_layer_types_win_and_are_written_back():
    spec = modkit.from_hf_config(_v32(mlp_layer_types=["dense", "sparse", "dense", "sparse"]))
    assert [spec.layer(i).ffn.type for i in range(4)] == ["swiglu", "moe", "swiglu", "moe"]
    written = modkit.get_registry().hf_converter("deepseek_v32").declaration.weights.hf_config(spec, {})
    assert written["mlp_layer_types"] == ["dense", "sparse", "dense", "sparse"]
    assert written["layer_types"] == ["indexed_attention"] * 4
    assert (written["index_n_heads"], written["index_head_dim"], written["index_topk"]) == (64, 128, 2048)
    assert "rope_interleave" not in written


@pytest.mark.parametrize(
    "changes,key",
    [
        ({"q_lora_rank": None}, "q_lora_rank"),
        (
            {"layer_types": ["indexed_attention", "full_attention", "indexed_attention", "indexed_attention"]},
            "layer_types",
        ),
        ({"mlp_layer_types": ["dense", "moe", "dense", "dense"]}, "mlp_layer_types"),
    ],
)
def test_deepseek_v32_refuses_by_key_what_modkit_cannot_express(changes, key):
    with pytest.raises(modkit.SpecError) as err:
        modkit.from_hf_config(_v32(**changes))
    assert any(p == key for p, _ in err.value.errors), err.value.errors


def _shared_spec(n_layers: int = 3, sources=(None, 0, 0)) -> dict:
    spec = _tiny(8, n_layers=n_layers)
    att = spec["block"]["attention"]
    spec["overrides"] = [
        {"layers": [i], "attention": dict(att, index_source=j)} for i, j in enumerate(sources) if j is not None
    ]
    return spec


def test_layers_reusing_a_selection_decode_as_the_full_forward_and_hold_no_indexer():
    """GLM-5's shared layers: layers 1 and 2 attend to layer 0's selection; no indexer parameters or index keys."""
    model = _model(_shared_spec())
    assert [layer.attention.indexer is None for layer in model.layers] == [False, True, True]
    per_layer = (32 + 8) * 4  # float32 latent and rotated key
    assert modkit.kv_cache_bytes_per_token(model.spec, "float32") == 3 * per_layer + 16 * 4
    indexer = 64 * 4 * 16 + 128 * 16 + 2 * 16 + 128 * 4  # wq_b, wk, k_norm (weight, bias), weights_proj
    assert modkit.count_params(model.spec) == sum(p.numel() for p in model.parameters())
    assert modkit.count_params(_tiny(8, n_layers=3)) - modkit.count_params(model.spec) == 2 * indexer
    ids = _ids(24)
    with torch.no_grad():
        full = model(ids).logits
    decode = _chunked(model, ids, [0, 5, *range(6, 25)])
    assert (decode - full).abs().max().item() <= TOL


def test_a_selection_from_a_later_layer_is_refused():
    with pytest.raises(ValueError, match="index_source = 2, which does not run before it"):
        _model(_shared_spec(sources=(None, 2, None)))


def test_glm5_defaults_count_as_transformers():
    """GlmMoeDsaConfig's defaults (78 layers, every one with its indexer): 743,911,199,232 parameters, transformers
    5.25's AutoModelForCausalLM count on the meta device."""
    assert modkit.count_params(modkit.from_hf_config({"model_type": "glm_moe_dsa"})) == 743_911_199_232


def test_the_kit_catches_a_selection_made_before_the_mask():
    """A plausible fault: top-k over every key, the causal mask applied after. Future tokens then decide which past
    keys a query keeps (fewer than index_topk survive): the kit's causality and cached-decode checks fail it."""
    from typing import Literal

    from modkit import hookimpl
    from modkit.testing import check_component
    from modkit_plugins import dsa as dsa_module

    class Unmasked(dsa_module.LightningIndexer):
        def select(self, x, q, k_all, allowed):
            everything = torch.ones_like(allowed)
            return super().select(x, q, k_all, everything) & allowed  # FAULT: the mask after the top-k

    class FaultyConfig(dsa_module.DSAConfig):
        type: Literal["dsa_unmasked"] = "dsa_unmasked"  # type: ignore[assignment]

    def factory(cfg, ctx):
        module = dsa_module.DSA(cfg, ctx)
        module.indexer.__class__ = Unmasked
        return module

    class Plugin:
        @hookimpl
        def register_components(self, register):
            entry = dsa_module.dsa_component()
            example = dict(entry.example, type="dsa_unmasked")
            register(
                modkit.Component(
                    **{
                        **entry.__dict__,
                        "type": "dsa_unmasked",
                        "config": FaultyConfig,
                        "factory": factory,
                        "example": example,
                        "provider": None,
                    }
                )
            )

    reg = modkit.Registry()
    for p in modkit.get_registry().plugins():
        reg.register_plugin(p.obj, p.name)
    reg.register_plugin(Plugin(), "dsa-fault")
    results = {
        r.check: r
        for r in check_component(
            "attention", "dsa_unmasked", registry=reg, checks=["causality", "kv_cache_decode", "shape_dtype"]
        )
    }
    assert results["causality"].status == "failed", results["causality"].detail
    assert results["kv_cache_decode"].status == "failed"
    assert results["shape_dtype"].status == "passed"
