"""Hugging Face ``longcat_flash`` (Meituan LongCat-Flash) → modkit: layers of two MLA + dense-MLP sublayer pairs with a
shortcut-connected mixture of experts across them, whose choices include zero-computation (identity) experts.

Semantics: ``transformers/models/longcat_flash/{configuration,modeling}_longcat_flash.py`` (``LongcatFlashMLA``,
``LongcatFlashTopkRouter``, ``LongcatFlashMoE``, ``LongcatFlashDecoderLayer``):

* each of the ``num_layers`` layers is one modkit block with placement ``shortcut-moe``
  (:mod:`modkit_plugins.shortcut_moe`): ``self_attn.0`` is the block's attention, ``self_attn.1`` the placement's
  ``mixer``, ``mlps.0`` / ``mlps.1`` its two ``dense`` SwiGLUs of ``ffn_hidden_size``, and the mixture ``mlp`` the
  block's ffn, which reads the input of ``mlps.0`` and is added after ``mlps.1``; the norms are
  ``input_layernorm.{0,1}`` (attn_norm, attn_2_norm) and ``post_attention_layernorm.{0,1}`` (ffn_norm, ffn_2_norm).
  transformers counts ``num_hidden_layers = 2 · num_layers`` (one per attention sublayer; a config giving only
  ``num_hidden_layers`` has ``num_layers`` half of it);
* attention is ``mla`` with low-rank queries always (``q_lora_rank``), latent norms RMSNorm eps 1e-6 (the class
  default, whatever ``rms_norm_eps``), interleaved RoPE pairs (``apply_rotary_pos_emb_interleave``) and
  ``lora_scale``: the queries times ``sqrt(hidden_size / q_lora_rank)``, the normalised latent times
  ``sqrt(hidden_size / kv_lora_rank)`` before it is cached. The RoPE tables are built for ``head_dim``, so it must
  equal ``qk_rope_head_dim``; ``qk_head_dim`` must be ``qk_nope_head_dim + qk_rope_head_dim`` and
  ``num_key_value_heads`` the heads (the latent serves every head). A YaRN scaling with ``mscale_all_dim`` multiplies
  the softmax scale by ``mscale²`` as in DeepSeek-V3;
* the mixture: ``n_routed_experts`` SwiGLUs of ``expert_ffn_hidden_size`` plus ``zero_expert_num`` zero-computation
  experts (``n_zero_experts``): the router ``classifier`` scores all ``n + z`` choices by a float32 softmax, picks
  ``moe_topk`` by the scores plus ``e_score_correction_bias`` (a selection-only buffer over all choices), weights the
  unbiased scores times ``routed_scaling_factor`` without renormalising; a choice ``>= n_routed_experts`` returns its
  input times its weight. A config's ``router_bias`` (read by transformers if present) puts a bias on the router;
* the multi-token-prediction module of the published checkpoint (``model.mtp.*``) is not part of the causal LM
  transformers builds: carried along, not computed.

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj`` (transformers 5 saves the fused ``gate_up_proj`` per
expert), the router ``mlp.router.classifier`` with its ``e_score_correction_bias``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ._keys import Entry, Ignore, Key, Own, Rope, sizes
from ._reader import HFConfig
from ._spec import attention_spec, dense_ffn, rmsnorm, norm_spec
from ._type import HFType
from ._weights import Head, StackExperts, W

MODEL_TYPE = "longcat_flash"

#: ``LongcatFlashRMSNorm``'s default eps, which the latent norms keep
LATENT_EPS = 1e-6

#: the keys :func:`read_own` reads and :func:`write_own` writes
OWN_KEYS = ("num_key_value_heads", "head_dim", "qk_head_dim", "router_bias", "num_hidden_layers")


class LatentAttention(Entry):
    """LongCat-Flash's ``mla``: ranks and head widths with transformers' defaults, ``attention_bias``, the YaRN
    softmax-scale correction and the latent scaling (always on)."""

    SETS = ("mla",)
    KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "attention_bias")

    def config_keys(self, name):
        return self.KEYS

    def read(self, r, f, name):
        mla = {
            "q_lora_rank": r.number("q_lora_rank", 1536, integer=True),
            "kv_lora_rank": r.number("kv_lora_rank", 512, integer=True),
            "qk_nope_head_dim": r.number("qk_nope_head_dim", 128, integer=True),
            "qk_rope_head_dim": r.number("qk_rope_head_dim", 64, integer=True),
            "v_head_dim": r.number("v_head_dim", 128, integer=True),
        }
        if r.flag("attention_bias", False):
            mla["bias"] = True
        scaling = (f["position"] or {}).get("scaling") or {}
        if scaling.get("type") == "yarn" and scaling.get("mscale_all_dim"):
            mla["yarn_mscale"] = {"factor": scaling["factor"], "mscale_all_dim": scaling["mscale_all_dim"]}
        mla["latent_norm"] = rmsnorm(LATENT_EPS)
        mla["lora_scale"] = True
        f["mla"] = mla

    def write(self, f, base, name):
        mla = f["mla"] or {}
        out = {k: mla.get(k) for k in self.KEYS[:-1]}
        out["attention_bias"] = bool(mla.get("bias"))
        return out

    def describe(self, name):
        return [
            (
                "`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`",
                "mapped",
                "`1536`, `512`, `128`, `64`, `128`",
                "`mla` with lora_scale: ranks and head widths (latent norms RMSNorm, eps 1e-6)",
            ),
            ("`attention_bias`", "mapped", "`false`", "`mla.bias`: q_a_proj, kv_a_proj_with_mqa, o_proj"),
        ]


def read_own(r: HFConfig, f: dict) -> None:
    """The head counts transformers derives or requires, the router bias, and the block: placement ``shortcut-moe``
    with the second attention equal to the first and the dense SwiGLU of ``d_ff``."""
    if "num_layers" not in r and r.get("num_hidden_layers") is not None:
        f["n_layers"] = r.number("num_hidden_layers", 56, integer=True) // 2
    r.ignore("num_hidden_layers")
    rope, mla, heads = f["mla"]["qk_rope_head_dim"], f["mla"], f["n_heads"]
    for key, want, why in (
        ("num_key_value_heads", heads, "latent attention serves every head from one latent"),
        ("head_dim", rope, "transformers builds the RoPE tables for head_dim features and rotates qk_rope_head_dim"),
        (
            "qk_head_dim",
            mla["qk_nope_head_dim"] + rope,
            "the queries split into qk_nope_head_dim + qk_rope_head_dim features",
        ),
    ):
        got = r.number(key, None, integer=True)
        if got is not None and got != want:
            r.error(key, f"= {got}, but must be {want} here: {why}")
    f["router_bias"] = r.flag("router_bias", False)
    att = attention_spec(f, "full_attention", norm_spec(f))
    f["placement"] = {"type": "shortcut-moe", "mixer": att, "dense": dense_ffn(f)}


def write_own(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """The dense width from the placement, the derived head counts, ``router_bias`` when set."""
    placement = f["placement"]
    dense = getattr(placement, "dense", None)
    if dense is not None:
        cfg["ffn_hidden_size"] = dense.d_ff
    rope = (f["mla"] or {}).get("qk_rope_head_dim")
    cfg.update(
        num_key_value_heads=f["n_heads"],
        head_dim=rope,
        qk_head_dim=(f["mla"] or {}).get("qk_nope_head_dim", 0) + (rope or 0),
    )
    if f["router_bias"]:
        cfg["router_bias"] = True


L = "model.layers.{i}."
A = "layers.{i}.attention"
F = "layers.{i}.ffn."


def _attention_rows(ours: str, hf: str) -> tuple:
    """The MLA tensors of one attention sublayer (``ours`` modkit prefix, ``hf`` checkpoint prefix)."""
    return (
        *(W(f"{ours}.{x}.{{p}}", f"{hf}.{x}.{{p}}") for x in ("q_a_proj", "kv_a_proj_with_mqa", "o_proj")),
        *(
            W(f"{ours}.{x}.weight", f"{hf}.{x}.weight")
            for x in ("q_a_layernorm", "q_b_proj", "kv_a_layernorm", "kv_b_proj")
        ),
    )


TENSORS = (
    W("embed.weight", "model.embed_tokens.weight"),
    W("final_norm.weight", "model.norm.weight"),
    W("layers.{i}.attn_norm.weight", L + "input_layernorm.0.weight"),
    W("layers.{i}.attn_2_norm.weight", L + "input_layernorm.1.weight"),
    W("layers.{i}.ffn_norm.weight", L + "post_attention_layernorm.0.weight"),
    W("layers.{i}.ffn_2_norm.weight", L + "post_attention_layernorm.1.weight"),
    *_attention_rows(A, L + "self_attn.0"),
    *_attention_rows(A + "_2", L + "self_attn.1"),
    *(W(f"layers.{{i}}.dense.{x}.weight", L + f"mlps.0.{x}_proj.weight") for x in ("gate", "up", "down")),
    *(W(f"layers.{{i}}.dense_2.{x}.weight", L + f"mlps.1.{x}_proj.weight") for x in ("gate", "up", "down")),
    W(F + "router.proj.{p}", L + "mlp.router.classifier.{p}"),
    W(F + "router.correction_bias", L + "mlp.router.e_score_correction_bias"),
    *(W(F + f"experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts()) for x in ("gate", "up", "down")),
    Head(),
)

#: the size rows, the layer count under LongCat's own name (``num_layers``, below)
SIZES = {
    k: v
    for k, v in sizes(
        vocab_size=131072,
        hidden_size=6144,
        num_hidden_layers=28,
        num_attention_heads=64,
        max_position_embeddings=131072,
    ).items()
    if k != "num_hidden_layers"
}

LONGCAT_FLASH = HFType(
    model_type=MODEL_TYPE,
    architecture="LongcatFlashForCausalLM",
    notes=__doc__,
    # transformers LongcatFlashConfig, key by key
    keys={
        **SIZES,
        "num_layers": Key("n_layers", 28, note="one block per layer (two attention sublayers each)"),
        "hidden_act": Key("act", "silu", kind="act"),
        "ffn_hidden_size": Key("d_ff", 12288, aliases=("intermediate_size",), note="the two dense MLPs of a layer"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "rope_parameters": Rope(10_000_000.0, layout="interleaved"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "q_lora_rank": LatentAttention(),
        "n_routed_experts": Key("n_experts", 512, aliases=("num_local_experts",)),
        "zero_expert_num": Key("n_zero_experts", 256, kind="count", note="zero-computation (identity) experts"),
        "moe_topk": Key("top_k", 12, aliases=("num_experts_per_tok",)),
        "expert_ffn_hidden_size": Key("expert_d_ff", 2048, aliases=("moe_intermediate_size",)),
        "routed_scaling_factor": Key("routed_scaling_factor", 6.0, kind="number"),
        "own": Own(
            OWN_KEYS,
            "num_key_value_heads (= heads), head_dim (= qk_rope_head_dim), qk_head_dim (= nope + rope) are checked "
            "and written; router_bias: a bias on the router classifier; num_hidden_layers: 2 · num_layers",
            fields=("router_bias",),
        ),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={
        "norm": "rmsnorm",
        "ffn": "gated",
        "moe": True,
        "router": "topk",
        "correction_bias": True,
        "placement": {"type": "shortcut-moe"},
    },
    tensors=TENSORS,
    keep=((r"model\.mtp\..*", "LongCat-Flash's multi-token-prediction module (not computed by the causal LM)"),),
    checkpoint_layout="interleaved",
    read_own=read_own,
    write_own=write_own,
)

TYPE = LONGCAT_FLASH
