"""Per-model details written as specs, against transformers on the same weights (float32, 1e-5, left padding).

* GPT-NeoX (Pythia): ``parallel`` with two norms (``use_parallel_residual``) and ``pre`` (the sequential form),
  partial rotary 0.25 in the half-split layout: the block equals ``GPTNeoXLayer`` (its fused per-head q/k/v weight
  split into q/k/v);
* Cohere: ``parallel`` with one shared bias-free LayerNorm, interleaved RoPE, QK LayerNorm with a weight per head
  (``qk_norm_scope: each_head``) or none, ``logit_scale``: the model equals ``CohereForCausalLM``;
* Granite: ``embedding_scale`` (embedding_multiplier), ``softmax_scale`` (attention_multiplier),
  ``residual_multiplier`` on ``pre``, ``logit_scale = 1 / logits_scaling``: equals ``GraniteForCausalLM``;
* GLM-4: ``sandwich`` (input, post_self_attn, post_attention, post_mlp layernorms), interleaved partial RoPE,
  q/k/v biases: equals ``Glm4ForCausalLM`` (its fused gate_up_proj split);
* SmolLM3: NoPE on its last layer through ``overrides[].position: {"type": "none"}``, RoPE elsewhere: equals
  ``SmolLM3ForCausalLM``.

Whole models run a full forward and, through the KV cache, a prefill then chunks and single tokens; their logits are
compared with transformers' full forward (position ids counted over real tokens, as generation derives them).
"""

from __future__ import annotations

import pytest
import torch

import modkit
from tests.hf_layers import CHUNKS, assert_close, hf_mask, left_padded, positions_of, record

transformers = pytest.importorskip("transformers")
T = transformers

VOCAB = 97
SMALL = dict(vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _spec(**parts) -> dict:
    block = {k: parts.pop(k) for k in ("attention", "ffn", "norm", "placement")}
    return {
        "schema_version": 1,
        "vocab_size": VOCAB,
        "d_model": 64,
        "max_seq_len": 64,
        "n_layers": 2,
        "block": block,
        **parts,
    }


def _randomise(module: torch.nn.Module, seed: int, std: float = 0.1) -> None:
    """Every parameter of the reference redrawn: gains around 1, the rest N(0, std²), so every term matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            noise = torch.randn(p.shape, generator=g) * std
            p.copy_(1 + noise if "norm" in name and name.endswith("weight") else noise)


def _llama_names(n_layers: int, *, ffn_norm=True, head=True, final="model.norm") -> dict[str, str]:
    """modkit parameter name -> transformers name, for a Llama-layout checkpoint."""
    names = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": f"{final}.weight"}
    if head:
        names["lm_head.weight"] = "lm_head.weight"
    for i in range(n_layers):
        L, M = f"model.layers.{i}.", f"layers.{i}."
        names[M + "attn_norm.weight"] = L + "input_layernorm.weight"
        if ffn_norm:
            names[M + "ffn_norm.weight"] = L + "post_attention_layernorm.weight"
        for x in "qkvo":
            names[M + f"attention.{x}_proj.weight"] = L + f"self_attn.{x}_proj.weight"
        for x in ("gate", "up", "down"):
            names[M + f"ffn.{x}.weight"] = L + f"mlp.{x}_proj.weight"
    return names


def _load(model: modkit.Model, hf_state: dict, names: dict[str, str], **tensors) -> None:
    """Copy transformers tensors into ``model`` by ``names`` (plus ready ``tensors``); every parameter must be set."""
    state = {ours: hf_state[theirs] for ours, theirs in names.items()}
    state.update(tensors)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if not m.endswith(("inv_freq", "freq"))], (missing, unexpected)


def _compare_lm(model: modkit.Model, hf, what: str, pad: int = 3) -> float:
    """Logits of a left-padded batch: modkit's full forward and its cached run against transformers' full forward."""
    ids, mask = left_padded(2, 12, pad=pad, vocab=VOCAB, seed=11)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=positions_of(mask)).logits
        full = model(ids, attention_mask=mask).logits
        cache = model.new_cache(2, 12)
        cached = torch.cat([model(ids[:, a:e], attention_mask=mask[:, :e], cache=cache).logits for a, e in CHUNKS], 1)
    worst = assert_close(full, want, mask, f"{what}: full forward")
    return max(worst, assert_close(cached, want, mask, f"{what}: cached decode"))


# ------------------------------------------------------------------------------------------------ GPT-NeoX


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel-residual", "sequential"])
def test_gpt_neox_block_equals_gpt_neox_layer(parallel):
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXLayer, GPTNeoXRotaryEmbedding

    cfg = T.GPTNeoXConfig(
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        num_hidden_layers=2,
        rotary_pct=0.25,
        use_parallel_residual=parallel,
        **SMALL,
    )
    cfg._attn_implementation = "eager"
    placement = {"type": "parallel", "shared_norm": False} if parallel else {"type": "pre"}
    spec = _spec(
        position={"type": "rope", "theta": 10000.0, "layout": "half_split", "partial_rotary": 0.25},
        attention={"type": "mha", "n_heads": 4, "q_bias": True, "k_bias": True, "v_bias": True, "o_bias": True},
        ffn={"type": "mlp", "d_ff": 128, "activation": "gelu"},
        norm={"type": "layernorm", "eps": 1e-5},
        placement=placement,
        final_norm={"type": "layernorm", "eps": 1e-5},
    )
    model = modkit.build(spec, seed=0).eval()
    rotary = GPTNeoXRotaryEmbedding(cfg)
    refs = []
    for i in range(2):
        ref = GPTNeoXLayer(cfg, i).eval()
        _randomise(ref, seed=20 + i)
        sd = ref.state_dict()
        h, hd = 4, 16
        qkv_w = sd["attention.query_key_value.weight"].view(h, 3, hd, 64)  # fused per head: [q_h; k_h; v_h]
        qkv_b = sd["attention.query_key_value.bias"].view(h, 3, hd)
        ours = {
            "attn_norm.weight": sd["input_layernorm.weight"],
            "attn_norm.bias": sd["input_layernorm.bias"],
            "ffn_norm.weight": sd["post_attention_layernorm.weight"],
            "ffn_norm.bias": sd["post_attention_layernorm.bias"],
            "attention.o_proj.weight": sd["attention.dense.weight"],
            "attention.o_proj.bias": sd["attention.dense.bias"],
            "ffn.up.weight": sd["mlp.dense_h_to_4h.weight"],
            "ffn.up.bias": sd["mlp.dense_h_to_4h.bias"],
            "ffn.down.weight": sd["mlp.dense_4h_to_h.weight"],
            "ffn.down.bias": sd["mlp.dense_4h_to_h.bias"],
        }
        for j, x in enumerate("qkv"):
            ours[f"attention.{x}_proj.weight"] = qkv_w[:, j].reshape(h * hd, 64)
            ours[f"attention.{x}_proj.bias"] = qkv_b[:, j].reshape(h * hd)
        model.layers[i].load_state_dict(ours)
        refs.append(ref)
    ids, mask = left_padded(2, 12, pad=3, vocab=VOCAB, seed=12)
    pos = positions_of(mask)
    for cached in (False, True):
        got = record(model, lambda m, i: m.layers[i], ids, mask, CHUNKS if cached else None)
        for i, ref in enumerate(refs):
            x, out = got[i]
            with torch.no_grad():
                want = ref(x, attention_mask=hf_mask("causal", cfg, x, mask), position_embeddings=rotary(x, pos))
            assert_close(out, want, mask, f"layer {i}{' cached' if cached else ''}")


# ------------------------------------------------------------------------------------------------ Cohere


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk-layernorm"])
def test_cohere_equals_transformers(qk_norm):
    cfg = T.CohereConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        num_hidden_layers=2,
        use_qk_norm=qk_norm,
        logit_scale=0.3,
        **SMALL,
    )
    hf = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf, seed=30)
    ln = {"type": "layernorm", "eps": 1e-5, "bias": False}
    attention = {"type": "gqa", "n_heads": 4, "n_kv_heads": 2}
    if qk_norm:
        attention.update(qk_norm=ln, qk_norm_scope="each_head")
    spec = _spec(
        position={"type": "rope", "theta": 500000.0, "layout": "interleaved"},
        attention=attention,
        ffn={"type": "swiglu", "d_ff": 96},
        norm=ln,
        placement={"type": "parallel", "shared_norm": True},
        final_norm=ln,
        tie_embeddings=True,
        logit_scale=0.3,
    )
    model = modkit.build(spec, seed=0).eval()
    names = _llama_names(2, ffn_norm=False, head=False)
    if qk_norm:
        for i in range(2):
            for x in "qk":
                names[f"layers.{i}.attention.{x}_norm.weight"] = f"model.layers.{i}.self_attn.{x}_norm.weight"
    _load(model, hf.state_dict(), names)
    assert modkit.count_params(spec) == sum(p.numel() for p in hf.parameters())
    _compare_lm(model, hf, f"cohere ({'qk-norm' if qk_norm else 'plain'})")


# ------------------------------------------------------------------------------------------------ Granite


def test_granite_multipliers_equal_transformers():
    cfg = T.GraniteConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        num_hidden_layers=2,
        embedding_multiplier=6.0,
        residual_multiplier=0.22,
        attention_multiplier=0.4,
        logits_scaling=6.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        **SMALL,
    )
    hf = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf, seed=40)
    rms = {"type": "rmsnorm", "eps": 1e-6}
    spec = _spec(
        position={"type": "rope", "theta": 10000.0},
        attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "softmax_scale": 0.4},
        ffn={"type": "swiglu", "d_ff": 96},
        norm=rms,
        placement={"type": "pre", "residual_multiplier": 0.22},
        final_norm=rms,
        embedding_scale=6.0,
        logit_scale=1 / 6.0,
    )
    model = modkit.build(spec, seed=0).eval()
    _load(model, hf.state_dict(), _llama_names(2))
    assert modkit.count_params(spec) == sum(p.numel() for p in hf.parameters())
    _compare_lm(model, hf, "granite")
    # each multiplier matters: dropping any one of them moves the logits far beyond the tolerance
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        base = model(ids).logits
        for block in model.layers:
            block.residual_multiplier = 1.0
        assert (model(ids).logits - base).abs().max() > 1e-2


# ------------------------------------------------------------------------------------------------ GLM-4


def test_glm4_sandwich_equals_transformers():
    cfg = T.Glm4Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
        attention_bias=True,
        **SMALL,
    )
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.5
    hf = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf, seed=50)
    rms = {"type": "rmsnorm", "eps": 1e-5}
    spec = _spec(
        position={"type": "rope", "theta": 10000.0, "layout": "interleaved", "partial_rotary": 0.5},
        attention={
            "type": "gqa",
            "n_heads": 4,
            "n_kv_heads": 2,
            "head_dim": 16,
            "q_bias": True,
            "k_bias": True,
            "v_bias": True,
        },
        ffn={"type": "swiglu", "d_ff": 96},
        norm=rms,
        placement={"type": "sandwich"},
        final_norm=rms,
    )
    model = modkit.build(spec, seed=0).eval()
    sd = hf.state_dict()
    names = {
        "embed.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight",
    }
    extra = {}
    for i in range(2):
        L, M = f"model.layers.{i}.", f"layers.{i}."
        names.update(
            {
                M + "attn_norm.weight": L + "input_layernorm.weight",
                M + "attn_post_norm.weight": L + "post_self_attn_layernorm.weight",
                M + "ffn_norm.weight": L + "post_attention_layernorm.weight",
                M + "ffn_post_norm.weight": L + "post_mlp_layernorm.weight",
                M + "ffn.down.weight": L + "mlp.down_proj.weight",
            }
        )
        for x in "qkvo":
            names[M + f"attention.{x}_proj.weight"] = L + f"self_attn.{x}_proj.weight"
        for x in "qkv":
            names[M + f"attention.{x}_proj.bias"] = L + f"self_attn.{x}_proj.bias"
        gate, up = sd[L + "mlp.gate_up_proj.weight"].chunk(2, dim=0)
        extra.update({M + "ffn.gate.weight": gate, M + "ffn.up.weight": up})
    _load(model, sd, names, **extra)
    assert modkit.count_params(spec) == sum(p.numel() for p in hf.parameters())
    _compare_lm(model, hf, "glm4")


# ------------------------------------------------------------------------------------------------ SmolLM3


def test_smollm3_nope_layers_through_overrides_equal_transformers():
    cfg = T.SmolLM3Config(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        num_hidden_layers=4,
        no_rope_layers=[1, 1, 1, 0],
        tie_word_embeddings=False,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        **SMALL,
    )
    hf = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    _randomise(hf, seed=60)
    rms = {"type": "rmsnorm", "eps": 1e-6}
    spec = _spec(
        position={"type": "rope", "theta": 10000.0},
        attention={"type": "gqa", "n_heads": 4, "n_kv_heads": 2},
        ffn={"type": "swiglu", "d_ff": 96},
        norm=rms,
        placement={"type": "pre"},
        final_norm=rms,
        overrides=[{"layers": [3], "position": {"type": "none"}}],
    )
    spec["n_layers"] = 4
    model = modkit.build(spec, seed=0).eval()
    _load(model, hf.state_dict(), _llama_names(4))
    assert [type(model.positions[model.layer_position[i]]).__name__ for i in range(4)] == ["Rope"] * 3 + ["NoPosition"]
    _compare_lm(model, hf, "smollm3")
    # the NoPE layer matters: with RoPE on every layer the logits differ
    roped = modkit.build({**spec, "overrides": []}, seed=0).eval()
    roped.load_state_dict(model.state_dict())
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (roped(ids).logits - model(ids).logits).abs().max() > 1e-3


@pytest.mark.parametrize(
    "field,change",
    [
        ("logit_scale", {"logit_scale": 0.5}),
        ("residual_multiplier", {"block__placement": {"type": "pre", "residual_multiplier": 0.5}}),
        ("sinks", {"block__attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "sinks": True}}),
    ],
)
def test_export_to_a_type_without_the_detail_is_refused(tmp_path, field, change):
    """A Llama checkpoint has no place for these details: the export names the field instead of dropping it."""
    from tests.conftest import tiny_spec

    model = modkit.build(tiny_spec(metadata={"hf_model_type": "llama"}, **change))
    with pytest.raises(modkit.CheckpointError, match="different network") as info:
        modkit.to_hf(model, tmp_path / "out")
    assert field in str(info.value)
