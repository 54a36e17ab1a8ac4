"""Parameter roles: what each parameter of a model *is*, declared by the component that owns it.

Optimizers (which rule updates a tensor: Muon for hidden matrices, AdamW for the rest), weight decay (which tensors
decay), μP (the init scale and learning-rate multiplier of each tensor, :mod:`modkit.core.parametrization`) and the
contract kit read a parameter's role, never its name. A role is one of :data:`ROLES`:

==============  ==========================================================================  =====  ===========
role            what it is                                                                  decay  μP class
==============  ==========================================================================  =====  ===========
``hidden``      a weight matrix between hidden widths, ``nn.Linear`` layout ``[out, in]``   yes    hidden
``expert``      stacked matrices of mixture-of-experts copies ``[n, in, out]``              yes    hidden
``embedding``   the token-embedding table ``[vocab_size, d_model]`` (the head too, tied)    yes    input
``position``    a learned absolute position table ``[max_seq_len, d_model]``                yes    input
``head``        the LM head ``[vocab_size, d_model]`` of an untied model                    yes    output
``router``      a router's weight ``[n_experts, d_model]`` (or a shared expert's gate           yes    readout
                ``[1, d_model]``): scores read out of the width
``norm_gain``   a norm's scale (RMSNorm / LayerNorm weight, DyT's weight)                   no     vector
``bias``        an additive bias (``nn.Linear`` bias, LayerNorm beta, the LM head's bias)   no     vector
``vector``      any other per-channel, per-head or scalar parameter (attention-sink          no     vector
                logits, SSM ``A_log`` / ``D`` / ``dt_bias``, depthwise conv kernels, DyT's
                alpha)
==============  ==========================================================================  =====  ===========

"decay" is the default weight-decay rule (nanoGPT's and GPT-3's: matrices and embeddings decay, vectors do not);
the μP class is the row of the μP tables (Yang et al. 2022, Tensor Programs V, arXiv:2203.03466, table 3) the role
follows: *input* (init and Adam learning rate independent of width), *hidden* (init variance and Adam learning rate
``∝ 1 / fan_in``), *output* (the logits get a ``1 / width`` multiplier), *readout* (a matrix from the width to a
fixed size with no multiplier: init std and Adam learning rate ``∝ 1 / width``), *vector* (like input).

How a component declares them (:func:`param_roles` resolves a whole model):

* a module may define ``param_roles``: a mapping (class attribute) or a method returning one, from the names of its
  parameters, relative to the module (``"weight"``, or ``"proj.weight"`` for a child without a declaration of its
  own), to roles. A name that runs through an attribute set to ``None`` (an optional bias switched off, an optional
  child such as a shared expert's gate left out) is allowed and ignored, so a class attribute can list every
  optional part;
* ``nn.Linear`` children without a declaration from an enclosing module are ``hidden`` (weight) and ``bias``;
  ``nn.Embedding`` children are ``embedding``;
* the nearest declaring module wins (a router's ``{"proj.weight": "router"}`` beats the ``nn.Linear`` default; a
  norm built inside an attention declares its own gain);
* every parameter must end with a role: one without is a :class:`RoleError` naming the parameter, the component
  (kind, type, plugin) that owns it and the fix.

So a component made of ``nn.Linear`` layers and built-in sub-components declares nothing; one that owns its own
``nn.Parameter`` declares it (``modkit check`` runs ``param_roles`` on every component).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

from torch import nn

from modkit.core.errors import ModkitError


class RoleError(ModkitError, ValueError):
    """A parameter without a role, an unknown role, or a declaration naming no parameter; says what to declare."""


@dataclass(frozen=True)
class Role:
    """One parameter role.

    Attributes:
        name: the role's name (a value of a ``param_roles`` mapping).
        description: what a parameter of this role is, with its layout.
        decay: whether the default weight-decay rule decays it.
        mup: its μP class: ``input``, ``hidden``, ``output``, ``readout`` or ``vector`` (see the module docstring).
        matrix: a weight matrix an orthogonalising optimizer (Muon) may update: ``hidden`` (2-D) and ``expert``
            (stacked, 3-D).
        ndim: the number of dimensions a parameter of this role has (``None``: any); the contract kit checks it.
    """

    name: str
    description: str
    decay: bool
    mup: str
    matrix: bool = False
    ndim: Optional[int] = None


#: Every role, by name (see the module docstring's table).
ROLES: Mapping[str, Role] = MappingProxyType(
    {
        r.name: r
        for r in (
            Role(
                "hidden",
                "a weight matrix between hidden widths, nn.Linear layout [out, in] (q/k/v/o, ffn and latent projections)",
                True,
                "hidden",
                matrix=True,
                ndim=2,
            ),
            Role(
                "expert",
                "stacked weight matrices of mixture-of-experts copies [n, in, out]",
                True,
                "hidden",
                matrix=True,
                ndim=3,
            ),
            Role(
                "embedding",
                "the token-embedding table [vocab_size, d_model] (also the LM head when tied)",
                True,
                "input",
                ndim=2,
            ),
            Role("position", "a learned absolute position table [max_seq_len, d_model]", True, "input", ndim=2),
            Role("head", "the LM head [vocab_size, d_model] of an untied model", True, "output", ndim=2),
            Role(
                "router",
                "a router's weight [n_experts, d_model], or a shared expert's gate [1, d_model]: scores read out of the width",
                True,
                "readout",
                ndim=2,
            ),
            Role("norm_gain", "a norm's learned scale (RMSNorm / LayerNorm weight)", False, "vector"),
            Role(
                "bias",
                "an additive bias (nn.Linear bias, LayerNorm beta, the LM head's bias, stacked expert biases)",
                False,
                "vector",
            ),
            Role(
                "vector",
                "any other per-channel, per-head or scalar parameter (attention-sink logits, SSM A_log / D / dt_bias, "
                "depthwise conv kernels, DyT's alpha)",
                False,
                "vector",
            ),
        )
    }
)


def declared_roles(module: nn.Module) -> dict[str, str]:
    """The module's own ``param_roles`` declaration (``{}`` without one): a mapping, or a method's result.

    Raises:
        RoleError: ``param_roles`` is neither a mapping nor a method returning one.
    """
    decl = getattr(module, "param_roles", None)
    if decl is None:
        return {}
    if callable(decl):
        decl = decl()
    if not isinstance(decl, Mapping):
        raise RoleError(
            f"{type(module).__name__}.param_roles must be a mapping {{parameter name: role}} or a method "
            f"returning one, got {type(decl).__name__}"
        )
    return dict(decl)


_OFF = object()  # a name that runs through an attribute set to None


def _walk(module: nn.Module, key: str) -> Any:
    """What ``key`` (``"proj.weight"``) names under ``module``: the object, :data:`_OFF` when an attribute on the way
    is ``None`` (an optional part switched off), ``None`` when it names nothing."""
    node: Any = module
    for part in key.split("."):
        if not hasattr(node, part):
            return None
        node = getattr(node, part)
        if node is None:
            return _OFF
    return node


def _owner(model: nn.Module, name: str) -> tuple[str, nn.Module, str]:
    prefix, _, leaf = name.rpartition(".")
    return prefix, (model.get_submodule(prefix) if prefix else model), leaf


def _component_of(model: nn.Module, name: str) -> str:
    """``kind/type (plugin P)`` of the nearest tagged module holding parameter ``name`` (``"the model"`` at the root)."""
    parts = name.split(".")[:-1]
    for k in range(len(parts), 0, -1):
        m = model.get_submodule(".".join(parts[:k]))
        kind, typ = getattr(m, "modkit_kind", None), getattr(m, "modkit_type", None)
        if kind and typ:
            try:
                from modkit.core.registry import get_registry

                provider = get_registry().get(kind, typ).provider
                return f"{kind}/{typ} (plugin {provider.plugin})" if provider else f"{kind}/{typ}"
            except Exception:  # noqa: BLE001 - a message helper: the tag alone is still useful
                return f"{kind}/{typ}"
    return "the model"


def param_roles(model: nn.Module) -> dict[str, str]:
    """The role of every parameter of ``model``: ``{qualified name: role}`` in ``named_parameters`` order (a tied
    parameter once, under its first name).

    Resolution (see the module docstring): the nearest enclosing module whose ``param_roles`` names the parameter,
    else the ``nn.Linear`` / ``nn.Embedding`` default, else an error.

    Raises:
        RoleError: every problem at once: a parameter with no role (naming it, its shape, the component that owns it
            and the declaration to add), an unknown role, a declared name that is not a parameter of the module.
    """
    found: dict[str, tuple[int, str]] = {}  # name -> (depth of the declaring module, role)
    problems: list[str] = []
    params = dict(model.named_parameters())
    for prefix, module in model.named_modules():
        decl = declared_roles(module)
        depth = prefix.count(".") + 1 if prefix else 0
        for key, role in decl.items():
            where = f"{type(module).__name__}" + (f" at {prefix!r}" if prefix else "")
            if role not in ROLES:
                problems.append(f"{where} declares role {role!r} for {key!r}; roles: {', '.join(ROLES)}")
                continue
            full = f"{prefix}.{key}" if prefix else key
            if full not in params:
                target = _walk(module, key)
                if target is _OFF:
                    continue  # an optional parameter or sub-module switched off (bias=False, shared_gate=None)
                if isinstance(target, nn.Parameter):
                    continue  # a tied parameter listed under its first name
                own = sorted(n for n, _ in module.named_parameters())
                shown = ", ".join(own[:8]) + (f", ... ({len(own)} in all)" if len(own) > 8 else "")
                problems.append(
                    f"{where} declares a role for {key!r}, which is not one of its parameters ({shown or 'none'})"
                )
                continue
            if full not in found or found[full][0] < depth:
                found[full] = (depth, role)
    out: dict[str, str] = {}
    for name, p in params.items():
        if name in found:
            out[name] = found[name][1]
            continue
        _, owner, leaf = _owner(model, name)
        if isinstance(owner, nn.Linear):
            out[name] = "hidden" if leaf == "weight" else "bias"
        elif isinstance(owner, nn.Embedding):
            out[name] = "embedding"
        else:
            cls = type(owner).__name__
            problems.append(
                f"parameter {name!r} {list(p.shape)} of {_component_of(model, name)} has no declared role; give "
                f"{cls} a param_roles = {{{leaf!r}: ROLE}} (roles: {', '.join(ROLES)}; see 'Parameter roles' in "
                "docs/guides/writing-a-plugin.md)"
            )
    if problems:
        raise RoleError("; ".join(problems))
    return out


def check_shapes(model: nn.Module, roles: Mapping[str, str]) -> list[str]:
    """Parameters whose number of dimensions does not fit their role (:attr:`Role.ndim`): one line each."""
    params = dict(model.named_parameters())
    out = []
    for name, role in roles.items():
        want = ROLES[role].ndim
        if want is not None and params[name].dim() != want:
            out.append(
                f"{name!r} {list(params[name].shape)} has role {role!r}, which is {want}-dimensional "
                f"({ROLES[role].description})"
            )
    return out


def role_table(model: nn.Module) -> dict[str, dict[str, Any]]:
    """``{role: {"tensors": n, "values": numel}}`` of a model, for cards and reports."""
    params = dict(model.named_parameters())
    out: dict[str, dict[str, Any]] = {}
    for name, role in param_roles(model).items():
        row = out.setdefault(role, {"tensors": 0, "values": 0})
        row["tensors"] += 1
        row["values"] += params[name].numel()
    return out
