"""The argument checks of :func:`modkit.inference.generate.stream_generate` (and of ``modkit generate``): each
argument refused with an :class:`~modkit.core.errors.ArgumentError` naming it, before any work.

The prompt's token ids and mask, ``eos_token_id``, the three classic sampling keywords, the loop's integers and the
length a row may reach (``max_len`` against the model's position schemes).
"""

from __future__ import annotations

import math
import numbers
import warnings
from typing import Any, Mapping, Optional, Sequence, Union

import torch
from torch import Tensor

from modkit.core.arguments import MAX_SEED, check_int, is_int, is_real, param_name, shown
from modkit.core.errors import ArgumentError, MaxSeqLenWarning
from modkit.core.limits import MAX_SEQ_LEN
from modkit.nn.model import Model

_name, _is_int, _is_real, _check_int = param_name, is_int, is_real, check_int


def check_sampling(
    temperature: Any = 1.0, top_k: Any = None, top_p: Any = None, *, names: Optional[Mapping[str, str]] = None
) -> None:
    """Check the three classic sampling keywords, each as a Python argument (before the pipeline is built):
    ``temperature`` a finite number >= 0 or ``None`` (not given), ``top_k`` an integer >= 1 or ``None``, ``top_p``
    a number in (0, 1] or ``None``. The pipeline (:func:`~modkit.inference.generate.build_sampler`) then validates
    every processor's values against its config.

    Args:
        names: how to call each parameter in messages (the CLI passes ``{"temperature": "--temperature", ...}``).

    Raises:
        ArgumentError: (a ``ValueError``) naming the parameter and the value.
    """
    name = _name(names, "temperature")
    bad = not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0
    if temperature is not None and bad:
        raise ArgumentError(name, f"{name} must be a finite number >= 0 (0 is greedy), got {shown(temperature)}")
    if top_k is not None:
        _check_int(top_k, "top_k", names, minimum=1)
    if top_p is not None:
        name = _name(names, "top_p")
        if not _is_real(top_p) or not math.isfinite(top_p) or not 0 < top_p <= 1:
            raise ArgumentError(name, f"{name} must be in (0, 1], got {shown(top_p)}")


def check_generation(
    max_new_tokens: Any,
    *,
    seed: Any = None,
    prefill_chunk: Any = None,
    max_len: Any = None,
    names: Optional[Mapping[str, str]] = None,
) -> None:
    """Check ``max_new_tokens`` (an integer >= 0), ``seed`` (``None`` or an integer in [0, 2**64 - 1]),
    ``prefill_chunk`` (``None`` or an integer >= 1) and ``max_len`` (``None`` or an integer in [1, 2**27],
    :data:`~modkit.core.limits.MAX_SEQ_LEN`), each on its own (:func:`~modkit.inference.generate.stream_generate`
    checks them against the model).

    Raises:
        ArgumentError: naming the parameter, the value and the bound.
    """
    check_int(max_new_tokens, "max_new_tokens", names, minimum=0)
    if seed is not None:
        check_int(seed, "seed", names, minimum=0, maximum=MAX_SEED)
    if prefill_chunk is not None:
        check_int(prefill_chunk, "prefill_chunk", names, minimum=1)
    if max_len is not None:
        check_int(max_len, "max_len", names, minimum=1, maximum=MAX_SEQ_LEN)


def _token_tensor(value: Any, name: str, vocab_size: Optional[int] = None) -> Tensor:
    """``value`` (a tensor or nested sequences) as an int64 tensor, refusing floats, bools and ints outside
    ``[0, vocab_size)`` (outside int64 when ``vocab_size`` is ``None``) before torch converts them (torch would
    truncate ``1.7``, read ``True`` as 1 and fail on ``2**64`` with ``Overflow when unpacking long long``)."""
    if isinstance(value, Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            dtype = str(value.dtype).replace("torch.", "")
            raise ArgumentError(name, f"{name} must hold integer token ids, got a {dtype} tensor")
        return value.long()
    if value is None or isinstance(value, (str, bytes, numbers.Number)):
        raise ArgumentError(
            name, f"{name} must be a [batch, seq] sequence of integer token ids, got {type(value).__name__}"
        )
    stack, leaves = [value], 0
    while stack:  # refuse floats and bools before torch truncates 1.7 to 1 or reads True as 1
        node = stack.pop()
        if isinstance(node, Tensor):
            continue
        if isinstance(node, (list, tuple)):
            stack.extend(node)
            continue
        leaves += 1
        if not _is_int(node):
            raise ArgumentError(name, f"{name} must hold integer token ids, got {type(node).__name__} {shown(node)}")
        if vocab_size is not None and not 0 <= node < vocab_size:
            raise ArgumentError(name, f"{name} must lie in [0, {vocab_size}) (the vocabulary); got the token id {node}")
        if not -(2**63) <= node < 2**63:
            raise ArgumentError(
                name,
                f"{name} holds {node}, outside the int64 range [-2**63, 2**63) of token ids; "
                "token ids lie in [0, vocab_size)",
            )
    try:
        return torch.as_tensor(value, dtype=torch.long)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise ArgumentError(
            name, f"{name} must be a rectangular [batch, seq] sequence of integer token ids ({exc})"
        ) from None


def _check_range(ids: Tensor, vocab_size: int, name: str) -> None:
    if ids.numel() and (bool((ids < 0).any()) or bool((ids >= vocab_size).any())):
        lo, hi = int(ids.min()), int(ids.max())
        raise ArgumentError(name, f"{name} must lie in [0, {vocab_size}) (the vocabulary); got min {lo}, max {hi}")


def _check_mask(mask: Any, ids: Tensor) -> Tensor:
    name = "attention_mask"
    if not isinstance(mask, Tensor):
        mask = _token_tensor(mask, name)
    if mask.is_floating_point() or mask.is_complex():
        raise ArgumentError(
            name, f"{name} must be bool or integer (1 for a real token, 0 for padding), got {mask.dtype}"
        )
    if tuple(mask.shape) != tuple(ids.shape):
        raise ArgumentError(name, f"{name} must have the prompt's shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        if bool(((mask != 0) & (mask != 1)).any()):
            raise ArgumentError(name, f"{name} must hold only 0 (padding) and 1 (a real token)")
        mask = mask != 0
    mask = mask.to(ids.device)
    empty = ~mask.any(dim=1)
    if bool(empty.any()):
        row = int(empty.nonzero()[0])
        raise ArgumentError(name, f"{name} row {row} is all padding; every row needs at least one real token")
    # left padding only: once a row has a real token, every later position is real (cumulative max stays 1)
    right = mask.int().cummax(dim=1).values.bool() & ~mask
    if bool(right.any()):
        row = int(right.any(dim=1).nonzero()[0])
        raise ArgumentError(
            name,
            f"{name} row {row} has padding after a real token; generate needs the padding on "
            "the left (left-pad ragged prompts: the new tokens follow the last column)",
        )
    return mask


def _check_eos(eos_token_id: Any, vocab_size: int) -> list[int]:
    name = "eos_token_id"
    if eos_token_id is None:
        return []
    values = [eos_token_id] if not isinstance(eos_token_id, (list, tuple, Tensor)) else list(eos_token_id)
    out = []
    for v in values:
        what = "an integer token id (or a list of them)"
        v = _check_int(v, name, None, minimum=0, maximum=vocab_size - 1, what=what)
        out.append(v)
    return out


def _as_batch(
    input_ids: Union[Tensor, Sequence[int], Sequence[Sequence[int]]], vocab_size: Optional[int] = None
) -> Tensor:
    """The prompt as ``[batch, seq]`` int64 (one sequence becomes a batch of one).

    Raises:
        ArgumentError: naming ``input_ids``: not integer token ids (or outside ``[0, vocab_size)``), ragged, or empty.
    """
    ids = _token_tensor(input_ids, "input_ids", vocab_size)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        shape = tuple(ids.shape)
        raise ArgumentError("input_ids", f"input_ids must be a non-empty [batch, seq] sequence, got shape {shape}")
    return ids


def _check_length(model: Model, prompt_len: int, max_new_tokens: int, limit: int, max_len: Any) -> None:
    """Refuse ``prompt_len + max_new_tokens`` positions past ``limit`` (:func:`_length_limit` of ``max_len``); warn
    (:class:`~modkit.core.errors.MaxSeqLenWarning`) past the spec's ``max_seq_len``.

    Raises:
        ArgumentError: naming ``max_new_tokens``, the position reached and the bound.
    """
    spec = model.spec
    total = prompt_len + max_new_tokens
    if total > limit:
        bound = f"max_len = {limit}" if max_len is not None else f"the model's max_seq_len = {spec.max_seq_len}"
        hint = ""
        if max_len is None and not _table_positions(model):
            hint = (
                f"; or pass max_len={total} (the model's position schemes compute any position, "
                "so generation may run past max_seq_len on request)"
            )
        raise ArgumentError(
            "max_new_tokens",
            f"a prompt of {prompt_len} tokens plus max_new_tokens = {max_new_tokens} reaches position {total - 1}, "
            f"past {bound}; generate at most {max(limit - prompt_len, 0)} new tokens or shorten the prompt{hint}",
        )
    if total > spec.max_seq_len:
        warnings.warn(
            MaxSeqLenWarning(
                f"generating up to position {total - 1} (max_len = {limit}), past the max_seq_len = "
                f"{spec.max_seq_len} the model was specified for; its position schemes compute any position, but it was "
                "trained (if at all) on at most max_seq_len tokens, so quality past that is not known"
            ),
            stacklevel=4,
        )  # the caller of stream_generate (stream_generate -> _checked -> here)


def _table_positions(model: Model) -> list[str]:
    """``type (provider)`` of each position scheme of ``model``'s layers that does not declare the
    ``unbounded_positions`` capability (a table of ``max_seq_len`` rows, or a scheme the registry does not know)."""
    from modkit.core.registry import get_registry

    reg = get_registry()
    spec = model.spec
    found: dict[str, None] = {}
    for cfg in [spec.position] + [spec.layer(i).position for i in range(spec.n_layers)]:
        try:
            entry = reg.entry_for_config(cfg, "position")
        except Exception:  # noqa: BLE001 - not in this registry: nothing is declared
            found[f"{getattr(cfg, 'type', type(cfg).__name__)!r} (not registered here)"] = None
            continue
        if not entry.capabilities.get("unbounded_positions"):
            found[f"{entry.type!r} ({entry.provider})"] = None
    return list(found)


def _length_limit(model: Model, max_len: Any) -> int:
    """The most positions a row may reach: ``max_len`` checked (see
    :func:`~modkit.inference.generate.stream_generate`), or ``max_seq_len``.

    Raises:
        ArgumentError: ``max_len`` not an integer in [1, 2**27], or past ``max_seq_len`` for a position scheme
            with a table of ``max_seq_len`` rows.
    """
    spec = model.spec
    if max_len is None:
        return spec.max_seq_len
    max_len = check_int(max_len, "max_len", None, minimum=1, maximum=MAX_SEQ_LEN)
    if max_len > spec.max_seq_len:
        tables = _table_positions(model)
        if tables:
            raise ArgumentError(
                "max_len",
                f"max_len = {max_len} is past the model's max_seq_len = {spec.max_seq_len}, and position type "
                f"{', '.join(tables)} does not declare 'unbounded_positions' (a table of max_seq_len rows has no row "
                "for a later position); generate at most max_seq_len positions, or raise max_seq_len in the spec "
                "and train",
            )
    return max_len
