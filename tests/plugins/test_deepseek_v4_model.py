"""DeepSeek-V4 written as a modkit spec (``specs/deepseek-v4.json``): its parameter count equals transformers' on
meta, the ``deepseek_v4`` converter reads transformers' class defaults as that very spec (and legacy keys as
transformers reads them), and a tiny random ``DeepseekV4ForCausalLM`` loaded with ``modkit.from_hf`` computes its
float32 logits within 1e-5 and its greedy tokens with the cache over a sequence of several windows.

The parts: the ``mhc`` stream (4 copies), ``compressed_attention`` (heavily compressed and compressed-sparse layers
with a lightning indexer), mixtures of ``swiglu_clamped`` experts (alpha 1, up_offset 0: DeepSeek-V4's clamp) with a
shared one, routed by token id (``hash``) on the first layers and by ``sqrtsoftplus_topk`` with a correction bias on
the others. The six checks of every converter on a left-padded batch and the export run in
``tests/plugins/hf/test_hf_types.py`` (fixture ``deepseek_v4``).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import pytest
import torch

import modkit
from modkit.inference.generate import generate
from modkit_plugins.hf._weights import spec_differences

transformers = pytest.importorskip("transformers")

SPEC = Path(__file__).resolve().parents[2] / "specs" / "deepseek-v4.json"
#: DeepseekV4Config() counted on meta (43 layers, d_model 4096, 256 experts), trainable parameters
FLAGSHIP = 284_325_869_015
HF = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    head_dim=16,
    q_lora_rank=12,
    qk_rope_head_dim=8,
    sliding_window=4,
    compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 4},
    layer_types=["heavily_compressed_attention", "compressed_sparse_attention"] * 2,
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    o_groups=2,
    o_lora_rank=8,
    index_n_heads=8,
    index_head_dim=8,
    index_topk=2,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=None,
)


def _convert(cfg: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return modkit.from_hf_config(cfg)


def test_flagship_spec_counts_transformers_parameters():
    assert modkit.count_params(modkit.load_spec(SPEC)) == FLAGSHIP
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV4Config())
    assert sum(p.numel() for p in hf.parameters() if p.requires_grad) == FLAGSHIP


def test_transformers_defaults_convert_to_the_flagship_spec():
    spec = _convert(transformers.DeepseekV4Config().to_dict())
    assert spec_differences(spec, modkit.load_spec(SPEC)) == []
    assert _convert({"model_type": "deepseek_v4"}).to_dict() == spec.to_dict()  # the table's defaults agree


@pytest.mark.parametrize(
    "layer_types",
    [
        None,  # the flagship's pattern
        ["sliding_attention"] * 4,  # no compressed layer: compress_rates and the indexer keep their values
        ["compressed_sparse_attention", "sliding_attention", "heavily_compressed_attention", "sliding_attention"],
    ],
)
def test_the_written_config_converts_back_to_the_same_spec(layer_types):
    """What an export writes (the table's keys and the own ones) reads back as the same network, and transformers
    builds from it the model of the same parameter count."""
    from modkit_plugins.hf.deepseek_v4 import DEEPSEEK_V4

    source = dict(HF, layer_types=layer_types, rope_theta=20000.0, compress_rope_theta=80000.0)
    if layer_types is None:
        source = {k: v for k, v in transformers.DeepseekV4Config().to_dict().items() if k != "transformers_version"}
    spec = _convert({**source, "model_type": "deepseek_v4"})
    written = DEEPSEEK_V4.to_config(spec, source)
    assert spec_differences(_convert({"model_type": "deepseek_v4", **written}), spec) == []
    if layer_types is not None:  # a RoPE base no layer uses is still the source's
        assert (written["rope_theta"], written["compress_rope_theta"]) == (20000.0, 80000.0)
        with torch.device("meta"):
            hf = transformers.AutoModelForCausalLM.from_config(transformers.DeepseekV4Config(**written))
        assert sum(p.numel() for p in hf.parameters()) == modkit.count_params(spec)


def test_legacy_keys_read_as_transformers_reads_them():
    """``compress_ratios`` (per layer 0 / 4 / 128), ``compress_rate_csa`` and ``num_hash_layers``, which published
    checkpoints hold and ``DeepseekV4Config`` folds into ``layer_types``, ``compress_rates``, ``mlp_layer_types``."""
    legacy = dict(HF, layer_types=None, mlp_layer_types=None, compress_rates=None)
    legacy.update(compress_ratios=[128, 4, 0, 4], compress_rate_csa=2, num_hash_layers=2)
    ours = _convert({"model_type": "deepseek_v4", **legacy})
    theirs = _convert(transformers.DeepseekV4Config(**legacy).to_dict())
    assert spec_differences(ours, theirs) == []
    kinds = [(a.compress_ratio, a.rope_theta) for a in (ours.layer(i).attention for i in range(4))]
    assert kinds == [(128, 160000.0), (2, 160000.0), (None, 10000.0), (2, 160000.0)]
    assert [ours.layer(i).ffn.router.type for i in range(4)] == ["hash"] * 2 + ["sqrtsoftplus_topk"] * 2


@pytest.mark.parametrize(
    "change, key",
    [
        (
            {"layer_types": ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]},
            "layer_types",
        ),
        ({"rope_parameters": {"rope_type": "linear", "factor": 16.0}}, "rope_parameters.rope_type"),
        ({"rope_parameters": {"main": {"rope_type": "llama3"}, "compress": {}}}, "rope_parameters.main.rope_type"),
        ({"num_key_value_heads": 2}, "num_key_value_heads"),
        ({"scoring_func": "sigmoid"}, "scoring_func"),
    ],
)
def test_configs_it_cannot_express_are_refused_naming_the_key(change, key):
    with pytest.raises(modkit.SpecError, match=key.replace(".", r"\.")):
        _convert({"model_type": "deepseek_v4", **HF, **change})


def _tiny(cfg: dict):
    """A tiny random ``DeepseekV4ForCausalLM`` of ``cfg``, every parameter off its init."""
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(
        transformers.DeepseekV4Config(**cfg), attn_implementation="eager"
    )
    hf.eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in hf.parameters():  # every parameter off its init (sinks, gate biases, norms)
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
        for n, b in hf.named_buffers():
            if n.endswith("tid2eid"):  # two distinct experts per token id
                first = torch.randint(0, 4, (b.shape[0],), generator=g)
                b.copy_(torch.stack([first, (first + 1) % 4], dim=-1))
            elif n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
    return hf


def test_tiny_model_loaded_with_from_hf_equals_transformers_logits_and_greedy_tokens(tmp_path):
    hf = _tiny(HF)
    hf.save_pretrained(tmp_path)
    model = modkit.from_hf(tmp_path).eval()
    assert modkit.count_params(model) == sum(p.numel() for p in hf.parameters())
    ids = torch.randint(2, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        diff = (model(ids).logits - hf(ids).logits).abs().max().item()
        theirs = hf.generate(ids[:, :7], attention_mask=torch.ones_like(ids[:, :7]), max_new_tokens=12, do_sample=False)
    assert diff <= 1e-5
    assert torch.equal(generate(model, ids[:, :7], max_new_tokens=12, temperature=0), theirs)


#: heavily compressed, compressed-sparse, sliding, compressed-sparse: both rope labels
TYPES_WITH_SLIDING = ["heavily_compressed_attention", "compressed_sparse_attention", "sliding_attention"] + [
    "compressed_sparse_attention"
]


#: YaRN per rope label, trained on 8 positions (the tests run 13); the betas put the ramp inside the 4 rotated pairs
YARN = dict(original_max_position_embeddings=8, beta_fast=0.25, beta_slow=0.01, partial_rotary_factor=0.5)


def _yarn_rope() -> dict:
    """Nested ``rope_parameters`` (a fresh dict: transformers fills them in place): main's attention factor given,
    compress's from its mscales."""
    return {
        "main": dict(YARN, rope_type="yarn", rope_theta=10000.0, factor=4.0, attention_factor=1.3),
        "compress": dict(YARN, rope_type="yarn", rope_theta=160000.0, factor=16.0, mscale=1.0, mscale_all_dim=0.5),
    }


def test_yarn_reads_per_rope_label_as_transformers_reads_it():
    """Nested per label: each label's scaling (compress's attention factor derived from its mscales); flat (or the
    legacy ``rope_scaling``): the compressed layers' scaling at ``compress_rope_theta``, attention factor 1."""
    nested = _convert(
        {"model_type": "deepseek_v4", **HF, "layer_types": TYPES_WITH_SLIDING, "rope_parameters": _yarn_rope()}
    )
    main, compress = nested.layer(2).attention, nested.layer(0).attention
    assert (main.rope_theta, main.rope_scaling.factor, main.rope_scaling.attention_factor) == (10000.0, 4.0, 1.3)
    assert (compress.rope_theta, compress.rope_scaling.factor, compress.rope_scaling.mscale_all_dim) == (
        160000.0,
        16.0,
        0.5,
    )
    assert compress.rope_scaling.original_max_seq_len == 8 and compress.rope_scaling.beta_slow == 0.01
    flat = {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 8, "rope_theta": 5.0}
    for key in ("rope_parameters", "rope_scaling"):
        cfg = {**HF, "layer_types": TYPES_WITH_SLIDING, key: dict(flat)}
        ours = _convert({"model_type": "deepseek_v4", **cfg})
        theirs = _convert(transformers.DeepseekV4Config(**cfg).to_dict())
        assert spec_differences(ours, theirs) == []
        att = ours.layer(0).attention
        assert (att.rope_theta, att.rope_scaling.factor, att.rope_scaling.attention_factor) == (160000.0, 16.0, 1.0)
        assert ours.layer(2).attention.rope_scaling is None
    cfg = dict(HF, layer_types=TYPES_WITH_SLIDING, rope_parameters=_yarn_rope())
    assert spec_differences(nested, _convert(transformers.DeepseekV4Config(**cfg).to_dict())) == []


def test_tiny_yarn_model_equals_transformers_and_exports_back(tmp_path):
    """YaRN on both labels, 13 positions past the 8 it was trained on: from_hf's float32 logits within 1e-5 of
    transformers' (every row unpadded), and the export loads in transformers with the same logits and reads back as
    the same spec."""
    hf = _tiny(dict(HF, layer_types=TYPES_WITH_SLIDING, rope_parameters=_yarn_rope()))
    hf.save_pretrained(tmp_path / "hf")
    model = modkit.from_hf(tmp_path / "hf").eval()
    assert model.spec.layer(2).attention.rope_scaling.attention_factor == 1.3
    ids = torch.randint(2, 97, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        assert (model(ids).logits - want).abs().max().item() <= 1e-5
        out = modkit.to_hf(model, tmp_path / "export")
        back = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        assert (back(ids).logits - want).abs().max().item() <= 1e-5
    assert back.config.rope_parameters["compress"]["rope_type"] == "yarn"
    assert spec_differences(modkit.from_hf_config(out / "config.json"), model.spec) == []


def test_yarn_export_refuses_what_the_config_cannot_hold():
    """One base and scaling per rope label, and YaRN's correction range always truncated: a spec whose compressed
    layers differ in their scaling, or with ``truncate`` false, is refused naming the field."""
    from modkit_plugins.hf.deepseek_v4 import DEEPSEEK_V4

    cfg = {"model_type": "deepseek_v4", **HF, "layer_types": TYPES_WITH_SLIDING, "rope_parameters": _yarn_rope()}
    d = _convert(cfg).to_dict()
    hca = next(o for o in d["overrides"] if o.get("attention", {}).get("compress_ratio") == 4)
    for change, field in (({"factor": 8.0}, "rope_scaling"), ({"truncate": False}, "truncate")):
        edited = copy.deepcopy(d)
        for slot in [edited["block"]] + edited["overrides"]:
            att = slot.get("attention")
            if att and att.get("compress_ratio") and (field == "truncate" or att == hca["attention"]):
                att["rope_scaling"].update(change)
        with pytest.raises(modkit.CheckpointError, match=field):
            DEEPSEEK_V4.to_config(modkit.load_spec(edited), cfg)
