"""The check of optimizers (:mod:`modkit.train.optim`): they are not part of a model, so every model check but
``spec_roundtrip`` skips them and ``optimizer`` trains a tiny model that holds every parameter role with them.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component, Registry
from .base import CheckFailed, fmt

#: the tiny model of the optimizer check: every role of :data:`modkit.core.roles.ROLES` but ``vector`` (hidden, expert,
#: embedding, position, head, router, norm_gain, bias), built from built-in components
OPTIMIZER_SPEC = {
    "schema_version": 1,
    "name": "optimizer-check",
    "vocab_size": 64,
    "d_model": 32,
    "n_layers": 2,
    "max_seq_len": 16,
    "position": {"type": "learned"},
    "block": {
        "attention": {"type": "gqa", "n_heads": 4, "n_kv_heads": 2, "q_bias": True},
        "ffn": {"type": "mlp", "d_ff": 64},
        "norm": {"type": "layernorm"},
        "placement": {"type": "pre"},
    },
    "overrides": [
        {
            "layers": [1],
            "ffn": {
                "type": "moe",
                "n_experts": 4,
                "top_k": 2,
                "expert": {"type": "swiglu", "d_ff": 32},
                "router": {"type": "topk", "renormalize": True},
            },
        }
    ],
    "final_norm": {"type": "layernorm"},
    "tie_embeddings": False,
    "init_std": 0.1,
}


@dataclass
class OptimizerBench:
    """What the optimizer check runs on: an optimizer entry and its validated config."""

    entry: Component
    config: ComponentConfig
    registry: Registry


def applies_optimizer(entry: Component, config: ComponentConfig) -> Optional[str]:
    from ...train.optim import KIND

    return None if entry.kind == KIND else "applies to optimizers"


def _loss(model, ids: torch.Tensor) -> torch.Tensor:
    out = model(ids[:, :-1])
    ce = F.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), ids[:, 1:].reshape(-1))
    return ce + (out.aux_loss if out.aux_loss is not None else 0.0)


def _step(model, opt, ids: torch.Tensor, lr: float) -> float:
    for g in opt.param_groups:
        g["lr"] = lr * g["lr_mult"]
    loss = _loss(model, ids)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def check_optimizer(bench: OptimizerBench) -> str:
    """The optimizer trains a tiny model holding every parameter role, and resumes bitwise from its saved state.

    On :data:`OPTIMIZER_SPEC` (float32, CPU) with lr 1e-2 and weight decay 0.1: every trainable parameter is in
    exactly one param group, each group has an ``lr_mult``; six steps on one fixed batch lower its loss and change
    every parameter that got a gradient; the optimizer state after three steps, saved as a run checkpoint saves it
    (:func:`modkit.train.state.optimizer_to_files`, the JSON part through ``json.dumps``), loaded into a fresh model
    and optimizer, gives three more steps bitwise equal to the uninterrupted run. A μP copy of the model builds too
    when the entry declares the ``mup`` capability.

    Catches: a parameter left out of every group (it never trains), one in two groups (updated twice), state that does
    not survive a checkpoint (a tuple turned list, a Python scalar the files drop), an update that ignores the
    learning rate the loop sets, a loss that does not go down. Source: resumable, bitwise training is a modkit
    contract (:mod:`modkit.train.state`); optimizers that select tensors by name mistreat new components.
    """
    from modkit.nn.build import build
    from ...spec import load_spec
    from ...train.config import TrainConfig
    from ...train.optim import build_optimizer

    config = TrainConfig(optimizer=bench.config.model_dump(mode="json"), lr=1e-2, weight_decay=0.1)
    spec = load_spec(OPTIMIZER_SPEC, registry=bench.registry)
    model = build(spec, seed=0, registry=bench.registry)
    opt = build_optimizer(model, spec, config, registry=bench.registry)
    ids = torch.randint(0, 64, (4, 17), generator=torch.Generator().manual_seed(7))
    members = _group_members(model, opt)
    start = [p.detach().clone() for p in model.parameters()]
    losses = [_step(model, opt, ids, 1e-2) for _ in range(3)]
    saved = _saved_state(model, opt)
    losses += [_step(model, opt, ids, 1e-2) for _ in range(3)]
    final = _check_trained(model, ids, losses, start)
    _check_resumes(bench, spec, config, saved, ids, losses, model)
    mup = _mup_note(bench, config)
    return (
        f"{len(members)} parameters in {len(opt.param_groups)} group(s); loss {fmt(losses[0])} -> {fmt(final)} in 6 steps; "
        f"resumed from saved state: steps 4-6 bitwise equal{mup}"
    )


def _group_members(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[int, int]:
    """``{id(parameter): number of param groups holding it}``.

    Raises:
        CheckFailed: a group without ``lr_mult``, a trainable parameter in no group, or one in several.
    """
    members: dict[int, int] = {}
    for g in opt.param_groups:
        if "lr_mult" not in g:
            raise CheckFailed("a param group has no 'lr_mult' (the loop sets lr * lr_mult every step)")
        for p in g["params"]:
            members[id(p)] = members.get(id(p), 0) + 1
    names = {id(p): n for n, p in model.named_parameters()}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in members]
    twice = [names.get(i, "?") for i, k in members.items() if k > 1]
    if missing or twice:
        raise CheckFailed(f"parameters in no param group: {missing[:4]}; in several: {twice[:4]}")
    return members


def _saved_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[dict, dict, dict]:
    """``(model state, optimizer tensors, optimizer data)`` as a run checkpoint holds them: copies, and the JSON part
    through ``json.dumps`` (:func:`modkit.train.state.optimizer_to_files`)."""
    from ...train.state import optimizer_to_files

    saved_model = copy.deepcopy(model.state_dict())
    tensors, data = optimizer_to_files(opt)
    tensors = {
        k: v.clone() for k, v in tensors.items()
    }  # what a checkpoint file holds: a copy (on the CPU .cpu() is not one)
    data = json.loads(json.dumps(data))
    return saved_model, tensors, data


def _check_trained(model: torch.nn.Module, ids: torch.Tensor, losses: list[float], start: list[torch.Tensor]) -> float:
    """The loss on ``ids`` after the six steps (returned) must be below the first step's, and every trainable
    parameter must differ from its value at ``start``.

    Raises:
        CheckFailed: the loss did not go down, or a parameter never changed.
    """
    with torch.no_grad():
        final = float(_loss(model, ids))
    if not final < losses[0]:
        raise CheckFailed(
            f"six steps at lr 1e-2 did not lower the loss of one fixed batch: {fmt(losses[0])} -> {fmt(final)}"
        )
    unchanged = [
        n for (n, p), s in zip(model.named_parameters(), start) if p.requires_grad and torch.equal(p.detach(), s)
    ]
    if unchanged:
        raise CheckFailed(f"{len(unchanged)} parameter(s) never changed in six steps: {unchanged[:4]}")
    return final


def _check_resumes(
    bench: OptimizerBench,
    spec: Any,
    config: Any,
    saved: tuple[dict, dict, dict],
    ids: torch.Tensor,
    losses: list[float],
    model: torch.nn.Module,
) -> None:
    """A fresh model and optimizer loaded from ``saved`` (after step 3) must give steps 4-6 bitwise equal to the
    uninterrupted run: its ``losses[3:]`` and the final parameters of ``model``.

    Raises:
        CheckFailed: the saved optimizer state does not load back, or the losses or parameters differ.
    """
    from modkit.nn.build import build
    from ...train.optim import build_optimizer
    from ...train.state import optimizer_from_files

    saved_model, tensors, data = saved
    again = build(spec, seed=0, registry=bench.registry)
    again.load_state_dict(saved_model)
    opt2 = build_optimizer(again, spec, config, registry=bench.registry)
    try:
        opt2.load_state_dict(optimizer_from_files(tensors, data))
    except Exception as exc:  # noqa: BLE001 - the component's fault, reported
        raise CheckFailed(f"the saved optimizer state does not load back: {type(exc).__name__}: {exc}") from None
    resumed = [_step(again, opt2, ids, 1e-2) for _ in range(3)]
    if resumed != losses[3:]:
        raise CheckFailed(
            f"resumed from the saved state, steps 4-6 give losses {resumed}, the uninterrupted run {losses[3:]}"
        )
    diff = [n for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters()) if not torch.equal(a, b)]
    if diff:
        raise CheckFailed(f"resumed from the saved state, {len(diff)} parameter(s) differ after step 6: {diff[:4]}")


def _mup_note(bench: OptimizerBench, config: Any) -> str:
    """``"; muP (m = 2) lr multipliers [...]"`` when the entry declares ``mup`` (a μP copy of the model, built on
    ``meta``, gets an optimizer), else ``""``.

    Raises:
        CheckFailed: it declares ``mup`` but the μP model's optimizer does not build.
    """
    if not bench.entry.capabilities.get("mup"):
        return ""
    from modkit.nn.build import build
    from ...spec import load_spec
    from ...train.optim import OptimizerError, build_optimizer

    wide = load_spec(
        {**OPTIMIZER_SPEC, "parametrization": {"type": "mup", "base_d_model": 16}}, registry=bench.registry
    )
    try:
        opt3 = build_optimizer(
            build(wide, device="meta", registry=bench.registry), wide, config, registry=bench.registry
        )
    except OptimizerError as exc:
        raise CheckFailed(
            f"declares mup = {bench.entry.capabilities['mup']!r} but a muP model does not build: {exc}"
        ) from None
    mults = sorted({round(g["lr_mult"], 6) for g in opt3.param_groups})
    return f"; muP (m = 2) lr multipliers {mults}"
