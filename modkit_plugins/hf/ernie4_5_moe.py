"""Hugging Face ``ernie4_5_moe`` (Baidu ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B) → modkit: GQA with interleaved RoPE,
mixtures on a range of layers under a softmax router whose correction bias only selects the experts, beside shared
experts; one ``use_bias`` for every projection and the head.

Semantics: ``transformers/models/ernie4_5_moe/{configuration,modeling}_ernie4_5_moe.py``
(``Ernie4_5_MoeAttention``, ``Ernie4_5_MoeTopKRouter``, ``Ernie4_5_MoeStatics``, ``Ernie4_5_MoeSparseMoeBlock``):

* ``use_bias`` biases q, k, v, o, the dense FFNs, the shared experts and the LM head (not the routed experts or the
  router); the head is tied by default;
* RoPE rotates interleaved pairs (``rotate_half`` over features 2i, 2i + 1), the checkpoint's layout too;
* layer ``i`` holds a mixture iff ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
  moe_layer_end_index`` (-1: the last layer), else a dense SwiGLU of ``intermediate_size``;
* the router (float32, no bias) takes a softmax over ``moe_num_experts``; the experts are the top ``moe_k`` of the
  scores plus ``moe_statics.e_score_correction_bias`` (selection only), weighted by the unbiased scores renormalised
  to sum 1 (the sum clamped at ``moe_norm_min``: only the default 1e-12, which never binds, is read);
* ``moe_num_shared_experts`` shared experts form one SwiGLU of ``moe_num_shared_experts · moe_intermediate_size``;
* the multi-token-prediction layer (``num_nextn_predict_layers``, the ``mtp*`` tensors) is not part of the causal LM;
  its tensors are carried along.

On disk each expert is ``mlp.experts.{e}.{gate,up,down}_proj``, the router ``mlp.gate``, its bias
``mlp.moe_statics.e_score_correction_bias`` of shape ``[1, n_experts]``, the shared experts ``mlp.shared_experts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ._keys import Entry, Ignore, Key, KVHeads, Refuse, Rope, sizes
from ._transforms import Transform
from ._weights import StackExperts, W
from .llama import LLAMA, L

MODEL_TYPE = "ernie4_5_moe"


@dataclass(frozen=True)
class LeadingOne(Transform):
    """A checkpoint tensor ``[1, n]`` ↔ modkit's ``[n]`` (ERNIE's ``e_score_correction_bias``)."""

    def to_ours(self, ts, ctx):
        return [t.reshape(ctx.shape(0)) for t in ts]

    def to_hf(self, ts, ctx, extras):
        return [t.reshape(1, -1) for t in ts]

    def describe(self) -> str:
        return "reshaped: [1, n] in the checkpoint, [n] in modkit"


@dataclass(frozen=True)
class LayerRange(Entry):
    """ERNIE's mixture layers: ``(i + 1) % moe_layer_interval == 0`` and ``moe_layer_start_index <= i <=
    moe_layer_end_index`` (-1: the last layer). Export writes the first and last mixture layer and the source's
    interval when it explains the layers between, else 1."""

    SETS: ClassVar[tuple[str, ...]] = ("moe", "moe_layers")

    def config_keys(self, name):
        return ("moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval")

    def read(self, r, f, name):
        n = f["n_layers"]
        start = r.number("moe_layer_start_index", 1, integer=True, positive=False, minimum=0)
        end = r.number("moe_layer_end_index", -1, integer=True, positive=False, minimum=-1)
        step = r.number("moe_layer_interval", 1, integer=True)
        end = n - 1 if end == -1 else end
        flags = [(f["n_experts"] or 0) > 0 and (i + 1) % (step or 1) == 0 and start <= i <= end for i in range(n)]
        f["moe"], f["moe_layers"] = any(flags), flags

    def write(self, f, base, name):
        flags = f["moe_layers"] if f["moe"] else [False] * f["n_layers"]
        on = [i for i, m in enumerate(flags) if m]
        if not on:
            return {"moe_layer_start_index": len(flags), "moe_layer_end_index": -1, "moe_layer_interval": 1}
        for step in dict.fromkeys((base.get("moe_layer_interval") or 1, 1)):
            if all(((i + 1) % step == 0) == m for i, m in enumerate(flags) if on[0] <= i <= on[-1]):
                break
        return {"moe_layer_start_index": on[0], "moe_layer_end_index": on[-1], "moe_layer_interval": step}

    def describe(self, name):
        return [
            (
                "`moe_layer_start_index`, `moe_layer_end_index`, `moe_layer_interval`",
                "mapped",
                "`1`, `-1`, `1`",
                "`moe_layers`: mixtures where (i + 1) % interval = 0 between start and end, else dense FFNs of d_ff",
            )
        ]


E = "layers.{i}.ffn."

ERNIE4_5_MOE = LLAMA.derive(
    MODEL_TYPE,
    architecture="Ernie4_5_MoeForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "attention_bias", "attention_dropout"),
    keys={
        # transformers Ernie4_5_MoeConfig, key by key
        **sizes(
            vocab_size=103424,
            hidden_size=2560,
            num_hidden_layers=28,
            num_attention_heads=20,
            max_position_embeddings=131072,
        ),
        "num_key_value_heads": KVHeads(4),
        "intermediate_size": Key("d_ff", 12288, note="the dense layers"),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "tie_word_embeddings": Key("tie_embeddings", True, kind="flag"),
        "rope_theta": Rope(500000.0, layout="interleaved"),
        "use_bias": Key(
            ("qkv_bias", "o_bias", "mlp_bias", "shared_bias", "lm_head_bias"),
            False,
            kind="flag",
            note="q, k, v, o, the dense FFNs, the shared experts and the head",
        ),
        "moe_num_experts": Key("n_experts", 64, aliases=("num_experts",)),
        "moe_k": Key("top_k", 6, aliases=("num_experts_per_tok",)),
        "moe_intermediate_size": Key("expert_d_ff", 1536),
        "moe_num_shared_experts": Key(
            "shared_d_ff",
            2,
            kind="count",
            read_as=lambda v, f: v * f["expert_d_ff"] if v else None,
            write_as=lambda v, f: v // f["expert_d_ff"] if v else 0,
            note="moe_num_shared_experts × moe_intermediate_size",
        ),
        "moe_layer_start_index": LayerRange(),
        "moe_norm_min": Refuse(1e-12, "the renormalised weights divide by their sum, clamped only at 1e-12"),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "num_nextn_predict_layers": Ignore("the multi-token-prediction layer is not part of the causal LM"),
    },
    fixed={"moe": True, "renormalize": True, "correction_bias": True},
    tensors=(
        W(E + "router.proj.weight", L + "mlp.gate.weight"),
        W(E + "router.correction_bias", L + "mlp.moe_statics.e_score_correction_bias", LeadingOne()),
        *(
            W(E + f"experts.{x}", L + f"mlp.experts.{{e}}.{x}_proj.weight", StackExperts())
            for x in ("gate", "up", "down")
        ),
        *(W(E + f"shared.{x}.{{p}}", L + f"mlp.shared_experts.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
        W("lm_head.bias", "lm_head.bias"),
        W("lm_head_bias", "lm_head.bias"),  # the head's bias when the head is tied
    ),
    keep=((r"(model\.)?mtp.*", "the multi-token-prediction layer (not computed by the causal LM)"),),
    checkpoint_layout="interleaved",
)

TYPE = ERNIE4_5_MOE
