"""Hugging Face ``falcon`` → modkit.

Semantics: ``transformers/models/falcon/{configuration,modeling}_falcon.py``:

* ``new_decoder_architecture`` (Falcon-40B/180B): grouped-query attention with ``num_kv_heads`` heads and
  parallel blocks with ``num_ln_in_parallel_attn`` norms (default 2: ``ln_attn`` and ``ln_mlp``; 1: shared);
  ``multi_query`` and ``parallel_attn`` are ignored by transformers there (``parallel_attn: false`` is refused,
  since transformers' block cannot run it).
* otherwise (Falcon-7B, Falcon-RW): ``multi_query`` gives one KV head, else ``num_attention_heads``;
  ``parallel_attn`` gives a parallel block with one shared norm, else a sequential pre-norm block.
* ``num_key_value_heads`` (written by transformers 5.25 and later, derived from the flags above) is the same KV
  width once more: read and checked against the flags, and written on export.
* ``bias`` on the fused QKV, the output ``dense`` and both MLP projections (one switch for all);
  MLP width ``ffn_hidden_size`` (default ``4 * hidden_size``) and ``activation``; LayerNorms with bias;
  head tied by default, never biased.
* positions: RoPE (half-split pairs, ``rope_theta``) unless ``alibi``. transformers scales Falcon's ALiBi bias
  by ``1 / sqrt(head_dim)`` like the scores (``FalconModel.forward`` folds ``alibi / sqrt(head_dim)`` into the
  attention mask), so ``alibi: true`` maps to ``{"type": "alibi", "scale": head_dim**-0.5}``. This matches
  transformers' SDPA path to 4e-7 (tests/plugins/hf/test_hf_parity.py); its eager path adds the bias a second time
  (``(scores + alibi) * inv_norm_factor`` plus the mask that already holds it), a transformers quirk not followed.
* weights: ``query_key_value`` fuses q, k, v per KV group (new architecture), as all queries then the key and
  value head (multi-query), or per head (multi-head); the norms are ``input_layernorm`` (+
  ``post_attention_layernorm`` when sequential) or ``ln_attn`` / ``ln_mlp`` (two parallel norms).

The three architectures are the code of this type's own (:func:`read_architecture`, :func:`write_architecture`).
"""

from __future__ import annotations

from typing import Any, Mapping

from modkit.plugin import json_value

from ._keys import HeadDim, Key, Own, Refuse, sizes
from ._reader import HFConfig
from ._rope import rope, rope_fields
from ._type import HFType
from ._weights import FusedQKV, Head, W

MODEL_TYPE = "falcon"

ARCHITECTURE_KEYS = (
    "new_decoder_architecture",
    "multi_query",
    "parallel_attn",
    "num_ln_in_parallel_attn",
    "num_kv_heads",
    "num_key_value_heads",
)
POSITION_KEYS = ("alibi", "rope_parameters", "rope_theta", "rope_scaling")


def read_architecture(r: HFConfig, f: dict) -> None:
    """The KV heads and the placement from the three architecture flags, and ALiBi or RoPE."""
    n_heads = f["n_heads"]
    new_arch = r.flag("new_decoder_architecture", False)
    multi_query = r.flag("multi_query", True)
    parallel = r.flag("parallel_attn", True)
    n_ln = r.get("num_ln_in_parallel_attn")
    kv_cfg = r.number("num_kv_heads", None, integer=True)
    if new_arch:
        kv = kv_cfg if kv_cfg is not None else n_heads
        if n_heads % kv:
            r.error("num_kv_heads", f"num_kv_heads = {kv} does not divide num_attention_heads = {n_heads}")
        if not parallel:
            r.error(
                "parallel_attn",
                "false with new_decoder_architecture: transformers' FalconDecoderLayer cannot run this combination",
            )
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
            r.error(
                "num_ln_in_parallel_attn",
                f"{json_value(n_ln)} requires new_decoder_architecture = true (transformers reads it only there)",
            )
        placement = {"type": "parallel", "shared_norm": True} if parallel else {"type": "pre"}
    # transformers 5.25 and later write the KV width the three flags give as num_key_value_heads (and recompute it
    # on load); an older config has no such key. A value that disagrees with the flags describes no network
    # transformers builds, so it is refused rather than one of the two picked.
    written = r.number("num_key_value_heads", None, integer=True)
    if written is not None and written != kv:
        r.error(
            "num_key_value_heads",
            f"{written}, but new_decoder_architecture = {json_value(new_arch)}, multi_query = {json_value(multi_query)} "
            f"and num_kv_heads = {json_value(kv_cfg)} give {kv} key/value heads; make it {kv} or remove the key",
        )
    f["n_kv_heads"], f["placement"] = kv, placement
    if r.flag("alibi", False):
        r.ignore("rope_parameters", "rope_theta", "rope_scaling")  # transformers builds no rotary table then
        # transformers' eager Falcon computes (scores + alibi) / sqrt(head_dim): the bias is scaled too
        f["position"] = {"type": "alibi", "scale": f["head_dim"] ** -0.5}
    else:
        f["position"] = rope(r, default_theta=10000.0, max_seq_len=f["max_seq_len"])


def write_architecture(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """The architecture flags that give the spec's block: sequential pre-norm → old architecture (``multi_query``
    for one KV head); two parallel norms → ``new_decoder_architecture``; one shared parallel norm → the old
    architecture for one or all KV heads (the new one when the source was new, or for GQA); then ALiBi or RoPE."""
    placement, nh, kv = f["placement"], f["n_heads"], f["n_kv_heads"]
    shared = getattr(placement, "shared_norm", True)
    if placement.type != "parallel":
        cfg.update(new_decoder_architecture=False, parallel_attn=False, multi_query=kv == 1)
    elif not shared:
        cfg.update(new_decoder_architecture=True, parallel_attn=True, num_kv_heads=kv, num_ln_in_parallel_attn=2)
    elif base.get("new_decoder_architecture") or kv not in (1, nh):
        cfg.update(new_decoder_architecture=True, parallel_attn=True, num_kv_heads=kv, num_ln_in_parallel_attn=1)
    else:
        cfg.update(new_decoder_architecture=False, parallel_attn=True, multi_query=kv == 1)
    cfg["num_key_value_heads"] = kv  # what transformers 5.25+ writes beside the flags
    if f["position"].type == "alibi":
        cfg["alibi"] = True
    else:
        cfg["alibi"] = False
        cfg.update(rope_fields(f["position"]))


def qkv_layout(config: Mapping[str, Any]) -> str:
    """How ``query_key_value`` is fused: per KV group (new architecture), all queries then k and v (multi-query),
    or per head (multi-head)."""
    if config.get("new_decoder_architecture"):
        return "grouped"
    return "blocks" if config.get("multi_query", True) else "per_head"


def _two_norms(config: Mapping[str, Any]) -> bool:
    n_ln = config.get("num_ln_in_parallel_attn") or (2 if config.get("new_decoder_architecture") else 1)
    return config.get("parallel_attn", True) and n_ln == 2


def _sequential(config: Mapping[str, Any]) -> bool:
    return not config.get("parallel_attn", True)


H = "transformer.h.{i}."

FALCON = HFType(
    model_type=MODEL_TYPE,
    architecture="FalconForCausalLM",
    notes=__doc__,
    # transformers FalconConfig
    keys={
        **sizes(
            vocab_size=65024,
            hidden_size=4544,
            num_hidden_layers=32,
            num_attention_heads=71,
            max_position_embeddings=2048,
        ),
        "hidden_size": Key("d_model", 4544, aliases=("n_embed",)),
        "head_dim": HeadDim(in_config=False),
        "new_decoder_architecture": Own(
            ARCHITECTURE_KEYS,
            "KV heads and the parallel or sequential block (see the notes)",
            fields=("n_kv_heads", "placement"),
        ),
        "apply_residual_connection_post_layernorm": Refuse(
            False, "a residual taken after the norm is not supported (and no longer read by transformers)"
        ),
        "bias": Key(("qkv_bias", "o_bias", "mlp_bias"), False, kind="flag", note="every projection"),
        "ffn_hidden_size": Key("d_ff", lambda f: 4 * f["d_model"], note="4 × hidden_size when absent"),
        "activation": Key("act", "gelu", kind="act"),
        "layer_norm_epsilon": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "alibi": Own(POSITION_KEYS, "ALiBi (scaled by 1/sqrt(head_dim)) or RoPE", fields=("position",)),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "hidden_dropout": Key("dropout_residual", 0.0, kind="prob"),
    },
    fixed={"norm": "layernorm", "ffn": "mlp"},
    read_own=read_architecture,
    write_own=write_architecture,
    tensors=(
        W("embed.weight", "transformer.word_embeddings.weight"),
        W("final_norm.{p}", "transformer.ln_f.{p}"),
        W("layers.{i}.attn_norm.{p}", H + "input_layernorm.{p}", when=lambda c: not _two_norms(c)),
        W("layers.{i}.ffn_norm.{p}", H + "post_attention_layernorm.{p}", when=_sequential),
        W("layers.{i}.attn_norm.{p}", H + "ln_attn.{p}", when=_two_norms),
        W("layers.{i}.ffn_norm.{p}", H + "ln_mlp.{p}", when=_two_norms),
        W(
            tuple(f"layers.{{i}}.attention.{x}_proj.{{p}}" for x in "qkv"),
            H + "self_attention.query_key_value.{p}",
            FusedQKV(qkv_layout),
        ),
        W("layers.{i}.attention.o_proj.{p}", H + "self_attention.dense.{p}"),
        W("layers.{i}.ffn.up.{p}", H + "mlp.dense_h_to_4h.{p}"),
        W("layers.{i}.ffn.down.{p}", H + "mlp.dense_4h_to_h.{p}"),
        Head(),
    ),
)

TYPE = FALCON
