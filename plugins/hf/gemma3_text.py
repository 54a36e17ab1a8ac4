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

from ._common import HFConfig, attention, gated_ffn, head_dim_of, kv_heads_of, model_spec, per_layer, rmsnorm, rope, sizes

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

    local_pos = rope(r, default_theta=10_000.0, layer_type="sliding_attention", theta_key="rope_local_base_freq", scaling_key=None)
    global_pos = rope(r, default_theta=1_000_000.0, layer_type="full_attention")

    pattern = r.number("sliding_window_pattern", DEFAULTS["sliding_window_pattern"], aliases=("_sliding_window_pattern",), integer=True)
    types = r.get("layer_types")
    if types is None:
        # transformers keeps the pattern only to derive layer_types when those are absent
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        r.error("layer_types", f"must list one type per layer ({n_layers}), got {types!r}")
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
