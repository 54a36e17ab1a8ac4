"""Hugging Face ``phi`` (Phi-1, Phi-1.5, Phi-2) → modkit.

Semantics: ``transformers/models/phi/{configuration,modeling}_phi.py``: ``parallel`` blocks with one shared
LayerNorm (``x + attn(ln(x)) + mlp(ln(x))``); q/k/v and ``dense`` projections all biased; optional per-head
LayerNorm QK-norm (``qk_layernorm``, with bias, over ``hidden_size // num_attention_heads``); RoPE on the first
``partial_rotary_factor`` (default 0.5) of each head, half-split pairs; MLP ``fc1``/``fc2`` with biases and
``hidden_act`` (``gelu_new`` is the tanh GELU); final LayerNorm; LM head with a bias, untied by default.
"""

from __future__ import annotations

from ._common import HFConfig, attention, kv_heads_of, layernorm, model_spec, rope, sizes
from ._weights import HFWeights, Renames, head_link, hf_activation, rope_fields

MODEL_TYPE = "phi"

# transformers PhiConfig defaults
DEFAULTS = dict(
    vocab_size=51200,
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=24,
    num_attention_heads=32,
    max_position_embeddings=2048,
    layer_norm_eps=1e-5,
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``phi`` config → modkit spec dict.

    Raises:
        SpecError: every unsupported or unknown field, named with its value.
    """
    r = HFConfig(cfg, MODEL_TYPE)
    s = sizes(r, DEFAULTS)
    d, n_heads = s["d_model"], s["n_heads"]
    if d % n_heads:
        r.error("num_attention_heads", f"hidden_size = {d} is not divisible by num_attention_heads = {n_heads}")
    head_dim = d // n_heads
    r.expect("head_dim", head_dim, "Phi's QK-norm and rotary sizes assume head_dim = hidden_size // num_attention_heads")
    kv = kv_heads_of(r, n_heads)
    d_ff = r.number("intermediate_size", DEFAULTS["intermediate_size"], integer=True)
    act = r.activation("hidden_act", "gelu_new")
    eps = r.number("layer_norm_eps", DEFAULTS["layer_norm_eps"])
    tie = r.flag("tie_word_embeddings", False)
    init_std = r.number("initializer_range", 0.02)
    qk = layernorm(eps) if r.flag("qk_layernorm", False) else None
    position = rope(r, default_theta=10000.0, default_partial=0.5, max_seq_len=s["max_seq_len"])

    block = {
        "attention": attention(d, n_heads, kv, head_dim, bias=(True,) * 4, qk_norm=qk),
        "ffn": {"type": "mlp", "d_ff": d_ff, "activation": act, "bias": True},
        "norm": layernorm(eps),
        "placement": {"type": "parallel", "shared_norm": True},
    }
    spec = model_spec(
        r,
        vocab_size=s["vocab_size"],
        d_model=d,
        n_layers=s["n_layers"],
        max_seq_len=s["max_seq_len"],
        position=position,
        block=block,
        final_norm=layernorm(eps),
        tie_embeddings=tie,
        lm_head_bias=True,
        init_std=init_std,
    )
    return r.finish(spec)


# ---------------------------------------------------------------------------------------------- weights


def links(spec, shapes, config):
    """Phi names: ``model.layers.{i}.input_layernorm`` (the shared norm), ``self_attn.{q,k,v}_proj`` and
    ``self_attn.dense`` (output), ``self_attn.{q,k}_layernorm``, ``mlp.fc1``/``fc2``, ``model.final_layernorm``,
    ``lm_head`` with its bias (also when the weight is tied)."""
    L = "model.layers.{i}."
    table = Renames([
        ("embed.weight", "model.embed_tokens.weight"),
        ("final_norm.{p}", "model.final_layernorm.{p}"),
        ("layers.{i}.attn_norm.{p}", L + "input_layernorm.{p}"),
        ("layers.{i}.attention.q_proj.{p}", L + "self_attn.q_proj.{p}"),
        ("layers.{i}.attention.k_proj.{p}", L + "self_attn.k_proj.{p}"),
        ("layers.{i}.attention.v_proj.{p}", L + "self_attn.v_proj.{p}"),
        ("layers.{i}.attention.o_proj.{p}", L + "self_attn.dense.{p}"),
        ("layers.{i}.attention.q_norm.{p}", L + "self_attn.q_layernorm.{p}"),
        ("layers.{i}.attention.k_norm.{p}", L + "self_attn.k_layernorm.{p}"),
        ("layers.{i}.ffn.up.{p}", L + "mlp.fc1.{p}"),
        ("layers.{i}.ffn.down.{p}", L + "mlp.fc2.{p}"),
        ("lm_head.bias", "lm_head.bias"),
        ("lm_head_bias", "lm_head.bias"),
    ])
    return table.links(shapes) + head_link(spec, shapes)


def to_config(spec, base):
    """Spec → ``PhiConfig`` keys (``partial_rotary_factor`` always written: Phi's default is 0.5)."""
    ls = spec.layer(0)
    att, ffn = ls.attention, ls.ffn
    cfg = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": getattr(ffn, "d_ff", None),
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.kv_heads,
        "max_position_embeddings": spec.max_seq_len,
        "hidden_act": hf_activation(getattr(ffn, "activation", "gelu_tanh"), "gelu_new", base.get("hidden_act")),
        "layer_norm_eps": getattr(ls.norm, "eps", None),
        "tie_word_embeddings": spec.tie_embeddings,
        "initializer_range": spec.init_std,
        "qk_layernorm": getattr(att, "qk_norm", None) is not None,
    }
    cfg.update(rope_fields(ls.position, always_partial=True))
    return cfg


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE, convert=convert, make_links=links, to_config=to_config, architecture="PhiForCausalLM"
)
