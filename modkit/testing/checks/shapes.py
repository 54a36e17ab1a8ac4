"""``shape_dtype``: every call of the component's contract keeps shape, dtype and device, and stays finite.

The contracts are those of :mod:`modkit.core.interfaces`: every block-level component maps ``[batch, seq, d_model]`` to
``[batch, seq, d_model]``; a norm also acts at widths other than ``d_model`` (a per-head QK-norm is built at
``head_dim`` and called on ``[batch, n_heads, seq, head_dim]``); a position scheme keeps q/k shapes and returns a
bias broadcastable to ``[batch, n_heads, q_len, kv_len]``.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch import Tensor, nn

from modkit.core.interfaces import Init, split_aux
from modkit.nn.model import init_modules
from ..harness import Bench, Record
from .base import CheckFailed, attention_inputs, ffn_kwargs, first_target, nonfinite, position_geometry

#: ``(batch, seq)`` shapes of the shape/dtype check; ``seq = 1`` is the decode shape.
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (2, 5), (3, 8))
#: dtypes of the shape/dtype check.
DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16)
#: widths other than ``d_model`` a norm is built at: a per-head QK-norm's ``head_dim``, and a wider one.
NORM_WIDTHS: tuple[int, ...] = (8, 40)


def _calls(
    bench: Bench, model: nn.Module, records: list[Record], b: int, s: int, dtype: torch.dtype
) -> Iterator[tuple]:
    """Yield ``(label, output, expected shape, expected dtype)`` for one call of the component's contract."""
    kind = bench.entry.kind
    d = bench.d_model()
    if kind in ("norm", "ffn", "attention", "mixer", "placement"):
        rec = first_target(bench, records)
        m = rec.module
        x = bench.randn(b, s, rec.ctx.dim or d, dtype=dtype, seed=b * 31 + s)
        if kind == "norm":
            yield "norm(x)", m(x), x.shape, dtype
        elif kind == "ffn":
            out = m(x, **ffn_kwargs(m, x))
            y, aux = split_aux(out)
            declares = bool(bench.entry.capabilities.get("aux_loss"))
            if isinstance(out, tuple) and not declares:
                raise CheckFailed("ffn returned a tuple but the entry does not declare the aux_loss capability")
            if declares and not isinstance(out, tuple):
                raise CheckFailed(
                    "the entry declares aux_loss but forward returned a single tensor, not (output, aux_loss)"
                )
            if aux is not None:
                if not isinstance(aux, Tensor) or aux.dim() != 0:
                    raise CheckFailed(
                        f"aux_loss must be a scalar tensor, got {getattr(aux, 'shape', type(aux).__name__)}"
                    )
                if nonfinite(aux):
                    raise CheckFailed(f"aux_loss is not finite: {aux.item()}")
            yield "ffn(x)", y, x.shape, dtype
        elif kind in ("attention", "mixer"):
            yield f"{kind}(x, inputs)", m(x, attention_inputs(bench, model, rec, b, s)), x.shape, dtype
        else:
            out = m(x, attention_inputs(bench, model, rec, b, s))
            if not (isinstance(out, tuple) and len(out) == 2):
                raise CheckFailed(f"a placement's block must return (x, aux_loss | None), got {type(out).__name__}")
            yield "block(x, inputs)[0]", out[0], x.shape, dtype
    elif kind == "position":
        rec = first_target(bench, records)
        scheme = rec.module
        h, hkv, hd = position_geometry(bench, records, rec)
        pos = bench.positions(b, s)
        x = bench.randn(b, s, d, dtype=dtype, seed=1)
        yield "embed(x, positions)", scheme.embed(x, pos), x.shape, dtype
        q = bench.randn(b, h, s, hd, dtype=dtype, seed=2)
        k = bench.randn(b, hkv, s, hd, dtype=dtype, seed=3)
        rq, rk = scheme.rotate(q, k, pos)
        yield "rotate(q, k)[0]", rq, q.shape, dtype
        yield "rotate(q, k)[1]", rk, k.shape, dtype
        bias = scheme.attention_bias(pos, pos, h)
        if bias is not None:
            try:
                ok = bias.dim() == 4 and torch.broadcast_shapes(bias.shape, (b, h, s, s)) == (b, h, s, s)
            except RuntimeError:
                ok = False
            if not ok:
                raise CheckFailed(
                    f"attention_bias shape {tuple(bias.shape)} does not broadcast to [batch, n_heads, q, k] = {(b, h, s, s)}"
                )
            if not bias.is_floating_point():
                raise CheckFailed(f"attention_bias dtype {bias.dtype} is not floating point")
        yield "model(ids).logits", model(bench.ids(b, s)).logits, torch.Size((b, s, bench.spec["vocab_size"])), dtype
    else:
        yield "model(ids).logits", model(bench.ids(b, s)).logits, torch.Size((b, s, bench.spec["vocab_size"])), dtype


def _norm_at_widths(bench: Bench, records: list[Record], dtype: torch.dtype) -> Iterator[tuple]:
    """A norm built (``BuildContext.dim``) at each of :data:`NORM_WIDTHS`, called as a per-head and a plain norm."""
    rec = first_target(bench, records)
    for width in NORM_WIDTHS:
        module = rec.ctx.build(bench.config, dim=width).to(bench.device)
        init_modules(module, Init(0, 0.2))
        module = module.to(dtype)
        for shape in ((2, 3, 5, width), (2, 5, width)):
            x = bench.randn(*shape, dtype=dtype, seed=width)
            label = f"norm built at dim = {width}, called on {list(shape)}"
            yield label, module(x), x.shape, dtype


def _mixer_at_wider_input(bench: Bench, model: nn.Module, records: list[Record], dtype: torch.dtype) -> Iterator[tuple]:
    """A mixer that declares ``d_in`` built with ``BuildContext.d_in = 2 · d_model`` and called on that many features:
    it must return ``d_model`` (the side attention of Zamba2's hybrid layer)."""
    rec = first_target(bench, records)
    d, (b, s) = bench.d_model(), SHAPES[-1]
    module = rec.ctx.build(bench.config, d_in=2 * d).to(bench.device)
    init_modules(module, Init(0, 0.2))
    module = module.to(dtype).eval()
    x = bench.randn(b, s, 2 * d, dtype=dtype, seed=2 * d)
    yield (
        f"mixer built at d_in = {2 * d}, called on {[b, s, 2 * d]}",
        module(x, attention_inputs(bench, model, rec, b, s)),
        torch.Size((b, s, d)),
        dtype,
    )


def check_shape_dtype(bench: Bench) -> str:
    """Shape, dtype and device are preserved and outputs are finite, for every call of the component's contract.

    Runs for ``(batch, seq)`` in :data:`SHAPES` (``seq = 1`` included: the decode shape) in float32 and bfloat16.
    A norm is also built at the widths :data:`NORM_WIDTHS` (``BuildContext.dim``) and called on
    ``[batch, n_heads, seq, head_dim]`` as a per-head QK-norm is.

    Catches: a norm that returns float32 for bfloat16 input (pytorch #133085; the ``leaky_dtype`` fixture); an ffn
    whose output is one feature too wide (``widening``); a norm that ignores ``ctx.dim`` and is always
    ``d_model`` wide, which crashes as soon as a spec uses it as a QK-norm (``fixed_width``); a position bias that
    does not broadcast to the scores. A mixer declaring ``d_in`` is also built with ``BuildContext.d_in = 2 ·
    d_model`` and must map that many input features to ``d_model`` (``blind_input``: one that ignores ``ctx.d_in``
    crashes on the side block of a Zamba2 layer).
    """
    problems: list[str] = []
    calls = 0
    for dtype in DTYPES:
        name = str(dtype).replace("torch.", "")
        model, records = bench.build(dtype=dtype)
        model.eval()
        with torch.no_grad():
            for b, s in SHAPES:
                for label, out, shape, want in _calls(bench, model, records, b, s, dtype):
                    calls += 1
                    problems += _problems(bench, f"{name} (batch {b}, seq {s}): {label}", out, shape, want)
            if bench.entry.kind == "norm":
                try:
                    for label, out, shape, want in _norm_at_widths(bench, records, dtype):
                        calls += 1
                        problems += _problems(bench, f"{name}: {label}", out, shape, want)
                except Exception as exc:  # noqa: BLE001 - a norm that cannot act at another width is this check's finding
                    problems.append(
                        f"{name}: a norm built at dim = {', '.join(map(str, NORM_WIDTHS))} raised "
                        f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]} (build it ctx.dim wide when set)"
                    )
            if bench.entry.kind in ("attention", "mixer") and bench.entry.capabilities.get("d_in"):
                try:
                    for label, out, shape, want in _mixer_at_wider_input(bench, model, records, dtype):
                        calls += 1
                        problems += _problems(bench, f"{name}: {label}", out, shape, want)
                except Exception as exc:  # noqa: BLE001 - a mixer that cannot take the wider input is this check's finding
                    problems.append(
                        f"{name}: declares d_in, but built with BuildContext.d_in = {2 * bench.d_model()} it raised "
                        f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]} (read ctx.d_in input features and "
                        "return d_model)"
                    )
    if problems:
        more = f" (+{len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckFailed("; ".join(problems[:3]) + more)
    shapes = ", ".join(f"({b},{s})" for b, s in SHAPES)
    widths = f"; norm also at dim {', '.join(map(str, NORM_WIDTHS))}" if bench.entry.kind == "norm" else ""
    widths += "; also built at d_in = 2 · d_model" if bench.entry.capabilities.get("d_in") else ""
    return f"{calls} calls: (batch, seq) in {shapes} x float32, bfloat16 keep shape, dtype and device{widths}"


def _problems(bench: Bench, where: str, out, shape, want: torch.dtype) -> list[str]:
    if not isinstance(out, Tensor):
        return [f"{where} returned {type(out).__name__}, not a tensor"]
    found = []
    if tuple(out.shape) != tuple(shape):
        found.append(f"{where} has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != want:
        found.append(f"{where} has dtype {out.dtype}, expected {want}")
    if out.device != bench.device and not (out.device.type == bench.device.type and bench.device.index is None):
        found.append(f"{where} is on {out.device}, expected {bench.device}")
    bad = nonfinite(out)
    if bad:
        found.append(f"{where} has {bad} non-finite value(s)")
    return found
