"""RoPE in Hugging Face configs: :func:`rope` reads either config form into a ``rope`` position spec,
:func:`rope_fields` writes one back (the 4.x form, which transformers 5 reads as well).

Semantics: ``transformers/modeling_rope_utils.py`` (``RotaryEmbeddingConfigMixin``, ``ROPE_INIT_FUNCTIONS``).
"""

from __future__ import annotations

import math
from typing import Any, Optional

from modkit.plugin import CheckpointError, join_path, json_value

from ._reader import HFConfig, _kind, _short


def rope(
    r: HFConfig,
    *,
    default_theta: float = 10000.0,
    layer_type: Optional[str] = None,
    theta_key: str = "rope_theta",
    scaling_key: Optional[str] = "rope_scaling",
    default_partial: float = 1.0,
    partial_key: str = "partial_rotary_factor",
    default_parameters: Optional[dict] = None,
    layout: str = "half_split",
    original_at_top: bool = False,
    max_seq_len: Optional[int] = None,
) -> dict:
    """The ``rope`` position spec from either config form.

    transformers 5 writes ``rope_parameters`` (``{"rope_type", "rope_theta", "partial_rotary_factor", ...}``, or
    one such dict per layer type); 4.x files have ``rope_theta``, ``rope_scaling`` (``type`` or ``rope_type``)
    and ``partial_rotary_factor`` at the top level. Values inside the dict win over top-level ones, as in
    ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``. Scaling types (``modeling_rope_utils``):

    * ``linear``: ``factor``;
    * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
    * ``dynamic``: ``factor``; the trained length is ``max_position_embeddings`` (as in
      ``_compute_dynamic_ntk_parameters``);
    * ``yarn``: ``factor`` (default ``max_position_embeddings / original_max_position_embeddings``), ``beta_fast``
      (``or 32``), ``beta_slow`` (``or 1``), ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``;
    * ``longrope`` (legacy ``su``): ``short_factor``, ``long_factor``, ``factor``, ``attention_factor``.

    ``original_max_position_embeddings`` comes from the scaling dict, else ``max_position_embeddings``; with
    ``original_at_top`` (Phi-3, whose config class has the key) the top-level key wins, as in
    ``standardize_rope_params``. Other keys of the dict are unknown keys (:meth:`HFConfig.unknown_key`).

    Args:
        layer_type: pick this entry when ``rope_parameters`` is nested per layer type (Gemma 3).
        theta_key: the 4.x top-level key of the base (Gemma 3 local layers: ``rope_local_base_freq``; GPT-NeoX:
            ``rotary_emb_base``).
        partial_key: the 4.x top-level key of the rotated fraction (GPT-NeoX: ``rotary_pct``).
        default_parameters: the ``rope_parameters`` of a config that has neither them nor ``rope_scaling`` (gpt-oss's
            YaRN; the config class's ``__post_init__`` default).
        scaling_key: the 4.x top-level scaling key, or ``None`` when it does not apply to these layers.
        original_at_top: the top-level ``original_max_position_embeddings`` overrides the dict's (Phi-3).
        max_seq_len: the model's ``max_position_embeddings`` (with the config class's default); default the key's
            value in the config.
    """
    params = r.get("rope_parameters")
    legacy = r.get(scaling_key) if scaling_key else None
    if params is None and legacy is None and default_parameters:
        params = dict(default_parameters)
    top_theta = r.number(theta_key)
    top_partial = r.number(partial_key)
    path = "rope_parameters"
    source: Any = None
    for key, value in ((scaling_key, legacy), ("rope_parameters", params)):
        if value is not None and not isinstance(value, dict):  # [] is not "no scaling": it is not an object at all
            r.error(str(key), f"must be an object (or null), got {_kind(value)} {_short(value)}")
    legacy = legacy if isinstance(legacy, dict) else None
    params = params if isinstance(params, dict) else None
    if legacy:
        source, path = legacy, scaling_key
    elif params:
        source = params
        if isinstance(params, dict) and (
            any(isinstance(v, dict) for v in params.values()) or set(params) & {"full_attention", "sliding_attention"}
        ):
            if layer_type is None:
                r.error("rope_parameters", f"per-layer-type RoPE parameters {sorted(params)} are not used by {r.model_type}")
                source = {}
            else:
                source, path = params.get(layer_type) or {}, join_path("rope_parameters", layer_type)
    if source is None:
        source = {}
    if not isinstance(source, dict):
        r.error(path, f"must be an object, got {_kind(source)} {_short(source)}")
        source = {}
    d = dict(source)
    rtype = d.pop("rope_type", None)
    legacy_type = d.pop("type", None)
    rtype = rtype or legacy_type or "default"
    theta = d.pop("rope_theta", None)
    if theta is not None:
        theta = r.check_number(join_path(path, "rope_theta"), theta, default_theta)
    theta = theta if theta is not None else top_theta if top_theta is not None else default_theta
    partial = d.pop("partial_rotary_factor", None)
    if partial is not None:
        partial = r.check_number(join_path(path, "partial_rotary_factor"), partial, default_partial)
    partial = partial if partial is not None else top_partial if top_partial is not None else default_partial
    spec: dict[str, Any] = {"type": "rope", "theta": float(theta)}
    if layout != "half_split":
        spec["layout"] = layout
    if not (isinstance(partial, (int, float)) and not isinstance(partial, bool) and 0 < partial <= 1):
        r.error(join_path(path, "partial_rotary_factor"), f"must lie in (0, 1], got {json_value(partial)}")
    elif partial != 1:
        spec["partial_rotary"] = float(partial)
    if not isinstance(rtype, str):
        r.error(join_path(path, "rope_type" if "rope_type" in source else "type"), f"must be a string naming the RoPE scaling, got {_kind(rtype)} {_short(rtype)}")
        rtype, d = "default", {}
    max_pos = max_seq_len if max_seq_len is not None else r.cfg.get("max_position_embeddings")

    def number(key: str, what: str, *, required: bool = False, positive: bool = True, default: Any = None) -> Any:
        value = d.pop(key, None)
        if value is None:
            if required:
                r.error(join_path(path, key), f"required by {what}")
            return default
        value = r.check_number(join_path(path, key), value, None, positive=positive)
        return default if value is None else float(value)

    def original() -> Optional[int]:
        inside = d.pop("original_max_position_embeddings", None)
        top = r.get("original_max_position_embeddings") if original_at_top else None
        value = top if top is not None else inside if inside is not None else max_pos
        where = (
            "original_max_position_embeddings" if top is not None
            else join_path(path, "original_max_position_embeddings") if inside is not None
            else "max_position_embeddings"
        )
        if value is None:
            r.error(where, "must be a positive integer, got null")
            return None
        return r.check_number(where, value, None, integer=True)

    what = f"{rtype} RoPE scaling"
    if rtype == "default":
        pass
    elif rtype == "linear":
        factor = number("factor", what, required=True)
        if factor is not None:
            spec["scaling"] = {"type": "linear", "factor": factor}
    elif rtype == "llama3":
        scaling: dict[str, Any] = {"type": "llama3"}
        for key in ("factor", "low_freq_factor", "high_freq_factor"):
            scaling[key] = number(key, what, required=True)
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        if low is not None and high is not None and high <= low:
            r.error(join_path(path, "high_freq_factor"), f"= {high} must exceed low_freq_factor = {low}")
        scaling["original_max_seq_len"] = original()
        spec["scaling"] = scaling
    elif rtype == "dynamic":
        factor = number("factor", what, required=True)
        if max_seq_len is None and max_pos is not None:
            max_pos = r.check_number("max_position_embeddings", max_pos, None, integer=True)
        spec["scaling"] = {"type": "dynamic", "factor": factor, "original_max_seq_len": max_pos}
    elif rtype == "yarn":
        omax = original()
        factor = number("factor", what)
        if factor is None and omax and isinstance(max_pos, int) and not isinstance(max_pos, bool):
            factor = max_pos / omax  # transformers: the ratio of the two lengths when factor is not given
        scaling = {"type": "yarn", "factor": factor, "original_max_seq_len": omax}
        # transformers reads these with `or` defaults: 0 and null mean the default too
        scaling["beta_fast"] = number("beta_fast", what, positive=False) or 32.0
        scaling["beta_slow"] = number("beta_slow", what, positive=False) or 1.0
        for key in ("mscale", "mscale_all_dim"):
            value = number(key, what, positive=False)
            if value is not None:
                scaling[key] = value
        af = number("attention_factor", what)
        if af is not None:
            scaling["attention_factor"] = af
        truncate = d.pop("truncate", None)
        if truncate is not None and not isinstance(truncate, bool):
            r.error(join_path(path, "truncate"), f"must be true or false, got {_kind(truncate)} {_short(truncate)}")
        elif truncate is False:
            scaling["truncate"] = False
        spec["scaling"] = scaling
    elif rtype in ("longrope", "su"):  # 'su' is the name of LongRoPE in Phi-3's first configs
        scaling = {"type": "longrope"}
        for key in ("short_factor", "long_factor"):
            value = d.pop(key, None)
            ok = isinstance(value, list) and value and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 2**63 for v in value
            )
            if not ok:
                shown = _short(value) or (f"{_kind(value)} of {len(value)}" if isinstance(value, (list, dict)) else _kind(value))
                r.error(join_path(path, key), f"LongRoPE needs a non-empty list of positive finite numbers, got {shown}")
            scaling[key] = [float(v) for v in value] if ok else [1.0]
        scaling["original_max_seq_len"] = original()
        for key in ("factor", "attention_factor"):
            value = number(key, what)
            if value is not None:
                scaling[key] = value
        spec["scaling"] = scaling
    else:
        key = "rope_type" if "rope_type" in source else "type"
        r.error(
            join_path(path, key),
            f"unsupported RoPE scaling {rtype!r}; modkit's rope supports 'default', 'linear', 'llama3', 'dynamic', "
            "'yarn' and 'longrope' ('su')",
        )
        d.clear()
    for key, value in d.items():
        r.unknown_key(join_path(path, key), value)
    return spec


def rope_fields(
    position,
    *,
    theta_key: str = "rope_theta",
    scaling_key: Optional[str] = "rope_scaling",
    always_partial: bool = False,
    partial_key: str = "partial_rotary_factor",
    original_at_top: bool = False,
) -> dict:
    """A ``rope`` position spec as 4.x-style config keys (read by transformers 4.x and 5.x alike).

    ``always_partial``: write the rotated fraction even when it is 1 (Phi's default is 0.5); ``theta_key`` and
    ``partial_key`` name the base and the fraction (GPT-NeoX: ``rotary_emb_base``, ``rotary_pct``).
    ``original_at_top``: also write LongRoPE's/YaRN's trained length as the top-level
    ``original_max_position_embeddings`` (Phi-3, whose config class reads it there first).
    """
    if position.type != "rope":
        return {}
    out: dict[str, Any] = {theta_key: position.theta}
    if position.partial_rotary != 1.0 or always_partial:
        out[partial_key] = position.partial_rotary
    sc = position.scaling
    if scaling_key is None:
        return out
    if sc is None:
        out[scaling_key] = None
        return out
    if sc.type == "linear":
        d: dict[str, Any] = {"rope_type": "linear", "factor": sc.factor}
    elif sc.type == "llama3":
        d = {"rope_type": "llama3", "factor": sc.factor, "low_freq_factor": sc.low_freq_factor,
             "high_freq_factor": sc.high_freq_factor, "original_max_position_embeddings": sc.original_max_seq_len}
    elif sc.type == "dynamic":  # its trained length is max_position_embeddings, checked by the reverse conversion
        d = {"rope_type": "dynamic", "factor": sc.factor}
    elif sc.type == "yarn":
        d = {"rope_type": "yarn", "factor": sc.factor, "original_max_position_embeddings": sc.original_max_seq_len,
             "beta_fast": sc.beta_fast, "beta_slow": sc.beta_slow}
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
        if not sc.truncate:
            d["truncate"] = False
    elif sc.type == "longrope":
        d = {"rope_type": "longrope", "short_factor": list(sc.short_factor), "long_factor": list(sc.long_factor),
             "original_max_position_embeddings": sc.original_max_seq_len}
        for key in ("factor", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
    else:
        raise CheckpointError(f"RoPE scaling {sc.type!r} has no Hugging Face form")
    out[scaling_key] = d
    if original_at_top and "original_max_position_embeddings" in d:
        out["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return out
