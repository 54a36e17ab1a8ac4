"""What training needs: ``gradients`` reach every parameter, ``dropout`` is what the capability says, and
``aux_loss_grad``: an auxiliary loss reaches the router.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor, nn

from modkit.core.config import ComponentConfig, slot_kinds
from modkit.core.registry import Component
from ..harness import Bench, qualified_names
from .base import (
    SAME_MATH_ULPS,
    CheckFailed,
    CheckSkipped,
    fmt,
    fork_rng,
    max_abs_diff,
    nonfinite,
    tolerance,
    transplant,
    unique_modules,
)


def check_gradients(bench: Bench) -> str:
    """Every parameter of the component receives a finite, non-zero gradient from a loss on the logits.

    A tiny model holding the component runs ``4 x 16`` random tokens (enough that a router spreads tokens over
    every expert); the loss is the logits projected on a random direction plus the aux loss, so every logit matters.

    Catches: a parameter the forward never uses (the ``idle_param`` fixture), an expert no token reaches, a
    ``.detach()`` or ``torch.no_grad`` in the forward. Source: a parameter that never learns is dead weight or a
    wiring bug (Megatron-LM #1617 for routers that get no gradient).
    """
    model, records = bench.build()
    model.train()
    modules = unique_modules(bench.targets(records))
    names = qualified_names(model)
    params: list[tuple[str, nn.Parameter]] = []
    seen: set[int] = set()
    for m in modules:
        for n, p in m.named_parameters():
            if id(p) not in seen:
                seen.add(id(p))
                params.append((f"{names.get(id(m), '?')}.{n}", p))
    if not params:
        raise CheckSkipped("the component has no parameters")
    ids = bench.ids(4, 16, seed=5)
    out = model(ids)
    direction = bench.randn(*out.logits.shape, seed=6)
    loss = (out.logits.float() * direction).sum()
    if out.aux_loss is not None:
        loss = loss + out.aux_loss.float()
    loss.backward()
    problems = []
    for n, p in params:
        if not p.requires_grad:
            continue
        if p.grad is None:
            problems.append(f"{n}: no gradient (grad is None)")
        elif nonfinite(p.grad):
            problems.append(f"{n}: {nonfinite(p.grad)} non-finite gradient value(s)")
        elif not bool(p.grad.abs().max() > 0):
            problems.append(f"{n}: gradient is exactly zero")
    if problems:
        more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
        raise CheckFailed(f"{len(problems)} of {len(params)} parameters: " + "; ".join(problems[:4]) + more)
    total = sum(p.numel() for _, p in params)
    return f"all {len(params)} parameters ({total:,} values) got finite non-zero gradients from 64 tokens"


#: ``{capability: (slot kind that declares it, spec dropout field)}``: the dropout a component may claim to apply
#: (``"mixer"``: a token mixer of any kind, :func:`~modkit.core.config.slot_kinds`).
DROPOUT_CAPABILITIES = {"attention_dropout": ("mixer", "attention"), "residual_dropout": ("placement", "residual")}
#: Dropout probability of the ``dropout`` check (large, so a dropped element is never missed).
DROPOUT_P = 0.5


def applies_dropout(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Components that declare ``attention_dropout`` (a token mixer of any kind) or ``residual_dropout`` (placement)."""
    if any(entry.capabilities.get(c) and entry.kind in slot_kinds(k) for c, (k, _) in DROPOUT_CAPABILITIES.items()):
        return None
    return "the entry declares no dropout capability (attention_dropout, residual_dropout)"


def check_dropout(bench: Bench) -> str:
    """A component declaring a dropout capability is stochastic in train mode and deterministic in eval mode.

    The tiny model with the spec's dropout at 0.5 for what the component declares (``dropout.attention`` for
    ``attention_dropout``, ``dropout.residual`` for ``residual_dropout``), everything else 0: in train mode two
    forwards with different seeds differ and two with the same seed agree; in eval mode two forwards agree and equal
    the same weights built with no dropout at all.

    Catches: a capability that is claimed but not applied (``fake_dropout``: validation then accepts a rate that
    does nothing), dropout left on in eval (``F.dropout(x, p)`` defaults to ``training=True``), a rate read from the
    wrong field.
    """
    fields = [
        f
        for c, (k, f) in DROPOUT_CAPABILITIES.items()
        if bench.entry.capabilities.get(c) and bench.entry.kind in slot_kinds(k)
    ]
    spec = {**bench.spec, "dropout": {f: DROPOUT_P for f in fields}}
    model, _ = bench.build(spec)
    plain, _ = bench.build()
    transplant(model, plain)
    ids = bench.ids(2, 16, seed=111)
    with torch.no_grad():
        model.train()
        with fork_rng(1):
            a = model(ids).logits
        with fork_rng(2):
            b = model(ids).logits
        with fork_rng(1):
            again = model(ids).logits
        model.eval(), plain.eval()
        e1, e2, ref = model(ids).logits, model(ids).logits, plain(ids).logits
    tol = tolerance(ref, torch.float32, SAME_MATH_ULPS)
    rates = ", ".join(f"dropout.{f} = {DROPOUT_P}" for f in fields)
    train_diff = max_abs_diff(a, b).max().item()
    if train_diff <= tol:
        raise CheckFailed(
            f"with {rates} two training-mode forwards (different seeds) give the same logits (max |Δ| = "
            f"{fmt(train_diff)}): the declared dropout is not applied"
        )
    if max_abs_diff(a, again).max().item() > tol:
        raise CheckFailed(
            f"with {rates} two training-mode forwards with the same seed differ: draw from torch's generator"
        )
    eval_diff = max(max_abs_diff(e1, e2).max().item(), max_abs_diff(e1, ref).max().item())
    if eval_diff > tol:
        raise CheckFailed(
            f"with {rates} eval mode is not the model without dropout: max |Δ| = {fmt(eval_diff)} "
            f"(tolerance {fmt(tol)}); apply dropout in training mode only"
        )
    return f"{rates}: train mode random (max |Δ| between seeds = {fmt(train_diff)}), eval mode equals no dropout"


def applies_aux(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Entries with the ``aux_loss`` capability, and routers (checked through the mixture that holds them)."""
    if entry.capabilities.get("aux_loss") or entry.kind == "router":
        return None
    return "the entry does not declare aux_loss"


def check_aux_loss_grad(bench: Bench) -> str:
    """The aux loss alone back-propagates into the router: every parameter of every router gets a gradient.

    The model's ``aux_loss`` must be a finite scalar that carries a gradient; ``aux_loss.backward()`` must give
    every router parameter (modules of kind ``router`` inside the component, or the component itself when it is a
    router, placed in the built-in mixture of experts) a finite non-zero gradient; a component with the ``aux_loss``
    capability and no nested router must send it to at least one of its parameters.

    Catches: an aux loss computed from detached router logits (the ``detached_router`` fixture; the main loss still
    trains the router through the expert weights, so ``gradients`` passes); an aux loss that is a constant.
    Source: a known fault of MoE code (an aux loss whose gradient never reaches the router, Megatron-LM #1617).
    """
    model, records = bench.build()
    model.train()
    out = model(bench.ids(4, 16, seed=41))
    aux = out.aux_loss
    if aux is None:
        raise CheckFailed(
            "the model returned aux_loss = None"
            + (" with the router in it" if bench.entry.kind == "router" else " although the entry declares aux_loss")
        )
    if not isinstance(aux, Tensor) or aux.dim() != 0:
        raise CheckFailed(f"aux_loss must be a scalar tensor, got shape {tuple(getattr(aux, 'shape', ()))}")
    if nonfinite(aux):
        raise CheckFailed(f"aux_loss = {aux.item()} is not finite")
    if not aux.requires_grad:
        raise CheckFailed(
            f"aux_loss = {aux.item():.4g} carries no gradient (requires_grad = False): it is computed "
            "from detached tensors"
        )
    aux.backward()
    names = qualified_names(model)
    targets = unique_modules(bench.targets(records))
    routers = [m for t in targets for m in t.modules() if getattr(m, "modkit_kind", None) == "router"]
    pool = routers or targets
    got, missing = [], []
    for m in pool:
        for n, p in m.named_parameters():
            full = f"{names.get(id(m), '?')}.{n}"
            if p.grad is not None and bool(p.grad.abs().max() > 0) and not nonfinite(p.grad):
                got.append((full, p.grad.abs().max().item()))
            elif routers:
                missing.append(full)
    if missing:
        raise CheckFailed(f"aux_loss = {aux.item():.4g} gives no gradient to router parameter(s) {missing[:4]}")
    if not got:
        raise CheckFailed(f"aux_loss = {aux.item():.4g} gives no gradient to any parameter of the component")
    what = "router" if routers else "component"
    return f"aux_loss = {aux.item():.4g}; {what} gradients: " + ", ".join(f"{n} max |g| = {fmt(v)}" for n, v in got[:3])
