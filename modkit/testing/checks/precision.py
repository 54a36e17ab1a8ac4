"""``precision``: in bfloat16 and float16 the component computes what float64 computes, to a few ulps.

The component's contract call (a norm, an ffn, an attention with its position scheme, a placement's block, a
position scheme's hooks; a router through its ffn) runs once in the low-precision dtype and once in float64 on
*the same numbers*: the float64 model holds the low-precision weights upcast exactly, and gets the low-precision
input upcast exactly. The only difference left is the precision of the arithmetic, so a correct component lands
within a few ulps of the low-precision dtype, and a missing upcast (an overflow to inf, a sum that loses every
digit) is off by orders of magnitude. A norm gets rows at the magnitudes of a real residual stream: 1e-2, 1 and 300
(300² overflows float16).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

from modkit.core.config import ComponentConfig
from modkit.core.interfaces import AttentionInputs
from modkit.core.registry import Component
from ..harness import Bench, Record
from .base import (
    CheckFailed,
    CheckSkipped,
    call_contract,
    contract_record,
    fmt,
    max_abs_diff,
    position_geometry,
    stand_in_embeddings,
    tolerance,
)

#: ``(dtype, ulps)``: the low-precision dtypes and the error allowed, in ulps of the dtype at the output scale.
DTYPES: tuple[tuple[torch.dtype, float], ...] = ((torch.bfloat16, 8.0), (torch.float16, 8.0))
#: Row magnitudes of a norm's input.
NORM_SCALES = (1e-2, 1.0, 300.0)


def applies_precision(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Every component (a kind without a contract call of its own through the component that holds it)."""
    return None


def _calls(
    bench: Bench, model: nn.Module, records: list[Record], dtype: torch.dtype
) -> list[tuple[str, Callable[[], Tensor]]]:
    """``[(label, call)]``: each call runs the component's contract in ``model`` on inputs rounded to ``dtype``
    and given to the model in its own dtype (the same values for the low-precision model and its float64 copy)."""
    kind, rec = contract_record(bench, records)
    run = next(model.parameters()).dtype

    def made(t: Tensor) -> Tensor:
        return t.to(dtype).to(run)

    b, s, d = 2, 8, bench.d_model()
    if kind in ("norm", "ffn", "attention", "mixer", "placement"):
        width = rec.ctx.dim or d
        if kind == "norm":
            rows = torch.tensor(NORM_SCALES).repeat_interleave(2)[:, None, None]  # [6, 1, 1]
            x = made(bench.randn(len(NORM_SCALES) * 2, s, width, seed=101) * rows.to(bench.device))
            return [(f"norm(x) with rows of magnitude {', '.join(map(fmt, NORM_SCALES))}", lambda: rec.module(x))]
        x = made(bench.randn(b, s, width, seed=102))
        inputs = AttentionInputs(
            positions=bench.positions(b, s),
            position=bench.position_for(model, getattr(rec.ctx, "layer_index", None)),
            embeddings=made(stand_in_embeddings(bench, b, s)),
        )
        label = {
            "ffn": "ffn(x)",
            "attention": "attention(x, inputs)",
            "mixer": "mixer(x, inputs)",
            "placement": "block(x, inputs)[0]",
        }[kind]
        return [(label, lambda: call_contract(kind, rec.module, x, inputs))]
    if kind == "position":
        scheme = rec.module
        h, hkv, hd = position_geometry(bench, records, rec)
        pos = torch.arange(40, device=bench.device).expand(b, 40)  # positions where a float16 angle would lose digits
        x = made(bench.randn(b, 40, d, seed=103))
        q = made(bench.randn(b, h, 40, hd, seed=104))
        k = made(bench.randn(b, hkv, 40, hd, seed=105))
        calls = [
            ("embed(x, positions)", lambda: scheme.embed(x, pos)),
            ("rotate(q, k, positions)[0]", lambda: scheme.rotate(q, k, pos)[0]),
            ("rotate(q, k, positions)[1]", lambda: scheme.rotate(q, k, pos)[1]),
        ]
        if scheme.attention_bias(pos, pos, h) is not None:
            calls.append(("attention_bias", lambda: scheme.attention_bias(pos, pos, h)))
        return calls
    raise CheckSkipped(f"{bench.name} has no contract call of its own and no host with one")


def check_precision(bench: Bench) -> str:
    """bfloat16 and float16 agree with a float64 reference on the same numbers, within :data:`DTYPES` ulps.

    For each dtype: the tiny model built in that dtype, and a float64 copy holding its weights upcast exactly;
    the component's contract call on the same low-precision input in both; ``max |Δ|`` must be at most
    ``ulps * eps(dtype) * max |reference|``.

    Catches: a norm without the float32 upcast (``no_upcast``: ``x²`` overflows float16 at x = 300 and the output
    is 0 instead of ±1; pytorch #133085); a softmax or a reduction kept in float16; RoPE angles computed in the
    input dtype (at position 40 a float16 angle has lost two digits).
    """
    report = []
    for dtype, ulps in DTYPES:
        low, low_records = bench.build(dtype=dtype)
        ref, ref_records = bench.build(dtype=torch.float64)
        ref.load_state_dict(low.state_dict())  # exact upcast of the low-precision weights
        low.eval(), ref.eval()
        name = str(dtype).replace("torch.", "")
        worst_ratio = 0.0
        with torch.no_grad():
            for (label, call), (_, call_ref) in zip(
                _calls(bench, low, low_records, dtype), _calls(bench, ref, ref_records, dtype)
            ):
                got = call()
                want = call_ref()
                tol = tolerance(want, dtype, ulps)
                d = max_abs_diff(got, want)
                worst = d.max().item()
                if worst > tol:
                    where = torch.nonzero(d == d.max())[0].tolist()
                    raise CheckFailed(
                        f"{name}: {label} differs from float64 on the same numbers by max |Δ| = {fmt(worst)} at index "
                        f"{where} (got {fmt(float(got.flatten()[d.flatten().argmax()]))}, float64 "
                        f"{fmt(float(want.flatten()[d.flatten().argmax()]))}; tolerance {ulps:g} ulps = {fmt(tol)}): "
                        "compute statistics and reductions in float32"
                    )
                worst_ratio = max(worst_ratio, worst / tol)
        report.append(f"{name} within {worst_ratio * ulps:.2g} ulps")
    return (
        "; ".join(report) + " of float64 on the same numbers (allowed: " + ", ".join(f"{u:g}" for _, u in DTYPES) + ")"
    )
