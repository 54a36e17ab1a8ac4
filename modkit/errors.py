"""Error types raised by modkit. All carry enough context to fix the input without reading a traceback."""

from __future__ import annotations

from typing import Iterable


class ModkitError(Exception):
    """Base class of every error modkit raises on purpose."""


class SpecError(ModkitError, ValueError):
    """A spec (or a Hugging Face config being converted) is invalid.

    Attributes:
        errors: every problem found, as ``(path, message)`` pairs; ``path`` is a dotted JSON path such as
            ``block.attention.n_kv_heads`` or ``overrides[2].ffn.d_ff`` (empty for the document root).
    """

    def __init__(self, errors: Iterable[tuple[str, str]], *, source: str | None = None):
        self.errors: list[tuple[str, str]] = [(str(p), str(m)) for p, m in errors]
        self.source = source
        head = f"invalid spec {source}" if source else "invalid spec"
        lines = [f"{head}: {len(self.errors)} error(s)"]
        lines += [f"  {p or '<root>'}: {m}" for p, m in self.errors]
        super().__init__("\n".join(lines))


class RegistryError(ModkitError):
    """A plugin or component could not be registered (name clash, malformed entry, broken plugin in strict mode)."""


class CheckpointError(ModkitError, ValueError):
    """A checkpoint does not match the model (missing/unexpected tensors, shape mismatch, unsafe format)."""


class NonFiniteWeightsWarning(UserWarning):
    """A loaded checkpoint holds NaN or infinite values; the message counts them tensor by tensor.

    Pass ``nonfinite="error"`` to :func:`modkit.load` / :func:`modkit.from_hf` to refuse such a checkpoint.
    """


class MemoryLimitError(ModkitError, ValueError):
    """An allocation was refused before it started: the estimated bytes exceed the memory available.

    Attributes:
        needed: estimated bytes.
        available: bytes available on the device (``None`` when unknown).
    """

    def __init__(self, message: str, *, needed: int, available: int | None):
        self.needed = needed
        self.available = available
        super().__init__(message)


class ArgumentError(ModkitError, ValueError):
    """A function or command argument is invalid; the message names the parameter, the value and the fix.

    Attributes:
        name: the parameter's name (``temperature``, ``input_ids``, ``--max-new-tokens``); the message names it too.
    """

    def __init__(self, name: str, message: str):
        self.name = name
        super().__init__(message)
