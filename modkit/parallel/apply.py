"""Applying a layout: :func:`parallelize` (tensor parallelism and FSDP2 on a model, in place),
:func:`materialize` with :class:`ShardedInit` (each rank allocates and initialises only its shards) and
:func:`build_parallel` (all three from a spec)."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from modkit.core.interfaces import Init
from modkit.core.registry import Registry

from .errors import ParallelError
from .expert import _apply_ep
from .fsdp import _apply_fsdp
from .mesh import _sub_mesh
from .plans import model_plan
from .styles import _grads_like_params, _shard_heads, _slice_heads_bias


# size: the keyword options of one layout (the mesh dims' names and FSDP2's settings), each forwarded as given
def parallelize(
    model: nn.Module,
    mesh,
    *,
    tp_dim: str = "tp",
    dp_dim: str = "dp",
    cp_dim: str = "cp",
    ep_dim: str = "ep",
    param_dtype: Union[str, torch.dtype, None] = None,
    reduce_dtype: Union[str, torch.dtype, None] = None,
    reshard_after_forward: bool = True,
    registry: Optional[Registry] = None,
) -> nn.Module:
    """Apply tensor parallelism and/or FSDP2 to ``model`` in place (best on a ``meta`` model; then :func:`materialize`).

    0. If the mesh has an ``ep_dim`` of size > 1 (:func:`make_mesh` with ``ep``): split the experts of every
       component declaring an ``ep_plan`` over it, with all-to-all token dispatch (:mod:`modkit.parallel.expert`).
    1. If the mesh has a ``tp_dim`` of size > 1: compose and validate the plan (:func:`model_plan`), apply it with
       ``parallelize_module``, divide the local attention modules' ``n_heads`` / ``n_kv_heads`` by ``tp`` and slice
       bias-type position schemes to the local heads.
    2. If it has a ``cp_dim`` of size > 1: context parallelism (:func:`~modkit.parallel.context.apply_context_parallel`:
       every mixer must declare it can be sequence-sharded).
    3. If it has a ``dp_dim`` or a ``cp_dim`` of size > 1: ``fully_shard`` every block (modules tagged ``placement``),
       then the root, with ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``, over the ``dp`` ranks (the flattened
       ``dp x cp`` ranks under context parallelism: each cp rank's gradient is of its slice's loss, and their mean
       is the whole sequence's, as torchtitan shards over ``dp_shard_cp``).

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
        ParallelError: see :func:`model_plan` and :func:`~modkit.parallel.expert.expert_plan`; a mesh naming none
            of the dims; a mixer that cannot be sequence-sharded under ``cp`` (named).
    """
    tp_mesh, dp_mesh = _sub_mesh(mesh, tp_dim), _sub_mesh(mesh, dp_dim)
    cp_mesh, ep_mesh = _sub_mesh(mesh, cp_dim), _sub_mesh(mesh, ep_dim)
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if not any(d in names for d in (tp_dim, dp_dim, cp_dim, ep_dim)):
        raise ParallelError(
            f"mesh dims {names} name none of {tp_dim!r}, {dp_dim!r}, {cp_dim!r}, {ep_dim!r}; build it with make_mesh"
        )
    if cp_mesh is not None:
        from .context import apply_context_parallel

        apply_context_parallel(model, cp_mesh)
        dp_mesh = cp_mesh if dp_mesh is None else mesh[dp_dim, cp_dim]._flatten(f"{dp_dim}_{cp_dim}")
    if tp_mesh is not None:
        _apply_tp(model, tp_mesh, registry)
    expert_mesh = None
    if ep_mesh is not None:
        if dp_mesh is None:
            raise ParallelError(f"mesh {names}: an {ep_dim!r} dim needs the flattened {dp_dim!r} dim; use make_mesh")
        _apply_ep(model, ep_mesh, dp_mesh.get_group(), registry)
        expert_mesh = mesh[f"{dp_dim}_mod_{ep_dim}"]
    if dp_mesh is not None:
        _apply_fsdp(model, dp_mesh, param_dtype, reduce_dtype, reshard_after_forward, expert_mesh=expert_mesh)
    return model


def _apply_tp(model: nn.Module, tp_mesh, registry: Optional[Registry]) -> None:
    """Step 1 of :func:`parallelize`: the plan applied on the 1-D ``tp_mesh``, in place.

    The styles of :meth:`TPPlan.parallel_styles` through ``parallelize_module``, the ``heads`` parameters
    sharded, the gradient-placement hook on every module holding a DTensor parameter, local head counts
    (``n_heads // tp``) and bias-type position schemes sliced to the local heads; the plan is kept as
    ``model.modkit_tp_plan``.

    Raises:
        ParallelError: see :func:`model_plan`.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    plan = model_plan(model, tp, registry=registry)
    parallelize_module(model, tp_mesh, plan.parallel_styles())
    for path in [p for p, style in plan.styles.items() if style == "heads"]:
        _shard_heads(model, path, tp_mesh)
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
            raise ValueError(
                f"init value of shape {tuple(full.shape)} for a parameter of global shape {tuple(t.shape)}"
            )
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
        parallel_options: ``param_dtype``, ``reduce_dtype``, ``reshard_after_forward``, ``tp_dim``, ``dp_dim``,
            ``ep_dim``.
    """
    from modkit.nn.build import build

    model = build(spec, device="meta", dtype=dtype, seed=seed, registry=registry)
    parallelize(model, mesh, registry=registry, **parallel_options)
    return materialize(model, device, seed=seed)
