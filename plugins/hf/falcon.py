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
  by ``1 / sqrt(head_dim)`` together with the scores (``modeling_falcon.py``: ``(scores + alibi) *
  inv_norm_factor`` in the eager path), so ``alibi: true`` maps to ``{"type": "alibi", "scale": head_dim**-0.5}``.
"""

from __future__ import annotations

from ._common import HFConfig, attention, layernorm, model_spec, rope, sizes

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
            r.error("num_ln_in_parallel_attn", f"must be 1 or 2, got {n_ln!r}")
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
            r.error("num_ln_in_parallel_attn", f"{n_ln!r} requires new_decoder_architecture = true (transformers reads it only there)")
        placement = {"type": "parallel", "shared_norm": True} if parallel else {"type": "pre"}

    if r.flag("alibi", False):
        r.ignore("rope_parameters", "rope_theta", "rope_scaling")  # transformers builds no rotary table then
        # transformers' eager Falcon computes (scores + alibi) / sqrt(head_dim): the bias is scaled too
        position = {"type": "alibi", "scale": (d // n_heads) ** -0.5}
    else:
        position = rope(r, default_theta=10000.0)

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
