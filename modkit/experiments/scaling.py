"""Sizes of a spec: the same design at another width or depth (what ``modkit compare --widths/--depths`` and
``modkit coordcheck`` train).

Widening sets ``d_model`` and scales every component field named in :data:`WIDTH_FIELDS` (a convention on field
names, as the training config's ``aux_loss_coef`` is: the core names no component) by the same ratio; head counts
stay, so a derived ``head_dim`` grows with ``d_model`` (the μP setting of Yang et al. 2022, arXiv:2203.03466, §J:
width = ``d_model`` and ``d_ff`` together, heads fixed). A spec in μP keeps its ``base_d_model``. Deepening sets
``n_layers``.

Rounding: a width that was even stays even (the nearest even integer, halves up): RoPE rotates features in pairs,
so a head or rotary width (``head_dim``, latent attention's ``qk_rope_head_dim``) must stay even, and every published
model's head and latent widths are even. An odd width rounds to the nearest integer. :func:`resize_checked`
validates the result; where the even rounding gives an invalid spec (a Mamba-2 ``head_dim`` that must divide
``d_inner``) it tries the nearest integers, and where neither fits (a derived ``head_dim = d_model / n_heads`` that is
not a whole even number) it refuses, naming the size, each invalid field with its value, and the nearest widths that
fit.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Optional

from modkit.core.errors import ModkitError

#: component fields that are hidden widths and scale with ``d_model`` (a field of any component with this name)
WIDTH_FIELDS = ("d_ff", "head_dim", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")


class ScalingError(ModkitError, ValueError):
    """A size that the spec cannot take (the message names the spec, the size and the field)."""


def scaled_width(value: int, ratio: float, *, keep_parity: bool = True) -> int:
    """``value x ratio`` rounded: to the nearest even integer (halves up, at least 2) when ``value`` is even and
    ``keep_parity``, else to the nearest integer (Python's ``round``, at least 1)."""
    x = value * ratio
    if keep_parity and value % 2 == 0:
        return max(2, 2 * math.floor(x / 2 + 0.5))
    return max(1, int(round(x)))


def _scale_fields(node: Any, ratio: float, keep_parity: bool) -> Any:
    if isinstance(node, list):
        return [_scale_fields(v, ratio, keep_parity) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in WIDTH_FIELDS and isinstance(v, int) and not isinstance(v, bool):
            out[k] = scaled_width(v, ratio, keep_parity=keep_parity)
        else:
            out[k] = _scale_fields(v, ratio, keep_parity)
    return out


def resize(
    spec: dict,
    *,
    d_model: Optional[int] = None,
    n_layers: Optional[int] = None,
    name: Optional[str] = None,
    keep_parity: bool = True,
) -> dict:
    """A copy of the spec dict at ``d_model`` and/or ``n_layers`` (see the module docstring).

    Args:
        spec: a spec as a dict (``ModelSpec.to_dict()`` or a file's JSON).
        d_model: the new width; every :data:`WIDTH_FIELDS` field is scaled by ``d_model / spec["d_model"]``.
        n_layers: the new depth.
        name: the new ``name`` (default: the old one with ``-d{d_model}`` / ``-l{n_layers}`` appended).
        keep_parity: round an even width to the nearest even integer (:func:`scaled_width`; the module docstring).

    Returns:
        The new spec dict (not validated: :func:`resize_checked` validates, and says what does not fit, e.g. a head
            count that no longer divides ``d_model``).

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
        out = {
            k: (_scale_fields(v, ratio, keep_parity) if k not in ("parametrization", "metadata") else v)
            for k, v in out.items()
        }
        out["d_model"] = d_model
        suffix += f"-d{d_model}"
    if n_layers is not None and n_layers != spec["n_layers"]:
        out["n_layers"] = n_layers
        suffix += f"-l{n_layers}"
    out["name"] = name if name is not None else f"{spec.get('name') or 'model'}{suffix}"
    return out


def _attempt(
    spec: dict, d_model: Optional[int], n_layers: Optional[int], name: Optional[str]
) -> tuple[Optional[dict], Any]:
    """The first of (even rounding, nearest rounding) that validates, else ``(None, the first one's SpecError)``."""
    from modkit.core.errors import SpecError
    from modkit.spec import load_spec

    first = None
    for keep in (True, False):
        out = resize(spec, d_model=d_model, n_layers=n_layers, name=name, keep_parity=keep)
        try:
            load_spec(out)
            return out, None
        except SpecError as exc:
            first = first or exc
    return None, first


def resize_checked(
    spec: dict, *, d_model: Optional[int] = None, n_layers: Optional[int] = None, name: Optional[str] = None
) -> dict:
    """:func:`resize`, validated: even widths kept even when that gives a valid spec, else rounded to the nearest
    integer when that does (the module docstring).

    Raises:
        ScalingError: a size below 1, or a size at which neither rounding gives a valid spec; the message names the
            size, every invalid field with its value (the validation errors), and the nearest widths (or depths,
            when only the depth changed) below and above at which the spec is valid.
    """
    out, error = _attempt(spec, d_model, n_layers, name)
    if out is not None:
        return out
    label = spec.get("name") or "the spec"
    where = []
    if d_model is not None and d_model != spec["d_model"]:
        where.append(f"d_model = {d_model} (scaled from {spec['d_model']})")
    if n_layers is not None and n_layers != spec["n_layers"]:
        where.append(f"n_layers = {n_layers}")
    lines = [f"{label} at {', '.join(where) or 'its own size'} is not a valid spec:"]
    lines += [f"  {path or '<root>'}: {message}" for path, message in error.errors]
    if d_model is not None and d_model != spec["d_model"]:
        near = _nearest(lambda w: _attempt(spec, w, n_layers, name)[0] is not None, d_model)
        what = "widths"
    elif n_layers is not None:
        near = _nearest(lambda n: _attempt(spec, d_model, n, name)[0] is not None, n_layers)
        what = "depths"
    else:
        near = []
    if near:
        lines.append(
            f"{what} near {d_model if what == 'widths' else n_layers} that give a valid spec: "
            + ", ".join(str(v) for v in near)
            + " (or set the field in the spec so it fits)"
        )
    else:
        lines.append("no nearby size gives a valid spec: fix the fields above in the spec itself")
    raise ScalingError("\n".join(lines))


def _nearest(valid, value: int, reach: int = 64) -> list[int]:
    """The nearest value below and the nearest above ``value`` (within ``reach``, at least 1) for which ``valid``."""
    below = next((v for v in range(value - 1, max(0, value - reach), -1) if valid(v)), None)
    above = next((v for v in range(value + 1, value + reach + 1) if valid(v)), None)
    return [v for v in (below, above) if v is not None]


def with_parametrization(spec: dict, parametrization: Optional[dict]) -> dict:
    """A copy of the spec dict with ``parametrization`` replaced (``None``: removed, i.e. standard)."""
    out = copy.deepcopy(spec)
    if parametrization is None:
        out.pop("parametrization", None)
    else:
        out["parametrization"] = dict(parametrization)
    return out
