"""Hugging Face ``falcon`` → modkit.

Semantics: ``transformers/models/falcon/{configuration,modeling}_falcon.py``:

* ``new_decoder_architecture`` (Falcon-40B/180B): grouped-query attention with ``num_kv_heads`` heads and
  parallel blocks with ``num_ln_in_parallel_attn`` norms (default 2: ``ln_attn`` and ``ln_mlp``; 1: shared);
  ``multi_query`` and ``parallel_attn`` are ignored by transformers there (``parallel_attn: false`` is refused,
  since transformers' block cannot run it).
* otherwise (Falcon-7B, Falcon-RW): ``multi_query`` gives one KV head, else ``num_attention_heads``;
  ``parallel_attn`` gives a parallel block with one shared norm, else a sequential pre-norm block.
* ``bias`` on the fused QKV, the output ``dense`` and both MLP projections (one switch for all);
  MLP width ``ffn_hidden_size`` (default ``4 * hidden_size``) and ``activation``; LayerNorms with bias;
  head tied by default, never biased.
* positions: RoPE (half-split pairs, ``rope_theta``) unless ``alibi``. transformers scales Falcon's ALiBi bias
  by ``1 / sqrt(head_dim)`` like the scores (``FalconModel.forward`` folds ``alibi / sqrt(head_dim)`` into the
  attention mask), so ``alibi: true`` maps to ``{"type": "alibi", "scale": head_dim**-0.5}``. This matches
  transformers' SDPA path to 4e-7 (tests/test_hf_parity.py); its eager path adds the bias a second time
  (``(scores + alibi) * inv_norm_factor`` plus the mask that already holds it), a transformers quirk not followed.
"""

from __future__ import annotations

import torch

from modkit.checkpoint import Link
from modkit.validation import json_value

from ._common import HFConfig, attention, layernorm, model_spec, rope, sizes
from ._weights import HFWeights, Renames, head_link, hf_activation, rope_fields

MODEL_TYPE = "falcon"

# transformers FalconConfig defaults
DEFAULTS = dict(
    vocab_size=65024,
    hidden_size=4544,
    num_hidden_layers=32,
    num_attention_heads=71,
    max_position_embeddings=2048,
    layer_norm_epsilon=1e-5,
)


def convert(cfg: dict) -> dict:
    """Hugging Face ``falcon`` config → modkit spec dict.

    Raises:
        SpecError: every unsupported or unknown field, named with its value.
    """
    r = HFConfig(cfg, MODEL_TYPE)
    s = sizes(r, DEFAULTS, names={"d_model": ("hidden_size", "n_embed")})
    d, n_heads = s["d_model"], s["n_heads"]
    if d % n_heads:
        r.error("num_attention_heads", f"hidden_size = {d} is not divisible by num_attention_heads = {n_heads}")
    new_arch = r.flag("new_decoder_architecture", False)
    multi_query = r.flag("multi_query", True)
    parallel = r.flag("parallel_attn", True)
    n_ln = r.get("num_ln_in_parallel_attn")
    kv_cfg = r.number("num_kv_heads", None, integer=True)
    r.expect(
        "apply_residual_connection_post_layernorm", False, "a residual taken after the norm is not supported (and no longer read by transformers)"
    )
    bias = r.flag("bias", False)
    d_ff = r.number("ffn_hidden_size", 4 * d, integer=True)
    act = r.activation("activation", "gelu")
    eps = r.number("layer_norm_epsilon", DEFAULTS["layer_norm_epsilon"])
    tie = r.flag("tie_word_embeddings", True)
    init_std = r.number("initializer_range", 0.02)

    if new_arch:
        kv = kv_cfg if kv_cfg is not None else n_heads
        if n_heads % kv:
            r.error("num_kv_heads", f"num_kv_heads = {kv} does not divide num_attention_heads = {n_heads}")
        if not parallel:
            r.error("parallel_attn", "false with new_decoder_architecture: transformers' FalconDecoderLayer cannot run this combination")
        n_ln = 2 if n_ln is None else n_ln
        if n_ln not in (1, 2):
            r.error("num_ln_in_parallel_attn", f"must be 1 or 2, got {json_value(n_ln)}")
        placement = {"type": "parallel", "shared_norm": n_ln == 1}
    else:
        kv = 1 if multi_query else n_heads
        if not multi_query and kv_cfg is not None and kv_cfg != n_heads:
            r.error(
                "num_kv_heads",
                f"{kv_cfg} with new_decoder_architecture = false and multi_query = false: the fused QKV then holds "
                f"{n_heads} key/value heads, which transformers cannot split into {kv_cfg}",
            )
        if n_ln not in (None, 1):
            r.error("num_ln_in_parallel_attn", f"{json_value(n_ln)} requires new_decoder_architecture = true (transformers reads it only there)")
        placement = {"type": "parallel", "shared_norm": True} if parallel else {"type": "pre"}

    if r.flag("alibi", False):
        r.ignore("rope_parameters", "rope_theta", "rope_scaling")  # transformers builds no rotary table then
        # transformers' eager Falcon computes (scores + alibi) / sqrt(head_dim): the bias is scaled too
        position = {"type": "alibi", "scale": (d // n_heads) ** -0.5}
    else:
        position = rope(r, default_theta=10000.0, max_seq_len=s["max_seq_len"])

    block = {
        "attention": attention(d, n_heads, kv, bias=(bias, bias, bias, bias)),
        "ffn": {"type": "mlp", "d_ff": d_ff, "activation": act, "bias": bias},
        "norm": layernorm(eps),
        "placement": placement,
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
        init_std=init_std,
    )
    return r.finish(spec)


# ---------------------------------------------------------------------------------------------- weights


def _layout(config) -> str:
    """How ``query_key_value`` is fused: ``grouped`` (new decoder architecture), ``mqa`` or ``per_head``."""
    if config.get("new_decoder_architecture"):
        return "grouped"
    return "mqa" if config.get("multi_query", True) else "per_head"


def qkv_link(hf: str, ours, n_heads: int, n_kv: int, head_dim: int, layout: str) -> Link:
    """Falcon's fused ``query_key_value`` (weight ``[rows, d]`` or bias ``[rows]``) ↔ modkit's q, k, v.

    * ``grouped`` (Falcon-40B/180B): per KV group, its ``n_heads / n_kv`` query heads, then its key, then its value
      head: ``[n_kv, r + 2, head_dim]`` rows (transformers ``FalconAttention._split_heads``);
    * ``mqa`` (Falcon-7B): all query heads, then the one key head, then the value head;
    * ``per_head`` (multi-head, old architecture): per head its query, key and value: ``[n_heads, 3, head_dim]``.
    """
    r = n_heads // n_kv

    def to_ours(ts):
        f = ts[0]
        rest = tuple(f.shape[1:])
        if layout == "grouped":
            g = f.reshape(n_kv, r + 2, head_dim, *rest)
            q, k, v = g[:, :r], g[:, r], g[:, r + 1]
        elif layout == "per_head":
            g = f.reshape(n_heads, 3, head_dim, *rest)
            q, k, v = g[:, 0], g[:, 1], g[:, 2]
        else:
            q, k, v = torch.split(f, [n_heads * head_dim, head_dim, head_dim], dim=0)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]

    def to_hf(ts, extras):
        q, k, v = ts
        rest = tuple(q.shape[1:])
        if layout == "grouped":
            g = torch.cat([q.reshape(n_kv, r, head_dim, *rest), k.reshape(n_kv, 1, head_dim, *rest),
                           v.reshape(n_kv, 1, head_dim, *rest)], dim=1)
        elif layout == "per_head":
            g = torch.stack([q.reshape(n_heads, head_dim, *rest), k.reshape(n_heads, head_dim, *rest),
                             v.reshape(n_heads, head_dim, *rest)], dim=1)
        else:
            g = torch.cat([q, k, v], dim=0)
        return [g.reshape(-1, *rest)]

    return Link((hf,), tuple(ours), to_ours, to_hf)


def links(spec, shapes, config):
    """Falcon names: ``transformer.word_embeddings``, ``transformer.h.{i}.`` + ``input_layernorm`` (shared norm or
    sequential attention norm), ``post_attention_layernorm`` (sequential MLP norm) or ``ln_attn``/``ln_mlp`` (two
    parallel norms), ``self_attention.query_key_value`` (fused, see :func:`qkv_link`) and ``self_attention.dense``,
    ``mlp.dense_h_to_4h``/``dense_4h_to_h``, ``transformer.ln_f``."""
    h = "transformer.h.{i}."
    parallel = config.get("parallel_attn", True)
    n_ln = config.get("num_ln_in_parallel_attn") or (2 if config.get("new_decoder_architecture") else 1)
    if not parallel:
        norms = [("layers.{i}.attn_norm.{p}", h + "input_layernorm.{p}"), ("layers.{i}.ffn_norm.{p}", h + "post_attention_layernorm.{p}")]
    elif n_ln == 2:
        norms = [("layers.{i}.attn_norm.{p}", h + "ln_attn.{p}"), ("layers.{i}.ffn_norm.{p}", h + "ln_mlp.{p}")]
    else:
        norms = [("layers.{i}.attn_norm.{p}", h + "input_layernorm.{p}")]
    table = Renames([
        ("embed.weight", "transformer.word_embeddings.weight"),
        ("final_norm.{p}", "transformer.ln_f.{p}"),
        *norms,
        ("layers.{i}.attention.o_proj.{p}", h + "self_attention.dense.{p}"),
        ("layers.{i}.ffn.up.{p}", h + "mlp.dense_h_to_4h.{p}"),
        ("layers.{i}.ffn.down.{p}", h + "mlp.dense_4h_to_h.{p}"),
    ])
    out, skip = [], []
    layout = _layout(config)
    for i in range(spec.n_layers):
        att = spec.layer(i).attention
        hd = att.resolved_head_dim(spec.d_model)
        for p in ("weight", "bias"):
            qkv = [f"layers.{i}.attention.{x}_proj.{p}" for x in "qkv"]
            if all(n in shapes for n in qkv):
                out.append(qkv_link(f"transformer.h.{i}.self_attention.query_key_value.{p}", qkv, att.n_heads, att.kv_heads, hd, layout))
                skip += qkv
    return out + table.links(shapes, skip=skip) + head_link(spec, shapes)


def to_config(spec, base):
    """Spec → ``FalconConfig`` keys. The architecture flags follow the block: sequential pre-norm → old
    architecture (``multi_query`` for one KV head); two parallel norms → ``new_decoder_architecture``; one shared
    parallel norm → the old architecture for one or all KV heads (the new one when the source was new, or for GQA)."""
    ls = spec.layer(0)
    att, ffn, placement = ls.attention, ls.ffn, ls.placement
    nh, kv = att.n_heads, att.kv_heads
    cfg = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.d_model,
        "num_hidden_layers": spec.n_layers,
        "num_attention_heads": nh,
        "max_position_embeddings": spec.max_seq_len,
        "layer_norm_epsilon": getattr(ls.norm, "eps", None),
        "bias": bool(getattr(att, "q_bias", False)),
        "ffn_hidden_size": getattr(ffn, "d_ff", None),
        "activation": hf_activation(getattr(ffn, "activation", "gelu"), "gelu_pytorch_tanh", base.get("activation")),
        "tie_word_embeddings": spec.tie_embeddings,
        "initializer_range": spec.init_std,
    }
    shared = getattr(placement, "shared_norm", True)
    if placement.type != "parallel":
        cfg.update(new_decoder_architecture=False, parallel_attn=False, multi_query=kv == 1)
    elif not shared:
        cfg.update(new_decoder_architecture=True, parallel_attn=True, num_kv_heads=kv, num_ln_in_parallel_attn=2)
    elif base.get("new_decoder_architecture") or kv not in (1, nh):
        cfg.update(new_decoder_architecture=True, parallel_attn=True, num_kv_heads=kv, num_ln_in_parallel_attn=1)
    else:
        cfg.update(new_decoder_architecture=False, parallel_attn=True, multi_query=kv == 1)
    if spec.position.type == "alibi":
        cfg["alibi"] = True
    else:
        cfg["alibi"] = False
        cfg.update(rope_fields(ls.position))
    return cfg


WEIGHTS = HFWeights(
    model_type=MODEL_TYPE, convert=convert, make_links=links, to_config=to_config, architecture="FalconForCausalLM"
)
