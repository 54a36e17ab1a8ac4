"""Device meshes: the ``("dp", "tp")`` mesh over the world and the per-rank counts of sharded tensors."""

from __future__ import annotations

from typing import Optional

import torch

from .errors import ParallelError


def make_mesh(
    tp: int = 1, dp: Optional[int] = None, *, ep: int = 1, cp: int = 1, pp: int = 1, device_type: Optional[str] = None
):
    """A ``DeviceMesh`` over the initialised world: ``("dp", "tp")`` (``dp * tp == world_size``); with context or
    pipeline parallelism ``("pp", "dp", "cp", "tp")`` (``pp * dp * cp * tp == world_size``; outermost first, as
    torchtitan orders them: the pipeline's stages across nodes, tensor parallelism inside one); with expert
    parallelism ``("dp_mod_ep", "ep", "tp")``, or ``("pp", "dp_mod_ep", "ep", "tp")`` with pipeline stages too,
    whose ``dp_mod_ep`` and ``ep`` dims flattened are ``"dp"`` (``mesh["dp"]`` works on every layout).

    Expert parallelism borrows from the data-parallel ranks (torchtitan's layout): the ``dp`` ranks read different
    tokens, the experts are split over groups of ``ep`` neighbouring data-parallel ranks and FSDP2-sharded over the
    ``dp / ep`` groups (:mod:`modkit.parallel.expert`).

    Args:
        tp: tensor-parallel degree (inner dimension: neighbouring ranks, i.e. the GPUs of one node).
        dp: data-parallel / FSDP degree; default ``world_size // (tp * cp * pp)``.
        ep: expert-parallel degree, dividing ``dp`` (1: none).
        cp: context-parallel degree (ranks sharing one sequence; :mod:`modkit.parallel.context`).
        pp: pipeline-parallel degree (stages; :mod:`modkit.parallel.pipeline`).
        device_type: ``"cuda"`` when CUDA is available, else ``"cpu"`` (gloo).

    Raises:
        ParallelError: no process group; the degrees' product differs from the world size; ``ep`` does not divide
            ``dp``; ``ep > 1`` with ``tp`` or ``cp`` > 1 (:func:`check_ep` names the reason).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        raise ParallelError(
            "torch.distributed is not initialised; launch with torchrun and call init_process_group first"
        )
    world = dist.get_world_size()
    inner = tp * cp * pp
    if min(tp, cp, pp) < 1 or world % inner:
        raise ParallelError(f"tp = {tp} x cp = {cp} x pp = {pp} = {inner} does not divide the world size {world}")
    dp = world // inner if dp is None else dp
    if dp * inner != world:
        raise ParallelError(
            f"mesh pp = {pp} x dp = {dp} x cp = {cp} x tp = {tp} = {dp * inner} differs from the world size {world}"
        )
    device_type = device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    if ep == 1 and cp == 1 and pp == 1:
        return init_device_mesh(device_type, (dp, tp), mesh_dim_names=("dp", "tp"))
    if ep == 1:
        return init_device_mesh(device_type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    check_ep(ep, dp, tp, cp=cp, pp=pp)
    if pp == 1:
        mesh = init_device_mesh(device_type, (dp // ep, ep, tp), mesh_dim_names=("dp_mod_ep", "ep", "tp"))
    else:
        names = ("pp", "dp_mod_ep", "ep", "tp")
        mesh = init_device_mesh(device_type, (pp, dp // ep, ep, tp), mesh_dim_names=names)
    mesh[("dp_mod_ep", "ep")]._flatten("dp")
    return mesh


def check_ep(ep: int, dp: int, tp: int, *, cp: int = 1, pp: int = 1) -> None:
    """Refuse an expert-parallel degree the mesh cannot hold.

    Expert parallelism composes with FSDP2 (``ep | dp``) and with pipeline stages (``pp``: each stage's experts
    split over the ``ep`` ranks of that stage). Not with tensor parallelism: under ``tp`` the experts take the
    ``grouped`` style (each TP rank holds a slice of every expert's hidden width and computes every token), and
    splitting them over ``ep`` as well would put each expert on a 2-D (``ep`` x ``tp``) mesh, with the all-to-all
    run once per TP rank and the partial outputs summed over ``tp`` after the return trip (Megatron-Core's
    expert-tensor parallelism): not built. Nor with context parallelism: the sequence slices of one row would be
    routed on different ranks while the aux losses' per-sequence statistics need the whole row.

    Raises:
        ParallelError: ``ep`` is not a positive integer dividing ``dp``, or ``ep > 1`` with ``tp`` or ``cp`` > 1,
            naming the reason and the layouts that work.
    """
    if not isinstance(ep, int) or ep < 1 or dp % ep:
        raise ParallelError(
            f"expert-parallel degree ep = {ep!r} does not divide the data-parallel degree dp = {dp} (expert "
            "parallelism borrows from the data-parallel ranks: world = dp x tp, ep | dp)"
        )
    if ep > 1 and tp > 1:
        raise ParallelError(
            f"ep = {ep} with tp = {tp}: expert parallelism together with tensor parallelism (expert-tensor "
            "parallelism) is not implemented yet: tensor parallelism already slices every expert's hidden width over "
            "the tp ranks, and splitting the experts over ep too would need the all-to-all dispatch per tp rank and "
            "the partial outputs summed over tp after it; use --ep with FSDP2 and --pp (tp = 1), or --tp without --ep"
        )
    if ep > 1 and cp > 1:
        raise ParallelError(
            f"ep = {ep} with cp = {cp}: expert parallelism together with context parallelism is not implemented "
            "yet: the aux losses' per-sequence statistics would be split over the cp ranks; use --ep with FSDP2 "
            "and --pp, or --cp without --ep"
        )


def _sub_mesh(mesh, name: str):
    """The 1-D sub-mesh named ``name`` of ``mesh``, or ``None`` when it has no such dim or it has size 1."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    if name not in names:
        try:
            sub = mesh[name]  # a flattened dim ("dp" of the expert-parallel mesh)
        except (KeyError, RuntimeError, ValueError):
            return None
    else:
        sub = mesh[name] if len(names) > 1 else mesh
    return sub if sub.size() > 1 else None


def _shard_count(t) -> int:
    """Into how many pieces the placements of DTensor ``t`` cut it: the product of the mesh sizes of its
    ``Shard`` and ``_StridedShard`` dims (FSDP x TP on one dim; not a ``Shard`` subclass); 1 when replicated."""
    from torch.distributed.tensor.placement_types import _StridedShard

    shards = 1
    for i, pl in enumerate(t.placements):
        if pl.is_shard() or isinstance(pl, _StridedShard):
            shards *= t.device_mesh.size(i)
    return shards
