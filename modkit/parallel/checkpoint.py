"""Checkpoints of a parallelised model: sharded (``torch.distributed.checkpoint``, each rank its own shards) and
consolidated (one safetensors file gathered to, or broadcast from, rank 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import torch
from torch import Tensor, nn

from modkit.core.errors import CheckpointError

from .fsdp import _dtype


def save_sharded(
    path: Union[str, Path],
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    *,
    flatten_optimizer: bool = False,
) -> None:
    """Save a sharded model (and optimiser) with ``torch.distributed.checkpoint``: every rank writes its shards.

    Collective: call on every rank. ``path`` is a directory shared by the ranks (one file per rank plus
    ``.metadata``). Reload on any mesh with :func:`load_sharded` (DCP reshards). ``flatten_optimizer`` writes the
    optimizer state with one hyper-parameter entry per parameter (``param_groups.<name>.lr``: torch's
    ``flatten_optimizer_state_dict``), as pipeline stages need (each rank's param groups hold other parameters);
    load it with the same flag.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(flatten_optimizer_state_dict=flatten_optimizer)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer, options=opts)
    dcp.save(state, checkpoint_id=str(path))


def load_sharded(
    path: Union[str, Path],
    model: nn.Module,
    optimizer: Optional[torch.optim.Optimizer] = None,
    *,
    flatten_optimizer: bool = False,
) -> None:
    """Load a :func:`save_sharded` checkpoint into a parallelised, materialised model (and optimiser), in place.

    Collective. Each rank reads the pieces overlapping its shards; the saving mesh may differ. Without a process
    group (one process) DCP reads the whole tensors. ``flatten_optimizer``: as the checkpoint was saved.

    Raises:
        CheckpointError: DCP could not match the checkpoint to the model (missing keys, shape mismatch).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(flatten_optimizer_state_dict=flatten_optimizer)
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optim"] = get_optimizer_state_dict(model, optimizer, options=opts)
    try:
        dcp.load(state, checkpoint_id=str(path))
    except Exception as exc:  # DCP wraps per-rank failures in CheckpointException
        raise CheckpointError(f"could not load sharded checkpoint {path}: {exc}") from exc
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optim"], options=opts)


def _rank() -> int:
    """This process's rank in the world (0 without a process group)."""
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def export_consolidated(
    path: Union[str, Path], model: nn.Module, *, dtype: Union[str, torch.dtype, None] = None
) -> Optional[dict]:
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
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    problem: list[Optional[str]] = [None]
    sd: dict[str, Tensor] = {}
    if _rank() == 0:
        sd, problem[0] = _read_consolidated(path, model)
    if dist.is_initialized():
        dist.broadcast_object_list(problem, src=0)
    if problem[0] is not None:
        raise CheckpointError(problem[0])
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, sd, options=opts)


def _read_consolidated(path: Union[str, Path], model: nn.Module) -> tuple[dict[str, Tensor], Optional[str]]:
    """Rank 0's half of :func:`load_consolidated`: the file's tensors, and what is wrong with them (or ``None``).

    Returns:
        ``(state dict, problem)``: ``problem`` names the read error, or the missing and unexpected tensors and
            the shape mismatches (five of each) against ``model.state_dict()``.
    """
    from safetensors.torch import load_file

    try:
        sd = load_file(str(path))
    except Exception as exc:
        return {}, f"cannot read {path}: {type(exc).__name__}: {exc}"
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    shapes = [
        f"{k}: file {tuple(sd[k].shape)} vs model {expected[k]}"
        for k in expected
        if k in sd and tuple(sd[k].shape) != expected[k]
    ]
    if missing or unexpected or shapes:
        return sd, (
            f"{path} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}, "
            f"shape mismatches {shapes[:5]}"
        )
    return sd, None
