"""The ``kv_share`` check: an attention that declares the ``kv_share`` capability reads another layer's keys and
values exactly (spec ``kv_sharing``, :mod:`modkit.nn.sharing`).

The tiny model's two layers become a source (layer 0) and a reader (layer 1). The reference is the same model
without sharing in which layer 1 has its own key/value modules, copies of layer 0's (the modules the reader
declares it drops, ``kv_modules``), and both models feed layer 1's mixer the very input layer 0's mixer received
(a forward pre-hook on each mixer). Layer 1's own keys and values are then exactly the source's, so reading the
source must give the reference's logits, in one forward and in a cached decode; and the reader must keep no cache
of its own.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from modkit.core.config import ComponentConfig
from modkit.core.errors import SpecError
from modkit.core.registry import Component
from ..harness import Bench
from .base import SAME_MATH_ULPS, CheckFailed, fmt, max_abs_diff, tolerance
from .cache import DECODE_CHUNKS, _state_problem

SUMMARY = (
    "a layer reading an earlier layer's keys and values (spec kv_sharing) gives the logits of the same layer "
    "computing them with the source's projections from the source's input, in a forward and a cached decode, and "
    "keeps no cache of its own"
)


def applies_kv_share(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Token mixers that declare the ``kv_share`` capability (and a causal config: decode is part of the check)."""
    if not entry.capabilities.get("kv_share"):
        return "the entry does not claim kv_share"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


def _layer_mixers(bench: Bench, records) -> dict[int, nn.Module]:
    """``{layer index: the component's module built for that layer's residual stream}``."""
    return {r.ctx.layer_index: r.module for r in bench.targets(records) if r.ctx.dim is None}


def _same_input(mixers: dict[int, nn.Module]) -> list:
    """Forward pre-hooks making layer 1's mixer read the input layer 0's mixer read in the same forward."""
    seen: dict[str, torch.Tensor] = {}

    def keep(module, args):
        seen["x"] = args[0]

    def give(module, args):
        return (seen["x"], *args[1:])

    return [mixers[0].register_forward_pre_hook(keep), mixers[1].register_forward_pre_hook(give)]


def _reference(bench: Bench, shared: nn.Module, reader: nn.Module) -> tuple[nn.Module, dict[int, nn.Module]]:
    """The plain model holding the sharing model's weights, layer 1's key/value modules copied from layer 0.

    Raises:
        CheckFailed: the reader dropped parameters other than those of the modules it declares in ``kv_modules``.
    """
    plain, records = bench.build()
    mixers = _layer_mixers(bench, records)
    missing = plain.load_state_dict(shared.state_dict(), strict=False).missing_keys
    names = tuple(getattr(reader, "kv_modules", ()))
    owner = next((n for n, m in plain.named_modules() if m is mixers.get(1)), None)
    if owner is None:
        raise CheckFailed("the plain tiny model holds no module of the component in layer 1 to compare the reader with")
    dropped = {f"{owner}.{n}" for n in names}
    stray = [k for k in missing if not any(k.startswith(d + ".") for d in dropped)]
    if stray:
        raise CheckFailed(
            f"the reading layer lacks {stray[:4]}, which are not in the modules it declares it drops (kv_modules = "
            f"{list(names)}); a reader keeps everything but its key/value modules"
        )
    for name in names:
        src, dst = getattr(mixers[0], name, None), getattr(mixers[1], name, None)
        if isinstance(src, nn.Module) and isinstance(dst, nn.Module):
            dst.load_state_dict(src.state_dict())
    return plain, mixers


def _logits(model: nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, object]:
    """``(full forward logits, cached decode logits over DECODE_CHUNKS, the cache)``."""
    model.eval()
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        parts = torch.cat([model(ids[:, a:e], cache=cache).logits for a, e in DECODE_CHUNKS], dim=1)
    return full, parts, cache


def check_kv_share(bench: Bench) -> str:
    """Layer 1 reads layer 0's keys and values; its logits, forward and cached decode (64 tokens in the chunks of
    :data:`~.cache.DECODE_CHUNKS`), equal those of the reference described in the module docstring within
    :data:`~.base.SAME_MATH_ULPS` ulps, and the reader declares and holds no cache bytes of its own.

    Catches: a reader that silently keeps its own key/value projections (``read_kv_from`` ignored), one that reads
    only the tokens of the current forward from its source (right in a prefill, wrong from the first decode step),
    one that rotates the source's already-rotated keys again, one that still declares a cache of its own. Source:
    Gemma 3n's shared-KV layers (transformers ``Gemma3nTextAttention``) and YOCO (Sun et al. 2024, arXiv:2405.05254).
    """
    spec = bench.spec_with(kv_sharing=[{"layers": [1], "source": 0}])
    try:
        shared, records = bench.build(spec)
    except (SpecError, ValueError) as exc:
        raise CheckFailed(f"a model with layer 1 reading layer 0's keys and values does not build: {exc}") from None
    mixers = _layer_mixers(bench, records)
    if not {0, 1} <= set(mixers):
        raise CheckFailed(
            f"the tiny model's layers hold the component in layers {sorted(mixers)}; the check needs it in layers 0 "
            "(the source) and 1 (the reader)"
        )
    plain, plain_mixers = _reference(bench, shared, mixers[1])
    own = sum(s.bytes_per_token(torch.float32) for s in shared.cache_layout()[1].values())
    if own:
        raise CheckFailed(
            f"the reading layer declares {own} cache bytes per token of its own; a reader keeps no cache (its "
            "cache_spec() declares no entry once read_kv_from() has run)"
        )
    ids = bench.ids(2, DECODE_CHUNKS[-1][1], seed=23)
    hooks = _same_input(mixers) + _same_input(plain_mixers)
    try:
        got_full, got_dec, cache = _logits(shared, ids)
        ref_full, ref_dec, _ = _logits(plain, ids)
    finally:
        for h in hooks:
            h.remove()
    tol = tolerance(ref_full, torch.float32, SAME_MATH_ULPS)
    for what, got, ref in (("the forward", got_full, ref_full), ("cached decode", got_dec, ref_dec)):
        d = max_abs_diff(got, ref)
        worst = d.max().item()
        if worst > tol:
            pos = int((d.amax(dim=(0, 2)) > tol).nonzero()[0, 0].item())
            raise CheckFailed(
                f"{what}: the reading layer's logits differ from the same layer computing the source's keys and "
                f"values itself by max |Δ| = {fmt(worst)} (tolerance {fmt(tol)}), first at position {pos}; a reader "
                "must attend over exactly the keys and values its source stored"
            )
    problem = _state_problem(shared, records, cache)
    if problem is not None:
        raise CheckFailed(f"with kv_sharing: {problem}")
    return "layer 1 reading layer 0's keys and values equals its own copies of them, forward and cached decode"
