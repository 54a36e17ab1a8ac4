"""The ``flops`` contract check (family: what an entry declares about itself, like ``param_count``): a component's FLOPs declaration equals what ``FlopCounterMode`` measures.

A component declares its matrix-product FLOPs with ``Component.flops(config, ctx, work)`` (see :mod:`modkit.analysis.cost`).
This check builds the kit's tiny model holding the component (CPU, float32), runs forwards of several shapes under
:func:`modkit.analysis.cost.flop_counter` (``torch.utils.flop_counter.FlopCounterMode`` plus formulas for the CPU attention
kernel and modkit's grouped product), and compares, to the FLOP:

* the whole model: the measured total against the sum of every component's declaration and the head
  (:class:`modkit.analysis.cost.CostModel` on the recorded factory calls, ``Workload(dense=True)``: the kernels score the whole
  ``[new, past + new]`` rectangle);
* each module the component built and whose ``forward`` ran: the FLOPs measured inside it against the declarations
  of the components in its subtree (itself and what it built, e.g. an MoE's router).

Shapes: ``(batch, seq)`` = (1, 1), (2, 5), (3, 8) with no cache, and one decoded token per row after a prefill
into the cache (whatever state the model's mixers declare): a declaration gets ``Workload.past > 0`` there, so a
mixer with a decode path of its own (MLA's absorbed attention over the latent) is checked on it. A component without a declaration is
reported ``skipped`` with the reason, never given a number: ``modkit cost`` refuses a model that uses it
(:class:`modkit.analysis.cost.CostError`). Source: a component declares its FLOPs as it declares its parameter
count, and the kit checks the declaration against a measurement.
"""

from __future__ import annotations

from typing import Optional

import torch

from modkit.core.config import ComponentConfig
from modkit.analysis.cost import CostError, CostModel, Workload, declared_flops, flop_counter
from modkit.core.registry import Component
from ..harness import Bench
from .base import CheckFailed, CheckSkipped

#: ``(batch, seq)`` of the forwards without a cache.
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 5), (3, 8))
#: ``(batch, past)`` of the decode step: ``past`` tokens prefilled into the cache, then one token per row.
DECODE = (2, 4)
SUMMARY = (
    "declared FLOPs equal FlopCounterMode's count on the tiny model, whole and per module, prefill and decode; the "
    "declaration gives {part: int} on every workload modkit cost asks for (cached decode, contexts up to 2^40)"
)
#: Contexts ``modkit cost`` evaluates declarations at: decode at 1, 2, 3 (the context-dependent parts), a prompt, its
#: default report contexts, and the end of the crossover search (``CostModel.crossover``'s limit, 2^40).
COST_CONTEXTS = (1, 2, 3, 64, 4096, 32768, 2**20, 2**40)
#: Batches of those workloads (``decode_latency`` and the report take a batch).
COST_BATCHES = (1, 4)


def applies_flops(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Components that declare FLOPs (``Component.flops``); the others are skipped, with the reason.

    Returns ``None`` when the check applies, else the reason it is skipped.
    """
    if entry.flops is not None:
        return None
    return (
        "declares no FLOPs (Component.flops): modkit cost refuses models using it instead of guessing; add "
        "flops=fn(config, ctx, work) -> {part: FLOPs}, or modkit.analysis.cost.elementwise(reason) if it does no matrix product"
    )


def _measure(model, ids, cache=None) -> dict[str, int]:
    """``{module name: FLOPs}`` of one forward (``"Global"``: the whole call)."""
    with torch.no_grad(), flop_counter() as counter:
        model(ids, cache=cache)
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


def cost_workloads() -> list[tuple[str, Workload]]:
    """``(label, workload)`` of what ``modkit cost`` evaluates a declaration on: prefill (``new = context``) and
    decode (one token after ``context - 1`` cached) at each of :data:`COST_CONTEXTS` and :data:`COST_BATCHES`, the
    useful pairs only (``dense = False``; the measured runs of :func:`check_flops` are the dense ones)."""
    out = []
    for b in COST_BATCHES:
        for n in COST_CONTEXTS:
            out.append((f"prefill at context {n:,}, batch {b}", CostModel.workload("prefill", n, b)))
            out.append((f"decode at context {n:,}, batch {b}", CostModel.workload("decode", n, b)))
    return out


def _cost_problem(bench: Bench, records: list) -> tuple[Optional[str], int]:
    """``(problem or None, workloads evaluated)``: the component's declarations (one per module it built) on every
    workload of :func:`cost_workloads` (prefill and cached decode at contexts 1 to 2^40, batch 1 and 4) and on its
    dense twin, each ``{part: non-negative int}`` (:func:`~modkit.analysis.cost.declared_flops`), the useful-pairs
    count never above the dense one (a mask only removes pairs)."""
    targets = bench.targets(records)
    workloads = cost_workloads()
    for label, work in workloads:
        dense = Workload(work.batch, work.new, work.past, True)
        for r in targets:
            try:
                useful = sum(declared_flops(r.entry, r.config, r.ctx, work).values())
                full = sum(declared_flops(r.entry, r.config, r.ctx, dense).values())
            except CostError as exc:
                return (
                    f"{label} ({work}): {exc}; modkit cost evaluates the declaration there (decode at every "
                    "context, prefill, the crossover search up to 2^40 tokens): return ints (// not /)",
                    len(workloads),
                )
            if useful > full:
                return (
                    f"{label}: the declaration gives {useful:,} FLOPs for the pairs the mask lets through, more "
                    f"than {full:,} for the whole score rectangle (dense = True)",
                    len(workloads),
                )
    return None, len(workloads)


def check_flops(bench: Bench) -> str:
    """Declared FLOPs (whole model and per module of the component) equal the measured ones on every workload.

    First the component's own declaration on every workload ``modkit cost`` asks for (:func:`_cost_problem`).

    Catches: a declaration that forgets a product or a factor (the ``relu2`` of ``tests/analysis/test_cost.py`` that drops its
    down projection fails with both numbers), or that ignores GQA, a window or a capacity factor: ``modkit cost``
    and the training MFU trust the declared numbers. A float where only ``cost`` evaluated it (``float_flops``).
    """
    model, records = bench.build()
    model.eval()
    problem, evaluated = _cost_problem(bench, records)
    if problem:
        raise CheckFailed(problem)
    missing = sorted({f"{r.entry.kind}/{r.entry.type}" for r in records if r.entry.flops is None})
    if missing:
        raise CheckSkipped(
            f"the tiny model's filler(s) {', '.join(missing)} declare no FLOPs; the total cannot be compared"
        )
    costs = CostModel.from_records(model, records, bench.registry)
    root = type(model).__name__
    names = {id(m): (f"{root}.{n}" if n else root) for n, m in model.named_modules()}
    targets = [r for r in bench.targets(records) if id(r.module) in names]

    try:  # every layer holds a token mixer that declares (or, an attention, implies) its cache state
        layout = model.cache_layout()
    except ValueError:
        layout = []
    cached = bool(layout)
    windows = [sp.window for specs in layout for sp in specs.values() if sp.token_entries and sp.window is not None]
    past = min([DECODE[1]] + [w - 1 for w in windows])  # no ring buffer: the kernel sees exactly past + 1 keys
    runs: list[tuple[str, Workload, dict[str, int]]] = []
    for b, s in SHAPES:
        runs.append((f"{b}x{s}", Workload(b, s, dense=True), _measure(model, bench.ids(b, s))))
    if cached:
        b = DECODE[0]
        cache = model.new_cache(b, past + 1)
        ids = bench.ids(b, past + 1, seed=1)
        if past:
            with torch.no_grad():
                model(ids[:, :past], cache=cache)
        runs.append(
            (f"decode {b}x1 after {past}", Workload(b, 1, past, dense=True), _measure(model, ids[:, past:], cache))
        )

    own = []
    for label, work, measured in runs:
        declared = costs.flops(work)
        total = sum(declared.values())
        if measured.get("Global", 0) != total:
            parts = ", ".join(f"{k} {v:,}" for k, v in sorted(declared.items()))
            raise CheckFailed(
                f"{label}: the model's declarations sum to {total:,} FLOPs ({parts}), FlopCounterMode measured "
                f"{measured.get('Global', 0):,} (difference {total - measured.get('Global', 0):+,})"
            )
        for r in targets:
            name = names[id(r.module)]
            if name not in measured:  # its forward did not run (a position scheme's hooks run inside attention)
                continue
            inside = {id(m) for m in r.module.modules()}
            want = sum(
                sum(declared_flops(x.entry, x.config, x.ctx, work).values()) for x in records if id(x.module) in inside
            )
            if measured[name] != want:
                mine = declared_flops(r.entry, r.config, r.ctx, work)
                raise CheckFailed(
                    f"{label}: {name} declares {want:,} FLOPs (itself: {mine}), FlopCounterMode measured "
                    f"{measured[name]:,} inside it (difference {want - measured[name]:+,})"
                )
            own.append(want)
    decl = bench.entry.flops
    reason = f"; declares 0 ({decl.reason})" if hasattr(decl, "reason") else ""
    totals = "; ".join(f"{label}: {m['Global']:,}" for label, _, m in runs)
    return (
        f"declared = measured on {len(runs)} workloads (model totals {totals}){reason}; {{part: int}} on "
        f"{evaluated} cost workloads"
    )
