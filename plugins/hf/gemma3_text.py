"""Hugging Face ``gemma3_text`` → modkit.

Semantics: ``transformers/models/gemma3/{configuration,modeling}_gemma3.py`` (``Gemma3TextConfig``,
``Gemma3ForCausalLM``):

* RMSNorm in the ``(1 + weight)`` form everywhere (``unit_offset``), including the per-head QK-norm;
* ``sandwich`` blocks: input, post-attention, pre-feedforward and post-feedforward norms;
* token embeddings scaled by ``sqrt(hidden_size)`` (``embedding_scale: "sqrt_d_model"``), head tied by default;
* GeGLU MLP with ``hidden_activation`` (``gelu_pytorch_tanh``);
* attention scores scaled by ``query_pre_attn_scalar ** -0.5`` (``softmax_scale``), ``attention_bias`` on all
  four projections; ``attn_logit_softcapping`` must be null; ``final_logit_softcapping`` → ``final_logit_softcap``;
* local/global layers: ``layer_types`` (transformers 5) or ``sliding_window_pattern`` (layer ``i`` is global iff
  ``(i + 1) % pattern == 0``). Local layers use ``sliding_window`` and RoPE base ``rope_local_base_freq``
  without scaling; global layers use ``rope_theta`` and ``rope_scaling``. The majority kind is the block default,
  the other becomes a per-layer override of attention and position.
"""

from __future__ import annotations

from modkit.validation import json_value

from ._common import HFConfig, attention, gated_ffn, head_dim_of, kv_heads_of, model_spec, per_layer, rmsnorm, rope, sizes
from ._weights import HFWeights, Renames, head_link, hf_activation, layer_windows, rope_fields

MODEL_TYPE = "gemma3_text"

# transformers Gemma3TextConfig defaults
DEFAULTS = dict(
    vocab_size=262_208,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=26,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    max_position_embeddings=131_072,
    rms_norm_eps=1e-6,
    query_pre_attn_scalar=256,
    sliding_window=4096,
    sliding_window_pattern=6,
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``gemma3_text`` config → modkit spec dict.

    Raises:
        SpecError: every unsupported or unknown field, named with its value.
    """
    r = HFConfig(cfg, MODEL_TYPE)
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
    softcap = r.number("final_logit_softcapping", None)
    r.expect("attn_logit_softcapping", None, "tanh soft-capping of attention logits is not supported by modkit's attention")
    r.expect(
        "use_bidirectional_attention", False, "bidirectional (encoder) Gemma changes the mask and window; only the causal LM is supported"
    )

    local_pos = rope(r, default_theta=10_000.0, layer_type="sliding_attention", theta_key="rope_local_base_freq",
                     scaling_key=None, max_seq_len=s["max_seq_len"])
    global_pos = rope(r, default_theta=1_000_000.0, layer_type="full_attention", max_seq_len=s["max_seq_len"])

    pattern = r.number("sliding_window_pattern", DEFAULTS["sliding_window_pattern"], aliases=("_sliding_window_pattern",), integer=True)
    types = r.get("layer_types")
    if types is None:
        # transformers keeps the pattern only to derive layer_types when those are absent
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        r.error("layer_types", f"must list one type per layer ({n_layers}), got {json_value(types)}")
        types = ["full_attention"] * n_layers
    bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
    if bad:
        r.error("layer_types", f"unsupported layer types {bad}; supported: 'full_attention', 'sliding_attention'")

    qk_norm = rmsnorm(eps, unit_offset=True)

    def slots(kind: str) -> dict:
        local = kind == "sliding_attention"
        return {
            "attention": attention(
                d,
                n_heads,
                kv,
                head_dim,
                bias=(bias,) * 4,
                qk_norm=qk_norm,
                sliding_window=window if local else None,
                softmax_scale=float(scalar) ** -0.5,
            ),
            "position": local_pos if local else global_pos,
        }

    default, overrides = per_layer(types, n_layers, slots)
    base = slots(default)
    block = {
        "attention": base["attention"],
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
        position=base["position"],
        block=block,
        overrides=overrides,
        embedding_scale="sqrt_d_model",
        final_norm=rmsnorm(eps, unit_offset=True),
        tie_embeddings=tie,
        final_logit_softcap=softcap,
        init_std=init_std,
    )
    return r.finish(spec)


# ---------------------------------------------------------------------------------------------- weights


def links(spec, shapes, config):
    """Gemma 3 names: ``model.layers.{i}.{input,post_attention,pre_feedforward,post_feedforward}_layernorm`` (the
    sandwich norms, stored as the ``w`` of ``(1 + w)``), ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm``,
    ``mlp.{gate,up,down}_proj``; the embedding is stored unscaled (the ``sqrt(hidden_size)`` factor is applied in
    the forward pass, as ``embedding_scale``)."""
    L = "model.layers.{i}."
    pairs = [
        ("embed.weight", "model.embed_tokens.weight"),
        ("final_norm.weight", "model.norm.weight"),
        ("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
        ("layers.{i}.attn_post_norm.weight", L + "post_attention_layernorm.weight"),
        ("layers.{i}.ffn_norm.weight", L + "pre_feedforward_layernorm.weight"),
        ("layers.{i}.ffn_post_norm.weight", L + "post_feedforward_layernorm.weight"),
    ]
    for x in ("q", "k", "v", "o"):
        pairs.append((f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}"))
    for x in ("q", "k"):
        pairs.append((f"layers.{{i}}.attention.{x}_norm.weight", L + f"self_attn.{x}_norm.weight"))
    for x in ("gate", "up", "down"):
        pairs.append((f"layers.{{i}}.ffn.{x}.{{p}}", L + f"mlp.{x}_proj.{{p}}"))
    return Renames(pairs).links(shapes) + head_link(spec, shapes)


def _scalar(scale, head_dim: int):
    """``query_pre_attn_scalar`` for a softmax scale (``scalar ** -0.5``), an integer when it is one."""
    if scale is None:
        return head_dim
    value = float(scale) ** -2
    near = round(value)
    return near if abs(value - near) <= 1e-9 * max(1.0, abs(value)) else value


def to_config(spec, base):
    """Spec → ``Gemma3TextConfig`` keys: ``layer_types`` from the per-layer windows, ``rope_theta``/``rope_scaling``
    from a global layer, ``rope_local_base_freq`` from a sliding one."""
    windows = layer_windows(spec)
    types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
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
        "final_logit_softcapping": spec.final_logit_softcap,
        "layer_types": types,
        "sliding_window": next((w for w in windows if w is not None), base.get("sliding_window") or DEFAULTS["sliding_window"]),
    }
    glob = next((i for i, t in enumerate(types) if t == "full_attention"), None)
    loc = next((i for i, t in enumerate(types) if t == "sliding_attention"), None)
    cfg.update(rope_fields(spec.layer(glob).position) if glob is not None else {"rope_theta": 1_000_000.0, "rope_scaling": None})
    if loc is not None:
        local = rope_fields(spec.layer(loc).position, theta_key="rope_local_base_freq", scaling_key=None)
        cfg["rope_local_base_freq"] = local.get("rope_local_base_freq", 10_000.0)
        if glob is None and "partial_rotary_factor" in local:
            cfg["partial_rotary_factor"] = local["partial_rotary_factor"]
    return cfg


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE, convert=convert, make_links=links, to_config=to_config, architecture="Gemma3ForCausalLM"
)
