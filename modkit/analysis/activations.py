"""The activation memory of a training step, measured: the bytes autograd saves for the backward, fitted in the
sequence length (what :meth:`modkit.analysis.cost.CostModel.training_memory` reports).

The model is built on ``meta`` (nothing allocated) and run in training mode with the training loss under
``torch.autograd.graph.saved_tensors_hooks``; the saved bytes (parameters excluded, each storage once) at three
equally spaced lengths give ``a + b·T + c·T²`` exactly. What a layer keeps for the backward: Korthikanti et al.
2022, Reducing Activation Recomputation in Large Transformer Models (arXiv:2205.05198).
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import nn

from modkit.core.registry import Registry
from modkit.nn.build import build
from modkit.spec import ModelSpec


def _saved_bytes(model: nn.Module, batch: int, seq: int) -> int:
    """Bytes autograd saves for the backward in one training forward + loss (each storage once, parameters excluded)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}
    keep: list[torch.Tensor] = []

    def pack(t: torch.Tensor):
        s = t.untyped_storage()
        if s._cdata not in params:
            seen.setdefault(s._cdata, s.nbytes())
        keep.append(t)  # hold it: a freed storage's address could be reused and counted once for two
        return t

    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(ids)
        logits = out.logits
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids.reshape(-1))
        if out.aux_loss is not None:
            loss = loss + out.aux_loss.float()
    return sum(seen.values())


_FIT_CACHE: dict[tuple, tuple[float, float, float]] = {}


def _saved_fit(spec: ModelSpec, batch: int, dtype: torch.dtype, registry: Registry) -> tuple[float, float, float]:
    """``(a, b, c)`` with saved bytes ``= a + b·T + c·T²`` at ``batch`` rows, fitted on three lengths (exact)."""
    key = (spec.model_dump_json(), batch, str(dtype), id(registry))
    if key not in _FIT_CACHE:
        model = build(spec, device="meta", dtype=dtype, registry=registry).train()
        step = max(1, min(4, spec.max_seq_len // 3))
        ts = (step, 2 * step, 3 * step)
        # a mixer that computes in chunks of its ``chunk_size`` tokens (the recurrent mixers' chunked forms) saves
        # [chunk, chunk] blocks: quadratic in T below one chunk, linear from two chunks on, where it is measured
        chunks = {
            m.chunk_size
            for m in model.modules()
            if isinstance(getattr(m, "chunk_size", None), int) and m.chunk_size > 0
        }
        if chunks and 4 * math.lcm(*chunks) <= spec.max_seq_len:
            step = math.lcm(*chunks)
            ts = (2 * step, 3 * step, 4 * step)
        s = [_saved_bytes(model, batch, t) for t in ts]
        # second differences of an exact quadratic at equally spaced points
        c = Fraction(s[2] - 2 * s[1] + s[0], 2 * step * step)
        b = Fraction(s[1] - s[0], step) - c * (ts[0] + ts[1])
        a = s[0] - b * ts[0] - c * ts[0] * ts[0]
        _FIT_CACHE[key] = (float(a), float(b), float(c))
    return _FIT_CACHE[key]
