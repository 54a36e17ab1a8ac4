"""Hugging Face ``qwen3_5_text`` (the language model of Qwen3.5) → modkit: Qwen3-Next's hybrid of Gated DeltaNet
and gated attention layers with a dense SwiGLU in every layer and the linear layers' projections stored unfused.

Semantics: ``transformers/models/qwen3_5/{configuration,modeling}_qwen3_5.py`` (``Qwen3_5TextConfig`` derives from
``Qwen3NextConfig``; read through :mod:`.qwen3_next`, whose notes hold for the layer pattern, the gated attention and
the (1 + w) RMSNorms), with these differences:

* every FFN is a SwiGLU of ``intermediate_size`` (``Qwen3_5MLP``): the config class has no mixture keys;
* the Gated DeltaNet (``Qwen3_5GatedDeltaNet``) keeps four projections: ``in_proj_qkv`` (all query rows, then all
  key rows, then all value rows, the order of the convolution's channels), ``in_proj_z`` (the output gate),
  ``in_proj_b`` and ``in_proj_a`` (one row per value head);
* the rotary embedding is Qwen3-VL's multimodal one (``mrope_section``, ``mrope_interleaved`` in
  ``rope_parameters``): a text-only sequence gives every section the same position, which is the plain partial RoPE,
  so those two keys do not change the language model and are not exported.

The ``qwen3_5`` vision-language checkpoints (``Qwen3_5Config``, the text model's config under ``text_config``) load
as their language model, this type (:mod:`.qwen3_5_vl`; the vision tower is left out).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._keys import Rope
from ._transforms import Transform
from ._weights import W
from .llama import L
from .qwen3_next import QWEN3_NEXT

MODEL_TYPE = "qwen3_5_text"

#: the keys of Qwen3-VL's multimodal RoPE that a text-only sequence does not use
MROPE_KEYS = ("mrope_section", "mrope_interleaved")


@dataclass(frozen=True)
class TextRope(Rope):
    """:class:`Rope` of a multimodal-RoPE config read for text: ``rope_parameters``' :data:`MROPE_KEYS` are marked
    read and left out (every section sees the same text position)."""

    def read(self, r, f, name):
        params = r.cfg.get("rope_parameters")
        if isinstance(params, dict) and set(params) & set(MROPE_KEYS):
            r.cfg = {**r.cfg, "rope_parameters": {k: v for k, v in params.items() if k not in MROPE_KEYS}}
        super().read(r, f, name)

    def describe(self, name):
        ((keys, status, default, how),) = super().describe(name)
        return [(keys, status, default, how + "; `mrope_section`, `mrope_interleaved` read for text (no effect)")]


@dataclass(frozen=True)
class Groups(Transform):
    """Checkpoint tensors each the rows of consecutive modkit tensors: ``parts[j]`` modkit tensors (in order) fused
    along dim 0 into the ``j``-th checkpoint tensor (Qwen3.5's ``in_proj_qkv`` holds q, k, v; ``in_proj_z`` the
    output gate alone)."""

    parts: tuple[int, ...] = ()

    def to_ours(self, ts, ctx):
        out, k = [], 0
        for t, n in zip(ts, self.parts):
            out += list(torch.split(t, [ctx.shape(k + j)[0] for j in range(n)], dim=0))
            k += n
        return out

    def to_hf(self, ts, ctx, extras):
        out, k = [], 0
        for n in self.parts:
            out.append(torch.cat(list(ts[k : k + n]), dim=0))
            k += n
        return out

    def describe(self) -> str:
        return f"fused: groups of {', '.join(map(str, self.parts))} parts, rows concatenated"


A = "layers.{i}.attention."
#: the Gated DeltaNet as Qwen3.5 saves it (q/k/v fused in that order; z, b, a apart), in place of Qwen3-Next's rows
LINEAR_TENSORS = (
    W((A + "q_proj.weight", A + "k_proj.weight", A + "v_proj.weight", A + "g_proj.weight"),
      (L + "linear_attn.in_proj_qkv.weight", L + "linear_attn.in_proj_z.weight"), Groups((3, 1))),
    W((A + "b_proj.weight", A + "a_proj.weight"),
      (L + "linear_attn.in_proj_b.weight", L + "linear_attn.in_proj_a.weight"), Groups((1, 1))),
)  # fmt: skip
#: Qwen3-Next's fused rows that :data:`LINEAR_TENSORS` replace
NEXT_LINEAR = (
    tuple(A + f"{x}_proj.weight" for x in "qkvg"),
    (A + "b_proj.weight", A + "a_proj.weight"),
)

#: Qwen3-Next's mixture keys, which the dense Qwen3.5 config class does not have
MOE_KEYS = (
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "norm_topk_prob",
    "decoder_sparse_step",
    "router_aux_loss_coef",
    "output_router_logits",
    "shared_expert_intermediate_size",
)

QWEN3_5 = QWEN3_NEXT.derive(
    MODEL_TYPE,
    architecture="Qwen3_5ForCausalLM",
    notes=__doc__,
    drop=MOE_KEYS,
    # transformers Qwen3_5TextConfig defaults
    defaults={
        "vocab_size": 248320,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_key_value_heads": 4,
    },
    keys={"rope_theta": TextRope(10000.0, partial=0.25, always_partial=True)},
    fixed={"moe": False, "shared_gate": False},
    tensors=LINEAR_TENSORS,
    drop_tensors=NEXT_LINEAR,
)

TYPE = QWEN3_5
