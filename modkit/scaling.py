"""Sizes of a spec: the same design at another width or depth (what ``modkit compare --widths/--depths`` and
``modkit coordcheck`` train).

Widening sets ``d_model`` and scales every component field named in :data:`WIDTH_FIELDS` (a convention on field
names, as the training config's ``aux_loss_coef`` is: the core names no component) by the same ratio, rounded to the
nearest integer; head counts stay, so a derived ``head_dim`` grows with ``d_model`` (the μP setting of Yang et al.
2022, arXiv:2203.03466, §J: width = ``d_model`` and ``d_ff`` together, heads fixed). A spec in μP keeps its
``base_d_model``. Deepening sets ``n_layers``.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from .errors import ModkitError

#: component fields that are hidden widths and scale with ``d_model`` (a field of any component with this name)
WIDTH_FIELDS = ("d_ff", "head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


class ScalingError(ModkitError, ValueError):
    """A size that the spec cannot take (the message names the spec, the size and the field)."""


def _scale_fields(node: Any, ratio: float) -> Any:
    if isinstance(node, list):
        return [_scale_fields(v, ratio) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in WIDTH_FIELDS and isinstance(v, int) and not isinstance(v, bool):
            out[k] = max(1, int(round(v * ratio)))
        else:
            out[k] = _scale_fields(v, ratio)
    return out


def resize(spec: dict, *, d_model: Optional[int] = None, n_layers: Optional[int] = None, name: Optional[str] = None) -> dict:
    """A copy of the spec dict at ``d_model`` and/or ``n_layers`` (see the module docstring).

    Args:
        spec: a spec as a dict (``ModelSpec.to_dict()`` or a file's JSON).
        d_model: the new width; every :data:`WIDTH_FIELDS` field is scaled by ``d_model / spec["d_model"]``.
        n_layers: the new depth.
        name: the new ``name`` (default: the old one with ``-d{d_model}`` / ``-l{n_layers}`` appended).

    Returns:
        The new spec dict (not validated: :func:`modkit.load_spec` says what does not fit, e.g. a head count that
            no longer divides ``d_model``).

    Raises:
        ScalingError: a size below 1.
    """
    for label, value in (("d_model", d_model), ("n_layers", n_layers)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ScalingError(f"{label} = {value!r}: give a positive integer")
    out = copy.deepcopy(spec)
    suffix = ""
    if d_model is not None and d_model != spec["d_model"]:
        ratio = d_model / spec["d_model"]
        out = {k: (_scale_fields(v, ratio) if k not in ("parametrization", "metadata") else v) for k, v in out.items()}
        out["d_model"] = d_model
        suffix += f"-d{d_model}"
    if n_layers is not None and n_layers != spec["n_layers"]:
        out["n_layers"] = n_layers
        suffix += f"-l{n_layers}"
    out["name"] = name if name is not None else f"{spec.get('name') or 'model'}{suffix}"
    return out


def with_parametrization(spec: dict, parametrization: Optional[dict]) -> dict:
    """A copy of the spec dict with ``parametrization`` replaced (``None``: removed, i.e. standard)."""
    out = copy.deepcopy(spec)
    if parametrization is None:
        out.pop("parametrization", None)
    else:
        out["parametrization"] = dict(parametrization)
    return out
