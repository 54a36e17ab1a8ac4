"""``grouped_form``: the stacked copies of an FFN (its ``grouped_factory``, what a mixture of experts uses as
experts) keep rows in their group, hold independent weights, initialise and train.
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from modkit.core.config import ComponentConfig
from modkit.core.interfaces import BuildContext, Init
from modkit.core.registry import Component
from ..harness import Bench
from .base import SAME_MATH_ULPS, CheckFailed, fmt, max_abs_diff, nonfinite, tolerance
from .compile import COMPILE_BACKEND


def applies_grouped(entry: Component, config: ComponentConfig) -> Optional[str]:
    """FFN entries with a ``grouped_factory``."""
    return None if entry.grouped_factory is not None else "the entry declares no grouped_factory"


def check_grouped_form(bench: Bench) -> str:
    """The grouped form (``grouped_factory``, the stacked copies a mixture of experts uses as experts) keeps its contract.

    Three copies, rows ``[0, 4)``, ``[4, 4)`` (empty) and ``[4, 10)`` of ``x [10, d_model]``: the output is
    ``[10, d_model]``, finite, in ``x``'s dtype; each group's rows, run alone as a single non-empty group, give the
    same output (rows go to the right copy and never mix); the same rows through copy 0 and copy 2 differ (the copies
    hold independent weights); ``init_weights(init)`` initialises every parameter; the parameter count is ``n``
    times the declared ``param_count``; every parameter gets a gradient; with ``compile_safe``, the call compiles
    with ``fullgraph=True`` (no host synchronisation, torchtune #2771).

    Catches: a grouped form that ignores ``offs`` and sends every row through copy 0 (the ``mixing_groups``
    fixture), copies that share weights, a copy ``init_weights`` forgets, a group that gets no gradient.
    """
    import torch._dynamo

    d = int(bench.spec["d_model"])
    ctx = BuildContext(d, 1, int(bench.spec["vocab_size"]), int(bench.spec["max_seq_len"]), bench.registry)
    n, ends = 3, [4, 4, 10]
    bank = ctx.build_grouped(bench.config, n).to(bench.device)
    init_fn = getattr(bank, "init_weights", None)
    if init_fn is None:
        raise CheckFailed(f"the grouped form {type(bank).__name__} has no init_weights(init)")
    init = Init(0, 0.2)
    init_fn(init)
    missed = [name for name, p in bank.named_parameters() if id(p) not in init.seen]
    if missed:
        raise CheckFailed(f"init_weights(init) left {missed[:4]} uninitialised")
    if bench.entry.param_count is not None:
        declared, actual = (
            n * int(bench.entry.param_count(bench.config, ctx)),
            sum(p.numel() for p in bank.parameters()),
        )
        if declared != actual:
            raise CheckFailed(f"{n} copies hold {actual:,} parameters, {n} x param_count = {declared:,}")
    x = torch.randn(10, d, generator=torch.Generator().manual_seed(5)).to(bench.device)
    offs = torch.tensor(ends, dtype=torch.int32, device=bench.device)
    y = bank(x, offs)
    if not isinstance(y, Tensor) or tuple(y.shape) != (10, d) or y.dtype != x.dtype or nonfinite(y):
        raise CheckFailed(
            f"forward(x [10, {d}], offs) returned {getattr(y, 'shape', type(y))} {getattr(y, 'dtype', '')}, "
            f"expected [10, {d}] {x.dtype}, finite"
        )
    alone = {0: (0, 4), 2: (4, 10)}
    worst = 0.0
    for g, (a, b) in alone.items():
        only = torch.tensor([0] * g + [b - a] * (n - g), dtype=torch.int32, device=bench.device)
        worst = max(worst, max_abs_diff(bank(x[a:b], only), y[a:b]).max().item())
    if worst > tolerance(y, torch.float32, SAME_MATH_ULPS):
        raise CheckFailed(
            f"a group's rows run alone differ from the same rows in the grouped call: max |Δ| = {fmt(worst)}"
        )
    through0 = bank(x, torch.tensor([10, 10, 10], dtype=torch.int32, device=bench.device))
    through2 = bank(x, torch.tensor([0, 0, 10], dtype=torch.int32, device=bench.device))
    if max_abs_diff(through0, through2).max().item() == 0.0:
        raise CheckFailed("copy 0 and copy 2 give identical outputs: the copies do not hold independent weights")
    bank(x, offs).pow(2).sum().backward()
    dead = [name for name, p in bank.named_parameters() if p.grad is None or not bool(p.grad.abs().max() > 0)]
    if dead:
        raise CheckFailed(f"no gradient reached {dead[:4]}")
    compiled = ""
    if bench.entry.capabilities.get("compile_safe"):
        torch._dynamo.reset()
        try:
            with torch.no_grad():
                c = torch.compile(bank, fullgraph=True, backend=COMPILE_BACKEND)(x, offs)
        except Exception as exc:  # noqa: BLE001 - any dynamo error means the claim is false
            raise CheckFailed(
                f"torch.compile(fullgraph=True) of the grouped form failed: {type(exc).__name__}: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from None
        finally:
            torch._dynamo.reset()
        compiled = f"; fullgraph compile max |Δ| = {fmt(max_abs_diff(c, y.detach()).max().item())}"
    return (
        f"{n} copies: rows stay in their group (max |Δ| alone vs grouped = {fmt(worst)}), copies independent, "
        f"init and gradients reach every parameter{compiled}"
    )
