"""The check of sampling steps (logits processors and stop conditions, :mod:`modkit.inference.sampling`).

They are not part of a model, so every model check but ``spec_roundtrip`` skips them and ``sampling`` checks their
calling convention on a small batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component, Registry
from modkit.inference.sampling import KINDS as SAMPLING_KINDS
from .base import CheckFailed


@dataclass
class SamplingBench:
    """What the sampling check runs on: a logits processor or stop condition entry and its validated config."""

    entry: Component
    config: ComponentConfig
    registry: Registry


def _toy_decode(ids: list[int]) -> str:
    """The tokenizer of the sampling check: token ``i`` is the text ``"t{i} "``."""
    return "".join(f"t{i} " for i in ids)


def applies_sampling(entry: Component, config: ComponentConfig) -> Optional[str]:
    return None if entry.kind in SAMPLING_KINDS else "applies to logits processors and stop conditions"


def check_sampling(bench: SamplingBench) -> str:
    """The calling convention of :mod:`modkit.inference.sampling` on a small batch (vocabulary 16, 3 rows, a left-padded
    prompt of 3 and 4 generated tokens).

    Catches: a processor that edits its input in place (the next step sees changed logits), one that empties a row
    (nothing left to draw: NaN probabilities), one whose result depends on the other rows of the batch.

    Logits processors: ``[batch, vocab]`` float32 in and out, the input not modified in place, at least one finite
    logit per row, nothing but ``-inf`` added (no NaN, no ``+inf``), the same result twice, and rows independent
    (reordering the batch reorders the result). Stop conditions: a ``[batch]`` bool tensor, the same twice, rows
    independent. The factory gets ``SamplingSetup(vocab_size=16, decode=...)`` where token ``i`` reads ``"t{i} "``.
    """
    from modkit.inference.sampling import PROCESSOR_KIND, GenerationState, LogitsProcessor, SamplingSetup, StopCondition

    entry, vocab = bench.entry, 16
    setup = SamplingSetup(vocab_size=vocab, decode=_toy_decode)
    g = torch.Generator().manual_seed(61)
    ids = torch.randint(0, vocab, (3, 7), generator=g)
    real = torch.ones(3, 7, dtype=torch.bool)
    real[1, :2] = False

    def make():
        obj = entry.factory(bench.config, setup)
        want = LogitsProcessor if entry.kind == PROCESSOR_KIND else StopCondition
        if not isinstance(obj, want):
            raise CheckFailed(f"factory returned {type(obj).__name__}, not a modkit.inference.sampling.{want.__name__}")
        return obj

    def st(order):
        return GenerationState(ids[order], real[order], 3, _toy_decode)

    order, flipped = torch.tensor([0, 1, 2]), torch.tensor([2, 0, 1])
    if entry.kind == PROCESSOR_KIND:
        logits = torch.randn(3, vocab, generator=g) * 2
        before = logits.clone()
        out = make()(logits, st(order))
        if not torch.equal(logits, before):
            raise CheckFailed("the processor modified its input logits in place")
        if out.shape != logits.shape or out.dtype != torch.float32:
            raise CheckFailed(f"returned {tuple(out.shape)} {out.dtype} for [3, {vocab}] float32 logits")
        if torch.isnan(out).any() or (out == float("inf")).any():
            raise CheckFailed("the result holds NaN or +inf; removed tokens must be -inf")
        if not torch.isfinite(out).any(-1).all():
            raise CheckFailed("a row has no finite logit left (every token removed)")
        again = make()(logits, st(order))
        if not torch.equal(out, again):
            raise CheckFailed("two calls on the same input differ")
        swapped = make()(logits[flipped], st(flipped))
        if not torch.equal(swapped, out[flipped]):
            raise CheckFailed("reordering the batch changes the result of a row (rows are not independent)")
        kept = int(torch.isfinite(out).sum())
        return f"[3, {vocab}] float32 kept, input untouched, {kept} of {3 * vocab} logits finite, deterministic, rows independent"
    out = make()(st(order))
    if not (isinstance(out, torch.Tensor) and out.dtype == torch.bool and out.shape == (3,)):
        raise CheckFailed(
            f"a stop condition returns a [batch] bool tensor, got {getattr(out, 'dtype', type(out).__name__)} "
            f"{tuple(getattr(out, 'shape', ()))}"
        )
    if not torch.equal(make()(st(order)), out):
        raise CheckFailed("two calls on the same state differ")
    if not torch.equal(make()(st(flipped)), out[flipped]):
        raise CheckFailed("reordering the batch changes the result of a row (rows are not independent)")
    return f"[3] bool ({int(out.sum())} of 3 rows stop on the toy batch), deterministic, rows independent"
