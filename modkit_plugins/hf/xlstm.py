"""Hugging Face ``xlstm`` (NX-AI xLSTM 7B) → modkit: every layer a pre-norm block of an mLSTM and a SwiGLU, RMSNorm
everywhere, soft-capped logits.

Semantics: ``transformers/models/xlstm/{configuration,modeling}_xlstm.py`` (transformers' own classes, used when the
``xlstm`` package is not installed):

* each block (``xLSTMBlock``) is ``x = x + mlstm_layer(norm_mlstm(x)); x = x + ffn(norm_ffn(x))``: modkit's ``pre``
  placement, the norms RMSNorms of ``norm_eps`` (``xLSTMRMSNorm``, reduced in float32);
* the mixer (``xLSTMLayer``) is modkit's ``mlstm``: ``num_heads`` heads, ``q`` and ``k`` of ``int(hidden_size ·
  qk_dim_factor)`` features, ``v`` and the output gate of ``int(hidden_size · v_dim_factor)``, input and forget
  gates soft-capped by ``gate_soft_cap``, the denominator's ``eps``, a per-head LayerNorm of ``norm_eps`` (weight
  over all features), the chunkwise form over ``chunk_size`` tokens (the same numbers as transformers' chunks of
  ``chunk_size`` followed by its step kernel);
* the FFN (``xLSTMFeedForward``) is a SwiGLU (``proj_up_gate`` the gate, ``proj_up`` the up, ``proj_down``) of width
  ``hidden_size · ffn_proj_factor`` rounded up to a multiple of ``ffn_round_up_to_multiple_of``;
* ``out_norm`` follows the last block (transformers' ``xLSTMModel`` builds and applies it whatever ``add_out_norm``
  says), and the logits are soft-capped, ``c · tanh(logits / c)`` with ``c = output_logit_soft_cap``.

The kernel keys (``chunkwise_kernel``, ``sequence_kernel``, ``step_kernel``, ``mode``, ``return_last_states``,
``autocast_kernel_dtype``, ``inference_state_dtype``, ``max_inference_chunksize``) choose how transformers computes
the same numbers and are carried over. transformers' xLSTM reads no attention mask: its padding tokens enter the
state, where modkit's leave it unchanged, so a left-padded batch gives each row the logits of the row alone in
modkit (transformers' unpadded numbers). Its cache sizes the state with the widths rounded up to multiples of 64
(``xLSTMConfig.qk_dim``), so transformers generates with a cache only where ``hidden_size · qk_dim_factor`` and
``hidden_size · v_dim_factor`` are such multiples; modkit's cache holds the widths the layer builds. The config has no
context length: the spec's ``max_seq_len`` is fixed at 1,048,576 (the decode state does not grow).
"""

from __future__ import annotations

from typing import Any, Mapping

from ._keys import Ignore, Key, Own, Refuse, Same
from ._reader import HFConfig
from ._type import HFType
from ._weights import Head, W

MODEL_TYPE = "xlstm"

#: the config keys of the mLSTM of every layer (:func:`read_own`, :func:`write_own`)
MIXER_KEYS = ("num_heads", "qk_dim_factor", "v_dim_factor", "gate_soft_cap", "eps", "chunk_size")
#: the keys that size the SwiGLU, with ``xLSTMConfig``'s defaults
FFN_DEFAULTS = {"ffn_proj_factor": 2.667, "ffn_round_up_to_multiple_of": 64}
#: the context length written into the spec (xLSTM configs have none)
MAX_SEQ_LEN = 2**20
#: keys that choose transformers' kernels and their precision, not the network
KERNEL_KEYS = (
    "chunkwise_kernel",
    "sequence_kernel",
    "step_kernel",
    "mode",
    "return_last_states",
    "autocast_kernel_dtype",
    "inference_state_dtype",
    "max_inference_chunksize",
)


def round_up(x: float, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple``, as ``xLSTMConfig``'s ``round_up_to_next_multiple_of``."""
    return int(((x + multiple - 1) // multiple) * multiple)


def _width(r: HFConfig, d: int, key: str, default: float) -> int:
    factor = r.number(key, default)
    width = int(d * factor)
    if width < 1:
        r.error(key, f"{key} = {factor} gives int(hidden_size · {key}) = {width} features; it must give at least 1")
        return int(d * default) or 1
    return width


def read_own(r: HFConfig, f: dict) -> None:
    """The ``mlstm`` of every layer from :data:`MIXER_KEYS` and the SwiGLU width from :data:`FFN_DEFAULTS`
    (``xLSTMConfig`` defaults)."""
    d = f["d_model"]
    heads = r.number("num_heads", 8, integer=True)
    qk, v = _width(r, d, "qk_dim_factor", 0.5), _width(r, d, "v_dim_factor", 1.0)
    for key, width in (("qk_dim_factor", qk), ("v_dim_factor", v)):
        if width % heads:
            r.error(
                key,
                f"{key} = {r.get(key)} gives int(hidden_size · {key}) = {width} features, not a multiple of "
                f"num_heads = {heads}: xLSTMLayer splits them into heads",
            )
    f["mixer"] = {
        "type": "mlstm",
        "n_heads": heads,
        "qk_dim": qk,
        "v_dim": v,
        "gate_soft_cap": r.number("gate_soft_cap", 15.0),
        "eps": r.number("eps", 1e-6),
        "norm_eps": f["eps"],
        "chunk_size": r.number("chunk_size", 64, integer=True, maximum=1024),
    }
    factor = r.number("ffn_proj_factor", FFN_DEFAULTS["ffn_proj_factor"])
    multiple = r.number("ffn_round_up_to_multiple_of", 64, integer=True)
    f["d_ff"] = round_up(d * factor, multiple)


def write_own(f: Mapping[str, Any], base: Mapping[str, Any], cfg: dict) -> None:
    """:data:`MIXER_KEYS` from the spec's ``mlstm`` (the factors ``qk_dim / hidden_size`` and ``v_dim /
    hidden_size``), and the FFN sizing keys: the source config's when they give ``d_ff`` again, else ``d_ff /
    hidden_size`` with a multiple that gives it back."""
    m, d = f["mixer"], f["d_model"]
    qk, v = m.widths(d)
    cfg.update(
        num_heads=m.n_heads,
        qk_dim_factor=qk / d,
        v_dim_factor=v / d,
        gate_soft_cap=m.gate_soft_cap,
        eps=m.eps,
        chunk_size=m.chunk_size,
    )
    sizing = {k: base.get(k, default) for k, default in FFN_DEFAULTS.items()}
    if round_up(d * sizing["ffn_proj_factor"], sizing["ffn_round_up_to_multiple_of"]) != f["d_ff"]:
        factor = f["d_ff"] / d
        multiple = next((x for x in (64, 1, f["d_ff"]) if round_up(d * factor, x) == f["d_ff"]), 1)
        sizing = {"ffn_proj_factor": factor, "ffn_round_up_to_multiple_of": multiple}
    cfg.update(sizing)


B = "backbone.blocks.{i}."
MIXER_TENSORS = ("q", "k", "v", "ogate_preact", "igate_preact", "fgate_preact", "multihead_norm", "out_proj")

XLSTM = HFType(
    model_type=MODEL_TYPE,
    architecture="xLSTMForCausalLM",
    notes=__doc__,
    # transformers xLSTMConfig, key by key
    keys={
        "vocab_size": Key("vocab_size", 50304),
        "hidden_size": Key("d_model", 4096),
        "embedding_dim": Same("d_model", "xLSTMConfig keeps embedding_dim equal to hidden_size"),
        "num_hidden_layers": Key("n_layers", 32),
        "num_blocks": Same("n_layers", "xLSTMConfig keeps num_blocks equal to num_hidden_layers"),
        "norm_eps": Key("eps", 1e-6, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "output_logit_soft_cap": Key("final_logit_softcap", 30.0, kind="nullable"),
        "num_heads": Own(
            (*MIXER_KEYS, *FFN_DEFAULTS),
            "the mlstm of every layer (qk_dim, v_dim from the factors) and the SwiGLU width (see the notes)",
            fields=("mixer", "d_ff"),
        ),
        "use_bias": Refuse(
            False, "biases sit on the blocks' RMSNorms too (xLSTMRMSNorm use_bias), which modkit's rmsnorm has not"
        ),
        "weight_mode": Refuse(
            "single",
            "the fused layout (qkv_opreact, ifgate_preact, proj_up_gate_z) is not mapped (transformers 5.25 cannot "
            "build it from a config either: its init fails on the fused gate bias); save the model as single",
        ),
        "add_out_norm": Refuse(
            True, "transformers' xLSTMModel applies out_norm whatever this says, the xlstm package's leaves it out"
        ),
        "norm_reduction_force_float32": Refuse(
            True, "modkit's norms reduce in float32; reductions in half precision are another network there"
        ),
        **{k: Ignore("chooses transformers' kernel or its precision: the same network") for k in KERNEL_KEYS},
    },
    fixed={
        "norm": "rmsnorm",
        "placement": {"type": "pre"},
        "ffn": "gated",
        "act": "silu",
        "position": {"type": "none"},
        "max_seq_len": MAX_SEQ_LEN,
    },
    tensors=(
        W("embed.weight", "backbone.embeddings.weight"),
        W("final_norm.weight", "backbone.out_norm.weight"),
        W("layers.{i}.attn_norm.weight", B + "norm_mlstm.weight"),
        W("layers.{i}.ffn_norm.weight", B + "norm_ffn.weight"),
        *(W(f"layers.{{i}}.attention.{x}.{{p}}", B + f"mlstm_layer.{x}.{{p}}") for x in MIXER_TENSORS),
        *(
            W(f"layers.{{i}}.ffn.{x}.{{p}}", B + f"ffn.{w}.{{p}}")
            for x, w in (("gate", "proj_up_gate"), ("up", "proj_up"), ("down", "proj_down"))
        ),
        Head(),
    ),
    read_own=read_own,
    write_own=write_own,
)

TYPE = XLSTM
