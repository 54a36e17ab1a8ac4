"""Error types raised by modkit. All carry enough context to fix the input without reading a traceback."""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator


class ModkitError(Exception):
    """Base class of every error modkit raises on purpose.

    It pickles with its message and every attribute (``errors``, ``source``, ``needed``...), whatever arguments a
    subclass's ``__init__`` takes, so an error raised in a worker process (``modkit compare --jobs N``) reaches the
    caller as it was raised.
    """

    def __reduce__(self):
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type, args: tuple, state: dict) -> ModkitError:
    """Unpickle a :class:`ModkitError` without calling its subclass's ``__init__`` (see ``ModkitError.__reduce__``)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


@contextlib.contextmanager
def reading(what: str) -> Iterator[None]:
    """Say what was being read when an exception that is not modkit's own passes through: a library's error
    (``Corrupt snappy compressed data.``, ``embedded null byte``) names no file, so the note ``while reading
    {what}`` is added to it (``exc.__notes__``, which tracebacks print and the ``modkit`` command's reporter shows).
    A :class:`ModkitError` already names what it is about and passes unchanged; nothing is caught.

    Use around the code that reads one input: ``with reading(f"{path} (a Parquet file)"): ...``.
    """
    try:
        yield
    except ModkitError:
        raise
    except Exception as exc:
        notes = getattr(exc, "__notes__", None)
        note = f"while reading {what}"
        if notes is None or note not in notes:
            exc.add_note(note)
        raise


class SpecError(ModkitError, ValueError):
    """A spec (or a Hugging Face config being converted) is invalid.

    Attributes:
        errors: every problem found, as ``(path, message)`` pairs; ``path`` is a JSON path such as
            ``block.attention.n_kv_heads``, ``overrides[2].ffn.d_ff`` or ``block["a.b"]`` (a key that is not an
            identifier is quoted; empty for the document root), which :func:`modkit.core.validation.resolve_path` resolves
            back to the node of the document.
    """

    #: what is invalid, in the first line of the message (``subject=`` overrides it for one error)
    subject = "spec"

    def __init__(self, errors: Iterable[tuple[str, str]], *, source: str | None = None, subject: str | None = None):
        self.errors: list[tuple[str, str]] = [(str(p), str(m)) for p, m in errors]
        self.source = source
        if subject is not None:
            self.subject = subject
        head = f"invalid {self.subject} {source}" if source else f"invalid {self.subject}"
        lines = [f"{head}: {len(self.errors)} error(s)"]
        lines += [f"  {p or '<root>'}: {m}" for p, m in self.errors]
        super().__init__("\n".join(lines))


class SamplingError(SpecError):
    """A sampling pipeline (keyword arguments or JSON list of logits processors and stop conditions) is invalid;
    ``errors`` name each argument or list item (``top_p``, ``[1].p``)."""

    subject = "sampling"


class RegistryError(ModkitError):
    """A plugin or component could not be registered (name clash, malformed entry, broken plugin in strict mode)."""


class CheckpointError(ModkitError, ValueError):
    """A checkpoint does not match the model (missing/unexpected tensors, shape mismatch, unsafe format)."""


class NonFiniteWeightsWarning(UserWarning):
    """A loaded checkpoint holds NaN or infinite values; the message counts them tensor by tensor.

    Pass ``nonfinite="error"`` to :func:`modkit.load` / :func:`modkit.from_hf` to refuse such a checkpoint.
    """


class LeftOutTensorsWarning(UserWarning):
    """A checkpoint holds tensors outside the model being loaded, declared so by its converter and left out unread:
    the vision tower and projector of a vision-language checkpoint whose language model is loaded. One warning per
    load names how many tensors were left out under which name prefixes (see :func:`modkit.from_hf`)."""


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


class DataError(ModkitError, ValueError):
    """Training data cannot be prepared or loaded: a missing, empty or non-UTF-8 input, a bad JSON Lines record, a
    tokenizer that cannot encode the text, a bad option (``val_fraction``, ``batch_size``, ...), or a prepared
    dataset whose files do not match its ``meta.json``. The message names the file (and line) and the fix."""


class MaxSeqLenWarning(UserWarning):
    """Generation runs past the ``max_seq_len`` a model was specified for, as asked (``max_len=`` of
    :func:`modkit.inference.generate.generate`, ``--max-len`` of ``modkit generate``); its position schemes compute any
    position, but the model was not trained that far."""


class SpecWarning(UserWarning):
    """A spec (or a Hugging Face config being converted) is accepted, but something in it deserves attention: a
    component alias whose meaning changed, a config key the converter does not know and dropped."""


class UnknownConfigKeyWarning(SpecWarning):
    """A Hugging Face config holds keys its converter does not know; they were dropped (see :func:`modkit.from_hf_config`).

    Attributes:
        model_type: the config's ``model_type``.
        keys: ``{key: value}`` of every dropped key (nested keys as paths, e.g. ``rope_scaling.foo``; a key that is not
            an identifier quoted, ``rope_scaling["a.b"]``: see :mod:`modkit.core.validation`).
    """

    def __init__(self, model_type: str, keys: dict):
        self.model_type = model_type
        self.keys = dict(keys)
        from modkit.core.validation import json_value  # (bounded: a value nested 10,000 levels deep gives a short text)

        listed = ", ".join(
            f"{k} = {json_value(v) if isinstance(v, (dict, list, tuple)) else repr(v)}" for k, v in self.keys.items()
        )
        super().__init__(
            f"Hugging Face {model_type} config: dropped {len(self.keys)} key(s) the converter does not know: {listed}. "
            "transformers ignores keys its config class does not read, and the converter reads every key that shapes a "
            f"{model_type} network, so the model is the same; convert with strict=True (modkit convert hf --strict) to "
            "refuse unknown keys instead"
        )
