"""The state a token mixer decodes from is all in the cache: ``cache_state`` (reset, a deep copy, nothing kept on the
module, the bytes held) and ``long_decode`` (1,024 single-token steps against the full forward, so a slow drift
shows).

Both apply to any component that declares the ``kv_cache`` capability, whatever its kind (an attention, a recurrent
mixer, a hybrid of both): what they check is what the cache contract of :mod:`modkit.nn.cache` promises, that a
``KVCache`` is the whole state between two forwards. ``cache.reset()`` then makes a cache as new,
``copy.deepcopy(cache)`` forks a generation (beam search, speculative decoding, a prompt cache), and
``cache.nbytes()`` is the memory decoding holds.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from modkit.core.config import ComponentConfig
from modkit.core.registry import Component
from ..harness import Bench
from .base import SAME_MATH_ULPS, CheckFailed, fmt, max_abs_diff, tolerance

STATE_SUMMARY = (
    "the cache is the whole decoding state: decode after cache.reset() and on a deep copy equals a fresh cache's; "
    "a forward keeps no tensor on the module; cache.nbytes() counts all the state held"
)
LONG_SUMMARY = (
    "1,024 single-token decode steps (float64, batch 1) equal the full forward, tolerance scaled to the logits "
    "and to the precision the component computes in"
)

#: ``(prefill, total)`` tokens of each ``cache_state`` run: a prefill of 6, then single tokens up to 12.
STATE_RUN = (6, 12)
#: Prefill, then single-token decode steps, of ``long_decode`` (1,024 steps after a 4-token prefill).
LONG_PREFILL, LONG_STEPS = 4, 1024


def applies_state(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Components that declare the ``kv_cache`` capability (any kind) with a causal config."""
    if not entry.capabilities.get("kv_cache"):
        return "the entry does not claim kv_cache (it keeps no decoding state)"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


# ------------------------------------------------------------------------------------------------- held tensors


def _tensors_of(value: Any) -> list[tuple[str, Tensor]]:
    """``(suffix, tensor)`` for a tensor, or for the tensors one level inside a list, tuple or dict."""
    if isinstance(value, Tensor):
        return [("", value)]
    if isinstance(value, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, Tensor)]
    if isinstance(value, dict):
        return [(f"[{k!r}]", v) for k, v in value.items() if isinstance(v, Tensor)]
    return []


def held_tensors(model: nn.Module) -> dict[str, Tensor]:
    """``{qualified name: tensor}`` of what the modules of ``model`` hold besides parameters: buffers and tensors kept
    as plain attributes (also one level inside a list, tuple or dict attribute)."""
    out: dict[str, Tensor] = {}
    for name, m in model.named_modules():
        prefix = f"{name}." if name else ""
        for attr, value in vars(m).items():
            if attr in ("_parameters", "_modules"):
                continue
            if attr == "_buffers":
                out.update({f"{prefix}{b}": t for b, t in value.items() if t is not None})
                continue
            out.update({f"{prefix}{attr}{s}": t for s, t in _tensors_of(value)})
    return out


def _snapshot(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in held_tensors(model).items()}


def _nbytes(t: Tensor) -> int:
    return t.numel() * t.element_size()


def _grown(before: dict[str, Tensor], model: nn.Module) -> list[tuple[str, Tensor, str]]:
    """``(name, tensor, how)`` of the tensors the modules hold now that they did not hold, or held with other
    values, in ``before``."""
    out = []
    for name, t in held_tensors(model).items():
        old = before.get(name)
        if old is None:
            out.append((name, t, "added"))
        elif old.shape != t.shape or old.dtype != t.dtype or not torch.equal(old, t.detach()):
            out.append((name, t, "changed"))
    return out


def _outside_cache(cache: Any) -> list[tuple[str, Tensor]]:
    """Tensors kept on the cache's layer and mixer objects outside their declared entries (``state.extra = t``)."""
    out = []
    for i, layer in enumerate(cache.layers):
        for attr, value in vars(layer).items():
            out += [(f"layers[{i}].{attr}{s}", t) for s, t in _tensors_of(value)]
        for key, state in layer.mixers.items():
            for attr, value in vars(state).items():
                if attr != "tensors":
                    out += [(f"layers[{i}].mixers[{key!r}].{attr}{s}", t) for s, t in _tensors_of(value)]
    return out


def _describe(items: list[tuple[str, Tensor, str]]) -> str:
    return ", ".join(
        f"{n} {list(t.shape)} {str(t.dtype).replace('torch.', '')} ({how}, {_nbytes(t):,} bytes)" for n, t, how in items
    )


# ------------------------------------------------------------------------------------------------- cache_state


def _decode(model: nn.Module, ids: Tensor, cache: Any, start: int = 0) -> Tensor:
    """Logits of ``ids[:, start:]`` fed to ``cache``: a prefill up to :data:`STATE_RUN`'s first bound, then single
    tokens (from ``start`` on)."""
    cut = max(STATE_RUN[0], start)
    parts = [model(ids[:, start:cut], cache=cache).logits] if cut > start else []
    parts += [model(ids[:, i : i + 1], cache=cache).logits for i in range(cut, ids.shape[1])]
    return torch.cat(parts, dim=1)


def _compare(got: Tensor, ref: Tensor, case: str, why: str, offset: int = 0) -> float:
    tol = tolerance(ref, torch.float32, SAME_MATH_ULPS)
    d = max_abs_diff(got, ref)
    worst = d.max().item()
    if worst > tol:
        pos = int(d.amax(dim=(0, 2)).argmax().item()) + offset
        raise CheckFailed(
            f"{case}: max |Δ| = {fmt(worst)} against the same tokens decoded on a fresh cache, worst at position "
            f"{pos} (tolerance {fmt(tol)}); {why}"
        )
    return worst


def check_cache_state(bench: Bench) -> str:
    """Everything a mixer decodes from lives in the cache it is given.

    On the tiny model (float32, batch 2, :data:`STATE_RUN`: a prefill of 6 tokens then single tokens to 12), the
    reference is sequence B decoded on a fresh cache by the fresh model (whether that equals the full forward is
    ``kv_cache_decode``'s question, not this check's):

    1. decode sequence A, ``cache.reset()``, decode B: B's logits equal the reference;
    2. prefill B, ``fork = copy.deepcopy(cache)``, decode the rest of B on the cache, then on the fork: both equal the
       reference (the fork starts where the cache was, whatever the cache did since);
    3. the modules hold no tensor after these forwards that they did not hold before, and no buffer or tensor
       attribute changed value (a tensor kept on ``self`` is state the cache does not carry: ``reset`` does not
       clear it, ``deepcopy`` does not copy it, and one model serving two caches mixes them), and nothing is kept
       on the cache's objects outside their declared entries: so ``cache.nbytes()`` is all the state held.

    Tolerance :data:`~.base.SAME_MATH_ULPS` float32 ulps of the logit scale.

    Catches: a retention mixer that keeps half its state on the module (``half_state``: the kit's older checks
    passed it, yet after ``reset`` its logits were off by O(1), a copied cache decoded wrongly, and ``nbytes``
    reported half the bytes held). Source: the cache contract of :mod:`modkit.nn.cache` (state never leaks
    between calls: litgpt #1596, torchtune #959).
    """
    model, _ = bench.build()
    model.eval()
    n, cut = STATE_RUN[1], STATE_RUN[0]
    a, b = bench.ids(2, n, seed=71), bench.ids(2, n, seed=72)
    before = _snapshot(model)
    with torch.no_grad():
        ref = _decode(model, b, model.new_cache(2, n))
        cache = model.new_cache(2, n)
        _decode(model, a, cache)
        cache.reset()
        after_reset = _decode(model, b, cache)
        cache.reset()
        model(b[:, :cut], cache=cache)
        fork = copy.deepcopy(cache)
        first = _decode(model, b, cache, cut)
        second = _decode(model, b, fork, cut)
    worst = _compare(
        after_reset, ref, "after cache.reset(), decoding another sequence", "state kept outside the cache survived"
    )
    why = "the copy does not carry the whole state"
    worst = max(worst, _compare(first, ref[:, cut:], "decoding on the cache after it was deep-copied", why, cut))
    worst = max(worst, _compare(second, ref[:, cut:], "decoding on a copy.deepcopy of the cache", why, cut))
    grown, outside = _grown(before, model), _outside_cache(cache)
    if grown or outside:
        held = sum(_nbytes(t) for _, t, _ in grown) + sum(_nbytes(t) for _, t in outside)
        where = _describe(grown + [(name, t, "on the cache outside its entries") for name, t in outside])
        raise CheckFailed(
            f"cache.nbytes() reports {cache.nbytes():,} bytes but decoding holds {held:,} more outside the declared "
            f"entries: {where}; keep every tensor a later forward reads in a declared cache entry "
            "(cache_spec() -> CacheSpec, read and written through inputs.cache_for(self))"
        )
    return (
        f"decode after cache.reset() and on a deep copy equals decoding on a fresh cache (max |Δ| = {fmt(worst)}); "
        f"the modules hold no new tensor; cache.nbytes() = {cache.nbytes():,} bytes is all the state"
    )


# ------------------------------------------------------------------------------------------------- long_decode


class _Precision(TorchDispatchMode):
    """The machine epsilon of the least precise floating dtype the component's values pass through: the model
    dtype's, or that of an op run inside one of ``modules`` that turns a more precise floating input into a less
    precise output (``x.float()`` of a float64 activation, a float32 state written from float64 values). The
    neighbours' ops do not count (a norm that computes in float32 does it alike in both forms, token by token)."""

    def __init__(self, dtype: torch.dtype, modules: list[nn.Module]) -> None:
        super().__init__()
        self.eps = torch.finfo(dtype).eps
        self.depth = 0
        self.modules = modules
        self.handles: list[Any] = []

    def __enter__(self) -> "_Precision":
        def enter(*_: Any) -> None:
            self.depth += 1

        def leave(*_: Any) -> None:
            self.depth -= 1

        for m in self.modules:
            self.handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        for h in self.handles:
            h.remove()
        self.handles = []
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func: Callable, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if self.depth <= 0:
            return out
        inputs = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, Tensor) and t.is_floating_point()]
        if inputs:
            finest = min(torch.finfo(t.dtype).eps for t in inputs)
            for t in tree_flatten(out)[0]:
                if isinstance(t, Tensor) and t.is_floating_point() and torch.finfo(t.dtype).eps > finest:
                    self.eps = max(self.eps, torch.finfo(t.dtype).eps)
        return out


def check_long_decode(bench: Bench) -> str:
    """:data:`LONG_STEPS` single-token decode steps give the full forward's logits: a slow drift shows.

    The tiny model with one layer and room for the run is built in float64 (batch 1); a prefill of
    :data:`LONG_PREFILL` tokens, then 1,024 tokens one at a time, against one forward over all of them. The tolerance
    is :data:`~.base.SAME_MATH_ULPS` ulps of the logit scale in the least precise floating dtype the model's ops
    lets its values pass through (read under a ``TorchDispatchMode`` during the prefill and one step: an op that
    makes a less precise output from a more precise input): float64 for a component that computes in the model
    dtype, float32 for one that keeps a float32 state or computes in float32 (``.float()``).

    Catches: a cached state that decays by an extra ``1 - 1e-5`` per decode step (``slow_decay``: its logits
    drift by O(1e-3) over 1,024 tokens, far below what a 64-token decode in chunks can see), a decode recurrence
    whose constants differ slightly from the chunked form's. Source: decoding must equal the full forward at any
    length (Sun et al. 2023, RetNet, arXiv:2307.08621, §2.1: the parallel and recurrent forms are the same math).
    """
    total = LONG_PREFILL + LONG_STEPS
    model, records = bench.build(bench.spec_with(n_layers=1, max_seq_len=total), dtype=torch.float64)
    model.eval()
    ids = bench.ids(1, total, seed=81)
    lowest = _Precision(torch.float64, [r.module for r in bench.targets(records)])
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache(1, total, dtype=torch.float64)
        with lowest:
            parts = [model(ids[:, :LONG_PREFILL], cache=cache).logits]
            parts.append(model(ids[:, LONG_PREFILL : LONG_PREFILL + 1], cache=cache).logits)
        parts += [model(ids[:, i : i + 1], cache=cache).logits for i in range(LONG_PREFILL + 1, total)]
    inc = torch.cat(parts, dim=1)
    scale = max(float(full.abs().max()), 1e-3)
    tol = SAME_MATH_ULPS * lowest.eps * scale
    per_pos = max_abs_diff(inc, full).amax(dim=(0, 2))
    worst = per_pos.max().item()
    names = {torch.finfo(d).eps: str(d).replace("torch.", "") for d in (torch.float64, torch.float32, torch.float16)}
    precision = names.get(lowest.eps, f"eps {fmt(lowest.eps)}")
    if worst > tol:
        first = int((per_pos > tol).nonzero()[0, 0].item())
        early = per_pos[: LONG_PREFILL + 64].max().item()
        raise CheckFailed(
            f"decoding {LONG_STEPS} tokens one at a time drifts from the full forward: max |Δ| = {fmt(worst)} at "
            f"position {int(per_pos.argmax())} (first above the tolerance at position {first}; max |Δ| over the "
            f"first 64 steps {fmt(early)}); tolerance {fmt(tol)} ({SAME_MATH_ULPS} ulps of {precision} x the logit "
            f"scale {fmt(scale)}): the decode step's state update differs from the full forward's"
        )
    return (
        f"{LONG_STEPS} single-token steps after a {LONG_PREFILL}-token prefill equal the full forward in float64: "
        f"max |Δ| = {fmt(worst)} (tolerance {fmt(tol)}: the component computes in {precision})"
    )
