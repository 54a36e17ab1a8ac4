"""Padding and the KV cache: ``kv_cache_decode`` (cached decode = full forward) and ``masked_row`` (no NaN from a
query that sees no key; padding never changes real tokens).

Both build the hard cases through :meth:`modkit.Model.forward`, the way generation uses a model: 64-token
sequences decoded in chunks past a sliding window; left padding with positions derived from the mask, with explicit
positions, an all-padding row, and a chunked prefill over left padding.
"""

from __future__ import annotations

from typing import Optional

import torch

from modkit.core.config import ComponentConfig, is_mixer
from modkit.core.errors import SpecError
from modkit.core.registry import Component
from ...spec import load_component, load_spec
from ..harness import Bench, neighbour_positions
from .base import SAME_MATH_ULPS, CheckFailed, CheckSkipped, fmt, max_abs_diff, tolerance

#: ``[start, end)`` chunks fed to the cache: a prefill, single tokens, chunks of 2, 18 (more than a window of 16:
#: the ring buffer's concat path) and 12, then single tokens after the window has wrapped; 64 tokens in all.
DECODE_CHUNKS = (
    (0, 5),
    (5, 6),
    (6, 8),
    (8, 9),
    (9, 27),
    (27, 28),
    (28, 46),
    (46, 47),
    (47, 48),
    (48, 60),
    (60, 61),
    (61, 62),
    (62, 63),
    (63, 64),
)
#: Sliding window tried when the attention's config has a ``sliding_window`` field left at ``None``.
WINDOW = 16
#: Chunk size tried when the attention's config has an ``attention_chunk_size`` field left at ``None`` (not a divisor
#: of the :data:`DECODE_CHUNKS` boundaries, so chunks of the cache feed and chunks of the mask cross each other).
CHUNK = 12
#: ``(config field, value)`` the cached decode is also run with when the attention's config has the field and leaves
#: it unset (``None`` / ``False``): each changes which keys a query sees or how its softmax weighs them, so what the
#: cache must hand back and how it is used. A window or a chunk shorter than the 64 tokens makes the cache a ring of
#: that many slots (fed 18 tokens at once: the concat path); sinks add a softmax column without a key.
OPTIONS = (("sliding_window", WINDOW), ("attention_chunk_size", CHUNK), ("sinks", True))


def applies_kv(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Every component; a token mixer (attention or mixer) only with the ``kv_cache`` capability and a causal config."""
    if is_mixer(entry.kind) and not entry.capabilities.get("kv_cache"):
        return "the entry does not claim kv_cache"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


def _decode_mismatch(bench: Bench, spec: dict) -> tuple[Optional[str], float, float]:
    """``(problem or None, worst |Δ|, tolerance)`` of cached decode against the full forward of ``spec``."""
    model, records = bench.build(spec)
    model.eval()
    ids = bench.ids(2, DECODE_CHUNKS[-1][1], seed=21)
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        parts = [model(ids[:, a:e], cache=cache).logits for a, e in DECODE_CHUNKS]
    inc = torch.cat(parts, dim=1)
    tol = tolerance(full, torch.float32, SAME_MATH_ULPS)
    d = max_abs_diff(inc, full)
    worst = d.max().item()
    if worst > tol:
        per_pos = d.amax(dim=(0, 2))
        pos = int((per_pos > tol).nonzero()[0, 0].item())
        chunk = next((a, e) for a, e in DECODE_CHUNKS if a <= pos < e)
        return (
            f"max |Δ| = {fmt(worst)} between cached decode and the full forward, first at position {pos} "
            f"(fed as tokens [{chunk[0]}, {chunk[1]}) after {chunk[0]} cached: |Δ| = {fmt(per_pos[pos].item())}; "
            f"tolerance {fmt(tol)})",
            worst,
            tol,
        )
    problem = _state_problem(model, records, cache)
    return problem, worst, tol


def _state_problem(model, records, cache) -> Optional[str]:
    """What is wrong with the cache state after a decode, against the mixers' declarations, or ``None``.

    Every declared entry is allocated with its declared shape and dtype; the bytes the declarations give
    (:func:`modkit.nn.build.kv_cache_bytes`, the figure ``modkit build``, ``modkit cost`` and ``generate`` report)
    equal the bytes allocated; every entry was written by the forward (a declared entry that stays zero is bytes the
    mixer reserves and never uses). The declaration is the only source of an entry's shape: an entry named ``"k"``
    may hold any number of key maps (Differential attention keeps ``2 · n_kv_heads``); an attention that declares
    no ``cache_spec()`` gets keys and values of ``n_kv_heads`` heads (:meth:`~modkit.CacheSpec.kv`), so one that
    stores ``n_heads`` heads there (torchtune #38) fails the allocated-shape comparison or the write itself.
    """
    from modkit.nn.build import kv_cache_bytes

    layout = model.cache_layout()
    for i, (specs, layer) in enumerate(zip(layout, cache.layers)):
        for key, spec in specs.items():
            state = layer.mixers.get(key)
            if state is None:
                return f"layer {i}: the cache holds no state for mixer {key!r} (it holds {sorted(layer.mixers)})"
            for e in spec.entries:
                t = state.tensors.get(e.name)
                slots = e.block_slots(cache.max_len) if e.per_block else spec.slots(cache.max_len)
                want = e.allocated_shape(cache.batch_size, slots)
                dtype = e.dtype or cache.dtype
                if t is None or tuple(t.shape) != want or t.dtype != dtype:
                    got = None if t is None else (tuple(t.shape), t.dtype)
                    return (
                        f"layer {i} {key or 'mixer'}: entry {e.name!r} is allocated as {got}, declared {(want, dtype)}"
                    )
                if not bool(t.ne(0).any()):
                    return (
                        f"layer {i} {key or 'mixer'}: declares cache entry {e.name!r} {e.shape} ({e.growth}) but the "
                        f"forward never wrote it: its {e.nbytes(cache.dtype):,} bytes per {e.growth} are counted "
                        "by modkit build / cost and allocated for nothing (declare only what the mixer stores)"
                    )
            problem = _block_problem(i, key, spec, state, cache.seen_tokens)
            if problem:
                return problem
    declared = kv_cache_bytes(model, cache.max_len, cache.batch_size, cache.dtype)
    if declared != cache.nbytes():
        return (
            f"the declarations give {declared:,} cache bytes for batch {cache.batch_size} x {cache.max_len} tokens, "
            f"new_cache allocated {cache.nbytes():,}"
        )
    return None


def _block_problem(i: int, key: str, spec, state, seen: int) -> Optional[str]:
    """A per-block entry (growth ``"block"``) whose first ``seen // block`` slots are not all written after ``seen``
    tokens (in every row), or ``None``: the declared growth is one slot per ``block`` tokens, so a mixer that fills
    fewer compresses over longer blocks than it declares and reports (and allocates) bytes it never uses."""
    for e in spec.block_entries:
        t = state.tensors.get(e.name)
        full = min(seen // e.block, t.shape[e.slot_axis])
        used = t.movedim(e.slot_axis, 1).ne(0).flatten(2).any(-1)[:, :full]
        if not bool(used.all()):
            first = int((~used).any(0).nonzero()[0, 0].item())
            return (
                f"layer {i} {key or 'mixer'}: cache entry {e.name!r} declares one slot per {e.block} tokens, so "
                f"{full} slots after {seen} tokens, but slot {first} was never written: the mixer compresses over "
                "longer blocks than it declares, and modkit build / cost count slots it never fills"
            )
    return None


def _variants(bench: Bench) -> list[tuple[str, dict]]:
    """``(label, attention config)`` for each of :data:`OPTIONS` the config has unset, one at a time, then all of them
    together when more than one applies (configs that do not validate are left out)."""
    cfg = bench.config_json
    fields = bench.entry.config.model_fields
    options = [(name, value) for name, value in OPTIONS if name in fields and cfg.get(name) in (None, False)]
    sets = [[o] for o in options] + ([options] if len(options) > 1 else [])
    out = []
    for chosen in sets:
        try:
            data = load_component(bench.entry.kind, {**cfg, **dict(chosen)}, registry=bench.registry).model_dump(
                mode="json"
            )
        except SpecError:
            continue
        out.append((" and ".join(f"{n} {v}" if v is not True else n for n, v in chosen), data))
    return out


def check_kv_cache_decode(bench: Bench) -> str:
    """Decoding with the KV cache, in the chunks of :data:`DECODE_CHUNKS` (64 tokens), gives the full forward's logits.

    For a token mixer (any kind) with the ``kv_cache`` capability this runs once per neighbour position scheme (the built-ins:
    rope rotates cached keys once, ALiBi needs key positions, absolute schemes need the right offsets), and again
    with each option of :data:`OPTIONS` its config has and leaves unset: ``sliding_window`` = 16 (the cache then
    keeps a ring buffer of 16 slots, fed chunks longer than the window), ``attention_chunk_size`` = 12 (a ring of
    12 slots and a chunked mask), ``sinks`` (a softmax column without a key), then all of them together. Other kinds
    decode with the tiny model's built-in attention. Then the state against the declarations (any mixer's
    ``cache_spec()``, not only keys and values; see :func:`_state_problem`): every declared entry allocated as
    declared and written by the forward, and the bytes the declarations give (what ``modkit build``, ``modkit
    cost`` and ``generate`` report) equal to the bytes allocated. No rule beyond the declaration: an entry named
    ``"k"`` may hold ``2 · n_kv_heads`` key maps (Differential attention) when the mixer declares so. Tolerance
    :data:`~.base.SAME_MATH_ULPS` float32 ulps of the logit scale.

    Catches: cached decode that drifts from the full forward (the ``drifting`` fixture); a RoPE offset off by one in
    the cached path (``rope_offset``: caught with a margin of ~10^3, where the 8-token, 1e-4 version of this
    check had 6.8); a mask aligned top-left (``is_causal=True`` with fewer queries than keys); a ring buffer that
    forgets or repeats a key; a declared cache entry the mixer never writes (``overdeclared``: bytes reported and
    allocated for nothing); a per-block entry (growth ``"block"``) whose first ``tokens // block`` slots are not all
    written (``overgrown_blocks``: it compresses blocks of m and declares one slot per m / 2 tokens). Source: a cached decode must equal the full forward (masks aligned bottom-right), and
    the cache's declaration is the one source of its shapes and bytes (torchtune #38: a cache of ``n_heads`` heads
    where ``n_kv_heads`` were declared).
    """
    if is_mixer(bench.entry.kind):
        schemes = neighbour_positions(bench)
        if not schemes:
            raise CheckSkipped("no position scheme (built-in or named) has a valid example config")
    else:
        filler = bench.mixer_filler
        if filler is not None and not filler[0].capabilities.get("kv_cache"):
            raise CheckSkipped("the tiny model's attention has no kv_cache capability to decode with")
        schemes = [(None, None)]
    runs = []
    for pos_entry, pos_cfg in schemes:
        spec = bench.spec_with(position=pos_cfg) if pos_entry is not None else bench.spec
        runs.append((pos_entry.type if pos_entry is not None else bench.spec["position"]["type"], spec))
    for label, attention in _variants(bench) if is_mixer(bench.entry.kind) else ():
        runs.append(
            (f"{runs[0][0]} and {label}", bench.spec_with(position=runs[0][1]["position"], attention=attention))
        )
    failures, passed, unusable = [], [], []
    worst_ratio, tol = 0.0, 0.0
    for label, spec in runs:
        try:
            load_spec(spec, registry=bench.registry)
        except SpecError as exc:
            unusable.append(f"{label} ({exc.errors[0][1] if exc.errors else exc})")
            continue
        problem, worst, tol = _decode_mismatch(bench, spec)
        worst_ratio = max(worst_ratio, worst / tol if tol else 0.0)
        if problem:
            failures.append(f"with position {label}: {problem}" if len(runs) > 1 else problem)
        else:
            passed.append(label)
    if failures:
        raise CheckFailed("; ".join(failures))
    if not passed:
        raise CheckSkipped("no position scheme could be combined with it: " + "; ".join(unusable))
    note = f"; not combinable: {', '.join(unusable)}" if unusable else ""
    return (
        f"cached decode of 64 tokens equals the full forward (worst at {worst_ratio:.2g} of the tolerance {fmt(tol)}) "
        f"with position {', '.join(passed)}{note}; the cache holds exactly the declared state, every entry written, "
        "declared bytes = allocated bytes"
    )


def applies_masked(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Token mixers (attention or mixer) and position schemes (the components that see the mask and the positions)."""
    return None if is_mixer(entry.kind) or entry.kind == "position" else "applies to token mixers and position schemes"


def _finite(out: torch.Tensor, case: str) -> None:
    bad = ~torch.isfinite(out.float())
    if bad.any():
        rows = sorted({(int(b), int(p)) for b, p, _ in bad.nonzero().tolist()})
        raise CheckFailed(
            f"{case}: {int(bad.sum())} non-finite logits at (batch, position) {rows[:6]} (a query that sees no key "
            "must output 0, not NaN: use modkit.masked_attention / masked_softmax)"
        )


def _same(got: torch.Tensor, ref: torch.Tensor, case: str, offset: int) -> float:
    tol = tolerance(ref, torch.float32, SAME_MATH_ULPS)
    d = max_abs_diff(got, ref)
    worst = d.max().item()
    if worst > tol:
        pos = int(d.amax(dim=-1).argmax().item()) + offset
        raise CheckFailed(
            f"{case}: the real tokens' logits change: max |Δ| = {fmt(worst)} at position {pos} (tolerance {fmt(tol)})"
        )
    return worst


def check_masked_row(bench: Bench) -> str:
    """Padding: no NaN anywhere, above all from a query that sees no key at all, and real tokens are unaffected.

    Four cases through :meth:`modkit.Model.forward` (float32, 8 tokens, 3 of them left padding in sequence 0):

    1. positions derived from ``attention_mask`` (padding tokens get position 0, so each sees the first real
       token): finite; the real tokens equal the unpadded sequence alone;
    2. explicit positions ``0..7``: each padding query sees only padding keys, a row with no visible key: finite;
       the real tokens equal the unpadded sequence at positions ``3..7``;
    3. an all-padding sequence beside a real one: finite; the real one equals itself alone;
    4. (with a KV cache) a chunked prefill, chunks of 4, of 6 left-padding tokens then 6 real ones: the first chunk
       is all padding, so its rows have no visible key and whatever they output goes into the cache: finite.

    Catches: a plain softmax with no dead-row guard (the ``nan_softmax`` fixture), which the old check (case 1
    only) never exercised: in real use its NaN spreads through the cache into every later token. Source: design
    brief, "Attention and the KV cache" (fully masked rows must not produce NaN; pytorch #103749).
    """
    model, _ = bench.build()
    model.eval()
    pad, s = 3, 8
    ids = bench.ids(2, s, seed=61)
    mask = torch.ones(2, s, dtype=torch.bool, device=ids.device)
    mask[0, :pad] = False
    cases = []
    with torch.no_grad():
        out = model(ids, attention_mask=mask).logits
        _finite(out, f"{pad} left-padding tokens")
        worst = _same(out[0, pad:], model(ids[0:1, pad:]).logits[0], f"{pad} left-padding tokens", pad)
        worst = max(
            worst, _same(out[1], model(ids[1:2]).logits[0], f"{pad} left-padding tokens in the other sequence", 0)
        )
        cases.append("left padding")

        positions = bench.positions(2, s)
        out = model(ids, attention_mask=mask, positions=positions).logits
        case = "padding queries that see only padding keys (explicit positions)"
        _finite(out, case)
        ref = model(ids[0:1, pad:], positions=positions[0:1, pad:]).logits[0]
        worst = max(worst, _same(out[0, pad:], ref, case, pad))
        cases.append("padding-only rows")

        empty = mask.clone()
        empty[0] = False
        out = model(ids, attention_mask=empty).logits
        case = "an all-padding sequence beside a real one"
        _finite(out, case)
        worst = max(worst, _same(out[1], model(ids[1:2]).logits[0], case, 0))
        cases.append("an all-padding row")

        attn = bench.entry if is_mixer(bench.entry.kind) else (bench.mixer_filler or (bench.entry,))[0]
        if attn.capabilities.get("kv_cache"):
            long_ids = bench.ids(2, 12, seed=62)
            long_mask = torch.ones(2, 12, dtype=torch.bool, device=ids.device)
            long_mask[0, :6] = False
            cache = model.new_cache()
            outs = [
                model(long_ids[:, a : a + 4], attention_mask=long_mask[:, : a + 4], cache=cache).logits
                for a in (0, 4, 8)
            ]
            _finite(torch.cat(outs, dim=1), "a chunked prefill (chunks of 4) over 6 left-padding tokens")
            cases.append("a chunked prefill over left padding")
    return f"no NaN with {', '.join(cases)}; real tokens equal the unpadded run (max |Δ| = {fmt(worst)})"
