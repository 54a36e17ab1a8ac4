"""Estimating memory before allocating it, and refusing what cannot fit.

A typo in a spec (``d_model: 163840``) or a CLI flag (``--max-new-tokens 1000000000000``) must not send the
process into a multi-terabyte allocation that either fails deep inside torch or, worse, succeeds through
overcommit and gets the machine's OOM killer involved. :func:`check_fits` compares an estimate with what the
device has free and raises :class:`~modkit.core.errors.MemoryLimitError` with both figures; callers offer a way around
it (``check_memory=False``; CLI ``--no-memory-check``) for the case the estimate is wrong.

Available memory: CUDA ``torch.cuda.mem_get_info`` (free bytes); CPU ``MemAvailable`` from ``/proc/meminfo``
(Linux; ``sysconf`` elsewhere), further limited by the process's address-space limit (``RLIMIT_AS``) when one is
set. Other device types report nothing and are not checked.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional, Union

import torch
from torch import nn

from modkit.core.errors import MemoryLimitError


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``; binary units up to TiB."""
    for div, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return f"{int(n)} B"


def _cpu_available() -> Optional[int]:
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            avail = soft if avail is None else min(avail, soft)
    except (ImportError, OSError, ValueError):
        pass
    return avail


def available_bytes(device: Union[str, torch.device]) -> Optional[int]:
    """Free memory on ``device`` in bytes, or ``None`` when it cannot be told (meta, MPS, ...)."""
    device = torch.device(device)
    if device.type == "cpu":
        return _cpu_available()
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            free, _ = torch.cuda.mem_get_info(device)
            return int(free)
        except (RuntimeError, AssertionError):
            return None
    return None


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of distinct ``tensors`` (a tensor listed twice, e.g. a tied weight, counts once)."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    return total


def module_bytes(module: nn.Module) -> int:
    """Bytes the parameters and buffers of ``module`` (e.g. built on ``meta``) take once materialised."""
    return tensor_bytes(list(module.parameters()) + list(module.buffers()))


def check_fits(needed: int, device: Union[str, torch.device], what: str, *, hint: str = "") -> None:
    """Raise :class:`~modkit.core.errors.MemoryLimitError` when ``needed`` bytes exceed what ``device`` has free.

    Args:
        needed: the estimate, in bytes.
        device: where the allocation would happen (meta and devices that report nothing are never refused).
        what: what would be allocated, for the message (``"the weights and buffers of this model (float32)"``).
        hint: how to need less, appended to the message.
    """
    device = torch.device(device)
    if device.type == "meta":
        return
    avail = available_bytes(device)
    if avail is None or needed <= avail:
        return
    raise MemoryLimitError(
        f"{what} would need about {format_bytes(needed)} ({needed:,} bytes) on {device}, but only "
        f"{format_bytes(avail)} is available; {hint + '; ' if hint else ''}pass check_memory=False "
        "(CLI: --no-memory-check) to try anyway",
        needed=needed,
        available=avail,
    )
