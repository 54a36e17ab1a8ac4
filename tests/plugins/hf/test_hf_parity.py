"""Weights parity with transformers (a test-only dependency) for every supported Hugging Face model type.

For each case a small random transformers model that keeps the type's structural features (GQA ratio, QK-norm
kind, sliding windows, MoE routing, biases, tying, partial rotary, parallel blocks, fused layouts...) is saved with
``save_pretrained`` (safetensors), loaded with :func:`modkit.from_hf`, and run on a batch **with left padding** in
float32: the logits of real tokens agree to 1e-5 (BERT: the last hidden state). Then:

* :func:`modkit.to_hf` writes it back; every tensor of the export equals the original file's bitwise
  (HF → modkit → HF), and transformers loads the export and gives the same logits;
* :func:`modkit.save` / :func:`modkit.load` reproduce every tensor bitwise (modkit → modkit).

The achieved differences are printed (``pytest -s``) and collected in ``PARITY``.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open

import modkit

transformers = pytest.importorskip("transformers")
T = transformers

TOL = 1e-5
SMALL = dict(vocab_size=97, max_position_embeddings=64)
PARITY: dict[str, dict[str, float]] = {}

# (id, config class, kwargs, model class): at least one per model type; features named in the comment
CASES = [
    # gpt2: tied head, fused Conv1D c_attn (transposed), learned positions, gelu_new
    ("gpt2", T.GPT2Config, dict(n_embd=64, n_head=4, n_layer=2, n_positions=64, vocab_size=97), "causal"),
    # gpt2: untied head, relu, no 1/sqrt(d) scaling
    (
        "gpt2-untied-relu",
        T.GPT2Config,
        dict(
            n_embd=64,
            n_head=4,
            n_layer=2,
            n_positions=64,
            vocab_size=97,
            n_inner=96,
            activation_function="relu",
            tie_word_embeddings=False,
            scale_attn_weights=False,
        ),
        "causal",
    ),
    # llama: GQA 2:1, attention and MLP biases, llama3 RoPE scaling, untied
    (
        "llama",
        T.LlamaConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 500000.0,
            },
            **SMALL,
        ),
        "causal",
    ),
    # llama: MQA, head_dim 32 != 64 / 4, tied, linear scaling
    (
        "llama-mqa-tied",
        T.LlamaConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=80,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
            **SMALL,
        ),
        "causal",
    ),
    # mistral: GQA 4:1, sliding window 4 (shorter than the batch)
    (
        "mistral",
        T.MistralConfig,
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            sliding_window=4,
            **SMALL,
        ),
        "causal",
    ),
    # mixtral: 4 experts, top-2 renormalised, GQA, sliding window
    (
        "mixtral",
        T.MixtralConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=48,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=5,
            **SMALL,
        ),
        "causal",
    ),
    # qwen2: q/k/v biases (no output bias), tied, sliding window on layer 1 only
    (
        "qwen2",
        T.Qwen2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=1,
            **SMALL,
        ),
        "causal",
    ),
    # qwen3: per-head QK RMSNorm, head_dim 32 != 64 / 4, GQA, attention biases
    (
        "qwen3",
        T.Qwen3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            num_hidden_layers=2,
            intermediate_size=96,
            attention_bias=True,
            tie_word_embeddings=False,
            **SMALL,
        ),
        "causal",
    ),
    # gemma3: MQA, (1 + w) RMSNorm sandwich, local/global layers (window 4, separate RoPE bases, linear scaling on
    # global), query_pre_attn_scalar != head_dim, final softcap, sqrt(d) embedding scale, tied
    (
        "gemma3_text",
        T.Gemma3TextConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=16,
            num_hidden_layers=3,
            intermediate_size=96,
            sliding_window=4,
            query_pre_attn_scalar=24,
            final_logit_softcapping=3.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
            **SMALL,
        ),
        "causal",
    ),
    # gemma2: GQA, (1 + w) RMSNorm sandwich, alternating local/global layers (window 4), attention logit softcap 0.5
    # (small, so it binds), final softcap 3, query_pre_attn_scalar != head_dim, sqrt(d) embedding scale, tied
    (
        "gemma2",
        T.Gemma2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=3,
            intermediate_size=96,
            sliding_window=4,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=0.5,
            final_logit_softcapping=3.0,
            **SMALL,
        ),
        "causal",
    ),
    # llama: YaRN (factor 4 over 4 trained positions: the batch runs past them), default attention factor
    (
        "llama-yarn",
        T.LlamaConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 4,
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
        "causal",
    ),
    # qwen2: dynamic NTK with 8 trained positions (the 9-token batch grows the base)
    (
        "qwen2-dynamic",
        T.Qwen2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            vocab_size=97,
            max_position_embeddings=8,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
        ),
        "causal",
    ),
    # phi3: LongRoPE over a partial rotary width, trained length 4 (long factors for the batch)
    (
        "phi3-longrope",
        T.Phi3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            partial_rotary_factor=0.5,
            original_max_position_embeddings=4,
            pad_token_id=0,
            eos_token_id=1,
            rope_parameters={
                "rope_type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6],
                "long_factor": [1.0, 2.0, 4.0, 8.0],
                "rope_theta": 10000.0,
            },
            **SMALL,
        ),
        "causal",
    ),
    # olmo2: reordered norm, full-width QK RMSNorm with GQA (k norm narrower than q norm)
    (
        "olmo2",
        T.Olmo2Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            **SMALL,
        ),
        "causal",
    ),
    # olmoe: 4 experts top-2 NOT renormalised, full-width QK-norm, GQA
    (
        "olmoe",
        T.OlmoeConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            norm_topk_prob=False,
            **SMALL,
        ),
        "causal",
    ),
    # falcon-40B style: new decoder architecture, grouped fused QKV (GQA 8/2), two parallel norms, tied
    (
        "falcon-new-arch",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=8,
            num_kv_heads=2,
            num_hidden_layers=2,
            new_decoder_architecture=True,
            ffn_hidden_size=96,
            **SMALL,
        ),
        "causal",
    ),
    # falcon-7B style: multi-query fused QKV, one shared parallel norm
    (
        "falcon-7b-style",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            new_decoder_architecture=False,
            multi_query=True,
            parallel_attn=True,
            **SMALL,
        ),
        "causal",
    ),
    # falcon RW style: multi-head per-head-interleaved fused QKV, sequential pre-norm blocks, biases, untied
    (
        "falcon-sequential-bias",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            new_decoder_architecture=False,
            multi_query=False,
            parallel_attn=False,
            bias=True,
            tie_word_embeddings=False,
            **SMALL,
        ),
        "causal",
    ),
    # falcon with ALiBi (bias scaled by 1/sqrt(head_dim) like the scores)
    (
        "falcon-alibi",
        T.FalconConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            alibi=True,
            new_decoder_architecture=False,
            multi_query=True,
            parallel_attn=True,
            **SMALL,
        ),
        "causal",
    ),
    # phi: parallel block with one shared LayerNorm, partial rotary 0.5, per-head LayerNorm QK-norm, head bias
    (
        "phi",
        T.PhiConfig,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=96,
            qk_layernorm=True,
            partial_rotary_factor=0.5,
            **SMALL,
        ),
        "causal",
    ),
    # phi3: fused qkv_proj and gate_up_proj, GQA, partial rotary 0.75, sliding window
    (
        "phi3",
        T.Phi3Config,
        dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_hidden_layers=2,
            intermediate_size=96,
            sliding_window=5,
            partial_rotary_factor=0.75,
            pad_token_id=0,
            eos_token_id=1,
            **SMALL,
        ),
        "causal",
    ),
    # bert: bidirectional encoder, post-norm, embedding LayerNorm, token types folded, pooler carried along
    (
        "bert",
        T.BertConfig,
        dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=96, **SMALL),
        "encoder",
    ),
]

#: attention implementation of the transformers side (default eager). transformers' eager Falcon adds the ALiBi
#: bias twice (once before the 1/sqrt(head_dim) scaling and again, scaled, through the mask), so its SDPA path is
#: the reference there
IMPL = {"falcon-alibi": "sdpa"}

MODEL_TYPES = [
    "bert",
    "falcon",
    "gemma2",
    "gemma3_text",
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "olmo2",
    "olmoe",
    "phi",
    "phi3",
    "qwen2",
    "qwen3",
]


def _quiet():
    w = warnings.catch_warnings()
    w.__enter__()
    warnings.simplefilter("ignore")
    transformers.logging.set_verbosity_error()
    return w


def make_hf(cls, kwargs, kind, seed=0, impl="eager"):
    """A random transformers model whose every parameter is perturbed (biases and norms too)."""
    cfg = cls(**kwargs)
    torch.manual_seed(seed)
    auto = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel
    hf = auto.from_config(cfg, attn_implementation=impl).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return hf


def batch(vocab: int):
    """Three sequences of 9 tokens, the second and third left-padded (3 and 7 padding tokens)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, :7] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask


def hf_output(hf, ids, mask, kind):
    """transformers' output with positions counted over real tokens (as ``generate`` does for left padding)."""
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=mask, position_ids=pos)
    return out.logits if kind == "causal" else out.last_hidden_state


def ours_output(model, ids, mask, kind):
    with torch.no_grad():
        out = model(ids, attention_mask=mask)
    return out.logits if kind == "causal" else out.hidden


def max_real_diff(a, b, mask) -> float:
    return (a.float() - b.float()).abs()[mask.bool()].max().item()


def file_tensors(folder) -> dict:
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    )
    out = {}
    for f in files:
        with safe_open(str(folder / f), "pt") as h:
            for k in h.keys():
                out[k] = h.get_tensor(k)
    return out


def test_cases_cover_every_model_type():
    covered = {cls.model_type for _, cls, _, _ in CASES}
    assert covered == set(MODEL_TYPES)
    assert set(MODEL_TYPES) <= set(modkit.get_registry().hf_model_types())


@pytest.mark.parametrize("name,cls,kwargs,kind", CASES, ids=[c[0] for c in CASES])
def test_parity_and_round_trips(name, cls, kwargs, kind, tmp_path):
    w = _quiet()
    try:
        impl = IMPL.get(name, "eager")
        hf = make_hf(cls, kwargs, kind, impl=impl)
        src = tmp_path / "hf"
        hf.save_pretrained(src)
        assert (src / "model.safetensors").is_file()
        ids, mask = batch(kwargs.get("vocab_size", 97))
        ref = hf_output(hf, ids, mask, kind)

        # HF -> modkit: logits of real tokens agree
        model = modkit.from_hf(src)
        assert model.spec.metadata["hf_model_type"] == cls.model_type
        got = ours_output(model, ids, mask, kind)
        assert torch.isfinite(got[mask.bool()]).all()
        diff = max_real_diff(got, ref, mask)

        # modkit -> HF: bitwise the same tensors, and transformers gives the same output
        out = tmp_path / "export"
        modkit.to_hf(model, out)
        original, exported = file_tensors(src), file_tensors(out)
        assert sorted(exported) == sorted(original)
        for k, t in original.items():
            assert exported[k].dtype == t.dtype and torch.equal(exported[k], t), k
        auto = transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel
        back = auto.from_pretrained(out, attn_implementation=impl).eval()
        back_diff = max_real_diff(hf_output(back, ids, mask, kind), ref, mask)

        # modkit -> modkit: bitwise
        mk = tmp_path / "modkit"
        modkit.save(model, mk)
        again = modkit.load(mk)
        a, b = model.state_dict(), again.state_dict()
        assert sorted(a) == sorted(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
        assert sorted(model.checkpoint_extras) == sorted(again.checkpoint_extras)
        for k, t in model.checkpoint_extras.items():
            assert torch.equal(t, again.checkpoint_extras[k]), k
        assert torch.equal(ours_output(again, ids, mask, kind), got)
        # ... and the reloaded model exports the same files again
        out2 = tmp_path / "export2"
        modkit.to_hf(again, out2)
        assert json.loads((out2 / "config.json").read_text()) == json.loads((out / "config.json").read_text())
        for k, t in file_tensors(out2).items():
            assert torch.equal(t, original[k]), k
    finally:
        w.__exit__(None, None, None)
    PARITY[name] = {"modkit_vs_hf": diff, "export_vs_hf": back_diff}
    print(
        f"\n[parity] {name:24s} model_type={cls.model_type:12s} max|modkit - hf| = {diff:.3e}   "
        f"max|hf(export) - hf| = {back_diff:.3e}"
    )
    assert diff <= TOL, f"{name}: max abs difference {diff:.3e} over real tokens"
    assert back_diff <= TOL, f"{name}: the exported checkpoint gives {back_diff:.3e}"


def test_export_config_converts_back_to_the_same_spec(tmp_path):
    """The written config.json converts back to the spec (checked inside to_hf too)."""
    w = _quiet()
    try:
        for name, cls, kwargs, kind in CASES:
            hf = make_hf(cls, kwargs, kind)
            hf.save_pretrained(tmp_path / name)
            model = modkit.from_hf(tmp_path / name)
            modkit.to_hf(model, tmp_path / (name + "-out"))
            back = modkit.from_hf_config(tmp_path / (name + "-out") / "config.json")
            a, b = model.spec.to_dict(), back.to_dict()
            for d in (a, b):
                d.pop("name"), d.pop("description")
            assert a == b, name
    finally:
        w.__exit__(None, None, None)


#: keys transformers ignores that published configs carry: legacy keys, keys other libraries add
EXTRA_KEYS = {
    "legacy_hidden_act": "gelu",
    "use_flash_attn": True,
    "quantization_bits": 4,
    "vllm_rope_hint": {"mode": "paged", "blocks": [16, 32]},
}
FIRST_CASE = {}
for _case in CASES:
    FIRST_CASE.setdefault(_case[1].model_type, _case)


@pytest.mark.parametrize("name,cls,kwargs,kind", list(FIRST_CASE.values()), ids=list(FIRST_CASE))
def test_config_with_extra_keys_converts_and_matches(name, cls, kwargs, kind, tmp_path):
    """A config.json with keys the converter does not know converts (one warning naming each key and value), still
    matches transformers (which ignores them), and strict conversion refuses them."""
    w = _quiet()
    try:
        hf = make_hf(cls, kwargs, kind, impl=IMPL.get(name, "eager"))
        hf.save_pretrained(tmp_path)
        path = tmp_path / "config.json"
        cfg = json.loads(path.read_text())
        cfg.update(EXTRA_KEYS)
        path.write_text(json.dumps(cfg))
        again = (
            (transformers.AutoModelForCausalLM if kind == "causal" else transformers.AutoModel)
            .from_pretrained(tmp_path, attn_implementation=IMPL.get(name, "eager"))
            .eval()
        )
        ids, mask = batch(kwargs.get("vocab_size", 97))
        ref = hf_output(again, ids, mask, kind)
    finally:
        w.__exit__(None, None, None)
    with pytest.warns(modkit.UnknownConfigKeyWarning) as rec:
        model = modkit.from_hf(tmp_path)
    found = [r.message for r in rec if isinstance(r.message, modkit.UnknownConfigKeyWarning)]
    assert len(found) == 1 and found[0].keys == EXTRA_KEYS
    diff = max_real_diff(ours_output(model, ids, mask, kind), ref, mask)
    print(f"\n[parity] {name:24s} with extra keys: max|modkit - hf| = {diff:.3e}")
    assert diff <= TOL
    with pytest.raises(modkit.SpecError) as info:
        modkit.from_hf(tmp_path, strict=True)
    assert sorted(p for p, _ in info.value.errors) == sorted(EXTRA_KEYS)


def test_gemma2_greedy_generation_equals_transformers(tmp_path):
    """Greedy decoding through modkit's cache (softcapped eager attention, sliding layers) gives transformers' tokens."""
    from modkit.inference.generate import generate

    w = _quiet()
    try:
        name, cls, kwargs, kind = next(c for c in CASES if c[0] == "gemma2")
        hf = make_hf(cls, kwargs, kind)
        hf.save_pretrained(tmp_path)
        ids = torch.randint(1, 97, (2, 7), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            theirs = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    finally:
        w.__exit__(None, None, None)
    ours = generate(modkit.from_hf(tmp_path), ids, max_new_tokens=12, temperature=0)
    assert torch.equal(ours, theirs), (ours, theirs)
