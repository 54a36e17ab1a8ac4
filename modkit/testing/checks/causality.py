"""Which tokens may influence which: ``causality`` (never a later token) and ``per_token`` (only the token itself).

* ``causality``: in a decoder, changing tokens from position ``j`` on never changes the logits before ``j``; over
  64 tokens (past a sliding window and the first few positions), in eval mode and in train mode with dropout on.
* ``per_token``: an ffn or a norm (or a router, through the ffn holding it) maps each token on its own: a token's
  output does not depend on the other tokens of its sequence.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from modkit.core.config import ComponentConfig
from modkit.core.errors import SpecError
from modkit.core.registry import Component
from ...spec import load_spec
from ..harness import CONTRACT_KINDS, Bench
from .base import (
    SAME_MATH_ULPS,
    CheckFailed,
    CheckSkipped,
    call_contract,
    contract_record,
    fmt,
    fork_rng,
    max_abs_diff,
    nonfinite,
    tolerance,
)

#: Sequence length of the causality check: long enough to pass a sliding window and the first few positions.
CAUSAL_SEQ = 64
#: Positions ``j`` from which the tokens are changed in train mode (one forward each; eval mode tries every ``j``).
TRAIN_CUTS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 16, 17, 24, 32, 33, 40, 48, 56, 63)
#: Dropout probabilities of the train-mode run (each only where the spec's components apply it).
TRAIN_DROPOUT = 0.1


def applies_causality(entry: Component, config: ComponentConfig) -> Optional[str]:
    """Every component; a token mixer only when it claims ``causal_safe`` and its config is not bidirectional."""
    if entry.kind in ("attention", "mixer") and not entry.capabilities.get("causal_safe"):
        return "the entry does not claim causal_safe"
    if getattr(config, "causal", True) is False:
        return "the config is bidirectional (causal = false)"
    return None


def _changed_from(ids: torch.Tensor, j: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    """``ids [1, seq]`` with every token at positions ``>= j`` replaced by another token."""
    out = ids.clone()
    shift = torch.randint(1, vocab, (ids.shape[1] - j,), generator=g).to(ids.device)
    out[0, j:] = (ids[0, j:] + shift) % vocab
    return out


def with_dropout(bench: Bench, rate: float) -> dict:
    """The bench's spec with ``dropout`` at ``rate`` wherever its components apply it (the rest left at 0).

    A rate the spec's attention or placement does not declare (capabilities ``attention_dropout`` /
    ``residual_dropout``) is refused by validation; that rate is set back to 0.
    """
    rates = {"embedding": rate, "attention": rate, "residual": rate}
    while True:
        spec = {**bench.spec, "dropout": dict(rates)}
        try:
            load_spec(spec, registry=bench.registry)
            return spec
        except SpecError as exc:
            refused = {p.split(".", 1)[1] for p, _ in exc.errors if p.startswith("dropout.")} & {
                k for k, v in rates.items() if v
            }
            if not refused:
                raise
            for k in refused:
                rates[k] = 0.0


def _first_leak(logits: torch.Tensor, base: torch.Tensor, j: int, tol: float, mode: str) -> Optional[str]:
    d = max_abs_diff(logits[:j], base[:j])
    worst = d.max().item()
    if worst <= tol:
        return None
    pos = int(d.amax(dim=-1).argmax().item())
    return (
        f"{mode}: max |Δ| = {fmt(worst)} at position {pos} after changing the tokens from position {j} on "
        f"(logits at positions < {j} must not change; tolerance {fmt(tol)})"
    )


def check_causality(bench: Bench) -> str:
    """Changing the tokens from position ``j`` on never changes the logits at positions before ``j``.

    Over a 64-token sequence in a tiny model holding the component: in eval mode for every ``j`` in ``1..63`` (one
    batched forward), and in train mode with dropout on (embedding, attention and residual at 0.1 wherever the
    components apply it; the same seed for both forwards, so the dropout masks are equal) for the ``j`` in
    :data:`TRAIN_CUTS`. Tolerance :data:`~.base.SAME_MATH_ULPS` float32 ulps of the logit scale.

    Catches: a decoder that sees the future (transformers #45811: a custom attention registered without its mask
    silently loses causality), including a leak that starts only at a later position (the ``late_peek`` fixture
    leaks from position 8 on, past the 8 tokens the kit used to try) or only in training mode (``train_peek``).
    Applies to causal_safe attention and to every other kind (position schemes, placements, norms and ffns must
    not mix positions either).
    """
    vocab = bench.spec["vocab_size"]
    s = CAUSAL_SEQ
    ids = bench.ids(1, s, seed=11)
    g = bench.generator(12)
    variants = [_changed_from(ids, j, vocab, g) for j in range(1, s)]
    model, _ = bench.build()
    model.eval()
    with torch.no_grad():
        logits = model(torch.cat([ids] + variants)).logits
    base = logits[0]
    bad = nonfinite(base)
    if bad:
        raise CheckFailed(f"the logits hold {bad} non-finite value(s) before any change")
    tol = tolerance(base, torch.float32, SAME_MATH_ULPS)
    for j in range(1, s):
        leak = _first_leak(logits[j], base, j, tol, "eval")
        if leak:
            raise CheckFailed(leak)

    spec = with_dropout(bench, TRAIN_DROPOUT)
    rates = ", ".join(f"{k} {v}" for k, v in spec["dropout"].items() if v) or "none applies"
    model, _ = bench.build(spec)
    model.train()
    with torch.no_grad():
        with fork_rng(13):
            base = model(ids).logits[0]
        for j in TRAIN_CUTS:
            with fork_rng(13):
                out = model(variants[j - 1]).logits[0]
            leak = _first_leak(out, base, j, tol, f"train mode with dropout ({rates})")
            if leak:
                raise CheckFailed(leak)
    return (
        f"{s} tokens: changing the tokens from position j on left every earlier logit unchanged, eval (j = 1..{s - 1}) "
        f"and train mode with dropout {rates} ({len(TRAIN_CUTS)} j's); tolerance {fmt(tol)}"
    )


def applies_per_token(entry: Component, config: ComponentConfig) -> Optional[str]:
    """ffn and norm, and kinds without a contract of their own (a router is called through its ffn)."""
    if entry.kind in ("ffn", "norm") or entry.kind not in CONTRACT_KINDS:
        return None
    return "applies to ffn and norm (they act on each token alone)"


def check_per_token(bench: Bench) -> str:
    """An ffn or a norm maps each token on its own: the other tokens of its sequence never change its output.

    ``x [3, 8, width]`` goes through the module once as is, once as 24 sequences of one token, and once with the
    tokens of each sequence shuffled; the three outputs must agree token by token (float32, tolerance
    :data:`~.base.SAME_MATH_ULPS` ulps of the output scale). A router is checked through the ffn that holds it.

    Catches: a "position-wise" FFN that mixes tokens (the ``token_mixing`` fixture keeps a running mean over the
    previous tokens: causal, so ``causality`` passes, and only cached decode hinted at it), a norm taking its
    statistics over the sequence instead of the features, a router normalising over the batch.
    """
    model, records = bench.build()
    model.eval()
    kind, rec = contract_record(bench, records)
    if kind not in ("ffn", "norm"):
        raise CheckSkipped(f"{bench.name} is not held by an ffn or a norm in the tiny model")
    m: nn.Module = rec.module
    width = rec.ctx.dim or bench.d_model()
    x = bench.randn(3, 8, width, seed=81)
    perm = torch.randperm(8, generator=bench.generator(82)).to(x.device)
    with torch.no_grad():
        y = call_contract(kind, m, x)
        alone = call_contract(kind, m, x.reshape(24, 1, width)).reshape(3, 8, width)
        shuffled = call_contract(kind, m, x[:, perm])
    tol = tolerance(y, torch.float32, SAME_MATH_ULPS)
    for label, got, ref in (("each token alone", alone, y), ("the tokens shuffled", shuffled, y[:, perm])):
        d = max_abs_diff(got, ref)
        worst = d.max().item()
        if worst > tol:
            b, t = divmod(int(d.amax(dim=-1).flatten().argmax().item()), 8)
            raise CheckFailed(
                f"a token's output depends on the other tokens of its sequence: with {label}, max |Δ| = {fmt(worst)} "
                f"(sequence {b}, token {t}; tolerance {fmt(tol)}); an {kind} must act on each token alone"
            )
    return f"{kind} output of each token equals it alone and after shuffling the tokens (tolerance {fmt(tol)})"
