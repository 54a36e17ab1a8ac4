"""The decoder a model type's table describes: its fields, the spec assembled from them, and the way back.

A model type's config table (:mod:`._keys`) reads a Hugging Face config into **fields**, a flat description of the
network in modkit's terms (:data:`FIELDS`: sizes, the norm, the block placement, the token mixer of each layer,
attention biases and windows, the position scheme, the FFN or MoE, the head). :func:`assemble` turns fields into a
spec dict (``mha``/``mqa``/``gqa`` from the head counts; per-layer mixers, windows, position schemes and FFNs as
compact overrides); :func:`fields_of`
reads the same fields back from a validated spec, which is what the table writes into an exported config. Every
model type shares these two functions: what differs between types is only which config key holds which field
(the table) and the fields a type fixes (its ``fixed`` values). The component spec dicts themselves are written by
the builders of :mod:`._builders` (re-exported here).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Optional, Sequence

# the builders of component spec dicts, importable from here too
from ._builders import (
    AttentionRequest,
    ModelRequest,
    attention,
    gated_ffn,
    layer_selector,  # noqa: F401
    layernorm,
    model_spec,
    per_layer,  # noqa: F401
    per_layer_slots,
    rmsnorm,
)
from ._reader import UNIT_ACTIVATIONS, HFConfig

#: The fields of a decoder: ``name -> (value when neither the type nor its table sets it, meaning)``.
FIELDS: dict[str, tuple[Any, str]] = {
    "vocab_size": (None, "number of token ids"),
    "d_model": (None, "residual stream width"),
    "n_layers": (None, "number of blocks"),
    "max_seq_len": (None, "longest sequence"),
    "n_heads": (None, "query heads"),
    "n_kv_heads": (None, "key/value heads (None: n_heads; mha when equal to n_heads, mqa when 1, else gqa)"),
    "head_dim": (None, "width of one head"),
    "d_ff": (None, "hidden width of the dense FFN (and of each routed expert unless expert_d_ff is set)"),
    "norm": ("rmsnorm", "every norm of the model: 'rmsnorm' or 'layernorm'"),
    "eps": (1e-6, "the norms' epsilon"),
    "unit_offset": (False, "RMSNorm scales by (1 + weight) (Gemma)"),
    "norm_bias": (True, "LayerNorm has a bias"),
    "placement": ({"type": "pre"}, "the block placement spec"),
    "placements": (
        None,
        "per layer, the placement spec when layers differ (OLMo Hybrid: pre-norm linear layers, reordered attention "
        "layers); None: placement on every layer",
    ),
    "residual_multiplier": (1.0, "what each sublayer adds to the residual stream is multiplied by it (Granite)"),
    "final_norm": (True, "a norm after the last block"),
    "embedding_norm": (False, "a norm on the token embeddings (BERT)"),
    "qkv_bias": (False, "biases on the q, k and v projections"),
    "o_bias": (False, "bias on the output projection"),
    "qk_norm": (None, "norm of q and k before RoPE: None, 'head' (per head) or 'full' (over all heads)"),
    "softmax_scale": (None, "multiplier of q·k (None: 1/sqrt(head_dim))"),
    "attn_softcap": (None, "tanh soft-cap of the attention logits"),
    "clip_qkv": (None, "the q, k and v projections clamped to [-clip_qkv, clip_qkv] (DBRX)"),
    "causal": (True, "causal mask (false: bidirectional encoder)"),
    "layer_types": (
        None,
        "kind of every layer: 'full_attention', 'sliding_attention' or 'chunked_attention' (None: all full)",
    ),
    "sliding_window": (None, "the window of the sliding_attention layers"),
    "attention_chunk_size": (None, "the chunk of the chunked_attention layers (Llama 4)"),
    "sinks": (False, "a learned sink logit per query head in every attention (gpt-oss)"),
    "attention_by_layer": (
        None,
        "per layer, attention fields merged into that layer's attention (Llama 4: the QK-norm of "
        "RoPE layers, the temperature tuning of NoPE layers)",
    ),
    "mla": (
        None,
        "multi-head latent attention in place of q/k/v attention: the mla fields beyond n_heads "
        "(q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, bias, yarn_mscale, head_gate; "
        "latent_norm, default the model's norm)",
    ),
    "position": (None, "the position spec of every layer"),
    "position_by_type": (None, "position spec per layer type, when they differ (Gemma 3's local and global RoPE)"),
    "positions": (None, "position spec per layer, when layers differ otherwise (NoPE layers)"),
    "mixer": (
        None,
        "the token mixer of every layer when it is not an attention: a recurrent mixer's spec (Mamba-2), "
        "written by the type's own code; None: an attention from the head fields",
    ),
    "mixers": (
        None,
        "per layer, a recurrent mixer's spec or None for an attention from the head fields (hybrids: Jamba's "
        "Mamba layers, Qwen3-Next's Gated DeltaNet layers); wins over mixer; written by the type's own code",
    ),
    "attn_output_gate": (
        False,
        "the attention output times sigmoid of a second query-width projection before o_proj "
        "(Qwen3-Next's gated attention)",
    ),
    "ffn": ("gated", "'gated' (SwiGLU/GeGLU: gate, up, down), 'mlp' (up, down) or None (no FFN: Mamba-2's blocks)"),
    "ffn_layers": (
        None,
        "per layer, whether it holds an FFN (None: every layer does; Nemotron-H's mixer layers do not)",
    ),
    "act": ("silu", "the FFN activation (modkit's name)"),
    "mlp_bias": (False, "biases on the FFN projections"),
    "ffn_multipliers": (
        None,
        (
            "[gate, output] multipliers of the gated dense FFN, m_out · down(act(m_gate · gate(x)) · "
            "up(x)) (Falcon-H1's mlp_multipliers; None: 1 and 1)"
        ),
    ),
    "moe": (False, "FFNs are mixtures of gated experts with a top-k router (every layer unless moe_layers)"),
    "moe_layers": (
        None,
        "one flag per layer: true for a mixture, false for a dense FFN of width d_ff (None: every layer when moe)",
    ),
    "n_experts": (None, "routed experts per MoE layer"),
    "top_k": (None, "experts per token"),
    "expert_d_ff": (None, "hidden width of each routed expert (None: d_ff)"),
    "expert_bias": (False, "biases on the routed experts' projections (gpt-oss)"),
    "expert_clamp": (None, "the routed experts are gpt-oss's clamped SwiGLU: {alpha, limit} (None: the gated FFN)"),
    "router": (
        "topk",
        "router type: 'topk' (softmax scores), 'sigmoid_topk' (sigmoid scores) or 'sparsemixer' (Phi-3.5-MoE)",
    ),
    "router_jitter": (None, "the sparsemixer router's jitter_eps (Phi-3.5-MoE's router_jitter_noise)"),
    "renormalize": (False, "the top-k router probabilities are renormalised to sum to 1"),
    "renormalize_p": (1.0, "with renormalize, the p of the norm the weights are divided by (DBRX's p-norm)"),
    "renormalize_eps": (None, "added to the sum the top-k weights are divided by (None: the router's 1e-20; LFM2-MoE)"),
    "router_bias": (False, "bias on the router projection (gpt-oss)"),
    "routed_scaling_factor": (1.0, "multiplier of the routed gate weights (DeepSeek)"),
    "n_group": (None, "expert groups of group-limited routing (DeepSeek n_group)"),
    "topk_group": (None, "groups a token may route to (DeepSeek topk_group)"),
    "group_score": ("top2_sum", "a group's score: 'top2_sum' (DeepSeek-V3) or 'max' (DeepSeek-V2)"),
    "correction_bias": (False, "a selection-only per-expert bias buffer (DeepSeek-V3 e_score_correction_bias)"),
    "weight_on": ("output", "where a routed expert's gate weight applies: 'output' or 'input' (Llama 4)"),
    "n_zero_experts": (0, "zero-computation (identity) experts beside the routed ones (LongCat-Flash zero_expert_num)"),
    "shared_d_ff": (None, "hidden width of a shared expert beside the routed ones (None: none)"),
    "shared_gate": (False, "the shared expert's output times sigmoid(w · x) (Qwen2-MoE)"),
    "shared_bias": (False, "biases on the shared expert's projections (DeepSeek-V2 mlp_bias, ERNIE 4.5 use_bias)"),
    "moe_latent_dim": (None, "the routed experts' latent width between two dense projections (Nemotron 3; None: none)"),
    "moe_latent_bias": (False, "biases on those two latent projections (Nemotron 3's mlp_bias)"),
    "aux_loss_coef": (0.0, "weight of the load-balancing loss"),
    "tie_embeddings": (False, "the head shares the token embedding"),
    "lm_head_bias": (False, "the head has a bias"),
    "embedding_scale": (None, "multiplier of the token embeddings ('sqrt_d_model': Gemma)"),
    "logit_scale": (None, "multiplier of the logits (Cohere's logit_scale, Granite's 1 / logits_scaling)"),
    "final_logit_softcap": (None, "tanh soft-cap of the logits"),
    "init_std": (0.02, "standard deviation of the weight init"),
    "dropout_embedding": (None, "dropout on the embeddings (None: the type has no such key)"),
    "dropout_attention": (None, "dropout on the attention probabilities"),
    "dropout_residual": (None, "dropout on each sublayer output"),
}

#: the spec's ``dropout`` fields and the field each comes from
DROPOUT_FIELDS = {"embedding": "dropout_embedding", "attention": "dropout_attention", "residual": "dropout_residual"}


# ---------------------------------------------------------------------------------------------- fields -> spec


def norm_spec(f: Mapping[str, Any]) -> dict:
    """The norm spec of every norm of the model (block, final, embedding, QK-norm)."""
    if f["norm"] == "layernorm":
        return layernorm(f["eps"], f["norm_bias"])
    return rmsnorm(f["eps"], f["unit_offset"])


def dense_ffn(f: Mapping[str, Any], d_ff: Optional[int] = None) -> dict:
    """The dense FFN spec of width ``d_ff`` (default ``f["d_ff"]``): a gated FFN, an MLP, or ``None`` (no FFN)."""
    if f["ffn"] is None:
        return None
    d_ff = f["d_ff"] if d_ff is None else d_ff
    if f["ffn"] == "mlp" and f["act"] in UNIT_ACTIVATIONS:  # an activation component (relu2, xielu)
        return {"type": "mlp", "d_ff": d_ff, "activation_unit": {"type": f["act"]}, "bias": bool(f["mlp_bias"])}
    if f["ffn"] == "mlp":
        return {"type": "mlp", "d_ff": d_ff, "activation": f["act"], "bias": bool(f["mlp_bias"])}
    spec = gated_ffn(d_ff, f["act"], bool(f["mlp_bias"]))
    for name, m in zip(("gate_multiplier", "output_multiplier"), f["ffn_multipliers"] or ()):
        if m != 1:
            spec[name] = float(m)
    return spec


def moe_spec(f: Mapping[str, Any]) -> dict:
    """The ``moe`` spec: ``n_experts`` gated experts (or gpt-oss's clamped SwiGLU) of width ``expert_d_ff`` under a
    ``topk`` / ``sigmoid_topk`` router, an optional shared expert (gated or not), no z-loss (transformers computes none
    for these models). Router fields at their defaults are left out."""
    width = f["expert_d_ff"] or f["d_ff"]
    if f["expert_clamp"] is not None:
        expert: dict[str, Any] = {"type": "swiglu_clamped", "d_ff": width, **dict(f["expert_clamp"])}
        if f["expert_bias"]:
            expert["bias"] = True
    elif f["ffn"] == "mlp":  # two-projection experts (Nemotron-H's ReLU²)
        expert = dense_ffn({**f, "mlp_bias": f["expert_bias"]}, width)
    else:
        expert = gated_ffn(width, f["act"], bool(f["expert_bias"]))
    router: dict[str, Any] = {"type": f["router"], "renormalize": bool(f["renormalize"])}
    if f["router"] == "sparsemixer":  # its own fields only
        router = {"type": "sparsemixer", "jitter_eps": float(f["router_jitter"])}
    if f["router_bias"]:
        router["bias"] = True
    if f["renormalize_p"] != 1:
        router["renormalize_p"] = float(f["renormalize_p"])
    if f["routed_scaling_factor"] != 1:
        router["routed_scaling_factor"] = float(f["routed_scaling_factor"])
    if f["n_group"] is not None:
        router["n_group"], router["topk_group"] = f["n_group"], f["topk_group"]
        if f["group_score"] != "top2_sum":
            router["group_score"] = f["group_score"]
    if f["correction_bias"]:
        router["correction_bias"] = True
    if f["renormalize_eps"] is not None:
        router["renormalize_eps"] = float(f["renormalize_eps"])
    spec: dict[str, Any] = {
        "type": "moe",
        "n_experts": f["n_experts"],
        "top_k": f["top_k"],
        "expert": expert,
        "router": router,
    }
    if f["shared_d_ff"] and f["ffn"] == "mlp":
        spec["shared"] = dense_ffn({**f, "mlp_bias": f["shared_bias"]}, f["shared_d_ff"])
    elif f["shared_d_ff"]:
        spec["shared"] = gated_ffn(f["shared_d_ff"], f["act"], bool(f["shared_bias"]))
        if f["shared_gate"]:
            spec["shared_gate"] = True
    if f["weight_on"] != "output":
        spec["weight_on"] = f["weight_on"]
    if f["moe_latent_dim"] is not None:
        spec["latent_dim"], spec["latent_bias"] = f["moe_latent_dim"], bool(f["moe_latent_bias"])
    if f["n_zero_experts"]:
        spec["n_zero_experts"] = f["n_zero_experts"]
    spec["aux_loss_coef"] = float(f["aux_loss_coef"])
    spec["z_loss_coef"] = 0.0
    return spec


def ffn_spec(f: Mapping[str, Any]) -> dict:
    """The FFN spec of every layer that ``moe_layers`` does not make dense: the mixture when ``moe``, else the dense
    FFN."""
    return moe_spec(f) if f["moe"] else dense_ffn(f)


def layer_ffns(f: Mapping[str, Any]) -> list[dict]:
    """The FFN spec of each layer: ``moe_layers`` chooses between the mixture and the dense FFN of width ``d_ff``;
    ``ffn_layers`` leaves it out (``None``) where false."""
    n = f["n_layers"]
    keep = f["ffn_layers"] or [True] * n
    if not f["moe"]:
        return [dense_ffn(f) if k else None for k in keep]
    flags = f["moe_layers"] if f["moe_layers"] is not None else [True] * n
    moe, dense = moe_spec(f), dense_ffn(f) if not all(flags) else None
    return [(moe if flag else dense) if k else None for flag, k in zip(flags, keep)]


def attention_spec(
    f: Mapping[str, Any], layer_type: str, norm: dict, extra: Optional[Mapping[str, Any]] = None
) -> dict:
    """The attention of a layer of ``layer_type``: ``mla`` when the fields hold one, else ``mha``/``mqa``/``gqa`` with
    the window (``sliding_attention``) or the chunk (``chunked_attention``), sinks, and ``extra`` fields merged in."""
    if f["mla"] is not None:
        spec: dict[str, Any] = {"type": "mla", "n_heads": f["n_heads"], "latent_norm": norm, **dict(f["mla"])}
        if f["softmax_scale"] is not None:
            spec["softmax_scale"] = f["softmax_scale"]
    else:
        kv = f["n_heads"] if f["n_kv_heads"] is None else f["n_kv_heads"]
        bias = (f["qkv_bias"],) * 3 + (f["o_bias"],)
        spec = attention(
            AttentionRequest(
                f["d_model"],
                f["n_heads"],
                kv,
                f["head_dim"],
                bias=bias,
                qk_norm=norm if f["qk_norm"] else None,
                qk_norm_scope=f["qk_norm"] or "head",
                sliding_window=f["sliding_window"] if layer_type == "sliding_attention" else None,
                softmax_scale=f["softmax_scale"],
                logit_softcap=f["attn_softcap"],
            )
        )
        if layer_type == "chunked_attention":
            spec["attention_chunk_size"] = f["attention_chunk_size"]
        if f["sinks"]:
            spec["sinks"] = True
        if f["attn_output_gate"]:
            spec["output_gate"] = True
        if f["clip_qkv"] is not None:
            spec["clip_qkv"] = float(f["clip_qkv"])
    if not f["causal"]:
        spec["causal"] = False
    spec.update(extra or {})
    return spec


def layer_mixers(f: Mapping[str, Any]) -> list[Optional[dict]]:
    """The recurrent mixer of each layer, ``None`` where the layer holds an attention: ``mixers`` when the type reads
    one per layer (a hybrid), else ``mixer`` on every layer (``None`` everywhere: an attention model)."""
    if f["mixers"] is not None:
        return [None if m is None else dict(m) for m in f["mixers"]]
    return [None if f["mixer"] is None else dict(f["mixer"])] * f["n_layers"]


def assemble(r: HFConfig, f: Mapping[str, Any]) -> dict:
    """The spec dict that fields ``f`` describe (see :data:`FIELDS`).

    Layers differ by their token mixer (``mixers``: a recurrent mixer or an attention), their kind (``layer_types``:
    a sliding window or a chunk), their position scheme (``positions`` or ``position_by_type``), extra attention
    fields (``attention_by_layer``) and their FFN (``moe_layers``): each layer is described slot by slot, the most
    common layer is the block, every other one an override of the slots where it differs (:func:`per_layer_slots`).
    A model with a recurrent mixer on some layer writes the token-mixing slot as ``mixer``, else as ``attention``.
    """
    n_layers = f["n_layers"]
    if f["act"] in UNIT_ACTIVATIONS and (f["ffn"] == "gated" or f["moe"] and f["ffn"] != "mlp"):
        r.error(
            r.key_of.get("act", "hidden_act"),
            f"activation {f['act']!r} is supported in a two-projection MLP only; this model type's "
            f"{'experts take' if f['moe'] else 'gated FFN takes'} silu, gelu, gelu_tanh or relu",
        )
        f = {**f, "act": "silu"}
    norm = norm_spec(f)
    mixers = layer_mixers(f)
    recurrent = any(m is not None for m in mixers)
    types = f["layer_types"] or ["full_attention"] * n_layers
    positions = f["positions"]
    if positions is None and f["position_by_type"] is not None:
        positions = [f["position_by_type"].get(t, f["position"]) for t in types]
    positions = positions or [f["position"] or {"type": "none"}] * n_layers
    extras = f["attention_by_layer"] or [None] * n_layers
    ffns = layer_ffns(f)
    slot = "mixer" if recurrent else "attention"
    placements = [dict(p) for p in f["placements"] or [f["placement"]] * n_layers]
    if f["residual_multiplier"] != 1:
        for placement in placements:
            placement["residual_multiplier"] = float(f["residual_multiplier"])
    layers = [
        {slot: m if m is not None else attention_spec(f, t, norm, x), "position": p, "ffn": ffn, "placement": pl}
        for m, t, p, x, ffn, pl in zip(mixers, types, positions, extras, ffns, placements)
    ]
    default, overrides = per_layer_slots(layers, n_layers)
    placement = default.pop("placement")
    block = {slot: default[slot], "ffn": default["ffn"], "norm": norm, "placement": placement}
    dropout = {name: float(f[field]) for name, field in DROPOUT_FIELDS.items() if f[field] is not None}
    spec = model_spec(
        r,
        ModelRequest(
            vocab_size=f["vocab_size"],
            d_model=f["d_model"],
            n_layers=n_layers,
            max_seq_len=f["max_seq_len"],
            position=default["position"],
            block=block,
            overrides=overrides,
            embedding_scale=f["embedding_scale"],
            final_norm=norm if f["final_norm"] else None,
            tie_embeddings=f["tie_embeddings"],
            lm_head_bias=f["lm_head_bias"],
            logit_scale=f["logit_scale"],
            final_logit_softcap=f["final_logit_softcap"],
            init_std=f["init_std"],
            dropout=dropout,
        ),
    )
    if f["embedding_norm"]:
        spec["embedding_norm"] = norm
    return spec


# ---------------------------------------------------------------------------------------------- spec -> fields


def _layer_type(att) -> str:
    if getattr(att, "sliding_window", None) is not None:
        return "sliding_attention"
    if getattr(att, "attention_chunk_size", None) is not None:
        return "chunked_attention"
    return "full_attention"


#: the fields of an ``mla`` config that the ``mla`` field holds
MLA_FIELDS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "bias",
    "yarn_mscale",
    "latent_norm",
    "head_gate",
)


class _Picked(NamedTuple):
    """The components of a validated spec that stand for the fields (:func:`fields_of`)."""

    layers: list  # every layer's resolved slots
    mixers: list  # per layer, the recurrent mixer, or None where the mixer slot holds an attention
    att: Any  # the first attention layer's attention (None: no attention layer)
    moe: Any  # the first mixture FFN (None: no mixture)
    dense: Any  # the first dense FFN (None: every FFN is a mixture)

    @property
    def expert(self) -> Any:
        """The routed expert of the first mixture."""
        return getattr(self.moe, "expert", None)

    @property
    def width(self) -> Any:
        """The FFN that stands for ``d_ff``, ``ffn`` and ``act``: the first dense one, else the expert."""
        return self.dense if self.dense is not None else self.expert


def _pick(spec) -> _Picked:
    """Layer 0 stands for the norm, the first attention layer for the attention fields, the first recurrent layer for
    ``mixer``, the first mixture layer for the MoE fields and the first dense layer for ``d_ff``."""
    from modkit.plugin import get_registry

    layers = [spec.layer(i) for i in range(spec.n_layers)]
    registry = get_registry()
    mixers = [None if registry.entry_for_config(x.attention).kind == "attention" else x.attention for x in layers]
    att = next((x.attention for x, m in zip(layers, mixers) if m is None), None)
    ffns = [x.ffn for x in layers]
    moe = next((x for x in ffns if getattr(x, "type", None) == "moe"), None)
    dense = next((x for x in ffns if x is not None and x.type != "moe"), None)
    return _Picked(layers, mixers, att, moe, dense)


def _head_fields(spec, p: _Picked) -> dict[str, Any]:
    """The sizes, the token mixers and the head counts."""
    att, d = p.att, spec.d_model
    return {
        "vocab_size": spec.vocab_size,
        "d_model": d,
        "n_layers": spec.n_layers,
        "max_seq_len": spec.max_seq_len,
        "mixer": next((m for m in p.mixers if m is not None), None),
        "mixers": p.mixers,
        "n_heads": getattr(att, "n_heads", None),
        "n_kv_heads": getattr(att, "kv_heads", getattr(att, "n_heads", None)),
        "head_dim": att.resolved_head_dim(d) if hasattr(att, "resolved_head_dim") else None,
        "d_ff": getattr(p.width, "d_ff", None),
    }


def _norm_fields(spec, p: _Picked) -> dict[str, Any]:
    """The norm (layer 0's), the placement and where norms sit."""
    ls = p.layers[0]
    norm = ls.norm
    return {
        "norm": norm.type,
        "eps": getattr(norm, "eps", None),
        "unit_offset": getattr(norm, "unit_offset", False),
        "norm_bias": getattr(norm, "bias", True),
        "placement": ls.placement,
        "placements": [x.placement for x in p.layers],
        "residual_multiplier": getattr(ls.placement, "residual_multiplier", 1.0),
        "final_norm": spec.final_norm is not None,
        "embedding_norm": getattr(spec, "embedding_norm", None) is not None,
    }


def _attention_fields(p: _Picked) -> dict[str, Any]:
    """The attention fields (the first attention layer's), every layer's window, kind and attention."""
    att = p.att
    attentions = [x.attention for x in p.layers]
    windows = [getattr(a, "sliding_window", None) for a in attentions]
    return {
        "qkv_bias": bool(getattr(att, "q_bias", False)),
        "o_bias": bool(getattr(att, "o_bias", False)),
        "qk_norm": getattr(att, "qk_norm_scope", "head") if getattr(att, "qk_norm", None) is not None else None,
        "softmax_scale": getattr(att, "softmax_scale", None),
        "attn_softcap": getattr(att, "logit_softcap", None),
        "causal": getattr(att, "causal", True),
        "windows": windows,
        "layer_types": [_layer_type(a) for a in attentions],
        "sliding_window": next((w for w in windows if w is not None), None),
        "attention_chunk_size": next(
            (a.attention_chunk_size for a in attentions if getattr(a, "attention_chunk_size", None) is not None), None
        ),
        "sinks": bool(getattr(att, "sinks", False)),
        "attn_output_gate": bool(getattr(att, "output_gate", False)),
        "clip_qkv": getattr(att, "clip_qkv", None),
        "attentions": attentions,
        "mla": _latent_fields(att),
    }


def _latent_fields(att) -> Optional[dict[str, Any]]:
    """The ``mla`` field of a latent attention: the ``mla`` fields, and for another latent type (``dsa``: MLA with
    a sparse selection) its type and the fields of its own (``None``: not a latent attention)."""
    if not hasattr(att, "kv_lora_rank"):
        return None
    out = {k: getattr(att, k) for k in MLA_FIELDS}
    if att.type != "mla":
        own = [k for k in type(att).model_fields if k not in out and k not in ("type", "n_heads", "softmax_scale")]
        out.update({k: getattr(att, k) for k in own}, type=att.type)
    return out


def _position_fields(p: _Picked, types: Sequence[str]) -> dict[str, Any]:
    """Layer 0's position, the first position of each layer type, every layer's position."""
    positions = [x.position for x in p.layers]
    by_type: dict[str, Any] = {}
    for t, pos in zip(types, positions):
        by_type.setdefault(t, pos)
    return {"position": p.layers[0].position, "position_by_type": by_type, "positions": positions}


def _ffn_fields(p: _Picked) -> dict[str, Any]:
    """Every layer's FFN and the dense FFN's fields (the width FFN's kind and activation)."""
    width, dense = p.width, p.dense
    return {
        "ffns": [x.ffn for x in p.layers],
        "ffn": None if width is None else "mlp" if getattr(width, "type", None) == "mlp" else "gated",
        "act": getattr(getattr(width, "activation_unit", None), "type", None)
        or getattr(width, "act", None)
        or getattr(width, "activation", None),
        "mlp_bias": bool(getattr(dense, "bias", False)),
        "ffn_multipliers": [getattr(dense, "gate_multiplier", 1.0), getattr(dense, "output_multiplier", 1.0)],
    }


def _moe_fields(p: _Picked) -> dict[str, Any]:
    """The mixture fields (the first mixture layer's) and which layers hold a mixture."""
    moe, expert = p.moe, p.expert
    router = getattr(moe, "router", None)
    clamped = getattr(expert, "type", None) == "swiglu_clamped"
    return {
        "moe": moe is not None,
        "moe_layers": [getattr(x.ffn, "type", None) == "moe" for x in p.layers],
        "n_experts": getattr(moe, "n_experts", None),
        "top_k": getattr(moe, "top_k", None),
        "expert_d_ff": getattr(expert, "d_ff", None),
        "expert_bias": bool(getattr(expert, "bias", False)),
        "expert_clamp": {"alpha": expert.alpha, "limit": expert.limit} if clamped else None,
        "router": getattr(router, "type", "topk"),
        "router_jitter": getattr(router, "jitter_eps", None),
        "renormalize": bool(getattr(router, "renormalize", False)),
        "renormalize_p": getattr(router, "renormalize_p", 1.0),
        "router_bias": bool(getattr(router, "bias", False)),
        "routed_scaling_factor": getattr(router, "routed_scaling_factor", 1.0),
        "n_group": getattr(router, "n_group", None),
        "topk_group": getattr(router, "topk_group", None),
        "group_score": getattr(router, "group_score", "top2_sum"),
        "correction_bias": bool(getattr(router, "correction_bias", False)),
        "renormalize_eps": getattr(router, "renormalize_eps", None),
        "weight_on": getattr(moe, "weight_on", "output"),
        "n_zero_experts": getattr(moe, "n_zero_experts", 0),
        "shared_d_ff": getattr(getattr(moe, "shared", None), "d_ff", None),
        "shared_gate": bool(getattr(moe, "shared_gate", False)),
        "shared_bias": bool(getattr(getattr(moe, "shared", None), "bias", False)),
        "moe_latent_dim": getattr(moe, "latent_dim", None),
        "moe_latent_bias": bool(getattr(moe, "latent_bias", False)),
        "aux_loss_coef": getattr(moe, "aux_loss_coef", None),
    }


def _output_fields(spec) -> dict[str, Any]:
    """The head, embedding and init fields, and the dropout probabilities."""
    return {
        "tie_embeddings": spec.tie_embeddings,
        "lm_head_bias": spec.lm_head_bias,
        "embedding_scale": spec.embedding_scale,
        "logit_scale": spec.logit_scale,
        "final_logit_softcap": spec.final_logit_softcap,
        "init_std": spec.init_std,
        **{field: float(getattr(spec.dropout, name)) for name, field in DROPOUT_FIELDS.items()},
    }


def fields_of(spec) -> dict[str, Any]:
    """The fields (:data:`FIELDS`) of a validated spec, as an export writes them: layer 0 stands for the norm, the
    first attention layer for the attention fields, the first recurrent layer for ``mixer`` (``mixers`` holds every
    layer's recurrent mixer, ``None`` on attention layers), the first mixture layer for the MoE fields and the first
    dense layer for ``d_ff`` (an all-MoE model: the expert width); ``windows``, ``positions``, ``attentions`` and
    ``ffns`` hold every layer. Component configs stay objects (``position``, ``positions``, ``placement``); a field a
    component does not have is ``None``. Whether the fields describe the spec completely is checked afterwards, by
    converting the written config back."""
    p = _pick(spec)
    attention_fields = _attention_fields(p)
    return {
        **_head_fields(spec, p),
        **_norm_fields(spec, p),
        **attention_fields,
        **_position_fields(p, attention_fields["layer_types"]),
        **_ffn_fields(p),
        **_moe_fields(p),
        **_output_fields(spec),
    }
