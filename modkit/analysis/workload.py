"""What a FLOPs declaration is evaluated on, and the declarations checked: :class:`Workload`, :func:`elementwise`,
:func:`declared_flops` and :class:`CostError`.

Every registry entry declares ``Component.flops(config, ctx, work) -> {part: FLOPs}`` for one call of its module on
a :class:`Workload` (1 multiply-add = 2 FLOPs, matrix products only; the conventions are those of
:mod:`modkit.analysis.cost`, which sums the declarations of a whole model). Attention counts the (query, key)
pairs its mask lets through, in closed forms (:meth:`Workload.pairs`), so a count is O(1) in the context length.
Nothing here needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from modkit.core.errors import ModkitError
from modkit.core.registry import Component

#: FLOPs of one multiply-add.
FLOPS_PER_MAC = 2


class CostError(ModkitError, ValueError):
    """A cost cannot be computed: a component declares no FLOPs, a declaration returns something that is not
    ``{part: non-negative int}``, or an argument is out of range. The message names the component and the fix."""


# ------------------------------------------------------------------------------------------------- workload


def _causal_prefix(n: int, window: Optional[int]) -> int:
    """``Σ_{p<n} min(p + 1, window)``: the pairs a causal mask lets through for queries at positions ``0..n-1``."""
    if window is None or n <= window:
        return n * (n + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def _reach(n: int, window: Optional[int]) -> int:
    """``Σ_{p<n} min(p, window - 1)``: keys on one side of a query, summed over queries ``0..n-1``."""
    if window is None or n <= window:
        return n * (n - 1) // 2
    return window * (window - 1) // 2 + (n - window) * (window - 1)


def _chunked_pairs(past: int, total: int, chunk: int, window: Optional[int], causal: bool) -> int:
    """Unmasked (query, key) pairs of the queries at positions ``past .. total - 1`` over keys ``0 .. total - 1`` when
    each query sees only its own chunk of ``chunk`` positions (and, with ``window``, keys less than ``window`` away).

    Causal: query ``p`` at offset ``r = p % chunk`` in its chunk sees ``min(r + 1, window)`` keys, so whole chunks
    repeat one sum (:func:`_causal_prefix` of ``chunk``). Bidirectional: it also sees the keys after it in its chunk
    (the last chunk ends at ``total``), ``min(r, window - 1) + min(L - 1 - r, window - 1) + 1`` in a chunk of ``L``
    keys. Closed forms per chunk, so the cost is O(1) in the context length.
    """
    if causal:

        def upto(n: int) -> int:  # Σ_{p<n} min(p % chunk + 1, window)
            return (n // chunk) * _causal_prefix(chunk, window) + _causal_prefix(n % chunk, window)

        return upto(total) - upto(past)

    def part(length: int, r0: int, r1: int) -> int:  # queries at offsets [r0, r1) of a chunk of `length` keys
        before = _reach(r1, window) - _reach(r0, window)
        after = _reach(length - r0, window) - _reach(length - r1, window)
        return before + after + (r1 - r0)

    first, last = past // chunk, (total - 1) // chunk
    count = 0
    for c in {first, last}:  # the chunks at the two ends may be cut (by past, by total)
        start = c * chunk
        length = min(chunk, total - start)
        count += part(length, max(past - start, 0), min(total - start, chunk))
    if last - first > 1:  # whole chunks in between, all of whose queries are new
        count += (last - first - 1) * part(chunk, 0, chunk)
    return count


@dataclass(frozen=True)
class Workload:
    """One forward call a FLOPs declaration is evaluated on.

    Attributes:
        batch: rows (sequences).
        new: new tokens per row (the query length; 1 when decoding).
        past: tokens per row already in the KV cache (their keys are attended to, not recomputed).
        dense: count every (query, key) pair of the ``[new, past + new]`` score matrix, as a dense kernel computes
            it (masked entries included; what ``FlopCounterMode`` measures) instead of only the pairs the mask
            lets through.

    Raises:
        CostError: a negative size, or no new token.
    """

    batch: int = 1
    new: int = 1
    past: int = 0
    dense: bool = False

    def __post_init__(self) -> None:
        if self.batch < 1 or self.new < 1 or self.past < 0:
            raise CostError(
                f"a workload needs batch >= 1, new >= 1, past >= 0; got batch {self.batch}, "
                f"new {self.new}, past {self.past}"
            )

    @property
    def tokens(self) -> int:
        """Token rows through each position-wise component: ``batch · new``."""
        return self.batch * self.new

    def pairs(self, *, causal: bool = True, window: Optional[int] = None, chunk: Optional[int] = None) -> int:
        """(query, key) pairs one attention head scores over the whole batch.

        Args:
            causal: query ``p`` sees keys ``k <= p``; otherwise every key (bidirectional).
            window: sliding window: only keys with ``0 <= p - k < window`` (``|p - k| < window`` bidirectional).
            chunk: chunked local attention: only keys of the query's own chunk, ``k // chunk == p // chunk``
                (Llama 4's ``attention_chunk_size``); combines with ``causal`` and ``window``.

        Returns:
            ``batch · new · (past + new)`` when ``dense``; otherwise the unmasked pairs, e.g. ``new · (new + 1) / 2``
                for a causal prefill, ``min(past + 1, window)`` for one decoded token and ``past % chunk + 1`` for
                one decoded token of a chunked layer.
        """
        total = self.past + self.new
        if self.dense:
            return self.batch * self.new * total
        if chunk is not None:
            return self.batch * _chunked_pairs(self.past, total, chunk, window, causal)
        if causal:
            return self.batch * (_causal_prefix(total, window) - _causal_prefix(self.past, window))
        if window is None:
            return self.batch * self.new * total
        before = _reach(total, window) - _reach(self.past, window)  # keys at or before each query, itself excluded
        after = _reach(total - self.past, window)  # keys after each query
        return self.batch * (before + after + self.new)

    def rows(self, n: int) -> Optional["Workload"]:
        """``n`` independent token rows (what a mixture of experts hands its stacked experts); ``None`` for none."""
        return Workload(batch=int(n), new=1, past=0, dense=self.dense) if n > 0 else None


class Elementwise:
    """A FLOPs declaration of 0 matrix-product FLOPs, with the reason (``Component(flops=elementwise(...))``)."""

    def __init__(self, reason: str):
        self.reason = reason

    def __call__(self, config: Any, ctx: Any, work: Workload) -> dict[str, int]:
        """No matrix product: ``{}``."""
        return {}

    def __repr__(self) -> str:
        return f"elementwise({self.reason!r})"


def elementwise(reason: str) -> Elementwise:
    """Declare that a component does no matrix product (0 FLOPs under modkit's convention), saying why.

    Example: ``Component(..., flops=elementwise("normalisation: element-wise"))``.
    """
    return Elementwise(reason)


def declared_flops(entry: Component, config: Any, ctx: Any, work: Optional[Workload]) -> dict[str, int]:
    """``entry.flops(config, ctx, work)`` checked: ``{part: FLOPs}`` with non-negative integer values.

    ``work`` may be ``None`` (zero rows: an expert no token reaches), which gives ``{}``.

    Raises:
        CostError: the entry declares no FLOPs (names it, its provider and the fix), or its declaration returned
            something else than a mapping of part names to non-negative integers.
    """
    where = f"{entry.kind}/{entry.type} ({entry.provider})" if entry.provider else f"{entry.kind}/{entry.type}"
    if entry.flops is None:
        raise CostError(
            f"{where} declares no FLOPs, so its cost is unknown (modkit does not guess a number); give its Component "
            "a flops=fn(config, ctx, work) -> {part: FLOPs} declaration, or "
            "flops=modkit.analysis.cost.elementwise(reason) "
            "when it does no matrix product (see docs/guides/cost.md)"
        )
    if work is None:
        return {}
    got = entry.flops(config, ctx, work)
    if not isinstance(got, Mapping):
        raise CostError(f"{where}: flops() returned {type(got).__name__}, expected a dict {{part: FLOPs}}")
    out = {}
    for part, n in got.items():
        if not isinstance(part, str) or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise CostError(
                f"{where}: flops() returned {part!r}: {n!r}; parts must be names and FLOPs non-negative integers"
            )
        out[part] = n
    return out


#: decode contexts a declaration is evaluated at to read its growth: an empty cache (1), then caches holding one and
#: two earlier tokens (2, 3), then two long ones (4,096 and 8,192 tokens): a part that grows by one entry per block
#: of tokens (block-compressed attention's indexer, one score per 4 or 128 tokens) is constant over the first few
#: tokens and grows only across the long pair. A component may compute differently with and without a cache (MLA's
#: expanded and absorbed forms), so growth is read within a pair of consecutive contexts, never across the
#: empty-cache case alone.
GROWTH_CONTEXTS = (1, 2, 3, 4096, 8192)


def varying_parts(by_context: list[Mapping[str, int]]) -> set[str]:
    """The parts whose FLOPs change between consecutive evaluations of ``by_context`` (one ``{part: FLOPs}`` per
    context, in increasing order): present at both contexts of a pair and different there.

    Example: ``[{"proj": 8, "scores": 2}, {"proj": 8, "scores": 4}]`` -> ``{"scores"}``.
    """
    return {k for a, b in zip(by_context, by_context[1:]) for k in set(a) & set(b) if a[k] != b[k]}


def declared_growth(entry: Component, config: Any, ctx: Any) -> set[str]:
    """The parts of a component whose declared FLOPs per decoded token grow with the context: its
    :func:`declared_flops` evaluated on one decoded token after ``n - 1`` cached ones for ``n`` in
    :data:`GROWTH_CONTEXTS` (:func:`varying_parts`). An attention's scores and weighted sum grow (one more key per
    cached token); a recurrent mixer's scan does not (a fixed-size state); a declaration is read, never a kind.

    Raises:
        CostError: as :func:`declared_flops` (no declaration, a malformed one).
    """
    return varying_parts([declared_flops(entry, config, ctx, Workload(new=1, past=n - 1)) for n in GROWTH_CONTEXTS])
