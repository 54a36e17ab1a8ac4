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
* every parameter should end with a role. One without takes the field's convention, so a component written before
  roles existed still trains: a matrix (2-D) is ``hidden``, anything else (a vector, a scalar, a tensor of 3 or
  more dimensions, whose layout cannot be told apart from a convolution kernel) is ``vector``; the same convention
  decides whether a tensor decays (nanoGPT's ``p.dim() >= 2`` rule, here for matrices only), which optimizer
  updates it (Muon takes the inferred ``hidden`` matrices, AdamW the rest) and its μP scaling
  (:mod:`modkit.core.parametrization`). Inferring warns once per component type and process
  (:class:`RoleWarning`), listing that type's parameters, the roles inferred and the ``param_roles`` mapping to
  add. ``param_roles(model, strict=True)`` (what the contract kit's ``param_roles`` check runs) refuses instead:
  a :class:`RoleError` with one sentence per component type, naming its parameters, the component (kind, type,
  plugin) that owns them and the fix.

So a component made of ``nn.Linear`` layers and built-in sub-components declares nothing; one that owns its own
``nn.Parameter`` declares it (``modkit check`` runs ``param_roles`` on every component and fails one that does not).
The convention follows the Muon reference (Jordan et al. 2024, kellerjordan.github.io/posts/muon: ``p.ndim >= 2``
hidden weights to Muon, the rest to AdamW) and nanoGPT's ``configure_optimizers`` (decay for matrices only).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Optional

from torch import nn

from modkit.core.errors import ModkitError


class RoleError(ModkitError, ValueError):
    """An unknown role, a declaration naming no parameter, or (``strict``) a parameter without a role; says what to
    declare, one sentence per component type or declaring class, never one per parameter."""


class RoleWarning(UserWarning):
    """Parameters of a component type declare no role, so the convention was inferred (matrices ``hidden``, the rest
    ``vector``); one warning per component type and process, naming the parameters and the ``param_roles`` to add."""


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


#: what :func:`declared_target` returns for a name that runs through an attribute set to ``None``
SWITCHED_OFF = object()


def declared_target(module: nn.Module, key: str) -> Any:
    """What a name a module declares (``param_roles``, ``matrix_weights``: ``"proj.weight"``) names under
    ``module``: the object, :data:`SWITCHED_OFF` when an attribute on the way is ``None`` (an optional part switched
    off), ``None`` when it names nothing (a typo)."""
    node: Any = module
    for part in key.split("."):
        if not hasattr(node, part):
            return None
        node = getattr(node, part)
        if node is None:
            return SWITCHED_OFF
    return node


def _owner(model: nn.Module, name: str) -> tuple[str, nn.Module, str]:
    prefix, _, leaf = name.rpartition(".")
    return prefix, (model.get_submodule(prefix) if prefix else model), leaf


def _label(module: nn.Module) -> Optional[str]:
    """``kind/type (plugin P)`` of a module tagged with its registry entry; ``None`` for an untagged module."""
    kind, typ = getattr(module, "modkit_kind", None), getattr(module, "modkit_type", None)
    if not (kind and typ):
        return None
    try:
        from modkit.core.registry import get_registry

        provider = get_registry().get(kind, typ).provider
    except Exception:  # noqa: BLE001 - a message helper: the tag alone is still useful
        return f"{kind}/{typ}"
    return f"{kind}/{typ} (plugin {provider.plugin})" if provider else f"{kind}/{typ}"


def _component_of(model: nn.Module, name: str) -> tuple[str, str, nn.Module]:
    """``(label, prefix, module)`` of the nearest tagged module holding parameter ``name``: its ``kind/type (plugin
    P)``, its qualified name and itself; ``("the model", "", model)`` when no tagged module holds it."""
    parts = name.split(".")[:-1]
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        module = model.get_submodule(prefix)
        label = _label(module)
        if label:
            return label, prefix, module
    return "the model", "", model


def convention_role(param: nn.Parameter) -> str:
    """The role a parameter without a declared one takes: ``hidden`` for a matrix (2-D), ``vector`` for anything else.

    A vector or scalar is ``vector`` (no decay, AdamW, μP's vector class, as ``norm_gain`` and ``bias`` are too); a
    tensor of 3 or more dimensions is ``vector`` as well, because a stacked ``[n, in, out]`` expert weight cannot be
    told apart from a convolution kernel by its shape, and only a 2-D matrix is one Muon can orthogonalise. Sources:
    the Muon reference's ``p.ndim >= 2`` split (Jordan et al. 2024) and nanoGPT's decay rule, restricted to 2-D.
    """
    return "hidden" if param.dim() == 2 else "vector"


#: component types already told that their parameters' roles are inferred (one warning each per process)
_INFERRED_WARNED: set[str] = set()
#: modules a grouped message names before "... (N in all)"
_SHOWN = 4
_CONVENTION = "matrices 'hidden', vectors and scalars 'vector'"
_GUIDE = "see 'Parameter roles' in docs/guides/writing-a-plugin.md"


def _listed(items: list[str]) -> str:
    """``a, b, c, d, ... (9 in all)``."""
    return ", ".join(items[:_SHOWN]) + (f", ... ({len(items)} in all)" if len(items) > _SHOWN else "")


@dataclass
class _Unroled:
    """The parameters of one component type that declare no role, gathered for one message (not one per parameter).

    Attributes:
        label: ``kind/type (plugin P)``. owner: the class that declares them (the component's module). declares: it
            has a ``param_roles`` already. first: the first parameter's qualified name and shape. names: ``{name
            relative to the component: (shape, inferred role)}``. modules: the qualified names of the components
            holding them. count: parameters in all (every layer).
    """

    label: str
    owner: str
    declares: bool
    first: str
    names: dict[str, tuple[list[int], str]]
    modules: list[str]
    count: int = 0

    def mapping(self) -> str:
        """The ``param_roles`` mapping that declares what was inferred: ``{'g': 'vector', 'w_in': 'hidden'}``."""
        return "{" + ", ".join(f"{n!r}: {r!r}" for n, (_, r) in self.names.items()) + "}"

    def where(self) -> str:
        """``'g' [1], 'w' [64, 32] in 5 modules: layers.0.ffn, ...`` (``in final_norm`` for one module)."""
        names = ", ".join(f"{n!r} {shape}" for n, (shape, _) in self.names.items())
        mods = f"in {self.modules[0]}" if len(self.modules) == 1 else f"in {len(self.modules)} modules: "
        return f"{names} {mods}{_listed(self.modules) if len(self.modules) > 1 else ''}"

    def fix(self) -> str:
        """What to write: a new ``param_roles``, or entries added to the one the class has."""
        if self.declares:
            return f"add {self.mapping()[1:-1]} to {self.owner}.param_roles"
        return f"give {self.owner} a param_roles = {self.mapping()}"

    def error(self) -> str:
        """The strict refusal: the first parameter by name, the others of the type listed once, the fix."""
        more = f", nor have the other {self.count - 1} of that type ({self.where()})" if self.count > 1 else ""
        return (
            f"parameter {self.first} of {self.label} has no declared role{more}: {self.fix()} ('norm_gain' or 'bias' "
            f"where one fits, roles: {', '.join(ROLES)}, {_GUIDE}), the convention ({_CONVENTION}) training infers "
            "with a warning"
        )

    def warning(self) -> str:
        """The warning of an inferred component type: its parameters, the roles inferred, who follows them, the fix."""
        return (
            f"{self.label} declares no role for {self.where()}; modkit inferred {self.mapping()} by the usual "
            f"convention ({_CONVENTION}), and weight decay, Muon and muP follow these inferred roles. The contract "
            f"kit's param_roles check fails until they are declared: {self.fix()} ('norm_gain' or 'bias' where one "
            f"fits; {_GUIDE})"
        )


def _gather(groups: dict[str, _Unroled], model: nn.Module, name: str, p: nn.Parameter, role: str) -> None:
    """Add parameter ``name`` (inferred ``role``) to the group of its component type."""
    label, prefix, module = _component_of(model, name)
    short = name[len(prefix) + 1 :] if prefix else name
    g = groups.get(label)
    if g is None:
        g = groups[label] = _Unroled(
            label, type(module).__name__, bool(declared_roles(module)), f"{name!r} {list(p.shape)}", {}, []
        )
    g.names.setdefault(short, (list(p.shape), role))
    where = prefix or "the model"
    if where not in g.modules:
        g.modules.append(where)
    g.count += 1


def _declarations(model: nn.Module, params: Mapping[str, nn.Parameter]) -> tuple[dict[str, str], list[str]]:
    """``({name: role}, problems)`` from every ``param_roles`` declaration, the nearest declaring module winning;
    problems grouped per declaring class (the same mistake in every layer is one sentence)."""
    found: dict[str, tuple[int, str]] = {}  # name -> (depth of the declaring module, role)
    problems: dict[tuple[str, str], list[str]] = {}  # (class, what is wrong) -> where
    for prefix, module in model.named_modules():
        decl = declared_roles(module)
        depth = prefix.count(".") + 1 if prefix else 0
        cls = type(module).__name__
        for key, role in decl.items():
            if role not in ROLES:
                what = f"declares role {role!r} for {key!r}; roles: {', '.join(ROLES)}"
                problems.setdefault((cls, what), []).append(prefix)
                continue
            full = f"{prefix}.{key}" if prefix else key
            if full not in params:
                target = declared_target(module, key)
                if target is SWITCHED_OFF or isinstance(target, nn.Parameter):
                    continue  # an optional part switched off (bias=False); a tied parameter under its first name
                own = sorted(n for n, _ in module.named_parameters())
                shown = ", ".join(own[:8]) + (f", ... ({len(own)} in all)" if len(own) > 8 else "")
                what = f"declares a role for {key!r}, which is not one of its parameters ({shown or 'none'})"
                problems.setdefault((cls, what), []).append(prefix)
                continue
            if full not in found or found[full][0] < depth:
                found[full] = (depth, role)
    out = []
    for (cls, what), where in problems.items():
        at = [repr(w) for w in where if w]
        places = "" if not at else f" at {at[0]}" if len(at) == 1 else f" at {len(at)} modules ({_listed(at)})"
        out.append(f"{cls}{places} {what}")
    return {n: r for n, (_, r) in found.items()}, out


def param_roles(model: nn.Module, *, strict: bool = False) -> dict[str, str]:
    """The role of every parameter of ``model``: ``{qualified name: role}`` in ``named_parameters`` order (a tied
    parameter once, under its first name).

    Resolution (see the module docstring): the nearest enclosing module whose ``param_roles`` names the parameter,
    else the ``nn.Linear`` / ``nn.Embedding`` default, else the convention (:func:`convention_role`: matrices
    ``hidden``, the rest ``vector``), which warns once per component type and process (:class:`RoleWarning`) unless
    ``strict``. Optimizers (Muon included), weight decay and μP all read this result, so they agree on the inferred
    roles.

    Args:
        model: the model (or any module built by modkit). strict: refuse parameters without a declared role instead
            of inferring them (the contract kit's ``param_roles`` check).

    Raises:
        RoleError: every problem at once, one sentence per declaring class or component type: an unknown role, a
            declared name that is not a parameter of the module and, when ``strict``, parameters with no role (the
            first by qualified name and shape, the others of its type, the component that owns them and the
            ``param_roles`` mapping to add).
    """
    params = dict(model.named_parameters())
    found, problems = _declarations(model, params)
    out: dict[str, str] = {}
    unroled: dict[str, _Unroled] = {}
    for name, p in params.items():
        if name in found:
            out[name] = found[name]
            continue
        _, owner, leaf = _owner(model, name)
        if isinstance(owner, nn.Linear):
            out[name] = "hidden" if leaf == "weight" else "bias"
        elif isinstance(owner, nn.Embedding):
            out[name] = "embedding"
        else:
            out[name] = convention_role(p)
            _gather(unroled, model, name, p, out[name])
    if strict:
        problems += [g.error() for g in unroled.values()]
    if problems:
        raise RoleError("; ".join(problems))
    for label, g in unroled.items():
        if label not in _INFERRED_WARNED:
            _INFERRED_WARNED.add(label)
            warnings.warn(g.warning(), RoleWarning, stacklevel=2)
    return out


def check_shapes(model: nn.Module, roles: Mapping[str, str]) -> list[str]:
    """Parameters whose number of dimensions does not fit their role (:attr:`Role.ndim`): one line per component type
    and parameter (the first by qualified name and shape; the same parameter in other layers counted, not repeated)."""
    params = dict(model.named_parameters())
    first: dict[tuple[str, str, str], list] = {}  # (component, short name, role) -> [qualified name, how many]
    for name, role in roles.items():
        want = ROLES[role].ndim
        if want is None or params[name].dim() == want:
            continue
        label, prefix, _ = _component_of(model, name)
        key = (label, name[len(prefix) + 1 :] if prefix else name, role)
        first.setdefault(key, [name, 0])[1] += 1
    out = []
    for (label, short, role), (name, n) in first.items():
        more = f" (and {short!r} in {n - 1} more module(s) of {label})" if n > 1 else ""
        out.append(
            f"{name!r} {list(params[name].shape)}{more} has role {role!r}, which is {ROLES[role].ndim}-dimensional "
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
