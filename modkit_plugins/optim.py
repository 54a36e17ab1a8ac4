"""Built-in optimizers: ``adamw``, ``muon`` (with AdamW for what is not a hidden matrix), ``lion`` and ``sgd``.

Each is an ``optimizer`` component (:mod:`modkit.train.optim`): ``factory(config, setup) -> optimizer`` over the
model's parameters grouped by role (:mod:`modkit.core.roles`). The training config's ``lr`` is the peak learning rate of
every parameter (times μP's factor under μP), its ``weight_decay`` the decoupled decay of roles that decay, its
``beta1`` / ``beta2`` / ``adam_eps`` those of every AdamW (``adamw``, and the AdamW part of ``muon``).

* ``adamw``: ``torch.optim.AdamW`` (fused on one process), nanoGPT's recipe: what modkit trained with before.
* ``muon``: ``torch.optim.Muon`` (Jordan et al. 2024, kellerjordan.github.io/posts/muon; the nanoGPT speedruns) on
  the ``hidden`` matrices: momentum, then the update orthogonalised by 5 Newton-Schulz iterations; stacked ``expert``
  matrices get the same update per expert (:class:`StackedMuon`, each ``[in, out]`` slice as the ``[out, in]`` matrix
  torch's Muon sees); embeddings, the head, norms, biases and routers train with AdamW. A plugin parameter without
  a declared role takes the inferred one (:func:`modkit.core.roles.param_roles`: a 2-D matrix ``hidden``, so Muon,
  anything else ``vector``, so AdamW), the same role μP scales it by, and training warns once per component type. With ``adjust_lr =
  "match_rms_adamw"`` (default; Liu et al. 2025, Muon is Scalable for LLM Training, arXiv:2502.16982) the update's
  RMS matches AdamW's, so Muon reuses AdamW's learning rate and weight decay.
* ``lion``: Lion (Chen et al. 2023, Symbolic Discovery of Optimization Algorithms, arXiv:2302.06675, Program 1):
  ``p -= lr (sign(β1 m + (1 - β1) g) + λ p)``, then ``m = β2 m + (1 - β2) g``; not in torch, so :class:`Lion` here.
  The paper's learning rate is 3-10x smaller than AdamW's and its weight decay as much larger.
* ``sgd``: ``torch.optim.SGD`` with momentum (coupled L2 weight decay, as torch defines it).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor

from modkit.plugin import Component, ComponentConfig, hookimpl, OptimizerChain, OptimizerSetup, ROLES

#: Newton-Schulz quintic coefficients and steps of Muon (Jordan 2024; the defaults of torch.optim.Muon)
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


class AdamWConfig(ComponentConfig):
    """Config of ``adamw``: the training config's lr, betas (beta1, beta2), adam_eps and weight_decay."""

    type: Literal["adamw"] = "adamw"


class MuonConfig(ComponentConfig):
    """Config of ``muon``: Muon on matrix roles, AdamW (the training config's betas) on the others."""

    type: Literal["muon"] = "muon"
    momentum: float = Field(0.95, ge=0, lt=1, description="Muon's momentum (0.95 in the speedruns)")
    nesterov: bool = Field(True, description="Nesterov momentum (the update is g + momentum * buffer)")
    ns_steps: int = Field(5, ge=1, le=99, description="Newton-Schulz iterations orthogonalising the update")
    adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw",
        description="'match_rms_adamw': lr * 0.2 * sqrt(max(A, B)) so Muon reuses AdamW's lr and weight decay "
        "(Moonshot); 'original': lr * sqrt(max(1, A / B)) (Keller Jordan; pair it with lr_multiplier ~ 20)",
    )
    lr_multiplier: float = Field(
        1.0, gt=0, le=1e4, description="Muon's learning rate is the scheduled lr times this (AdamW's part keeps lr)"
    )
    roles: list[Literal["hidden", "expert"]] = Field(
        ["hidden", "expert"], min_length=1, description="matrix roles Muon updates; every other role trains with AdamW"
    )


class LionConfig(ComponentConfig):
    """Config of ``lion``: its own betas; the training config's lr and weight_decay."""

    type: Literal["lion"] = "lion"
    beta1: float = Field(0.9, ge=0, lt=1, description="interpolation of momentum and gradient whose sign is the update")
    beta2: float = Field(0.99, ge=0, lt=1, description="decay of the momentum")


class SGDConfig(ComponentConfig):
    """Config of ``sgd``: torch.optim.SGD with momentum; the training config's lr and weight_decay (coupled L2)."""

    type: Literal["sgd"] = "sgd"
    momentum: float = Field(0.9, ge=0, lt=1, description="momentum factor")
    dampening: float = Field(0.0, ge=0, lt=1, description="dampening of the momentum")
    nesterov: bool = Field(False, description="Nesterov momentum (needs momentum > 0 and dampening = 0)")

    @model_validator(mode="after")
    def _nesterov(self) -> "SGDConfig":
        if self.nesterov and (self.momentum == 0 or self.dampening != 0):
            raise ValueError(
                f"nesterov needs momentum > 0 and dampening = 0; got momentum = {self.momentum}, "
                f"dampening = {self.dampening}"
            )
        return self


# ----------------------------------------------------------------------------------------------------- Lion


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, arXiv:2302.06675, Program 1), per parameter ``p`` with gradient ``g``::

        c = β1 m + (1 - β1) g;  p = p (1 - lr λ) - lr sign(c);  m = β2 m + (1 - β2) g

    State: ``exp_avg`` (``m``, shaped like ``p``). Element-wise, so it runs on FSDP2 / tensor-parallel shards.

    Args:
        params: parameters or param groups; lr: learning rate; betas: ``(β1, β2)``; weight_decay: ``λ`` (decoupled).

    Raises:
        ValueError: a negative learning rate or weight decay, a beta outside ``[0, 1)``.
    """

    def __init__(self, params, lr: float = 1e-4, betas: tuple[float, float] = (0.9, 0.99), weight_decay: float = 0.0):
        if lr < 0 or weight_decay < 0 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(
                f"Lion needs lr >= 0, weight_decay >= 0 and betas in [0, 1); got {lr}, {weight_decay}, {betas}"
            )
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        """One Lion step of every parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "exp_avg" not in state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, g = state["exp_avg"], p.grad
                update = (m * beta1 + g * (1 - beta1)).sign_()
                p.mul_(1 - lr * wd).add_(update, alpha=-lr)
                m.mul_(beta2).add_(g, alpha=1 - beta2)
        return loss


# ----------------------------------------------------------------------------------------------------- Muon


def newton_schulz(g: Tensor, steps: int, eps: float = 1e-7) -> Tensor:
    """The orthogonalised ``g [A, B]`` of Muon: ``steps`` quintic Newton-Schulz iterations in bfloat16 with
    :data:`NS_COEFFICIENTS`, on the wide orientation (Jordan 2024; the same operations as ``torch.optim.Muon``).

    Returns a bfloat16 ``[A, B]`` tensor whose singular values lie roughly in ``[0.5, 1.5]``.
    """
    a, b, c = NS_COEFFICIENTS
    x = g.bfloat16()
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        upd = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, upd, x, beta=a)
    return x.T if tall else x


class StackedMuon(torch.optim.Optimizer):
    """Muon on stacked matrices ``[n, in, out]`` (mixture-of-experts experts): each expert's slice ``W_e [in, out]``
    is updated exactly as ``torch.optim.Muon`` updates the ``nn.Linear``-layout matrix ``W_e.T [out, in]``.

    State: ``momentum_buffer`` (shaped like the parameter). Args as ``torch.optim.Muon`` (``adjust_lr_fn``:
    ``"original"`` or ``"match_rms_adamw"``).

    Raises:
        ValueError: a parameter that is not 3-dimensional.
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str = "original",
        eps: float = 1e-7,
    ):
        super().__init__(
            params,
            {
                "lr": lr,
                "weight_decay": weight_decay,
                "momentum": momentum,
                "nesterov": nesterov,
                "ns_steps": ns_steps,
                "adjust_lr_fn": adjust_lr_fn,
                "eps": eps,
            },
        )
        for group in self.param_groups:
            for p in group["params"]:
                if p.dim() != 3:
                    raise ValueError(
                        f"StackedMuon updates [n, in, out] stacks; got a parameter of shape {tuple(p.shape)}"
                    )

    @staticmethod
    def _adjusted(lr: float, fn: str, out_dim: int, in_dim: int) -> float:
        """The learning rate of one ``[out, in]`` matrix, computed as ``torch.optim.Muon`` computes it."""
        ratio = (
            0.2 * math.sqrt(max(out_dim, in_dim)) if fn == "match_rms_adamw" else math.sqrt(max(1, out_dim / in_dim))
        )
        return lr * ratio

    @torch.no_grad()
    def step(self, closure=None):
        """One step of every stacked parameter with a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, wd, mu = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                n, d_in, d_out = p.shape
                step_lr = self._adjusted(lr, group["adjust_lr_fn"], d_out, d_in)
                p.mul_(1 - lr * wd)
                for e in range(n):  # the [out, in] matrix torch's Muon sees is the slice's transpose
                    p[e].add_(newton_schulz(update[e].T, group["ns_steps"], group["eps"]).T, alpha=-step_lr)
        return loss


def _muon(cfg: MuonConfig, setup: OptimizerSetup):
    """torch Muon on 2-D matrix roles, :class:`StackedMuon` on 3-D ones, AdamW on every other role."""
    if not hasattr(torch.optim, "Muon"):
        raise ValueError("optimizer 'muon' needs torch.optim.Muon (torch >= 2.9); install a newer torch")
    chosen = setup.select(cfg.roles)
    flat = [g for g in chosen if ROLES[g.role].ndim == 2]
    stacked = [g for g in chosen if ROLES[g.role].ndim == 3]
    others = setup.select(exclude=cfg.roles)
    args = dict(momentum=cfg.momentum, nesterov=cfg.nesterov, ns_steps=cfg.ns_steps, adjust_lr_fn=cfg.adjust_lr)
    parts = []
    for groups, cls in ((flat, torch.optim.Muon), (stacked, StackedMuon)):
        if groups:
            pg = setup.param_groups(groups)
            for g in pg:
                g["lr_mult"] *= cfg.lr_multiplier
            parts.append(cls(pg, lr=setup.lr * cfg.lr_multiplier, **args))
    if others:
        parts.append(setup.adamw(others))
    if not parts:
        raise ValueError("the model has no parameters for muon")
    return OptimizerChain(parts)


@hookimpl
def register_components(register) -> None:
    """Register ``adamw``, ``muon``, ``lion`` and ``sgd``."""
    register(
        Component(
            kind="optimizer",
            type="adamw",
            config=AdamWConfig,
            factory=lambda cfg, setup: setup.adamw(),
            description="AdamW with decoupled weight decay on the roles that decay (matrices, embeddings, head, routers), "
            "none on norm gains, biases and vectors; the training config's lr, beta1, beta2, adam_eps, weight_decay.",
            reference="Loshchilov & Hutter 2019, Decoupled Weight Decay Regularization, arXiv:1711.05101 (torch.optim.AdamW); "
            "the decay rule of nanoGPT's configure_optimizers",
            capabilities={"mup": "adam", "sharded": True},
        )
    )
    register(
        Component(
            kind="optimizer",
            type="muon",
            config=MuonConfig,
            factory=_muon,
            description="Muon (momentum orthogonalised by Newton-Schulz) on hidden matrices, per expert on stacked expert "
            "matrices; AdamW on embeddings, the head, norm gains, biases, routers and vectors (the nanoGPT speedruns' split).",
            reference="Jordan et al. 2024, Muon: An optimizer for hidden layers in neural networks (kellerjordan.github.io/"
            "posts/muon), torch.optim.Muon; Liu et al. 2025, Muon is Scalable for LLM Training, arXiv:2502.16982",
            capabilities={"mup": "adam", "sharded": False},
            example={"type": "muon", "momentum": 0.95},
        )
    )
    register(
        Component(
            kind="optimizer",
            type="lion",
            config=LionConfig,
            factory=lambda cfg, setup: Lion(setup.param_groups(), lr=setup.lr, betas=(cfg.beta1, cfg.beta2)),
            description="Lion: the sign of an interpolation of momentum and gradient, decoupled weight decay; one state "
            "tensor per parameter. Use a learning rate 3-10x smaller than AdamW's.",
            reference="Chen et al. 2023, Symbolic Discovery of Optimization Algorithms, arXiv:2302.06675 (Program 1)",
            capabilities={"mup": "adam", "sharded": True},
        )
    )
    register(
        Component(
            kind="optimizer",
            type="sgd",
            config=SGDConfig,
            factory=lambda cfg, setup: torch.optim.SGD(
                setup.param_groups(), lr=setup.lr, momentum=cfg.momentum, dampening=cfg.dampening, nesterov=cfg.nesterov
            ),
            description="Stochastic gradient descent with (Nesterov) momentum and coupled L2 weight decay (torch.optim.SGD).",
            reference="Polyak 1964 (momentum); Sutskever et al. 2013, On the importance of initialization and momentum in "
            "deep learning (Nesterov form); torch.optim.SGD",
            capabilities={"mup": "sgd", "sharded": True},
        )
    )
