"""Hugging Face ``gemma2`` → modkit.

Semantics: ``transformers/models/gemma2/{configuration,modeling}_gemma2.py`` (``Gemma2Config``,
``Gemma2ForCausalLM``):

* RMSNorm in the ``(1 + weight)`` form everywhere (``unit_offset``); no QK-norm;
* ``sandwich`` blocks: input, post-attention, pre-feedforward and post-feedforward norms;
* token embeddings scaled by ``sqrt(hidden_size)`` (``embedding_scale: "sqrt_d_model"``), head tied by default;
* GeGLU MLP with ``hidden_activation`` (``gelu_pytorch_tanh``). Published configs also carry a legacy
  ``hidden_act`` that ``Gemma2MLP`` never reads, and some a ``sliding_window_size`` beside ``sliding_window``
  that ``Gemma2Config`` does not read either: both are ignored, as transformers does;
* attention scores scaled by ``query_pre_attn_scalar ** -0.5`` (``softmax_scale``), then soft-capped,
  ``attn_logit_softcapping · tanh(scores / attn_logit_softcapping)`` (``logit_softcap``; default 50), before the
  mask; ``attention_bias`` on all four projections;
* final logits soft-capped by ``final_logit_softcapping`` (default 30) → ``final_logit_softcap``;
* local/global layers: ``layer_types`` (transformers 5), else layer ``i`` slides iff ``i`` is even (4.x:
  ``not bool(layer_idx % 2)``) with ``sliding_window``; one RoPE (``rope_theta``, ``rope_scaling``) for all layers.
"""

from __future__ import annotations

from modkit.validation import json_value

from ._common import HFConfig, attention, gated_ffn, head_dim_of, kv_heads_of, model_spec, per_layer, rmsnorm, rope, sizes
from ._weights import HFWeights, hf_activation, layer_windows, rope_fields
from .gemma3_text import _scalar, links

MODEL_TYPE = "gemma2"

# transformers Gemma2Config defaults
DEFAULTS = dict(
    vocab_size=256_000,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=8192,
    rms_norm_eps=1e-6,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    final_logit_softcapping=30.0,
    attn_logit_softcapping=50.0,
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``gemma2`` config → modkit spec dict.

    Raises:
        SpecError: every unsupported field, named with its value.
    """
    r = HFConfig(cfg, MODEL_TYPE, ignore=("hidden_act", "sliding_window_size"))
    s = sizes(r, DEFAULTS)
    d, n_heads, n_layers = s["d_model"], s["n_heads"], s["n_layers"]
    kv = kv_heads_of(r, n_heads, default=DEFAULTS["num_key_value_heads"])
    head_dim = head_dim_of(r, d, n_heads, DEFAULTS["head_dim"])
    act = r.activation("hidden_activation", "gelu_pytorch_tanh")
    d_ff = r.number("intermediate_size", DEFAULTS["intermediate_size"], integer=True)
    eps = r.number("rms_norm_eps", DEFAULTS["rms_norm_eps"])
    tie = r.flag("tie_word_embeddings", True)
    init_std = r.number("initializer_range", 0.02)
    bias = r.flag("attention_bias", False)
    scalar = r.number("query_pre_attn_scalar", DEFAULTS["query_pre_attn_scalar"])
    window = r.number("sliding_window", DEFAULTS["sliding_window"], integer=True)
    # a present null switches soft-capping off; an absent key means the class default
    final_cap = r.number("final_logit_softcapping", None) if "final_logit_softcapping" in cfg else DEFAULTS["final_logit_softcapping"]
    attn_cap = r.number("attn_logit_softcapping", None) if "attn_logit_softcapping" in cfg else DEFAULTS["attn_logit_softcapping"]
    r.expect(
        "use_bidirectional_attention", False, "bidirectional (encoder) Gemma changes the mask and window; only the causal LM is supported"
    )
    position = rope(r, default_theta=10_000.0, max_seq_len=s["max_seq_len"])

    types = r.get("layer_types")
    if types is None:  # Gemma2Config.__post_init__ and the 4.x modeling: even layers slide
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        r.error("layer_types", f"must list one type per layer ({n_layers}), got {json_value(types)}")
        types = ["full_attention"] * n_layers
    bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if bad:
        r.error("layer_types", f"unsupported layer types {bad}; supported: 'full_attention', 'sliding_attention'")

    def slots(kind: str) -> dict:
        return {
            "attention": attention(
                d,
                n_heads,
                kv,
                head_dim,
                bias=(bias,) * 4,
                sliding_window=window if kind == "sliding_attention" else None,
                softmax_scale=float(scalar) ** -0.5,
                logit_softcap=attn_cap,
            )
        }

    default, overrides = per_layer(types, n_layers, slots)
    block = {
        "attention": slots(default)["attention"],
        "ffn": gated_ffn(d_ff, act),
        "norm": rmsnorm(eps, unit_offset=True),
        "placement": {"type": "sandwich"},
    }
    spec = model_spec(
        r,
        vocab_size=s["vocab_size"],
        d_model=d,
        n_layers=n_layers,
        max_seq_len=s["max_seq_len"],
        position=position,
        block=block,
        overrides=overrides,
        embedding_scale="sqrt_d_model",
        final_norm=rmsnorm(eps, unit_offset=True),
        tie_embeddings=tie,
        final_logit_softcap=final_cap,
        init_std=init_std,
    )
    return r.finish(spec)


def to_config(spec, base):
    """Spec → ``Gemma2Config`` keys: ``layer_types`` from the per-layer windows; the soft-caps written explicitly
    (null when off, since the class defaults are 50 and 30)."""
    windows = layer_windows(spec)
    ls = spec.layer(0)
    att, ffn = ls.attention, ls.ffn
    hd = att.resolved_head_dim(spec.d_model)
    cfg = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "intermediate_size": getattr(ffn, "d_ff", None),
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": att.n_heads,
        "num_key_value_heads": att.kv_heads,
        "head_dim": hd,
        "max_position_embeddings": spec.max_seq_len,
        "rms_norm_eps": getattr(ls.norm, "eps", None),
        "hidden_activation": hf_activation(getattr(ffn, "act", "gelu_tanh"), "gelu_pytorch_tanh", base.get("hidden_activation")),
        "tie_word_embeddings": spec.tie_embeddings,
        "initializer_range": spec.init_std,
        "attention_bias": bool(getattr(att, "q_bias", False)),
        "query_pre_attn_scalar": _scalar(getattr(att, "softmax_scale", None), hd),
        "attn_logit_softcapping": getattr(att, "logit_softcap", None),
        "final_logit_softcapping": spec.final_logit_softcap,
        "layer_types": ["sliding_attention" if w is not None else "full_attention" for w in windows],
        "sliding_window": next((w for w in windows if w is not None), base.get("sliding_window") or DEFAULTS["sliding_window"]),
    }
    cfg.update(rope_fields(ls.position))
    return cfg


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE, convert=convert, make_links=links, to_config=to_config, architecture="Gemma2ForCausalLM",
    carry=("hidden_act", "sliding_window_size"),
)
