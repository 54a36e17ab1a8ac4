"""The process layout of a training run: one process, or the ``torchrun`` ranks on a ``("dp", "tp")`` device mesh
(data parallel with FSDP2, tensor parallel), and the few collectives the loop needs (barrier, mean, broadcast)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .config import TrainConfig
from .errors import TrainError


@dataclass
class Processes:
    """The process layout of a run: ``world = pp * dp * cp * tp`` ranks on a ``("dp", "tp")`` mesh, or
    ``("pp", "dp", "cp", "tp")`` with context or pipeline parallelism (one process: all 1)."""

    world: int = 1
    rank: int = 0
    dp: int = 1
    dp_rank: int = 0
    tp: int = 1
    #: context-parallel degree (ranks sharing one sequence)
    cp: int = 1
    #: expert-parallel degree (data-parallel ranks whose experts are split among them)
    ep: int = 1
    #: pipeline-parallel degree (stages of the model, one per group of ``world / pp`` ranks)
    pp: int = 1
    mesh: Any = None
    #: True when this run joined the process group itself (launched by torchrun, no group before it)
    owns_group: bool = False

    @property
    def main(self) -> bool:
        """Rank 0 writes the run folder's shared files."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one process."""
        return self.world > 1

    def close(self) -> None:
        """Leave the process group this run joined (every rank, after a barrier), as PyTorch asks of a finished
        program: a gloo rank that exits with its group alive can abort in the interpreter's teardown ("terminate
        called without an active exception") after its work is done. A group the caller created is left alone.
        Called only after a run that finished on every rank: a rank that failed must not wait in a collective."""
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
            self.owns_group = False

    def barrier(self) -> None:
        """Wait for every rank (no-op on one process)."""
        if self.distributed:
            torch.distributed.barrier()

    def mean(self, value: Tensor) -> Tensor:
        """The mean of a scalar tensor over all ranks (tensor-parallel replicas hold equal values); a tensor of a
        few values element by element (one all-reduce)."""
        if not self.distributed:
            return value
        from ..parallel import mean_across_ranks

        return mean_across_ranks(value)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if not self.distributed:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def init_processes(config: TrainConfig, device: torch.device) -> Processes:
    """Join the process group that ``torchrun`` describes (``WORLD_SIZE`` > 1) and build the mesh.

    gloo on the CPU, NCCL on CUDA (each rank on ``cuda:LOCAL_RANK``). One process: nothing to do.

    Context parallelism (``cp`` > 1) puts ``cp`` ranks on one sequence and pipeline parallelism (``pp`` > 1) cuts
    the model into ``pp`` stages: the mesh is ``("pp", "dp", "cp", "tp")`` and ``dp = world / (pp · tp · cp)``.

    Raises:
        TrainError: ``pp · tp · cp`` does not divide the world size, or ``batch_size`` is not divisible by the
            data-parallel degree, or ``seq_len`` by ``cp``, or ``tp``, ``cp``, ``ep`` or ``pp`` > 1 on one process, or ``ep``
            does not divide the data-parallel degree or comes with ``tp`` or ``cp`` > 1.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    inner = config.tp * config.cp * config.pp
    if world <= 1:
        if inner > 1 or config.ep > 1:
            degrees = (("pp", config.pp), ("tp", config.tp), ("cp", config.cp), ("ep", config.ep))
            named = " x ".join(f"{k} = {v}" for k, v in degrees if v > 1)
            n = max(inner, config.ep)
            raise TrainError(f"{named} needs {n} processes or more: launch with torchrun --nproc-per-node N")
        return Processes()
    import torch.distributed as dist

    from ..parallel import ParallelError, make_mesh
    from ..parallel.mesh import check_ep

    owns_group = not dist.is_initialized()
    if owns_group:
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % inner:
        raise TrainError(
            f"pp = {config.pp} x tp = {config.tp} x cp = {config.cp} does not divide the number of processes {world}"
        )
    dp = world // inner
    if config.batch_size % dp:
        raise TrainError(f"batch_size = {config.batch_size} is not divisible by the {dp} data-parallel processes")
    if config.seq_len % config.cp:
        raise TrainError(f"seq_len = {config.seq_len} is not divisible by cp = {config.cp} (one slice per rank)")
    try:
        check_ep(config.ep, dp, config.tp, cp=config.cp)
    except ParallelError as exc:
        raise TrainError(f"ep: {exc}") from None
    mesh = make_mesh(tp=config.tp, dp=dp, ep=config.ep, cp=config.cp, pp=config.pp, device_type=device.type)
    return Processes(
        world=world,
        rank=rank,
        dp=dp,
        dp_rank=mesh["dp"].get_local_rank(),
        tp=config.tp,
        cp=config.cp,
        ep=config.ep,
        pp=config.pp,
        mesh=mesh,
        owns_group=owns_group,
    )
