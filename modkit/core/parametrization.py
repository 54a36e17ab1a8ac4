"""Parametrizations of a spec: standard (the default, unchanged) and μP, read through the parameters' roles.

A spec's ``parametrization`` (absent, or ``{"type": "sp"}``: standard) says how init scales, learning rates, the
output logits and the attention scores change with the width. μP (Yang et al. 2022, Tensor Programs V: Tuning
Large Neural Networks via Zero-Shot Hyperparameter Transfer, arXiv:2203.03466) makes them change so that the best
learning rate and init found at a small *base* width transfer to larger ones. With ``m = d_model / base_d_model``
(the width multiplier; 1 at the base width, where μP equals standard exactly):

=================  =====================  ================================  =====================================
μP class (roles)   init std               Adam-like lr (and weight decay)   SGD lr (and weight decay)
=================  =====================  ================================  =====================================
input              × 1                    × 1                               × m  (decay / m)
(embedding, position)
vector             × 1                    × 1                               × m  (decay / m)
(norm_gain, bias, vector)
hidden             × m^-1/2               × 1/m  (decay × m)                × 1
(hidden, expert)
output (head)      × 1                    × 1                               × m  (decay / m)
readout (router)   × 1/m                  × 1/m  (decay × m)                × 1/m (decay × m)
=================  =====================  ================================  =====================================

and two changes to the forward pass:

* **output multiplier**: ``logits = output_multiplier / m · head(h)`` (TP V's table 8 formulation, the ``mup``
  package's ``MuReadout``), which is why the head's init and Adam learning rate stay as they are; a tied head shares
  the embedding (role ``embedding``) and its rules;
* **attention scale**: ``q·k`` is scaled by ``sqrt(base_head_dim) / head_dim`` instead of ``1 / sqrt(head_dim)``
  (TP V §J.2.1 "1/d attention"), equal at the base width. An attention reads it from
  :meth:`modkit.core.interfaces.BuildContext.attention_scale`; an explicit ``softmax_scale`` in its config wins.

The learning-rate and weight-decay columns multiply each parameter group's learning rate and weight decay; the
weight-decay factor is the inverse of the learning-rate factor, so the decoupled decay per step (``lr ·
weight_decay``) does not change with width (the ``mup`` package's ``MuAdam`` / ``MuSGD`` rule). Which column an
optimizer follows is its registry entry's ``mup`` capability (``"adam"``: AdamW, Lion, Muon with the
``match_rms_adamw`` scaling; ``"sgd"``: SGD). The table follows TP V's table 3 (and the ``mup`` package,
github.com/microsoft/mup, for the multiplier form); u-μP (Blake et al. 2024, arXiv:2407.17465) motivates checking it
with the coordinate check (``modkit coordcheck``).

Roles come from :func:`modkit.core.roles.param_roles`, the same call the optimizers (Muon included) make, so a
parameter of a component that declares no role is scaled as the role the convention infers for it (a 2-D matrix
``hidden``: init ``× m^-1/2``, Adam learning rate ``× 1/m``; anything else ``vector``: unchanged), and training's
:class:`~modkit.core.roles.RoleWarning` says so, once per component type.

Widths are assumed to scale together with ``d_model`` (``d_ff``, ``head_dim`` and other hidden widths in proportion,
as ``modkit compare --widths`` scales them); ``base_head_dim`` defaults to ``head_dim · base_d_model / d_model``.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal, Optional, Union

from pydantic import Field

from modkit.core.config import StrictModel
from modkit.core.limits import MAX_MULTIPLIER, DModel, HeadDim, Multiplier


class StandardParametrization(StrictModel):
    """Standard parametrization: init, learning rates and forward as the spec and training config give them."""

    type: Literal["sp"] = "sp"


class MuParametrization(StrictModel):
    """μP relative to a base width (see :mod:`modkit.core.parametrization`)."""

    type: Literal["mup"] = "mup"
    base_d_model: DModel = Field(
        ..., description="the base width: at d_model = base_d_model muP equals standard parametrization"
    )
    base_head_dim: Optional[HeadDim] = Field(
        None,
        description="head_dim at the base width for the 1/head_dim attention scale; default head_dim * base_d_model / d_model",
    )
    output_multiplier: Multiplier = Field(
        1.0,
        description="alpha_output: logits = output_multiplier * base_d_model / d_model * head(h); at most "
        f"{MAX_MULTIPLIER:g} (muP sweeps use 0.5-10; larger only pushes the logits toward overflow)",
    )


#: the ``parametrization`` field of a spec
Parametrization = Annotated[Union[StandardParametrization, MuParametrization], Field(discriminator="type")]

#: ``{μP class: exponent of m}`` of the init std (see the module docstring)
INIT_EXPONENT = {"input": 0.0, "vector": 0.0, "hidden": -0.5, "output": 0.0, "readout": -1.0}
#: ``{optimizer family: {μP class: exponent of m}}`` of the learning rate (weight decay: the opposite exponent)
LR_EXPONENT = {
    "adam": {"input": 0.0, "vector": 0.0, "hidden": -1.0, "output": 0.0, "readout": -1.0},
    "sgd": {"input": 1.0, "vector": 1.0, "hidden": 0.0, "output": 1.0, "readout": -1.0},
}


def width_multiplier(spec) -> float:
    """``m = d_model / base_d_model`` under μP; 1.0 under standard parametrization."""
    p = getattr(spec, "parametrization", None)
    if isinstance(p, MuParametrization):
        return spec.d_model / p.base_d_model
    return 1.0


def is_mup(spec) -> bool:
    """Whether the spec is in μP."""
    return isinstance(getattr(spec, "parametrization", None), MuParametrization)


def init_scales(spec, roles: dict[str, str]) -> dict[str, float]:
    """``{parameter name: factor}`` multiplying the std of each parameter's random init (only factors != 1).

    Args:
        spec: the model's spec. roles: ``{name: role}`` (:func:`modkit.core.roles.param_roles`: declared roles, and
            the convention's for parameters without one, as the optimizers see them).
    """
    from modkit.core.roles import ROLES

    if not is_mup(spec):
        return {}
    m = width_multiplier(spec)
    out = {}
    for name, role in roles.items():
        f = m ** INIT_EXPONENT[ROLES[role].mup]
        if f != 1.0:
            out[name] = f
    return out


def lr_multiplier(spec, role: str, family: Optional[str]) -> tuple[float, float]:
    """``(learning-rate factor, weight-decay factor)`` of a parameter of ``role`` under an optimizer of ``family``.

    Standard parametrization: ``(1, 1)``.

    Raises:
        ValueError: the spec is in μP and ``family`` is not one of :data:`LR_EXPONENT` (the optimizer declares no
            ``mup`` capability).
    """
    from modkit.core.roles import ROLES

    if not is_mup(spec):
        return 1.0, 1.0
    if family not in LR_EXPONENT:
        raise ValueError(
            f"the spec is in muP but the optimizer declares no muP rule (capability 'mup' = "
            f"{family!r}; one of {', '.join(LR_EXPONENT)}); use another optimizer or a standard-parametrization spec"
        )
    f = width_multiplier(spec) ** LR_EXPONENT[family][ROLES[role].mup]
    return f, 1.0 / f


def output_multiplier(spec) -> Optional[float]:
    """The factor on the logits (``None`` under standard parametrization)."""
    p = getattr(spec, "parametrization", None)
    if isinstance(p, MuParametrization):
        return p.output_multiplier * p.base_d_model / spec.d_model
    return None


def attention_scale(spec_parametrization, d_model: int, head_dim: int) -> float:
    """The default score scale of an attention with heads of ``head_dim``: ``1 / sqrt(head_dim)`` (standard), or
    ``sqrt(base_head_dim) / head_dim`` (μP, ``base_head_dim = head_dim · base_d_model / d_model`` unless given)."""
    p = spec_parametrization
    if isinstance(p, MuParametrization):
        base = p.base_head_dim if p.base_head_dim is not None else head_dim * p.base_d_model / d_model
        return math.sqrt(base) / head_dim
    return 1.0 / math.sqrt(head_dim)
