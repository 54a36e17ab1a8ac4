"""Expert parallelism: the routed experts of a mixture split over an ``ep`` mesh dimension, each token's rows sent to
their experts' ranks and back with all-to-all (dropless), declared by components like the tensor-parallel plans.

**Plans as data.** A component with experts declares the capability ``ep_plan``, ``{submodule: "experts"}``: that
submodule holds stacked copies whose every parameter has the expert index on dim 0 (``[n_experts, ...]``). The
component may define ``ep_refusal(ep) -> str | None``, the reason it cannot be split ``ep`` ways (the ``moe``:
``ep`` must divide ``n_experts``; the fixed-capacity dispatch is refused). A component with an auxiliary loss (a
mixture) that declares no ``ep_plan`` is refused by name, and so is a model with nothing to split.

**The layout** (torchtitan's ``ExpertParallel`` style, pytorch/torchtitan ``distributed/expert_parallel.py``;
Megatron-Core's ``MoEAlltoAllTokenDispatcher``): ``ep`` borrows from the data-parallel ranks. With ``dp`` data-parallel
ranks and ``ep | dp`` the mesh is ``("dp_mod_ep", "ep", "tp")``, ``"dp"`` its flattened first two dims
(:func:`~modkit.parallel.make_mesh`). Every rank reads its own tokens; rank ``r`` of an ``ep`` group holds experts
``[r E / ep, (r + 1) E / ep)`` as ``Shard(0)`` DTensors on the ``ep`` mesh, FSDP2-sharded again over ``dp_mod_ep``
(the dense parts: FSDP2 over all of ``"dp"``). The experts' gradients, which collect every rank's tokens, are
divided by ``dp`` so they equal the dense parts' data-parallel mean (see the dispatch).

**Dispatch** (:class:`AllToAllDispatch`): the mixture's dropless path sorts its ``T k`` assignments by expert; the
per-expert counts ``[E]`` go to every rank (one all-to-all of ``E`` integers, then one host synchronisation for
the split sizes), the rows follow with a differentiable ``all_to_all_single`` (torch's functional collectives),
are regrouped by local expert, run through the local grouped GEMM, put back in arrival order and returned by the
reverse all-to-all. The experts' computation is wrapped so that their weight gradients are ``1 / ep`` of the sum
(and the rows' gradients whole): with FSDP2's mean over ``dp_mod_ep`` that is the data-parallel mean over ``dp``
(torchtitan sets FSDP2's gradient divide factor instead, which needs NCCL's ``PREMUL_SUM``; this works on gloo). Nothing is dropped or padded: each rank computes exactly its experts' rows.

**Global statistics.** The mixture's ``token_group`` is set to the data-parallel group: its balance loss and
z-loss are computed over every rank's tokens (:func:`modkit_plugins.moe_losses.global_aux_loss`), and the
training loop sums the routers' loads over the same group before DeepSeek-V3's bias update, so a run equals one
process on the whole batch.

**With pipeline stages** (``make_mesh(ep=N, pp=K)``: ``("pp", "dp_mod_ep", "ep", "tp")``): each stage's experts
are split over the ``ep`` ranks of that stage (:func:`~modkit.parallel.build_pipeline` parallelises every stage
on the mesh without its ``pp`` dim), the all-to-all runs inside each microbatch's forward and backward, and the
aux losses' global statistics are those of the microbatch's tokens on every data-parallel rank; the gradient is
that of one process accumulating over the same global microbatches, and the bias update reads the loads of the
whole step (:mod:`~modkit.parallel.pipeline`).

Not yet: expert parallelism together with tensor parallelism (expert-tensor parallelism) or context parallelism
(:func:`~modkit.parallel.mesh.check_ep` says why), and the capacity form.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional

import torch
from torch import Tensor, nn

from modkit.core.registry import Registry, get_registry

from .errors import ParallelError

#: Expert-parallel styles an ``ep_plan`` may use.
EP_STYLES: Mapping[str, str] = {
    "experts": "stacked copies [n_experts, ...] split on dim 0 over the ep ranks; rows dispatched by all-to-all",
}


@dataclass
class EPPlan:
    """The expert-parallel plan of a model for degree ``ep``.

    Attributes:
        ep: the degree.
        experts: ``{path of the stacked experts: path of the component holding them}``.
        sources: ``{path of the stacked experts: "kind/type"}``.
    """

    ep: int
    experts: dict[str, str] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def describe(self) -> list[str]:
        """One human line per split module: ``path: experts / ep (from kind/type)``."""
        return [f"{p}: experts / {self.ep} (from {self.sources[p]})" for p in self.experts]


def _name(entry) -> str:
    return f"{entry.kind}/{entry.type} (plugin {entry.provider})"


def expert_plan(model: nn.Module, ep: int, *, registry: Optional[Registry] = None, allow_empty: bool = False) -> EPPlan:
    """Compose and check the expert-parallel plan of ``model`` for degree ``ep`` (no process group; ``meta`` works).

    Args:
        model: a built model, before parallelisation.
        ep: expert-parallel degree (>= 1; 1 gives an empty plan).
        registry: the registry the model was built from (default: the process-wide one).
        allow_empty: a model with no experts gives an empty plan instead of the refusal (a pipeline stage whose
            layers are all dense: the model as a whole was checked).

    Raises:
        ParallelError: naming the layer path and the reason: a mixture declares no ``ep_plan``; its
            ``ep_refusal(ep)`` gives a reason (``ep`` does not divide ``n_experts``, capacity dispatch); a plan
            uses an unknown style or names a missing submodule; a split parameter's dim 0 is not divisible by
            ``ep``; no layer of the model has experts to split.
    """
    if not isinstance(ep, int) or ep < 1:
        raise ParallelError(f"expert-parallel degree must be a positive integer, got {ep!r}")
    plan = EPPlan(ep=ep)
    if ep == 1:
        return plan
    reg = registry or get_registry()
    modules = dict(model.named_modules())
    for path, module in modules.items():
        kind, typ = getattr(module, "modkit_kind", None), getattr(module, "modkit_type", None)
        if typ is None:
            continue
        entry = reg.get(kind, typ)
        comp_plan = entry.capabilities.get("ep_plan")
        if comp_plan is None:
            if entry.capabilities.get("aux_loss"):
                raise ParallelError(
                    f"{path}: {_name(entry)} declares no ep_plan capability, so its experts cannot be split over "
                    f"ep = {ep} ranks; train it without --ep, or declare e.g. capabilities={{'ep_plan': "
                    "{'experts': 'experts'}}"
                )
            continue
        _component(plan, path, module, entry, comp_plan, modules)
    if not plan.experts and not allow_empty:
        raise ParallelError(
            f"ep = {ep} asks for expert parallelism, but no layer of this model declares experts to split (no "
            "component has an ep_plan capability); use data parallelism (no --ep) for a dense model"
        )
    return plan


def _component(plan: EPPlan, path: str, module: nn.Module, entry, comp_plan, modules: dict) -> None:
    """Add one component's ``ep_plan`` items to ``plan``.

    Raises:
        ParallelError: see :func:`expert_plan`.
    """
    ep = plan.ep
    refusal = getattr(module, "ep_refusal", None)
    reason = refusal(ep) if callable(refusal) else None
    if reason:
        raise ParallelError(f"{path}: {_name(entry)} cannot be split over ep = {ep} ranks: {reason}")
    for sub, style in dict(comp_plan).items():
        full = f"{path}.{sub}" if path else sub
        if style not in EP_STYLES:
            raise ParallelError(f"{_name(entry)}: ep_plan[{sub!r}] = {style!r} is not a style; use {sorted(EP_STYLES)}")
        target = modules.get(full)
        if target is None:
            raise ParallelError(f"{_name(entry)}: ep_plan names {sub!r} but {path} has no submodule of that name")
        for name, p in target.named_parameters(recurse=False):
            if p.dim() == 0 or p.shape[0] % ep:
                raise ParallelError(
                    f"{full}.{name} (shape {list(p.shape)}): dim 0 (the expert index) is not divisible by ep = {ep}"
                )
        plan.experts[full] = path
        plan.sources[full] = f"{entry.kind}/{entry.type}"


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times ``scale`` on the way back."""

    @staticmethod
    def forward(ctx, x: Tensor, scale: float) -> Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad * ctx.scale, None


class AllToAllDispatch:
    """A mixture's ``dispatcher`` under expert parallelism: rows to their experts' ranks, through them, and back.

    ``dispatch(rows [N, d] sorted by expert, counts [E] int, run) -> [N, d]``, where ``run(rows [M, d], offs
    [E / ep] int32)`` applies the local experts (group ``g`` = rows ``[offs[g-1], offs[g])``). Rank ``r`` of the
    ``ep`` group holds experts ``[r E / ep, (r + 1) E / ep)``; rows arrive grouped by source rank then local
    expert and are regrouped by local expert (a stable sort) before ``run``. Both all-to-alls are
    ``torch.distributed._functional_collectives.all_to_all_single_autograd``: the backward sends the gradients
    the reverse way. One host synchronisation per call (the split sizes). Megatron-Core's
    ``MoEAlltoAllTokenDispatcher`` (dropless), torchtitan's ``ExpertParallel._token_dispatch``.

    Args:
        mesh: the 1-D ``ep`` DeviceMesh.
        n_experts: ``E``, divisible by the mesh size.
    """

    def __init__(self, mesh, n_experts: int):
        self.group = mesh.get_group()
        self.ep = mesh.size()
        self.n_local = n_experts // self.ep

    def __call__(self, rows: Tensor, counts: Tensor, run: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, nl = self.ep, self.n_local
        send = counts.to(torch.int64).reshape(ep, nl)  # [destination rank, its local expert]
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send, group=self.group)  # [source rank, my local expert]
        send_split, recv_split = send.sum(1).tolist(), recv.sum(1).tolist()
        got = all_to_all_single_autograd(rows, recv_split, send_split, self.group)
        expert = torch.arange(nl, device=rows.device).repeat(ep).repeat_interleave(recv.reshape(-1).to(rows.device))
        order = expert.argsort(stable=True)  # by local expert, source rank order inside each
        offs = recv.sum(0).cumsum(0).to(device=rows.device, dtype=torch.int32)
        # the experts' weight gradients collect every rank's tokens; FSDP2 averages them over dp_mod_ep only, so
        # they are scaled by 1 / ep here (the rows' own gradients are left whole): the data-parallel mean
        out = _ScaleGrad.apply(run(_ScaleGrad.apply(got[order], float(ep)), offs), 1.0 / ep)
        back = torch.empty_like(out).index_copy(0, order, out)  # arrival order again (differentiable)
        return all_to_all_single_autograd(back, send_split, recv_split, self.group)


def _apply_ep(model: nn.Module, ep_mesh, dp_group, registry: Optional[Registry]) -> EPPlan:
    """Split the experts of ``model`` over the 1-D ``ep_mesh`` in place (before FSDP2; best on ``meta``).

    Every parameter of a planned experts module becomes a ``Shard(0)`` DTensor on ``ep_mesh`` (the module reads
    ``to_local()``: its local ``[E / ep, ...]`` experts); its component gets an :class:`AllToAllDispatch` and
    ``token_group = dp_group``; the module is tagged ``modkit_ep_experts`` for :func:`_apply_fsdp`. The plan is
    kept as ``model.modkit_ep_plan``.

    Raises:
        ParallelError: see :func:`expert_plan`.
    """
    from torch.distributed.tensor import Shard, distribute_tensor

    # a pipeline stage (``modkit_stage``) may hold only dense layers: its model was checked as a whole
    plan = expert_plan(model, ep_mesh.size(), registry=registry, allow_empty=getattr(model, "modkit_stage", False))
    modules = dict(model.named_modules())
    for path, owner in plan.experts.items():
        experts = modules[path]
        for name, p in list(experts.named_parameters(recurse=False)):
            shard = distribute_tensor(p.data, ep_mesh, [Shard(0)], src_data_rank=None)
            experts.register_parameter(name, nn.Parameter(shard, requires_grad=p.requires_grad))
        experts.modkit_ep_experts = True
        component = modules[owner]
        component.dispatcher = AllToAllDispatch(ep_mesh, getattr(component, "n_experts", experts_count(experts)))
        component.token_group = dp_group
    model.modkit_ep_plan = plan
    return plan


def experts_count(experts: nn.Module) -> int:
    """The number of stacked copies of an experts module: dim 0 of its first parameter (global, for a DTensor)."""
    return int(next(experts.parameters()).shape[0])
