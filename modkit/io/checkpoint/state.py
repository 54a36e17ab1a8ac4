"""A complete modkit state dict into a model: :func:`materialize` (built on ``meta``, filled without a random init,
every name, shape and dtype checked) and the count of non-finite weights (:func:`report_nonfinite`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Optional, Union

import torch
from torch import Tensor

from modkit.core.errors import CheckpointError, NonFiniteWeightsWarning
from modkit.core.interfaces import Init

from .files import _fmt_names

if TYPE_CHECKING:
    from modkit.core.registry import Registry
    from modkit.nn.model import Model
    from modkit.spec import ModelSpec


#: floating dtypes a checkpoint tensor may hold where the model has a floating-point tensor
LOADABLE_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _float_dtype_of(tensors: Iterable[Tensor]) -> torch.dtype:
    """The common floating dtype of ``tensors``, or the widest of them when they differ (upcasting is exact)."""
    found = {t.dtype for t in tensors if t.dtype in LOADABLE_FLOAT_DTYPES}
    if not found:
        return torch.float32
    if len(found) == 1:
        return found.pop()
    return torch.float64 if torch.float64 in found else torch.float32


def _dtype_problems(state: Mapping[str, Tensor], own: Mapping[str, Tensor]) -> list[str]:
    """Tensors whose stored dtype the model cannot take: an integer, bool or float8 tensor for a floating one."""
    problems = []
    for name, want in own.items():
        t = state.get(name)
        if t is None:
            continue
        got = str(t.dtype).replace("torch.", "")
        if want.is_floating_point() and t.dtype not in LOADABLE_FLOAT_DTYPES:
            why = (
                "a quantised 8-bit float format; dequantise the checkpoint first"
                if "float8" in got
                else "not a floating-point type"
            )
            problems.append(f"{name}: stored as {got} ({why}); the model needs float16, bfloat16, float32 or float64")
        elif not want.is_floating_point() and t.dtype != want.dtype:
            problems.append(f"{name}: stored as {got}; the model needs {str(want.dtype).replace('torch.', '')}")
    return problems


def nonfinite_counts(tensors: Mapping[str, Tensor], *, chunk: int = 2**24) -> dict[str, int]:
    """``{name: number of NaN or infinite values}`` for every floating tensor that holds any (in chunks of
    ``chunk`` elements, so the check needs little extra memory)."""
    out = {}
    for name, t in tensors.items():
        if not t.is_floating_point() or t.is_meta:
            continue
        flat = t.detach().reshape(-1)
        bad = 0
        for start in range(0, flat.numel(), chunk):
            part = flat[start : start + chunk]
            bad += int(part.numel() - torch.isfinite(part).sum())
        if bad:
            out[name] = bad
    return out


def report_nonfinite(tensors: Mapping[str, Tensor], origin: str, nonfinite: str) -> None:
    """Warn (:class:`~modkit.core.errors.NonFiniteWeightsWarning`) or, with ``nonfinite="error"``, raise
    :class:`CheckpointError` when ``tensors`` hold NaN or infinite values; the message counts them by tensor."""
    counts = nonfinite_counts(tensors)
    if not counts:
        return
    total = sum(counts.values())
    listed = ", ".join(f"{n} ({c:,} of {tensors[n].numel():,})" for n, c in list(counts.items())[:10])
    more = f" and {len(counts) - 10} more tensor(s)" if len(counts) > 10 else ""
    msg = f"{origin}: {total:,} NaN or infinite value(s) in {len(counts)} tensor(s): {listed}{more}"
    if nonfinite == "error":
        raise CheckpointError(msg + "; refusing to load them (nonfinite='error')")
    import warnings

    warnings.warn(
        msg + "; outputs computed from them will not be finite (pass nonfinite='error' to refuse such checkpoints)",
        NonFiniteWeightsWarning,
        stacklevel=3,
    )


def materialize(
    spec: "ModelSpec",
    state: Mapping[str, Tensor],
    *,
    device: Union[str, torch.device, None] = None,
    dtype: Union[str, torch.dtype, None] = None,
    registry: Optional["Registry"] = None,
    nonfinite: str = "warn",
    check_memory: bool = True,
    origin: str = "checkpoint",
) -> "Model":
    """Build ``spec`` on ``meta`` and fill it from ``state`` (a complete modkit state dict), without a random init.

    Parameters are assigned from ``state`` (cast to ``dtype``: default, the checkpoint's floating dtype, or the
    widest one when it mixes several); buffers (RoPE tables...) are recomputed by their modules'
    ``init_weights``. The model's own ``load_state_dict`` checks run (strict names; a head that differs from a
    tied embedding raises :class:`CheckpointError`).

    Non-finite values (NaN, +-inf) are counted tensor by tensor: a :class:`~modkit.core.errors.NonFiniteWeightsWarning`
    with ``nonfinite="warn"``, a :class:`CheckpointError` with ``nonfinite="error"``.

    Returns:
        the :class:`~modkit.nn.model.Model` in eval mode on ``device``.

    Raises:
        CheckpointError: missing or unexpected tensors, a shape mismatch (names the tensor and both shapes), a
            tensor of a dtype the model cannot take (an integer or float8 tensor where a float is expected), a
            tied head that differs from the embedding, non-finite values with ``nonfinite="error"``.
        MemoryLimitError: with ``check_memory``, the model would not fit in the memory free on ``device``.
    """
    from modkit.nn.build import _parse_dtype, build
    from modkit.nn.memory import check_fits, module_bytes

    if nonfinite not in ("warn", "error"):
        raise ValueError(f"nonfinite must be 'warn' or 'error', got {nonfinite!r}")
    target = torch.device(device) if device is not None else torch.device("cpu")
    tdtype = _float_dtype_of(state.values()) if dtype is None else _parse_dtype(dtype)
    model = build(spec, device="meta", dtype=tdtype, registry=registry)
    own = model.state_dict()
    _refuse_dtypes(state, own, origin)
    if check_memory:
        check_fits(
            module_bytes(model),
            target,
            f"the weights and buffers of this model ({str(tdtype).replace('torch.', '')})",
            hint="load it with a smaller dtype or on another device",
        )
    _refuse_mismatch(spec, state, own)
    _recompute_buffers(model, Init(0, spec.init_std), target)
    cast = _cast_state(state, own, tdtype, target)
    report_nonfinite(cast, origin, nonfinite)
    model.load_state_dict(cast, strict=True, assign=True)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(
            f"after loading, {len(left)} tensor(s) are still uninitialised: {_fmt_names(left)}; a buffer's module "
            "must recompute it in init_weights(init)"
        )
    return model.eval()


def _refuse_dtypes(state: Mapping[str, Tensor], own: Mapping[str, Tensor], origin: str) -> None:
    """Refuse every tensor of ``state`` whose dtype the model's tensor of that name cannot take.

    Raises:
        CheckpointError: listing up to ten such tensors (see :func:`_dtype_problems`).
    """
    bad_dtypes = _dtype_problems(state, own)
    if bad_dtypes:
        shown = bad_dtypes[:10] + ([f"... and {len(bad_dtypes) - 10} more"] if len(bad_dtypes) > 10 else [])
        raise CheckpointError(
            f"{origin}: {len(bad_dtypes)} tensor(s) of a dtype the model cannot take:\n  " + "\n  ".join(shown)
        )


def _refuse_mismatch(spec: "ModelSpec", state: Mapping[str, Tensor], own: Mapping[str, Tensor]) -> None:
    """Refuse a state dict whose names or shapes differ from the model's (``own``); a tied model's file may hold
    its head (``lm_head.weight``) too.

    Raises:
        CheckpointError: naming every missing and unexpected tensor and every shape mismatch (both shapes).
    """
    missing = [n for n in own if n not in state]
    unexpected = [n for n in state if n not in own and not (n.endswith("lm_head.weight") and spec.tie_embeddings)]
    mismatched = [
        f"{n}: the checkpoint stores shape {list(state[n].shape)}, the model needs {list(own[n].shape)}"
        for n in own
        if n in state and tuple(state[n].shape) != tuple(own[n].shape)
    ]
    if missing or unexpected or mismatched:
        parts = ["checkpoint does not match the spec:"]
        if missing:
            parts.append(f"  missing {len(missing)} tensor(s): {_fmt_names(missing)}")
        if unexpected:
            parts.append(f"  unexpected {len(unexpected)} tensor(s) (refusing to drop them): {_fmt_names(unexpected)}")
        if mismatched:
            parts.append(f"  {len(mismatched)} shape mismatch(es):")
            parts += [f"    {m}" for m in mismatched]
        raise CheckpointError("\n".join(parts))


def _recompute_buffers(model: "Model", init: Init, target: torch.device) -> None:
    """Allocate every buffer of a ``meta`` model on ``target`` and let its module recompute it (``init_weights``);
    parameters stay on ``meta``."""
    for _name, module in model.named_modules():
        bufs = {k: b for k, b in module._buffers.items() if b is not None}
        if not bufs:
            continue
        for k, b in bufs.items():
            module._buffers[k] = torch.empty_like(b, device=target)
        fn = getattr(type(module), "init_weights", None)
        if fn is not None:
            module.init_weights(init)


def _cast_state(
    state: Mapping[str, Tensor], own: Mapping[str, Tensor], tdtype: torch.dtype, target: torch.device
) -> dict[str, Tensor]:
    """``state`` on ``target``, contiguous, its floating tensors in ``tdtype``, except where the model keeps a
    floating tensor in a dtype of its own (a float32 buffer of a bfloat16 model: a router's correction bias)."""
    cast = {}
    for n, t in state.items():
        mine = own.get(n)  # a float32 buffer of a bfloat16 model (a router's correction bias) keeps its own dtype
        want = mine.dtype if mine is not None and mine.is_floating_point() else tdtype
        t = t.to(device=target, dtype=want if t.is_floating_point() else t.dtype)
        cast[n] = t if t.is_contiguous() else t.contiguous()
    return cast
