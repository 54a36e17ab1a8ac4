"""Hugging Face ``llama4_text`` (the text model of Llama 4 Scout and Maverick) → modkit: chunked attention on the RoPE
layers, NoPE layers with attention temperature tuning, an L2 QK-norm, and mixtures whose router weights the
experts' input, beside a shared expert.

Semantics: ``transformers/models/llama4/{configuration,modeling}_llama4.py`` (``Llama4TextConfig``,
``Llama4TextAttention``, ``Llama4TextMoe``, ``Llama4TextDecoderLayer``):

* ``no_rope_layers``: one flag per layer, 1 for a RoPE layer, 0 for a NoPE layer (empty or absent: layer ``i`` is
  NoPE iff ``(i + 1) % no_rope_layer_interval == 0``, interval 4); RoPE (base 500000) rotates *interleaved* pairs
  (``torch.view_as_complex`` over adjacent features), the checkpoint's layout too;
* ``layer_types`` (default: ``chunked_attention`` on the RoPE layers when ``attention_chunk_size`` is set, else
  ``full_attention``): a chunked layer's queries see only keys of their own chunk (``attention_chunk_size``);
* ``use_qk_norm``: the RoPE layers' q and k go through a weightless L2 norm (``l2norm``, ``rms_norm_eps``; after the
  rotation in transformers, which a norm-preserving rotation makes the same);
* ``attn_temperature_tuning`` (published configs write ``4``, read as true): the NoPE layers' queries times ``log(floor((p + 1) / floor_scale) + 1) · attn_scale +
  1`` (``temperature_tuning``). transformers takes ``p`` from the cache slot, which counts left padding; modkit takes
  each token's own position, so the two agree on unpadded rows and modkit is unchanged by padding;
* the mixture layers ``moe_layers`` (default: every ``interleave_moe_layer_step``-th layer, from layer
  ``step - 1``): a router without bias keeps the top ``num_experts_per_tok`` logits and scales each chosen expert's
  *input* by its sigmoid (``sigmoid_topk``, not renormalised, ``weight_on: input``); experts and the shared expert
  are SwiGLUs of ``intermediate_size``; the other layers a dense SwiGLU of ``intermediate_size_mlp``;
* on disk the experts are stacked: ``gate_up_proj [n_experts, d_model, 2 d_ff]`` (gate, then up) and
  ``down_proj [n_experts, d_ff, d_model]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from modkit.plugin import json_value

from ._keys import Entry, HeadDim, Ignore, Key, KVHeads, Rope, _read, _types, sizes
from ._weights import Concat, W
from .llama import LLAMA, L

MODEL_TYPE = "llama4_text"

LAYER_KINDS = ("full_attention", "chunked_attention")


def _int_if_whole(value: float):
    """``floor_scale`` as ``Llama4TextConfig`` types it (an int) when it is whole."""
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True)
class Llama4Layers(Entry):
    """Every per-layer choice of Llama 4: NoPE layers, chunked layers, the QK-norm and temperature tuning they imply,
    and the mixture layers (see the module docstring)."""

    SETS = ("positions", "layer_types", "attention_chunk_size", "attention_by_layer", "moe", "moe_layers")

    interval: int = 4
    chunk: int = 8192

    KEYS = (
        "no_rope_layers",
        "no_rope_layer_interval",
        "attention_chunk_size",
        "layer_types",
        "use_qk_norm",
        "attn_temperature_tuning",
        "floor_scale",
        "attn_scale",
        "moe_layers",
        "interleave_moe_layer_step",
    )

    def config_keys(self, name):
        return self.KEYS

    def read(self, r, f, name):
        n = f["n_layers"]
        interval = r.number("no_rope_layer_interval", self.interval, integer=True)
        flags = r.get("no_rope_layers")
        if not flags:  # transformers: an empty list means the default too
            flags = [int((i + 1) % interval != 0) for i in range(n)]
        elif not (
            isinstance(flags, list) and len(flags) >= n and all(v in (0, 1) and not isinstance(v, float) for v in flags)
        ):
            r.error(
                "no_rope_layers", f"must list 1 (RoPE) or 0 (NoPE) for each of the {n} layers, got {json_value(flags)}"
            )
            flags = [1] * n
        chunk = _read(r, "attention_chunk_size", "window", self.chunk, ())
        types = r.get("layer_types")
        if types is None:
            types = ["chunked_attention" if flags[i] and chunk is not None else "full_attention" for i in range(n)]
        types = _types(r, types, n, LAYER_KINDS) or ["full_attention"] * n
        if "chunked_attention" in types and chunk is None:
            r.error(
                "attention_chunk_size",
                "is null, but layer_types has chunked_attention layers; give the chunk or "
                "mark those layers full_attention",
            )
        qk_norm = r.flag("use_qk_norm", True)
        tuning = r.get("attn_temperature_tuning", True)
        if isinstance(tuning, int) and not isinstance(tuning, bool):
            tuning = tuning != 0  # Meta's published configs write 4, which transformers 4.x reads as true
        elif not isinstance(tuning, bool):
            r.error("attn_temperature_tuning", f"must be true or false, got {json_value(tuning)}")
            tuning = True
        floor_scale = r.number("floor_scale", 8192)
        attn_scale = r.number("attn_scale", 0.1, positive=False, minimum=0)
        extras = []
        for i in range(n):
            if flags[i]:
                extras.append({"qk_norm": {"type": "l2norm", "eps": float(f["eps"])}} if qk_norm else {})
            else:
                extras.append(
                    {"temperature_tuning": {"floor_scale": float(floor_scale), "attn_scale": float(attn_scale)}}
                    if tuning
                    else {}
                )
        step = r.number("interleave_moe_layer_step", 1, integer=True)
        moe = r.get("moe_layers")
        if moe is None:
            moe = list(range(step - 1, n, step))
        elif not (isinstance(moe, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in moe)):
            r.error("moe_layers", f"must list layer indices, got {json_value(moe)}")
            moe = []
        elif any(not 0 <= i < n for i in moe):  # transformers would build a model with no mixture there
            bad = sorted({i for i in moe if not 0 <= i < n})
            r.error("moe_layers", f"layers {bad} outside 0..{n - 1} (num_hidden_layers = {n}); list existing layers")
            moe = []
        f["positions"] = [f["position"] if flags[i] else {"type": "none"} for i in range(n)]
        f["layer_types"], f["attention_chunk_size"] = types, chunk
        f["attention_by_layer"] = extras
        f["moe_layers"] = [i in moe for i in range(n)]
        f["moe"] = any(f["moe_layers"])

    def write(self, f, base, name):
        flags = [0 if getattr(p, "type", None) == "none" else 1 for p in f["positions"]]
        atts = f["attentions"]
        qk = [getattr(a, "qk_norm", None) is not None for a in atts]
        tuned = [getattr(a, "temperature_tuning", None) for a in atts]
        tuning = next((t for t in tuned if t is not None), None)
        moe = [i for i, m in enumerate(f["moe_layers"]) if m and f["moe"]]
        chunk = f["attention_chunk_size"]
        return {
            "no_rope_layers": flags,
            "no_rope_layer_interval": base.get("no_rope_layer_interval") or self.interval,
            "attention_chunk_size": chunk if chunk is not None else base.get("attention_chunk_size", self.chunk),
            "layer_types": [
                "chunked_attention" if t == "chunked_attention" else "full_attention" for t in f["layer_types"]
            ],
            "use_qk_norm": any(qk),
            "attn_temperature_tuning": tuning is not None,
            "floor_scale": _int_if_whole(tuning.floor_scale) if tuning is not None else base.get("floor_scale", 8192),
            "attn_scale": tuning.attn_scale if tuning is not None else base.get("attn_scale", 0.1),
            "moe_layers": moe,
            "interleave_moe_layer_step": base.get("interleave_moe_layer_step") or 1,
        }

    def describe(self, name):
        return [
            (
                "`no_rope_layers`, `no_rope_layer_interval`",
                "mapped",
                f"NoPE on every {self.interval}th layer",
                "`positions`: `none` on NoPE layers (overrides)",
            ),
            (
                "`attention_chunk_size`, `layer_types`",
                "mapped",
                f"chunk {self.chunk} on the RoPE layers",
                "`attention_chunk_size` of the chunked layers",
            ),
            ("`use_qk_norm`", "mapped", "`true`", "`l2norm` QK-norm on the RoPE layers"),
            (
                "`attn_temperature_tuning`, `floor_scale`, `attn_scale`",
                "mapped",
                "`true`, `8192`, `0.1`",
                "`temperature_tuning` of the NoPE layers",
            ),
            (
                "`moe_layers`, `interleave_moe_layer_step`",
                "mapped",
                "every layer",
                "`moe_layers`: mixtures there, dense FFNs of intermediate_size_mlp elsewhere",
            ),
        ]


F = "layers.{i}.ffn."

LLAMA4_TEXT = LLAMA.derive(
    MODEL_TYPE,
    architecture="Llama4ForCausalLM",
    notes=__doc__,
    drop=("mlp_bias", "pretraining_tp", "intermediate_size"),
    keys={
        # transformers Llama4TextConfig, key by key
        **sizes(
            vocab_size=202048,
            hidden_size=5120,
            num_hidden_layers=48,
            num_attention_heads=40,
            max_position_embeddings=131072,
        ),
        "num_key_value_heads": KVHeads(8),
        "head_dim": HeadDim(128),
        "rms_norm_eps": Key("eps", 1e-5, kind="number"),
        "rope_theta": Rope(500000.0, layout="interleaved"),
        "num_local_experts": Key("n_experts", 16),
        "num_experts_per_tok": Key("top_k", 1),
        "intermediate_size": Key(("expert_d_ff", "shared_d_ff"), 8192, note="the routed experts and the shared expert"),
        "intermediate_size_mlp": Key("d_ff", 16384, note="the dense layers"),
        "router_aux_loss_coef": Key("aux_loss_coef", 0.001, kind="nonneg"),
        "output_router_logits": Ignore("switches the aux-loss computation on in training", carry=False),
        "router_jitter_noise": Ignore("multiplicative router-input noise, in training only", carry=False),
        "no_rope_layers": Llama4Layers(),
    },
    fixed={"router": "sigmoid_topk", "renormalize": False, "weight_on": "input"},
    tensors=(
        *(W(F + f"{x}.{{p}}", L + f"feed_forward.{x}_proj.{{p}}") for x in ("gate", "up", "down")),
        W(F + "router.proj.weight", L + "feed_forward.router.weight"),
        W((F + "experts.gate", F + "experts.up"), L + "feed_forward.experts.gate_up_proj", Concat(dim=-1)),
        W(F + "experts.down", L + "feed_forward.experts.down_proj"),
        *(
            W(F + f"shared.{x}.weight", L + f"feed_forward.shared_expert.{x}_proj.weight")
            for x in ("gate", "up", "down")
        ),
    ),
    checkpoint_layout="interleaved",
)

TYPE = LLAMA4_TEXT
