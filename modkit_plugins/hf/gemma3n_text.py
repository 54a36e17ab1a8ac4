"""Hugging Face ``gemma3n_text`` → modkit: Gemma 3's local/global sandwich blocks on an AltUp residual stream, with
LAuReL residuals, per-layer embeddings, activation sparsity and key/value sharing on the last layers.

Semantics: ``transformers/models/gemma3n/{configuration,modeling}_gemma3n.py`` (``Gemma3nTextConfig``,
``Gemma3nForCausalLM``):

* plain RMSNorm ``x / rms(x) · weight`` in float32 (not Gemma's ``1 + weight``), every norm with ``rms_norm_eps``;
  a per-head QK-norm with a gain and a value norm without one (``v_norm_eps``); scores scaled by 1
  (``softmax_scale``);
* ``sandwich`` blocks with a LAuReL residual of rank ``laurel_rank`` around the attention (``laurel_rank`` of the
  placement, :class:`modkit_plugins.placement.Laurel`);
* the ``altup`` residual stream (:mod:`modkit_plugins.altup`): ``altup_num_inputs`` copies, ``altup_active_idx``,
  ``altup_coef_clip``, ``altup_correct_scale``, and the per-layer embeddings ``hidden_size_per_layer_input`` /
  ``vocab_size_per_layer_input``; the per-layer gate uses ``hidden_activation``;
* GeGLU MLP of width ``intermediate_size[i]`` (a list, one per layer, or one number) with the Gaussian top-k
  ``activation_sparsity_pattern[i]`` on its gate (``activation_sparsity``; by default 0.95 on the first 10 layers
  of a model deeper than 10);
* ``num_kv_shared_layers``: the last layers read the keys and values of the last earlier layer of their type
  (spec ``kv_sharing``, one entry per layer type) and have no key/value projections;
* local/global layers from ``layer_types`` (default: every 5th layer global) with ``sliding_window`` and RoPE per
  layer type (``rope_parameters``; defaults 10,000 local and 1,000,000 global); final logits soft-capped by
  ``final_logit_softcapping`` (default 30); token embeddings scaled by ``sqrt(hidden_size)``, head tied by default.
"""

from __future__ import annotations

from typing import Any, Mapping

from ._builders import per_layer_slots
from ._keys import LayerTypes, Own
from ._reader import HFConfig
from ._spec import assemble, dense_ffn
from ._type import HFType
from ._weights import W
from .gemma3_text import GEMMA3_TEXT

MODEL_TYPE = "gemma3n_text"

#: transformers Gemma3nTextConfig's defaults of the keys the type reads itself
OWN_DEFAULTS = {
    "intermediate_size": 16_384,
    "vocab_size_per_layer_input": 262_144,
    "hidden_size_per_layer_input": 256,
    "altup_active_idx": 0,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    "altup_num_inputs": 4,
    "num_kv_shared_layers": 15,
    "laurel_rank": 64,
    "activation_sparsity_pattern": None,
}

#: the integer keys of :data:`OWN_DEFAULTS`, read with :meth:`HFConfig.number`; those that must be above 0
INTEGER_KEYS = (
    "vocab_size_per_layer_input",
    "hidden_size_per_layer_input",
    "altup_active_idx",
    "altup_num_inputs",
    "num_kv_shared_layers",
    "laurel_rank",
)
POSITIVE_KEYS = ("vocab_size_per_layer_input", "hidden_size_per_layer_input", "altup_num_inputs", "laurel_rank")

S = "model.layers.{i}."
TENSORS = (
    W("stream.layer_embed.weight", "model.embed_tokens_per_layer.weight"),
    W("stream.layer_proj.weight", "model.per_layer_model_projection.weight"),
    W("stream.layer_proj_norm.weight", "model.per_layer_projection_norm.weight"),
    W("stream.enter_proj.{j}.weight", "model.altup_projections.{j}.weight"),
    W("stream.exit_proj.{j}.weight", "model.altup_unembed_projections.{j}.weight"),
    W("layers.{i}.stream_link.output_scale", S + "altup.correct_output_scale"),
    W("layers.{i}.stream_link.correct.weight", S + "altup.correction_coefs.weight"),
    W("layers.{i}.stream_link.predict.weight", S + "altup.prediction_coefs.weight"),
    W("layers.{i}.stream_link.router.weight", S + "altup.modality_router.weight"),
    W("layers.{i}.stream_link.router_norm.weight", S + "altup.router_norm.weight"),
    W("layers.{i}.stream_link.layer_gate.weight", S + "per_layer_input_gate.weight"),
    W("layers.{i}.stream_link.layer_proj.weight", S + "per_layer_projection.weight"),
    W("layers.{i}.stream_link.layer_norm.weight", S + "post_per_layer_input_norm.weight"),
    W("layers.{i}.laurel.left.weight", S + "laurel.linear_left.weight"),
    W("layers.{i}.laurel.right.weight", S + "laurel.linear_right.weight"),
    W("layers.{i}.laurel.norm.weight", S + "laurel.post_laurel_norm.weight"),
)


def _per_layer(r: HFConfig, key: str, value: Any, n: int, kind: type) -> list:
    """``value`` as one entry per layer: a number repeated, or a list of ``n`` (else an error naming the key)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            r.error(key, f"has {len(value)} entries {list(value)[:4]}...; give one number per layer ({n})")
            return [kind(value[0]) if value else kind(0)] * n
        return [kind(v) for v in value]
    return [kind(value)] * n


def read_gemma3n(r: HFConfig, f: dict) -> None:
    """Read the keys of :data:`OWN_DEFAULTS` into ``f["gemma3n"]`` (the stream, LAuReL, widths, sparsity, sharing)
    and give every attention the value norm."""
    n = f["n_layers"]
    own = {key: r.get(key, default) for key, default in OWN_DEFAULTS.items()}
    for key in INTEGER_KEYS:  # checked, so a wrong type is an error naming the key (not int()'s raw message)
        own[key] = r.number(key, OWN_DEFAULTS[key], integer=True, positive=key in POSITIVE_KEYS, minimum=0)
    own["altup_coef_clip"] = r.number("altup_coef_clip", OWN_DEFAULTS["altup_coef_clip"])
    own["altup_correct_scale"] = r.flag("altup_correct_scale", OWN_DEFAULTS["altup_correct_scale"])
    if "altup_coef_clip" in r and r.cfg["altup_coef_clip"] is None:  # a present null: no clip (not the default)
        own["altup_coef_clip"] = None
    sparsity = own["activation_sparsity_pattern"]
    if sparsity is None:  # Gemma3nTextConfig.__post_init__: 0.95 on the first 10 layers of a model deeper than 10
        sparsity = [0.95] * (10 if n > 10 else 0) + [0.0] * (n - (10 if n > 10 else 0))
    own["d_ff"] = _per_layer(r, "intermediate_size", own["intermediate_size"], n, int)
    own["sparsity"] = _per_layer(r, "activation_sparsity_pattern", sparsity, n, float)
    shared = int(own["num_kv_shared_layers"])
    if not 0 <= shared < n:
        r.error("num_kv_shared_layers", f"= {shared}; it must be at least 0 and below num_hidden_layers ({n})")
        shared = 0
    own["shared"] = shared
    f["d_ff"] = own["d_ff"][0]
    f["attention_by_layer"] = [{"v_norm_eps": f["eps"]}] * n
    f["gemma3n"] = own


def _kv_sharing(r: HFConfig, types: list[str], shared: int) -> list[dict]:
    """``kv_sharing`` of the last ``shared`` layers: each reads the last earlier layer of its type
    (``Gemma3nTextConfig.kv_sharing_modes``); an error when a type has no such layer."""
    first = len(types) - shared
    out = []
    for t in sorted(set(types[first:])):
        sources = [i for i in range(first) if types[i] == t]
        if not sources:
            r.error("num_kv_shared_layers", f"= {shared} leaves no earlier {t} layer for the {t} layers to read")
            continue
        out.append({"layers": [i for i in range(first, len(types)) if types[i] == t], "source": sources[-1]})
    return out


def gemma3n_parts(r: HFConfig, f: Mapping[str, Any], spec: dict) -> dict:
    """The assembled Gemma 3 style ``spec`` with Gemma 3n's parts: the ``altup`` stream, LAuReL in the placement,
    one FFN per layer (width and sparsity) as overrides, and ``kv_sharing``."""
    own, n = f["gemma3n"], f["n_layers"]
    spec["stream"] = {
        "type": "altup",
        "n_streams": int(own["altup_num_inputs"]),
        "active": int(own["altup_active_idx"]),
        "coef_clip": None if own["altup_coef_clip"] is None else float(own["altup_coef_clip"]),
        "correct_scale": bool(own["altup_correct_scale"]),
        "layer_input_width": int(own["hidden_size_per_layer_input"]),
        "layer_input_vocab": int(own["vocab_size_per_layer_input"]),
        "activation": f["act"],
        "eps": float(f["eps"]),
    }
    for part in [spec["block"]] + spec.get("overrides", []):
        if part.get("placement") is not None:
            part["placement"] = {**part["placement"], "laurel_rank": int(own["laurel_rank"])}
    ffns = []
    for width, sparsity in zip(own["d_ff"], own["sparsity"]):
        ffn = dense_ffn(f, d_ff=width)
        ffns.append({**ffn, "activation_sparsity": sparsity} if sparsity else ffn)
    default, overrides = per_layer_slots([{"ffn": x} for x in ffns], n)
    spec["block"]["ffn"] = default["ffn"]
    if overrides:
        spec["overrides"] = spec.get("overrides", []) + overrides
    if own["shared"]:
        spec["kv_sharing"] = _kv_sharing(r, f["layer_types"] or ["full_attention"] * n, own["shared"])
    return spec


def write_gemma3n(spec) -> dict:
    """The config keys of :data:`OWN_DEFAULTS` for a validated ``spec``."""
    stream = spec.stream
    layers = [spec.layer(i) for i in range(spec.n_layers)]
    shared = sum(len(s.indices(spec.n_layers)) for s in spec.kv_sharing)
    return {
        "intermediate_size": [x.ffn.d_ff for x in layers],
        "activation_sparsity_pattern": [float(getattr(x.ffn, "activation_sparsity", 0.0)) for x in layers],
        "vocab_size_per_layer_input": stream.layer_input_vocab or spec.vocab_size,
        "hidden_size_per_layer_input": stream.layer_input_width,
        "altup_active_idx": stream.active,
        "altup_coef_clip": stream.coef_clip,
        "altup_correct_scale": stream.correct_scale,
        "altup_num_inputs": stream.n_streams,
        "num_kv_shared_layers": shared,
        "laurel_rank": layers[0].placement.laurel_rank,
    }


class Gemma3nType(HFType):
    """:class:`HFType` whose conversions add Gemma 3n's parts (:func:`gemma3n_parts`, :func:`write_gemma3n`) to the
    tables' Gemma 3 description: the stream, sharing and per-layer FFNs are outside the table's fields."""

    def convert(self, cfg: dict) -> dict:
        """Hugging Face config → modkit spec dict (as :meth:`HFType.convert`, then :func:`gemma3n_parts`)."""
        r = HFConfig(cfg, self.model_type)
        f = self.fields(r)
        return r.finish(gemma3n_parts(r, f, assemble(r, f)))

    def to_config(self, spec, base: Mapping[str, Any]) -> dict:
        """The architecture keys of the config for ``spec``: the tables' keys, then :func:`write_gemma3n`'s."""
        cfg = super().to_config(spec, base)
        cfg.update(write_gemma3n(spec))
        return cfg


_BASE = GEMMA3_TEXT.derive(
    MODEL_TYPE,
    architecture="Gemma3nForCausalLM",
    notes=__doc__,
    drop=("query_pre_attn_scalar", "attn_logit_softcapping", "intermediate_size", "use_bidirectional_attention"),
    # transformers Gemma3nTextConfig defaults
    defaults={
        "vocab_size": 262_400,
        "hidden_size": 2048,
        "num_hidden_layers": 35,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32_768,
        "final_logit_softcapping": 30.0,
    },
    keys={
        "layer_types": LayerTypes(512, pattern=5),
        "intermediate_size": Own(
            tuple(OWN_DEFAULTS),
            "Gemma 3n's own keys: the AltUp stream, LAuReL, per-layer "
            "widths and sparsity, key/value sharing (read_gemma3n)",
        ),
    },
    fixed={"unit_offset": False, "softmax_scale": 1.0},
    tensors=TENSORS,
    read_own=read_gemma3n,
)

GEMMA3N_TEXT = Gemma3nType(**{k: getattr(_BASE, k) for k in _BASE.__dataclass_fields__})

TYPE = GEMMA3N_TEXT
