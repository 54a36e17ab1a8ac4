"""Optimizers as registered components: the ``optimizer`` kind, the setup a factory gets, and several as one.

A training config names its optimizer like a spec names a component (``"optimizer": {"type": "muon", "momentum":
0.95}``), validated strictly against the registry; the built-ins (``adamw``, ``muon``, ``lion``, ``sgd``) live in
``modkit_plugins.optim`` and a plugin adds one the same way::

    register(modkit.Component(kind="optimizer", type="my-opt", config=MyOptConfig,
                              factory=lambda cfg, setup: MyOpt(setup.param_groups(), lr=setup.lr),
                              description="...", capabilities={"mup": "adam", "sharded": True}))

The factory gets an :class:`OptimizerSetup`: the model's parameters grouped by role (:mod:`modkit.core.roles`), each
group with its weight decay (the training config's ``weight_decay`` on roles that decay, 0 on the others) and its
learning-rate multiplier (1, or μP's factor for the role: :mod:`modkit.core.parametrization`), plus the shared
hyper-parameters of the training config. It returns a ``torch.optim.Optimizer`` whose param groups carry an
``lr_mult`` key (the loop sets ``group["lr"] = lr(step) * group["lr_mult"]`` every step), or an
:class:`OptimizerChain` of several (Muon for hidden matrices, AdamW for the rest). Which rule updates which tensor
is decided by roles, never by parameter names.

Capabilities of an optimizer entry: ``mup`` (``"adam"`` or ``"sgd"``: which column of μP's learning-rate table its
update follows; without it a μP spec cannot use it) and ``sharded`` (true: its step is correct on FSDP2 / tensor-
parallel shards, so it may train under torchrun).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import nn

from modkit.core.errors import ModkitError

#: the registry kind of optimizers
KIND = "optimizer"


class OptimizerError(ModkitError, ValueError):
    """An optimizer that cannot train this model as configured (μP without a rule, sharding, no parameters)."""


@dataclass
class RoleGroup:
    """The trainable parameters of one role.

    Attributes:
        role: the role (:data:`modkit.core.roles.ROLES`); names: the parameters' qualified names (for messages);
        params: the parameters, in ``named_parameters`` order; weight_decay: its decoupled weight decay (the
            training config's on roles that decay, times μP's factor; 0 on the others); lr_mult: the factor on the
            scheduled learning rate (1 under standard parametrization).
    """

    role: str
    names: list[str]
    params: list[nn.Parameter]
    weight_decay: float
    lr_mult: float = 1.0


@dataclass
class OptimizerSetup:
    """What an optimizer factory gets (``factory(config, setup) -> optimizer``).

    Attributes:
        groups: one :class:`RoleGroup` per role present, in order of each role's first parameter.
        lr: the peak learning rate (the loop overwrites ``group["lr"]`` every step; factories pass it as the initial
            value). beta1, beta2, eps: the training config's AdamW ``beta1``, ``beta2``, ``adam_eps``.
        weight_decay: the training config's ``weight_decay`` (already applied to the groups).
        fused: whether a fused kernel may be used (one process; FSDP2 shards are not fused-safe).
        distributed: the run has several processes.
    """

    groups: list[RoleGroup]
    lr: float
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.1
    fused: bool = False
    distributed: bool = False
    roles: dict[str, str] = field(default_factory=dict)

    def select(self, roles: Optional[Iterable[str]] = None, *, exclude: Iterable[str] = ()) -> list[RoleGroup]:
        """The groups of ``roles`` (all when ``None``) minus those of ``exclude``."""
        want = None if roles is None else set(roles)
        skip = set(exclude)
        return [g for g in self.groups if (want is None or g.role in want) and g.role not in skip]

    def param_groups(self, groups: Optional[Sequence[RoleGroup]] = None) -> list[dict[str, Any]]:
        """torch param-group dicts of ``groups`` (default: all): role groups with the same weight decay and learning-
        rate multiplier merged into one, decaying groups first, parameters in model order within a group.

        Each dict holds ``params``, ``weight_decay``, ``lr_mult`` and ``roles`` (the roles it covers). Under standard
        parametrization AdamW gets exactly nanoGPT's two groups, decay and no decay.
        """
        merged: dict[tuple[float, float], dict[str, Any]] = {}
        for g in groups if groups is not None else self.groups:
            key = (g.weight_decay, g.lr_mult)
            d = merged.setdefault(
                key, {"params": [], "weight_decay": g.weight_decay, "lr_mult": g.lr_mult, "roles": [], "_order": []}
            )
            d["_order"] += list(zip(g.names, g.params))
            d["roles"].append(g.role)
        order = {n: i for i, n in enumerate(self.roles)}
        out = []
        for d in sorted(
            merged.values(), key=lambda d: (d["weight_decay"] == 0.0, min(order.get(n, 0) for n, _ in d["_order"]))
        ):
            d["params"] = [p for _, p in sorted(d.pop("_order"), key=lambda np_: order.get(np_[0], 0))]
            out.append(d)
        return out

    def adamw(self, groups: Optional[Sequence[RoleGroup]] = None) -> torch.optim.AdamW:
        """AdamW (Loshchilov & Hutter 2019, arXiv:1711.05101; ``torch.optim.AdamW``) over ``groups`` with the
        training config's betas and epsilon: modkit's optimizer before optimizers were components."""
        return torch.optim.AdamW(
            self.param_groups(groups),
            lr=self.lr,
            betas=(self.beta1, self.beta2),
            eps=self.eps,
            **({"fused": True} if self.fused else {}),
        )


def role_groups(
    model: nn.Module, spec: Any, weight_decay: float, family: Optional[str]
) -> tuple[list[RoleGroup], dict[str, str]]:
    """Trainable parameters grouped by role, with weight decay and μP learning-rate factors.

    Args:
        model: the model (roles from :func:`modkit.core.roles.param_roles`: declared, or inferred by the convention
            for a parameter without one, with one :class:`~modkit.core.roles.RoleWarning` per component type).
        spec: its spec (its ``parametrization`` decides the factors).
        weight_decay: the training config's; applied to roles whose :attr:`~modkit.core.roles.Role.decay` is true.
        family: the optimizer's ``mup`` capability (``"adam"`` / ``"sgd"``; needed only under μP).

    Returns:
        ``(groups, roles)``: the :class:`RoleGroup` list and ``{name: role}`` of the trainable parameters.

    Raises:
        RoleError: an unknown role or a declaration naming no parameter. OptimizerError: μP with an optimizer that
            declares no ``mup`` rule.
    """
    from modkit.core.parametrization import lr_multiplier
    from modkit.core.roles import ROLES, param_roles

    roles = param_roles(model)
    params = dict(model.named_parameters())
    groups: dict[str, RoleGroup] = {}
    kept: dict[str, str] = {}
    for name, role in roles.items():
        p = params[name]
        if not p.requires_grad:
            continue
        kept[name] = role
        if role not in groups:
            try:
                lr_f, wd_f = lr_multiplier(spec, role, family)
            except ValueError as exc:
                raise OptimizerError(str(exc)) from None
            groups[role] = RoleGroup(role, [], [], weight_decay * wd_f if ROLES[role].decay else 0.0, lr_f)
        groups[role].names.append(name)
        groups[role].params.append(p)
    return list(groups.values()), kept


class OptimizerChain:
    """Several torch optimizers stepping as one (e.g. Muon on hidden matrices, AdamW on the rest).

    ``param_groups`` is the concatenation of the parts' groups (the same dicts, so the loop's learning-rate updates
    reach every part); ``step``, ``zero_grad`` run each part; ``state_dict`` is one optimizer-style dict (global
    parameter indices, each group tagged with its ``part``), which :mod:`modkit.train.state` saves like any other, and
    ``load_state_dict`` splits it back. ``torch.amp.GradScaler`` accepts it (it reads ``param_groups``).
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]):
        if not optimizers:
            raise OptimizerError("an optimizer chain needs at least one optimizer")
        self.optimizers = list(optimizers)

    @property
    def param_groups(self) -> list[dict]:
        """Every part's param groups, in part order."""
        return [g for opt in self.optimizers for g in opt.param_groups]

    @property
    def state(self) -> dict:
        """Per-parameter state of every part (a merged view)."""
        out: dict = {}
        for opt in self.optimizers:
            out.update(opt.state)
        return out

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every part (``closure`` evaluated once, by the first)."""
        loss = None
        for i, opt in enumerate(self.optimizers):
            out = opt.step(closure if i == 0 else None)
            loss = out if i == 0 else loss
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear every part's gradients."""
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """``{"state": {global index: ...}, "param_groups": [... {"part": k, "params": [global indices]}]}``."""
        state, groups, offset = {}, [], 0
        for k, opt in enumerate(self.optimizers):
            sd = opt.state_dict()
            n = sum(len(g["params"]) for g in sd["param_groups"])
            for g in sd["param_groups"]:
                groups.append({**g, "part": k, "params": [i + offset for i in g["params"]]})
            for i, s in sd["state"].items():
                state[int(i) + offset] = s
            offset += n
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Split a :meth:`state_dict` back into the parts.

        Raises:
            ValueError: the dict was saved by a chain of other parts.
        """
        offset = 0
        for k, opt in enumerate(self.optimizers):
            groups = [g for g in state_dict["param_groups"] if g.get("part") == k]
            if len(groups) != len(opt.param_groups):
                raise ValueError(
                    f"optimizer state of part {k} has {len(groups)} param groups, the optimizer {len(opt.param_groups)}"
                )
            n = sum(len(g["params"]) for g in opt.param_groups)
            own = {i - offset: s for i, s in state_dict["state"].items() if offset <= int(i) < offset + n}
            parts = [
                {key: v for key, v in g.items() if key != "part"} | {"params": [i - offset for i in g["params"]]}
                for g in groups
            ]
            opt.load_state_dict({"state": own, "param_groups": parts})
            offset += n


def load_optimizer_config(data: Any, registry=None):
    """Validate an ``optimizer`` config (``{"type": "adamw"}``) against the registry.

    Raises:
        SpecError: unknown type (with close matches) or invalid fields (paths relative to the optimizer).
    """
    from ..spec import load_component

    return load_component(KIND, data, registry=registry)


def build_optimizer(model: nn.Module, spec: Any, config: Any, *, distributed: bool = False, registry=None):
    """The optimizer a training config names, over ``model``'s parameters grouped by role.

    Args:
        model: the model to train. spec: its spec (μP factors). config: the :class:`~modkit.train.TrainConfig`.
        distributed: several processes (FSDP2 / tensor parallel): only optimizers with the ``sharded`` capability.

    Returns:
        A ``torch.optim.Optimizer`` or :class:`OptimizerChain`, every param group with an ``lr_mult``.

    Raises:
        RoleError: a bad role declaration (names the declaring class). OptimizerError: μP with an optimizer
            without a ``mup`` rule; a non-sharded optimizer under torchrun; a factory that returned something else.
        SpecError: an invalid optimizer config.
    """
    from modkit.core.registry import get_registry

    reg = registry or get_registry()
    cfg = load_optimizer_config(config.optimizer, registry=reg)
    entry = reg.get(KIND, cfg.type)
    if distributed and not entry.capabilities.get("sharded"):
        raise OptimizerError(
            f"optimizer {cfg.type!r} ({entry.provider}) does not declare the 'sharded' capability: its "
            "step is not known to be correct on FSDP2 / tensor-parallel shards; train on one process or "
            "use an optimizer that declares it (adamw, lion, sgd)"
        )
    groups, roles = role_groups(model, spec, config.weight_decay, entry.capabilities.get("mup"))
    if not groups:
        raise OptimizerError("the model has no trainable parameters")
    setup = OptimizerSetup(
        groups,
        config.lr,
        config.beta1,
        config.beta2,
        config.adam_eps,
        config.weight_decay,
        fused=not distributed,
        distributed=distributed,
        roles=roles,
    )
    opt = entry.factory(cfg, setup)
    if not isinstance(opt, (torch.optim.Optimizer, OptimizerChain)):
        raise OptimizerError(
            f"factory of optimizer/{cfg.type} ({entry.provider}) returned {type(opt).__name__}, "
            "not a torch.optim.Optimizer or modkit.train.optim.OptimizerChain"
        )
    for g in opt.param_groups:
        g.setdefault("lr_mult", 1.0)
    return opt


def parts(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside ``optimizer`` (itself, or a chain's parts), e.g. for ``torch.distributed.checkpoint``."""
    return list(optimizer.optimizers) if isinstance(optimizer, OptimizerChain) else [optimizer]
