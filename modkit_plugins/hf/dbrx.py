"""Hugging Face ``dbrx`` (Databricks DBRX) → modkit: bias-free LayerNorm blocks, GQA from one fused ``Wqkv`` whose
output is clamped, and in every layer a mixture of SwiGLU experts whose top-k softmax weights are divided by their
p-norm.

Semantics: ``transformers/models/dbrx/{configuration,modeling}_dbrx.py`` (``DbrxAttention``, ``DbrxRouter``,
``DbrxFFN``, ``DbrxExpertGLU``, ``DbrxBlock``). The config nests two sub-configs, read key by key:

* ``attn_config``: ``kv_n_heads`` (default 1), ``clip_qkv`` (``Wqkv``'s output clamped to ``[-clip_qkv, clip_qkv]``
  before it is split into q, k and v: modkit's ``clip_qkv``), ``attn_pdrop``; its ``rope_theta`` is not read by the
  rotary embedding (``DbrxRotaryEmbedding`` reads the top-level ``rope_parameters``, so a published DBRX file, which
  holds 500000 only there, runs in transformers 5 with the default base 10000), but ``DbrxAttention`` needs the key
  to exist, so an export writes the RoPE base there too;
* ``ffn_config``: ``ffn_hidden_size`` (each expert's width), ``moe_num_experts``, ``moe_top_k``,
  ``moe_normalize_expert_weights`` (the top-k softmax weights divided by their p-norm; null: not renormalised),
  ``moe_loss_weight`` (the balance loss), ``ffn_act_fn`` (``{"name": "silu"}`` only), ``moe_jitter_eps`` (training
  noise); its ``hidden_size`` is overwritten with ``d_model`` by ``DbrxConfig``.

Blocks: ``norm_1`` → attention → residual, ``norm_2`` → mixture → residual, every norm an ``nn.LayerNorm`` without
bias (eps 1e-5), the final ``norm_f`` too; no projection has a bias; ``tie_word_embeddings`` is refused by
``DbrxConfig`` itself.

On disk: ``transformer.wte``, ``transformer.blocks.{i}.norm_attn_norm.{norm_1, attn.Wqkv, attn.out_proj, norm_2}``,
``transformer.blocks.{i}.ffn.router.layer``, the experts as three ``[n_experts · ffn_hidden_size, d_model]`` matrices
``ffn.experts.mlp.w1`` (gate), ``v1`` (up) and ``w2`` (down, used as ``x @ w2``), ``transformer.norm_f``, ``lm_head``.
"""

from __future__ import annotations

from dataclasses import dataclass
from ._keys import Entry, Ignore, Key, Refuse, Rope
from ._reader import IRRELEVANT, HFConfig
from ._transforms import Transform
from ._type import HFType
from ._weights import Concat, Head, W

MODEL_TYPE = "dbrx"


def _sub(r: HFConfig, key: str, known: tuple[str, ...]) -> HFConfig:
    """A reader over the sub-config ``key`` (an object; null: the class defaults): its keys outside ``known`` and the
    generic ones are unknown keys of ``r`` (``key.name``)."""
    value = r.get(key) or {}
    if not isinstance(value, dict):
        r.error(key, f"must be an object, got {type(value).__name__}")
        value = {}
    for name, v in value.items():
        if name not in known and name not in IRRELEVANT:
            r.unknown_key(f"{key}.{name}", v)
    return HFConfig(value, r.model_type)


def _merge(r: HFConfig, sub: HFConfig, key: str) -> None:
    r.errors.extend((f"{key}.{path}", message) for path, message in sub.errors)


@dataclass(frozen=True)
class AttnConfig(Entry):
    """``attn_config``: ``kv_n_heads``, ``clip_qkv``, ``attn_pdrop`` (``rope_theta`` is not read; see the notes)."""

    SETS = ("n_kv_heads", "clip_qkv", "dropout_attention")
    KNOWN = ("kv_n_heads", "clip_qkv", "attn_pdrop", "rope_theta")

    def read(self, r, f, name):
        sub = _sub(r, name, self.KNOWN)
        kv = sub.number("kv_n_heads", 1, integer=True)
        if f["n_heads"] % kv:
            sub.error("kv_n_heads", f"= {kv} does not divide n_heads = {f['n_heads']}")
        clip = sub.number("clip_qkv", None)
        pdrop = sub.number("attn_pdrop", 0.0, positive=False)
        sub.ignore("rope_theta")
        _merge(r, sub, name)
        f["n_kv_heads"], f["clip_qkv"], f["dropout_attention"] = kv, clip, float(pdrop or 0.0)

    def write(self, f, base, name):
        theta = getattr(f["position"], "theta", 10000.0)
        return {
            name: {
                "kv_n_heads": f["n_kv_heads"],
                "clip_qkv": f["clip_qkv"],
                "attn_pdrop": f["dropout_attention"],
                "rope_theta": theta,
            }
        }

    def describe(self, name):
        return [
            (
                "`attn_config`: `kv_n_heads`, `clip_qkv`, `attn_pdrop`",
                "mapped",
                "`1`, null, `0`",
                "`n_kv_heads`, `clip_qkv`, attention dropout (`rope_theta` there is not read)",
            )
        ]


@dataclass(frozen=True)
class FfnConfig(Entry):
    """``ffn_config``: the experts (width, count, top-k), their p-norm weights, the balance loss, the activation."""

    SETS = ("d_ff", "n_experts", "top_k", "renormalize", "renormalize_p", "aux_loss_coef", "act")
    KNOWN = (
        "ffn_hidden_size",
        "moe_num_experts",
        "moe_top_k",
        "moe_normalize_expert_weights",
        "moe_loss_weight",
        "ffn_act_fn",
        "moe_jitter_eps",
        "hidden_size",
    )

    def read(self, r, f, name):
        sub = _sub(r, name, self.KNOWN)
        f["d_ff"] = sub.number("ffn_hidden_size", 3584, integer=True)
        f["n_experts"] = sub.number("moe_num_experts", 4, integer=True)
        f["top_k"] = sub.number("moe_top_k", 1, integer=True)
        key = "moe_normalize_expert_weights"  # a present null: no renormalisation (null is not the default here)
        p = None if key in sub.cfg and sub.cfg[key] is None else sub.number(key, 1.0)
        f["renormalize"], f["renormalize_p"] = p is not None, float(p or 1.0)
        f["aux_loss_coef"] = float(sub.number("moe_loss_weight", 0.01, positive=False))
        act = sub.get("ffn_act_fn") or {"name": "silu"}
        if not isinstance(act, dict) or act.get("name", "silu") != "silu" or set(act) - {"name"}:
            sub.error("ffn_act_fn", f"= {act}: DbrxExpertGLU's experts are SwiGLUs here; only {{'name': 'silu'}}")
        sub.ignore("moe_jitter_eps", "hidden_size")
        _merge(r, sub, name)

    def write(self, f, base, name):
        return {
            name: {
                "ffn_hidden_size": f["d_ff"],
                "moe_num_experts": f["n_experts"],
                "moe_top_k": f["top_k"],
                "moe_normalize_expert_weights": f["renormalize_p"] if f["renormalize"] else None,
                "moe_loss_weight": f["aux_loss_coef"],
                "ffn_act_fn": {"name": "silu"},
                "hidden_size": f["d_model"],
            }
        }

    def describe(self, name):
        return [
            (
                "`ffn_config`: `ffn_hidden_size`, `moe_num_experts`, `moe_top_k`, `moe_normalize_expert_weights`, "
                "`moe_loss_weight`, `ffn_act_fn`",
                "mapped",
                "`3584`, `4`, `1`, `1`, `0.01`, silu",
                "experts' width, count and top-k; renormalize_p (null: no renormalisation); aux_loss_coef",
            )
        ]


@dataclass(frozen=True)
class FlatExperts(Transform):
    """DBRX's experts ``[n_experts · d_ff, d_model]`` ↔ modkit's stacked ``[n_experts, d_model, d_ff]`` (``w1``,
    ``v1``: used as ``x @ w.T``; ``transpose``) or ``[n_experts, d_ff, d_model]`` (``w2``: used as ``x @ w``)."""

    transpose: bool = True

    def to_ours(self, ts, ctx):
        shape = ctx.shape(0)
        n, d_ff = shape[0], shape[2] if self.transpose else shape[1]
        t = ts[0].reshape(n, d_ff, -1)
        return [t.transpose(1, 2).contiguous() if self.transpose else t.contiguous()]

    def to_hf(self, ts, ctx, extras):
        t = ts[0].transpose(1, 2) if self.transpose else ts[0]
        return [t.reshape(-1, t.shape[-1]).contiguous()]

    def describe(self) -> str:
        return "experts flattened: [n_experts · d_ff, d_model] ↔ stacked" + (" (transposed)" if self.transpose else "")


B, A, E = "transformer.blocks.{i}.", "layers.{i}.attention.", "layers.{i}.ffn."


DBRX = HFType(
    model_type=MODEL_TYPE,
    architecture="DbrxForCausalLM",
    notes=__doc__,
    keys={
        # transformers DbrxConfig, key by key
        "vocab_size": Key("vocab_size", 32000),
        "d_model": Key("d_model", 2048, aliases=("hidden_size",)),
        "n_layers": Key("n_layers", 24, aliases=("num_hidden_layers",)),
        "n_heads": Key("n_heads", 16, aliases=("num_attention_heads",)),
        "max_seq_len": Key("max_seq_len", 2048, aliases=("max_position_embeddings",)),
        "attn_config": AttnConfig(),
        "ffn_config": FfnConfig(),
        "rope_theta": Rope(10000.0),
        "resid_pdrop": Key("dropout_residual", 0.0, kind="prob"),
        "emb_pdrop": Key("dropout_embedding", 0.0, kind="prob"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "tie_word_embeddings": Refuse(False, "DbrxConfig refuses tied embeddings"),
        "num_key_value_heads": Ignore("DbrxConfig copies attn_config.kv_n_heads here", carry=False),
        "output_router_logits": Ignore("switches router-logit outputs on in training", carry=False),
    },
    fixed={
        "norm": "layernorm",
        "norm_bias": False,
        "eps": 1e-5,
        "placement": {"type": "pre"},
        "ffn": "gated",
        "act": "silu",
        "moe": True,
    },
    tensors=(
        W("embed.weight", "transformer.wte.weight"),
        W("final_norm.weight", "transformer.norm_f.weight"),
        W("layers.{i}.attn_norm.weight", B + "norm_attn_norm.norm_1.weight"),
        W("layers.{i}.ffn_norm.weight", B + "norm_attn_norm.norm_2.weight"),
        W(
            (A + "q_proj.weight", A + "k_proj.weight", A + "v_proj.weight"),
            B + "norm_attn_norm.attn.Wqkv.weight",
            Concat(),
        ),
        W(A + "o_proj.weight", B + "norm_attn_norm.attn.out_proj.weight"),
        W(E + "router.proj.weight", B + "ffn.router.layer.weight"),
        W(E + "experts.gate", B + "ffn.experts.mlp.w1", FlatExperts()),
        W(E + "experts.up", B + "ffn.experts.mlp.v1", FlatExperts()),
        W(E + "experts.down", B + "ffn.experts.mlp.w2", FlatExperts(transpose=False)),
        Head(),
    ),
)

TYPE = DBRX
