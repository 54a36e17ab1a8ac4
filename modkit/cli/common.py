"""Inputs several ``modkit`` commands share: the registry, a spec path, a torch device (imported when called)."""

from __future__ import annotations

from pathlib import Path

from .errors import UserError


def _registry():
    """The process-wide registry (loads the plugins, and torch, on first use)."""
    import modkit

    return modkit.get_registry()


def _spec_path(text: str) -> Path:
    """``text`` as the path of an existing spec file; FileNotFoundError or a :class:`UserError` for a folder."""
    if "\x00" in text:  # os.stat would raise a bare "embedded null byte"
        raise UserError(f"{text!r}: the path contains a NUL byte; give the path of a spec .json file")
    path = Path(text)
    if not path.exists():
        raise FileNotFoundError(f"{text}: no such file")
    if path.is_dir():
        raise UserError(f"{text} is a directory; give a spec .json file")
    return path


def _check_device(text: str):
    """``text`` as a usable ``torch.device`` (an empty tensor is made there), or a :class:`UserError` saying why not."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise UserError(
            f"invalid device {text!r}; use cpu, meta, cuda or cuda:N (any torch device type works)"
        ) from None
    if device.type == "meta":
        return device
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {text!r} requested but CUDA is not available here; use --device cpu or meta")
    try:
        torch.empty(1, device=device)
    except Exception as exc:  # noqa: BLE001 - any backend failure means the device is unusable
        raise UserError(f"device {text!r} is not usable: {type(exc).__name__}: {exc}") from None
    return device


def _sync(device) -> None:
    """Wait for the device's queued work (CUDA), so that wall-clock timings cover it."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
