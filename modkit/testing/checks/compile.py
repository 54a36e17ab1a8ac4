"""``compile``: a component that claims ``compile_safe`` compiles with ``torch.compile(fullgraph=True)`` and
computes what eager computes.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn

from modkit.core.config import ComponentConfig
from modkit.core.interfaces import AttentionInputs
from modkit.core.registry import Component
from ..harness import Bench, Record
from .base import (
    SAME_MATH_ULPS,
    CheckFailed,
    contract_record,
    ffn_kwargs,
    fmt,
    max_abs_diff,
    position_geometry,
    stand_in_embeddings,
    tolerance,
)

#: backend used by the ``compile`` check (``MODKIT_CHECK_COMPILE_BACKEND``); any ``fullgraph`` compile proves
#: there is no graph break, and ``eager`` keeps it fast on a CPU.
COMPILE_BACKEND = os.environ.get("MODKIT_CHECK_COMPILE_BACKEND", "eager")


def applies_compile(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Entries with the ``compile_safe`` capability."""
    return None if entry.capabilities.get("compile_safe") else "the entry does not claim compile_safe"


def _compile_target(bench: Bench, model: nn.Module, records: list[Record]) -> tuple[Callable, tuple, str]:
    """``(fn, args, what)``: the call to compile for the component (or for its host, for kinds without a contract)."""
    kind, rec = contract_record(bench, records)
    b, s, d = 2, 6, bench.d_model()
    if rec is not None and kind in ("norm", "ffn"):
        x, m = bench.randn(b, s, rec.ctx.dim or d, seed=51), rec.module
        if ffn_kwargs(m, x):  # routes by token id: the ids are an argument of the compiled call

            def ffn_fn(x: Tensor, token_ids: Tensor):
                return m(x, token_ids=token_ids)

            return ffn_fn, (x, ffn_kwargs(m, x)["token_ids"]), f"{kind} module(x, token_ids)"
        return m, (x,), f"{kind} module"
    if rec is not None and kind in ("attention", "mixer", "placement"):
        m = rec.module
        scheme = bench.position_for(model, getattr(rec.ctx, "layer_index", None))
        emb = stand_in_embeddings(bench, b, s)  # what Model.forward hands every layer (AttentionInputs.embeddings)
        if kind == "placement":  # the block; padding paths are the attention's own compile check

            def block_fn(x: Tensor, pos: Tensor):
                return m(x, AttentionInputs(positions=pos, position=scheme, embeddings=emb))

            return block_fn, (bench.randn(b, s, d, seed=52), bench.positions(b, s)), "block(x, inputs)"

        def fn(x: Tensor, pos: Tensor, mask: Tensor):
            plain = m(x, AttentionInputs(positions=pos, position=scheme, embeddings=emb))
            padded = m(x, AttentionInputs(positions=pos, token_mask=mask, position=scheme, embeddings=emb))
            return plain, padded

        mask = torch.ones(b, s, dtype=torch.bool, device=bench.device)
        mask[0, :2] = False
        return (
            fn,
            (bench.randn(b, s, d, seed=52), bench.positions(b, s), mask),
            f"{kind}(x, inputs) with and without padding",
        )
    if rec is not None and kind == "position":
        scheme = rec.module
        h, hkv, hd = position_geometry(bench, records, rec)

        def pfn(x: Tensor, q: Tensor, k: Tensor, pos: Tensor):
            rq, rk = scheme.rotate(q, k, pos)
            return scheme.embed(x, pos), rq, rk, scheme.attention_bias(pos, pos, h)

        args = (
            bench.randn(b, s, d, seed=53),
            bench.randn(b, h, s, hd, seed=54),
            bench.randn(b, hkv, s, hd, seed=55),
            bench.positions(b, s),
        )
        return pfn, args, "embed, rotate and attention_bias"

    def mfn(ids: Tensor):
        return model(ids).logits

    return mfn, (bench.ids(b, s, seed=56),), "the tiny model"


def _decode_step_compiles(bench: Bench, model: nn.Module) -> tuple[float, int]:
    """Compile one cached decode step of the tiny model (``fullgraph=True``) and compare it with eager.

    Two caches are prefilled alike in eager mode (6 tokens, row 0 left-padded by 2); one decode step then runs
    eagerly on the first and compiled on the second: the logits and every cache tensor (whatever state the mixers
    declare) must agree. Returns ``(max |Δ|, tensors compared)``; raises :class:`CheckFailed`.
    """
    ids = bench.ids(2, 7, seed=57)
    mask = torch.ones(2, 6, dtype=torch.bool, device=bench.device)
    mask[0, :2] = False
    caches = [model.new_cache(2, 8), model.new_cache(2, 8)]

    def step(tok: Tensor, cache) -> Tensor:
        return model(tok, cache=cache).logits

    with torch.no_grad():
        for c in caches:
            model(ids[:, :6], attention_mask=mask, cache=c)
        eager = step(ids[:, 6:], caches[0])
        try:
            compiled = torch.compile(step, fullgraph=True, backend=COMPILE_BACKEND)(ids[:, 6:], caches[1])
        except Exception as exc:  # noqa: BLE001 - any dynamo error means the claim is false
            msg = " ".join(str(exc).split())
            raise CheckFailed(
                f"a cached decode step under torch.compile(fullgraph=True, backend={COMPILE_BACKEND!r}) failed: "
                f"{type(exc).__name__}: {msg[:400]}"
            ) from None
    pairs = [(eager, compiled)]
    for la, lb in zip(caches[0].layers, caches[1].layers):
        for key, state in la.mixers.items():
            pairs += [(t, lb.mixers[key].tensors[n]) for n, t in state.tensors.items()]
    worst = 0.0
    for a, c in pairs:
        d = max_abs_diff(a.float(), c.float()).max().item() if a.numel() else 0.0
        tol = tolerance(a.float(), torch.float32, SAME_MATH_ULPS)
        if d > tol:
            raise CheckFailed(
                f"a compiled cached decode step differs from eager: max |Δ| = {fmt(d)} (tolerance {fmt(tol)})"
            )
        worst = max(worst, d)
    return worst, len(pairs)


def _flat(out: Any) -> list[Tensor]:
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return []


def check_compile(bench: Bench) -> str:
    """``torch.compile(fullgraph=True)`` traces the component's forward without a graph break and matches eager.

    Compiles the module itself (norm, ffn), the attention with and without left padding (and, with the
    ``kv_cache`` capability, one cached decode step of the tiny model after a left-padded prefill: static shapes
    over whatever state the mixer declares), the placement's
    block, the position scheme's ``embed``/``rotate``/``attention_bias``; for other kinds the component that
    hosts it (a router: its mixture of experts) or else the tiny model; with backend :data:`COMPILE_BACKEND`.

    Catches: a ``compile_safe`` claim that does not hold: ``.item()`` / ``.tolist()`` / data-dependent Python
    control flow in the forward (torchtune #2771: MoE routing that breaks graphs), and a compiled result that
    differs from eager. Source: known faults of compiled MoE and decode code (graph breaks, silent divergence).
    """
    import torch._dynamo

    model, records = bench.build()
    model.eval()
    fn, args, what = _compile_target(bench, model, records)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            eager = fn(*args)
            try:
                compiled = torch.compile(fn, fullgraph=True, backend=COMPILE_BACKEND)(*args)
            except Exception as exc:  # noqa: BLE001 - any dynamo error means the claim is false
                msg = " ".join(str(exc).split())
                raise CheckFailed(
                    f"torch.compile(fullgraph=True, backend={COMPILE_BACKEND!r}) failed: {type(exc).__name__}: {msg[:400]}"
                ) from None
    finally:
        torch._dynamo.reset()
    ea, ca = _flat(eager), _flat(compiled)
    if len(ea) != len(ca):
        raise CheckFailed(f"compiled call returned {len(ca)} tensors, eager {len(ea)}")
    worst = 0.0
    for a, c in zip(ea, ca):
        if a.shape != c.shape:
            raise CheckFailed(f"compiled output shape {tuple(c.shape)} != eager {tuple(a.shape)}")
        d = max_abs_diff(a, c).max().item() if a.numel() else 0.0
        tol = tolerance(a, torch.float32, SAME_MATH_ULPS)
        if d > tol:
            raise CheckFailed(f"compiled output differs from eager: max |Δ| = {fmt(d)} (tolerance {fmt(tol)})")
        worst = max(worst, d)
    extra = ""
    if (
        bench.entry.kind in ("attention", "mixer")
        and bench.entry.capabilities.get("kv_cache")
        and getattr(bench.config, "causal", True)
    ):
        torch._dynamo.reset()
        try:
            d, n = _decode_step_compiles(bench, model)
        finally:
            torch._dynamo.reset()
        extra = f"; a cached decode step too (logits and {n - 1} cache tensors, max |Δ| = {fmt(d)})"
    return f"fullgraph compile of {what} (backend {COMPILE_BACKEND!r}): no graph break; max |Δ| vs eager = {fmt(worst)}{extra}"
