"""Hugging Face ``gpt_neox`` (GPT-NeoX-20B, the Pythia suite) → modkit: LayerNorm blocks, parallel or sequential,
multi-head attention with a fused per-head q/k/v, partial rotary, biases everywhere, an erf-GELU MLP.

Semantics: ``transformers/models/gpt_neox/{configuration,modeling}_gpt_neox.py`` (``GPTNeoXLayer``,
``GPTNeoXAttention``):

* ``use_parallel_residual`` (default true): ``x + attn(input_layernorm(x)) + mlp(post_attention_layernorm(x))``,
  modkit's ``parallel`` with two norms (``shared_norm: false``); false: the sequential pre-norm block, with the same
  two norms (``pre``);
* ``query_key_value`` holds, head by head, the query, key and value rows (``[n_heads, 3, head_dim]``; the output is
  viewed ``[..., n_heads, 3 * head_dim]`` and chunked in three), split into q/k/v here; ``attention_bias`` (default
  true) puts a bias on it and on the output ``dense``; ``head_dim = hidden_size // num_attention_heads``;
* RoPE on the first ``int(head_dim * partial)`` features of each head, half-split pairs: ``rope_parameters``
  (transformers 5) or the 4.x keys ``rotary_emb_base`` (default 10000) and ``rotary_pct`` (default 0.25), a
  ``rope_scaling`` dict replacing ``rope_parameters``, as ``GPTNeoXConfig.convert_rope_params_to_dict`` does;
* the MLP ``dense_4h_to_h(act(dense_h_to_4h(x)))`` always has biases; ``hidden_act`` default ``gelu`` (erf);
* a final LayerNorm; the head ``embed_out`` (transformers 5 renames it ``lm_head`` in memory and back on save),
  untied by default; ``hidden_dropout`` drops each sublayer output, ``attention_dropout`` the probabilities.

Old checkpoints (Pythia's) also store the causal-mask buffers ``attention.bias`` / ``attention.masked_bias`` and
the rotary table ``attention.rotary_emb.inv_freq``; they are derivable, carried along for a lossless export.
"""

from __future__ import annotations

from ._keys import HeadDim, Key, Rope, sizes
from ._type import HFType
from ._weights import FusedQKV, Head, W

MODEL_TYPE = "gpt_neox"

L = "gpt_neox.layers.{i}."

#: the two placements of ``use_parallel_residual``
PARALLEL, SEQUENTIAL = {"type": "parallel", "shared_norm": False}, {"type": "pre"}


def _placement(parallel: bool, f) -> dict:
    return dict(PARALLEL if parallel else SEQUENTIAL)


def _parallel(placement, f) -> bool:
    return placement.type == "parallel"


GPT_NEOX = HFType(
    model_type=MODEL_TYPE,
    architecture="GPTNeoXForCausalLM",
    notes=__doc__,
    # transformers GPTNeoXConfig, key by key
    keys={
        **sizes(
            vocab_size=50432,
            hidden_size=6144,
            num_hidden_layers=44,
            num_attention_heads=64,
            max_position_embeddings=2048,
        ),
        "head_dim": HeadDim(in_config=False),
        "intermediate_size": Key("d_ff", 24576),
        "hidden_act": Key("act", "gelu", kind="act"),
        "layer_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", False, kind="flag"),
        "initializer_range": Key("init_std", 0.02, kind="number"),
        "use_parallel_residual": Key(
            "placement",
            True,
            kind="flag",
            read_as=_placement,
            write_as=_parallel,
            note="true: parallel with two norms; false: sequential pre-norm",
        ),
        "rope_parameters": Rope(
            10000.0, partial=0.25, always_partial=True, theta_key="rotary_emb_base", partial_key="rotary_pct"
        ),
        "attention_bias": Key(("qkv_bias", "o_bias"), True, kind="flag", note="query_key_value and dense"),
        "attention_dropout": Key("dropout_attention", 0.0, kind="prob"),
        "hidden_dropout": Key("dropout_residual", 0.0, kind="prob"),
    },
    fixed={"norm": "layernorm", "ffn": "mlp", "mlp_bias": True},
    tensors=(
        W("embed.weight", "gpt_neox.embed_in.weight"),
        W("final_norm.{p}", "gpt_neox.final_layer_norm.{p}"),
        W("layers.{i}.attn_norm.{p}", L + "input_layernorm.{p}"),
        W("layers.{i}.ffn_norm.{p}", L + "post_attention_layernorm.{p}"),
        W(
            tuple(f"layers.{{i}}.attention.{x}_proj.{{p}}" for x in "qkv"),
            L + "attention.query_key_value.{p}",
            FusedQKV("per_head"),
        ),
        W("layers.{i}.attention.o_proj.{p}", L + "attention.dense.{p}"),
        W("layers.{i}.ffn.up.{p}", L + "mlp.dense_h_to_4h.{p}"),
        W("layers.{i}.ffn.down.{p}", L + "mlp.dense_4h_to_h.{p}"),
        Head("embed_out.weight"),
    ),
    keep=(
        (
            r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",
            "causal-mask and RoPE-table buffers of old checkpoints (derivable)",
        ),
    ),
    aliases=(("embed_out.", "lm_head."),),
)

TYPE = GPT_NEOX
