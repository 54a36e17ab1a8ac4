"""Tensor-parallel plans composed from registry data: :func:`model_plan` and the :class:`TPPlan` it returns.

Each registry entry with weights declares a ``tp_plan`` capability relative to its own module; the composed plan
prefixes it with the module's path, adds the core's own layout (:data:`CORE_PLAN`) and is validated
(:mod:`modkit.parallel.plan_checks`) before any process group is involved.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from torch import nn

from modkit.core.registry import Registry, get_registry

from .errors import ParallelError, PlanWarning
from .plan_checks import (
    _MISSING,
    _attribute,
    _check_declared,
    _check_grouped,
    _check_head_param,
    _check_heads,
    _check_linear,
    _check_positions,
    _check_replicated_consumers,
    _entry_name,
    _join,
)
from .styles import _SHARDING, STYLES, GroupedParallel, PerHeadParallel

#: The core's own parallel layout, keyed by the ``modkit_kind`` tags the core puts on its modules (not
#: registry components): vocab-parallel embedding and LM head (torchtitan's ``tok_embeddings`` / ``output``).
CORE_PLAN: Mapping[str, str] = {"embedding": "rowwise", "lm_head": "colwise_gather"}

#: ``stacklevel`` of a warning raised two calls below :func:`model_plan`: it names the line calling model_plan
_CALLER_OF_MODEL_PLAN = 4


@dataclass
class TPPlan:
    """The composed tensor-parallel plan of one model for one degree (from :func:`model_plan`).

    Attributes:
        tp: the tensor-parallel degree it was validated for.
        styles: ``{module path: style}`` for every module that is sharded (``replicate`` entries are dropped); a
            ``heads`` entry's path names a parameter.
        sources: ``{module path: "kind/type"}`` (or ``"core:<kind>"``) naming the plan each entry came from.
        head_modules: paths of modules whose ``n_heads`` / ``n_kv_heads`` attributes become local counts.
        bias_positions: paths of position modules (``acts_on = "bias"``) whose ``attention_bias`` is sliced
            to this rank's heads.
        replicated: ``{component path: reason}`` for components with weights that stay whole on every rank
            for want of a plan (each also produced a :class:`PlanWarning`), or the vocab fallback.
        embeddings: paths of ``nn.Embedding`` modules among ``styles`` (their ``rowwise`` input is the replicated
            token ids, not a feature shard).
    """

    tp: int
    styles: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    head_modules: list[str] = field(default_factory=list)
    bias_positions: list[str] = field(default_factory=list)
    replicated: dict[str, str] = field(default_factory=dict)
    embeddings: list[str] = field(default_factory=list)

    def parallel_styles(self) -> dict[str, Any]:
        """``{path: ParallelStyle}`` for ``torch.distributed.tensor.parallel.parallelize_module``."""
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        out: dict[str, Any] = {}
        for path, style in self.styles.items():
            if style == "grouped":
                out[path] = GroupedParallel()
            elif style == "per_head":
                out[path] = PerHeadParallel()
            elif style == "colwise":
                out[path] = ColwiseParallel()
            elif style == "colwise_gather":
                out[path] = ColwiseParallel(output_layouts=Replicate())
            elif style == "rowwise" and path in self.embeddings:
                out[path] = RowwiseParallel(input_layouts=Replicate())
            elif style == "rowwise":
                out[path] = RowwiseParallel()
        return out

    def describe(self) -> list[str]:
        """One human line per sharded module: ``path: style (from kind/type)``."""
        return [f"{p}: {s} (from {self.sources.get(p, '?')})" for p, s in self.styles.items()]


def _tagged(module: nn.Module) -> bool:
    return getattr(module, "modkit_type", None) is not None or getattr(module, "modkit_kind", None) in CORE_PLAN


def _owned_params(module: nn.Module) -> int:
    """Parameters of ``module`` not inside a nested tagged component (those answer for themselves)."""
    n = sum(p.numel() for p in module.parameters(recurse=False))
    for child in module.children():
        if not _tagged(child):
            n += _owned_params(child)
    return n


def model_plan(model: nn.Module, tp: int, *, registry: Optional[Registry] = None) -> TPPlan:
    """Compose and validate the tensor-parallel plan of ``model`` for degree ``tp`` (no process group needed).

    Walks ``model.named_modules()``; a module tagged with ``modkit_kind`` / ``modkit_type`` contributes its
    registry entry's ``tp_plan`` prefixed with its path; modules tagged ``embedding`` / ``lm_head`` follow
    :data:`CORE_PLAN`. Works on a ``meta`` model (pure shape arithmetic), so a layout can be checked on a laptop
    for an 8B spec before any GPU is involved.

    Args:
        model: a built model (any device, ``meta`` included), before parallelisation.
        tp: tensor-parallel degree (>= 1).
        registry: the registry the model was built from (default: the process-wide one).

    Returns:
        :class:`TPPlan`; with ``tp = 1`` an empty plan.

    Raises:
        ParallelError: ``tp`` does not divide ``n_heads`` or ``n_kv_heads`` of an attention module (or a sharded
            ``nn.Linear`` width); a plan uses an unknown style, names a missing submodule or a module that is
            not ``nn.Linear`` / ``nn.Embedding``; a replicated 1-D parameter is as wide as a sharded output; a
            component that shards something leaves a parameter undeclared (it could get a partial gradient);
            a position scheme with parameters acts on q/k while attention heads are sharded.
        RegistryError: a tagged module's ``(kind, type)`` is not in the registry.

    Warns:
        PlanWarning: a component with weights declares no ``tp_plan`` (replicated), or the vocabulary is not
            divisible by ``tp`` (embedding and head replicated).
    """
    if not isinstance(tp, int) or tp < 1:
        raise ParallelError(f"tensor-parallel degree must be a positive integer, got {tp!r}")
    plan = TPPlan(tp=tp)
    if tp == 1:
        return plan
    reg = registry or get_registry()
    walk = _Composer(plan, reg, dict(model.named_modules()))
    tied = bool(getattr(getattr(model, "spec", None), "tie_embeddings", False))
    for path, module in walk.modules.items():
        if any(path.startswith(c + ".") for c in walk.covered):
            continue
        kind, typ = getattr(module, "modkit_kind", None), getattr(module, "modkit_type", None)
        if typ is None:
            if kind in CORE_PLAN:
                _core_entry(plan, path, module, kind, tied)
            continue
        entry = reg.get(kind, typ)
        comp_plan = entry.capabilities.get("tp_plan")
        if comp_plan is None:
            walk.unplanned_component(path, module, entry)
        elif not isinstance(comp_plan, Mapping):
            raise ParallelError(
                f"{_entry_name(entry)} ({entry.provider}): tp_plan must be a mapping, got {comp_plan!r}"
            )
        else:
            walk.component(path, module, entry, comp_plan)
    if plan.head_modules:
        _check_positions(walk.modules, reg, tp)
    _warn_unplanned(walk.unplanned, tp)
    return plan


def _warn_unplanned(unplanned: Mapping[str, list[str]], tp: int) -> None:
    """One :class:`PlanWarning` per component without a ``tp_plan`` (``{"kind/type (plugin p)": [paths]}``)."""
    for name, paths in unplanned.items():
        shown = ", ".join(paths[:4]) + (f", ... ({len(paths)} in all)" if len(paths) > 4 else "")
        warnings.warn(
            f"component {name} declares no tp_plan capability; its parameters are replicated on every "
            f"tensor-parallel rank (tp = {tp}) at {shown}. Declare e.g. capabilities={{'tp_plan': "
            "{'up': 'colwise', 'down': 'rowwise'}}} to shard it, or {} to say replication is intended.",
            PlanWarning,
            stacklevel=3,  # the line calling model_plan
        )


@dataclass
class _Composer:
    """The state of one :func:`model_plan` walk over ``model.named_modules()``.

    Attributes:
        plan: the plan being composed.
        reg: the registry the model was built from.
        modules: ``{path: module}`` of the whole model.
        unplanned: ``{"kind/type (plugin p)": [paths]}`` of components with weights and no ``tp_plan``.
        covered: submodules an enclosing component's plan declares: that plan answers for them.
    """

    plan: TPPlan
    reg: Registry
    modules: dict[str, nn.Module]
    unplanned: dict[str, list[str]] = field(default_factory=dict)
    covered: list[str] = field(default_factory=list)

    def unplanned_component(self, path: str, module: nn.Module, entry) -> None:
        """A component that declares no ``tp_plan``: replicated (warned about later) if it owns parameters."""
        n = _owned_params(module)
        if n:
            self.unplanned.setdefault(f"{_entry_name(entry)} (plugin {entry.provider})", []).append(path or "<root>")
            self.plan.replicated[path] = f"{_entry_name(entry)} declares no tp_plan ({n} parameters replicated)"
        if getattr(module, "modkit_kind", None) == "position" and entry.capabilities.get("acts_on") == "bias":
            self.plan.bias_positions.append(path)

    def component(self, path: str, module: nn.Module, entry, comp_plan: Mapping[str, str]) -> None:
        """Add the items of one component's ``tp_plan`` (prefixed with ``path``) and check the component.

        Raises:
            ParallelError: see :func:`model_plan`.
        """
        plan, tp = self.plan, self.plan.tp
        sharded_here: list[str] = []
        declared: list[str] = []
        if any(style in _SHARDING for style in comp_plan.values()):
            _check_heads(path, module, tp)  # before the widths: the head counts are the message that helps
        for sub, style in comp_plan.items():
            if style not in STYLES:
                raise ParallelError(
                    f"{_entry_name(entry)} ({entry.provider}): tp_plan[{sub!r}] = {style!r} is not a style; "
                    f"use one of {sorted(STYLES)}"
                )
            outcome = self._item(path, module, entry, sub, style)
            if outcome != "absent":
                declared.append(_join(path, sub))
            if outcome == "sharded":
                sharded_here.append(_join(path, sub))
        self.covered.extend(declared)
        per_head = [p for p in declared if plan.styles.get(p) == "per_head"]
        if per_head and not sharded_here:
            raise ParallelError(
                f"{_entry_name(entry)} ({entry.provider}): tp_plan declares {per_head[0]} 'per_head' but shards "
                f"nothing in {path or '<root>'}, so its input holds every head: summing its gradient over the "
                f"tp = {tp} ranks would multiply it by tp. 'per_head' belongs in the plan of a component that "
                "shards its heads"
            )
        if getattr(module, "modkit_kind", None) == "position" and entry.capabilities.get("acts_on") == "bias":
            plan.bias_positions.append(path)
        if sharded_here:
            _check_replicated_consumers(path, module, {p: self.modules[p] for p in sharded_here}, plan.styles, tp)
            _check_declared(path, module, _entry_name(entry), declared, sharded_here, self.reg, tp)
            heads = any(isinstance(getattr(module, a, None), int) for a in ("n_heads", "n_kv_heads"))
            if heads and path not in plan.head_modules:  # once: a 'heads' parameter may have listed it already
                plan.head_modules.append(path)

    def _item(self, path: str, module: nn.Module, entry, sub: str, style: str) -> str:
        """Add one item ``sub: style`` of the plan of the component at ``path``.

        Returns:
            ``"absent"`` (an optional submodule or parameter this configuration does not have), ``"declared"``
                (left whole or replicated per head: the plan answers for it) or ``"sharded"`` (also declared).

        Raises:
            ParallelError: see :func:`model_plan`.
        """
        plan, full, source = self.plan, _join(path, sub), _entry_name(entry)
        if style == "heads":  # a per-head parameter, not a submodule
            if _attribute(module, sub) is None:  # an optional parameter this configuration does not have
                return "absent"
            _check_head_param(full, module, sub, plan.tp, source)
            plan.styles[full], plan.sources[full] = style, source
            if path not in plan.head_modules:
                plan.head_modules.append(path)
            return "declared"  # sharded with the heads: each rank's gradient is its own shard's
        target = self.modules.get(full)
        if target is None:
            return _not_a_submodule(path, module, entry, sub, style)
        if style == "replicate":
            return "declared"
        if style == "per_head":
            _check_per_head(full, module, target, source, sub)
            if next(target.parameters(), None) is not None:  # no weights: no gradient to sum, nothing to wrap
                plan.styles[full], plan.sources[full] = style, source
            return "declared"
        if style == "grouped" and not _check_grouped(full, target, plan.tp, source):
            plan.replicated[full] = f"{type(target).__name__} declares no tp_shard_dims (output bias)"
            warnings.warn(
                f"{full} ({source}): {type(target).__name__} has tp_shard_dims None (an output bias "
                "would be added tp times); it stays replicated",
                PlanWarning,
                stacklevel=_CALLER_OF_MODEL_PLAN,
            )
            return "declared"
        if style != "grouped":
            _check_linear(full, target, style, plan.tp, source)
        plan.styles[full], plan.sources[full] = style, source
        if isinstance(target, nn.Embedding):
            plan.embeddings.append(full)
        return "sharded"


def _not_a_submodule(path: str, module: nn.Module, entry, sub: str, style: str) -> str:
    """A plan item naming no submodule: ``"absent"`` (an optional one that is ``None``) or ``"declared"`` (a
    parameter declared ``replicate``).

    Raises:
        ParallelError: the item names nothing, or a parameter with a style other than ``replicate``.
    """
    found = _attribute(module, sub)
    if found is None:  # an optional submodule this configuration does not have (e.g. no QK-norm)
        return "absent"
    if isinstance(found, nn.Parameter) and style == "replicate":
        return "declared"
    raise ParallelError(
        f"{_entry_name(entry)} ({entry.provider}): tp_plan names {sub!r} but {path or '<root>'} has no "
        f"submodule of that name{' (a parameter can only be declared replicate)' if found is not _MISSING else ''}; "
        f"its children are {[n for n, _ in module.named_children()]}"
    )


def _check_per_head(full: str, module: nn.Module, target: nn.Module, source: str, sub: str) -> None:
    """A ``per_head`` target holds no weight with a row per head (that would need sharding with the heads).

    Raises:
        ParallelError: ``target`` has a parameter ``[n_heads or n_kv_heads, ...]``.
    """
    heads = {getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
    grouped = [n for n, prm in target.named_parameters() if prm.dim() > 1 and prm.shape[0] in heads]
    if grouped:  # a weight per head ([heads, dim]) would need sharding with the heads, not replication
        raise ParallelError(
            f"{full}.{grouped[0]} (shape {list(target.get_parameter(grouped[0]).shape)}): plan of "
            f"{source} applies {sub!r} 'per_head' (one replicated weight for every local head), "
            "but this weight has a row per head (e.g. qk_norm_scope 'each_head'); such a model cannot be "
            "tensor-parallel yet: use qk_norm_scope 'head' or train it without tp"
        )


def _core_entry(plan: TPPlan, path: str, module: nn.Module, kind: str, tied: bool) -> None:
    style = CORE_PLAN[kind]
    if tied:
        plan.replicated[path] = "tied embeddings: the head multiplies by embed.weight directly"
        return
    rows = getattr(module, "num_embeddings", None) or getattr(module, "out_features", None)
    if rows is None or rows % plan.tp:
        plan.replicated[path] = f"vocab_size = {rows} is not divisible by tp = {plan.tp}"
        warnings.warn(
            f"{path} ({kind}): vocab_size = {rows} is not divisible by tp = {plan.tp}; it stays replicated on "
            "every tensor-parallel rank",
            PlanWarning,
            stacklevel=3,
        )
        return
    _check_linear(path, module, style, plan.tp, f"core:{kind}")
    plan.styles[path] = style
    plan.sources[path] = f"core:{kind}"
    if isinstance(module, nn.Embedding):
        plan.embeddings.append(path)
