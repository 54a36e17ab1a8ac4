"""RoPE in Hugging Face configs: :func:`rope` reads either config form into a ``rope`` position spec,
:func:`rope_fields` writes one back (the 4.x form, which transformers 5 reads as well).

Semantics: ``transformers/modeling_rope_utils.py`` (``RotaryEmbeddingConfigMixin``, ``ROPE_INIT_FUNCTIONS``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from modkit.plugin import CheckpointError, join_path, json_value

from ._reader import HFConfig, _kind, _short


# size: 11 parameters: each a config key or default that some model type overrides; callers name only theirs
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
    ntk_alpha: bool = False,
) -> dict:
    """The ``rope`` position spec from either config form.

    transformers 5 writes ``rope_parameters`` (``{"rope_type", "rope_theta", "partial_rotary_factor", ...}``, or
    one such dict per layer type); 4.x files have ``rope_theta``, ``rope_scaling`` (``type`` or ``rope_type``)
    and ``partial_rotary_factor`` at the top level. Values inside the dict win over top-level ones, as in
    ``RotaryEmbeddingConfigMixin.convert_rope_params_to_dict``. Scaling types (``modeling_rope_utils``):

    * ``linear``: ``factor``;
    * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``;
    * ``dynamic``: ``factor``; the trained length is ``max_position_embeddings`` (as in
      ``_compute_dynamic_ntk_parameters``); with ``ntk_alpha`` (Hunyuan) a dict holding ``alpha`` is the static
      NTK-alpha base instead (``ntk_alpha`` scaling; its ``factor`` is then unused);
    * ``yarn``: ``factor`` (default ``max_position_embeddings / original_max_position_embeddings``), ``beta_fast``
      (``or 32``), ``beta_slow`` (``or 1``), ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``;
    * ``longrope`` (legacy ``su``): ``short_factor``, ``long_factor``, ``factor``, ``attention_factor``;
    * ``proportional`` (Gemma 4, LFM3): ``partial_mode: proportional`` (the partial fraction's pairs spread over the
      whole head, ``_compute_proportional_rope_parameters``), its ``factor`` (default 1) a linear scaling.

    ``original_max_position_embeddings`` comes from the scaling dict, else ``max_position_embeddings``; with
    ``original_at_top`` (Phi-3, whose config class has the key) the top-level key wins, as in
    ``standardize_rope_params``. Other keys of the dict are unknown keys (:meth:`HFConfig.unknown_key`).

    Problems are recorded on ``r`` (:meth:`HFConfig.error`, one per key, naming its path), never raised here: a bad
    value gives the default in its place so that every problem of the config is reported at once.

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
        ntk_alpha: ``dynamic`` with ``alpha`` means NTK-alpha (transformers ``HunYuanDenseV1RotaryEmbedding``).

    Returns:
        ``{"type": "rope", "theta": ..., ["layout"], ["partial_rotary"], ["scaling": {...}]}``; ``theta`` is the
        base of the rotation frequencies, ``original_max_seq_len`` a length in tokens.
    """
    params = r.get("rope_parameters")
    legacy = r.get(scaling_key) if scaling_key else None
    if params is None and legacy is None and default_parameters:
        params = dict(default_parameters)
    top_theta = r.number(theta_key)
    top_partial = r.number(partial_key)
    source, path = _source(r, params, legacy, scaling_key, layer_type)
    d = dict(source)
    rtype = d.pop("rope_type", None)
    legacy_type = d.pop("type", None)
    rtype = rtype or legacy_type or "default"
    spec = _base_spec(r, d, path, layout, (top_theta, default_theta), (top_partial, default_partial))
    if not isinstance(rtype, str):
        r.error(
            join_path(path, "rope_type" if "rope_type" in source else "type"),
            f"must be a string naming the RoPE scaling, got {_kind(rtype)} {_short(rtype)}",
        )
        rtype, d = "default", {}
    if rtype == "proportional":  # partial rotation over the whole head; its factor divides the frequencies
        spec["partial_mode"] = "proportional"
        rtype = "linear" if d.get("factor", 1.0) != 1.0 else "default"
        if rtype == "default":
            d.pop("factor", None)
    max_pos = max_seq_len if max_seq_len is not None else r.cfg.get("max_position_embeddings")
    reader = _Scaling(r, d, path, max_pos, original_at_top)
    if ntk_alpha and rtype == "dynamic" and "alpha" in d:
        scaling = _ntk_alpha(reader, "dynamic RoPE scaling with alpha", max_seq_len)
        for key, value in d.items():
            r.unknown_key(join_path(path, key), value)
    else:
        scaling = _read_scaling(reader, rtype, source, max_seq_len)
    if scaling is not None:
        spec["scaling"] = scaling
    return spec


def _base_spec(r: HFConfig, d: dict, path: Optional[str], layout: str, theta: tuple, partial: tuple) -> dict:
    """``{"type": "rope", "theta", ["layout"], ["partial_rotary"]}`` from the dict ``d`` (at ``path``; its
    ``rope_theta`` and ``partial_rotary_factor`` are taken out) or the top level: ``theta`` and ``partial`` are
    ``(the top-level value or None, the default)``. A fraction outside (0, 1] is an error on ``r``."""
    (top_theta, default_theta), (top_partial, default_partial) = theta, partial
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
    return spec


def _read_scaling(s: "_Scaling", rtype: str, source: dict, max_seq_len: Optional[int]) -> Optional[dict]:
    """The ``scaling`` of a ``rope`` spec for scaling type ``rtype`` (None for ``default``); an unsupported type is
    an error on ``s.r`` naming the supported ones. The keys of the dict left unread are unknown keys."""
    scaling = None
    if rtype in _SCALINGS:
        scaling = _SCALINGS[rtype](s, f"{rtype} RoPE scaling", max_seq_len)
    elif rtype != "default":
        key = "rope_type" if "rope_type" in source else "type"
        s.r.error(
            join_path(s.path, key),
            f"unsupported RoPE scaling {rtype!r}; modkit's rope supports 'default', 'linear', 'llama3', 'dynamic', "
            "'yarn', 'longrope' ('su') and 'proportional'",
        )
        s.d.clear()
    for key, value in s.d.items():
        s.r.unknown_key(join_path(s.path, key), value)
    return scaling


def _source(
    r: HFConfig, params: Any, legacy: Any, scaling_key: Optional[str], layer_type: Optional[str]
) -> tuple[dict, Optional[str]]:
    """The dict of RoPE parameters to read and its path in the config: the 4.x scaling dict ``legacy`` when given,
    else ``rope_parameters`` (the entry of ``layer_type`` when nested per layer type), else ``{}``. A value that is
    not an object is an error on ``r`` and reads as ``{}``."""
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
        if any(isinstance(v, dict) for v in params.values()) or set(params) & {"full_attention", "sliding_attention"}:
            if layer_type is None:
                r.error(
                    "rope_parameters", f"per-layer-type RoPE parameters {sorted(params)} are not used by {r.model_type}"
                )
                source = {}
            else:
                source, path = params.get(layer_type) or {}, join_path("rope_parameters", layer_type)
    if source is None:
        source = {}
    if not isinstance(source, dict):
        r.error(path, f"must be an object, got {_kind(source)} {_short(source)}")
        source = {}
    return source, path


class _Scaling:
    """The keys of one scaling dict ``d`` (at ``path`` in the config) as its reader takes them out; what is left in
    ``d`` afterwards is unknown. ``max_pos``: the model's trained length in tokens (``max_position_embeddings``)."""

    def __init__(self, r: HFConfig, d: dict, path: Optional[str], max_pos: Any, original_at_top: bool):
        self.r, self.d, self.path, self.max_pos, self.original_at_top = r, d, path, max_pos, original_at_top

    def number(self, key: str, what: str, *, required: bool = False, positive: bool = True, default: Any = None) -> Any:
        """``d[key]`` as a float (taken out of ``d``), ``default`` when absent or invalid (an error on ``r`` then,
        and when ``required`` and absent: "required by ``what``")."""
        value = self.d.pop(key, None)
        if value is None:
            if required:
                self.r.error(join_path(self.path, key), f"required by {what}")
            return default
        value = self.r.check_number(join_path(self.path, key), value, None, positive=positive)
        return default if value is None else float(value)

    def original(self) -> Optional[int]:
        """The trained length in tokens (``original_max_position_embeddings``): the top-level key with
        ``original_at_top``, else the dict's, else ``max_position_embeddings``; None (an error) when none is set."""
        r = self.r
        inside = self.d.pop("original_max_position_embeddings", None)
        top = r.get("original_max_position_embeddings") if self.original_at_top else None
        value = top if top is not None else inside if inside is not None else self.max_pos
        where = (
            "original_max_position_embeddings"
            if top is not None
            else join_path(self.path, "original_max_position_embeddings")
            if inside is not None
            else "max_position_embeddings"
        )
        if value is None:
            r.error(where, "must be a positive integer, got null")
            return None
        return r.check_number(where, value, None, integer=True)

    def optional(self, scaling: dict, keys: tuple[str, ...], what: str) -> None:
        """Copy the numbers among ``keys`` that are present into ``scaling``."""
        for key in keys:
            value = self.number(key, what, positive=key not in ("mscale", "mscale_all_dim"))
            if value is not None:
                scaling[key] = value


def _linear(s: _Scaling, what: str, max_seq_len: Optional[int]) -> Optional[dict]:
    """``linear``: positions divided by ``factor``."""
    factor = s.number("factor", what, required=True)
    return {"type": "linear", "factor": factor} if factor is not None else None


def _llama3(s: _Scaling, what: str, max_seq_len: Optional[int]) -> dict:
    """``llama3``: ``factor``, ``low_freq_factor`` < ``high_freq_factor``, and the trained length."""
    scaling: dict[str, Any] = {"type": "llama3"}
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        scaling[key] = s.number(key, what, required=True)
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    if low is not None and high is not None and high <= low:
        s.r.error(join_path(s.path, "high_freq_factor"), f"= {high} must exceed low_freq_factor = {low}")
    scaling["original_max_seq_len"] = s.original()
    return scaling


def _dynamic(s: _Scaling, what: str, max_seq_len: Optional[int]) -> dict:
    """``dynamic`` (NTK): ``factor``; the trained length is ``max_position_embeddings``."""
    factor = s.number("factor", what, required=True)
    max_pos = s.max_pos
    if max_seq_len is None and max_pos is not None:
        max_pos = s.r.check_number("max_position_embeddings", max_pos, None, integer=True)
    return {"type": "dynamic", "factor": factor, "original_max_seq_len": max_pos}


def _ntk_alpha(s: _Scaling, what: str, max_seq_len: Optional[int]) -> Optional[dict]:
    """``dynamic`` with ``alpha`` (Hunyuan): the static base ``theta · alpha ** (d / (d - 2))``; the ``factor``
    transformers' validation requires is read and unused (its rotary embedding ignores it)."""
    alpha = s.number("alpha", what, required=True)
    s.number("factor", what)
    return {"type": "ntk_alpha", "alpha": alpha} if alpha is not None else None


def _yarn(s: _Scaling, what: str, max_seq_len: Optional[int]) -> dict:
    """``yarn``: ``factor`` (default: the ratio of the two lengths), ``beta_fast``, ``beta_slow``, and optionally
    ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``."""
    omax = s.original()
    factor = s.number("factor", what)
    max_pos = s.max_pos
    if factor is None and omax and isinstance(max_pos, int) and not isinstance(max_pos, bool):
        factor = max_pos / omax  # transformers: the ratio of the two lengths when factor is not given
    scaling = {"type": "yarn", "factor": factor, "original_max_seq_len": omax}
    # transformers reads these with `or` defaults: 0 and null mean the default too
    scaling["beta_fast"] = s.number("beta_fast", what, positive=False) or 32.0
    scaling["beta_slow"] = s.number("beta_slow", what, positive=False) or 1.0
    s.optional(scaling, ("mscale", "mscale_all_dim", "attention_factor"), what)
    truncate = s.d.pop("truncate", None)
    if truncate is not None and not isinstance(truncate, bool):
        s.r.error(join_path(s.path, "truncate"), f"must be true or false, got {_kind(truncate)} {_short(truncate)}")
    elif truncate is False:
        scaling["truncate"] = False
    return scaling


def _longrope(s: _Scaling, what: str, max_seq_len: Optional[int]) -> dict:
    """``longrope`` (``su`` in Phi-3's first configs): ``short_factor`` and ``long_factor`` (non-empty lists of
    positive finite numbers), the trained length, and optionally ``factor``, ``attention_factor``."""
    scaling: dict[str, Any] = {"type": "longrope"}
    for key in ("short_factor", "long_factor"):
        value = s.d.pop(key, None)
        ok = (
            isinstance(value, list)
            and value
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0 < v <= 2**63
                for v in value
            )
        )
        if not ok:
            shown = _short(value) or (
                f"{_kind(value)} of {len(value)}" if isinstance(value, (list, dict)) else _kind(value)
            )
            s.r.error(
                join_path(s.path, key), f"LongRoPE needs a non-empty list of positive finite numbers, got {shown}"
            )
        scaling[key] = [float(v) for v in value] if ok else [1.0]
    scaling["original_max_seq_len"] = s.original()
    s.optional(scaling, ("factor", "attention_factor"), what)
    return scaling


#: the reader of each RoPE scaling type (``rope_type``, or ``type`` in 4.x files); 'su' is LongRoPE's first name
_SCALINGS: dict[str, Callable[[_Scaling, str, Optional[int]], Optional[dict]]] = {
    "linear": _linear,
    "llama3": _llama3,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "longrope": _longrope,
    "su": _longrope,
}


def rope_fields(
    position,
    *,
    theta_key: str = "rope_theta",
    scaling_key: Optional[str] = "rope_scaling",
    always_partial: bool = False,
    partial_key: str = "partial_rotary_factor",
    original_at_top: bool = False,
) -> dict:
    """A ``rope`` position spec as 4.x-style config keys (read by transformers 4.x and 5.x alike); ``partial_mode:
    proportional`` is ``rope_type: proportional`` (with the linear scaling's ``factor``).

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
    if getattr(position, "partial_mode", "leading") == "proportional":  # its factor: the linear scaling's
        out[scaling_key] = {"rope_type": "proportional", **({"factor": sc.factor} if sc is not None else {})}
        return out
    if sc is None:
        out[scaling_key] = None
        return out
    if sc.type == "linear":
        d: dict[str, Any] = {"rope_type": "linear", "factor": sc.factor}
    elif sc.type == "llama3":
        d = {
            "rope_type": "llama3",
            "factor": sc.factor,
            "low_freq_factor": sc.low_freq_factor,
            "high_freq_factor": sc.high_freq_factor,
            "original_max_position_embeddings": sc.original_max_seq_len,
        }
    elif sc.type == "dynamic":  # its trained length is max_position_embeddings, checked by the reverse conversion
        d = {"rope_type": "dynamic", "factor": sc.factor}
    elif sc.type == "ntk_alpha":  # Hunyuan's form: dynamic with a fixed alpha (factor 1 for the validation)
        d = {"rope_type": "dynamic", "alpha": sc.alpha, "factor": 1.0}
    elif sc.type == "yarn":
        d = {
            "rope_type": "yarn",
            "factor": sc.factor,
            "original_max_position_embeddings": sc.original_max_seq_len,
            "beta_fast": sc.beta_fast,
            "beta_slow": sc.beta_slow,
        }
        for key in ("mscale", "mscale_all_dim", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
        if not sc.truncate:
            d["truncate"] = False
    elif sc.type == "longrope":
        d = {
            "rope_type": "longrope",
            "short_factor": list(sc.short_factor),
            "long_factor": list(sc.long_factor),
            "original_max_position_embeddings": sc.original_max_seq_len,
        }
        for key in ("factor", "attention_factor"):
            if getattr(sc, key) is not None:
                d[key] = getattr(sc, key)
    else:
        raise CheckpointError(
            f"position.scaling.type = {sc.type!r} has no Hugging Face form: a Hugging Face config holds linear, "
            "llama3, dynamic, ntk_alpha, yarn or longrope scaling; use one of them, or keep the spec in modkit's own "
            "format (modkit.save)"
        )
    out[scaling_key] = d
    if original_at_top and "original_max_position_embeddings" in d:
        out["original_max_position_embeddings"] = d["original_max_position_embeddings"]
    return out
