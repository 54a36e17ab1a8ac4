"""Hugging Face ``gpt2`` → modkit.

Semantics: ``transformers/models/gpt2/{configuration,modeling}_gpt2.py``: learned absolute positions
(``wpe``, ``n_positions`` rows), pre-norm LayerNorm blocks, multi-head attention whose fused ``c_attn`` and
``c_proj`` carry biases (all four projections biased), MLP ``c_fc``/``c_proj`` with biases and
``activation_function`` (``gelu_new`` is the tanh GELU), inner width ``n_inner`` (default ``4 * n_embd``), final
LayerNorm, head tied to the token embedding. ``scale_attn_weights: false`` drops the ``1/sqrt(head_dim)``
factor (``softmax_scale: 1``); ``scale_attn_by_inverse_layer_idx`` and cross-attention are refused;
``reorder_and_upcast_attn`` only changes the float precision of the eager kernel and is ignored. The
``summary_*`` keys configure the multiple-choice head of ``GPT2DoubleHeadsModel``, not the language model.
"""

from __future__ import annotations

from ._common import HFConfig, attention, layernorm, model_spec, sizes
from ._weights import HFWeights, Renames, head_link, hf_activation, split_link, transposed_link

MODEL_TYPE = "gpt2"

# transformers GPT2Config defaults
DEFAULTS = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, layer_norm_epsilon=1e-5)

#: keys that do not shape the language model (multiple-choice head of GPT2DoubleHeadsModel; kernel precision)
IGNORE = ("summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels", "reorder_and_upcast_attn")


def convert(cfg: dict) -> dict:
    """Hugging Face ``gpt2`` config → modkit spec dict.

    Raises:
        SpecError: every unsupported or unknown field, named with its value.
    """
    r = HFConfig(cfg, MODEL_TYPE, ignore=IGNORE)
    s = sizes(
        r,
        DEFAULTS,
        names={
            # GPT2Config.attribute_map lets either name appear
            "d_model": ("n_embd", "hidden_size"),
            "n_layers": ("n_layer", "num_hidden_layers"),
            "n_heads": ("n_head", "num_attention_heads"),
            "max_seq_len": ("n_positions", "max_position_embeddings"),
        },
    )
    d, n_heads = s["d_model"], s["n_heads"]
    if d % n_heads:
        r.error("n_head", f"n_embd = {d} is not divisible by n_head = {n_heads}")
    n_ctx = r.get("n_ctx")  # legacy duplicate of n_positions that transformers no longer reads
    if n_ctx is not None and n_ctx != s["max_seq_len"]:
        r.error("n_ctx", f"n_ctx = {n_ctx} differs from n_positions = {s['max_seq_len']}; the position table has n_positions rows")
    d_ff = r.number("n_inner", 4 * d, integer=True)
    act = r.activation("activation_function", "gelu_new")
    eps = r.number("layer_norm_epsilon", DEFAULTS["layer_norm_epsilon"])
    tie = r.flag("tie_word_embeddings", True)
    init_std = r.number("initializer_range", 0.02)
    scaled = r.flag("scale_attn_weights", True)
    r.expect("scale_attn_by_inverse_layer_idx", False, "scaling attention by 1 / (layer_idx + 1) per layer is not supported")

    block = {
        "attention": attention(d, n_heads, n_heads, bias=(True,) * 4, softmax_scale=None if scaled else 1.0),
        "ffn": {"type": "mlp", "d_ff": d_ff, "activation": act, "bias": True},
        "norm": layernorm(eps),
        "placement": {"type": "pre"},
    }
    spec = model_spec(
        r,
        vocab_size=s["vocab_size"],
        d_model=d,
        n_layers=s["n_layers"],
        max_seq_len=s["max_seq_len"],
        position={"type": "learned"},
        block=block,
        final_norm=layernorm(eps),
        tie_embeddings=tie,
        init_std=init_std,
    )
    return r.finish(spec)


# ---------------------------------------------------------------------------------------------- weights


def links(spec, shapes, config):
    """GPT-2 names (``transformer.`` prefix; files saved from ``GPT2Model`` omit it). ``Conv1D`` layers store
    ``[in, out]`` weights, so every matrix is transposed; ``c_attn`` fuses q, k, v along its output dimension."""
    h = "transformer.h.{i}."
    table = Renames([
        ("embed.weight", "transformer.wte.weight"),
        ("positions.0.weight", "transformer.wpe.weight"),
        ("final_norm.{p}", "transformer.ln_f.{p}"),
        ("layers.{i}.attn_norm.{p}", h + "ln_1.{p}"),
        ("layers.{i}.ffn_norm.{p}", h + "ln_2.{p}"),
        ("layers.{i}.attention.o_proj.bias", h + "attn.c_proj.bias"),
        ("layers.{i}.ffn.up.bias", h + "mlp.c_fc.bias"),
        ("layers.{i}.ffn.down.bias", h + "mlp.c_proj.bias"),
    ])
    out, skip = [], []
    for i in range(spec.n_layers):
        a, f, hf = f"layers.{i}.attention.", f"layers.{i}.ffn.", f"transformer.h.{i}."
        for p in ("weight", "bias"):
            qkv = [a + f"{x}_proj.{p}" for x in "qkv"]
            if all(n in shapes for n in qkv):
                out.append(split_link(hf + f"attn.c_attn.{p}", qkv, [shapes[n][0] for n in qkv], transpose=True))
                skip += qkv
        for ours, theirs in ((a + "o_proj.weight", "attn.c_proj.weight"), (f + "up.weight", "mlp.c_fc.weight"),
                             (f + "down.weight", "mlp.c_proj.weight")):
            if ours in shapes:
                out.append(transposed_link(hf + theirs, ours))
                skip.append(ours)
    return out + table.links(shapes, skip=skip) + head_link(spec, shapes)


def to_config(spec, base):
    """Spec → GPT-2 ``config.json`` keys."""
    ls = spec.layer(0)
    att, ffn = ls.attention, ls.ffn
    return {
        "vocab_size": spec.vocab_size,
        "n_embd": spec.d_model,
        "n_layer": spec.n_layers,
        "n_head": att.n_heads,
        "n_positions": spec.max_seq_len,
        "n_inner": getattr(ffn, "d_ff", None),
        "activation_function": hf_activation(getattr(ffn, "activation", "gelu_tanh"), "gelu_new", base.get("activation_function")),
        "layer_norm_epsilon": getattr(ls.norm, "eps", None),
        "tie_word_embeddings": spec.tie_embeddings,
        "initializer_range": spec.init_std,
        "scale_attn_weights": getattr(att, "softmax_scale", None) is None,
    }


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE,
    convert=convert,
    make_links=links,
    to_config=to_config,
    keep=((r"transformer\.h\.\d+\.attn\.(bias|masked_bias)", "causal-mask buffers stored by older GPT-2 checkpoints (derivable)"),),
    aliases=(("transformer.", ""),),
    carry=IGNORE,
    architecture="GPT2LMHeadModel",
)
