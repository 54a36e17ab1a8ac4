"""Hugging Face ``llama`` → modkit, and the shared builder of the Llama family.

Llama, Mistral, Mixtral, Qwen2, Qwen3, OLMo 2, OLMoE and Phi-3 are one architecture with small differences:
RMSNorm, a gated MLP (or an MoE of them), RoPE (half-split pairs, as transformers' ``rotate_half``), untied or
tied head. :func:`convert_family` builds all of them from a :class:`Family` that names the differences;
each model type's module only describes its :class:`Family`.

Semantics: ``transformers/models/llama/{configuration,modeling}_llama.py``. ``attention_bias`` puts a bias on
all four projections, ``mlp_bias`` on the three MLP projections; ``head_dim`` defaults to
``hidden_size // num_attention_heads``; ``pretraining_tp`` only slices matmuls (same result) and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from modkit.validation import json_value

from ._common import HFConfig, attention, gated_ffn, head_dim_of, kv_heads_of, model_spec, per_layer, rmsnorm, rope, sizes
from ._weights import HFWeights, Renames, hf_activation, head_link, layer_windows, rope_fields, split_link, stacked_link

MODEL_TYPE = "llama"


@dataclass(frozen=True)
class Family:
    """What distinguishes one member of the Llama family.

    Attributes:
        model_type: the Hugging Face ``model_type``.
        defaults: transformers' config-class defaults for keys a config may omit.
        attention_bias: ``"flag"``: ``attention_bias`` sets q/k/v/o biases; ``"qkv"``: q/k/v always biased,
            output never (Qwen2); ``"none"``: no biases and no key (Mistral, Mixtral, Phi-3).
        mlp_bias: whether ``mlp_bias`` exists (Llama).
        qk_norm: ``None``, ``"head"`` (RMSNorm over head_dim, Qwen3) or ``"full"`` (over the projection, OLMo).
        placement: ``"pre"`` or ``"reordered"`` (OLMo 2: norm on each sublayer's output).
        sliding: ``"none"``; ``"all"``: ``sliding_window`` applies to every layer (Mistral, Mixtral, Phi-3);
            ``"qwen"``: ``use_sliding_window`` + ``max_window_layers`` or ``layer_types`` choose the layers.
        moe: ``None``, ``"mixtral"`` (renormalised top-k) or ``"olmoe"`` (``norm_topk_prob``).
        head_dim_default: transformers' default when ``head_dim`` is absent (Qwen3: 128), else d_model / n_heads.
        ignore: model-specific keys irrelevant to the architecture.
        expect: ``(key, only supported value, why)`` for model-specific switches modkit cannot express.
        fused: the checkpoint stores q/k/v as one ``qkv_proj`` and gate/up as one ``gate_up_proj`` (Phi-3).
        rope_original_at_top: the config class holds ``original_max_position_embeddings`` at the top level, which
            then wins over the scaling dict's (Phi-3, ``standardize_rope_params``), and exports write it there.
        architecture: the ``architectures`` entry written on export.
    """

    model_type: str
    defaults: dict
    attention_bias: str = "flag"
    mlp_bias: bool = False
    qk_norm: Optional[str] = None
    placement: str = "pre"
    sliding: str = "none"
    moe: Optional[str] = None
    head_dim_default: Optional[int] = None
    ignore: tuple = field(default_factory=tuple)
    expect: tuple = field(default_factory=tuple)
    fused: bool = False
    rope_original_at_top: bool = False
    architecture: str = ""


def convert_family(cfg: dict, fam: Family) -> dict:
    """Convert a config of any Llama-family ``model_type`` described by ``fam``.

    Raises:
        SpecError: every unsupported or unknown field, named with its value.
    """
    r = HFConfig(cfg, fam.model_type, ignore=fam.ignore)
    dflt = fam.defaults
    for key, value, why in fam.expect:
        r.expect(key, value, why)
    s = sizes(r, dflt)
    d, n_heads = s["d_model"], s["n_heads"]
    kv = kv_heads_of(r, n_heads, default=dflt.get("num_key_value_heads"))
    if fam.moe == "olmoe":
        # OLMoE sizes its QK-norms from hidden_size, so transformers only works with the derived head_dim
        r.expect("head_dim", d // n_heads, "OLMoE derives head_dim = hidden_size // num_attention_heads")
        head_dim = d // n_heads
    else:
        head_dim = head_dim_of(r, d, n_heads, fam.head_dim_default)
    act = r.activation("hidden_act", dflt.get("hidden_act", "silu"))
    d_ff = r.number("intermediate_size", dflt.get("intermediate_size"), integer=True)
    eps = r.number("rms_norm_eps", dflt.get("rms_norm_eps", 1e-6))
    tie = r.flag("tie_word_embeddings", dflt.get("tie_word_embeddings", False))
    init_std = r.number("initializer_range", 0.02)
    position = rope(r, default_theta=dflt.get("rope_theta", 10000.0), original_at_top=fam.rope_original_at_top,
                    max_seq_len=s["max_seq_len"])

    if fam.attention_bias == "flag":
        bias = (r.flag("attention_bias", False),) * 4
    elif fam.attention_bias == "qkv":
        bias = (True, True, True, False)
    else:
        bias = (False,) * 4
    mlp_bias = r.flag("mlp_bias", False) if fam.mlp_bias else False
    qk_norm = rmsnorm(eps) if fam.qk_norm else None

    windows = _windows(r, fam, s["n_layers"], dflt)

    if fam.moe:
        ffn = _moe(r, fam, d_ff, act, dflt)
    else:
        ffn = gated_ffn(d_ff, act, mlp_bias)

    def attn(window):
        return attention(
            d, n_heads, kv, head_dim, bias=bias, qk_norm=qk_norm, qk_norm_scope=fam.qk_norm or "head", sliding_window=window
        )

    default_window, overrides = per_layer(windows, s["n_layers"], lambda w: {"attention": attn(w)})
    block = {"attention": attn(default_window), "ffn": ffn, "norm": rmsnorm(eps), "placement": {"type": fam.placement}}
    spec = model_spec(
        r,
        vocab_size=s["vocab_size"],
        d_model=d,
        n_layers=s["n_layers"],
        max_seq_len=s["max_seq_len"],
        position=position,
        block=block,
        overrides=overrides,
        final_norm=rmsnorm(eps),
        tie_embeddings=tie,
        init_std=init_std,
    )
    return r.finish(spec)


def _windows(r: HFConfig, fam: Family, n_layers: int, dflt: dict) -> list[Optional[int]]:
    """The sliding window of every layer (``None``: global attention)."""
    if fam.sliding == "none":
        return [None] * n_layers
    if fam.sliding == "all":
        window = r.number("sliding_window", dflt.get("sliding_window"), integer=True)
        return [window] * n_layers
    # qwen: the window exists only with use_sliding_window; then layer_types (transformers 5) or, in 4.x files,
    # every layer from max_window_layers on slides (Qwen2Config.__post_init__)
    use = r.flag("use_sliding_window", False)
    window = r.number("sliding_window", dflt.get("sliding_window"), integer=True)
    first = r.number("max_window_layers", dflt.get("max_window_layers"), integer=True, positive=False)
    types = r.get("layer_types")
    if not use or window is None:
        return [None] * n_layers
    if types is not None:
        if not isinstance(types, list) or len(types) != n_layers:
            r.error("layer_types", f"must list one type per layer ({n_layers}), got {json_value(types)}")
            return [None] * n_layers
        bad = sorted({t for t in types if t not in ("full_attention", "sliding_attention")})
        if bad:
            r.error("layer_types", f"unsupported layer types {bad}; supported: 'full_attention', 'sliding_attention'")
        return [window if t == "sliding_attention" else None for t in types]
    return [window if i >= (first or 0) else None for i in range(n_layers)]


def _moe(r: HFConfig, fam: Family, d_ff: int, act: str, dflt: dict) -> dict:
    """The MoE ffn spec (softmax over all experts, then top-k; router without bias)."""
    # output_router_logits only switches the aux-loss computation on in transformers' forward (a training
    # setting): the coefficient itself is kept in the spec.
    r.ignore("output_router_logits")
    if fam.moe == "mixtral":
        n = r.number("num_local_experts", dflt.get("num_local_experts"), aliases=("num_experts",), integer=True)
        renormalize = True  # MixtralTopKRouter divides the top-k probabilities by their sum
        # router_jitter_noise multiplies the router input by U(1 - eps, 1 + eps) noise in training only
        r.ignore("router_jitter_noise")
    else:
        n = r.number("num_experts", dflt.get("num_experts"), aliases=("num_local_experts",), integer=True)
        renormalize = r.flag("norm_topk_prob", False)
        r.expect("clip_qkv", None, "clamping q/k/v activations is not supported by modkit's attention")
    top_k = r.number("num_experts_per_tok", dflt.get("num_experts_per_tok"), integer=True)
    aux = r.number("router_aux_loss_coef", dflt.get("router_aux_loss_coef"), positive=False, minimum=0)
    return {
        "type": "moe",
        "n_experts": n,
        "top_k": top_k,
        "expert": gated_ffn(d_ff, act),
        "router": {"type": "topk", "renormalize": renormalize},
        "aux_loss_coef": float(aux),
        "z_loss_coef": 0.0,  # transformers computes no router z-loss for these models
    }


# ---------------------------------------------------------------------------------------------- weights


def family_links(fam: Family):
    """The ``links(spec, shapes, config)`` function of a Llama-family member.

    Names (``model.layers.{i}.`` prefix): ``input_layernorm``/``post_attention_layernorm`` (pre-norm) or
    ``post_attention_layernorm``/``post_feedforward_layernorm`` (OLMo 2's reordered norm), ``self_attn.{q,k,v,o}_proj``
    (Phi-3: fused ``qkv_proj``), ``self_attn.{q,k}_norm``, ``mlp.{gate,up,down}_proj`` (Phi-3: fused
    ``gate_up_proj``, gate first); Mixtral experts ``block_sparse_moe.experts.{e}.w1/w3/w2`` (gate/up/down) and
    router ``block_sparse_moe.gate``; OLMoE experts ``mlp.experts.{e}.{gate,up,down}_proj`` and router ``mlp.gate``.
    These are the on-disk names transformers writes (5.x fuses experts in memory and splits them again on save).
    """

    def make(spec, shapes, config):
        L = "model.layers.{i}."
        pairs = [("embed.weight", "model.embed_tokens.weight"), ("final_norm.weight", "model.norm.weight")]
        if fam.placement == "reordered":
            pairs += [("layers.{i}.attn_post_norm.weight", L + "post_attention_layernorm.weight"),
                      ("layers.{i}.ffn_post_norm.weight", L + "post_feedforward_layernorm.weight")]
        else:
            pairs += [("layers.{i}.attn_norm.weight", L + "input_layernorm.weight"),
                      ("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.weight")]
        for x in ("q", "k", "v", "o"):
            pairs.append((f"layers.{{i}}.attention.{x}_proj.{{p}}", L + f"self_attn.{x}_proj.{{p}}"))
        for x in ("q", "k"):
            pairs.append((f"layers.{{i}}.attention.{x}_norm.weight", L + f"self_attn.{x}_norm.weight"))
        for x in ("gate", "up", "down"):
            pairs.append((f"layers.{{i}}.ffn.{x}.{{p}}", L + f"mlp.{x}_proj.{{p}}"))
        links, skip = [], []
        if fam.moe:
            block, names = {
                "mixtral": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
                "olmoe": ("mlp", {x: f"{x}_proj" for x in ("gate", "up", "down")}),
            }[fam.moe]
            pairs.append(("layers.{i}.ffn.router.proj.weight", L + f"{block}.gate.weight"))
            for i in range(spec.n_layers):
                for ours, theirs in names.items():
                    name = f"layers.{i}.ffn.experts.{ours}"
                    if name in shapes:  # stacked [n_experts, in, out] <- one [out, in] tensor per expert
                        per_expert = [f"model.layers.{i}.{block}.experts.{e}.{theirs}.weight" for e in range(shapes[name][0])]
                        links.append(stacked_link(per_expert, name))
        if fam.fused:
            for i in range(spec.n_layers):
                a = f"layers.{i}.attention."
                q, k, v = (a + f"{x}_proj.weight" for x in "qkv")
                if all(n in shapes for n in (q, k, v)):
                    links.append(split_link(f"model.layers.{i}.self_attn.qkv_proj.weight", (q, k, v), [shapes[n][0] for n in (q, k, v)]))
                    skip += [q, k, v]
                g, u = f"layers.{i}.ffn.gate.weight", f"layers.{i}.ffn.up.weight"
                if g in shapes and u in shapes:
                    links.append(split_link(f"model.layers.{i}.mlp.gate_up_proj.weight", (g, u), [shapes[g][0], shapes[u][0]]))
                    skip += [g, u]
        return links + Renames(pairs).links(shapes, skip=skip) + head_link(spec, shapes)

    return make


def family_config(fam: Family):
    """The reverse conversion (spec → ``config.json`` keys) of a Llama-family member.

    Written in the transformers 4.x form (``rope_theta`` + ``rope_scaling``; Qwen sliding layers as
    ``layer_types`` plus ``max_window_layers`` when they form a suffix), which transformers 5 reads as well.
    """

    def to_config(spec, base):
        ls = spec.layer(0)
        att, ffn, norm = ls.attention, ls.ffn, ls.norm
        d, n = spec.d_model, att.n_heads
        hd = att.resolved_head_dim(d)
        cfg = {
            "vocab_size": spec.vocab_size,
            "hidden_size": d,
            "num_hidden_layers": spec.n_layers,
            "num_attention_heads": n,
            "num_key_value_heads": att.kv_heads,
            "max_position_embeddings": spec.max_seq_len,
            "rms_norm_eps": getattr(norm, "eps", None),
            "tie_word_embeddings": spec.tie_embeddings,
            "initializer_range": spec.init_std,
        }
        if hd != d // n or fam.head_dim_default is not None:
            cfg["head_dim"] = hd
        cfg.update(rope_fields(ls.position, original_at_top=fam.rope_original_at_top))
        dense = getattr(ffn, "expert", ffn)
        cfg["intermediate_size"] = getattr(dense, "d_ff", None)
        cfg["hidden_act"] = hf_activation(getattr(dense, "act", getattr(dense, "activation", "silu")), base=base.get("hidden_act"))
        if fam.attention_bias == "flag":
            cfg["attention_bias"] = bool(getattr(att, "q_bias", False))
        if fam.mlp_bias:
            cfg["mlp_bias"] = bool(getattr(ffn, "bias", False))
        if fam.moe is not None:
            experts = "num_local_experts" if fam.moe == "mixtral" else "num_experts"
            cfg[experts] = getattr(ffn, "n_experts", None)
            cfg["num_experts_per_tok"] = getattr(ffn, "top_k", None)
            cfg["router_aux_loss_coef"] = getattr(ffn, "aux_loss_coef", None)
            if fam.moe == "olmoe":
                cfg["norm_topk_prob"] = bool(getattr(getattr(ffn, "router", None), "renormalize", False))
        windows = layer_windows(spec)
        if fam.sliding == "all":
            cfg["sliding_window"] = windows[0]
        elif fam.sliding == "qwen":
            sliding = [w for w in windows if w is not None]
            if sliding:
                first = next(i for i, w in enumerate(windows) if w is not None)
                cfg["use_sliding_window"] = True
                cfg["sliding_window"] = sliding[0]
                cfg["layer_types"] = ["sliding_attention" if w is not None else "full_attention" for w in windows]
                suffix = all(w is not None for w in windows[first:])
                cfg["max_window_layers"] = first if suffix else spec.n_layers
            else:
                cfg["use_sliding_window"] = False
                cfg["sliding_window"] = None
                cfg["max_window_layers"] = spec.n_layers
        return cfg

    return to_config


def family_weights(fam: Family, convert) -> HFWeights:
    """The :class:`HFWeights` mapper of a Llama-family member."""
    return HFWeights(
        model_type=fam.model_type,
        convert=convert,
        make_links=family_links(fam),
        to_config=family_config(fam),
        # rotary tables that transformers < 4.3x stored in Llama checkpoints: recomputed, carried for a lossless export
        keep=((r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq", "RoPE table buffer of old checkpoints (recomputed)"),),
        carry=fam.ignore,
        architecture=fam.architecture,
    )


FAMILY = Family(
    model_type="llama",
    architecture="LlamaForCausalLM",
    # transformers LlamaConfig defaults
    defaults=dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        tie_word_embeddings=False,
    ),
    attention_bias="flag",
    mlp_bias=True,
    ignore=("pretraining_tp",),  # Meta's tensor-parallel matmul slicing emulation: numerically the same model
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``llama`` config → modkit spec dict."""
    return convert_family(cfg, FAMILY)


WEIGHTS = family_weights(FAMILY, convert)
