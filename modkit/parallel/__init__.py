"""Scaling out: tensor parallelism composed from per-component plans, FSDP2, sharded init and checkpoints.

The flow, for a model that never exists whole on any rank::

    mesh  = modkit.parallel.make_mesh(tp=2)                      # ("dp", "tp") device mesh over the world
    model = modkit.build(spec, device="meta")                    # structure only, no memory
    modkit.parallel.parallelize(model, mesh)                     # TP styles + fully_shard, still on meta
    modkit.parallel.materialize(model, seed=0)                   # to_empty: each rank allocates its shard;
                                                                 # init_weights writes each rank's slice
    # or all of it at once: modkit.parallel.build_parallel(spec, mesh, seed=0)

**Plans as data.** Each registry entry with weights declares a ``tp_plan`` capability relative to its own
module, ``{submodule path: style}`` (attention: q/k/v ``colwise``, o ``rowwise``, a per-head QK-norm
``per_head``; gated FFN: gate/up ``colwise``, down ``rowwise``; MoE: experts ``grouped``, router ``replicate``;
norms, routers, learned positions: ``{}``, replicated). :func:`model_plan` walks
``model.named_modules()``, looks each tagged module (``modkit_kind`` / ``modkit_type``) up in the registry and
prefixes its plan with the module's path. Nothing here names a component: the only structure it knows is the
core's own (modules tagged ``embedding`` and ``lm_head``, and blocks tagged ``placement`` as FSDP units). This is
torchtitan's ``parallelize_llama`` layout (pytorch/torchtitan, ``models/llama3/infra/parallelize.py``) without
sequence parallelism, so every activation between sublayers stays replicated on the TP ranks:

| style | meaning (PyTorch ``torch.distributed.tensor.parallel``) |
|---|---|
| ``colwise`` | ``ColwiseParallel()``: ``nn.Linear`` weight ``[out, in]`` and bias sharded on ``out``; input replicated, output the local shard ``[..., out / tp]`` (a plain tensor) |
| ``rowwise`` | ``RowwiseParallel()``: weight sharded on ``in``, bias replicated; input the local shard ``[..., in / tp]``, output all-reduced ``[..., out]``. On an ``nn.Embedding``: vocab-parallel lookup (rows sharded, token ids replicated, output all-reduced) |
| ``colwise_gather`` | ``ColwiseParallel(output_layouts=Replicate())``: like ``colwise`` but the output is all-gathered to the full ``[..., out]`` (the vocab-parallel LM head: full logits) |
| ``grouped`` | stacked copies (a component's grouped form, e.g. mixture-of-experts experts): every parameter sharded on the dim its module's ``tp_shard_dims`` names (the hidden ``d_ff`` dim of each copy); input replicated (its gradient all-reduced: :func:`copy_to_tp`), the module computes on its local shards, output all-reduced |
| ``per_head`` | ``SequenceParallel(sequence_dim=1)`` with heads for the sequence: weights left whole (``Replicate`` DTensors) and applied to this rank's heads ``[batch, heads / tp, seq, head_dim]`` (a per-head QK-norm); their gradient is summed over the TP group |
| ``heads`` | a *parameter* (not a submodule) whose dim 0 indexes the module's heads (``[n_heads, ...]`` or ``[n_kv_heads, ...]``, e.g. a per-head gain or temperature): sharded on dim 0 in the blocks the colwise q/k/v shard the heads; during ``forward`` the module reads its local heads as a plain tensor |
| ``replicate`` | explicit "leave this submodule (or parameter) whole on every TP rank": it reads only replicated activations |

Choices made here (and why):

* **Embedding and LM head: vocab-parallel** when the head is untied and ``tp`` divides ``vocab_size``
  (embedding ``rowwise``, head ``colwise_gather`` so ``forward`` still returns full logits ``[b, s, vocab]``).
  A tied head multiplies by ``embed.weight`` inside ``Model.forward`` (no module call), so tied models keep
  both replicated under TP (FSDP still shards them); a vocabulary ``tp`` does not divide is replicated with a
  :class:`PlanWarning`.
* **Head counts.** ``tp`` must divide both ``n_heads`` and ``n_kv_heads`` of every attention module whose
  plan shards something: q is sharded by query heads and k/v by key/value heads, and each rank must hold
  whole GQA groups. Checked before any collective (:class:`ParallelError` names the layer path and values).
  After sharding, the local module's ``n_heads`` / ``n_kv_heads`` attributes are divided by ``tp`` (as
  torchtitan does), so its ``rearrange(..., h=self.n_heads)`` sees the local heads. Position schemes that act
  as an attention bias (capability ``acts_on = "bias"``, e.g. ALiBi) get the full head count and return this
  rank's slice of heads.
* **Gradients of replicated tensors next to a shard.** A tensor that every TP rank holds whole but that each
  rank then uses against its own shard gets, on each rank, only that rank's part of its gradient; the full
  gradient is the sum over the group. Activations entering a sharded module are summed on the way back by the
  styles themselves (``colwise``: DTensor's ``Replicate`` input; ``grouped`` and sliced attention biases:
  :func:`copy_to_tp`, Megatron-LM's ``f`` operator). An activation a component computes whole on every rank and
  feeds to its local heads without a sharded projection in between (multi-head latent attention's rotated key,
  shared by every head) goes through :func:`shared_by_heads` in the component's forward. Parameters cannot be told apart by structure, so in a
  component whose plan shards something **every parameter must be declared**: by a sharding style, ``per_head``
  (summed over the group), or ``replicate`` (reads only replicated activations); :func:`model_plan` refuses an
  undeclared one, naming it, rather than train it silently wrong. Nested components whose own plan shards
  answer for themselves; a plan entry for an optional submodule that is ``None`` (no QK-norm) is skipped. Every
  DTensor parameter's gradient is brought to the parameter's own placements (``p.grad`` has ``p``'s layout).
  Position schemes with parameters that act on q/k (this rank's heads) are refused.
* **Replicated parameters that would read a shard.** A 1-D replicated parameter inside a sharded component
  whose length equals the full output width of a ``colwise`` sibling (OLMo 2's full-width QK-norm) would see
  only ``1/tp`` of the features; :func:`model_plan` rejects it instead of computing wrong statistics.
* **Third-party components without a plan** are replicated, with a :class:`PlanWarning` naming the component,
  its plugin and the layer paths.
* **MoE.** The router is replicated; the stacked experts take the ``grouped`` style (expert-tensor-parallelism:
  every rank holds ``1/tp`` of the hidden width of every expert, computes every token's assignments on it, and
  the partial outputs are all-reduced). A grouped module with an output bias (``tp_shard_dims`` is ``None``)
  stays replicated with a :class:`PlanWarning`: the bias would be added ``tp`` times. No expert parallelism
  (all-to-all token dispatch). FSDP shards experts with the rest of their block.
* **FSDP2** (``torch.distributed.fsdp.fully_shard``): one unit per block (modules tagged ``placement``), then
  the root (embedding, final norm, head); mixed precision with ``param_dtype`` / ``reduce_dtype``.

**Init without the whole model.** ``materialize`` calls ``model.to_empty`` (each rank allocates only its shards)
and then ``Model.init_weights(init=ShardedInit(...))``. :class:`ShardedInit` draws exactly the values a
single-process build draws, one parameter at a time (a full ``[out, in]`` float32 tensor for the duration of one
copy, generated on the CPU), and keeps this rank's slice with ``distribute_tensor(..., src_data_rank=None)`` (a
local slice, no communication), so a sharded model equals ``modkit.build`` with the same seed.

**Checkpoints.** :func:`save_sharded` / :func:`load_sharded` use ``torch.distributed.checkpoint`` (each rank
writes and reads its own shards; resharding to another mesh on load is DCP's job). :func:`export_consolidated`
gathers the full state dict to rank 0 (``get_model_state_dict`` with ``full_state_dict=True``,
``cpu_offload=True``) and writes one safetensors file; :func:`load_consolidated` reads it on rank 0 and
broadcasts (``set_model_state_dict`` with ``broadcast_from_rank0=True``), each rank keeping its shard.

References: PyTorch tensor parallel docs (``torch.distributed.tensor.parallel``), FSDP2 docs
(``torch.distributed.fsdp.fully_shard``), DCP docs (``torch.distributed.checkpoint``); Shoeybi et al. 2019,
Megatron-LM (arXiv:1909.08053) for the column/row split; torchtitan ``parallelize_llama`` for the plan layout.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import torch
from torch import Tensor, nn

from modkit.core.errors import CheckpointError, ModkitError
from modkit.core.interfaces import Init
from modkit.core.registry import Registry, get_registry

__all__ = [
    "STYLES",
    "copy_to_tp",
    "shared_by_heads",
    "ParallelError",
    "PlanWarning",
    "TPPlan",
    "ShardedInit",
    "model_plan",
    "make_mesh",
    "parallelize",
    "materialize",
    "build_parallel",
    "clip_grad_norm_",
    "mean_across_ranks",
    "param_stats",
    "save_sharded",
    "load_sharded",
    "export_consolidated",
    "load_consolidated",
]

#: Tensor-parallel styles a ``tp_plan`` may use (see the module docstring for their meaning).
STYLES: Mapping[str, str] = {
    "colwise": "shard weight/bias on the output features; input replicated, output the local shard",
    "rowwise": "shard weight on the input features (an Embedding: on the vocabulary); output all-reduced",
    "colwise_gather": "colwise with the output all-gathered (vocab-parallel LM head returning full logits)",
    "grouped": "stacked copies: parameters sharded on the dims the module's tp_shard_dims names; input gradient and "
    "output all-reduced",
    "per_head": "weights replicated, applied to this rank's heads of a [batch, heads, seq, head_dim] activation "
    "(e.g. a per-head QK-norm); their gradient is summed over the tensor-parallel group",
    "heads": "a parameter [n_heads or n_kv_heads, ...] sharded on its head dim; the module reads its local heads",
    "replicate": "leave whole on every tensor-parallel rank; it reads only replicated activations",
}

#: The core's own parallel layout, keyed by the ``modkit_kind`` tags the core puts on its modules (not
#: registry components): vocab-parallel embedding and LM head (torchtitan's ``tok_embeddings`` / ``output``).
CORE_PLAN: Mapping[str, str] = {"embedding": "rowwise", "lm_head": "colwise_gather"}

_SHARDING = {"colwise", "rowwise", "colwise_gather", "grouped", "heads"}


def copy_to_tp(x: Tensor, mesh) -> Tensor:
    """Identity in the forward pass; in the backward pass the gradient is summed over the ranks of ``mesh``.

    Megatron-LM's ``copy_to_tensor_model_parallel_region`` (the ``f`` operator of Shoeybi et al. 2019,
    arXiv:1909.08053, section 3): a tensor that every tensor-parallel rank holds whole (a replicated activation)
    and that each rank then consumes through its own shard of the weights receives, on each rank, only that
    shard's part of its gradient; the full gradient is their sum. Built from DTensor's own collectives:
    ``DTensor.from_local(x, [Replicate()]).to_local(grad_placements=[Partial()])``, whose backward turns the
    ``Partial`` gradient into a ``Replicate`` one (one all-reduce). A tensor that does not require a gradient is
    returned as it is (nothing to reduce).

    Args:
        x: any shape, the same values on every rank of ``mesh``.
        mesh: the 1-D tensor-parallel ``DeviceMesh``.

    Returns:
        ``x`` (same values, shape and dtype), a plain tensor.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate

    if not x.requires_grad:
        return x
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def shared_by_heads(x: Tensor, sharded: Tensor) -> Tensor:
    """``x`` as this rank's heads read it: its gradient summed over the tensor-parallel group of ``sharded``.

    For a component whose plan shards its heads: a tensor that every rank computes whole (from replicated
    weights) and that its local heads then consume directly, not through a ``colwise`` projection (whose input
    gradient the style already sums), gets only this rank's heads' part of its gradient; this restores the sum
    (:func:`copy_to_tp` on the mesh of ``sharded``). Without tensor parallelism (``sharded`` a plain tensor) it
    returns ``x`` itself, so a component may call it unconditionally.

    Args:
        x: any shape, the same values on every rank (e.g. MLA's rotated key ``[batch, 1, seq, qk_rope_head_dim]``).
        sharded: a parameter of the component that the plan shards (a DTensor under tensor parallelism).
    """
    mesh = getattr(sharded, "device_mesh", None)
    return x if mesh is None else copy_to_tp(x, mesh)


def _grads_like_params(module: nn.Module, inputs) -> None:
    """Forward pre-hook: the gradient of each DTensor parameter of ``module`` arrives in the parameter's placements.

    DTensor's autograd gives a gradient the placements its sharding rules produce, not the parameter's: a
    ``Replicate`` weight applied to a sharded activation (``per_head``) gets a ``Partial`` gradient (each rank's
    part), and a vocab-parallel embedding (``Shard(0)``) a ``Replicate`` one (the whole ``[vocab, d_model]``
    gradient on every rank). A hook on the parameter redistributes it before it is accumulated into ``.grad``
    (``Partial -> Replicate``: one all-reduce; ``Replicate -> Shard``: a local slice), so ``p.grad`` always has
    ``p``'s layout: optimisers, gradient clipping and ``p.grad.to_local()`` see this rank's part of the full
    gradient, and gradient accumulation adds like to like. The hook goes on the tensor the module holds at call
    time (FSDP2 swaps in its unsharded parameters before the forward, ``to_empty`` replaces parameter objects);
    each is hooked once.
    """
    from torch.distributed.tensor import DTensor

    for p in module.parameters(recurse=False):
        if isinstance(p, DTensor) and p.requires_grad and not getattr(p, "_modkit_grad_hooked", False):
            placements = tuple(p.placements)

            def to_placements(g, placements=placements):
                if isinstance(g, DTensor) and tuple(g.placements) != placements:
                    return g.redistribute(g.device_mesh, placements)
                return g

            p.register_hook(to_placements)
            p._modkit_grad_hooked = True


def GroupedParallel():
    """The ``grouped`` style as a ``ParallelStyle``: shard each parameter of stacked copies on its ``tp_shard_dims``
    dim; the input ``[rows, d_model]`` enters through :func:`copy_to_tp` (its gradient is all-reduced) and the
    module's partial output is all-reduced (``Partial -> Replicate``, differentiable).

    The module computes on local shards (``t.to_local()`` of its DTensor parameters): with gate/up sharded on the
    hidden dim and down on its input (hidden) dim, each rank's output is a partial sum over its slice of the hidden
    features (Megatron-LM's column-then-row split, Shoeybi et al. 2019, arXiv:1909.08053), here per expert. The
    backward mirrors it: each rank's gradient w.r.t. the input covers only its slice of the hidden features, so it
    is summed over the group (Megatron's ``f`` operator); without that every parameter before the layer would get
    a wrong gradient.
    """
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class _Grouped(ParallelStyle):
        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            for name, dim in module.tp_shard_dims.items():
                p = getattr(module, name)
                shard = distribute_tensor(p.data, device_mesh, [Shard(dim)], src_data_rank=None)
                module.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))

            def enter(mod, inputs):
                return (copy_to_tp(inputs[0], device_mesh), *inputs[1:])

            def reduce(mod, inputs, out):
                partial = DTensor.from_local(out, device_mesh, [Partial()], run_check=False)
                return partial.redistribute(device_mesh, [Replicate()]).to_local()

            module.register_forward_pre_hook(enter)
            module.register_forward_hook(reduce)
            return module

    return _Grouped()


def PerHeadParallel():
    """The ``per_head`` style as a ``ParallelStyle``: replicated weights applied to this rank's heads.

    PyTorch's ``SequenceParallel(sequence_dim=1, use_local_output=True)`` with the heads in the place of the
    sequence: the module's parameters become ``Replicate`` DTensors, its input ``[batch, heads / tp, seq,
    head_dim]`` is taken as this rank's ``Shard(1)`` of the full ``[batch, heads, seq, head_dim]``, the module runs
    in DTensor and returns the local tensor. DTensor's autograd then gives each weight the sum over all heads of
    all ranks (a ``Partial`` gradient, reduced to the weight's ``Replicate`` layout by the hook :func:`parallelize`
    puts on every DTensor parameter).
    The module must act on each head independently (a norm over ``head_dim``, a per-head scale): a module mixing
    heads would see only this rank's.
    """
    from torch.distributed.tensor.parallel import SequenceParallel

    class _PerHead(SequenceParallel):
        def __init__(self):
            super().__init__(sequence_dim=1, use_local_output=True)

        def _replicate_module_fn(self, name: str, module: nn.Module, device_mesh) -> None:
            # distribute_module visits every submodule: each replicates its own parameters (the values are
            # already equal on every rank: the model is built on meta and initialised with one seed)
            from torch.distributed.tensor import DTensor, Replicate

            for p_name, param in list(module.named_parameters(recurse=False)):
                replicated = DTensor.from_local(param.data, device_mesh, [Replicate()], run_check=False)
                module.register_parameter(p_name, nn.Parameter(replicated, requires_grad=param.requires_grad))

        # (the Partial gradients of the replicated weights are reduced by the hook parallelize puts on them)

    return _PerHead()


class ParallelError(ModkitError, ValueError):
    """A parallel layout cannot be applied (degree not dividing a sharded size, a malformed plan, a bad mesh).

    Raised before any collective runs; the message names the module path and the offending values.
    """


class PlanWarning(UserWarning):
    """A component is replicated under tensor parallelism for lack of a plan (or an unshardable vocabulary)."""


# ------------------------------------------------------------------------------------------------- the plan


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


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _tagged(module: nn.Module) -> bool:
    return getattr(module, "modkit_type", None) is not None or getattr(module, "modkit_kind", None) in CORE_PLAN


def _owned_params(module: nn.Module) -> int:
    """Parameters of ``module`` not inside a nested tagged component (those answer for themselves)."""
    n = sum(p.numel() for p in module.parameters(recurse=False))
    for child in module.children():
        if not _tagged(child):
            n += _owned_params(child)
    return n


def _entry_name(entry) -> str:
    return f"{entry.kind}/{entry.type}"


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
    modules = dict(model.named_modules())
    spec = getattr(model, "spec", None)
    tied = bool(getattr(spec, "tie_embeddings", False))
    unplanned: dict[str, list[str]] = {}
    covered: list[str] = []  # submodules an enclosing component's plan declares: that plan answers for them

    for path, module in modules.items():
        if any(path.startswith(c + ".") for c in covered):
            continue
        kind, typ = getattr(module, "modkit_kind", None), getattr(module, "modkit_type", None)
        if typ is None:
            if kind in CORE_PLAN:
                _core_entry(plan, path, module, kind, tied)
            continue
        entry = reg.get(kind, typ)
        comp_plan = entry.capabilities.get("tp_plan")
        if comp_plan is None:
            n = _owned_params(module)
            if n:
                unplanned.setdefault(f"{_entry_name(entry)} (plugin {entry.provider})", []).append(path or "<root>")
                plan.replicated[path] = f"{_entry_name(entry)} declares no tp_plan ({n} parameters replicated)"
            if kind == "position" and entry.capabilities.get("acts_on") == "bias":
                plan.bias_positions.append(path)
            continue
        if not isinstance(comp_plan, Mapping):
            raise ParallelError(f"{_entry_name(entry)} ({entry.provider}): tp_plan must be a mapping, got {comp_plan!r}")
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
            full = _join(path, sub)
            if style == "heads":  # a per-head parameter, not a submodule
                if _attribute(module, sub) is None:  # an optional parameter this configuration does not have
                    continue
                _check_head_param(full, module, sub, tp, _entry_name(entry))
                plan.styles[full], plan.sources[full] = style, _entry_name(entry)
                declared.append(full)  # sharded with the heads: each rank's gradient is its own shard's
                if path not in plan.head_modules:
                    plan.head_modules.append(path)
                continue
            target = modules.get(full)
            if target is None:
                found = _attribute(module, sub)
                if found is None:  # an optional submodule this configuration does not have (e.g. no QK-norm)
                    continue
                if isinstance(found, nn.Parameter) and style == "replicate":
                    declared.append(full)
                    continue
                raise ParallelError(
                    f"{_entry_name(entry)} ({entry.provider}): tp_plan names {sub!r} but {path or '<root>'} has no "
                    f"submodule of that name{' (a parameter can only be declared replicate)' if found is not _MISSING else ''}; "
                    f"its children are {[n for n, _ in module.named_children()]}"
                )
            declared.append(full)
            if style == "replicate":
                continue
            if style == "per_head":
                heads = {getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
                grouped = [n for n, prm in target.named_parameters() if prm.dim() > 1 and prm.shape[0] in heads]
                if grouped:  # a weight per head ([heads, dim]) would need sharding with the heads, not replication
                    raise ParallelError(
                        f"{full}.{grouped[0]} (shape {list(target.get_parameter(grouped[0]).shape)}): plan of "
                        f"{_entry_name(entry)} applies {sub!r} 'per_head' (one replicated weight for every local head), "
                        "but this weight has a row per head (e.g. qk_norm_scope 'each_head'); such a model cannot be "
                        "tensor-parallel yet: use qk_norm_scope 'head' or train it without tp"
                    )
                if next(target.parameters(), None) is not None:  # no weights: no gradient to sum, nothing to wrap
                    plan.styles[full] = style
                    plan.sources[full] = _entry_name(entry)
                continue
            if style == "grouped":
                if not _check_grouped(full, target, tp, _entry_name(entry)):
                    plan.replicated[full] = f"{type(target).__name__} declares no tp_shard_dims (output bias)"
                    warnings.warn(f"{full} ({_entry_name(entry)}): {type(target).__name__} has tp_shard_dims None "
                                  "(an output bias would be added tp times); it stays replicated", PlanWarning, stacklevel=2)
                    continue
            else:
                _check_linear(full, target, style, tp, _entry_name(entry))
            plan.styles[full] = style
            plan.sources[full] = _entry_name(entry)
            if isinstance(target, nn.Embedding):
                plan.embeddings.append(full)
            sharded_here.append(full)
        covered.extend(declared)
        per_head = [p for p in declared if plan.styles.get(p) == "per_head"]
        if per_head and not sharded_here:
            raise ParallelError(
                f"{_entry_name(entry)} ({entry.provider}): tp_plan declares {per_head[0]} 'per_head' but shards nothing "
                f"in {path or '<root>'}, so its input holds every head: summing its gradient over the tp = {tp} ranks "
                "would multiply it by tp. 'per_head' belongs in the plan of a component that shards its heads"
            )
        if kind == "position" and entry.capabilities.get("acts_on") == "bias":
            plan.bias_positions.append(path)
        if sharded_here:
            _check_replicated_consumers(path, module, {p: modules[p] for p in sharded_here}, plan.styles, tp)
            _check_declared(path, module, _entry_name(entry), declared, sharded_here, reg, tp)
            heads = any(isinstance(getattr(module, a, None), int) for a in ("n_heads", "n_kv_heads"))
            if heads and path not in plan.head_modules:  # once: a 'heads' parameter may have listed it already
                plan.head_modules.append(path)
    if plan.head_modules:
        _check_positions(modules, reg, tp)

    for name, paths in unplanned.items():
        shown = ", ".join(paths[:4]) + (f", ... ({len(paths)} in all)" if len(paths) > 4 else "")
        warnings.warn(
            f"component {name} declares no tp_plan capability; its parameters are replicated on every "
            f"tensor-parallel rank (tp = {tp}) at {shown}. Declare e.g. capabilities={{'tp_plan': "
            "{'up': 'colwise', 'down': 'rowwise'}}} to shard it, or {} to say replication is intended.",
            PlanWarning,
            stacklevel=2,
        )
    return plan


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
            "every tensor-parallel rank", PlanWarning, stacklevel=3,
        )
        return
    _check_linear(path, module, style, plan.tp, f"core:{kind}")
    plan.styles[path] = style
    plan.sources[path] = f"core:{kind}"
    if isinstance(module, nn.Embedding):
        plan.embeddings.append(path)


def _check_linear(path: str, module: nn.Module, style: str, tp: int, source: str) -> None:
    if isinstance(module, nn.Embedding) and style == "rowwise":
        dim, size = "num_embeddings", module.num_embeddings
    elif isinstance(module, nn.Linear):
        dim, size = ("in_features", module.in_features) if style == "rowwise" else ("out_features", module.out_features)
    else:
        raise ParallelError(
            f"{path}: plan of {source} asks for {style!r} on a {type(module).__name__}; tensor-parallel styles "
            "apply to nn.Linear (and 'rowwise' to nn.Embedding)"
        )
    if size % tp:
        raise ParallelError(
            f"{path}: tensor-parallel degree tp = {tp} does not divide {dim} = {size} of this {style} "
            f"{type(module).__name__} (plan of {source}); choose a tp that divides {size}"
        )


def _check_grouped(path: str, module: nn.Module, tp: int, source: str) -> bool:
    """Validate a ``grouped`` target; False when it declares ``tp_shard_dims = None`` (to stay replicated)."""
    dims = getattr(module, "tp_shard_dims", "missing")
    if dims is None:
        return False
    own = dict(module.named_parameters(recurse=False))
    if not isinstance(dims, Mapping) or set(dims) != set(own):
        raise ParallelError(
            f"{path}: plan of {source} asks for 'grouped' on a {type(module).__name__}, which must define "
            f"tp_shard_dims {{parameter: dim}} covering exactly its parameters {sorted(own)}; got {dims!r}"
        )
    for name, dim in dims.items():
        size = own[name].shape[dim]
        if size % tp:
            raise ParallelError(
                f"{path}.{name}: tensor-parallel degree tp = {tp} does not divide its dim {dim} (size {size}) "
                f"(plan of {source}); choose a tp that divides {size}"
            )
    return True


def _check_head_param(full: str, module: nn.Module, sub: str, tp: int, source: str) -> None:
    """Validate a ``heads`` item: ``sub`` is a parameter of ``module`` whose dim 0 is its n_heads or n_kv_heads."""
    try:
        prm = module.get_parameter(sub)
    except AttributeError:
        names = [n for n, _ in module.named_parameters()]
        raise ParallelError(f"{full}: plan of {source} asks for 'heads' on {sub!r}, which is not a parameter of the "
                            f"module; its parameters are {names}") from None
    heads = {getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
    if prm.dim() == 0 or prm.shape[0] not in heads:
        raise ParallelError(f"{full} (shape {list(prm.shape)}): plan of {source} asks for 'heads', but its dim 0 is not "
                            f"the module's n_heads or n_kv_heads ({sorted(heads) or 'the module exposes neither'})")
    if prm.shape[0] % tp:
        raise ParallelError(f"{full}: tensor-parallel degree tp = {tp} does not divide its {prm.shape[0]} heads")


def _shard_heads(model: nn.Module, path: str, mesh) -> None:
    """Shard the per-head parameter at ``path`` on dim 0; its module reads the local heads as a plain tensor.

    The parameter becomes a ``DTensor`` (``Shard(0)``: optimizers, checkpoints and :class:`ShardedInit` see the
    sharded parameter); for the duration of each forward of its module, the attribute resolves to
    ``to_local()`` (differentiable, so the gradient reaches the shard).
    """
    from torch.distributed.tensor import Shard, distribute_tensor

    owner_path, _, name = path.rpartition(".")
    owner = model.get_submodule(owner_path)
    p = owner._parameters[name]
    shard = distribute_tensor(p.data, mesh, [Shard(0)], src_data_rank=None)
    owner.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))

    def local(mod, args):
        mod.__dict__[name] = mod._parameters[name].to_local()  # found before Module.__getattr__ looks in _parameters

    def restore(mod, args, out):
        mod.__dict__.pop(name, None)

    owner.register_forward_pre_hook(local)
    owner.register_forward_hook(restore)


def _check_heads(path: str, module: nn.Module, tp: int) -> None:
    heads = {a: getattr(module, a) for a in ("n_heads", "n_kv_heads") if isinstance(getattr(module, a, None), int)}
    bad = {a: v for a, v in heads.items() if v % tp}
    if bad:
        values = ", ".join(f"{a} = {v}" for a, v in heads.items())
        raise ParallelError(
            f"{path}: tensor-parallel degree tp = {tp} does not divide {' and '.join(bad)} ({values}); every rank "
            f"must hold whole query heads and whole key/value heads, so tp must divide both n_heads and n_kv_heads "
            f"(here: one of {_divisors(math.gcd(*heads.values()))})"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_MISSING = object()


def _attribute(module: nn.Module, dotted: str):
    """``module.a.b`` for ``"a.b"``, or :data:`_MISSING` (``None`` when an optional submodule is absent)."""
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, _MISSING)
        if obj is _MISSING or obj is None:
            return obj
    return obj


def _shards_itself(module: nn.Module, reg: Registry) -> bool:
    """A tagged component whose own plan shards something (its styles prepare its input and output)."""
    if getattr(module, "modkit_type", None) is None:
        return False
    comp_plan = reg.get(module.modkit_kind, module.modkit_type).capabilities.get("tp_plan")
    return isinstance(comp_plan, Mapping) and any(style in _SHARDING for style in comp_plan.values())


def _check_declared(
    path: str, module: nn.Module, source: str, declared: list[str], sharded: list[str], reg: Registry, tp: int
) -> None:
    """Every parameter of a component that shards something is declared by its plan.

    Between a ``colwise`` and a ``rowwise`` module the activations are this rank's shard; a parameter left whole
    on every rank that reads such an activation gets only this rank's part of its gradient (a per-head QK-norm
    weight sees only this rank's heads), and nothing would sum the parts: the ranks' copies drift apart and
    training is silently wrong. Whether a parameter reads a shard cannot be seen from the module's structure, so
    the plan must say it: a sharding style, ``per_head`` (gradient summed over the group) or ``replicate`` (reads
    only replicated activations). Nested components whose own plan shards something answer for themselves.
    """
    answering = [_join(path, sub) for sub, m in module.named_modules() if sub and _shards_itself(m, reg)]
    roots = declared + answering
    for name, prm in module.named_parameters():
        full = _join(path, name)
        if any(full == d or full.startswith(d + ".") for d in roots):
            continue
        child = name.split(".")[0]
        raise ParallelError(
            f"{full} (shape {list(prm.shape)}) is left whole on every tensor-parallel rank by the plan of {source}, "
            f"which shards {', '.join(sharded[:3])}{', ...' if len(sharded) > 3 else ''}; if it reads a sharded "
            f"activation it gets only this rank's part of its gradient (tp = {tp}) and training is silently wrong. "
            f"Declare {child!r} in the tp_plan: 'replicate' if it reads only replicated activations (the component's "
            "input or its all-reduced output), 'per_head' if it acts on this rank's heads (its gradient is summed "
            "over the tensor-parallel group), or a sharding style"
        )


def _check_positions(modules: dict[str, nn.Module], reg: Registry, tp: int) -> None:
    """Position schemes with parameters that act on this rank's heads of q/k are refused (partial gradients)."""
    for path, module in modules.items():
        if getattr(module, "modkit_kind", None) != "position" or getattr(module, "modkit_type", None) is None:
            continue
        entry = reg.get("position", module.modkit_type)
        names = [n for n, _ in module.named_parameters()]
        if entry.capabilities.get("acts_on") == "qk" and names:
            raise ParallelError(
                f"{path} ({_entry_name(entry)}, {entry.provider}) acts on queries and keys and has parameters "
                f"{names[:4]}; under tensor parallelism (tp = {tp}) each rank applies it to its own heads only, so "
                "those parameters would get a partial gradient. Not supported: use FSDP (tp = 1) for this model"
            )


def _check_replicated_consumers(
    path: str, module: nn.Module, sharded: dict[str, nn.Module], styles: dict[str, str], tp: int
) -> None:
    """Reject replicated 1-D parameters as wide as a colwise output (they would normalise/scale a shard)."""
    widths: dict[int, str] = {}
    for p, m in sharded.items():
        if styles[p] == "colwise" and isinstance(m, nn.Linear):
            widths.setdefault(m.out_features, p)
    for sub, child in module.named_modules():
        full = _join(path, sub)
        if not sub or full in sharded or any(full.startswith(s + ".") for s in sharded):
            continue
        for pname, prm in child.named_parameters(recurse=False):
            if prm.dim() == 1 and prm.shape[0] in widths and prm.shape[0] > 1:
                raise ParallelError(
                    f"{full}.{pname} (shape [{prm.shape[0]}]) is replicated but as wide as the full output of colwise "
                    f"{widths[prm.shape[0]]}; under tp = {tp} it would act on a 1/{tp} shard of those features "
                    "(e.g. a QK-norm over the whole projection, qk_norm_scope = 'full'); use a per-head variant or tp = 1"
                )


# ------------------------------------------------------------------------------------------------- meshes


def make_mesh(tp: int = 1, dp: Optional[int] = None, *, device_type: Optional[str] = None):
    """A 2-D ``DeviceMesh`` named ``("dp", "tp")`` over the initialised world (``dp * tp == world_size``).

    Args:
        tp: tensor-parallel degree (inner dimension: neighbouring ranks, i.e. the GPUs of one node).
        dp: data-parallel / FSDP degree; default ``world_size // tp``.
        device_type: ``"cuda"`` when CUDA is available, else ``"cpu"`` (gloo).

    Raises:
        ParallelError: no process group, or ``dp * tp`` differs from the world size.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ParallelError("torch.distributed is not initialised; launch with torchrun and call init_process_group first")
    world = dist.get_world_size()
    if tp < 1 or world % tp:
        raise ParallelError(f"tensor-parallel degree tp = {tp} does not divide the world size {world}")
    dp = world // tp if dp is None else dp
    if dp * tp != world:
        raise ParallelError(f"mesh dp = {dp} x tp = {tp} = {dp * tp} differs from the world size {world}")
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))


def _sub_mesh(mesh, name: str):
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if name not in names:
        return None
    sub = mesh[name] if len(names) > 1 else mesh
    return sub if sub.size() > 1 else None


# ------------------------------------------------------------------------------------------------- applying


def _dtype(value) -> Optional[torch.dtype]:
    if value is None or isinstance(value, torch.dtype):
        return value
    out = getattr(torch, str(value).replace("torch.", ""), None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise ParallelError(f"unknown floating dtype {value!r}; use float32, bfloat16 or float16")
    return out


def _slice_heads_bias(position: nn.Module, mesh) -> None:
    """Make ``position.attention_bias(q, k, n_local)`` return this rank's heads of the ``n_local * tp`` bias.

    The full bias goes through :func:`copy_to_tp` before the slice: a bias computed from parameters (a learned
    relative-position bias) gets, on each rank, the gradient of its own heads only, and the sum over the group is
    the full one (ALiBi's bias needs no gradient: nothing is communicated).
    """
    full_bias = position.attention_bias
    tp, rank = mesh.size(), mesh.get_local_rank()

    def attention_bias(q_positions: Tensor, k_positions: Tensor, n_heads: int):
        bias = full_bias(q_positions, k_positions, n_heads * tp)
        if bias is None:
            return bias
        bias = copy_to_tp(bias, mesh)
        return bias if bias.shape[1] == 1 else bias[:, rank * n_heads : (rank + 1) * n_heads]

    position.attention_bias = attention_bias


def parallelize(
    model: nn.Module,
    mesh,
    *,
    tp_dim: str = "tp",
    dp_dim: str = "dp",
    param_dtype: Union[str, torch.dtype, None] = None,
    reduce_dtype: Union[str, torch.dtype, None] = None,
    reshard_after_forward: bool = True,
    registry: Optional[Registry] = None,
) -> nn.Module:
    """Apply tensor parallelism and/or FSDP2 to ``model`` in place (best on a ``meta`` model; then :func:`materialize`).

    1. If the mesh has a ``tp_dim`` of size > 1: compose and validate the plan (:func:`model_plan`), apply it with
       ``parallelize_module``, divide the local attention modules' ``n_heads`` / ``n_kv_heads`` by ``tp`` and slice
       bias-type position schemes to the local heads.
    2. If it has a ``dp_dim`` of size > 1: ``fully_shard`` every block (modules tagged ``placement``), then the root,
       with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``.

    Args:
        model: a :class:`~modkit.nn.model.Model` (or any module built from registry components).
        mesh: a ``DeviceMesh`` with named dims (see :func:`make_mesh`); a 1-D mesh named ``"tp"`` or ``"dp"`` works.
        param_dtype: FSDP2 compute dtype of the unsharded parameters (e.g. ``"bfloat16"``); default: as stored.
        reduce_dtype: FSDP2 gradient reduce-scatter dtype (e.g. ``"float32"``); default: ``param_dtype``.
        reshard_after_forward: FSDP2: free unsharded parameters after forward (ZeRO-3) or keep them (ZeRO-2).
        registry: the registry the model was built from.

    Returns:
        ``model`` (the same object; FSDP2 changes its class to a ``FSDPModule`` subclass).

    Raises:
        ParallelError: see :func:`model_plan`; a mesh without either named dim.
    """
    tp_mesh, dp_mesh = _sub_mesh(mesh, tp_dim), _sub_mesh(mesh, dp_dim)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if tp_dim not in names and dp_dim not in names:
        raise ParallelError(f"mesh dims {names} name neither {tp_dim!r} nor {dp_dim!r}; build it with make_mesh")
    if tp_mesh is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        tp = tp_mesh.size()
        plan = model_plan(model, tp, registry=registry)
        parallelize_module(model, tp_mesh, plan.parallel_styles())
        for path in [p for p, style in plan.styles.items() if style == "heads"]:
            _shard_heads(model, path, tp_mesh)
        from torch.distributed.tensor import DTensor

        for mod in model.modules():
            if any(isinstance(p, DTensor) for p in mod.parameters(recurse=False)):
                mod.register_forward_pre_hook(_grads_like_params)
        modules = dict(model.named_modules())
        for path in plan.head_modules:
            mod = modules[path]
            for attr in ("n_heads", "n_kv_heads"):
                if isinstance(getattr(mod, attr, None), int):
                    setattr(mod, attr, getattr(mod, attr) // tp)
        for path in plan.bias_positions:
            _slice_heads_bias(modules[path], tp_mesh)
        model.modkit_tp_plan = plan
    if dp_mesh is not None:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        pd, rd = _dtype(param_dtype), _dtype(reduce_dtype)
        mp = MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd if rd is not None else pd)
        blocks = [m for m in model.modules() if getattr(m, "modkit_kind", None) == "placement"]
        for block in blocks:
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    return model


class ShardedInit(Init):
    """An :class:`~modkit.core.interfaces.Init` that writes each rank's shard of ``DTensor`` parameters.

    The random stream is the single-process one (same seed, same order), so a sharded model holds exactly the
    slices of ``modkit.build(spec, seed=seed)``. For a DTensor ``t`` the full value (``t.shape`` is global) is
    generated on the CPU, moved to ``t``'s device, cut with ``distribute_tensor(value, mesh, placements,
    src_data_rank=None)`` (a local slice, no communication; ``_StridedShard`` of FSDP x TP included) and copied
    into ``t.to_local()``; then it is dropped. Peak extra memory: one full parameter.
    """

    @torch.no_grad()
    def copy_(self, t: Tensor, value: Tensor) -> Tensor:
        """Copy ``value`` (the full tensor) or its local shard into ``t``."""
        from torch.distributed.tensor import DTensor, distribute_tensor

        if not isinstance(t, DTensor):
            return super().copy_(t, value)
        self.seen.add(id(t))
        local = t.to_local()
        full = value.to(device=local.device, dtype=t.dtype)
        if tuple(full.shape) != tuple(t.shape):
            raise ValueError(f"init value of shape {tuple(full.shape)} for a parameter of global shape {tuple(t.shape)}")
        shard = distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None).to_local()
        local.copy_(shard)
        return t

    @torch.no_grad()
    def constant_(self, t: Tensor, value: float) -> Tensor:
        """Fill ``t`` (its local shard, for a DTensor) with ``value``."""
        from torch.distributed.tensor import DTensor

        if isinstance(t, DTensor):
            self.seen.add(id(t))
            t.to_local().fill_(value)
            return t
        return super().constant_(t, value)


def materialize(model: nn.Module, device: Union[str, torch.device, None] = None, *, seed: int = 0) -> nn.Module:
    """Allocate each rank's shards (``to_empty``) and initialise them deterministically from ``seed``.

    Args:
        model: a parallelised model on ``meta``.
        device: default ``cuda:<current device>`` when CUDA is available, else ``cpu``.
        seed: the seed ``modkit.build`` would use; the values equal that single-process build.

    Returns:
        ``model``.
    """
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    from modkit.nn.build import to_empty_poisoned

    to_empty_poisoned(model, device)  # what init_weights leaves unset is NaN on every rank, never allocator leftovers
    std = float(getattr(getattr(model, "spec", None), "init_std", 0.02))
    model.init_weights(seed, init=ShardedInit(seed, std))
    return model


def build_parallel(
    spec,
    mesh,
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    seed: int = 0,
    registry: Optional[Registry] = None,
    **parallel_options: Any,
) -> nn.Module:
    """``modkit.build`` on ``meta``, :func:`parallelize` on ``mesh``, then :func:`materialize`: no rank holds the model.

    Args:
        spec: anything :func:`modkit.build` accepts.
        mesh: see :func:`parallelize`.
        device: see :func:`materialize`.
        dtype: storage dtype of the (sharded) parameters.
        seed: weight-init seed (values equal ``modkit.build(spec, seed=seed)``).
        registry: defaults to the process-wide registry.
        parallel_options: ``param_dtype``, ``reduce_dtype``, ``reshard_after_forward``, ``tp_dim``, ``dp_dim``.
    """
    from modkit.nn.build import build

    model = build(spec, device="meta", dtype=dtype, seed=seed, registry=registry)
    parallelize(model, mesh, registry=registry, **parallel_options)
    return materialize(model, device, seed=seed)


# ------------------------------------------------------------------------------------------------- training


def _copies(t: Tensor, world: int) -> int:
    """How many ranks hold the same values as this rank's piece of ``t`` (meshes from make_mesh span the world)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard

    if not isinstance(t, DTensor):
        return world
    shards = 1
    for i, pl in enumerate(t.placements):
        if pl.is_partial():
            raise ParallelError(f"a gradient of shape {list(t.shape)} is still Partial on mesh dim {i}; reduce it first")
        if pl.is_shard() or isinstance(pl, _StridedShard):
            shards *= t.device_mesh.size(i)
    return max(1, world // shards)


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0) -> Tensor:
    """Clip the gradients of a parallelised model by their global norm, in place; returns the norm before clipping.

    ``torch.nn.utils.clip_grad_norm_`` for a model whose gradients are a mix of plain tensors (replicated on every
    rank, e.g. norm weights under TP alone) and DTensors on several meshes (TP shards, FSDP2 shards, both): it
    cannot mix them in one call. Here each rank adds ``|g_local|^p / copies`` over its gradients, where ``copies``
    is the number of ranks holding the same piece (the world size for a plain tensor, ``world / shards`` for a
    DTensor), one all-reduce sums that over the world, and ``total = sum^(1/p)`` is the norm of the full
    gradient of the single-process model. Every gradient is then scaled by ``min(1, max_norm / (total + 1e-6))``,
    as torch does. ``norm_type = inf`` takes the max instead (an all-reduce MAX). Without a process group this is
    the single-process norm.

    Args:
        parameters: an iterable of parameters (``model.parameters()``); those without ``.grad`` are ignored.
        max_norm: largest allowed norm (> 0).
        norm_type: ``p`` of the p-norm (2.0 default; ``float("inf")`` for the max norm).

    Returns:
        The total norm, a float32 scalar tensor on the gradients' device (identical on every rank).

    Raises:
        ValueError: ``max_norm`` or ``norm_type`` not positive.
        ParallelError: a gradient is still a ``Partial`` DTensor (not reduced to its parameter's layout).
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    if not max_norm > 0 or not norm_type > 0:
        raise ValueError(f"clip_grad_norm_ needs max_norm > 0 and norm_type > 0, got {max_norm} and {norm_type}")
    grads = [p.grad for p in parameters if p.grad is not None]
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    locals_ = [(g.to_local() if isinstance(g, DTensor) else g, _copies(g, world)) for g in grads]
    device = locals_[0][0].device if locals_ else torch.device("cpu")
    inf = math.isinf(norm_type)
    acc = torch.zeros((), dtype=torch.float32, device=device)
    for g, copies in locals_:
        if g.numel() == 0:
            continue
        if inf:
            acc = torch.maximum(acc, g.detach().abs().max().float().to(device))
        else:
            acc += torch.linalg.vector_norm(g.detach().float(), norm_type).to(device) ** norm_type / copies
    if world > 1:
        dist.all_reduce(acc, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM)
    total = acc if inf else acc ** (1.0 / norm_type)
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    for g, _ in locals_:
        g.mul_(coef.to(g.device, g.dtype))
    return total


def mean_across_ranks(value: Union[Tensor, float]) -> Tensor:
    """The mean of a scalar (a loss, a token count) over every rank of the world, for logging.

    Tensor-parallel ranks of one data-parallel group hold the same value, so the world mean is the mean over the
    data-parallel groups. One all-reduce of a float32 copy; the input is not modified. Without a process group the
    value itself.

    Returns:
        A float32 scalar tensor (on ``value``'s device; CPU for a Python number), detached.
    """
    import torch.distributed as dist

    out = torch.as_tensor(value).detach().float().clone().reshape(())
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(out)
        out /= dist.get_world_size()
    return out


# ------------------------------------------------------------------------------------------------- accounting


def param_stats(model: nn.Module) -> dict[str, int]:
    """What this rank holds, in elements and bytes.

    Returns:
        ``{"global_params", "local_params", "local_bytes", "sharded_local_params", "replicated_params",
            "owned_params"}``: ``local_*`` count the tensors this rank stores (shards of DTensors, whole plain
            tensors); ``sharded_local_params`` the part of it that is a shard (split over > 1 rank),
            ``replicated_params`` the part stored whole; ``owned_params`` sums ``local / (world / shards)``: this
            rank's share once copies on other ranks are discounted (a norm weight FSDP-sharded over ``dp`` is still
            copied on each ``tp`` rank), so it adds up to ``global_params`` over all ranks.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.placement_types import _StridedShard  # FSDP x TP on one dim; not a Shard subclass

    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_initialized() else 1
    except Exception:  # pragma: no cover - distributed unavailable
        world = 1
    out = dict(global_params=0, local_params=0, local_bytes=0, sharded_local_params=0, replicated_params=0)
    owned = 0.0
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        out["global_params"] += p.numel()
        if isinstance(p, DTensor):
            local = p.to_local()
            shards = 1
            for i, pl in enumerate(p.placements):
                if pl.is_shard() or isinstance(pl, _StridedShard):
                    shards *= p.device_mesh.size(i)
            repl = max(1, world // shards)  # every rank holds a piece of every parameter (meshes span the world)
            n = local.numel()
            out["local_bytes"] += n * local.element_size()
            if shards > 1:
                out["sharded_local_params"] += n
            else:
                out["replicated_params"] += n
        else:
            n, repl = p.numel(), world
            out["local_bytes"] += n * p.element_size()
            out["replicated_params"] += n
        out["local_params"] += n
        owned += n / repl
    out["owned_params"] = int(round(owned))
    return out


# ------------------------------------------------------------------------------------------------- checkpoints


def save_sharded(path: Union[str, Path], model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Save a sharded model (and optimiser) with ``torch.distributed.checkpoint``: every rank writes its shards.

    Collective: call on every rank. ``path`` is a directory shared by the ranks (one file per rank plus
    ``.metadata``). Reload on any mesh with :func:`load_sharded` (DCP reshards).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    dcp.save(state, checkpoint_id=str(path))


def load_sharded(path: Union[str, Path], model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None) -> None:
    """Load a :func:`save_sharded` checkpoint into a parallelised, materialised model (and optimiser), in place.

    Collective. Each rank reads the pieces overlapping its shards; the saving mesh may differ.

    Raises:
        CheckpointError: DCP could not match the checkpoint to the model (missing keys, shape mismatch).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # DCP wraps per-rank failures in CheckpointException
        raise CheckpointError(f"could not load sharded checkpoint {path}: {exc}") from exc
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"])


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def export_consolidated(path: Union[str, Path], model: nn.Module, *, dtype: Union[str, torch.dtype, None] = None) -> Optional[dict]:
    """Write one consolidated safetensors file from a sharded model (collective; rank 0 writes).

    The full state dict is gathered to rank 0 on the CPU (``get_model_state_dict`` with
    ``StateDictOptions(full_state_dict=True, cpu_offload=True)``); the other ranks hold nothing. Keys are those
    of ``model.state_dict()`` of the single-process model (a tied head has no ``lm_head.weight``), so the file
    loads into ``modkit.build(spec)`` with ``load_state_dict``. Metadata: ``format = "pt"`` and the spec JSON
    under ``modkit_spec`` when the model has one.

    Args:
        path: the ``.safetensors`` file to write (parent directories are created).
        model: the parallelised model.
        dtype: cast floating tensors to this dtype on write (default: as stored).

    Returns:
        On rank 0 ``{"tensors": n, "bytes": b}``, elsewhere ``None``.
    """
    import torch.distributed as dist
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    sd = get_model_state_dict(model, options=opts)
    info = None
    if _rank() == 0:
        cast = _dtype(dtype)
        tensors = {
            k: (v.to(cast) if cast is not None and v.is_floating_point() else v).contiguous() for k, v in sd.items()
        }
        meta = {"format": "pt"}
        spec = getattr(model, "spec", None)
        if spec is not None and hasattr(spec, "model_dump_json"):
            meta["modkit_spec"] = spec.model_dump_json()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(path), metadata=meta)
        info = {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values())}
    del sd
    if dist.is_initialized():
        dist.barrier()
    return info


def load_consolidated(path: Union[str, Path], model: nn.Module) -> None:
    """Start a sharded model from a consolidated safetensors file (collective): rank 0 reads, then broadcasts.

    Only rank 0 opens the file; ``set_model_state_dict(..., StateDictOptions(full_state_dict=True,
    broadcast_from_rank0=True))`` broadcasts tensor by tensor and each rank keeps its shard. Non-persistent
    buffers (RoPE tables) are not in the file: materialise (init) the model first, then load.

    Raises:
        CheckpointError (on every rank): missing or unexpected tensors, or shape mismatches; names them.
    """
    import torch.distributed as dist
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    problem: list[Optional[str]] = [None]
    sd: dict[str, Tensor] = {}
    if _rank() == 0:
        try:
            sd = load_file(str(path))
        except Exception as exc:
            problem[0] = f"cannot read {path}: {type(exc).__name__}: {exc}"
        else:
            expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
            missing = sorted(set(expected) - set(sd))
            unexpected = sorted(set(sd) - set(expected))
            shapes = [f"{k}: file {tuple(sd[k].shape)} vs model {expected[k]}" for k in expected if k in sd and tuple(sd[k].shape) != expected[k]]
            if missing or unexpected or shapes:
                problem[0] = (
                    f"{path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}, "
                    f"shape mismatches {shapes[:5]}"
                )
    if dist.is_initialized():
        dist.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise CheckpointError(problem[0])
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, sd, options=opts)
