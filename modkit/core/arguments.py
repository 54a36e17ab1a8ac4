"""Checks of Python arguments shared by :mod:`modkit.nn.build` and :mod:`modkit.inference.generate` (a module below both, so
their imports point one way: ``generate`` imports ``build``, never the reverse).

An integer argument is checked against its bound before it reaches torch, so that a value torch cannot hold
(``2**64`` where an int64 belongs) is refused with a message naming the parameter, the value and the bound rather
than torch's ``Overflow when unpacking long long``.
"""

from __future__ import annotations

import numbers
from typing import Any, Mapping, Optional

from modkit.core.errors import ArgumentError

#: largest seed ``torch.Generator.manual_seed`` takes (seeds are unsigned 64-bit)
MAX_SEED = 2**64 - 1


def param_name(names: Optional[Mapping[str, str]], key: str) -> str:
    """How to call parameter ``key`` in a message: ``names[key]`` (the CLI passes ``{"seed": "--seed"}``) or ``key``."""
    return (names or {}).get(key, key)


def is_int(value: Any) -> bool:
    """An integer that is not a bool (``numbers.Integral``: ``int``, numpy integers)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """A real number that is not a bool (``numbers.Real``)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def shown(value: Any, limit: int = 40) -> str:
    """A short text of an argument's value for a message: its ``repr`` cut at ``limit`` characters, containers as
    bounded JSON (:func:`modkit.core.validation.json_value`: a list nested 10,000 levels deep is no ``RecursionError``)."""
    if isinstance(value, (dict, list, tuple)):
        from modkit.core.validation import json_value

        return json_value(value, limit)
    try:
        return f"{value!r:.{limit}}"
    except Exception:  # noqa: BLE001 - a broken __repr__ must not break the message
        return f"<{type(value).__name__}>"


def check_int(
    value: Any,
    key: str,
    names: Optional[Mapping[str, str]] = None,
    *,
    minimum: int,
    maximum: Optional[int] = None,
    what: str = "an integer",
) -> int:
    """``value`` as an ``int`` after checking it is an integer (a one-element integer tensor counts) in
    ``[minimum, maximum]`` (no upper bound when ``maximum`` is ``None``).

    Args:
        key: the parameter's name; ``names`` maps it to what the message calls it (see :func:`param_name`).
        what: what the value must be, for the message (``"an integer token id"``).

    Raises:
        ArgumentError: (a ``ValueError``) naming the parameter, the value and the bound:
            ``seed must be in [0, 18446744073709551615], got 18446744073709551616``.
    """
    import torch

    name = param_name(names, key)
    if (
        isinstance(value, torch.Tensor)
        and value.numel() == 1
        and not value.is_floating_point()
        and value.dtype != torch.bool
    ):
        value = int(value)
    if not is_int(value):
        raise ArgumentError(name, f"{name} must be {what}, got {type(value).__name__} {shown(value)}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ArgumentError(name, f"{name} must be {bound}, got {value}")
    return int(value)
